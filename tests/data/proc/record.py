"""Record the /proc and /sys files the collectors read into a replayable tree.

    .venv/bin/python tests/data/proc/record.py tests/data/proc/normal

Copies each file's bytes (procfs/sysfs files report size 0, so they are read, not
copied with sendfile) and re-creates every symlink on the way with its own relative
target, so ``os.path.realpath`` inside the tree resolves the way it does on the host
(NIC -> PCI function, block device -> PCI function, bus/pci/devices -> devices/...).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

FILES = [
    "/proc/stat",
    "/proc/loadavg",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/meminfo",
    "/proc/vmstat",
    "/proc/pressure/cpu",
    "/proc/pressure/memory",
    "/proc/pressure/io",
    "/proc/net/dev",
    "/proc/net/snmp",
    "/proc/diskstats",
    "/proc/cpuinfo",
    "/proc/sys/kernel/osrelease",
    "/proc/irq/*/smp_affinity_list",
    "/proc/irq/*/effective_affinity_list",
    "/sys/devices/system/node/node*/cpulist",
    "/sys/devices/system/node/node*/numastat",
    "/sys/devices/system/node/node*/meminfo",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq",
    "/sys/devices/system/cpu/cpufreq/policy*/scaling_governor",
    "/sys/devices/system/cpu/cpufreq/policy*/scaling_driver",
    "/sys/devices/system/cpu/cpufreq/policy*/related_cpus",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/class/net/*/speed",
    "/sys/bus/pci/devices/*/numa_node",
    "/sys/bus/pci/devices/*/msi_irqs/*",
    "/sys/bus/pci/devices/*/current_link_speed",
    "/sys/bus/pci/devices/*/max_link_speed",
    "/sys/bus/pci/devices/*/current_link_width",
    "/sys/bus/pci/devices/*/max_link_width",
    "/sys/fs/cgroup/cgroup.controllers",
    "/sys/fs/cgroup/*/cpu.stat",
    "/sys/fs/cgroup/*/cpu.max",
    "/sys/fs/cgroup/*/memory.current",
    "/sys/fs/cgroup/*/memory.max",
    "/sys/fs/cgroup/*/cpu.pressure",
    "/sys/fs/cgroup/*/memory.pressure",
    "/sys/fs/cgroup/cpu/cpu.stat",
    "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
    "/sys/fs/cgroup/cpuacct/cpuacct.usage",
    "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/fs/cgroup/cpu*/*/cpu.stat",
    "/sys/fs/cgroup/cpu*/*/cpu.cfs_quota_us",
    "/sys/fs/cgroup/cpu*/*/cpu.cfs_period_us",
    "/sys/fs/cgroup/cpu*/*/cpuacct.usage",
    "/sys/fs/cgroup/memory/*/memory.usage_in_bytes",
    "/sys/fs/cgroup/memory/*/memory.limit_in_bytes",
]
#: links recorded as links (their targets are not needed)
LINKS = ["/sys/class/net/*/device/driver", "/sys/block/*/device/driver"]
#: directories whose presence matters (listed by the collectors)
DIRS = ["/sys/class/net/*", "/sys/block/*", "/sys/class/net/*/device", "/sys/block/*/device"]


def _walk(live: str, dest: Path, *, keep_last_link: bool = False) -> str:
    """Re-create the symlinks on the way to ``live`` below ``dest``; return the resolved path."""
    parts = Path(live).parts
    cur = "/"
    for i, part in enumerate(parts[1:], start=1):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            target = os.readlink(cur)
            dst = dest / cur.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(dst):
                os.symlink(target, dst)
            if keep_last_link and i == len(parts) - 1:
                return cur
            cur = _walk(os.path.normpath(os.path.join(os.path.dirname(cur), target)), dest)
    return cur


def record(dest: Path) -> None:
    for pattern in FILES:
        for live in sorted(glob.glob(pattern)):
            try:
                with open(live, "rb") as f:
                    data = f.read()
            except OSError:
                continue  # e.g. speed of a virtual interface: EINVAL
            real = _walk(live, dest)
            out = dest / real.lstrip("/")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
    for pattern in DIRS:
        for live in sorted(glob.glob(pattern)):
            real = _walk(live, dest)
            (dest / real.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for pattern in LINKS:
        for live in sorted(glob.glob(pattern)):
            _walk(live, dest, keep_last_link=True)
    # /proc/net -> self/net -> <recorder pid>/net: keep a plain directory instead
    net = dest / "proc/net"
    if net.is_symlink():
        real = net.resolve()
        net.unlink()
        shutil.move(str(real), str(net))
        for p in (dest / "proc/self", real.parent):
            if p.is_symlink():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)


if __name__ == "__main__":
    record(Path(sys.argv[1]))
