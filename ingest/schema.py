"""The telemetry schema: the single source of truth for every measurement.

Every measurement follows the InfluxDB model (measurement, tags, fields, time) and is
also one Parquet table of the lake. Names here are a public contract: SQL files,
dashboards and users' queries depend on them. A rename is a CHANGELOG entry under
"Important changes".

Counter semantics: fields of kind ``counter`` are **stored as deltas** — the increase
since the previous sample of the same series, with wraps and resets corrected at the
source by :mod:`ingest.counters`. The first sample of a series after the agent starts
has a null delta. Summing a counter field over a window gives the increase over that
window; dividing by the window length gives a rate. Gauges are stored as read.

Sparse tables (``sparse=True``) omit rows whose counter deltas are all zero, so a
missing (time, series) row in them means "no events", not "no data".

Every table has a ``time`` column (UTC, microseconds) and a ``host`` tag. In the lake
``host`` is a hive partition column (with ``date`` and ``hour``) rather than a column
stored in the files; readers get it back from the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import polars as pl

Kind = Literal["counter", "gauge", "state"]
Subsystem = Literal["cpu", "gpu", "memory", "interconnect", "network", "storage", "host"]
Tier = Literal["fast", "medium", "slow", "static"]

SUBSYSTEMS: tuple[str, ...] = ("cpu", "gpu", "memory", "interconnect", "network", "storage")

TIME = "time"
HOST = "host"
TIME_DTYPE = pl.Datetime("us", "UTC")

# Default sampling period of each tier, in seconds (the agent's config can override).
# Host facts are "static" but a knob flipped at run time (THP mode, IRQ affinity, a power
# limit) must reach the knowledge base within a minute; a full read costs ~5-12 ms.
TIER_PERIOD_S: dict[str, float] = {"fast": 0.1, "medium": 1.0, "slow": 10.0, "static": 60.0}


@dataclass(frozen=True)
class Field:
    name: str
    dtype: pl.DataType
    unit: str
    kind: Kind
    subsystem: Subsystem
    description: str


@dataclass(frozen=True)
class Measurement:
    name: str
    description: str
    source: str
    tags: tuple[str, ...]  # besides ``host``
    fields: tuple[Field, ...]
    tier: Tier = "fast"
    sparse: bool = False
    # counters a collector reads less often than every tick: null = not read, and the next
    # read's delta covers the time since the previous one (ingest.counters)
    polled: tuple[str, ...] = ()
    ground_truth: bool = False  # written by the simulator only; never seen by the agent
    field_index: dict[str, Field] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "field_index", {f.name: f for f in self.fields})

    @cached_property
    def counters(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.kind == "counter")

    @cached_property
    def gauges(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.kind != "counter")

    def polars_schema(self, *, with_host: bool = True) -> dict[str, pl.DataType]:
        """Column name -> dtype of a frame of this measurement (time, host, tags, fields)."""
        cols: dict[str, pl.DataType] = {TIME: TIME_DTYPE}
        if with_host:
            cols[HOST] = pl.String()
        for t in self.tags:
            cols[t] = pl.String()
        for f in self.fields:
            cols[f.name] = f.dtype
        return cols


def _f(name: str, dtype: pl.DataType, unit: str, kind: Kind, subsystem: Subsystem, desc: str) -> Field:
    return Field(name, dtype, unit, kind, subsystem, desc)


I64 = pl.Int64()
F32 = pl.Float32()
F64 = pl.Float64()


def _counters(names: list[tuple[str, str, str]], subsystem: Subsystem) -> list[Field]:
    return [_f(n, I64, u, "counter", subsystem, d) for n, u, d in names]


# --------------------------------------------------------------------------- cpu
CPU = Measurement(
    "cpu",
    "Per-CPU time from /proc/stat, plus current frequency from cpufreq.",
    "/proc/stat, /sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq",
    tags=("cpu", "node"),
    fields=tuple(
        _counters(
            [
                ("user", "ticks", "time in user mode (USER_HZ ticks, 1/100 s on Linux)"),
                ("nice", "ticks", "time in user mode at low priority"),
                ("system", "ticks", "time in kernel mode"),
                ("idle", "ticks", "idle time"),
                ("iowait", "ticks", "idle time waiting for I/O"),
                ("irq", "ticks", "time servicing hard interrupts"),
                ("softirq", "ticks", "time servicing softirqs"),
                ("steal", "ticks", "time stolen by the hypervisor"),
            ],
            "cpu",
        )
        + [_f("freq_mhz", F32, "MHz", "gauge", "cpu", "current frequency (scaling_cur_freq)")]
    ),
)

SYSTEM = Measurement(
    "system",
    "Host-wide scheduler counters from /proc/stat and /proc/loadavg.",
    "/proc/stat, /proc/loadavg",
    tags=(),
    fields=(
        _f("ctxt", I64, "switches", "counter", "cpu", "context switches"),
        _f("forks", I64, "processes", "counter", "cpu", "processes created"),
        _f("procs_running", F32, "tasks", "gauge", "cpu", "runnable tasks"),
        _f("procs_blocked", F32, "tasks", "gauge", "cpu", "tasks blocked on I/O"),
        _f("load1", F32, "tasks", "gauge", "cpu", "1-minute load average"),
    ),
)

# ------------------------------------------------------------------- interrupts
INTERRUPTS = Measurement(
    "interrupts",
    "Hard interrupts per IRQ line reduced at the source to per-NUMA-node counts. "
    "IRQ locality of a device = count on the device's node / count on all nodes.",
    "/proc/interrupts",
    tags=("irq", "device", "node"),
    fields=(_f("count", I64, "interrupts", "counter", "interconnect", "interrupts serviced on CPUs of this node"),),
    tier="medium",
    sparse=True,
)

SOFTIRQS = Measurement(
    "softirqs",
    "Softirqs per type reduced to per-NUMA-node counts.",
    "/proc/softirqs",
    tags=("softirq", "node"),
    fields=(_f("count", I64, "softirqs", "counter", "cpu", "softirqs run on CPUs of this node"),),
    tier="medium",
    sparse=True,
)

# ------------------------------------------------------------------------ memory
_MEMINFO_FIELDS = [
    ("mem_total", "MemTotal"),
    ("mem_free", "MemFree"),
    ("mem_available", "MemAvailable"),
    ("cached", "Cached"),
    ("dirty", "Dirty"),
    ("writeback", "Writeback"),
    ("anon_pages", "AnonPages"),
    ("anon_huge_pages", "AnonHugePages"),
    ("shmem", "Shmem"),
    ("page_tables", "PageTables"),
    ("swap_total", "SwapTotal"),
    ("swap_free", "SwapFree"),
    ("hugepages_total", "HugePages_Total"),
    ("hugepages_free", "HugePages_Free"),
    ("hugepages_rsvd", "HugePages_Rsvd"),
    ("hugepagesize", "Hugepagesize"),
]
#: lake field -> /proc/meminfo key; sizes are stored in bytes, HugePages_* as page counts.
MEMINFO_KEYS: dict[str, str] = dict(_MEMINFO_FIELDS)

MEMORY = Measurement(
    "memory",
    "Host memory from /proc/meminfo (bytes; HugePages_* in pages).",
    "/proc/meminfo",
    tags=(),
    fields=tuple(
        _f(n, I64, "pages" if k.startswith("HugePages_") else "bytes", "gauge", "memory", f"meminfo {k}")
        for n, k in _MEMINFO_FIELDS
    ),
    tier="medium",
)

VMSTAT_COUNTERS: tuple[str, ...] = (
    "pgfault",
    "pgmajfault",
    "pswpin",
    "pswpout",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "allocstall_normal",
    "compact_stall",
    "compact_fail",
    "compact_success",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "thp_collapse_alloc",
    "thp_collapse_alloc_failed",
    "thp_split_page",
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "numa_local",
    "numa_other",
    "numa_pte_updates",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pages_migrated",
    "pgmigrate_success",
    "pgmigrate_fail",
)

VMSTAT = Measurement(
    "vmstat",
    "Virtual-memory event counters from /proc/vmstat (faults, THP, NUMA, migration, swap, "
    "compaction). Fields the kernel does not expose are null.",
    "/proc/vmstat",
    tags=(),
    fields=tuple(
        _f(
            n,
            I64,
            "events" if not n.startswith(("pgscan", "pgsteal", "pswp", "numa_pages", "pgmigrate")) else "pages",
            "counter",
            "interconnect" if n.startswith("numa") or n.startswith("pgmigrate") else "memory",
            f"/proc/vmstat {n}",
        )
        for n in VMSTAT_COUNTERS
    ),
    tier="medium",
)

NUMA = Measurement(
    "numa",
    "Per-NUMA-node allocation counters (numastat) and free/anon-huge memory.",
    "/sys/devices/system/node/node*/numastat, node*/meminfo",
    tags=("node",),
    fields=tuple(
        _counters(
            [
                ("numa_hit", "pages", "allocations intended for and satisfied on this node"),
                ("numa_miss", "pages", "allocations placed here although intended for another node"),
                ("numa_foreign", "pages", "allocations intended here but placed on another node"),
                ("interleave_hit", "pages", "interleave-policy allocations satisfied here"),
                ("local_node", "pages", "allocations here by a process running on this node"),
                ("other_node", "pages", "allocations here by a process running on another node"),
            ],
            "interconnect",
        )
        + [
            _f("mem_free", I64, "bytes", "gauge", "memory", "node MemFree"),
            _f("anon_huge_pages", I64, "bytes", "gauge", "memory", "node AnonHugePages"),
        ]
    ),
    tier="medium",
)

PRESSURE = Measurement(
    "pressure",
    "Pressure stall information per resource (cpu, memory, io).",
    "/proc/pressure/{cpu,memory,io}",
    tags=("resource",),
    fields=(
        _f("some_avg10", F32, "%", "gauge", "cpu", "share of time some tasks stalled, 10 s average"),
        _f("full_avg10", F32, "%", "gauge", "cpu", "share of time all tasks stalled, 10 s average"),
        _f("some_total", I64, "us", "counter", "cpu", "time some tasks stalled"),
        _f("full_total", I64, "us", "counter", "cpu", "time all non-idle tasks stalled"),
    ),
    tier="medium",  # the kernel's own averages are 10 s wide; 1 s totals resolve stalls well
)

# ----------------------------------------------------------------------- network
NET = Measurement(
    "net",
    "Per-interface traffic and errors from /proc/net/dev.",
    "/proc/net/dev",
    tags=("interface",),
    fields=tuple(
        _counters(
            [
                ("rx_bytes", "bytes", "received bytes"),
                ("rx_packets", "packets", "received packets"),
                ("rx_errors", "packets", "receive errors"),
                ("rx_dropped", "packets", "received packets dropped"),
                ("rx_fifo", "packets", "receive FIFO/ring overruns"),
                ("tx_bytes", "bytes", "sent bytes"),
                ("tx_packets", "packets", "sent packets"),
                ("tx_errors", "packets", "send errors"),
                ("tx_dropped", "packets", "sent packets dropped"),
            ],
            "network",
        )
    ),
    tier="medium",
)

TCP = Measurement(
    "tcp",
    "TCP segment counters from /proc/net/snmp.",
    "/proc/net/snmp",
    tags=(),
    fields=tuple(
        _counters(
            [
                ("in_segs", "segments", "segments received"),
                ("out_segs", "segments", "segments sent"),
                ("retrans_segs", "segments", "segments retransmitted"),
                ("in_errs", "segments", "segments received in error"),
                ("active_opens", "connections", "active connection openings"),
            ],
            "network",
        )
    ),
    tier="medium",
)

# ----------------------------------------------------------------------- storage
DISK = Measurement(
    "disk",
    "Per-disk I/O from /proc/diskstats (whole disks only, not partitions).",
    "/proc/diskstats",
    tags=("device",),
    fields=tuple(
        _counters(
            [
                ("reads", "requests", "reads completed"),
                ("read_sectors", "sectors", "512-byte sectors read"),
                ("read_time", "ms", "time spent reading"),
                ("writes", "requests", "writes completed"),
                ("write_sectors", "sectors", "512-byte sectors written"),
                ("write_time", "ms", "time spent writing"),
                ("io_time", "ms", "time the device had I/O in flight"),
                ("weighted_io_time", "ms", "in-flight-weighted I/O time"),
            ],
            "storage",
        )
        + [_f("in_flight", F32, "requests", "gauge", "storage", "I/Os currently in flight")]
    ),
    tier="medium",
)

# ----------------------------------------------------------------------- cgroups
CGROUP = Measurement(
    "cgroup",
    "Per top-level cgroup (container / VM slice) CPU usage, throttling and memory, cgroup v1 or v2.",
    "/sys/fs/cgroup",
    tags=("cgroup",),
    fields=(
        _f("cpu_usage", I64, "us", "counter", "cpu", "CPU time used"),
        _f("nr_periods", I64, "periods", "counter", "cpu", "CFS enforcement periods"),
        _f("nr_throttled", I64, "periods", "counter", "cpu", "periods in which the group was throttled"),
        _f("throttled_time", I64, "us", "counter", "cpu", "time the group was throttled"),
        _f("cpu_quota_cores", F32, "cores", "gauge", "cpu", "CFS quota / period; null when unlimited"),
        _f("memory_current", I64, "bytes", "gauge", "memory", "memory in use"),
        _f("memory_max", I64, "bytes", "gauge", "memory", "memory limit; null when unlimited"),
        _f("cpu_pressure_some", I64, "us", "counter", "cpu", "cgroup PSI cpu some total (v2)"),
        _f("memory_pressure_some", I64, "us", "counter", "memory", "cgroup PSI memory some total (v2)"),
    ),
    tier="medium",
)

# -------------------------------------------------------------------------- perf
PERF = Measurement(
    "perf",
    "Hardware performance counters per socket from one long-lived `perf stat -I` process.",
    "perf stat -a --per-socket -I",
    tags=("socket",),
    fields=tuple(
        _counters(
            [
                ("instructions", "events", "retired instructions"),
                ("cycles", "events", "core cycles"),
                ("llc_loads", "events", "last-level-cache loads"),
                ("llc_misses", "events", "last-level-cache misses"),
                ("mem_bandwidth", "bytes", "memory-controller traffic where an uncore event exists"),
            ],
            "cpu",
        )
    ),
)

# --------------------------------------------------------------------------- gpu
GPU = Measurement(
    "gpu",
    "Per-GPU state from NVML.",
    "NVML (nvidia-ml-py)",
    tags=("gpu", "uuid"),
    polled=("energy", "power_violation", "thermal_violation"),
    fields=(
        _f("util_gpu", F32, "%", "gauge", "gpu", "SM busy share over the driver's sample period"),
        _f("util_mem", F32, "%", "gauge", "gpu", "memory-controller busy share"),
        _f("mem_used", I64, "bytes", "gauge", "gpu", "framebuffer memory used"),
        _f("mem_total", I64, "bytes", "gauge", "gpu", "framebuffer memory total"),
        _f("power_w", F32, "W", "gauge", "gpu", "power draw"),
        _f("power_limit_w", F32, "W", "gauge", "gpu", "enforced power limit"),
        _f("power_limit_default_w", F32, "W", "gauge", "gpu", "default power limit"),
        _f("energy", I64, "mJ", "counter", "gpu", "energy consumed"),
        _f("sm_clock_mhz", F32, "MHz", "gauge", "gpu", "SM clock"),
        _f("sm_clock_max_mhz", F32, "MHz", "gauge", "gpu", "maximum SM clock"),
        _f("mem_clock_mhz", F32, "MHz", "gauge", "gpu", "memory clock"),
        _f("mem_clock_max_mhz", F32, "MHz", "gauge", "gpu", "maximum memory clock"),
        _f("temperature_c", F32, "C", "gauge", "gpu", "GPU core temperature"),
        _f("clock_event_reasons", I64, "bitmask", "state", "gpu", "NVML clocks-event (throttle) reasons bitmask"),
        _f("power_violation", I64, "ns", "counter", "gpu", "time clocks were held down by the power cap"),
        _f("thermal_violation", I64, "ns", "counter", "gpu", "time clocks were held down by thermal limits"),
        _f("pcie_tx", F32, "KB/s", "gauge", "interconnect", "PCIe transmit throughput"),
        _f("pcie_rx", F32, "KB/s", "gauge", "interconnect", "PCIe receive throughput"),
        _f("pcie_link_gen", F32, "gen", "gauge", "interconnect", "current PCIe link generation"),
        _f("pcie_link_gen_max", F32, "gen", "gauge", "interconnect", "maximum PCIe link generation"),
        _f("pcie_link_width", F32, "lanes", "gauge", "interconnect", "current PCIe link width"),
        _f("pcie_link_width_max", F32, "lanes", "gauge", "interconnect", "maximum PCIe link width"),
        _f("nvlink_tx", I64, "KiB", "counter", "interconnect", "NVLink data transmitted, all links"),
        _f("nvlink_rx", I64, "KiB", "counter", "interconnect", "NVLink data received, all links"),
        _f("ecc_corrected", I64, "errors", "counter", "gpu", "corrected (single-bit) ECC errors, volatile"),
        _f("ecc_uncorrected", I64, "errors", "counter", "gpu", "uncorrected (double-bit) ECC errors, volatile"),
        _f("xid_events", I64, "events", "counter", "gpu", "XID events since the previous sample"),
        _f("last_xid", I64, "xid", "state", "gpu", "most recent XID code seen by the agent (0 = none)"),
    ),
)

# ------------------------------------------------------------------------- agent
AGENT = Measurement(
    "agent",
    "The agent's own health, one row per flush: ticks, missed ticks, sampling cost, counter anomalies.",
    "the agent",
    tags=(),
    fields=(
        _f("ticks", I64, "ticks", "counter", "host", "fast-tier ticks taken"),
        _f("missed_ticks", I64, "ticks", "counter", "host", "ticks skipped because the agent was late"),
        _f("sample_time", I64, "us", "counter", "host", "wall time spent sampling"),
        _f("cpu_time", I64, "us", "counter", "host", "agent CPU time (utime+stime, with children)"),
        _f("counter_wraps", I64, "events", "counter", "host", "counter wraps corrected"),
        _f("counter_resets", I64, "events", "counter", "host", "counter resets detected"),
    ),
    tier="medium",
)

# ------------------------------------------------------------------ host facts
HOST_FACTS = Measurement(
    "host_facts",
    "Static host facts (topology, placement, knobs), one row per fact, re-read periodically. "
    "category: numa | cpu | gpu | nic | nvme | disk | irq | thp | power | pcie | system; device: "
    "the device the fact is about ('' for host-wide); key/value: the fact, value_num when numeric.",
    "/sys, /proc, NVML",
    tags=("category", "device", "key"),
    fields=(
        _f("value", pl.String(), "", "state", "host", "fact value as text"),
        _f("value_num", F64, "", "state", "host", "numeric value when the fact is a number"),
    ),
    tier="static",
)

# ------------------------------------------------------------ ground truth (sim)
LABELS = Measurement(
    "labels",
    "Ground truth: injected inefficiencies (simulator) or user-supplied incidents. "
    "time = start of the inefficiency.",
    "simulator / user",
    tags=("type", "devices"),
    fields=(
        _f("end", TIME_DTYPE, "time", "state", "host", "end of the inefficiency (exclusive)"),
        _f("severity", F32, "0..1", "state", "host", "severity of the injection"),
        _f("label_id", pl.String(), "", "state", "host", "stable id of the label"),
        _f("cost", F64, "0..1", "state", "host",
           "throughput lost by the injection over its span against the same-seed healthy run "
           "(0.05 = 5 %); null where unknown (user labels, a host doing no work)"),
    ),
    tier="static",
    ground_truth=True,
)

WORKLOAD = Measurement(
    "workload",
    "Ground truth: workload throughput the agent cannot see (tokens/s or steps/s).",
    "simulator / benchmark workloads",
    tags=("workload", "unit"),
    fields=(
        _f("throughput", F32, "unit/s", "gauge", "host", "workload throughput"),
        _f("phase", pl.String(), "", "state", "host", "workload phase"),
    ),
    ground_truth=True,
)

MEASUREMENTS: dict[str, Measurement] = {
    m.name: m
    for m in (
        CPU,
        SYSTEM,
        INTERRUPTS,
        SOFTIRQS,
        MEMORY,
        VMSTAT,
        NUMA,
        PRESSURE,
        NET,
        TCP,
        DISK,
        CGROUP,
        PERF,
        GPU,
        AGENT,
        HOST_FACTS,
        LABELS,
        WORKLOAD,
    )
}


def get(name: str) -> Measurement:
    try:
        return MEASUREMENTS[name]
    except KeyError:
        raise KeyError(f"unknown measurement {name!r}; known: {', '.join(MEASUREMENTS)}") from None


def empty_frame(name: str) -> pl.DataFrame:
    """An empty DataFrame with the exact columns and dtypes of a measurement."""
    return pl.DataFrame(schema=get(name).polars_schema())


def conform(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """Cast ``df`` to the measurement's schema: known columns in schema order, missing
    fields as nulls. Unknown columns are an error (they would silently vanish)."""
    schema = get(name).polars_schema()
    extra = [c for c in df.columns if c not in schema]
    if extra:
        raise ValueError(f"measurement {name!r}: unknown columns {extra}")
    return df.select(
        [
            pl.col(c).cast(dt) if c in df.columns else pl.lit(None, dtype=dt).alias(c)
            for c, dt in schema.items()
        ]
    )


def markdown() -> str:
    """The schema as Markdown (docs/schema.md is generated from this; a test keeps them equal)."""
    out = [
        "# Telemetry schema",
        "",
        "Generated from `ingest/schema.py` by `unveil schema --format markdown`; do not edit by hand.",
        "",
        "Counters are stored as **deltas** since the previous sample of the same series "
        "(wraps and resets corrected at the source; null on a series' first sample). "
        "Gauges are stored as read. Every table has `time` (UTC, µs) and the tag `host`.",
        "",
        f"Default tier periods: {', '.join(f'{k} {v:g} s' for k, v in TIER_PERIOD_S.items())}.",
        "",
    ]
    for m in MEASUREMENTS.values():
        flags = [f"tier `{m.tier}`"]
        if m.sparse:
            flags.append("sparse (all-zero rows omitted)")
        if m.ground_truth:
            flags.append("ground truth (simulator/benchmarks only)")
        out += [
            f"## `{m.name}`",
            "",
            m.description,
            "",
            f"Source: {m.source}. Tags: {', '.join(f'`{t}`' for t in ('host', *m.tags))}. {'; '.join(flags)}.",
            "",
            "| field | dtype | unit | kind | subsystem | description |",
            "|---|---|---|---|---|---|",
        ]
        for f in m.fields:
            out.append(f"| `{f.name}` | {f.dtype} | {f.unit} | {f.kind} | {f.subsystem} | {f.description} |")
        out.append("")
    return "\n".join(out)
