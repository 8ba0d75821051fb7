"""The feature catalog: every feature family the analytics compute, with its meaning.

Feature columns are named ``<family>`` (host-wide) or ``<family>@<device>`` (one
device: a GPU, NIC, disk, NUMA node, cgroup ...), e.g. ``gpu.power_ratio@gpu3``,
``irq.locality@mlx5_0``, ``mem.hugepage_coverage``. These names are a public contract:
the knowledge base's signatures reference them, so a rename is a CHANGELOG entry.

Each family carries its unit, its subsystem (cpu, gpu, memory, interconnect, network,
storage; ``other`` for imported metrics without known semantics), a description and
the *direction of trouble* (``up``: higher is worse, ``down``: lower is worse,
``both``), and ``floor``: the smallest change of the feature worth noticing, used as
the lower bound of its robust scale so that a channel that never changes is not
"100 % anomalous" the first time it moves by a rounding error (see
:mod:`analytics.detectors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Direction = Literal["up", "down", "both"]

#: subsystems of the fingerprint, in profile order
SUBSYSTEMS: tuple[str, ...] = ("cpu", "gpu", "memory", "interconnect", "network", "storage", "other")

DEVICE_SEP = "@"


@dataclass(frozen=True)
class FeatureFamily:
    name: str
    subsystem: str
    unit: str
    direction: Direction
    floor: float
    description: str
    #: follows the workload's load on a healthy host: the detectors weigh it as activity
    #: (context, :func:`analytics.pipeline.evidence_weights`), one-sided still; signatures
    #: read it as they do any feature
    context: bool = False


@dataclass(frozen=True)
class FeatureInfo:
    """What one feature column is: its family, device and the family's metadata."""

    feature: str
    family: str
    device: str
    subsystem: str
    unit: str
    direction: Direction
    floor: float
    description: str
    context: bool = False


def _fam(name: str, subsystem: str, unit: str, direction: Direction, floor: float, desc: str,
         context: bool = False) -> FeatureFamily:
    return FeatureFamily(name, subsystem, unit, direction, floor, desc, context)


# floors: ratios/shares 0.02 (two percentage points); rates roughly "one event per second"
_FAMILIES: list[FeatureFamily] = [
    # ------------------------------------------------------------------ cpu (per NUMA node)
    _fam("cpu.user_share", "cpu", "fraction", "both", 0.02, "user+nice ticks / all ticks of the node's CPUs"),
    _fam("cpu.system_share", "cpu", "fraction", "up", 0.02, "system ticks / all ticks"),
    _fam("cpu.iowait_share", "cpu", "fraction", "up", 0.02, "iowait ticks / all ticks"),
    _fam("cpu.irq_share", "cpu", "fraction", "up", 0.01, "hard-IRQ ticks / all ticks"),
    _fam("cpu.softirq_share", "cpu", "fraction", "up", 0.01, "softirq ticks / all ticks"),
    _fam("cpu.steal_share", "cpu", "fraction", "up", 0.01, "steal ticks / all ticks (hypervisor took the CPU)"),
    _fam("cpu.busy_share", "cpu", "fraction", "both", 0.02, "1 - (idle+iowait) / all ticks"),
    _fam("cpu.freq_mhz", "cpu", "MHz", "down", 50.0, "mean current CPU frequency (governor in powersave shows here)"),
    # ------------------------------------------------------------------ cpu (host-wide)
    _fam("cpu.ctxt_rate", "cpu", "1/s", "both", 1000.0, "context switches per second (an event rate: activity, not evidence)"),
    _fam("cpu.fork_rate", "cpu", "1/s", "up", 5.0, "processes created per second"),
    _fam("cpu.procs_running", "cpu", "tasks", "up", 1.0, "mean runnable tasks"),
    _fam("cpu.procs_blocked", "cpu", "tasks", "up", 1.0, "mean tasks blocked on I/O"),
    _fam("cpu.load1", "cpu", "tasks", "up", 1.0, "mean 1-minute load average"),
    _fam("cpu.own_cores", "cpu", "cores", "up", 0.1,
         "cores used by Unveil's own units (unveil.slice): set apart, never judged by the detectors"),
    _fam("softirq.rate", "cpu", "1/s", "both", 100.0, "softirqs of one type (device = type, e.g. NET_RX) per second"),
    _fam("psi.cpu_some_share", "cpu", "fraction", "up", 0.01, "share of time some tasks stalled on CPU (PSI some_total)"),
    _fam("psi.cpu_some_avg10", "cpu", "fraction", "up", 0.01, "PSI cpu some avg10 / 100 (kernel's 10-s average)"),
    _fam("psi.memory_some_share", "memory", "fraction", "up", 0.01, "share of time some tasks stalled on memory"),
    _fam("psi.memory_full_share", "memory", "fraction", "up", 0.01, "share of time all tasks stalled on memory"),
    _fam("psi.memory_some_avg10", "memory", "fraction", "up", 0.01, "PSI memory some avg10 / 100"),
    _fam("psi.io_some_share", "storage", "fraction", "up", 0.01, "share of time some tasks stalled on I/O"),
    _fam("psi.io_full_share", "storage", "fraction", "up", 0.01, "share of time all tasks stalled on I/O"),
    _fam("psi.io_some_avg10", "storage", "fraction", "up", 0.01, "PSI io some avg10 / 100"),
    # ------------------------------------------------------------------ cgroups (device = cgroup)
    _fam("cgroup.throttled_share", "cpu", "fraction", "up", 0.02, "CFS periods throttled / periods (nr_throttled/nr_periods)"),
    _fam("cgroup.throttled_time_share", "cpu", "fraction", "up", 0.02, "throttled time / window length"),
    _fam("cgroup.cpu_cores", "cpu", "cores", "both", 0.1, "CPU time used per second (cores busy)"),
    _fam("cgroup.quota_use_share", "cpu", "fraction", "up", 0.02, "cores used / CFS quota (null when unlimited)"),
    _fam("cgroup.mem_use_share", "memory", "fraction", "up", 0.02, "memory in use / limit (null when unlimited)"),
    _fam("cgroup.cpu_pressure_share", "cpu", "fraction", "up", 0.01, "cgroup PSI cpu some time / window length"),
    _fam("cgroup.memory_pressure_share", "memory", "fraction", "up", 0.01, "cgroup PSI memory some time / window length"),
    # ------------------------------------------------------------------ perf (device = socket)
    _fam("perf.ipc", "cpu", "instructions/cycle", "down", 0.05, "instructions per cycle"),
    _fam("perf.llc_miss_share", "memory", "fraction", "up", 0.02, "LLC misses / LLC loads"),
    _fam("perf.mem_bandwidth", "memory", "bytes/s", "both", 1e8, "memory-controller traffic per second (bandwidth proxy)"),
    # ------------------------------------------------------------------ memory
    _fam("mem.hugepage_coverage", "memory", "fraction", "down", 0.02, "AnonHugePages / AnonPages: share of anonymous memory on THP"),
    _fam("mem.available_share", "memory", "fraction", "down", 0.02, "MemAvailable / MemTotal"),
    _fam("mem.dirty_share", "memory", "fraction", "up", 0.005, "(Dirty+Writeback) / MemTotal"),
    _fam("mem.swap_used_share", "memory", "fraction", "up", 0.01, "swap used / swap total (null without swap)"),
    _fam("mem.hugetlb_used_share", "memory", "fraction", "both", 0.02, "HugeTLB pages in use / pages reserved (null without HugeTLB)"),
    _fam("mem.page_tables_share", "memory", "fraction", "up", 0.002, "PageTables / MemTotal (TLB/page-walk pressure proxy)"),
    _fam("mem.thp_fault_alloc_rate", "memory", "1/s", "both", 0.5, "THP faults served with a huge page, per second (workload activity: the KB reads a drop with the mode fact)"),
    _fam("mem.thp_fallback_rate", "memory", "1/s", "up", 1.0, "THP faults that fell back to small pages, per second"),
    _fam("mem.thp_fallback_share", "memory", "fraction", "up", 0.02, "thp_fault_fallback / (thp_fault_alloc + thp_fault_fallback)"),
    _fam("mem.pgfault_rate", "memory", "1/s", "up", 1000.0, "page faults per second"),
    _fam("mem.pgmajfault_rate", "memory", "1/s", "up", 5.0, "major page faults per second"),
    _fam("mem.swap_rate", "memory", "pages/s", "up", 5.0, "pages swapped in+out per second"),
    _fam("mem.direct_scan_rate", "memory", "pages/s", "up", 50.0, "pages scanned by direct reclaim per second"),
    _fam("mem.kswapd_scan_rate", "memory", "pages/s", "up", 50.0, "pages scanned by kswapd per second"),
    _fam("mem.compact_stall_rate", "memory", "1/s", "up", 1.0, "compaction stalls per second"),
    _fam("mem.allocstall_rate", "memory", "1/s", "up", 1.0, "allocation stalls (direct reclaim entries) per second"),
    # ------------------------------------------------------------------ NUMA (interconnect)
    _fam("numa.remote_share", "interconnect", "fraction", "up", 0.02, "numa_miss / (numa_hit + numa_miss); per node from numastat, host-wide from vmstat"),
    _fam("numa.other_node_share", "interconnect", "fraction", "up", 0.02, "other_node / (local_node + other_node): allocations by processes of another node"),
    _fam("numa.migration_rate", "interconnect", "pages/s", "up", 100.0, "NUMA pages migrated per second"),
    _fam("numa.hint_fault_remote_share", "interconnect", "fraction", "up", 0.02, "1 - numa_hint_faults_local / numa_hint_faults"),
    # ------------------------------------------------------------------ interrupts
    _fam("irq.locality", "interconnect", "fraction", "down", 0.02, "interrupts of the device serviced on its own NUMA node / all its interrupts (node from host_facts)"),
    _fam("irq.rate", "interconnect", "1/s", "both", 100.0, "interrupts of the device per second"),
    # ------------------------------------------------------------------ GPU (device = gpuN)
    _fam("gpu.util", "gpu", "fraction", "both", 0.02, "mean SM busy share (NVML utilization.gpu / 100)"),
    _fam("gpu.mem_util", "gpu", "fraction", "both", 0.02, "mean memory-controller busy share"),
    _fam("gpu.mem_used_share", "gpu", "fraction", "both", 0.02, "framebuffer used / total"),
    _fam("gpu.power_ratio", "gpu", "fraction", "both", 0.02, "power draw / enforced power limit"),
    _fam("gpu.power_limit_ratio", "gpu", "fraction", "down", 0.02, "enforced power limit / default power limit (a lowered cap shows < 1)"),
    _fam("gpu.sm_clock_ratio", "gpu", "fraction", "down", 0.02, "SM clock / maximum SM clock while busy (>= 10 % util)"),
    _fam("gpu.mem_clock_ratio", "gpu", "fraction", "down", 0.02, "memory clock / maximum memory clock"),
    # context, not evidence: a GPU's temperature follows its power draw, and a healthy GPU at
    # its *default* limit sits at its power cap under load (a real H200: ~180 s of SW power
    # cap in a 3-min bf16 load, tests/data/hosts). A busier healthy host is warmer and more
    # capped than its peers; the faults are read elsewhere: thermal from the thermal reasons
    # and violation time, a lowered cap from the limit (gpu.power_limit_ratio)
    _fam("gpu.temperature_max", "gpu", "C", "up", 2.0, "maximum GPU temperature in the window (context)",
         context=True),
    _fam("gpu.throttle_power_share", "gpu", "fraction", "up", 0.02, "share of samples with a power throttle reason (SW power cap 0x4 or HW power brake 0x80) (context)",
         context=True),
    _fam("gpu.throttle_thermal_share", "gpu", "fraction", "up", 0.02, "share of samples with a thermal throttle reason (SW thermal 0x20 or HW thermal 0x40)"),
    _fam("gpu.throttle_hw_slowdown_share", "gpu", "fraction", "up", 0.02, "share of samples with HW slowdown (0x8)"),
    _fam("gpu.power_violation_share", "gpu", "fraction", "up", 0.02, "time clocks were held by the power cap / window length (context)",
         context=True),
    _fam("gpu.thermal_violation_share", "gpu", "fraction", "up", 0.02, "time clocks were held by thermal limits / window length"),
    _fam("gpu.ecc_corrected_rate", "gpu", "1/s", "up", 0.5, "corrected ECC errors per second"),
    _fam("gpu.ecc_uncorrected_rate", "gpu", "1/s", "up", 0.1, "uncorrected ECC errors per second"),
    _fam("gpu.xid_rate", "gpu", "1/s", "up", 0.1, "XID events per second"),
    _fam("pcie.link_gen_ratio", "interconnect", "fraction", "down", 0.05, "minimum PCIe link generation while busy (>= 10 % util) / maximum generation"),
    _fam("pcie.link_width_ratio", "interconnect", "fraction", "down", 0.05, "minimum PCIe link width while busy (>= 10 % util) / maximum width"),
    _fam("pcie.tx_rate", "interconnect", "KB/s", "both", 1e4, "mean PCIe transmit throughput"),
    _fam("pcie.rx_rate", "interconnect", "KB/s", "both", 1e4, "mean PCIe receive throughput"),
    _fam("nvlink.tx_rate", "interconnect", "KiB/s", "both", 1e4, "NVLink data transmitted per second"),
    _fam("nvlink.rx_rate", "interconnect", "KiB/s", "both", 1e4, "NVLink data received per second"),
    # ------------------------------------------------------------------ network (device = interface)
    _fam("net.rx_bytes_rate", "network", "bytes/s", "both", 1e6, "received bytes per second"),
    _fam("net.tx_bytes_rate", "network", "bytes/s", "both", 1e6, "sent bytes per second"),
    _fam("net.drop_rate", "network", "packets/s", "up", 1.0, "packets dropped (rx+tx dropped, rx FIFO overruns) per second"),
    _fam("net.drop_share", "network", "fraction", "up", 1e-4,
         "received packets dropped (rx_dropped + rx_fifo) / packets offered (received + dropped)"),
    _fam("net.error_rate", "network", "packets/s", "up", 1.0, "rx+tx errors per second"),
    _fam("net.retrans_share", "network", "fraction", "up", 0.005, "TCP segments retransmitted / segments sent"),
    _fam("net.retrans_rate", "network", "segments/s", "up", 5.0, "TCP retransmissions per second"),
    _fam("net.in_err_rate", "network", "segments/s", "up", 1.0, "TCP segments received in error per second"),
    _fam("net.active_open_rate", "network", "1/s", "up", 5.0, "TCP active connection openings per second"),
    # ------------------------------------------------------------------ storage (device = disk)
    _fam("disk.latency_ms", "storage", "ms", "up", 0.5, "(read_time + write_time) / (reads + writes): mean I/O latency"),
    _fam("disk.util", "storage", "fraction", "both", 0.02, "time with I/O in flight / window length"),
    _fam("disk.queue_depth", "storage", "requests", "up", 0.5, "weighted I/O time / window length: mean queue depth"),
    _fam("disk.read_iops", "storage", "1/s", "both", 20.0, "reads completed per second"),
    _fam("disk.write_iops", "storage", "1/s", "both", 20.0, "writes completed per second"),
    _fam("disk.read_bytes_rate", "storage", "bytes/s", "both", 1e6, "bytes read per second"),
    _fam("disk.write_bytes_rate", "storage", "bytes/s", "both", 1e6, "bytes written per second"),
]

FAMILIES: dict[str, FeatureFamily] = {f.name: f for f in _FAMILIES}

#: default for features of unknown families (imported metrics)
_OTHER_FLOOR = 0.0


def feature_name(family: str, device: str | None = None) -> str:
    """``family`` or ``family@device``."""
    return family if not device else f"{family}{DEVICE_SEP}{device}"


def split_feature(feature: str) -> tuple[str, str]:
    """``"gpu.power_ratio@gpu3"`` -> ``("gpu.power_ratio", "gpu3")``; no device -> ``""``."""
    family, _, device = feature.partition(DEVICE_SEP)
    return family, device


@lru_cache(maxsize=16384)  # called per column by every analyze(); FeatureInfo is frozen
def lookup(feature: str) -> FeatureInfo:
    """Metadata of one feature column. Unknown families (imported metrics) get
    subsystem ``other``, direction ``both`` and no floor."""
    family, device = split_feature(feature)
    fam = FAMILIES.get(family)
    if fam is None:
        return FeatureInfo(feature, family, device, "other", "", "both", _OTHER_FLOOR, "imported metric (no known semantics)")
    return FeatureInfo(feature, family, device, fam.subsystem, fam.unit, fam.direction, fam.floor, fam.description,
                       fam.context)


def markdown() -> str:
    """The catalog as a Markdown table (docs/analytics.md embeds it)."""
    out = [
        "| family | subsystem | unit | trouble | floor | description |",
        "|---|---|---|---|---|---|",
    ]
    for f in _FAMILIES:
        out.append(f"| `{f.name}` | {f.subsystem} | {f.unit} | {f.direction} | {f.floor:g} | {f.description} |")
    return "\n".join(out)
