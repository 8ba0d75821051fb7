"""Execution of the feature plans, in two stages. **Buckets**, one table at a time: Polars
evaluates the plan's row expressions, the bucket kernel reduces them to one row per (host,
device, bucket); interrupts per (device named by host_facts, on its own node or not), then
per device (the kernel again). **Windows**: every host has one grid of buckets from its
first to its last (over all tables); the window kernel aggregates each table's devices x
that grid over the buckets of each kept window (at its last bucket's row), then Polars
evaluates the plan's features; the tables share the grid's rows (a horizontal stack)."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from analytics.catalog import DEVICE_SEP, feature_name, split_feature
from analytics.features import kernels, plans
from analytics.features.plans import DEV, DUR, HOST, LOCAL, TIME, Plan, WindowSpec
from ingest import schema
from ingest.collectors.cgroup import is_own

log = logging.getLogger(__name__)

WINDOW_START = "window_start"
WINDOW_END = "window_end"
KEYS: tuple[str, ...] = (HOST, WINDOW_START, WINDOW_END)
_KEYS_SCHEMA = pl.Schema(
    {HOST: pl.String(), WINDOW_START: schema.TIME_DTYPE, WINDOW_END: schema.TIME_DTYPE})
_B, _T, _G = kernels.B, kernels.T, kernels.GROUP
_DEFAULT_SPEC = WindowSpec()


def compute_features(frames: Mapping[str, pl.LazyFrame], spec: WindowSpec = _DEFAULT_SPEC, *,
                     host_facts: pl.DataFrame | None = None) -> pl.DataFrame:
    """The wide feature frame: host, window_start, window_end (Datetime us UTC), one Float64
    column per feature named by :mod:`analytics.catalog` (``family@device``). Missing tables
    or columns give fewer columns, an empty input only the keys. The raw rows are read
    once, one table at a time (peak memory: the largest table's rows)."""
    got = _features(frames, spec, host_facts, None)
    if got is None:
        return pl.DataFrame(schema=_KEYS_SCHEMA)
    index, cols = got
    _add_own_cores(cols)
    return index.hstack([cols[c] for c in sorted(cols)])


def features_by_host(frames: Mapping[str, pl.LazyFrame], spec: WindowSpec = _DEFAULT_SPEC, *,
                     host_facts: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """:func:`compute_features` of each host of ``frames`` alone, by host: the rows, values
    and columns one call per host gives (a host gets the columns of the devices it has
    rows of, not its batch's), at the cost of one call. A host without windows is absent.
    Why: a call has a fixed cost of ~0.1 CPU-s (its per-table and per-feature passes), more
    than the features of one host's minute (the live scheduler's chunk) cost."""
    seen: dict[str, set[str]] = {}
    got = _features(frames, spec, host_facts, seen)
    if got is None:
        return {}
    index, cols = got
    out: dict[str, pl.DataFrame] = {}
    hosts, at = index[HOST], kernels.runs(index[HOST])[0]
    for lo, hi in zip(at.tolist(), [*at[1:].tolist(), index.height], strict=True):
        h = hosts[lo]
        own = {c: cols[c].slice(lo, hi - lo) for c in seen.get(h, ())}
        _add_own_cores(own)
        out[h] = index.slice(lo, hi - lo).hstack([own[c] for c in sorted(own)])
    return out


def _features(frames: Mapping[str, pl.LazyFrame], spec: WindowSpec, host_facts: pl.DataFrame | None,
              seen: dict[str, set[str]] | None) -> tuple[pl.DataFrame, dict[str, pl.Series]] | None:
    """The windows' keys and feature columns (None: no table has features); ``seen``, when
    given, gets each host's columns: those of the devices it has rows of."""
    # bucket frames (a host's rows in one run), their plans and host runs
    bks: dict[str, tuple[pl.DataFrame, Plan, tuple[np.ndarray, list[str]]]] = {}
    for name, lf in frames.items():
        plan = _plan(name, lf)
        bk = (None if plan is None else _irq_buckets(lf, plan, spec, host_facts)
              if name == "interrupts" else _buckets(lf, plan, spec))
        if bk is not None and bk.height and plan is not None:
            bks[name] = (bk, plan, kernels.runs(bk[HOST]))
    if not bks:
        return None
    grid = _grid([(bk, runs) for bk, _, runs in bks.values()], spec)
    n_win = grid.index.height
    cols: dict[str, pl.Series] = {}
    for name, (bk, plan, runs) in bks.items():  # (table order: of equal names the first is kept)
        devs, feats = _windows(bk, runs, plan, grid)
        added: set[str] = set()
        for i, dev in enumerate(devs):
            for s in feats.slice(i * n_win, n_win).get_columns():
                col = feature_name(s.name, dev)
                if col in cols:  # e.g. an imported table named like a built-in family
                    log.warning("measurement %r: feature %s already computed from another "
                                "table; dropped", name, col)
                    continue
                cols[col] = s.alias(col)
                added.add(col)
        if seen is not None:
            for h, dev in bk.select(HOST, DEV).unique().iter_rows():
                mine = seen.setdefault(h, set())
                mine.update(c for c in (feature_name(f, dev) for f in feats.columns) if c in added)
    return grid.index, cols


def _add_own_cores(cols: dict[str, pl.Series]) -> None:
    """Unveil's own cores (:data:`OWN_CORES`): its groups' cgroup.cpu_cores, once each (not
    those inside another), when ``cols`` has any."""
    own = [d for f, d in map(split_feature, cols) if f == "cgroup.cpu_cores" and is_own(d)]
    parts = [cols[feature_name("cgroup.cpu_cores", d)].fill_null(0.0) for d in own
             if not any(d.startswith(o + "/") for o in own if o != d)]
    if parts:
        cols[OWN_CORES] = pl.Series(OWN_CORES, sum(parts[1:], parts[0]), dtype=pl.Float64)


#: host-wide: cores used by Unveil's own units (its cgroups, ingest.collectors.cgroup.is_own)
OWN_CORES = "cpu.own_cores"


def feature_columns(features: pl.DataFrame) -> list[str]:
    """The feature columns of a wide frame the detectors judge: all but the keys, Unveil's
    own CPU (``cpu.own_cores``, its cgroups: its sweeps are no anomaly of the host; the
    knowledge base reads them), the PSI ``avg10`` averages (the exact ``psi.*_share`` say
    the same without their lag: an avg10 still decays for tens of seconds after a stall,
    an echo flagged as a new anomaly) and ``net.drop_share`` (on a quiet port a share of a
    few packets is noise; the knowledge base reads it, net.drop_rate is judged)."""
    return [c for c in features.columns
            if c not in KEYS and c != OWN_CORES and not c.endswith("_avg10")
            and split_feature(c)[0] != "net.drop_share"
            and not (c.startswith("cgroup.") and is_own(split_feature(c)[1]))]


def _plan(name: str, lf: pl.LazyFrame) -> Plan | None:
    """The table's plan (validated), None for tables without features."""
    if name in plans.SKIPPED:
        return None
    sch = lf.collect_schema()
    if TIME not in sch or HOST not in sch:
        raise ValueError(f"measurement {name!r}: frame lacks {TIME!r}/{HOST!r} columns "
                         f"(has {list(sch)})")
    if name == "interrupts" and not {"count", "device", "node"} <= set(sch):
        return None
    plan = plans.plan_of(name, tuple(sch.items()))
    missing = set(plans.tags(plan)) - set(sch) - {DEV}
    if missing:
        raise ValueError(f"measurement {name!r}: missing tag column(s) {sorted(missing)}")
    return plan if plan.features else None


def _rows(lf: pl.LazyFrame, keys: Sequence[str], exprs: Mapping[str, pl.Expr],
          spec: WindowSpec) -> pl.DataFrame:
    """The row-level columns of the bucket stage: ``keys`` (host first), ``_t`` (µs),
    the bucket ``_b`` (µs since the epoch, a multiple of the bucket) and ``exprs``."""
    b_us = round(spec.bucket * 1e6)
    t = pl.col(TIME).cast(pl.Int64)
    rows = lf.select(pl.col(HOST).cast(pl.String), *[pl.col(k) for k in keys[1:]], t.alias(_T),
                     (t // b_us * b_us).alias(_B), *[e.alias(n) for n, e in exprs.items()]
                     ).collect(engine="in-memory")
    return rows.filter(pl.col(_T).is_not_null()) if rows[_T].null_count() else rows


def _buckets(lf: pl.LazyFrame, plan: Plan, spec: WindowSpec) -> pl.DataFrame:
    """(host, _dev, _b, bucket aggregations) of a table: its rows grouped by host,
    device and bucket."""
    keys = [HOST, *plans.tags(plan)]
    rows = _rows(lf, keys, {n: e for n, (e, _) in plan.buckets.items()}, spec)
    dev = (plan.device if plan.device is not None else pl.lit("")).cast(pl.String).fill_null("")
    dev = dev.str.replace_all(DEVICE_SEP, ":", literal=True).alias(DEV)
    aggs = {n: a for n, (_, a) in plan.buckets.items()}
    named: dict[tuple[Any, ...], pl.Series] = {}

    def devices(series: pl.DataFrame) -> pl.Series:
        # the name reads the tags only (keys[1:]): hosts with the same series (the same
        # hardware) share it, and a Polars pass per host and table cost ~0.6 ms
        key = (series.height, *(tuple(series[c].to_list()) for c in keys[1:]))
        got = named.get(key)
        if got is None:
            got = named[key] = series.with_columns(dev)[DEV]
        return got

    return kernels.reduce_buckets(rows, keys, aggs, devices, DEV)


def _irq_buckets(lf: pl.LazyFrame, plan: Plan, spec: WindowSpec,
                 host_facts: pl.DataFrame | None) -> pl.DataFrame | None:
    """Interrupt buckets per device (see the module's docstring); None without facts."""
    facts = _irq_facts(host_facts)
    if not facts:
        log.info("no numa_node facts: irq.locality and irq.rate are not computed")
        return None
    assert all(a == "sum" for _, a in plan.buckets.values()), "summed per series, then device"

    def name(series: pl.DataFrame) -> pl.Series:
        """``<local><device>`` of each (host, IRQ action, node) series: the first device
        whose PCI address, else whose name, occurs in the action name (``mlx5_comp3@pci:
        0000:17:00.0`` -> ``mlx5_0``); local 1 when the node is its own. Null: none."""
        node = series["node"].str.strip_chars_start("node").cast(pl.Int64, strict=False)
        out: list[str | None] = []
        for host, action, nd in zip(series[HOST].to_list(), series["device"].to_list(),
                                    node.to_list(), strict=True):
            low, fs = (action or "").lower(), facts.get(host, [])
            by_pci = (f for f in fs if f[2] and (f[2] in low or (len(f[3]) >= 7 and f[3] in low)))
            f = next(itertools.chain(by_pci, (f for f in fs if f[4].search(low))), None)
            out.append(None if f is None else f"{int(nd is not None and f[1] == nd)}{f[0]}")
        return pl.Series(out, dtype=pl.String)

    keys = [HOST, "device", "node"]
    roots = sorted({r for e, _ in plan.buckets.values() for r in e.meta.root_names()} - {LOCAL})
    lf = lf.with_columns(pl.col("device").cast(pl.String),
                         pl.col("node").cast(pl.String).fill_null(""))
    rows = _rows(lf, keys, {r: pl.col(r) for r in roots}, spec)
    per_group = kernels.reduce_buckets(rows, keys, dict.fromkeys(roots, "sum"), name)
    # then per device: its groups are the series, their buckets the samples
    per_group = per_group.with_columns((pl.col(_G).str.head(1) == "1").alias(LOCAL),
                                       pl.col(_B).alias(_T)).select(
        HOST, _G, _T, _B, *[e.alias(n) for n, (e, _) in plan.buckets.items()])
    return kernels.reduce_buckets(per_group, [HOST, _G], dict.fromkeys(plan.buckets, "sum"),
                                  lambda s: s[_G].str.slice(1), DEV)


#: (device, NUMA node, PCI address, the address without its domain, a pattern of its name)
_Fact = tuple[str, int, str, str, re.Pattern[str]]


def _irq_facts(host_facts: pl.DataFrame | None) -> dict[str, list[_Fact]]:
    """Every host's devices with a numa_node fact (gpu facts name the index, ``3``: named
    like the gpu features, ``gpu3``)."""
    if host_facts is None or "key" not in host_facts.columns:
        return {}
    on = [HOST, "category", "device"]
    hf = host_facts.filter(pl.col("device").fill_null("") != "")
    nodes = hf.filter(pl.col("key") == "numa_node").select(
        *on, pl.col("value_num").cast(pl.Int64).alias("node")).filter(pl.col("node") >= 0)
    pci = hf.filter(pl.col("key").is_in(["pci_bus_id", "pci_address", "pci"])).select(
        *on, pl.col("value").str.to_lowercase().alias("pci"))
    out: dict[str, list[_Fact]] = {}
    for host, cat, dev, node, addr in nodes.join(pci, on=on, how="left").unique(on).iter_rows():
        dev = f"gpu{dev}" if cat == "gpu" and dev.isdecimal() else dev
        addr = addr or ""
        short = addr.split(":", 1)[1] if addr.count(":") == 2 else addr
        pattern = re.compile(rf"(^|[^a-z0-9]){re.escape(dev.lower())}(?![0-9])")
        out.setdefault(host, []).append((dev, node, addr, short, pattern))
    return out


@dataclass(frozen=True)
class _Grid:
    """Every host's buckets from its first to its last (over all tables) and the kept
    windows, each evaluated at the row of its last bucket."""

    kept: np.ndarray | slice  # the grid rows m-1 .. that end a kept window, less m-1
    index: pl.DataFrame  # host, window_start, window_end of the kept windows
    dur: np.ndarray  # covered seconds of each kept window
    m: int  # buckets per window
    n: int  # grid rows
    base: dict[str, int]  # the grid row of a host's bucket b is base[host] + b // b_us
    b_us: int


def _grid(bks: Sequence[tuple[pl.DataFrame, tuple[np.ndarray, list[str]]]],
          spec: WindowSpec) -> _Grid:
    """The grid of bucket frames given with their host runs (:func:`kernels.runs`)."""
    b_us, s_us = round(spec.bucket * 1e6), round(spec.stride_s * 1e6)
    m = round(spec.length_s / spec.bucket)
    lo, hi = dict[str, int](), dict[str, int]()  # each host's first and last bucket
    for bk, (at, hs) in bks:
        b = bk[_B].to_numpy()
        for h, x, y in zip(hs, np.minimum.reduceat(b, at).tolist(),
                           np.maximum.reduceat(b, at).tolist(), strict=True):
            lo[h], hi[h] = min(lo.get(h, x), x), max(hi.get(h, y), y)
    # Polars' sort order: nulls first, then by code point (= UTF-8 byte order)
    hosts = sorted(lo, key=lambda h: (h is not None, h or ""))
    firsts, lasts = (np.array([d[h] for h in hosts], dtype=np.int64) for d in (lo, hi))
    # a host with less than one window of data still gets its grid extended to one window
    nbs = np.maximum((lasts - firsts) // b_us + 1, m).astype(np.int64)
    off = np.concatenate([[0], np.cumsum(nbs)])
    first, last = np.repeat(firsts, nbs), np.repeat(lasts, nbs)
    b = first + (np.arange(off[-1], dtype=np.int64) - np.repeat(off[:-1], nbs)) * b_us
    ws = b - (m - 1) * b_us
    # full windows aligned to the stride inside the host's data; a host shorter than one
    # window keeps the one window starting at its first bucket (normalised by coverage)
    keep = (ws >= first) & (((b <= last) & (ws % s_us == 0)) | ((ws == first) & (last < b)))
    dur = (np.minimum(b, last)[keep] + b_us - ws[keep]) / 1e6
    host = pl.Series(np.repeat(np.array(hosts, dtype=object), nbs)[keep], dtype=pl.String)
    index = pl.DataFrame({HOST: host, WINDOW_START: ws[keep],
                          WINDOW_END: ws[keep] + round(spec.length_s * 1e6)}).cast(_KEYS_SCHEMA)
    # (the first m-1 rows of a grid never end a kept window; all others kept: a view)
    kept = slice(None) if keep[m - 1:].all() else np.flatnonzero(keep[m - 1:])
    base = dict(zip(hosts, (off[:-1] - firsts // b_us).tolist(), strict=True))
    return _Grid(kept, index, dur, m, int(off[-1]), base, b_us)


def _windows(bk: pl.DataFrame, host_runs: tuple[np.ndarray, list[str]], plan: Plan,
             grid: _Grid) -> tuple[list[str], pl.DataFrame]:
    """A table's devices (sorted) and features (``len(devices) * n_windows`` rows, device-major):
    the bucket rows placed on (device x grid) rows by arithmetic (none there: missing), rolled
    over each kept window, then the plan's features; non-finite values (0/0, x/0) are null
    (missing evidence), or 0 for ``zero_fill`` families (sparse tables: no rows, no events)."""
    at, values = kernels.runs(bk[DEV])
    devs = sorted(set(values))  # (Polars' string order: by code point, as numpy's)
    dev = np.repeat(np.searchsorted(devs, values), np.diff(np.r_[at, bk.height]))
    at, hosts = host_runs
    base = np.repeat([grid.base[x] for x in hosts], np.diff(np.r_[at, bk.height]))
    n = len(devs) * grid.n
    # the (device x grid) row of each bucket row; in place: the grid's rows in order
    at = dev * grid.n + base + bk[_B].to_numpy() // grid.b_us
    in_place = at.size == n and bool((at == np.arange(n)).all())

    def place(x: np.ndarray, fill: object) -> np.ndarray:
        """A bucket column on the (device x grid) rows, ``fill`` where no bucket is."""
        if in_place:
            return x
        out = np.full(n, fill, dtype=x.dtype)
        out[at] = x
        return out

    cols: list[pl.Series] = []
    for name, (_, agg) in plan.buckets.items():  # (every bucket column is read by a feature)
        v, valid = kernels.values(bk[name], agg)
        ok = valid if in_place else place(np.ones(v.size, bool) if valid is None else valid, False)
        v = place(v, kernels.identity(v.dtype.kind == "f", agg))
        cols.append(kernels.masked(name, *kernels.rolling(v, ok, agg, len(devs), grid.m,
                                                          grid.kept)))
    cols.append(pl.Series(DUR, np.tile(grid.dur, len(devs))))
    raw = pl.DataFrame(cols).select([e.cast(pl.Float64).alias(f) for f, e in plan.features.items()])
    out = []  # the finite check in numpy: a when/then per feature costs twice the feature
    for s in raw.get_columns():
        x, zero = s.to_numpy(), s.name in plan.zero_fill  # (a null reads NaN)
        ok = np.isfinite(x)
        out.append(s if ok.all() else pl.Series(s.name, np.where(ok, x, 0.0 if zero else np.nan),
                                                nan_to_null=not zero))
    return devs, pl.DataFrame(out)


def concat_features(parts: Sequence[pl.DataFrame], columns: Sequence[str] | None = None) -> pl.DataFrame:
    """Wide feature frames of disjoint hosts (each computed alone, or read back from the lake)
    as :func:`compute_features` gives them for all at once: rows by host then window, columns
    sorted; a column another host lacks is null there (0: zero-fill families, own cores).
    ``columns``: the feature columns of the whole fleet when ``parts`` are some of its hosts
    (the result is then those hosts' rows of the fleet's frame)."""
    parts = [p for p in parts if p.width]
    if not parts:
        return pl.DataFrame(schema=_KEYS_SCHEMA)
    df = parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal_relaxed")
    if columns is not None:
        df = df.with_columns(pl.lit(None, pl.Float64).alias(c) for c in columns if c not in df.columns)
    rest = sorted(c for c in df.columns if c not in KEYS)
    zero = [c for c in rest if c == OWN_CORES or split_feature(c)[0] in plans.ZERO_FILL]
    if zero:
        df = df.with_columns(pl.col(zero).fill_null(0.0))
    df = df.select(*KEYS, *rest)  # (a concat without rechunk and a select share the buffers)
    h, ws = df[HOST], df[WINDOW_START]
    ordered = bool(((h.shift(-1) > h) | ((h.shift(-1) == h) & (ws.shift(-1) >= ws))).head(-1).all())
    return df if ordered else df.sort(HOST, WINDOW_START, maintain_order=True)  # (copies all)
