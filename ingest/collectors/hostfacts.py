"""Static host facts -> ``host_facts``: topology, device placement and knobs.

One row per fact: tags category / device / key, fields value (text) and value_num (when
numeric). A fact the host does not expose has no row (absence = unknown). Categories:

- system: kernel release;  cpu: count, online list, model;
- numa: node count, each node's cpulist and cpu count (device = node number);
- nic: each NIC with a device behind it: pci address, numa_node, driver, speed (Mb/s);
- nvme (nvme*) / disk (other whole disks): pci address, numa_node, driver;
- pcie: current/max link speed (GT/s) and width (lanes) of those NICs' and disks' PCI
  functions (device = PCI address);
- irq: per IRQ line (device = IRQ number): its device (action name), smp_affinity_list,
  effective_affinity_list, affinity_nodes, and when the device behind it is known
  (msi_irqs of a PCI function, or a PCI address in the line) its pci address and node;
- thp: enabled and defrag modes;  power: cpufreq governor per policy, scaling driver.

GPU facts come from the GPU collector's ``facts()``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ingest.collectors.base import CollectorError, Reading, Value, proc_path
from ingest.collectors.interrupts import irq_device
from ingest.collectors.procfs import (
    bracketed,
    cpu_node_map,
    format_cpulist,
    numa_nodes,
    parse_cpulist,
    read_text,
)
from ingest.schema import Tier

_PCI_ADDR = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_SKIP_BLOCK = ("loop", "ram", "zram")
_LINK_KEYS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def pci_function(path: str | Path) -> Path | None:
    """The PCI function directory above a sysfs device path (a NIC's ``device`` link, a
    block device's ``device`` ...), following symlinks; None for virtual devices."""
    real = Path(os.path.realpath(path))
    for p in (real, *real.parents):
        if _PCI_ADDR.fullmatch(p.name):
            return p
    return None


class _Facts:
    def __init__(self) -> None:
        self.category: list[str] = []
        self.device: list[str] = []
        self.key: list[str] = []
        self.value: list[Value] = []
        self.value_num: list[Value] = []

    def add(
        self,
        category: str,
        device: str,
        key: str,
        value: str | None,
        num: float | None | bool = True,
    ) -> None:
        """``num``: True = value_num parsed from value when it is a number, None/False =
        no numeric value (lists, names), a float = that value."""
        if value is None or value == "":
            return
        self.category.append(category)
        self.device.append(device)
        self.key.append(key)
        self.value.append(value)
        self.value_num.append(
            _num(value) if num is True else (None if num is None or num is False else float(num))
        )

    def reading(self) -> Reading:
        return Reading(
            "host_facts",
            tags={"category": self.category, "device": self.device, "key": self.key},
            fields={"value": self.value, "value_num": self.value_num},
        )


class HostFactsCollector:
    name = "hostfacts"
    measurements: tuple[str, ...] = ("host_facts",)
    tier: Tier = "static"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._root = root

    def _p(self, *parts: str) -> Path:
        return proc_path(self._root, *parts)

    def collect(self) -> list[Reading]:
        return [self.facts()]

    def facts(self) -> Reading:
        out = _Facts()
        out.add("system", "", "kernel", read_text(self._p("proc/sys/kernel/osrelease")))
        self._cpu(out)
        nodes = numa_nodes(self._root)
        cpu_node = cpu_node_map(self._root)
        if nodes != {0: []}:
            out.add("numa", "", "nodes", str(len(nodes)))
            for n, cpus in nodes.items():
                out.add("numa", str(n), "cpulist", format_cpulist(cpus) or "(none)", None)
                out.add("numa", str(n), "cpus", str(len(cpus)))
        pci = self._nics(out) + self._disks(out)
        for addr, fn in dict(pci).items():
            for k in _LINK_KEYS:
                v = read_text(fn / k)
                if v is not None:
                    out.add("pcie", addr, k, v, _num(v.split()[0]) if v.split() else None)
        self._irqs(out, cpu_node)
        thp = self._p("sys/kernel/mm/transparent_hugepage")
        out.add("thp", "", "enabled", bracketed(read_text(thp / "enabled")))
        out.add("thp", "", "defrag", bracketed(read_text(thp / "defrag")))
        self._power(out)
        return out.reading()

    def _cpu(self, out: _Facts) -> None:
        online = read_text(self._p("sys/devices/system/cpu/online"))
        if online is not None:
            out.add("cpu", "", "online", online, None)
            out.add("cpu", "", "count", str(len(parse_cpulist(online, where="cpu/online"))))
        else:
            try:
                with open(self._p("proc/stat"), "rb") as f:
                    n = sum(1 for line in f if line[:3] == b"cpu" and line[3:4] != b" ")
                out.add("cpu", "", "count", str(n))
            except OSError:
                pass
        try:
            with open(self._p("proc/cpuinfo"), "rb") as f:
                for line in f:
                    if line.startswith(b"model name"):
                        out.add(
                            "cpu",
                            "",
                            "model",
                            line.partition(b":")[2].strip().decode("utf-8", "replace"),
                        )
                        break
        except OSError:
            pass

    def _device_facts(
        self, out: _Facts, category: str, name: str, dev_link: Path
    ) -> tuple[str, Path] | None:
        fn = pci_function(dev_link)
        # an NVMe namespace's device is the nvme class device: its driver is on the PCI function
        for driver in (dev_link / "driver", fn / "driver" if fn is not None else None):
            if driver is not None and driver.is_symlink():
                out.add(category, name, "driver", os.path.basename(os.readlink(driver)))
                break
        if fn is None:
            return None
        out.add(category, name, "pci", fn.name)
        out.add(category, name, "numa_node", read_text(fn / "numa_node"))
        return fn.name, fn

    def _nics(self, out: _Facts) -> list[tuple[str, Path]]:
        base = self._p("sys/class/net")
        found: list[tuple[str, Path]] = []
        for name in sorted(os.listdir(base)) if base.is_dir() else []:
            dev = base / name / "device"
            if not dev.exists():
                continue  # virtual interface (lo, bridges, veth, ifb ...)
            r = self._device_facts(out, "nic", name, dev)
            speed = read_text(base / name / "speed")
            if speed is not None and speed.lstrip("-").isdigit() and int(speed) > 0:
                out.add("nic", name, "speed", speed)
            if r is not None:
                found.append(r)
        return found

    def _disks(self, out: _Facts) -> list[tuple[str, Path]]:
        base = self._p("sys/block")
        found: list[tuple[str, Path]] = []
        for name in sorted(os.listdir(base)) if base.is_dir() else []:
            if name.startswith(_SKIP_BLOCK):
                continue
            dev = base / name / "device"
            if not dev.exists():
                continue  # dm-*, md*: no device of their own
            r = self._device_facts(out, "nvme" if name.startswith("nvme") else "disk", name, dev)
            if r is not None:
                found.append(r)
        return found

    def _msi_map(self) -> dict[str, Path]:
        """IRQ number -> PCI function, from /sys/bus/pci/devices/*/msi_irqs/."""
        base = self._p("sys/bus/pci/devices")
        out: dict[str, Path] = {}
        for addr in sorted(os.listdir(base)) if base.is_dir() else []:
            try:
                irqs = os.listdir(base / addr / "msi_irqs")
            except OSError:
                continue
            fn = Path(os.path.realpath(base / addr))
            for irq in irqs:
                out[irq] = fn
        return out

    def _irqs(self, out: _Facts, cpu_node: dict[int, str]) -> None:
        path = self._p("proc/interrupts")
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError:
            return
        ncpu = len(lines[0].split())
        msi = self._msi_map()
        pci_nodes: dict[Path, str | None] = {}
        for line in lines[1:]:
            parts = line.split()
            if not parts or not parts[0][:-1].isdigit():
                continue
            irq = parts[0][:-1].decode()
            tail = b" ".join(parts[1 + ncpu :])
            out.add("irq", irq, "device", irq_device(tail))
            irqdir = self._p("proc/irq", irq)
            aff = read_text(irqdir / "smp_affinity_list")
            out.add("irq", irq, "smp_affinity_list", aff, None)
            out.add(
                "irq",
                irq,
                "effective_affinity_list",
                read_text(irqdir / "effective_affinity_list"),
                None,
            )
            if aff:
                try:
                    cpus = parse_cpulist(aff, where=str(irqdir / "smp_affinity_list"))
                except CollectorError:
                    cpus = []
                nodes = sorted({cpu_node.get(c, "0") for c in cpus}, key=int)
                out.add("irq", irq, "affinity_nodes", ",".join(nodes), None)
            fn = msi.get(irq)
            if fn is None:
                m = _PCI_ADDR.search(tail.decode("utf-8", "replace"))
                if m is not None:
                    cand = self._p("sys/bus/pci/devices", m.group(0))
                    fn = Path(os.path.realpath(cand)) if cand.exists() else None
            if fn is None:
                continue
            out.add("irq", irq, "pci", fn.name)
            if fn not in pci_nodes:
                pci_nodes[fn] = read_text(fn / "numa_node")
            out.add("irq", irq, "device_node", pci_nodes[fn])

    def _power(self, out: _Facts) -> None:
        base = self._p("sys/devices/system/cpu/cpufreq")
        policies = [p for p in os.listdir(base) if p.startswith("policy")] if base.is_dir() else []
        for p in sorted(policies, key=lambda s: int(s[6:]) if s[6:].isdigit() else 1 << 30):
            out.add("power", p, "scaling_governor", read_text(base / p / "scaling_governor"))
            out.add("power", p, "related_cpus", read_text(base / p / "related_cpus"), None)
        if policies:
            out.add(
                "power",
                "",
                "scaling_driver",
                read_text(base / sorted(policies)[0] / "scaling_driver"),
            )

    def close(self) -> None:
        pass
