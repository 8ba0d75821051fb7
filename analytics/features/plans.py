"""The feature plans: what each measurement's features mean, as Polars expressions.

A plan (:class:`Plan`) says, for one measurement (table): which tag names a row's
device, which columns are aggregated per bucket and how (counter deltas summed,
gauges averaged, min/max, counts), and each feature family as an expression over the
window's aggregates and its covered duration ``_dur`` (s). The execution
(:mod:`analytics.features.engine`) evaluates the row expressions in Polars, reduces
them per bucket and window with its kernels, then evaluates the feature expressions
in Polars: the plans are the only statement of meaning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl

from analytics.catalog import DEVICE_SEP
from ingest import schema

HOST = schema.HOST
TIME = schema.TIME
DUR = "_dur"  # covered window duration, seconds
DEV = "_dev"  # device of a row ("" for host-wide tables)
LOCAL = "_local"  # an interrupt series counted on its device's own NUMA node

# NVML clock-event (throttle) reason bits
THROTTLE_BITS: dict[str, int] = {
    "power": 0x4 | 0x80,  # SW power cap | HW power brake
    "thermal": 0x20 | 0x40,  # SW thermal | HW thermal slowdown
    "hw_slowdown": 0x8,
}


@dataclass(frozen=True)
class WindowSpec:
    """Sliding windows: ``length_s`` long every ``stride_s``, built from ``bucket_s``
    buckets (default: the stride). Length and stride must be multiples of the bucket."""

    length_s: float = 3.0
    stride_s: float = 1.0
    bucket_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("length_s", "stride_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v > 0):
                raise ValueError(f"WindowSpec.{name} must be a positive number of seconds, not {v!r}")
        b = self.bucket
        if b <= 0:
            raise ValueError(f"WindowSpec.bucket_s must be positive, not {self.bucket_s!r}")
        for name in ("length_s", "stride_s"):
            us = round(getattr(self, name) * 1e6)
            if us % round(b * 1e6):
                raise ValueError(f"WindowSpec.{name}={getattr(self, name)} is not a multiple of the bucket ({b} s)")

    @property
    def bucket(self) -> float:
        return float(self.bucket_s if self.bucket_s is not None else self.stride_s)


Agg = Literal["sum", "count", "mean", "max", "min"]


@dataclass(frozen=True, eq=False)  # (hashed by identity: plans are cached, see plan_of)
class Plan:
    """How one measurement becomes features.

    ``device``: expression naming the device of a row (None: host-wide);
    ``buckets``: name -> (row expression, its aggregation per bucket: sum, count of
    non-null, max or min; counts are summed over the buckets of a window);
    ``features``: family -> expression over the window columns and ``_dur`` (s);
    ``zero_fill``: families whose missing value means 0 (rates of sparse tables)."""

    device: pl.Expr | None
    buckets: dict[str, tuple[pl.Expr, Agg]]
    features: dict[str, pl.Expr]
    zero_fill: tuple[str, ...] = ()


def _c(name: str) -> pl.Expr:
    return pl.col(name)


def _sum(name: str) -> tuple[pl.Expr, Agg]:
    return (_c(name), "sum")


def _gauge(plan: dict[str, tuple[pl.Expr, Agg]], name: str) -> pl.Expr:
    """Register a gauge's bucket mean; return the window mean (mean of the bucket means:
    the sample mean when buckets hold equally many samples, as with regular sampling)."""
    plan[f"{name}__m"] = (_c(name).cast(pl.Float64).fill_nan(None), "mean")
    return _c(f"{name}__m")


def _prefixed(tag: str, prefix: str) -> pl.Expr:
    """A device name from a tag: bare numbers get a prefix (``3`` -> ``gpu3``)."""
    v = _c(tag).cast(pl.String).fill_null("")
    return pl.when(v.str.contains(r"^\d+$")).then(pl.lit(prefix) + v).otherwise(v)


def _rate(name: str) -> pl.Expr:
    return _c(name) / _c(DUR)


def _plan_cpu(cols: set[str]) -> Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    ticks = [t for t in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal") if t in cols]
    for t in ticks:
        b[t] = _sum(t)
    f: dict[str, pl.Expr] = {}
    if ticks:
        total = pl.sum_horizontal([_c(t) for t in ticks])
        user = pl.sum_horizontal([_c(t) for t in ("user", "nice") if t in cols])
        if "user" in cols:
            f["cpu.user_share"] = user / total
        for t in ("system", "iowait", "irq", "softirq", "steal"):
            if t in cols:
                f[f"cpu.{t}_share"] = _c(t) / total
        idle = [t for t in ("idle", "iowait") if t in cols]
        if idle:
            f["cpu.busy_share"] = 1.0 - pl.sum_horizontal([_c(t) for t in idle]) / total
    if "freq_mhz" in cols:
        f["cpu.freq_mhz"] = _gauge(b, "freq_mhz")
    return Plan(_prefixed("node", "node"), b, f)


def _plan_system(cols: set[str]) -> Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    for c, fam in (("ctxt", "cpu.ctxt_rate"), ("forks", "cpu.fork_rate")):
        if c in cols:
            b[c] = _sum(c)
            f[fam] = _rate(c)
    for c in ("procs_running", "procs_blocked", "load1"):
        if c in cols:
            f[f"cpu.{c}"] = _gauge(b, c)
    return Plan(None, b, f)


def _plan_softirqs(cols: set[str]) -> Plan:
    b = {"count": _sum("count")}
    return Plan(_c("softirq").cast(pl.String), b, {"softirq.rate": _rate("count")}, zero_fill=("softirq.rate",))


def _plan_interrupts(cols: set[str]) -> Plan:
    # per IRQ series (host, IRQ action, node): DEV is the device host_facts maps the
    # action to and LOCAL whether the node is that device's own (the engine attaches
    # both per series, see engine._irq_names); series of one device are summed
    b: dict[str, tuple[pl.Expr, Agg]] = {
        "count": _sum("count"),
        "local": (pl.when(_c(LOCAL)).then(_c("count")).otherwise(0), "sum"),
    }
    f = {"irq.rate": _rate("count"), "irq.locality": _c("local") / _c("count")}
    return Plan(_c(DEV), b, f, zero_fill=("irq.rate",))


def _plan_memory(cols: set[str]) -> Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    m = {c: _gauge(b, c) for c in schema.MEMORY.gauges if c in cols}
    f: dict[str, pl.Expr] = {}

    def has(*names: str) -> bool:
        return all(n in m for n in names)

    if has("anon_huge_pages", "anon_pages"):
        f["mem.hugepage_coverage"] = m["anon_huge_pages"] / m["anon_pages"]
    if has("mem_available", "mem_total"):
        f["mem.available_share"] = m["mem_available"] / m["mem_total"]
    if has("dirty", "writeback", "mem_total"):
        f["mem.dirty_share"] = (m["dirty"] + m["writeback"]) / m["mem_total"]
    if has("swap_total", "swap_free"):
        f["mem.swap_used_share"] = 1.0 - m["swap_free"] / m["swap_total"]
    if has("hugepages_total", "hugepages_free"):
        f["mem.hugetlb_used_share"] = 1.0 - m["hugepages_free"] / m["hugepages_total"]
    if has("page_tables", "mem_total"):
        f["mem.page_tables_share"] = m["page_tables"] / m["mem_total"]
    return Plan(None, b, f)


def _plan_vmstat(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.VMSTAT.counters if c in cols}
    f: dict[str, pl.Expr] = {}

    def has(*names: str) -> bool:
        return all(n in b for n in names)

    if has("thp_fault_alloc"):
        # stops the moment THP is set to never (new faults get 4 KiB pages), while the
        # coverage only decays as memory turns over
        f["mem.thp_fault_alloc_rate"] = _rate("thp_fault_alloc")
    if has("thp_fault_fallback"):
        f["mem.thp_fallback_rate"] = _rate("thp_fault_fallback")
        if has("thp_fault_alloc"):
            f["mem.thp_fallback_share"] = _c("thp_fault_fallback") / (_c("thp_fault_alloc") + _c("thp_fault_fallback"))
    for c, fam in (
        ("pgfault", "mem.pgfault_rate"),
        ("pgmajfault", "mem.pgmajfault_rate"),
        ("pgscan_direct", "mem.direct_scan_rate"),
        ("pgscan_kswapd", "mem.kswapd_scan_rate"),
        ("compact_stall", "mem.compact_stall_rate"),
        ("allocstall_normal", "mem.allocstall_rate"),
        ("numa_pages_migrated", "numa.migration_rate"),
    ):
        if has(c):
            f[fam] = _rate(c)
    if has("pswpin", "pswpout"):
        f["mem.swap_rate"] = (_c("pswpin") + _c("pswpout")) / _c(DUR)
    if has("numa_hit", "numa_miss"):
        f["numa.remote_share"] = _c("numa_miss") / (_c("numa_hit") + _c("numa_miss"))
    if has("numa_local", "numa_other"):
        f["numa.other_node_share"] = _c("numa_other") / (_c("numa_local") + _c("numa_other"))
    if has("numa_hint_faults", "numa_hint_faults_local"):
        f["numa.hint_fault_remote_share"] = 1.0 - _c("numa_hint_faults_local") / _c("numa_hint_faults")
    return Plan(None, b, f)


def _plan_numa(cols: set[str]) -> Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {c: _sum(c) for c in ("numa_hit", "numa_miss", "local_node", "other_node") if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"numa_hit", "numa_miss"} <= b.keys():
        f["numa.remote_share"] = _c("numa_miss") / (_c("numa_hit") + _c("numa_miss"))
    if {"local_node", "other_node"} <= b.keys():
        f["numa.other_node_share"] = _c("other_node") / (_c("local_node") + _c("other_node"))
    return Plan(_prefixed("node", "node"), b, f)


_PSI_RESOURCES = ("cpu", "memory", "io")


def _plan_pressure(cols: set[str]) -> Plan:
    # host-wide families per resource (psi.io_some_share ...): pivot by hand, no device
    r = _c("resource").cast(pl.String)
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    for res in _PSI_RESOURCES:
        for kind in ("some", "full"):
            if f"{kind}_total" in cols and not (res == "cpu" and kind == "full"):
                b[f"{res}_{kind}"] = (pl.when(r == res).then(_c(f"{kind}_total")), "sum")
                f[f"psi.{res}_{kind}_share"] = _c(f"{res}_{kind}") / (_c(DUR) * 1e6)
        if "some_avg10" in cols:
            b[f"{res}_avg"] = (pl.when(r == res).then(_c("some_avg10").cast(pl.Float64)), "mean")
            f[f"psi.{res}_some_avg10"] = _c(f"{res}_avg") / 100.0
    return Plan(None, b, f)


def _plan_net(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.NET.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    for c in ("rx_bytes", "tx_bytes"):
        if c in b:
            f[f"net.{c}_rate"] = _rate(c)
    drops = [c for c in ("rx_dropped", "tx_dropped", "rx_fifo") if c in b]
    if drops:
        f["net.drop_rate"] = pl.sum_horizontal([_c(c) for c in drops]) / _c(DUR)
    rx_drops = [c for c in ("rx_dropped", "rx_fifo") if c in b]
    if rx_drops and "rx_packets" in b:
        # the share of offered packets the receive side lost (rx_packets counts only those
        # delivered): a ring overflow loses a share of the traffic, while a fixed trickle of
        # benign drops (unknown protocols, micro-bursts on a busy RDMA port) is a rate
        lost = pl.sum_horizontal([_c(c) for c in rx_drops])
        f["net.drop_share"] = lost / (_c("rx_packets") + lost)
    errs = [c for c in ("rx_errors", "tx_errors") if c in b]
    if errs:
        f["net.error_rate"] = pl.sum_horizontal([_c(c) for c in errs]) / _c(DUR)
    return Plan(_c("interface").cast(pl.String), b, f)


def _plan_tcp(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.TCP.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if "retrans_segs" in b:
        f["net.retrans_rate"] = _rate("retrans_segs")
        if "out_segs" in b:
            f["net.retrans_share"] = _c("retrans_segs") / _c("out_segs")
    if "in_errs" in b:
        f["net.in_err_rate"] = _rate("in_errs")
    if "active_opens" in b:
        f["net.active_open_rate"] = _rate("active_opens")
    return Plan(None, b, f)


def _plan_disk(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.DISK.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"reads", "writes", "read_time", "write_time"} <= b.keys():
        f["disk.latency_ms"] = (_c("read_time") + _c("write_time")) / (_c("reads") + _c("writes"))
    if "io_time" in b:
        f["disk.util"] = _c("io_time") / (_c(DUR) * 1e3)
    if "weighted_io_time" in b:
        f["disk.queue_depth"] = _c("weighted_io_time") / (_c(DUR) * 1e3)
    for c, fam in (("reads", "disk.read_iops"), ("writes", "disk.write_iops")):
        if c in b:
            f[fam] = _rate(c)
    for c, fam in (("read_sectors", "disk.read_bytes_rate"), ("write_sectors", "disk.write_bytes_rate")):
        if c in b:
            f[fam] = _c(c) * 512.0 / _c(DUR)
    return Plan(_c("device").cast(pl.String), b, f)


def _plan_cgroup(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.CGROUP.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"nr_throttled", "nr_periods"} <= b.keys():
        f["cgroup.throttled_share"] = _c("nr_throttled") / _c("nr_periods")
    us = _c(DUR) * 1e6
    if "throttled_time" in b:
        f["cgroup.throttled_time_share"] = _c("throttled_time") / us
    if "cpu_usage" in b:
        f["cgroup.cpu_cores"] = _c("cpu_usage") / us
        if "cpu_quota_cores" in cols:
            f["cgroup.quota_use_share"] = _c("cpu_usage") / us / _gauge(b, "cpu_quota_cores")
    if {"memory_current", "memory_max"} <= cols:
        f["cgroup.mem_use_share"] = _gauge(b, "memory_current") / _gauge(b, "memory_max")
    if "cpu_pressure_some" in b:
        f["cgroup.cpu_pressure_share"] = _c("cpu_pressure_some") / us
    if "memory_pressure_some" in b:
        f["cgroup.memory_pressure_share"] = _c("memory_pressure_some") / us
    return Plan(_c("cgroup").cast(pl.String), b, f)


def _plan_perf(cols: set[str]) -> Plan:
    b = {c: _sum(c) for c in schema.PERF.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"instructions", "cycles"} <= b.keys():
        f["perf.ipc"] = _c("instructions") / _c("cycles")
    if {"llc_misses", "llc_loads"} <= b.keys():
        f["perf.llc_miss_share"] = _c("llc_misses") / _c("llc_loads")
    if "mem_bandwidth" in b:
        f["perf.mem_bandwidth"] = _rate("mem_bandwidth")
    return Plan(_prefixed("socket", "socket"), b, f)


def _plan_gpu(cols: set[str]) -> Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    g = {c: _gauge(b, c) for c in ("util_gpu", "util_mem", "mem_used", "mem_total", "power_w", "power_limit_w",
                                   "power_limit_default_w", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz",
                                   "mem_clock_max_mhz", "pcie_tx", "pcie_rx") if c in cols}

    def has(*names: str) -> bool:
        return all(n in g for n in names)

    if has("util_gpu"):
        f["gpu.util"] = g["util_gpu"] / 100.0
    if has("util_mem"):
        f["gpu.mem_util"] = g["util_mem"] / 100.0
    if has("mem_used", "mem_total"):
        f["gpu.mem_used_share"] = g["mem_used"] / g["mem_total"]
    if has("power_w", "power_limit_w"):
        f["gpu.power_ratio"] = g["power_w"] / g["power_limit_w"]
    if has("power_limit_w", "power_limit_default_w"):
        f["gpu.power_limit_ratio"] = g["power_limit_w"] / g["power_limit_default_w"]
    if has("sm_clock_mhz", "sm_clock_max_mhz"):
        f["gpu.sm_clock_ratio"] = g["sm_clock_mhz"] / g["sm_clock_max_mhz"]
    if has("mem_clock_mhz", "mem_clock_max_mhz"):
        f["gpu.mem_clock_ratio"] = g["mem_clock_mhz"] / g["mem_clock_max_mhz"]
    if "temperature_c" in cols:
        b["temp_max"] = (_c("temperature_c").cast(pl.Float64), "max")
        f["gpu.temperature_max"] = _c("temp_max")
    if "clock_event_reasons" in cols:
        r = _c("clock_event_reasons")
        b["cer__n"] = (r, "count")
        for name, bits in THROTTLE_BITS.items():
            b[f"cer_{name}"] = (((r & bits) != 0).cast(pl.Int64), "sum")
            f[f"gpu.throttle_{name}_share"] = _c(f"cer_{name}") / _c("cer__n")
    for c, fam in (("power_violation", "gpu.power_violation_share"), ("thermal_violation", "gpu.thermal_violation_share")):
        if c in cols:
            b[c] = _sum(c)
            f[fam] = _c(c) / (_c(DUR) * 1e9)
    for c, fam in (("ecc_corrected", "gpu.ecc_corrected_rate"), ("ecc_uncorrected", "gpu.ecc_uncorrected_rate"),
                   ("xid_events", "gpu.xid_rate"), ("nvlink_tx", "nvlink.tx_rate"), ("nvlink_rx", "nvlink.rx_rate")):
        if c in cols:
            b[c] = _sum(c)
            f[fam] = _rate(c)
    for cur, mx, fam in (("pcie_link_gen", "pcie_link_gen_max", "pcie.link_gen_ratio"),
                         ("pcie_link_width", "pcie_link_width_max", "pcie.link_width_ratio")):
        if cur in cols and mx in cols:
            b[f"{cur}__min"] = (_c(cur).cast(pl.Float64), "min")
            b[f"{mx}__max"] = (_c(mx).cast(pl.Float64), "max")
            f[fam] = _c(f"{cur}__min") / _c(f"{mx}__max")
    if has("pcie_tx"):
        f["pcie.tx_rate"] = g["pcie_tx"]
    if has("pcie_rx"):
        f["pcie.rx_rate"] = g["pcie_rx"]
    return Plan(_prefixed("gpu", "gpu"), b, f)


PLANS: dict[str, Callable[[set[str]], Plan]] = {
    "cpu": _plan_cpu,
    "system": _plan_system,
    "interrupts": _plan_interrupts,
    "softirqs": _plan_softirqs,
    "memory": _plan_memory,
    "vmstat": _plan_vmstat,
    "numa": _plan_numa,
    "pressure": _plan_pressure,
    "net": _plan_net,
    "tcp": _plan_tcp,
    "disk": _plan_disk,
    "cgroup": _plan_cgroup,
    "perf": _plan_perf,
    "gpu": _plan_gpu,
}

#: tables that never become features (the agent's self-health, static facts, ground truth)
SKIPPED: frozenset[str] = frozenset({"agent", "host_facts", "labels", "workload"} | {"features", "scores", "findings",
                                                                                     "incidents", "remediations"}
                                    | {"drill_scorecard"})  # `unveil drill`'s results, not telemetry

_NUMERIC = (pl.Float32, pl.Float64, pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32,
            pl.UInt64, pl.Boolean)


def _plan_generic(name: str, sch: pl.Schema) -> Plan:
    """An imported or unknown measurement: every numeric column's window mean, feature
    ``<measurement>.<column>``; string columns other than host are tags (the device)."""
    tags = [c for c, dt in sch.items() if c not in (TIME, HOST) and dt == pl.String]
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    for c, dt in sch.items():
        if c in (TIME, HOST) or c in tags or not isinstance(dt, _NUMERIC):
            continue
        fam = f"{name}.{c}".replace(DEVICE_SEP, "_")
        b[f"{c}__m"] = (_c(c).cast(pl.Float64), "mean")
        f[fam] = _c(f"{c}__m")
    dev = pl.concat_str([_c(t).fill_null("") for t in tags], separator="/") if tags else None
    return Plan(dev, b, f)




@functools.lru_cache(maxsize=256)
def plan_of(name: str, columns: tuple[tuple[str, pl.DataType], ...]) -> Plan:
    """A measurement's plan for its (column, dtype) pairs; cached (``lru_cache`` is
    thread-safe; plans are immutable): building them costs ~5 % of the features' time."""
    builder = PLANS.get(name)
    sch = pl.Schema(columns)
    return builder(set(sch)) if builder is not None else _plan_generic(name, sch)


def tags(plan: Plan) -> list[str]:
    """The columns a plan's device is named from."""
    return list(dict.fromkeys(plan.device.meta.root_names())) if plan.device is not None else []
