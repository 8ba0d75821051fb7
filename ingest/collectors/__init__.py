"""Collectors: one module per telemetry source, listed in one table.

Each class follows :class:`ingest.collectors.base.Collector`: ``Cls(root="/", **options)``
(raises SourceUnavailable when the source does not exist on this host), then
``collect()`` on every tick of its tier and ``close()``. To add a source, write one
module and add one line to :data:`REGISTRY` (see docs/collectors.md).
"""

from __future__ import annotations

from ingest.collectors import (
    cgroup,
    cpu,
    disk,
    gpu,
    hostfacts,
    interrupts,
    memory,
    net,
    numa,
    perf,
    pressure,
    softirqs,
    vmstat,
)

#: registry name -> collector class; the agent instantiates the enabled ones
REGISTRY: dict[str, type] = {
    "cpu": cpu.CpuCollector,  # /proc/stat, /proc/loadavg, cpufreq -> cpu, system (fast)
    "pressure": pressure.PressureCollector,  # /proc/pressure/* -> pressure (fast)
    "interrupts": interrupts.InterruptsCollector,  # /proc/interrupts -> interrupts (medium)
    "softirqs": softirqs.SoftirqsCollector,  # /proc/softirqs -> softirqs (medium)
    "memory": memory.MemoryCollector,  # /proc/meminfo -> memory (medium)
    "vmstat": vmstat.VmstatCollector,  # /proc/vmstat -> vmstat (medium)
    "numa": numa.NumaCollector,  # node*/numastat, node*/meminfo -> numa (medium)
    "net": net.NetCollector,  # /proc/net/dev -> net (medium)
    "tcp": net.TcpCollector,  # /proc/net/snmp -> tcp (medium)
    "disk": disk.DiskCollector,  # /proc/diskstats -> disk (medium)
    "cgroup": cgroup.CgroupCollector,  # /sys/fs/cgroup -> cgroup (medium)
    "hostfacts": hostfacts.HostFactsCollector,  # /sys, /proc -> host_facts (static)
    "gpu": gpu.GpuCollector,  # NVML -> gpu (+ gpu host facts)
    "perf": perf.PerfCollector,  # perf stat -> perf
}

__all__ = ["REGISTRY"]
