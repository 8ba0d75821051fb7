"""The /proc and /sys collectors, replayed on recorded trees (tests/data/proc/*).

normal: this 2-CPU VM as recorded; missing_fields: an old kernel; large: a generated
192-CPU, 2-node host (make_large.py); wrap: two snapshots with counter wraps and resets.
Expected values are read off the files by hand (see the comments)."""

from __future__ import annotations

import os
import shutil
import time
import timeit
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ingest import schema
from ingest.collectors import REGISTRY
from ingest.collectors.base import CollectorError, Reading, SourceUnavailable
from ingest.collectors.cgroup import CgroupCollector
from ingest.collectors.cpu import CpuCollector
from ingest.collectors.disk import DiskCollector
from ingest.collectors.interrupts import InterruptsCollector, irq_device
from ingest.collectors.memory import MemoryCollector
from ingest.collectors.net import NetCollector, TcpCollector
from ingest.collectors.numa import NumaCollector
from ingest.collectors.pressure import PressureCollector
from ingest.collectors.procfs import NodeReducer, format_cpulist, parse_cpulist
from ingest.collectors.softirqs import SoftirqsCollector
from ingest.collectors.vmstat import VmstatCollector
from ingest.counters import CounterTracker

DATA = Path(__file__).parent / "data" / "proc"
NORMAL, MISSING, LARGE, WRAP = (DATA / n for n in ("normal", "missing_fields", "large", "wrap"))
PROC_COLLECTORS = [n for n in REGISTRY if n not in ("gpu", "perf")]


def rows(r: Reading) -> list[dict[str, object]]:
    cols = {**r.tags, **r.fields}
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def one(reading: Reading, **tags: str) -> dict[str, object]:
    found = [r for r in rows(reading) if all(r[k] == v for k, v in tags.items())]
    assert len(found) == 1, (tags, len(found))
    return found[0]


def collect(cls: type, root: Path, **kw: object) -> dict[str, Reading]:
    c = cls(root, **kw)
    try:
        return {r.measurement: r for r in c.collect()}
    finally:
        c.close()


def check_schema(r: Reading) -> None:
    """Every reading has exactly the measurement's tags and fields, columns of equal length."""
    m = schema.get(r.measurement)
    assert set(r.tags) == set(m.tags)
    assert set(r.fields) == set(m.field_index)
    assert len({len(c) for c in (*r.tags.values(), *r.fields.values())}) <= 1


# ------------------------------------------------------------------ registry, schema
def test_registry_lists_every_collector_with_its_contract() -> None:
    assert {"cpu", "pressure", "interrupts", "softirqs", "memory", "vmstat", "numa", "net",
            "tcp", "disk", "cgroup", "hostfacts", "gpu", "perf"} <= set(REGISTRY)  # fmt: skip
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert cls.tier in schema.TIER_PERIOD_S
        for m in cls.measurements:
            schema.get(m)


@pytest.mark.parametrize("tree", [NORMAL, MISSING, LARGE])
@pytest.mark.parametrize("name", PROC_COLLECTORS)
def test_every_reading_matches_the_schema(tree: Path, name: str) -> None:
    try:
        c = REGISTRY[name](tree)
    except SourceUnavailable:
        assert tree == MISSING and name in ("pressure", "numa")
        return
    for r in c.collect():
        assert r.measurement in c.measurements
        check_schema(r)
        schema.conform(r.measurement, pl.DataFrame({**r.tags, **r.fields}))
    c.close()


# ------------------------------------------------------------------------- normal
def test_cpu_and_system_normal() -> None:
    got = collect(CpuCollector, NORMAL)
    # cpu0 5282 0 2383 59500 245 0 15 249 0 0 / cpu1 9374 0 3663 53779 527 0 153 240 0 0
    assert rows(got["cpu"]) == [
        {"cpu": "0", "node": "0", "user": 5282, "nice": 0, "system": 2383, "idle": 59500,
         "iowait": 245, "irq": 0, "softirq": 15, "steal": 249, "freq_mhz": None},
        {"cpu": "1", "node": "0", "user": 9374, "nice": 0, "system": 3663, "idle": 53779,
         "iowait": 527, "irq": 0, "softirq": 153, "steal": 240, "freq_mhz": None},
    ]  # fmt: skip
    assert rows(got["system"]) == [
        {"ctxt": 922018, "forks": 10123, "procs_running": 2.0, "procs_blocked": 0.0, "load1": 1.46}
    ]


def test_pressure_normal() -> None:
    assert rows(collect(PressureCollector, NORMAL)["pressure"]) == [
        {"resource": "cpu", "some_avg10": 34.14, "full_avg10": 0.0, "some_total": 20913664, "full_total": 0},
        {"resource": "memory", "some_avg10": 0.0, "full_avg10": 0.0, "some_total": 0, "full_total": 0},
        {"resource": "io", "some_avg10": 2.91, "full_avg10": 1.04, "some_total": 6189678,
         "full_total": 5076339},
    ]  # fmt: skip


def test_interrupts_normal() -> None:
    r = collect(InterruptsCollector, NORMAL)["interrupts"]
    # 19 numbered lines + 14 named per-CPU lines (ERR and MIS hold one global count: skipped)
    assert r.n_rows == 33
    assert one(r, irq="36") == {"irq": "36", "device": "virtio1-req.0", "node": "0", "count": 67934}
    assert one(r, irq="24") == {"irq": "24", "device": "ACPI:Ged", "node": "0", "count": 1}
    assert one(r, irq="LOC") == {"irq": "LOC", "device": "", "node": "0", "count": 50394 + 54921}
    assert one(r, irq="CAL") == {"irq": "CAL", "device": "", "node": "0", "count": 59312 + 41460}
    assert not [x for x in rows(r) if x["irq"] in ("ERR", "MIS")]


def test_softirqs_normal() -> None:
    r = collect(SoftirqsCollector, NORMAL)["softirqs"]
    assert [x["softirq"] for x in rows(r)] == [
        "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"
    ]  # fmt: skip
    assert one(r, softirq="TIMER") == {"softirq": "TIMER", "node": "0", "count": 11729 + 13050}
    assert one(r, softirq="BLOCK") == {"softirq": "BLOCK", "node": "0", "count": 67931}


def test_memory_normal() -> None:
    kb = 1024
    assert rows(collect(MemoryCollector, NORMAL)["memory"]) == [
        {"mem_total": 24684096 * kb, "mem_free": 23451776 * kb, "mem_available": 24168032 * kb,
         "cached": 874080 * kb, "dirty": 14176 * kb, "writeback": 0, "anon_pages": 126592 * kb,
         "anon_huge_pages": 6144 * kb, "shmem": 8788 * kb, "page_tables": 3044 * kb,
         "swap_total": 0, "swap_free": 0, "hugepages_total": 0, "hugepages_free": 0,
         "hugepages_rsvd": 0, "hugepagesize": 2048 * kb}
    ]  # fmt: skip


def test_vmstat_normal() -> None:
    row = rows(collect(VmstatCollector, NORMAL)["vmstat"])[0]
    assert set(row) == set(schema.VMSTAT_COUNTERS)
    assert row["pgfault"] == 3721371
    assert row["pgmajfault"] == 1315
    assert row["thp_fault_alloc"] == 207
    assert row["numa_hit"] == row["numa_local"] == 3643918
    assert all(v is not None for v in row.values())  # this kernel has every counter


def test_numa_normal() -> None:
    assert rows(collect(NumaCollector, NORMAL)["numa"]) == [
        {"node": "0", "numa_hit": 3644500, "numa_miss": 0, "numa_foreign": 0, "interleave_hit": 1121,
         "local_node": 3644500, "other_node": 0, "mem_free": 4234060 * 1024,
         "anon_huge_pages": 6144 * 1024}
    ]  # fmt: skip


def test_net_and_tcp_normal() -> None:
    net = rows(collect(NetCollector, NORMAL)["net"])
    assert [x["interface"] for x in net] == ["ifb0", "ifb1", "eth0"]  # lo skipped
    assert net[2] == {
        "interface": "eth0", "rx_bytes": 202013078, "rx_packets": 4725, "rx_errors": 0,
        "rx_dropped": 0, "rx_fifo": 0, "tx_bytes": 211625, "tx_packets": 2477, "tx_errors": 0,
        "tx_dropped": 0,
    }  # fmt: skip
    # Tcp: 1 200 120000 -1 154 76 61 0 0 6364 4107 3 0 75 0
    assert rows(collect(TcpCollector, NORMAL)["tcp"]) == [
        {"in_segs": 6364, "out_segs": 4107, "retrans_segs": 3, "in_errs": 0, "active_opens": 154}
    ]


def test_disk_normal_whole_disks_only() -> None:
    # 254 0 vda 54349 9358 3841498 55121 22708 23385 2962768 11588 0 12776 67907 ...
    assert rows(collect(DiskCollector, NORMAL)["disk"]) == [
        {"device": "vda", "reads": 54349, "read_sectors": 3841498, "read_time": 55121,
         "writes": 22708, "write_sectors": 2962768, "write_time": 11588, "io_time": 12776,
         "weighted_io_time": 67907, "in_flight": 0.0}
    ]  # fmt: skip


def test_cgroup_v1_normal() -> None:
    c = CgroupCollector(NORMAL)
    assert c.version == 1
    # only memory has a child group here; the cpu hierarchies have none
    assert rows(c.collect()[0]) == [
        {"cgroup": "process_api", "cpu_usage": None, "nr_periods": None, "nr_throttled": None,
         "throttled_time": None, "cpu_quota_cores": None, "memory_current": 1106079744,
         "memory_max": None, "cpu_pressure_some": None, "memory_pressure_some": None}
    ]  # fmt: skip


# ----------------------------------------------------------------- missing fields
def test_missing_sources_are_unavailable_not_errors() -> None:
    with pytest.raises(SourceUnavailable, match="pressure"):
        PressureCollector(MISSING)
    with pytest.raises(SourceUnavailable, match="node"):
        NumaCollector(MISSING)
    with pytest.raises(SourceUnavailable):
        MemoryCollector(MISSING / "nowhere")


def test_missing_fields_give_nulls() -> None:
    cpu = rows(collect(CpuCollector, MISSING)["cpu"])
    # cpu0 5282 0 2383 59500 245 0 15: no steal column; no NUMA info: node "0"
    assert cpu[0] == {"cpu": "0", "node": "0", "user": 5282, "nice": 0, "system": 2383,
                      "idle": 59500, "iowait": 245, "irq": 0, "softirq": 15, "steal": None,
                      "freq_mhz": None}  # fmt: skip
    vm = rows(collect(VmstatCollector, MISSING)["vmstat"])[0]
    absent = [n for n in schema.VMSTAT_COUNTERS if n.startswith(("thp_", "numa_"))]
    assert absent and all(vm[n] is None for n in absent)
    assert vm["allocstall_normal"] is None  # old kernels: 'allocstall'
    assert vm["pgfault"] == 3721371
    mem = rows(collect(MemoryCollector, MISSING)["memory"])[0]
    for k in ("mem_available", "anon_huge_pages", "hugepages_total", "hugepages_free",
              "hugepages_rsvd", "hugepagesize"):  # fmt: skip
        assert mem[k] is None
    assert mem["mem_total"] == 24684096 * 1024


def test_old_interrupts_format_and_old_diskstats() -> None:
    r = collect(InterruptsCollector, MISSING)["interrupts"]
    assert one(r, irq="36") == {"irq": "36", "device": "virtio1-req.0", "node": "0", "count": 67934}
    assert one(r, irq="24")["device"] == "ACPI:Ged"
    d = rows(collect(DiskCollector, MISSING)["disk"])
    assert [x["device"] for x in d] == ["vda"] and d[0]["weighted_io_time"] == 67907


@pytest.mark.parametrize(
    ("tail", "device"),
    [
        (b"  IO-APIC   5-edge      ACPI:Ged", "ACPI:Ged"),
        (b"  IR-PCI-MSI-edge      eth0-TxRx-0", "eth0-TxRx-0"),
        (
            b" IR-PCI-MSIX-0000:17:00.0   12-edge  mlx5_comp3@pci:0000:17:00.0",
            "mlx5_comp3@pci:0000:17:00.0",
        ),
        (b" PCI-MSI-0000:00:01.0    0-edge  PCIe PME, aerdrv", "PCIe PME, aerdrv"),
        (b"     GICv3  27 Level     arch_timer", "arch_timer"),
        (b"  IO-APIC   9-fasteoi   acpi", "acpi"),
        (b"  IO-APIC   7-edge", ""),
    ],
)
def test_irq_device_formats(tail: bytes, device: str) -> None:
    assert irq_device(tail) == device


def test_cgroup_v1_combined_hierarchy_with_quota() -> None:
    r = collect(CgroupCollector, MISSING)["cgroup"]
    # cpu,cpuacct/system.slice: usage 123456789000 ns, throttled_time 7500000000 ns, 150000/100000
    assert one(r, cgroup="system.slice") == {
        "cgroup": "system.slice", "cpu_usage": 123456789, "nr_periods": 5000, "nr_throttled": 250,
        "throttled_time": 7500000, "cpu_quota_cores": 1.5, "memory_current": None,
        "memory_max": None, "cpu_pressure_some": None, "memory_pressure_some": None,
    }  # fmt: skip
    assert one(r, cgroup="process_api")["memory_current"] == 1106079744


# -------------------------------------------------------------------------- large
def _reference_interrupts(root: Path) -> dict[str, list[int]]:
    """IRQ label -> per-CPU counts, by plain splitting (independent of the collector)."""
    lines = (root / "proc/interrupts").read_text().splitlines()
    ncpu = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) >= ncpu and all(p.isdigit() for p in parts[:ncpu]):
            out[label.strip()] = [int(p) for p in parts[:ncpu]]
    return out


def test_large_cpu_nodes_and_frequency() -> None:
    got = collect(CpuCollector, LARGE, freq_every=1)
    cpu = rows(got["cpu"])
    assert len(cpu) == 192
    nodes = {x["cpu"]: x["node"] for x in cpu}
    assert (nodes["0"], nodes["47"], nodes["48"], nodes["95"], nodes["96"], nodes["150"]) == (
        "0", "0", "1", "1", "0", "1")  # fmt: skip
    assert cpu[5]["freq_mhz"] == pytest.approx(2105.0)  # scaling_cur_freq 2105000 kHz
    assert rows(got["system"]) == [
        {"ctxt": 123456789012, "forks": 4567890, "procs_running": 97.0, "procs_blocked": 3.0,
         "load1": 95.12}
    ]  # fmt: skip


def test_cpu_frequency_is_reread_every_n_ticks(tmp_path: Path) -> None:
    root = tmp_path / "large"
    (root / "proc").mkdir(parents=True)
    shutil.copy(LARGE / "proc/stat", root / "proc/stat")
    f = root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"
    f.parent.mkdir(parents=True)
    f.write_text("1\n")
    c = CpuCollector(root, freq_every=3)
    seen = []
    for tick in range(4):
        with open(f, "r+b") as fh:  # same inode: the collector's open fd sees it
            fh.truncate(0)
            fh.write(f"{1000000 + tick * 1000}\n".encode())
        seen.append(rows(c.collect()[0])[0]["freq_mhz"])
    assert seen == [1000.0, 1000.0, 1000.0, 1003.0]


def test_large_interrupts_per_node_sums_to_line_total() -> None:
    ref = _reference_interrupts(LARGE)
    node_cpus = {n: parse_cpulist((LARGE / f"sys/devices/system/node/node{n}/cpulist").read_text())
                 for n in (0, 1)}  # fmt: skip
    c = InterruptsCollector(LARGE)
    t0 = time.perf_counter()
    r = c.collect()[0]
    print(
        f"\ninterrupts collect on 192 CPUs x {len(ref)} lines: {(time.perf_counter() - t0) * 1e3:.2f} ms"
    )
    n = 20
    print(f"  steady state: {timeit.timeit(c.collect, number=n) / n * 1e3:.2f} ms per collect")
    got: dict[str, dict[str, int]] = {}
    for x in rows(r):
        got.setdefault(str(x["irq"]), {})[str(x["node"])] = int(x["count"])  # type: ignore[call-overload]
    assert set(got) == set(ref) - {"ERR", "MIS"}
    for irq, counts in got.items():
        assert sum(counts.values()) == sum(ref[irq]), irq
        for n_ in (0, 1):
            assert counts[str(n_)] == sum(ref[irq][cpu] for cpu in node_cpus[n_]), (irq, n_)


def test_large_irq_locality_is_computable() -> None:
    r = collect(InterruptsCollector, LARGE)["interrupts"]
    per: dict[str, dict[str, int]] = {}
    for x in rows(r):
        if "mlx5_comp" in str(x["device"]):
            pci = str(x["device"]).split("@pci:")[1]
            per.setdefault(pci, {"0": 0, "1": 0})[str(x["node"])] += int(x["count"])  # type: ignore[call-overload]
    # ens1f0np0 (0000:17:00.0) is on node 0, ens2f0np0 (0000:ca:00.0) on node 1; both
    # have their completion IRQs pinned to node-0 CPUs
    loc = {
        pci: c["0" if pci == "0000:17:00.0" else "1"] / (c["0"] + c["1"]) for pci, c in per.items()
    }
    assert loc == {"0000:17:00.0": 1.0, "0000:ca:00.0": 0.0}


def test_large_softirqs_per_node() -> None:
    text = (LARGE / "proc/softirqs").read_text().splitlines()
    r = collect(SoftirqsCollector, LARGE)["softirqs"]
    net_rx = [int(v) for v in next(x for x in text if "NET_RX:" in x).split()[1:]]
    node0 = parse_cpulist("0-47,96-143")
    assert one(r, softirq="NET_RX", node="0")["count"] == sum(net_rx[c] for c in node0)
    assert one(r, softirq="NET_RX", node="1")["count"] == sum(net_rx) - sum(
        net_rx[c] for c in node0
    )


def test_large_cgroup_v2() -> None:
    c = CgroupCollector(LARGE, paths=["kubepods.slice/kubepods-burstable.slice", "not/there"])
    assert c.version == 2
    r = c.collect()[0]
    assert r.tags["cgroup"] == ["init.scope", "kubepods.slice", "system.slice", "user.slice",
                                "kubepods.slice/kubepods-burstable.slice"]  # fmt: skip
    assert one(r, cgroup="kubepods.slice") == {
        "cgroup": "kubepods.slice", "cpu_usage": 98765432100, "nr_periods": 120000,
        "nr_throttled": 30000, "throttled_time": 987654321, "cpu_quota_cores": 40.0,
        "memory_current": 805306368000, "memory_max": 858993459200,
        "cpu_pressure_some": 98765432100 // 7, "memory_pressure_some": 98765432100 // 11,
    }  # fmt: skip
    sysl = one(r, cgroup="system.slice")
    assert sysl["cpu_quota_cores"] is None and sysl["memory_max"] is None  # 'max'
    assert one(r, cgroup="init.scope") == {
        "cgroup": "init.scope", "cpu_usage": 4242, "nr_periods": None, "nr_throttled": None,
        "throttled_time": None, "cpu_quota_cores": None, "memory_current": None,
        "memory_max": None, "cpu_pressure_some": None, "memory_pressure_some": None,
    }  # fmt: skip


def test_large_disk_net_numa_pressure() -> None:
    assert collect(DiskCollector, LARGE)["disk"].tags["device"] == [
        "nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1", "dm-0"]  # fmt: skip
    assert collect(NetCollector, LARGE)["net"].tags["interface"] == [
        "ens1f0np0",
        "ens2f0np0",
        "docker0",
    ]
    numa = rows(collect(NumaCollector, LARGE)["numa"])
    assert [x["node"] for x in numa] == ["0", "1"]
    assert numa[1]["numa_miss"] == 2000001 and numa[1]["anon_huge_pages"] == 500000001 * 1024
    p = collect(PressureCollector, LARGE)["pressure"]
    assert one(p, resource="cpu") == {"resource": "cpu", "some_avg10": 12.5, "full_avg10": 0.0,
                                      "some_total": 1000003, "full_total": 3}  # fmt: skip


# --------------------------------------------------------------------------- wrap
def _replace(path: Path, text: str) -> None:
    with open(path, "r+b") as f:  # same inode: the collector's open fd reads the new content
        f.truncate(0)
        f.write(text.encode())


def _deltas(
    tracker: CounterTracker, r: Reading, tags: tuple[str, ...]
) -> dict[tuple[str, ...], int | None]:
    keys = list(zip(*(r.tags[t] for t in tags), strict=True))
    d = tracker.deltas(keys, {c: r.fields[c] for c in tracker.counters})
    return dict(zip(keys, d[tracker.counters[0]], strict=True))


def test_interrupt_wraps_are_corrected_per_cpu(tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(WRAP / "t0", root)
    c = InterruptsCollector(root)
    tr = CounterTracker(schema.INTERRUPTS.counters)
    first = _deltas(tr, c.collect()[0], schema.INTERRUPTS.tags)
    assert set(first.values()) == {None}
    _replace(root / "proc/interrupts", (WRAP / "t1/proc/interrupts").read_text())
    d = _deltas(tr, c.collect()[0], schema.INTERRUPTS.tags)
    assert d[("36", "virtio1-req.0", "0")] == 1000  # CPU1 wrapped: 296 + 704
    assert d[("38", "virtio2-input.0", "0")] == 596  # CPU0 wrapped under a node sum > 2**32
    assert d[("41", "virtio3-rx", "0")] == 10  # CPU0 reset: counted from zero
    assert d[("LOC", "", "0")] == 150
    assert d[("24", "ACPI:Ged", "0")] == 0
    assert (tr.stats.wraps, tr.stats.resets) == (0, 0)  # node sums stay monotonic
    assert c._table.reducer.resets == 1
    # an IRQ line freed (43) and the rest unchanged: the state of the others is kept
    t1 = (WRAP / "t1/proc/interrupts").read_text()
    _replace(
        root / "proc/interrupts",
        "".join(x for x in t1.splitlines(True) if not x.startswith(" 43:")),
    )
    d = _deltas(tr, c.collect()[0], schema.INTERRUPTS.tags)
    assert ("43", "virtio3-event", "0") not in d
    assert d[("38", "virtio2-input.0", "0")] == 0 and d[("36", "virtio1-req.0", "0")] == 0


def test_node_reducer_keeps_sums_monotonic() -> None:
    r = NodeReducer({0: "0", 1: "0", 2: "1"})
    r.set_columns((0, 1, 2))

    def reduce(keys: list[object], rows: list[list[int]]) -> np.ndarray:  # one sample
        return r.reduce(keys, np.array([rows], dtype=np.int64))[0]

    a = reduce(["x"], [[500_000, 500_000, 2**32 - 10]])
    # CPU0 reset (counts from zero), CPU1 +100, CPU2 wrapped (+15)
    b = reduce(["x"], [[10, 500_100, 5]])
    assert (b - a).tolist() == [[110, 15]]
    assert r.resets == 1
    # a row that appears later starts from its own first value
    c = reduce(["x", "y"], [[10, 500_100, 5], [7, 0, 1]])
    assert c[0].tolist() == b[0].tolist() and c[1].tolist() == [7, 1]
    r.set_columns((0, 1))  # hotplug: the sums restart
    assert reduce(["x"], [[1, 2]]).tolist() == [[3, 0]]
    # consecutive samples at once: the sums of one sample at a time
    r.set_columns((0, 1, 2))
    many = r.reduce(["x"], np.array([[[500_000, 500_000, 2**32 - 10]], [[10, 500_100, 5]]], dtype=np.int64))
    assert (many[1] - many[0]).tolist() == [[110, 15]]


def test_net_wraps_and_reset(tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(WRAP / "t0", root)
    c = NetCollector(root)
    tr = CounterTracker(schema.NET.counters)
    r0 = c.collect()[0]
    keys = [(i,) for i in r0.tags["interface"]]
    tr.deltas(keys, r0.fields)
    _replace(root / "proc/net/dev", (WRAP / "t1/proc/net/dev").read_text())
    r1 = c.collect()[0]
    d = tr.deltas([(i,) for i in r1.tags["interface"]], r1.fields)
    eth0 = r1.tags["interface"].index("eth0")
    ifb0 = r1.tags["interface"].index("ifb0")
    assert d["rx_packets"][eth0] == 196  # 32-bit driver counter wrapped
    assert d["tx_bytes"][eth0] == 1500  # 64-bit wrap
    assert d["rx_bytes"][eth0] == 100000
    assert d["rx_bytes"][ifb0] == 1000  # interface re-created: reset
    assert (tr.stats.wraps, tr.stats.resets) == (2, 1)


# ------------------------------------------------------------------------- errors
def test_parse_failure_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal:  100 kB\nMemFree:  lots kB\n")
    with pytest.raises(CollectorError, match=r"proc/meminfo:2: not a number"):
        MemoryCollector(tmp_path).collect()
    (tmp_path / "proc/net/dev").write_text("h1\nh2\n  eth0: 1 2 3\n")
    with pytest.raises(CollectorError, match=r"proc/net/dev:3: expected 16 counters"):
        NetCollector(tmp_path).collect()


def test_key_value_fast_paths_equal_the_line_parsers_and_name_bad_lines(tmp_path: Path) -> None:
    # vmstat, numastat and meminfo are parsed in one C-level pass; anything unusual goes
    # through the line-by-line parser, which gives the same values or names the line
    (tmp_path / "proc").mkdir()
    vm = tmp_path / "proc/vmstat"
    vm.write_text("nr_free_pages 5\npgfault 77\nthp_fault_alloc 3\n")
    fields = VmstatCollector(tmp_path).collect()[0].fields
    assert (fields["pgfault"], fields["thp_fault_alloc"], fields["pgmajfault"]) == ([77], [3], [None])
    vm.write_text("nr_free_pages 5\n\npgfault 77\nodd line here\nthp_fault_alloc 3\n")
    fields = VmstatCollector(tmp_path).collect()[0].fields
    assert (fields["pgfault"], fields["thp_fault_alloc"]) == ([77], [3])
    vm.write_text("nr_free_pages 5\npgfault many\n")
    with pytest.raises(CollectorError, match=r"proc/vmstat:2: not a number"):
        VmstatCollector(tmp_path).collect()
    node = tmp_path / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "numastat").write_text("numa_hit 10\nnuma_miss x\n")
    (node / "meminfo").write_text("Node 0 MemFree:  4 kB\nNode 0 AnonHugePages:  2048 kB\n")
    with pytest.raises(CollectorError, match=r"numastat:2: not a number"):
        NumaCollector(tmp_path).collect()
    (node / "numastat").write_text("numa_hit 10\nnuma_miss 2\n")
    numa = NumaCollector(tmp_path).collect()[0].fields
    assert (numa["numa_hit"], numa["numa_miss"], numa["mem_free"], numa["anon_huge_pages"]) == (
        [10], [2], [4096], [2048 * 1024])
    (tmp_path / "proc/meminfo").write_text("MemTotal:  100 kB\nHugePages_Total:   3\nWeird line\n")
    with pytest.raises(CollectorError, match=r"proc/meminfo:3: expected 'Key: value"):
        MemoryCollector(tmp_path).collect()


def test_a_cpu_line_without_a_number_is_a_collector_error(tmp_path: Path) -> None:
    """A corrupt /proc/stat label ('cpux65') is a CollectorError naming the file, not a
    ValueError that would abort the agent's flush."""
    (tmp_path / "proc").mkdir()
    stat = tmp_path / "proc/stat"
    good = "cpu  2 0 2 8 0 0 0 0\ncpu0 1 0 1 4 0 0 0 0\ncpu1 1 0 1 4 0 0 0 0\nintr 5\nctxt 9\n"
    stat.write_text(good)
    assert CpuCollector(tmp_path).collect()[0].tags["cpu"] == ["0", "1"]
    stat.write_text(good.replace("cpu1 ", "cpux65 "))
    with pytest.raises(CollectorError, match=r"proc/stat:2: .*expected only cpuN lines"):
        CpuCollector(tmp_path).collect()


def test_interrupts_odd_layout_falls_back_and_bad_counts_are_named(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    f = tmp_path / "proc/interrupts"
    # not the ' %10u' grid (narrow columns), still parseable by splitting
    f.write_text("     CPU0 CPU1\n  5:  7 8  IO-APIC 5-edge  foo\nLOC:  1 2  Local timer\n")
    assert rows(InterruptsCollector(tmp_path).collect()[0]) == [
        {"irq": "5", "device": "foo", "node": "0", "count": 15},
        {"irq": "LOC", "device": "", "node": "0", "count": 3},
    ]
    f.write_text("     CPU0 CPU1\n  5:  7 x8  IO-APIC 5-edge  foo\n")
    with pytest.raises(CollectorError, match=r"interrupts:2: IRQ 5: expected 2 counts"):
        InterruptsCollector(tmp_path).collect()


def test_cpulist_roundtrip() -> None:
    assert parse_cpulist("0-2,5,7-8\n") == [0, 1, 2, 5, 7, 8]
    assert format_cpulist([8, 7, 5, 2, 1, 0]) == "0-2,5,7-8"
    assert parse_cpulist("") == []
    with pytest.raises(CollectorError):
        parse_cpulist("0-x")


def test_trees_stay_small() -> None:
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file() and not p.is_symlink())
    assert total < 2_000_000, total


# --------------------------------------------------------------------------- host
@pytest.mark.host
def test_live_host_plausible() -> None:
    ncpu = os.cpu_count() or 1
    for name in PROC_COLLECTORS:
        try:
            c = REGISTRY[name]("/")
        except SourceUnavailable:
            continue
        for r in c.collect():
            check_schema(r)
        c.close()
    cpu = CpuCollector("/")
    a = {r.measurement: r for r in cpu.collect()}
    time.sleep(0.05)
    b = {r.measurement: r for r in cpu.collect()}
    assert a["cpu"].n_rows == ncpu
    for f in schema.CPU.counters:
        assert all(y >= x for x, y in zip(a["cpu"].fields[f], b["cpu"].fields[f], strict=True))  # type: ignore[operator]
    assert b["system"].fields["ctxt"][0] > a["system"].fields["ctxt"][0]  # type: ignore[operator]
    mem = rows(collect(MemoryCollector, Path("/"))["memory"])[0]
    assert 0 < mem["mem_free"] <= mem["mem_total"]  # type: ignore[operator]
    loc = [
        x for x in rows(collect(InterruptsCollector, Path("/"))["interrupts"]) if x["irq"] == "LOC"
    ]
    assert loc and all(int(x["count"]) > 0 for x in loc)  # type: ignore[call-overload]
    # the fast tier's cost on this host (budget: ~400 us per tick in total at 100 ms)
    p = PressureCollector("/") if Path("/proc/pressure/cpu").exists() else None
    n = 2000
    t_cpu = timeit.timeit(cpu.collect, number=n) / n
    t_psi = timeit.timeit(p.collect, number=n) / n if p else 0.0
    print(f"\nfast tier per tick: cpu+system {t_cpu * 1e6:.1f} us, pressure {t_psi * 1e6:.1f} us")
    assert t_cpu + t_psi < 0.002  # generous: a shared CI core, not a benchmark


def test_cgroup_groups_come_and_go_between_listings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from ingest.collectors import cgroup

    base = tmp_path / "sys/fs/cgroup"

    def group(name: str, usage: int) -> None:
        d = base / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.stat").write_text(f"usage_usec {usage}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
        (d / "memory.current").write_text("4096\n")

    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu memory\n")
    group("a.slice", 10)
    c = CgroupCollector(tmp_path)
    r = c.collect()[0]
    assert r.tags["cgroup"] == ["a.slice"] and r.fields["cpu_usage"] == [10]
    group("b.slice", 5)
    assert c.collect()[0].tags["cgroup"] == ["a.slice"]  # listed at most once a second
    monkeypatch.setattr(cgroup, "REFRESH_S", 0.0)
    r = c.collect()[0]
    assert r.tags["cgroup"] == ["a.slice", "b.slice"] and r.fields["cpu_usage"] == [10, 5]
    shutil.rmtree(base / "a.slice")
    assert c.collect()[0].tags["cgroup"] == ["b.slice"]
    c.close()
