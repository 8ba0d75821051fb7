"""Host facts (ingest/collectors/hostfacts.py) on the recorded trees of tests/data/proc."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from ingest import schema
from ingest.collectors.base import Reading
from ingest.collectors.hostfacts import HostFactsCollector, pci_function

DATA = Path(__file__).parent / "data" / "proc"
NORMAL, MISSING, LARGE = (DATA / n for n in ("normal", "missing_fields", "large"))

Row = tuple[str, str, str, object, object]


def facts(root: Path) -> dict[tuple[str, str, str], tuple[object, object]]:
    r = HostFactsCollector(root).facts()
    assert r.measurement == "host_facts"
    keys = list(zip(r.tags["category"], r.tags["device"], r.tags["key"], strict=True))
    assert len(keys) == len(set(keys)), "one row per fact"
    return dict(zip(keys, zip(r.fields["value"], r.fields["value_num"], strict=True), strict=True))


def test_reading_conforms_to_the_schema() -> None:
    r = HostFactsCollector(LARGE).collect()[0]
    assert isinstance(r, Reading)
    df = schema.conform("host_facts", pl.DataFrame({**r.tags, **r.fields}))
    assert df.height == r.n_rows > 1000


def test_normal_vm() -> None:
    f = facts(NORMAL)
    expected = {
        ("system", "", "kernel"): ("6.18.44-fc-v595", None),
        ("cpu", "", "count"): ("2", 2.0),
        ("cpu", "", "online"): ("0-1", None),
        ("cpu", "", "model"): ("AMD EPYC", None),
        ("numa", "", "nodes"): ("1", 1.0),
        ("numa", "0", "cpulist"): ("0-1", None),
        ("numa", "0", "cpus"): ("2", 2.0),
        # eth0 -> virtio2 -> PCI 0000:00:03.0; a VM without NUMA placement: -1
        ("nic", "eth0", "pci"): ("0000:00:03.0", None),
        ("nic", "eth0", "numa_node"): ("-1", -1.0),
        ("nic", "eth0", "driver"): ("virtio_net", None),
        ("disk", "vda", "pci"): ("0000:00:02.0", None),
        ("disk", "vda", "driver"): ("virtio_blk", None),
        ("irq", "36", "device"): ("virtio1-req.0", None),
        ("irq", "36", "smp_affinity_list"): ("0-1", None),
        ("irq", "36", "affinity_nodes"): ("0", None),
        ("irq", "36", "pci"): ("0000:00:02.0", None),  # msi_irqs/36 of 0000:00:02.0
        ("irq", "36", "device_node"): ("-1", -1.0),
        ("irq", "24", "device"): ("ACPI:Ged", None),
        ("thp", "", "enabled"): ("madvise", None),
        ("thp", "", "defrag"): ("madvise", None),
    }
    assert {k: f.get(k) for k in expected} == expected
    assert ("nic", "eth0", "speed") not in f  # virtio reports -1: unknown, no row
    assert not [k for k in f if k[1] in ("lo", "ifb0", "zram0", "loop0")]  # virtual devices
    assert ("irq", "24", "pci") not in f  # IO-APIC line: no PCI device behind it
    assert not [k for k in f if k[0] in ("power", "pcie")]  # no cpufreq, no link files here


def test_large_host_topology_and_placement() -> None:
    f = facts(LARGE)
    expected = {
        ("numa", "", "nodes"): ("2", 2.0),
        ("numa", "0", "cpulist"): ("0-47,96-143", None),
        ("numa", "1", "cpulist"): ("48-95,144-191", None),
        ("cpu", "", "count"): ("192", 192.0),
        ("nic", "ens1f0np0", "numa_node"): ("0", 0.0),
        ("nic", "ens2f0np0", "pci"): ("0000:ca:00.0", None),
        ("nic", "ens2f0np0", "numa_node"): ("1", 1.0),
        ("nic", "ens2f0np0", "driver"): ("mlx5_core", None),
        ("nic", "ens2f0np0", "speed"): ("200000", 200000.0),
        ("nvme", "nvme3n1", "pci"): ("0000:b2:00.0", None),
        ("nvme", "nvme3n1", "numa_node"): ("1", 1.0),
        ("nvme", "nvme3n1", "driver"): ("nvme", None),  # from the PCI function
        ("pcie", "0000:b2:00.0", "current_link_speed"): ("8.0 GT/s PCIe", 8.0),
        ("pcie", "0000:b2:00.0", "max_link_speed"): ("16.0 GT/s PCIe", 16.0),
        ("pcie", "0000:b2:00.0", "current_link_width"): ("4", 4.0),
        ("pcie", "0000:17:00.0", "max_link_width"): ("16", 16.0),
        # mlx5_comp0 of the node-1 NIC, pinned to CPU 0 (node 0): a locality miss
        ("irq", "301", "device"): ("mlx5_comp0@pci:0000:ca:00.0", None),
        ("irq", "301", "smp_affinity_list"): ("0", None),
        ("irq", "301", "affinity_nodes"): ("0", None),
        ("irq", "301", "pci"): ("0000:ca:00.0", None),
        ("irq", "301", "device_node"): ("1", 1.0),
        ("irq", "401", "affinity_nodes"): ("0", None),  # nvme0q1: CPUs 0-5
        ("irq", "30", "device"): ("PCIe PME, aerdrv", None),
        ("thp", "", "enabled"): ("always", None),
        ("thp", "", "defrag"): ("madvise", None),
        ("power", "policy150", "scaling_governor"): ("powersave", None),
        ("power", "policy0", "scaling_governor"): ("performance", None),
        ("power", "", "scaling_driver"): ("intel_pstate", None),
    }
    assert {k: f.get(k) for k in expected} == expected
    assert ("nic", "docker0", "numa_node") not in f and ("disk", "dm-0", "pci") not in f
    # every MSI-X line of the two NICs and four NVMe drives knows its device's node
    msix = [k for k in f if k[0] == "irq" and k[2] == "pci"]
    assert len(msix) == 2 * 64 + 4 * 33


def test_missing_fields_give_no_rows_not_crashes() -> None:
    f = facts(MISSING)
    assert not [k for k in f if k[0] in ("numa", "thp", "power", "pcie")]
    assert not [k for k in f if k[2] == "effective_affinity_list"]
    assert f[("irq", "36", "device")] == ("virtio1-req.0", None)  # old 'PCI-MSI-edge' format
    assert f[("cpu", "", "count")] == ("2", 2.0)


def test_empty_root_gives_no_facts(tmp_path: Path) -> None:
    assert HostFactsCollector(tmp_path).facts().n_rows == 0


def test_pci_function_walks_up_symlinks() -> None:
    fn = pci_function(LARGE / "sys/block/nvme2n1/device")
    assert fn is not None and fn.name == "0000:b1:00.0"
    assert (fn / "numa_node").read_text().strip() == "1"
    assert pci_function(LARGE / "sys/class/net/lo") is None


@pytest.mark.host
def test_live_host_facts() -> None:
    f = facts(Path("/"))
    assert f[("cpu", "", "count")][1] == float(os.cpu_count() or 0)  # online CPUs
    assert f[("system", "", "kernel")][0] == os.uname().release
    assert any(k[0] == "irq" and k[2] == "smp_affinity_list" for k in f)
