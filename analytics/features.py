"""Windowed features: telemetry LazyFrames -> one wide row per (host, window).

The same code serves sweeps, post-mortems and evaluation. Two stages keep it cheap:

1. **buckets** — per measurement, the raw rows grouped by ``(host, tag columns,
   integer bucket)`` (default bucket = stride = 1 s) with every aggregation at once,
   one table at a time (:func:`bucket_rows`, :func:`_reduce_buckets`; the reference
   semantics is one ``group_by``, :func:`bucket_frame`): counter deltas summed, gauges
   as bucket means (window mean = mean of bucket means), min/max where a feature needs
   them, throttle-reason bits as counts of samples with the bit set. Regular telemetry
   (every sample reads the same series in the same order: a samples x series grid) is
   reduced by numpy over contiguous runs instead of a hash ``group_by``;
2. **windows** (eager, on the small bucket frames) — every host gets one grid of
   buckets from its first to its last (over all tables); each table's devices x that
   grid, trailing sums/means/max/min over the buckets of a window (a window is
   evaluated at the row of its last bucket), in numpy at the kept window rows only
   (:func:`_rolled_np`; Polars' ``rolling_*`` is the reference), then the derived
   ratios as plain expressions, one query for all tables with equally many devices.
   All tables share the grid's row order, so the wide frame is a horizontal stack,
   without joins.

Counters are stored as deltas (see :mod:`ingest.schema`), so "sum of deltas / window
duration" is a rate. A window that runs past the end of a host's data is normalised
by the covered duration and kept only when no full window exists (a host with less
than one window of data still gets one row). A ratio whose denominator is zero
(no interrupts, no I/O) is null, never a fake 0 or inf: detectors read null as
"no evidence" (see :mod:`analytics.detectors`).

Output (:func:`compute_features`): ``host``, ``window_start``, ``window_end``
(Datetime us UTC) and one Float64 column per feature named by
:mod:`analytics.catalog` (``family`` or ``family@device``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa

from analytics.catalog import DEVICE_SEP, feature_name, split_feature
from ingest import schema
from ingest.collectors.cgroup import is_own

log = logging.getLogger(__name__)

HOST = schema.HOST
TIME = schema.TIME
WINDOW_START = "window_start"
WINDOW_END = "window_end"
KEYS: tuple[str, ...] = (HOST, WINDOW_START, WINDOW_END)

_B = "_b"  # bucket start
_DEV = "_dev"  # device of a row ("" for host-wide tables)
_DUR = "_dur"  # covered window duration, seconds
_LAST = "_last"
_T = "_t"  # sample time, µs
_LOCAL = "_local"  # an interrupt row counted on its device's own NUMA node

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

    @staticmethod
    def _dur(seconds: float) -> str:
        return f"{round(seconds * 1e6)}us"

    @property
    def length(self) -> str:
        return self._dur(self.length_s)

    @property
    def stride(self) -> str:
        return self._dur(self.stride_s)

    @property
    def bucket_str(self) -> str:
        return self._dur(self.bucket)


# ----------------------------------------------------------------------------- plans
Agg = Literal["sum", "count", "mean", "max", "min"]


@dataclass(frozen=True)
class _Plan:
    """How one measurement becomes features.

    ``device``: expression naming the device of a row (None: host-wide);
    ``buckets``: name -> (row expression, its aggregation per bucket: sum, count of
    non-null, max or min; counts are summed over the buckets of a window);
    ``features``: family -> expression over the window columns and ``_dur`` (s);
    ``zero_fill``: families whose missing value means 0 (rates of sparse tables);
    ``exprs``: the expressions derived from the plan, built once per plan (see
    :func:`_derived`: with plans cached per schema, rebuilding them on every call cost
    ~5 % of the features' time)."""

    device: pl.Expr | None
    buckets: dict[str, tuple[pl.Expr, Agg]]
    features: dict[str, pl.Expr]
    zero_fill: tuple[str, ...] = ()
    exprs: dict[tuple[object, ...], list[pl.Expr]] = field(default_factory=dict, compare=False, repr=False)


def _derived(plan: _Plan, key: tuple[object, ...], build: Callable[[], list[pl.Expr]]) -> list[pl.Expr]:
    """``plan``'s expressions for ``key``, built by ``build`` the first time (expressions
    are immutable: sharing them between queries is safe)."""
    got = plan.exprs.get(key)
    if got is None:
        got = plan.exprs[key] = build()
    return got


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
    return _c(name) / _c(_DUR)


def _div(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return a / b


def _plan_cpu(cols: set[str]) -> _Plan:
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
    return _Plan(_prefixed("node", "node"), b, f)


def _plan_system(cols: set[str]) -> _Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    for c, fam in (("ctxt", "cpu.ctxt_rate"), ("forks", "cpu.fork_rate")):
        if c in cols:
            b[c] = _sum(c)
            f[fam] = _rate(c)
    for c in ("procs_running", "procs_blocked", "load1"):
        if c in cols:
            f[f"cpu.{c}"] = _gauge(b, c)
    return _Plan(None, b, f)


def _plan_softirqs(cols: set[str]) -> _Plan:
    b = {"count": _sum("count")}
    return _Plan(_c("softirq").cast(pl.String), b, {"softirq.rate": _rate("count")}, zero_fill=("softirq.rate",))


def _plan_interrupts(cols: set[str]) -> _Plan:
    # rows carry _dev and _local (the row's node is its device's own node, from
    # host_facts) after _attach_irq_devices
    b: dict[str, tuple[pl.Expr, Agg]] = {
        "count": _sum("count"),
        "local": (pl.when(_c(_LOCAL)).then(_c("count")).otherwise(0), "sum"),
    }
    f = {"irq.rate": _rate("count"), "irq.locality": _c("local") / _c("count")}
    return _Plan(_c(_DEV), b, f, zero_fill=("irq.rate",))


def _plan_memory(cols: set[str]) -> _Plan:
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
    return _Plan(None, b, f)


def _plan_vmstat(cols: set[str]) -> _Plan:
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
        f["mem.swap_rate"] = (_c("pswpin") + _c("pswpout")) / _c(_DUR)
    if has("numa_hit", "numa_miss"):
        f["numa.remote_share"] = _c("numa_miss") / (_c("numa_hit") + _c("numa_miss"))
    if has("numa_local", "numa_other"):
        f["numa.other_node_share"] = _c("numa_other") / (_c("numa_local") + _c("numa_other"))
    if has("numa_hint_faults", "numa_hint_faults_local"):
        f["numa.hint_fault_remote_share"] = 1.0 - _c("numa_hint_faults_local") / _c("numa_hint_faults")
    return _Plan(None, b, f)


def _plan_numa(cols: set[str]) -> _Plan:
    b: dict[str, tuple[pl.Expr, Agg]] = {c: _sum(c) for c in ("numa_hit", "numa_miss", "local_node", "other_node") if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"numa_hit", "numa_miss"} <= b.keys():
        f["numa.remote_share"] = _c("numa_miss") / (_c("numa_hit") + _c("numa_miss"))
    if {"local_node", "other_node"} <= b.keys():
        f["numa.other_node_share"] = _c("other_node") / (_c("local_node") + _c("other_node"))
    return _Plan(_prefixed("node", "node"), b, f)


_PSI_RESOURCES = ("cpu", "memory", "io")


def _plan_pressure(cols: set[str]) -> _Plan:
    # host-wide families per resource (psi.io_some_share ...): pivot by hand, no device
    r = _c("resource").cast(pl.String)
    b: dict[str, tuple[pl.Expr, Agg]] = {}
    f: dict[str, pl.Expr] = {}
    for res in _PSI_RESOURCES:
        for kind in ("some", "full"):
            if f"{kind}_total" in cols and not (res == "cpu" and kind == "full"):
                b[f"{res}_{kind}"] = (pl.when(r == res).then(_c(f"{kind}_total")), "sum")
                f[f"psi.{res}_{kind}_share"] = _c(f"{res}_{kind}") / (_c(_DUR) * 1e6)
        if "some_avg10" in cols:
            b[f"{res}_avg"] = (pl.when(r == res).then(_c("some_avg10").cast(pl.Float64)), "mean")
            f[f"psi.{res}_some_avg10"] = _c(f"{res}_avg") / 100.0
    return _Plan(None, b, f)


def _plan_net(cols: set[str]) -> _Plan:
    b = {c: _sum(c) for c in schema.NET.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    for c in ("rx_bytes", "tx_bytes"):
        if c in b:
            f[f"net.{c}_rate"] = _rate(c)
    drops = [c for c in ("rx_dropped", "tx_dropped", "rx_fifo") if c in b]
    if drops:
        f["net.drop_rate"] = pl.sum_horizontal([_c(c) for c in drops]) / _c(_DUR)
    errs = [c for c in ("rx_errors", "tx_errors") if c in b]
    if errs:
        f["net.error_rate"] = pl.sum_horizontal([_c(c) for c in errs]) / _c(_DUR)
    return _Plan(_c("interface").cast(pl.String), b, f)


def _plan_tcp(cols: set[str]) -> _Plan:
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
    return _Plan(None, b, f)


def _plan_disk(cols: set[str]) -> _Plan:
    b = {c: _sum(c) for c in schema.DISK.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"reads", "writes", "read_time", "write_time"} <= b.keys():
        f["disk.latency_ms"] = (_c("read_time") + _c("write_time")) / (_c("reads") + _c("writes"))
    if "io_time" in b:
        f["disk.util"] = _c("io_time") / (_c(_DUR) * 1e3)
    if "weighted_io_time" in b:
        f["disk.queue_depth"] = _c("weighted_io_time") / (_c(_DUR) * 1e3)
    for c, fam in (("reads", "disk.read_iops"), ("writes", "disk.write_iops")):
        if c in b:
            f[fam] = _rate(c)
    for c, fam in (("read_sectors", "disk.read_bytes_rate"), ("write_sectors", "disk.write_bytes_rate")):
        if c in b:
            f[fam] = _c(c) * 512.0 / _c(_DUR)
    return _Plan(_c("device").cast(pl.String), b, f)


def _plan_cgroup(cols: set[str]) -> _Plan:
    b = {c: _sum(c) for c in schema.CGROUP.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"nr_throttled", "nr_periods"} <= b.keys():
        f["cgroup.throttled_share"] = _c("nr_throttled") / _c("nr_periods")
    us = _c(_DUR) * 1e6
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
    return _Plan(_c("cgroup").cast(pl.String), b, f)


def _plan_perf(cols: set[str]) -> _Plan:
    b = {c: _sum(c) for c in schema.PERF.counters if c in cols}
    f: dict[str, pl.Expr] = {}
    if {"instructions", "cycles"} <= b.keys():
        f["perf.ipc"] = _c("instructions") / _c("cycles")
    if {"llc_misses", "llc_loads"} <= b.keys():
        f["perf.llc_miss_share"] = _c("llc_misses") / _c("llc_loads")
    if "mem_bandwidth" in b:
        f["perf.mem_bandwidth"] = _rate("mem_bandwidth")
    return _Plan(_prefixed("socket", "socket"), b, f)


def _plan_gpu(cols: set[str]) -> _Plan:
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
            f[fam] = _c(c) / (_c(_DUR) * 1e9)
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
    return _Plan(_prefixed("gpu", "gpu"), b, f)


_PLANS: dict[str, Callable[[set[str]], _Plan]] = {
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


def _plan_generic(name: str, sch: pl.Schema) -> _Plan:
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
    return _Plan(dev, b, f)


# ------------------------------------------------------------------------ machinery
def _safe(e: pl.Expr) -> pl.Expr:
    """Non-finite (0/0, x/0) -> null: an undefined ratio is missing evidence."""
    e = e.cast(pl.Float64)
    return pl.when(e.is_finite()).then(e)


def _facts_nodes(host_facts: pl.DataFrame | None) -> pl.DataFrame:
    """(host, device, pci, node) of every device with a numa_node fact."""
    empty = pl.DataFrame(schema={HOST: pl.String, "device": pl.String, "pci": pl.String, "node": pl.Int64})
    if host_facts is None or host_facts.is_empty() or "key" not in host_facts.columns:
        return empty
    hf = host_facts.filter(pl.col("device").fill_null("") != "")
    nodes = hf.filter(pl.col("key") == "numa_node").select(
        HOST, "category", "device", pl.col("value_num").cast(pl.Int64).alias("node")
    ).filter(pl.col("node") >= 0)
    pci = hf.filter(pl.col("key").is_in(["pci_bus_id", "pci_address", "pci"])).select(
        HOST, "category", "device", pl.col("value").str.to_lowercase().alias("pci")
    )
    out = nodes.join(pci, on=[HOST, "category", "device"], how="left").unique([HOST, "category", "device"])
    # gpu facts use the index ("3"); name those devices like the gpu features do ("gpu3")
    out = out.with_columns(
        pl.when((pl.col("category") == "gpu") & pl.col("device").str.contains(r"^\d+$"))
        .then(pl.lit("gpu") + pl.col("device")).otherwise(pl.col("device")).alias("device")
    )
    return out.select(HOST, "device", "pci", "node") if not out.is_empty() else empty


def _irq_device_map(irq_names: Sequence[str], facts: pl.DataFrame) -> dict[str, tuple[str, int]]:
    """IRQ action name -> (fact device, its node): the device whose name or PCI address
    occurs in the action name (``mlx5_comp3@pci:0000:17:00.0`` -> ``mlx5_0`` by PCI)."""
    out: dict[str, tuple[str, int]] = {}
    # per fact row once: its PCI address (full, and without the domain) and name pattern
    rows = []
    for dev, pci, node in facts.select("device", "pci", "node").iter_rows():
        short = (pci.split(":", 1)[1] if pci.count(":") == 2 else pci) if pci else ""
        pattern = re.compile(rf"(^|[^a-z0-9]){re.escape(dev.lower())}(?![0-9])") if dev else None
        rows.append((dev, pci, short, node, pattern))
    for name in irq_names:
        low = name.lower()
        best: tuple[int, str, int] | None = None
        for dev, pci, short, node, pattern in rows:
            if pci and (pci in low or (len(short) >= 7 and short in low)):
                best = (2, dev, node)  # the first PCI match wins
                break
            if best is None and pattern is not None and pattern.search(low):
                best = (1, dev, node)
        if best is not None:
            out[name] = (best[1], best[2])
    return out


def _attach_irq_devices(lf: pl.LazyFrame, host_facts: pl.DataFrame | None) -> pl.LazyFrame | None:
    """Interrupt rows of devices known to host_facts, with _dev and _local; None if none.
    Both come from the few distinct (host, IRQ action, node) of the rows, joined back
    on those three keys (parsing every row's node would cost as much as the join)."""
    facts = _facts_nodes(host_facts)
    if facts.is_empty():
        log.info("no numa_node facts: irq.locality and irq.rate are not computed")
        return None
    keys = (HOST, "device", "node")
    lf = lf.with_columns(pl.col("device").cast(pl.String), pl.col("node").cast(pl.String).fill_null(""))
    # distinct values one column at a time (a multi-column unique costs twice as much);
    # (host, device) pairs only for several hosts. The mapping may list (device, node)
    # pairs that never occur: the inner join ignores them.
    uniq = lf.select(*[pl.col(k).unique().implode() for k in keys]).collect().row(0)
    hosts, nodes = uniq[0], uniq[2]
    pairs = ({hosts[0]: uniq[1]} if len(hosts) == 1 else
             {h: g["device"].to_list() for (h,), g in lf.select(HOST, "device").unique().collect().group_by([HOST])})
    rows = []
    for host, names in pairs.items():
        m = _irq_device_map([n for n in names if n is not None], facts.filter(pl.col(HOST) == host))
        rows += [(host, name, node, dev, dev_node) for name, (dev, dev_node) in m.items() for node in nodes]
    if not rows:
        return None
    node = pl.col("node").str.strip_chars_start("node").cast(pl.Int64, strict=False)
    mapping = pl.DataFrame(rows, schema={HOST: pl.String, "device": pl.String, "node": pl.String, _DEV: pl.String,
                                         "_dev_node": pl.Int64}, orient="row").select(
        *keys, _DEV, (node == pl.col("_dev_node")).fill_null(False).alias(_LOCAL))
    # row order kept: _reduce_buckets' fast path needs the rows' sample x series grid
    return lf.join(mapping.lazy(), on=list(keys), how="inner", maintain_order="left")


def _irq_series(lf: pl.LazyFrame, facts: pl.DataFrame, spec: WindowSpec
                ) -> tuple[pl.DataFrame, tuple[int, int, bool], list[str | None], np.ndarray] | None:
    """One host's interrupt rows as a (samples x series) grid (see :func:`_reduce_buckets`)
    with each series' device (None: no facts for it) and locality (the row's node is the
    device's own), from the few series' (IRQ action, node): (rows, (samples, series,
    time-major), devices, local). None for anything else: several hosts, irregular rows."""
    b_us = round(spec.bucket * 1e6)
    t = pl.col(TIME).cast(pl.Int64)
    raw = lf.select(pl.col(HOST).cast(pl.String), pl.col("device").cast(pl.String),
                    pl.col("node").cast(pl.String).fill_null(""), t.alias(_T), (t // b_us * b_us).alias(_B),
                    "count").collect(engine="in-memory")
    hosts = raw[HOST]
    if not raw.height or hosts.null_count() or raw[_T].null_count() or not _rows_equal(hosts, 1):
        return None
    shape = _grid_shape(raw[_T].to_numpy(), raw[_B].to_numpy())
    if shape is None:
        return None
    n_t, k, time_major = shape
    if not _tags_follow_grid(raw, ("device", "node"), n_t, k, time_major):  # IRQ action and node
        return None
    first = np.arange(k) if time_major else np.arange(k) * n_t
    actions = _values_at(raw["device"], first)
    names = [str(d) for d in dict.fromkeys(actions) if d is not None]
    mapping = _irq_device_map(names, facts.filter(pl.col(HOST) == hosts[0]))
    node = pl.Series(_values_at(raw["node"], first), dtype=pl.String).str.strip_chars_start("node").cast(
        pl.Int64, strict=False).to_list()
    devs = [mapping[d][0] if d in mapping else None for d in actions]
    local = np.array([d in mapping and nd is not None and mapping[d][1] == nd
                      for d, nd in zip(actions, node, strict=True)], dtype=bool)
    return raw, shape, devs, local


def _irq_rows(lf: pl.LazyFrame, facts: pl.DataFrame, plan: _Plan, spec: WindowSpec) -> pl.DataFrame | None:
    """The :func:`bucket_rows` of :func:`_attach_irq_devices`' rows, mapped per series
    instead of joined per row (:func:`_irq_series`) and repeated over the samples. None
    (the caller joins) where the rows are no one-host grid. ``facts``: :func:`_facts_nodes`."""
    got = _irq_series(lf, facts, spec)
    if got is None:
        return None
    raw, (n_t, k, time_major), devs, local = got
    sidx = np.tile(np.arange(k), n_t) if time_major else np.repeat(np.arange(k), n_t)
    out = raw.select(HOST, pl.Series(_DEV, devs, dtype=pl.String).gather(sidx), _T, _B, "count",
                     pl.Series(_LOCAL, local[sidx]))
    kept = np.array([d is not None for d in devs], dtype=bool)
    if not kept.all():  # IRQs of devices without facts: dropped, as by the inner join
        out = out.filter(pl.Series(kept[sidx]))
    return out.select(HOST, _DEV, _T, _B, *[e.alias(c) for c, (e, _) in plan.buckets.items()])


def _irq_buckets(lf: pl.LazyFrame, facts: pl.DataFrame, plan: _Plan, spec: WindowSpec) -> pl.DataFrame | None:
    """:func:`_reduce_buckets` of :func:`_irq_rows` without the per-row frame: each
    series' interrupt counts summed per bucket over the grid, then the series summed per
    device (all, and the local ones): integer sums, exact in any order. Same frame as
    the reduction gives (row order aside); None where :func:`_irq_rows` is None or the
    plan/dtypes are not the built-in ones."""
    if set(plan.buckets) != {"count", "local"}:
        return None
    got = _irq_series(lf, facts, spec)
    if got is None or got[0]["count"].dtype != pl.Int64:
        return None
    raw, (n_t, k, time_major), devs, local = got
    c = raw["count"]
    v = (c.fill_null(0) if c.null_count() else c).to_numpy()  # polars' sum skips nulls
    b = raw[_B].to_numpy()
    bb = b[::k][:n_t] if time_major else b[:n_t]
    r_at = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1]])
    n_r = r_at.size
    if n_t % n_r == 0 and (np.diff(r_at) == n_t // n_r).all():  # equal buckets: einsum, ~10x
        run = n_t // n_r  # faster than reduceat over many short runs (integer sums: exact)
        per = (np.einsum("rlk->rk", v.reshape(n_r, run, k)).T if time_major
               else np.einsum("krl->kr", v.reshape(k, n_r, run)))
    else:
        per = (np.add.reduceat(v.reshape(n_t, k), r_at, axis=0).T if time_major
               else np.add.reduceat(v.reshape(k, n_t), r_at, axis=1))  # (series, buckets)
    kept = np.array([d is not None for d in devs], dtype=bool)
    if not kept.any():
        return None
    # devices as the reduction names them; series naming one device are summed
    named = pl.Series(_DEV, [d for d in devs if d is not None], dtype=pl.String).to_frame().select(
        _device_expr(plan).alias(_DEV))[_DEV]
    names = named.unique(maintain_order=True).to_list()
    idx = {d: i for i, d in enumerate(names)}
    codes = np.array([idx[d] for d in named.to_list()], dtype=np.int64)
    perm = np.argsort(codes, kind="stable")
    g_at = np.flatnonzero(np.r_[True, np.diff(codes[perm]) != 0])
    # series -> devices: one add per series of the largest device, on whole rows of
    # buckets (:func:`_group_rows`; reduceat runs element by element)
    sel = per[np.flatnonzero(kept)[perm]]
    steps = _group_steps(g_at, sel.shape[0])
    cnt = _group_rows(sel, g_at, steps, np.add)
    loc = _group_rows(sel * local[kept][perm][:, None], g_at, steps, np.add)
    n_d = len(names)
    return pl.DataFrame([
        pl.Series(HOST, [raw[HOST][0]], dtype=pl.String).new_from_index(0, n_r * n_d),
        pl.Series(_B, np.tile(bb[r_at], n_d)),
        pl.Series("count", cnt.ravel()), pl.Series("local", loc.ravel()),
        _repeat_each(_DEV, names, n_r),
    ])


def _tables(
    frames: Mapping[str, pl.LazyFrame], host_facts: pl.DataFrame | None, *, attach: bool = True
) -> dict[str, tuple[pl.LazyFrame, _Plan]]:
    """The measurements that give features, each with its plan (validated). With
    ``attach=False`` the interrupts frame is left as it is (see :func:`_irq_rows`)."""
    out: dict[str, tuple[pl.LazyFrame, _Plan]] = {}
    for name, lf in frames.items():
        if name in SKIPPED:
            continue
        sch = lf.collect_schema()
        if TIME not in sch or HOST not in sch:
            raise ValueError(f"measurement {name!r}: frame lacks {TIME!r}/{HOST!r} columns (has {list(sch)})")
        cols = set(sch)
        if name == "interrupts":
            if not {"count", "device", "node"} <= cols:
                continue
            if attach:
                attached = _attach_irq_devices(lf, host_facts)
                if attached is None:
                    continue
                lf = attached

        plan = _plan_of(name, tuple(sch.items()))
        if plan.device is not None and name in _PLANS:
            tag_cols = plan.device.meta.root_names()
            if not set(tag_cols) <= cols | {_DEV}:
                raise ValueError(f"measurement {name!r}: missing tag column(s) {sorted(set(tag_cols) - cols)}")
        if plan.features:
            out[name] = (lf, plan)
    return out


@functools.lru_cache(maxsize=256)
def _plan_of(name: str, columns: tuple[tuple[str, pl.DataType], ...]) -> _Plan:
    """A measurement's plan for its (column, dtype) pairs; cached: plans are immutable
    expressions, and building them cost ~5 % of the features' time per host-hour."""
    builder = _PLANS.get(name)
    sch = pl.Schema(columns)
    return builder(set(sch)) if builder is not None else _plan_generic(name, sch)


def _tags(plan: _Plan) -> list[str]:
    return list(dict.fromkeys(plan.device.meta.root_names())) if plan.device is not None else []


def bucket_rows(lf: pl.LazyFrame, plan: _Plan, spec: WindowSpec) -> pl.LazyFrame:
    """Stage 1a, lazy: the row-level columns of the bucket aggregation: host, tag
    columns, ``_t`` (µs), the bucket ``_b`` (an integer: µs since the epoch, a multiple
    of the bucket length; cheaper than datetime truncation) and one column per bucket
    aggregation. Row order is the input's (:func:`_reduce_buckets` relies on it)."""
    b_us = round(spec.bucket * 1e6)

    def build() -> list[pl.Expr]:
        t = pl.col(TIME).cast(pl.Int64)
        return [pl.col(HOST).cast(pl.String), *[pl.col(c) for c in _tags(plan)], t.alias(_T),
                (t // b_us * b_us).alias(_B), *[e.alias(n) for n, (e, _) in plan.buckets.items()]]

    return lf.select(_derived(plan, ("rows", b_us), build))


def _group_by_buckets(rows: pl.LazyFrame, plan: _Plan) -> pl.LazyFrame:
    def build() -> list[pl.Expr]:
        how = {"sum": pl.Expr.sum, "count": pl.Expr.count, "mean": pl.Expr.mean, "max": pl.Expr.max,
               "min": pl.Expr.min}
        return [how[a](pl.col(n)) for n, (_, a) in plan.buckets.items()]

    return rows.group_by(HOST, *_tags(plan), _B).agg(_derived(plan, ("group_by",), build))


def bucket_frame(lf: pl.LazyFrame, plan: _Plan, spec: WindowSpec) -> pl.LazyFrame:
    """Stage 1, lazy: ONE ``group_by`` of the raw rows on (host, tag columns, bucket) with
    every bucket aggregation of the plan at once (the reference semantics of
    :func:`_reduce_buckets`, which is what :func:`compute_features` uses)."""
    return _group_by_buckets(bucket_rows(lf, plan, spec), plan)


def _reduce_buckets(rows: pl.DataFrame, plan: _Plan) -> pl.DataFrame:
    """Stage 1b: the rows of :func:`bucket_rows` grouped by (host, tags, bucket), as
    :func:`bucket_frame` would, then named by device (:func:`_with_device`): host,
    ``_dev``, ``_b``, the aggregations (dtypes as the group_by's; row order differs;
    float sums equal up to rounding). Telemetry is regular - every sample of a tier reads the
    same series in the same order - so a host's rows are a (samples x series) grid,
    time-major as the agent and the lake store them or series-major as concatenated
    per-series frames are; then the reduction is numpy ``reduceat`` over contiguous
    runs, several times cheaper than a hash ``group_by`` over strings. Null readings
    (a counter's first delta) are corrected after the reduction when they are few
    (at most one in ``_SPARSE_NULLS`` rows), masked when many. Anything irregular
    (sparse tables with omitted rows, out-of-order samples, NaN under a max/min,
    float32 sums) takes the ``group_by``; so do tables of fewer than
    ``_REGULAR_MIN_ROWS`` rows whose float sums would differ from it in rounding."""
    out = _regular_buckets(rows, plan, exact=rows.height < _REGULAR_MIN_ROWS) if rows.height else None
    if out is None:
        log.debug("bucket rows of %s are not a regular grid: group_by", list(plan.buckets)[:3])
        return _with_device(_group_by_buckets(rows.lazy(), plan).collect(engine="in-memory"), plan)
    return out


_REGULAR_DTYPES = (pl.Int64, pl.Float64)
#: below this many rows the fast path is taken only where its values are the group_by's
#: bit for bit (:func:`_regular_host`'s ``exact``): small tables keep the reference's float
#: sums; above it, numpy's speed is worth float sums equal up to rounding
_REGULAR_MIN_ROWS = 20_000
#: numpy dtype of the group_by's counts (Polars' index type)
_IDX_NP = np.dtype(np.uint64) if pl.get_index_type() == pl.UInt64 else np.dtype(np.uint32)


def _regular_buckets(rows: pl.DataFrame, plan: _Plan, *, exact: bool = False) -> pl.DataFrame | None:
    """The fast path of :func:`_reduce_buckets`; None where the layout is not a grid
    (or not ``exact``: see :func:`_regular_host`). Devices are named on each host's few
    series, not on every bucket row; only where several series of a host name one
    device are their buckets merged (:func:`_merge_devices`)."""
    sch = rows.schema
    if any(sch[n] not in _REGULAR_DTYPES for n in plan.buckets):
        return None
    hosts = rows[HOST]
    if hosts.null_count() or rows[_T].null_count():
        return None
    if _rows_equal(hosts, 1):  # the usual case: one host per table scan
        spans = [(0, rows.height)]
    else:
        rle = hosts.rle()
        if rle.struct.field("value").n_unique() != rle.len():  # a host in several runs
            return None
        ends = np.cumsum(rle.struct.field("len").to_numpy())
        spans = list(zip(np.r_[0, ends[:-1]].tolist(), ends.tolist(), strict=True))
    parts, merge = [], False
    for lo, hi in spans:
        got = _regular_host(rows if len(spans) == 1 else rows.slice(lo, hi - lo), plan, exact)
        if got is None:
            return None
        parts.append(got[0])
        merge |= got[1]
    out = pl.concat(parts, rechunk=True) if len(parts) > 1 else parts[0]
    return _merge_devices(out, plan) if merge else out


def _grid_shape(t: np.ndarray, b: np.ndarray) -> tuple[int, int, bool] | None:
    """(samples, series, time_major) of a host's rows, or None. Buckets never going
    back: time-major, one sample of K series per run of equal times; else series-major,
    every series with the first one's T buckets. Bucket checks here, tag checks by the
    caller."""
    n = t.size
    back = np.flatnonzero(b[1:] < b[:-1])
    if not back.size:
        k = int(np.argmax(t != t[0])) or n
        if n % k == 0:
            bm = b.reshape(n // k, k)
            if k == 1 or (bm == bm[:, :1]).all():
                return n // k, k, True
        return None
    t_len = int(back[0]) + 1
    if n % t_len == 0:
        bm = b.reshape(n // t_len, t_len)
        if (bm == bm[:1]).all():  # (the first series' buckets never go back: t_len)
            return t_len, n // t_len, False
    return None


def _tags_follow_grid(rows: pl.DataFrame, tags: Sequence[str], n_t: int, k: int, time_major: bool) -> bool:
    """Whether every row of a samples x series grid (``n_t`` samples of ``k`` series,
    time-major or series-major) carries its series' values of ``tags``."""
    # time-major: a row is its series' row of the previous sample, k rows back;
    # series-major: the previous row, except where a series starts
    return all(_rows_equal(rows[tag], k) if time_major else _rows_equal(rows[tag], 1, n_t) for tag in tags)


#: undecided pairs of rows (equal length and first bytes, different views), up to one
#: in this many, compared string by string; more: the whole column by Polars
_FEW_PAIRS = 8


def _rows_equal(s: pl.Series, shift: int, period: int = 0) -> bool:
    """Whether every row of ``s`` equals the row ``shift`` rows later (nulls equal
    nulls), rows ``period - 1``, ``2 period - 1`` ... excepted where ``period`` > 0 (a
    series' last sample, series-major). By the Arrow string views in numpy where Polars
    exports them (:func:`_string_views`; Polars' string comparisons cost ~3 ns a row,
    the views' ~1): equal views are equal strings, a different length or first four
    bytes different ones; the rest - long strings stored once per row - by Polars."""
    n = s.len()
    if n <= shift:
        return True
    v = _string_views(s) if s.dtype == pl.String else None
    if v is not None:
        head = v[:, 0]  # length and first four bytes
        # a look at the first rows of a long column: long strings stored once per row
        # have different views everywhere, which Polars compares without a wasted pass
        for stop in ((256, n - shift) if n - shift > 4096 else (n - shift,)):
            at = _views_differ(v, shift, period, stop)
            if (head[at] != head[at + shift]).any():
                return False
            if at.size * _FEW_PAIRS > stop:
                break
        else:
            return not at.size or bool((s.gather(at) == s.gather(at + shift)).all())
    eq = _same_as(s.slice(shift), s.slice(0, n - shift))
    bad = eq.len() - eq.sum()
    if not bad or not period:
        return not bad
    at_starts = eq.gather_every(period, period - 1)  # where a new series may start
    return bad == at_starts.len() - at_starts.sum()


def _views_differ(v: np.ndarray, shift: int, period: int, stop: int) -> np.ndarray:
    """The rows ``i < stop`` whose string view differs from row ``i + shift``'s, rows
    ``period - 1``, ``2 period - 1`` ... excepted (see :func:`_rows_equal`)."""
    x = v[:stop + shift].reshape(-1)  # (length and prefix, rest) of each row
    d = x[2 * shift:] != x[:-2 * shift]
    if not d.any():
        return np.empty(0, dtype=np.int64)
    pair = d.view(np.uint16)  # nonzero where either half of a row's views differs
    if period:
        pair[period - 1::period] = 0
    return np.flatnonzero(pair)


def _same_as(s: pl.Series, other: pl.Series) -> pl.Series:
    return s.eq_missing(other) if s.null_count() or other.null_count() else s == other


def _regular_host(rows: pl.DataFrame, plan: _Plan, exact: bool = False) -> tuple[pl.DataFrame, bool] | None:
    """One host's reduction: (host, _b, aggregations, _dev; whether several groups name
    one device), or None if not a grid. With ``exact``, None also where a float sum or
    mean would add more than two values in a (bucket, group) cell: the group_by adds in
    an order of its own; two values (and the zeros standing in for nulls) add alike in
    any order."""
    n = rows.height
    b = rows[_B].to_numpy()
    shape = _grid_shape(rows[_T].to_numpy(), b)
    if shape is None:
        return None
    n_t, k, time_major = shape
    tags = _tags(plan)
    if not _tags_follow_grid(rows, tags, n_t, k, time_major):
        return None
    first = np.arange(k) if time_major else np.arange(k) * n_t  # each series' first row
    # series -> group of equal tag tuples, in order of first appearance
    keys = list(zip(*[_values_at(rows[tag], first) for tag in tags], strict=True)) if tags else [()] * k
    code_of: dict[tuple[object, ...], int] = {}
    codes = np.array([code_of.setdefault(key, len(code_of)) for key in keys], dtype=np.int64)
    n_g = len(code_of)
    perm = np.argsort(codes, kind="stable")
    g_at = np.flatnonzero(np.r_[True, np.diff(codes[perm]) != 0])  # group starts among sorted series
    bb = b[::k][:n_t] if time_major else b[:n_t]
    r_at = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1]])  # bucket starts among samples
    n_r = r_at.size
    run = n_t // n_r if n_t % n_r == 0 and (np.diff(r_at) == n_t // n_r).all() else 0  # equal buckets

    def reduce(v: np.ndarray, op: np.ufunc, pairwise: bool = False) -> np.ndarray:
        """(groups, buckets): over each bucket's samples first (the big reduction, on
        views), then over the series of each group (small): one ufunc call per series
        of the largest group, on whole rows of buckets (:func:`_group_rows`), or with
        ``pairwise`` numpy's ``reduceat`` along each bucket's series (~20x slower; its
        float sums add in an order of their own, which the features had before:
        kept where the order changes the bits)."""
        if run == 1:  # one sample per bucket: nothing to reduce over the samples
            r = v.reshape(n_t, k).T if time_major else v.reshape(k, n_t)
        elif time_major:  # (samples, series), C order
            m = v.reshape(n_t, k)
            if run:
                m3 = m.reshape(n_r, run, k)
                r = np.einsum("rlk->rk", m3) if op is np.add else op.reduce(m3, axis=1)
            else:
                r = op.reduceat(m, r_at, axis=0)
            r = r.T
        else:  # (series, samples), C order: reduce along rows
            m = v.reshape(k, n_t)
            if run:  # einsum: the fastest plain sum over a short inner axis; max/min
                m3 = m.reshape(k, n_r, run)  # by one pass per position (exact either way)
                if op is np.add:
                    r = np.einsum("krl->kr", m3)
                else:  # (on (cells, run): 1-d strided passes, ~1/3 faster than 2-d ones)
                    m2 = m.reshape(-1, run)
                    r = m2[:, 0].copy()
                    for j in range(1, run):
                        op(r, m2[:, j], out=r)
                    r = r.reshape(k, n_r)
            else:
                r = op.reduceat(m, r_at, axis=1)
        if identity:
            return r
        return op.reduceat(r.T[:, perm], g_at, axis=1).T if pairwise else _group_rows(r[perm], g_at, steps, op)

    identity = n_g == k and bool((perm == np.arange(k)).all())
    steps = None if identity else _group_steps(g_at, k)
    # one sample per bucket and group, rows in the output's order: the rows are the
    # buckets (the medium tier's tables, per series or host-wide, series-major)
    same_rows = run == 1 and identity and (k == 1 or not time_major)

    # samples per (group, bucket) when a column has no nulls
    full = np.outer(np.bincount(codes, minlength=n_g), np.diff(r_at, append=n_t))
    full_ok = None if full.all() else full > 0

    def cells(i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group, bucket) of the rows ``i``: where they land in a reduction."""
        t, j = np.divmod(i, k) if time_major else np.divmod(i, n_t)[::-1]
        return codes[j], np.searchsorted(r_at, t, side="right") - 1

    cols: list[pl.Series] = []
    for name, (_, agg) in plan.buckets.items():
        s = rows[name]
        n_null = s.null_count()
        cnt, has, fix = full, full_ok, None
        if same_rows and not n_null and agg != "count" and (agg != "mean" or s.dtype == pl.Float64):
            if agg in ("max", "min") and s.dtype == pl.Float64 and np.isnan(s.to_numpy()).any():
                return None  # (as below)
            cols.append(s)  # the column as it is: each value is its bucket's sum, mean, max or min
            continue
        if not n_null:
            v = s.to_numpy()
        elif n_null * _SPARSE_NULLS <= n:
            # few nulls (a counter's first delta per series): the values buffer as it is,
            # the rows under nulls set or subtracted afterwards (no mask of every row)
            v, valid = _buffers(s)
            null_i = np.flatnonzero(~valid)
            at = cells(null_i)
            if agg == "sum" and v.dtype.kind == "i":
                fix = (at, v[null_i])  # exact for integers: subtract what lies under the nulls
            else:
                v = v.copy()
                v[null_i] = _fill_value(v.dtype, agg)
            if agg != "sum":
                cnt = full.copy()
                np.subtract.at(cnt, at, 1)
                has = None if cnt.all() else cnt > 0
        else:
            v, valid = _buffers(s)
            if agg != "sum":
                cnt = reduce(valid.astype(np.int64), np.add)
                has = cnt > 0
            v = np.where(valid, v, _fill_value(v.dtype, agg))
        if agg == "count":
            r, ok = cnt.astype(_IDX_NP), None
        elif agg in ("sum", "mean"):
            # a float cell of more than two values (a sum's cnt: its rows, nulls too)
            # adds in an order of numpy's, other than the group_by's
            many = v.dtype.kind == "f" and cnt.max(initial=0) > 2
            if exact and many:
                return None
            r, ok = reduce(v, np.add, pairwise=many), None  # polars: the sum of no values is 0
            if fix is not None:
                r = np.require(r, requirements=["O", "W"])  # (not a view of the values: they are Polars')
                np.subtract.at(r, fix[0], fix[1])
            if agg == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    r, ok = r / cnt, has
        else:
            r, ok = reduce(v, np.maximum if agg == "max" else np.minimum), has
            # NaN propagates through np.maximum/minimum: a NaN cell had a NaN row
            if r.dtype.kind == "f" and np.isnan(r).any():
                return None  # polars' max/min skip NaN; leave that to it
        cols.append(_masked(name, r.ravel(), None if ok is None or ok.all() else ok.ravel()))
    # group-major output: group 0's buckets, then group 1's ...; each group's device
    # as _with_device names it (merging is needed where two share one)
    names = _group_devices(plan, tags, list(code_of), rows.schema) if tags else [""]
    n_out = n_r * n_g
    if same_rows:
        host, b_col = rows[HOST], rows[_B]
    else:
        host = pl.Series(HOST, [rows[HOST][0]], dtype=pl.String).new_from_index(0, n_out)
        b_col = pl.Series(_B, np.tile(bb[r_at], n_g))
    out = pl.DataFrame([host, b_col, *cols, _repeat_each(_DEV, names, n_r)])
    return out, len(set(names)) < n_g


def _values_at(s: pl.Series, at: np.ndarray) -> list[object]:
    """``s``'s values at the rows ``at`` (a few: one by one, ~1 µs each; a gather of
    even two strings costs ~80 µs)."""
    return [s[i] for i in at.tolist()] if at.size <= _FEW_RUNS else s.gather(at).to_list()


#: plan -> (the plan, {tag values: device name}): the names of a table's few tag values,
#: kept per plan (a query of the device expression costs ~0.15 ms, mostly a regex
#: compiled anew). The plan is held, so its id is not reused while cached
_NAMES: dict[int, tuple[_Plan, dict[tuple[object, ...], str]]] = {}
_NAMES_MAX = 256


def _group_devices(plan: _Plan, tags: Sequence[str], groups: Sequence[tuple[object, ...]],
                   sch: pl.Schema) -> list[str]:
    """The device name of each group's tag values (:func:`_device_expr`): one query
    for the values not named before."""
    entry = _NAMES.get(id(plan))
    if entry is None or entry[0] is not plan:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        entry = _NAMES[id(plan)] = (plan, {})
    known = entry[1]
    if len(known) > _NAMES_MAX * 16:  # (tag values of high cardinality)
        known.clear()
    dtypes = tuple(sch[tag] for tag in tags)
    # (looked up once into a local dict: another thread's sweep may clear the cache)
    found = {g: known.get((dtypes, g)) for g in groups}
    new = [g for g, name in found.items() if name is None]
    if new:
        values = pl.DataFrame([pl.Series(tag, [g[j] for g in new], dtype=dt)
                               for j, (tag, dt) in enumerate(zip(tags, dtypes, strict=True))])
        for g, name in zip(new, values.select(_device_expr(plan)).to_series().to_list(), strict=True):
            found[g] = known[(dtypes, g)] = name
    return [str(found[g]) for g in groups]


def _repeat_each(name: str, values: Sequence[str], each: int) -> pl.Series:
    """A string column of ``values``, each repeated ``each`` times (a few constant
    blocks: ~4x cheaper than a gather of every row)."""
    s = pl.Series(name, values, dtype=pl.String)
    if len(values) == 1:
        return s.new_from_index(0, each)
    if len(values) > _FEW_RUNS:
        return s.gather(np.repeat(np.arange(len(values)), each))
    return pl.concat([s.new_from_index(i, each) for i in range(len(values))], rechunk=True)


#: a column with at most one null in this many rows is corrected null by null
_SPARSE_NULLS = 16


def _fill_value(dtype: np.dtype, agg: Agg) -> float:
    """What stands in for a null in a reduction: 0 for sums, the identity for max/min."""
    if agg not in ("max", "min"):
        return 0
    if dtype.kind == "f":
        return -np.inf if agg == "max" else np.inf
    info = np.iinfo(dtype)
    return int(info.min if agg == "max" else info.max)


def _values_buffer(s: pl.Series) -> np.ndarray:
    """The values of a numeric series without a copy, nulls included as whatever lies
    under them (read-only; the caller masks or subtracts those rows)."""
    return _arrow_values(s.rechunk().to_arrow())


def _arrow_values(arr: pa.Array) -> np.ndarray:
    dt = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)


def _buffers(s: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_values_buffer` and the validity of every row (bool) of a numeric series
    with nulls, from its Arrow buffers (Polars' ``is_not_null``/``fill_null`` cost
    ~0.1-0.2 ms each, even on small tables)."""
    arr = s.rechunk().to_arrow()
    v, bits = _arrow_values(arr), arr.buffers()[0]
    n, off = len(arr), arr.offset
    if bits is None:  # (no nulls after all)
        return v, np.ones(n, dtype=bool)
    valid = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=off + n, bitorder="little")[off:]
    return v, valid.view(bool)


def _group_steps(g_at: np.ndarray, k: int) -> list[tuple[np.ndarray | None, np.ndarray]]:
    """For :func:`_group_rows`: the ``j``-th series (j >= 1) of every group that has
    one, as (those groups, None for all; their rows), once per table."""
    size = np.diff(g_at, append=k)
    steps: list[tuple[np.ndarray | None, np.ndarray]] = []
    for j in range(1, int(size.max())):
        sel = np.flatnonzero(size > j)
        steps.append((None, g_at + j) if sel.size == g_at.size else (sel, g_at[sel] + j))
    return steps


def _group_rows(rs: np.ndarray, g_at: np.ndarray, steps: list[tuple[np.ndarray | None, np.ndarray]] | None,
                op: np.ufunc) -> np.ndarray:
    """``op`` over the rows of each group of ``rs`` (series x buckets, the groups'
    series in runs starting at ``g_at``; ``steps``: :func:`_group_steps`), the series
    one after the other: one ufunc call per series of the largest group, on whole rows
    (``reduceat`` runs element by element: ~20x slower)."""
    out = rs[g_at]
    for sel, at in steps or ():
        if sel is None:
            op(out, rs[at], out=out)
        else:
            out[sel] = op(out[sel], rs[at])
    return out


def _masked(name: str, values: np.ndarray, valid: np.ndarray | None) -> pl.Series:
    """A series of ``values``, null where ``valid`` is False (a validity mask: a NaN
    stays a NaN)."""
    if valid is None or valid.all():
        return pl.Series(name, values)
    return pl.Series(name, pa.array(values, mask=~valid))


def _device_expr(plan: _Plan) -> pl.Expr:
    dev = plan.device if plan.device is not None else pl.lit("")
    return dev.cast(pl.String).fill_null("").str.replace_all(DEVICE_SEP, ":", literal=True)


def _with_device(bk: pl.DataFrame, plan: _Plan) -> pl.DataFrame:
    """(host, _dev, _b, aggregations): the device named from the tags, on the
    group_by's bucket rows (the fast path names its groups itself)."""
    tags = _tags(plan)
    if not tags:
        return bk.hstack([pl.Series(_DEV, [""], dtype=pl.String).new_from_index(0, bk.height)])
    dev = _device_expr(plan)
    if tags != [_DEV] and len(tags) == 1 and bk.height and not bk[HOST].null_count() and _rows_equal(bk[HOST], 1):
        # one host, one tag: the devices of its few distinct values, by string views
        # (naming every row cost ~1 ms per table, the check of a merge as much again)
        got = _device_codes(bk[tags[0]]) if bk[tags[0]].dtype == pl.String else None
        if got is not None:
            values, code = got
            names = values.rename(tags[0]).to_frame().select(dev.alias(_DEV)).to_series()
            out = bk.drop(tags).hstack([names.gather(code)])
            return _merge_devices(out, plan) if names.n_unique() < names.len() else out
    named = bk.lazy().with_columns(dev.alias(_DEV)).drop([t for t in tags if t != _DEV]).collect(engine="in-memory")
    # merging is needed only where a host has several tag values of one device (a merge of
    # single rows changes nothing), which the few distinct tag values tell
    merge = len(tags) > 1 or (tags != [_DEV] and bool(
        bk.lazy().select(HOST, *tags).unique().select(pl.struct(HOST, dev).is_duplicated().any())
        .collect(engine="in-memory").item()))
    return _merge_devices(named, plan) if merge else named


def _merge_devices(bk: pl.DataFrame, plan: _Plan) -> pl.DataFrame:
    """Bucket rows of several tag values that name one device (e.g. '1' and 'node1')
    merged with the window semantics (sums add; a mean of means is close enough here)."""
    agg = {"sum": pl.Expr.sum, "count": pl.Expr.sum, "mean": pl.Expr.mean, "max": pl.Expr.max, "min": pl.Expr.min}
    return bk.lazy().group_by(HOST, _DEV, _B).agg([agg[a](pl.col(n)) for n, (_, a) in plan.buckets.items()]).collect(
        engine="in-memory")


@dataclass(frozen=True)
class _Grid:
    """Every host's buckets from its first to its last (over all tables), and which
    grid rows end a window that is kept. Windows are evaluated at the row of their LAST
    bucket as trailing sums over ``m`` buckets, so all tables share one row order."""

    frame: pl.DataFrame  # host, _b (sorted)
    keep: np.ndarray  # bool per grid row: a window ends here
    index: pl.DataFrame  # host, window_start, window_end of the kept rows
    dur: np.ndarray  # covered seconds of each kept window
    m: int  # buckets per window
    hosts: pl.Series  # sorted; host i's buckets are frame rows off[i] .. off[i+1]-1
    off: np.ndarray
    first: np.ndarray  # first bucket of each host
    b_us: int


def _grid(bks: Sequence[pl.DataFrame], spec: WindowSpec) -> _Grid:
    b_us = round(spec.bucket * 1e6)
    s_us = round(spec.stride_s * 1e6)
    m = round(spec.length_s / spec.bucket)
    span: dict[str, tuple[int, int]] = {}
    for bk in bks:  # one host per table is the usual case: its extent without a query
        hs = bk[HOST]
        if hs.null_count() == 0 and (hs == hs[0]).all():
            b = bk[_B].to_numpy()
            ext = [(hs[0], int(b.min()), int(b.max()))]
        else:
            ext = bk.group_by(HOST).agg(pl.col(_B).min(), pl.col(_B).max().alias(_LAST)).rows()
        for h, lo, hi in ext:
            old = span.get(h)
            span[h] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    # Polars' sort order: nulls first, then by code point (= UTF-8 byte order)
    hosts = sorted(span, key=lambda h: (h is not None, h or ""))
    firsts = np.array([span[h][0] for h in hosts], dtype=np.int64)
    lasts = np.array([span[h][1] for h in hosts], dtype=np.int64)
    # a host with less than one window of data still gets its grid extended to one window
    nbs = np.maximum((lasts - firsts) // b_us + 1, m).astype(np.int64)
    off = np.concatenate([[0], np.cumsum(nbs)])
    local = np.arange(off[-1], dtype=np.int64) - np.repeat(off[:-1], nbs)
    first = np.repeat(firsts, nbs)
    last = np.repeat(lasts, nbs)
    b = first + local * b_us
    ws = b - (m - 1) * b_us
    # full windows aligned to the stride inside the host's data; a host shorter than one
    # window keeps the one window starting at its first bucket (normalised by coverage)
    keep = (ws >= first) & (((b <= last) & (ws % s_us == 0)) | ((ws == first) & (last < b)))
    frame = pl.DataFrame({HOST: pl.Series(np.repeat(np.array(hosts, dtype=object), nbs), dtype=pl.String),
                          _B: b})
    dur = (np.minimum(b, last)[keep] + b_us - ws[keep]) / 1e6
    start = pl.Series(WINDOW_START, ws[keep]).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    index = pl.DataFrame({HOST: frame[HOST].filter(pl.Series(keep)), WINDOW_START: start}).with_columns(
        (pl.col(WINDOW_START) + pl.duration(microseconds=round(spec.length_s * 1e6))).alias(WINDOW_END))
    return _Grid(frame, keep, index, dur, m, pl.Series(HOST, hosts, dtype=pl.String), off, firsts, b_us)


def _table_windows(bk: pl.DataFrame, plan: _Plan, grid: _Grid) -> tuple[list[str], pl.DataFrame]:
    """Stage 2, eager on the small bucket frame: the table's devices x the host grid,
    trailing aggregations over ``m`` buckets at the kept window rows (sum/count -> sum,
    mean -> mean of the non-null bucket values, max/min; null where all ``m`` are null),
    then the plan's features (:func:`_windows_np`). Returns the devices and a frame of
    ``len(devices) * n_windows`` rows, device-major, each device's rows in the grid's
    window order."""
    devs, src = _dense_index(bk, grid)
    return [str(d) for d in devs.to_list()], _windows_np([(bk, plan, src)], devs.len(), grid)


def _dense_index(bk: pl.DataFrame, grid: _Grid) -> tuple[pl.Series, np.ndarray | None]:
    """The table's devices (sorted) and, for each (device x grid) row, device-major, the
    bucket row that lands there (-1: none); None where the bucket rows already are
    those rows in that order (regular tables). The positions are arithmetic: no join;
    each row's device comes from :func:`_device_codes` (a search per run of equal
    devices where that declines)."""
    n_grid = grid.frame.height
    got = _device_codes(bk[_DEV])
    if got is None:  # by runs of equal values: a search per run
        runs = bk[_DEV].rle()
        devs = runs.struct.field("value").unique().sort()
        dev = np.repeat(devs.search_sorted(runs.struct.field("value")).to_numpy(),
                        runs.struct.field("len").to_numpy())
    else:
        devs, dev = got
    b = bk[_B].to_numpy()
    if grid.hosts.len() == 1:  # then every table's rows are of that host
        pos = dev * n_grid + (b - grid.first[0]) // grid.b_us
    else:
        runs = bk[HOST].rle()
        h = np.repeat(grid.hosts.search_sorted(runs.struct.field("value")).to_numpy(),
                      runs.struct.field("len").to_numpy())
        pos = dev * n_grid + grid.off[h] + (b - grid.first[h]) // grid.b_us
    if pos.size == devs.len() * n_grid and bool((pos == np.arange(pos.size)).all()):
        return devs, None
    src = np.full(devs.len() * n_grid, -1, dtype=np.int64)
    src[pos] = np.arange(pos.size)
    return devs, src


#: runs, or distinct string views, up to which rows' devices are named one at a time
_FEW_RUNS = 64
_FEW_VIEWS = 16


#: pyarrow >= 16 reads Arrow string views (Polars' strings), without a copy
_HAS_VIEWS = hasattr(pa, "string_view")


def _string_views(s: pl.Series) -> np.ndarray | None:
    """The Arrow string views of a column without nulls as (n, 2) uint64, without a
    copy (16 bytes a value: length and prefix, then the rest of a short string or the
    buffer and offset of a long one); None where Polars exports no views. Equal views
    are equal strings; equal strings may have different views (long ones)."""
    if not _HAS_VIEWS or s.null_count():
        return None
    a = s.to_arrow(compat_level=pl.CompatLevel.newest())
    if a.type != pa.string_view():
        return None
    return np.frombuffer(a.buffers()[1], dtype=np.uint64, count=2 * len(a), offset=a.offset * 16).reshape(-1, 2)


def _device_codes(dev: pl.Series) -> tuple[pl.Series, np.ndarray] | None:
    """The sorted devices of a column and each row's index among them, by the rows'
    string views (numpy; Polars' string operations cost 20-50 ns a row here): runs of
    equal views named one by one where they are few (the fast reduction's rows come
    device by device), else one comparison per distinct view (the ``group_by``'s rows
    come in any order). A device seen under several views is one device (named by its
    string). None (the caller searches per run) without views, or with many."""
    n = dev.len()
    v = _string_views(dev) if n else None
    if v is None:
        return None
    lo, hi = v[:, 0], v[:, 1]
    change = lo[1:] != lo[:-1]
    change |= hi[1:] != hi[:-1]
    starts = np.flatnonzero(change) + 1
    if starts.size < _FEW_RUNS:
        at = np.concatenate([[0], starts])
        found = [dev[int(i)] for i in at]
        code = np.repeat(np.arange(at.size), np.diff(np.append(at, n)))
    else:
        code = np.full(n, -1, dtype=np.int64)
        found = []
        first = 0  # the first row without a view group yet
        while first < n:
            if len(found) == _FEW_VIEWS:
                return None
            same = lo == lo[first]
            same &= hi == hi[first]
            code[same] = len(found)
            found.append(dev[first])
            rest = np.flatnonzero(code[first:] < 0)
            first = first + int(rest[0]) if rest.size else n
    names = sorted(set(found))  # Polars' string order: by code point
    rank = {name: i for i, name in enumerate(names)}
    return pl.Series(_DEV, names, dtype=pl.String), np.array([rank[f] for f in found], dtype=np.int64)[code]


def _dense(bk: pl.DataFrame, plan: _Plan, grid: _Grid) -> tuple[pl.Series, pl.LazyFrame]:
    """The table's devices and its bucket columns laid out as (device x grid) rows,
    device-major (lazy; a grid position without a bucket row is null): the input of
    Polars' rolling (:func:`_windows_query`)."""
    devs, src = _dense_index(bk, grid)
    return devs, _dense_frame(bk, list(plan.buckets), src)


def _dense_frame(bk: pl.DataFrame, cols: list[str], src: np.ndarray | None) -> pl.LazyFrame:
    """``cols`` of ``bk`` gathered by a :func:`_dense_index` (ONE gather; -1 gathers null)."""
    if src is None:
        return bk.lazy().select(cols)
    at = pl.Series(src, dtype=pl.Int64)
    if (src < 0).any():
        at = pl.select(pl.when(at >= 0).then(at)).to_series()
    return bk.lazy().select(pl.col(cols).gather(at.cast(pl.get_index_type())))


def _rolled(plan: _Plan, m: int) -> list[pl.Expr]:
    def build() -> list[pl.Expr]:
        if m <= 1:
            return [pl.col(n) for n in plan.buckets]
        # rows whose window would reach into the previous (device, host) group are never
        # kept (their window starts before the host's first bucket), so no .over() needed
        roll = {"sum": pl.Expr.rolling_sum, "count": pl.Expr.rolling_sum, "mean": pl.Expr.rolling_mean,
                "max": pl.Expr.rolling_max, "min": pl.Expr.rolling_min}
        return [roll[a](pl.col(n), m, min_samples=1) for n, (_, a) in plan.buckets.items()]

    return _derived(plan, ("roll", m), build)


def _feature_exprs(plan: _Plan) -> list[pl.Expr]:
    def build() -> list[pl.Expr]:
        zero = set(plan.zero_fill)  # sparse tables: a device without rows in a window had no events
        return [(_safe(e).fill_null(0.0) if fam in zero else _safe(e)).alias(fam) for fam, e in plan.features.items()]

    return _derived(plan, ("features",), build)


def _raw_feature_exprs(plan: _Plan) -> list[pl.Expr]:
    """:func:`_feature_exprs` before :func:`_safe`'s finite check and ``zero_fill``."""
    return _derived(plan, ("raw",), lambda: [e.cast(pl.Float64).alias(fam) for fam, e in plan.features.items()])


def _read(plan: _Plan) -> list[str]:
    """The bucket columns that the plan's features read (others are never rolled)."""
    def build() -> list[pl.Expr]:
        roots = {r for e in plan.features.values() for r in e.meta.root_names()}
        used = [pl.col(n) for n in plan.buckets if n in roots]
        return [pl.struct(used)] if used else []  # one expression: its root names are the columns

    got = _derived(plan, ("read",), build)
    return got[0].meta.root_names() if got else []


def _windows_of(g: pl.LazyFrame | pl.DataFrame, devs: pl.Series, plan: _Plan, grid: _Grid
                ) -> tuple[list[str], pl.DataFrame]:
    """:func:`_windows_query` of one table's dense (device x grid) bucket columns."""
    return [str(d) for d in devs.to_list()], _windows_query(g.lazy(), [plan], devs.len(), grid)


def _windows_query(g: pl.LazyFrame, plans: Sequence[_Plan], n_dev: int, grid: _Grid) -> pl.DataFrame:
    """The Polars reference of :func:`_windows_np` (and its fallback): Polars' rolling
    aggregations over the dense (device x grid) columns of tables with ``n_dev`` devices
    side by side in ``g``, the kept rows, the features (``zero_fill`` ones with 0 for
    null) - one query."""
    keep = np.tile(grid.keep, n_dev)
    w = g.select([e for p in plans for e in _rolled(p, grid.m)]).filter(pl.lit(pl.Series(keep))).with_columns(
        pl.lit(pl.Series(_DUR, np.tile(grid.dur, n_dev))))
    return w.select([e for p in plans for e in _feature_exprs(p)]).collect(engine="in-memory")


#: dtypes the numpy windows handle as Polars' rolling does (output dtype = input dtype;
#: Polars widens smaller integers and booleans when summing them)
_NP_DTYPES = (pl.Int64, pl.Float64, pl.UInt32, pl.Int32, pl.UInt64)
#: windows of more buckets go to Polars: the numpy sums cost m passes, Polars' kernel one
_NP_MAX_M = 16


def _windows_np(parts: Sequence[tuple[pl.DataFrame, _Plan, np.ndarray | None]], n_dev: int, grid: _Grid
                ) -> pl.DataFrame:
    """The features of tables with ``n_dev`` devices each (``(bucket frame, plan,
    :func:`_dense_index`)``; bucket and feature names distinct), one frame of
    ``n_dev * n_windows`` rows: :func:`_rolled_frame`, then the features (``zero_fill``
    ones with 0 for null) in ONE Polars query. Where that declines, Polars' rolling
    over the dense columns (:func:`_windows_query`)."""
    plans = [plan for _, plan, _ in parts]
    w = _rolled_frame(parts, n_dev, grid)
    if w is None:
        dense = [_dense_frame(bk, list(plan.buckets), src) for bk, plan, src in parts]
        return _windows_query(dense[0] if len(dense) == 1 else pl.concat(dense, how="horizontal"), plans, n_dev, grid)
    raw = w.select([e for p in plans for e in _raw_feature_exprs(p)])
    # :func:`_safe` (non-finite -> null) and ``zero_fill`` on the results: a when/then
    # per feature cost twice the features themselves; the finite check in numpy, a tenth
    zero = {fam for p in plans for fam in p.zero_fill}
    cols = []
    for col in raw.get_columns():
        x = col.to_numpy()  # (nulls read NaN: not finite either)
        ok = np.isfinite(x)
        if ok.all():
            cols.append(col)
        elif col.name in zero:
            cols.append(pl.Series(col.name, np.where(ok, x, 0.0)))
        else:
            cols.append(pl.Series(col.name, np.where(ok, x, np.nan), nan_to_null=True))
    return pl.DataFrame(cols)


def _rolled_frame(parts: Sequence[tuple[pl.DataFrame, _Plan, np.ndarray | None]], n_dev: int, grid: _Grid
                  ) -> pl.DataFrame | None:
    """Each bucket column the features read (:func:`_read`) aggregated over the ``m``
    buckets of every kept window, device-major (:func:`_rolled_np`: numpy at the kept
    rows only; Polars' rolling kernels cost ~13 ns per element of every row), and
    ``_dur``. None (Polars' rolling then) for dtypes other than ``_NP_DTYPES`` and
    windows of more than ``_NP_MAX_M`` buckets."""
    read = [_read(plan) for _, plan, _ in parts]
    if grid.m > _NP_MAX_M or any(bk[c].dtype not in _NP_DTYPES for (bk, _, _), cs in zip(parts, read, strict=True)
                                 for c in cs):
        return None
    sel = grid.keep[grid.m - 1:]  # (the first m-1 rows of a grid are never kept)
    kept = None if sel.all() else np.flatnonzero(sel)
    cols: list[pl.Series] = []
    for (bk, plan, src), cs in zip(parts, read, strict=True):
        miss = None
        if src is not None and (src < 0).any():
            miss = src < 0
            src = np.where(miss, 0, src)
        for name in cs:
            values, valid = _rolled_np(bk[name], plan.buckets[name][1], src, miss, n_dev, grid.m, kept)
            # nulls by a validity mask: a NaN in a window is a NaN, not a null
            cols.append(pl.Series(name, values if valid is None else pa.array(values, mask=~valid)))
    cols.append(pl.Series(_DUR, np.tile(grid.dur, n_dev)))
    return pl.DataFrame(cols)


def _rolled_np(s: pl.Series, agg: Agg, src: np.ndarray | None, miss: np.ndarray | None, n_dev: int, m: int,
               kept: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """One bucket column aggregated over the trailing ``m`` buckets of every kept window
    row, with Polars' ``rolling_*(m, min_samples=1)`` semantics: nulls skipped, null
    where all ``m`` are null; NaN propagates (sums, means, max and min alike). ``src``:
    the bucket row of each (device x grid) row (no -1: ``miss`` marks those), None
    for the rows as they are; ``kept``: the kept window rows among each device's grid
    rows ``m-1 ..`` (None: all). Returns the values and their validity (None: all
    valid), device-major. Sums add left to right (Polars' rolling sum is a running
    Kahan sum with subtractions: float sums and means may differ in the last bits;
    integers, max and min are exact)."""
    valid: np.ndarray | None = None
    if s.null_count():
        v, valid = _buffers(s)
    else:
        v = s.to_numpy()
    if src is not None:
        v = v[src]
        if valid is not None:
            valid = valid[src]
        if miss is not None:
            valid = ~miss if valid is None else valid & ~miss
    if agg == "mean" and v.dtype.kind != "f" and m > 1:
        v = v.astype(np.float64)
    if valid is not None:
        v = np.where(valid, v, _fill_value(v.dtype, "max" if agg == "max" else "min" if agg == "min" else "sum"))
    d = v.reshape(n_dev, -1)
    w = d.shape[1] - m + 1  # windows ending at grid rows m-1 ..
    if m == 1:
        acc = d
    else:
        op = np.maximum if agg == "max" else np.minimum if agg == "min" else np.add
        acc = op(d[:, :w], d[:, 1:1 + w])
        for j in range(2, m):
            op(acc, d[:, j:j + w], out=acc)
        if op is np.add and acc.dtype.kind == "f":
            acc += 0.0  # Polars' sums start at +0.0: a window of -0.0 sums to +0.0
    cnt = None
    if valid is not None:
        ok = valid.reshape(n_dev, -1).view(np.int8)
        cnt = ok[:, :w].astype(np.int32)
        for j in range(1, m):
            cnt += ok[:, j:j + w]
    if agg == "mean" and m > 1:  # (acc is a new float array here: divided in place)
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, cnt if cnt is not None else m, out=acc)
    if kept is not None:
        acc = acc[:, kept]
        cnt = cnt[:, kept] if cnt is not None else None
    has = None if cnt is None else (cnt > 0).ravel()
    return acc.ravel(), None if has is None or has.all() else has


def _all_windows(bks: Mapping[str, pl.DataFrame], plans: Mapping[str, _Plan], grid: _Grid
                 ) -> dict[str, tuple[list[str], pl.DataFrame]]:
    """:func:`_table_windows` of every table, tables with equally many devices in one
    query (their window rows have equal heights and the same order; 14 tables -> 6
    queries per host-hour). Tables whose bucket or feature names collide with
    another's of the group get their own query."""
    groups: dict[int, list[tuple[str, pl.Series, np.ndarray | None, set[str]]]] = {}
    alone: list[tuple[str, pl.Series, np.ndarray | None]] = []
    for name, bk in bks.items():
        devs, src = _dense_index(bk, grid)
        names = {*plans[name].buckets, *plans[name].features}
        members = groups.setdefault(devs.len(), [])
        if _DUR in names or any(names & other for *_, other in members):
            alone.append((name, devs, src))
        else:
            members.append((name, devs, src, names))
    out: dict[str, tuple[list[str], pl.DataFrame]] = {}
    for n_dev, members in groups.items():
        feats = _windows_np([(bks[name], plans[name], src) for name, _, src, _ in members], n_dev, grid)
        for name, devs, _, _ in members:
            out[name] = ([str(d) for d in devs.to_list()], feats[list(plans[name].features)])
    for name, devs, src in alone:
        out[name] = ([str(d) for d in devs.to_list()], _windows_np([(bks[name], plans[name], src)], devs.len(), grid))
    return out


def _table_windows_polars(bk: pl.DataFrame, plan: _Plan, grid: _Grid) -> tuple[list[str], pl.DataFrame]:
    """:func:`_table_windows` by a join of the bucket rows on the grid and Polars'
    rolling aggregations (the reference semantics)."""
    devs = bk[_DEV].unique().sort()
    n_dev, n_grid = devs.len(), grid.frame.height
    g = pl.DataFrame({_DEV: devs.gather(np.repeat(np.arange(n_dev), n_grid))}).hstack(
        pl.concat([grid.frame] * n_dev) if n_dev > 1 else grid.frame)
    g = g.join(bk, on=[_DEV, HOST, _B], how="left", maintain_order="left")
    return _windows_of(g.select(list(plan.buckets)), devs, plan, grid)


def compute_features(
    frames: Mapping[str, pl.LazyFrame],
    spec: WindowSpec = WindowSpec(),
    *,
    host_facts: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The wide feature frame: host, window_start, window_end, one Float64 column per
    feature (see :mod:`analytics.catalog` for names). Missing tables/columns simply give
    fewer columns; an empty input gives an empty frame with the key columns.

    Cost: the raw rows are touched once, one table at a time (peak memory is the
    largest table's rows, not all of them); everything after works on 1-s buckets."""
    tables = _tables(frames, host_facts, attach=False)
    names = list(tables)
    bks = {}
    for name in names:  # one table at a time: peak memory is the largest table's rows
        lf, plan = tables[name]
        bk = None
        if name == "interrupts":  # the raw frame: devices mapped per series, else joined per row
            facts = _facts_nodes(host_facts)
            if facts.is_empty():
                log.info("no numa_node facts: irq.locality and irq.rate are not computed")
                continue
            bk = _irq_buckets(lf, facts, plan, spec)
            if bk is None:
                attached = _attach_irq_devices(lf, host_facts)
                if attached is None:
                    continue
                lf = attached
        if bk is None:
            bk = _reduce_buckets(bucket_rows(lf, plan, spec).collect(engine="in-memory"), plan)
        if bk.height:
            bks[name] = bk
    if not bks:
        return pl.DataFrame(schema={HOST: pl.String, WINDOW_START: schema.TIME_DTYPE, WINDOW_END: schema.TIME_DTYPE})
    grid = _grid(list(bks.values()), spec)
    n_win = grid.index.height
    cols: dict[str, pl.Series] = {}
    windows = _all_windows(bks, {name: tables[name][1] for name in bks}, grid)
    for name in bks:  # (in table order: the first of two equal feature names is kept)
        devs, feats = windows[name]
        fams = feats.columns
        for i, dev in enumerate(devs):
            part = feats.slice(i * n_win, n_win)
            part.columns = [feature_name(fam, dev) for fam in fams]  # one rename, not one per column
            for s in part.get_columns():
                if s.name in cols:  # e.g. an imported table named like a built-in family
                    log.warning("measurement %r: feature %s already computed from another table; dropped", name, s.name)
                    continue
                cols[s.name] = s
    own = _own_cores(cols)
    if own is not None:
        cols[OWN_CORES] = own
    return grid.index.hstack([cols[c] for c in sorted(cols)])


#: host-wide: cores used by Unveil's own units (its cgroups, ingest.collectors.cgroup.is_own)
OWN_CORES = "cpu.own_cores"


def _own_cores(cols: Mapping[str, pl.Series]) -> pl.Series | None:
    """Sum of ``cgroup.cpu_cores`` over Unveil's own groups, each counted once (a group
    below another own group listed is inside it); None when the host has none."""
    devs = [split_feature(c)[1] for c in cols if split_feature(c)[0] == "cgroup.cpu_cores"]
    own = [d for d in devs if is_own(d)]
    outer = [d for d in own if not any(d.startswith(o + "/") for o in own if o != d)]
    if not outer:
        return None
    parts = [cols[feature_name("cgroup.cpu_cores", d)].fill_null(0.0) for d in outer]
    return pl.Series(OWN_CORES, sum(parts[1:], parts[0]), dtype=pl.Float64)


def feature_columns(features: pl.DataFrame) -> list[str]:
    """The feature columns of a wide frame the detectors judge: everything but the keys
    and Unveil's own CPU (``cpu.own_cores``, its own cgroups' columns): its own sweeps are
    never an anomaly of the host (the knowledge base still reads them, to set them apart)."""
    return [c for c in features.columns if c not in KEYS and c != OWN_CORES
            and not (c.startswith("cgroup.") and is_own(split_feature(c)[1]))]


def feature_name_of(family: str, device: str | None) -> str:  # re-export for callers
    return feature_name(family, device)
