"""Derive the ``missing_fields`` and ``wrap`` trees from ``normal`` (the recorded VM).

    .venv/bin/python tests/data/proc/make_variants.py

missing_fields: what an old kernel (CentOS-7-like, 3.10) or a minimal VM shows:
  no /proc/pressure; /proc/vmstat without thp_* and numa_* (and 'allocstall' instead of
  allocstall_normal); /proc/meminfo without MemAvailable, AnonHugePages and the
  HugePages lines; /proc/stat cpu lines without steal/guest columns; no NUMA node
  directory; no THP directory; no cpufreq; /proc/interrupts in the old 'chip-edge'
  format; /proc/diskstats with 14 columns; no effective_affinity_list; cgroup v1 with
  the combined 'cpu,cpuacct' hierarchy and a group with a 1.5-core quota.
wrap/t0, wrap/t1: two snapshots of /proc/interrupts and /proc/net/dev (see WRAP below).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
NORMAL = HERE / "normal"


def _edit(path: Path, fn: Callable[[str], str]) -> None:
    path.write_text(fn(path.read_text()))


def _drop_lines(prefixes: tuple[str, ...]) -> Callable[[str], str]:
    return lambda t: "".join(line for line in t.splitlines(True) if not line.startswith(prefixes))


def missing_fields() -> None:
    out = HERE / "missing_fields"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(NORMAL, out, symlinks=True)
    shutil.rmtree(out / "proc/pressure")
    shutil.rmtree(out / "sys/devices/system/node")
    shutil.rmtree(out / "sys/kernel/mm/transparent_hugepage")
    _edit(
        out / "proc/vmstat",
        lambda t: _drop_lines(("thp_", "numa_", "allocstall_"))(t) + "allocstall 5\n",
    )
    _edit(
        out / "proc/meminfo",
        _drop_lines(("MemAvailable:", "AnonHugePages:", "HugePages_", "Hugepagesize:")),
    )
    # cpuN user nice system idle iowait irq softirq   (no steal, guest, guest_nice)
    _edit(
        out / "proc/stat",
        lambda t: "".join(
            (" ".join(line.split()[:8]) + "\n") if line.startswith("cpu") else line
            for line in t.splitlines(True)
        ),
    )
    # '  PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0' -> '  PCI-MSI-edge      virtio2-input.0'
    _edit(
        out / "proc/interrupts",
        lambda t: re.sub(
            r" +(IO-APIC|PCI-MSIX-[0-9a-f:.]+) +\d+-(edge|fasteoi)",
            lambda m: (
                "  " + ("IO-APIC" if m.group(1) == "IO-APIC" else "PCI-MSI") + "-" + m.group(2)
            ),
            t,
        ),
    )
    _edit(
        out / "proc/diskstats",
        lambda t: "".join(" ".join(line.split()[:14]) + "\n" for line in t.splitlines()),
    )
    for p in (out / "proc/irq").glob("*/effective_affinity_list"):
        p.unlink()
    cg = out / "sys/fs/cgroup"
    (cg / "cpu").rename(cg / "cpu,cpuacct")
    shutil.move(str(cg / "cpuacct/cpuacct.usage"), str(cg / "cpu,cpuacct/cpuacct.usage"))
    shutil.rmtree(cg / "cpuacct")
    shutil.rmtree(cg / "unified")
    grp = cg / "cpu,cpuacct/system.slice"
    grp.mkdir()
    (grp / "cpuacct.usage").write_text("123456789000\n")
    (grp / "cpu.stat").write_text("nr_periods 5000\nnr_throttled 250\nthrottled_time 7500000000\n")
    (grp / "cpu.cfs_quota_us").write_text("150000\n")
    (grp / "cpu.cfs_period_us").write_text("100000\n")


#: (IRQ, CPU0, CPU1) counts in t0 and t1 of /proc/interrupts; deltas per node (one node):
#:  36: CPU1 wraps 4294967000 -> 704: 296 + 704 = 1000 (node sum fits 32 bits)
#:  38: CPU0 wraps, CPU1 +100, the node sum is above 2**32: 296 + 200 + 100 = 596
#:  41: CPU0 1000000 -> 10 is no plausible wrap: a reset, counted from zero: 10
#: LOC: +100 and +50: 150
WRAP_IRQ = {
    "36": ((0, 4294967000), (0, 704)),
    "38": ((4294967000, 4000000000), (200, 4000000100)),
    "41": ((1000000, 0), (10, 0)),
    "LOC": ((15277, 19634), (15377, 19684)),
}
#: interface -> {column: (t0, t1)} of /proc/net/dev (columns as in the file)
#:  eth0 rx_packets: 32-bit driver counter wraps: 196;  eth0 tx_bytes: 64-bit wrap: 1500;
#:  eth0 rx_bytes: +100000;  ifb0 rx_bytes 5e9 -> 1000: reset (interface re-created): 1000
WRAP_NET = {
    "eth0": {0: (201778069, 201878069), 1: (4294967200, 100), 8: ((1 << 64) - 1000, 500)},
    "ifb0": {0: (5000000000, 1000)},
}


def _set_irq(text: str, snap: int) -> str:
    out = []
    for line in text.splitlines(True):
        label = line.split(":", 1)[0].strip()
        if label in WRAP_IRQ:
            c0, c1 = WRAP_IRQ[label][snap]
            colon = line.index(":")
            line = line[: colon + 1] + f" {c0:10d} {c1:10d}" + line[colon + 23 :]
        out.append(line)
    return "".join(out)


def _set_net(text: str, snap: int) -> str:
    out = []
    for line in text.splitlines(True):
        name, sep, rest = line.partition(":")
        if sep and name.strip() in WRAP_NET:
            vals = rest.split()
            for col, pair in WRAP_NET[name.strip()].items():
                vals[col] = str(pair[snap])
            line = f"{name}: " + " ".join(vals) + "\n"
        out.append(line)
    return "".join(out)


def wrap() -> None:
    out = HERE / "wrap"
    if out.exists():
        shutil.rmtree(out)
    for snap in (0, 1):
        root = out / f"t{snap}"
        (root / "proc/net").mkdir(parents=True)
        shutil.copytree(NORMAL / "sys/devices/system/node", root / "sys/devices/system/node")
        (root / "proc/interrupts").write_text(
            _set_irq((NORMAL / "proc/interrupts").read_text(), snap)
        )
        (root / "proc/net/dev").write_text(_set_net((NORMAL / "proc/net/dev").read_text(), snap))


if __name__ == "__main__":
    missing_fields()
    wrap()
