"""The feature plans: what each measurement's features mean, as Polars expressions.

``_SPECS`` states each measurement's features over the window's aggregates of its columns
(as the schema calls them: counter deltas summed, gauges averaged with NaN missing; or
derived bucket columns) and the covered duration ``_dur`` (s). The engine executes them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import polars as pl

from analytics.catalog import DEVICE_SEP
from analytics.features.kernels import Agg
from ingest import schema

HOST, TIME = schema.HOST, schema.TIME
DUR = "_dur"  # covered window duration, seconds
DEV = "_dev"  # device of a row ("" for host-wide tables)
LOCAL = "_local"  # an interrupt series counted on its device's own NUMA node

# NVML clock-event (throttle) reason bits: SW power cap | HW power brake, SW | HW thermal
THROTTLE_BITS: dict[str, int] = {"power": 0x4 | 0x80, "thermal": 0x20 | 0x40, "hw_slowdown": 0x8}


@dataclass(frozen=True)
class WindowSpec:
    """Sliding windows: ``length_s`` long every ``stride_s``, built from ``bucket_s``
    buckets (default: the stride). Length and stride must be multiples of the bucket."""

    length_s: float = 3.0
    stride_s: float = 1.0
    bucket_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("length_s", "stride_s", "bucket_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v > 0 or v is None and name == "bucket_s"):
                raise ValueError(f"WindowSpec.{name} must be a positive time (s), not {v!r}")
        for name in ("length_s", "stride_s"):
            if round(getattr(self, name) * 1e6) % round(self.bucket * 1e6):
                raise ValueError(f"WindowSpec.{name}={getattr(self, name)} is not a multiple "
                                 f"of the bucket ({self.bucket} s)")

    @property
    def bucket(self) -> float:
        return float(self.bucket_s if self.bucket_s is not None else self.stride_s)


@dataclass(frozen=True, eq=False)  # (hashed by identity: plans are cached, see plan_of)
class Plan:
    """How one measurement becomes features: ``device`` names a row's device (None:
    host-wide); ``buckets``: name -> (row expression, its aggregation per bucket; counts
    of non-null are summed over a window's buckets); ``features``: family -> expression
    over the window columns and ``_dur``; ``zero_fill``: families whose missing value
    means 0 (rates of sparse tables)."""

    device: pl.Expr | None
    buckets: dict[str, tuple[pl.Expr, Agg]]
    features: dict[str, pl.Expr]
    zero_fill: tuple[str, ...] = ()


_c = pl.col
#: a column no table has: a feature that reads it is left out of the plan
_ABSENT = _c("\x00absent")


def _total(cols: set[str], *names: str) -> pl.Expr:
    """The sum of those of ``names`` the table has (``_ABSENT`` when it has none)."""
    have = [_c(n) for n in names if n in cols]
    return pl.sum_horizontal(have) if have else _ABSENT


def _prefixed(tag: str, prefix: str) -> pl.Expr:
    """A device name from a tag: bare numbers get a prefix (``3`` -> ``gpu3``)."""
    v = _c(tag).cast(pl.String).fill_null("")
    return pl.when(v.str.contains(r"^\d+$")).then(pl.lit(prefix) + v).otherwise(v)


@dataclass(frozen=True)
class _Spec:
    """A ``_SPECS`` entry: a :class:`Plan`'s fields, with the features (or a function of the
    table's columns giving them) and only the derived bucket columns."""

    device: pl.Expr | None
    features: Mapping[str, pl.Expr] | Callable[[set[str]], Mapping[str, pl.Expr]]
    derived: Mapping[str, tuple[pl.Expr, Agg]] = field(default_factory=dict)
    zero_fill: tuple[str, ...] = ()


def _ratio(num: str, den: str) -> pl.Expr:
    return _c(num) / _c(den)


def _share(part: str, other: str) -> pl.Expr:
    """``part`` of ``other + part``."""
    return _c(part) / (_c(other) + _c(part))


def _per_s(scale: float, cols: Mapping[str, str]) -> dict[str, pl.Expr]:
    """family -> counter / (window * scale): rates (1), shares of time in ms, µs, ns (1e3...)."""
    return {fam: _c(c) / (_c(DUR) * scale) for fam, c in cols.items()}


def _busy(col: str) -> pl.Expr:
    """``col`` while the GPU is >= 10 % busy (or unknown): idle GPUs lower clocks and links."""
    return pl.when(_c("util_gpu") < 10).then(None).otherwise(_c(col)).cast(pl.Float64)


def _cpu(cols: set[str]) -> dict[str, pl.Expr]:
    total = _total(cols, "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    user = _total(cols, "user", "nice") if "user" in cols else _ABSENT
    f = {f"cpu.{t}_share": _c(t) / total for t in ("system", "iowait", "irq", "softirq", "steal")}
    return {**f, "cpu.user_share": user / total, "cpu.freq_mhz": _c("freq_mhz"),
            "cpu.busy_share": 1.0 - _total(cols, "idle", "iowait") / total}


def _net(cols: set[str]) -> dict[str, pl.Expr]:
    # net.drop_share: the share of offered packets (rx_packets counts the delivered) lost: a ring
    # overflow loses a share of traffic; benign drops (unknown protocols, bursts) are a rate
    lost = _total(cols, "rx_dropped", "rx_fifo")
    return {**_per_s(1, {"net.rx_bytes_rate": "rx_bytes", "net.tx_bytes_rate": "tx_bytes"}),
            "net.drop_rate": _total(cols, "rx_dropped", "tx_dropped", "rx_fifo") / _c(DUR),
            "net.drop_share": lost / (_c("rx_packets") + lost),
            "net.error_rate": _total(cols, "rx_errors", "tx_errors") / _c(DUR)}


_PSI = [(r, k) for r in ("cpu", "memory", "io") for k in ("some", "full")
        if (r, k) != ("cpu", "full")]
_RESOURCE = _c("resource").cast(pl.String)
_CER = _c("clock_event_reasons")
_LINK = {"gen": ("pcie_link_gen", "pcie_link_gen_max"),
         "width": ("pcie_link_width", "pcie_link_width_max")}

_SPECS: dict[str, _Spec] = {
    "cpu": _Spec(_prefixed("node", "node"), _cpu),
    "system": _Spec(None, {
        **_per_s(1, {"cpu.ctxt_rate": "ctxt", "cpu.fork_rate": "forks"}),
        **{f"cpu.{c}": _c(c) for c in ("procs_running", "procs_blocked", "load1")}}),
    # per IRQ series (host, IRQ action, node): DEV is the device host_facts maps the action
    # to and LOCAL whether the node is that device's own (the engine attaches both per
    # series); series of one device are summed
    "interrupts": _Spec(
        _c(DEV), {**_per_s(1, {"irq.rate": "count"}), "irq.locality": _ratio("local", "count")},
        {"local": (pl.when(_c(LOCAL)).then(_c("count")).otherwise(0), "sum")},
        zero_fill=("irq.rate",)),
    "softirqs": _Spec(_c("softirq").cast(pl.String), _per_s(1, {"softirq.rate": "count"}),
                      zero_fill=("softirq.rate",)),
    "memory": _Spec(None, {
        "mem.hugepage_coverage": _ratio("anon_huge_pages", "anon_pages"),
        "mem.available_share": _ratio("mem_available", "mem_total"),
        "mem.dirty_share": (_c("dirty") + _c("writeback")) / _c("mem_total"),
        "mem.swap_used_share": 1.0 - _ratio("swap_free", "swap_total"),
        "mem.hugetlb_used_share": 1.0 - _ratio("hugepages_free", "hugepages_total"),
        "mem.page_tables_share": _ratio("page_tables", "mem_total")}),
    "vmstat": _Spec(None, {
        # mem.thp_fault_alloc_rate stops the moment THP is set to never (new faults get
        # 4 KiB pages), while the coverage only decays as memory turns over
        **_per_s(1, {
            "mem.thp_fault_alloc_rate": "thp_fault_alloc",
            "mem.thp_fallback_rate": "thp_fault_fallback", "mem.pgfault_rate": "pgfault",
            "mem.pgmajfault_rate": "pgmajfault", "mem.direct_scan_rate": "pgscan_direct",
            "mem.kswapd_scan_rate": "pgscan_kswapd", "mem.compact_stall_rate": "compact_stall",
            "mem.allocstall_rate": "allocstall_normal",
            "numa.migration_rate": "numa_pages_migrated"}),
        "mem.thp_fallback_share": _share("thp_fault_fallback", "thp_fault_alloc"),
        "mem.swap_rate": (_c("pswpin") + _c("pswpout")) / _c(DUR),
        "numa.remote_share": _share("numa_miss", "numa_hit"),
        "numa.other_node_share": _share("numa_other", "numa_local"),
        "numa.hint_fault_remote_share":
            1.0 - _ratio("numa_hint_faults_local", "numa_hint_faults")}),
    "numa": _Spec(_prefixed("node", "node"), {
        "numa.remote_share": _share("numa_miss", "numa_hit"),
        "numa.other_node_share": _share("other_node", "local_node")}),
    # host-wide families per resource (psi.io_some_share ...): pivoted by hand, no device
    "pressure": _Spec(None, {
        **{f"psi.{r}_{k}_share": _c(f"{r}_{k}") / (_c(DUR) * 1e6) for r, k in _PSI},
        **{f"psi.{r}_some_avg10": _c(f"{r}_avg") / 100.0 for r in ("cpu", "memory", "io")}}, {
        **{f"{r}_{k}": (pl.when(_RESOURCE == r).then(_c(f"{k}_total")), "sum") for r, k in _PSI},
        **{f"{r}_avg": (pl.when(_RESOURCE == r).then(_c("some_avg10").cast(pl.Float64)), "mean")
           for r in ("cpu", "memory", "io")}}),
    "net": _Spec(_c("interface").cast(pl.String), _net),
    "tcp": _Spec(None, {
        **_per_s(1, {"net.retrans_rate": "retrans_segs", "net.in_err_rate": "in_errs",
                     "net.active_open_rate": "active_opens"}),
        "net.retrans_share": _ratio("retrans_segs", "out_segs")}),
    "disk": _Spec(_c("device").cast(pl.String), {
        "disk.latency_ms": (_c("read_time") + _c("write_time")) / (_c("reads") + _c("writes")),
        **_per_s(1e3, {"disk.util": "io_time", "disk.queue_depth": "weighted_io_time"}),
        **_per_s(1, {"disk.read_iops": "reads", "disk.write_iops": "writes"}),
        "disk.read_bytes_rate": _c("read_sectors") * 512.0 / _c(DUR),
        "disk.write_bytes_rate": _c("write_sectors") * 512.0 / _c(DUR)}),
    "cgroup": _Spec(_c("cgroup").cast(pl.String), {
        "cgroup.throttled_share": _ratio("nr_throttled", "nr_periods"),
        **_per_s(1e6, {"cgroup.throttled_time_share": "throttled_time",
                       "cgroup.cpu_cores": "cpu_usage",
                       "cgroup.cpu_pressure_share": "cpu_pressure_some",
                       "cgroup.memory_pressure_share": "memory_pressure_some"}),
        "cgroup.quota_use_share": _c("cpu_usage") / (_c(DUR) * 1e6) / _c("cpu_quota_cores"),
        "cgroup.mem_use_share": _ratio("memory_current", "memory_max")}),
    "perf": _Spec(_prefixed("socket", "socket"), {
        "perf.ipc": _ratio("instructions", "cycles"),
        "perf.llc_miss_share": _ratio("llc_misses", "llc_loads"),
        **_per_s(1, {"perf.mem_bandwidth": "mem_bandwidth"})}),
    "gpu": _Spec(_prefixed("gpu", "gpu"), {
        "gpu.util": _c("util_gpu") / 100.0, "gpu.mem_util": _c("util_mem") / 100.0,
        "gpu.mem_used_share": _ratio("mem_used", "mem_total"),
        "gpu.power_ratio": _ratio("power_w", "power_limit_w"),
        "gpu.power_limit_ratio": _ratio("power_limit_w", "power_limit_default_w"),
        "gpu.sm_clock_ratio": _ratio("sm_clock_busy", "sm_clock_max_mhz"),
        "gpu.mem_clock_ratio": _ratio("mem_clock_mhz", "mem_clock_max_mhz"),
        "gpu.temperature_max": _c("temp_max"),
        "pcie.tx_rate": _c("pcie_tx"), "pcie.rx_rate": _c("pcie_rx"),
        **{f"gpu.throttle_{name}_share": _ratio(f"cer_{name}", "cer__n") for name in THROTTLE_BITS},
        **_per_s(1e9, {"gpu.power_violation_share": "power_violation",
                       "gpu.thermal_violation_share": "thermal_violation"}),
        **_per_s(1, {"gpu.ecc_corrected_rate": "ecc_corrected",
                     "gpu.ecc_uncorrected_rate": "ecc_uncorrected", "gpu.xid_rate": "xid_events",
                     "nvlink.tx_rate": "nvlink_tx", "nvlink.rx_rate": "nvlink_rx"}),
        **{f"pcie.link_{k}_ratio": _ratio(f"{cur}__min", f"{mx}__max")
           for k, (cur, mx) in _LINK.items()}}, {
        "temp_max": (_c("temperature_c").cast(pl.Float64), "max"), "cer__n": (_CER, "count"),
        "sm_clock_busy": (_busy("sm_clock_mhz"), "mean"),
        **{f"cer_{name}": (((_CER & bits) != 0).cast(pl.Int64), "sum")
           for name, bits in THROTTLE_BITS.items()},
        **{f"{cur}__min": (_busy(cur), "min") for cur, _ in _LINK.values()},
        **{f"{mx}__max": (_c(mx).cast(pl.Float64), "max") for _, mx in _LINK.values()}}),
}

#: families whose missing value means 0 (the plans' ``zero_fill``)
ZERO_FILL: frozenset[str] = frozenset(f for s in _SPECS.values() for f in s.zero_fill)

#: tables that never become features (the agent's self-health, static facts, ground truth,
#: the pipeline's own outputs, `unveil drill`'s results)
SKIPPED: frozenset[str] = frozenset({"agent", "host_facts", "labels", "workload", "features",
                                     "scores", "findings", "incidents", "remediations",
                                     "drill_scorecard"})

_NUMERIC = (pl.Float32, pl.Float64, pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16,
            pl.UInt32, pl.UInt64, pl.Boolean)


def _roots(e: pl.Expr) -> set[str]:
    return set(e.meta.root_names())


@functools.lru_cache(maxsize=256)
def plan_of(name: str, columns: tuple[tuple[str, pl.DataType], ...]) -> Plan:
    """A measurement's plan for its (column, dtype) pairs (cached; plans are immutable):
    the features of its ``_SPECS`` entry the columns allow and the buckets they read. An
    imported or unknown measurement gets every numeric column's window mean (feature
    ``<measurement>.<column>``), its string columns but host as tags (the device)."""
    sch = pl.Schema(columns)
    if name not in _SPECS:
        tags = [c for c, dt in sch.items() if c not in (TIME, HOST) and dt == pl.String]
        num = [c for c, dt in sch.items() if c not in (TIME, HOST) and isinstance(dt, _NUMERIC)]
        dev = pl.concat_str([_c(t).fill_null("") for t in tags], separator="/") if tags else None
        return Plan(dev, {f"{c}__m": (_c(c).cast(pl.Float64), "mean") for c in num},
                    {f"{name}.{c}".replace(DEVICE_SEP, "_"): _c(f"{c}__m") for c in num})
    spec, cols = _SPECS[name], set(sch)
    derived = {n: d for n, d in spec.derived.items() if _roots(d[0]) <= cols | {LOCAL}}
    feats = spec.features(cols) if callable(spec.features) else spec.features
    feats = {f: e for f, e in feats.items() if _roots(e) <= cols | derived.keys() | {DUR}}
    counters = schema.MEASUREMENTS[name].counters
    buckets: dict[str, tuple[pl.Expr, Agg]] = {
        r: derived.get(r) or ((_c(r), "sum") if r in counters
                              else (_c(r).cast(pl.Float64).fill_nan(None), "mean"))
        for r in sorted(set().union(*map(_roots, feats.values())) - {DUR})}
    return Plan(spec.device, buckets, feats, spec.zero_fill)


def tags(plan: Plan) -> list[str]:
    """The columns a plan's device is named from."""
    return list(dict.fromkeys(plan.device.meta.root_names())) if plan.device is not None else []
