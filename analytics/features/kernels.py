"""The feature engine's two numpy kernels (docs/analytics.md says why they exist):
:func:`reduce_buckets` means one Polars ``group_by(group, bucket).agg(...)``, :func:`rolling`
Polars' ``rolling_*(m, min_samples=1)`` at chosen rows. They know nothing of features."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

Agg = Literal["sum", "count", "mean", "max", "min"]
T = "_t"  # sample time, µs
B = "_b"  # bucket start, µs
GROUP = "_g"  # the group a row's series belongs to (see reduce_buckets)

#: max/min skip NaN as Polars' group_by does (fmax: NaN only where all are NaN); else add
_OPS: dict[str, np.ufunc] = {"max": np.fmax, "min": np.fmin}


def identity(is_float: bool, agg: Agg) -> float:
    """What stands in for a missing value: 0 for sums and means, the identity of max/min."""
    i64 = np.iinfo(np.int64)
    lo, hi = (-np.inf, np.inf) if is_float else (int(i64.min), int(i64.max))
    return {"max": lo, "min": hi}.get(agg, 0)


def values(s: pl.Series, agg: Agg) -> tuple[np.ndarray, np.ndarray | None]:
    """A column as int64/float64 values, nulls replaced by :func:`identity`; its validity."""
    if s.dtype not in (pl.Int64, pl.Float64):
        s = s.cast(pl.Float64 if s.dtype.is_float() else pl.Int64)
    if not s.null_count():
        return s.to_numpy(), None
    # Arrow's kernels: Polars' fill_null/is_not_null on a small column cost ~6x in planning
    a = s.to_arrow()
    v = pc.fill_null(a, pa.scalar(identity(s.dtype == pl.Float64, agg), a.type)).to_numpy()
    return v, pc.is_valid(a).to_numpy(zero_copy_only=False)


def masked(name: str, v: np.ndarray, valid: np.ndarray | None) -> pl.Series:
    """A series of ``v``, null where ``valid`` is False (a validity mask: a NaN stays NaN)."""
    return pl.Series(name, v if valid is None or valid.all() else pa.array(v, mask=~valid))


def runs(s: pl.Series) -> tuple[np.ndarray, list[str]]:
    """The first row of each run of equal values of ``s`` and the runs' values, by
    64-bit hashes (a false merge of two runs needs a hash collision of neighbours)."""
    if s.len() and not s.null_count() and s[0] == s[-1] and (s == s[0]).all():
        return np.zeros(1, dtype=np.int64), [s[0]]  # one run (one pass, not three)
    h = s.hash().to_numpy()
    at = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    return at, s[at].to_list()  # (a Series indexed by numpy: ~3x cheaper than gather)


def reduce_buckets(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
                   group_of: Callable[[pl.DataFrame], pl.Series], out: str = GROUP
                   ) -> pl.DataFrame:
    """``rows`` (``keys``, host first; ``_t``, ``_b``, the ``aggs`` columns; no null times) ->
    one row per (host, group ``out``, bucket ``_b``): ``group_of`` names the series (a frame of
    distinct ``keys`` -> a name per row; null: dropped); each column aggregated over a group's
    rows of a bucket (sums keep integers, means are floats, counts int64; null where there is
    no value; max/min skip NaN). Each host's rows are reduced as a (samples x series) grid;
    rows in another order or times are first sorted and padded into one (null rows)."""
    if not rows.height:
        return rows.select(keys[0], pl.lit(None, pl.String).alias(out), B, *aggs)
    at, hosts = runs(rows[keys[0]])
    if len(set(hosts)) != len(hosts):  # hosts interleaved
        rows = rows.sort(keys[0], maintain_order=True)
        at, hosts = runs(rows[keys[0]])
    ends = np.r_[at[1:], rows.height]
    parts = [_reduce_grid(rows.slice(lo, hi - lo), keys, aggs, group_of, out)
             for lo, hi in zip(at.tolist(), ends.tolist(), strict=True)]
    return pl.concat(parts, rechunk=True) if len(parts) != 1 else parts[0]


def _as_grid(rows: pl.DataFrame, keys: Sequence[str]
             ) -> tuple[pl.DataFrame, tuple[int, int, bool], np.ndarray | None]:
    """One host's rows as a grid: (rows, (samples, series, time_major), which rows are
    real: None when all are). The rows are one when time-major (the series' samples of
    each time in turn) or series-major (each series' samples in turn), the bucket constant
    across the series and each tag (by 64-bit hashes) across the samples; else they are
    sorted and padded with null rows into a time-major grid."""
    t, b = rows[T].to_numpy(), rows[B].to_numpy()
    back = np.flatnonzero(b[1:] < b[:-1])
    tm = not back.size
    inner = (int(np.argmax(t != t[0])) or t.size) if tm else int(back[0]) + 1

    def same(a: np.ndarray, across_rows: bool) -> bool:
        g = a.reshape(-1, inner)  # (samples, series) time-major, else (series, samples)
        return bool((g == (g[:1] if across_rows else g[:, :1])).all())

    if t.size % inner == 0 and same(b, not tm) and all(
            same(rows[c].hash().to_numpy(), tm) for c in keys[1:]):
        outer = t.size // inner
        return rows, ((outer, inner, True) if tm else (inner, outer, False)), None
    n = rows.height
    h = (rows.select(pl.struct(keys[1:]).hash()).to_series().to_numpy() if len(keys) > 1
         else np.zeros(n, np.uint64))
    _, first, sid = np.unique(h, return_index=True, return_inverse=True)  # series of each row
    order = np.lexsort((t, sid))  # by series, then time
    ts, ss = t[order], sid[order]
    # a slot is (time, how many earlier rows of the series had that time): a duplicate
    # stays a sample
    lead = np.flatnonzero(np.r_[True, (ss[1:] != ss[:-1]) | (ts[1:] != ts[:-1])])
    occ = np.arange(n) - np.repeat(lead, np.diff(np.r_[lead, n]))
    times, ti = np.unique(ts, return_inverse=True)
    width = np.zeros(times.size, dtype=np.int64)  # slots of each time
    np.maximum.at(width, ti, occ + 1)
    slot = np.r_[0, np.cumsum(width)][ti] + occ
    n_t, k = int(width.sum()), first.size
    src = np.full(n_t * k, -1, dtype=np.int64)
    src[slot * k + ss] = order  # time-major
    real = src >= 0
    bs = np.empty(n_t, dtype=np.int64)  # each sample's bucket
    bs[slot] = b[order]
    data = rows.drop([*keys, T, B]).gather(pl.Series(src).set(pl.Series(~real), None))
    grid = pl.DataFrame([*rows.select(keys).gather(np.tile(first, n_t)).get_columns(),
                         pl.Series(T, np.repeat(np.repeat(times, width), k)),
                         pl.Series(B, np.repeat(bs, k)), *data.get_columns()])
    return grid, (n_t, k, True), real


def _reduce_grid(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
                 group_of: Callable[[pl.DataFrame], pl.Series], out: str) -> pl.DataFrame:
    """One host's rows as a (samples x series) grid reduced over each bucket's samples, then
    over the series of each group (groups in order of first appearance)."""
    rows, (n_t, k, time_major), real = _as_grid(rows, keys)
    first = np.arange(k) if time_major else np.arange(k) * n_t  # each series' first row
    idx: dict[str, int] = {}
    code = np.array([-1 if g is None else idx.setdefault(g, len(idx))
                     for g in group_of(pl.DataFrame([rows[c][first] for c in keys])).to_list()],
                    dtype=np.int64)  # each series' group (-1: dropped)
    kept = np.flatnonzero(code >= 0)
    perm = kept[np.argsort(code[kept], kind="stable")]  # series sorted by group
    g_at = np.flatnonzero(np.r_[perm.size > 0, np.diff(code[perm]) != 0])  # (none: no group)
    alone = bool((code == np.arange(k)).all())  # each series its own group, in order
    bb = rows[B].to_numpy()[::k if time_major else 1][:n_t]  # each sample's bucket
    r_at = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1]])  # bucket starts among samples
    n_r = r_at.size
    sizes = np.diff(np.r_[r_at, n_t])
    run = n_t // n_r if (sizes == n_t // n_r).all() else 0  # samples a bucket, if equal

    def reduce(v: np.ndarray, op: np.ufunc) -> np.ndarray:
        """(groups, buckets): over each bucket's samples in the rows' own layout (a transposed
        copy costs), then each group's series; equal buckets by a reshape: einsum for sums,
        max/min one pass per position (op.reduce: ~5x slower), else ``reduceat``."""
        g = v.reshape((n_t, k) if time_major else (k, n_t))
        g3 = g.reshape((n_r, run, k) if time_major else (k, n_r, run)) if run > 1 else g
        if not run:
            r = op.reduceat(g, r_at, axis=0 if time_major else 1)
        elif run == 1 or op is np.add:
            r = g if run == 1 else np.einsum("rlk->rk" if time_major else "krl->kr", g3)
        else:
            lanes = np.moveaxis(g3, 1 if time_major else 2, 0)  # (position in the bucket, ...)
            r = lanes[0].copy()
            for x in lanes[1:]:
                op(r, x, out=r)
        r = r.T if time_major else r  # (series, buckets)
        return r if alone else op.reduceat(r[perm], g_at, axis=0)

    full = np.outer(np.diff(np.r_[g_at, perm.size]), sizes)  # samples a (group, bucket)
    has = None if real is None else reduce(real.astype(np.int64), np.add) > 0
    cols = []
    for name, agg in aggs.items():
        v, valid = values(rows[name], agg)
        cnt = full if valid is None else reduce(valid.astype(np.int64), np.add)
        r = cnt if agg == "count" else reduce(v, _OPS.get(agg, np.add))
        if agg == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                r = r / cnt
        ok = has if agg in ("sum", "count") else (cnt > 0) if has is None else (cnt > 0) & has
        cols.append(masked(name, r.ravel(), None if ok is None else ok.ravel()))
    groups = pl.Series(out, list(idx), dtype=pl.String)
    return pl.DataFrame([rows[keys[0]].new_from_index(0, len(idx) * n_r),
                         groups[np.repeat(np.arange(len(idx)), n_r)],
                         pl.Series(B, np.tile(bb[r_at], len(idx))), *cols])


def rolling(v: np.ndarray, valid: np.ndarray | None, agg: Agg, n_dev: int, m: int,
            kept: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray | None]:
    """One bucket column (``n_dev`` devices' rows of equal length, device-major; nulls
    replaced, ``valid`` their validity) aggregated over the trailing ``m`` rows at the rows
    ``m-1 ..`` of each device ``kept``: sum, mean of the valid values, max, min; invalid
    where all ``m`` are; NaN propagates (sums add left to right: Polars' running sum may
    differ in the last bits). Returns values and validity, device-major."""
    w = v.size // n_dev - m + 1  # windows ending at rows m-1 ..

    def trailing(x: np.ndarray, op: np.ufunc) -> np.ndarray:
        d = x.reshape(n_dev, -1)
        acc = d[:, :w].copy()
        for j in range(1, m):
            op(acc, d[:, j:j + w], out=acc)
        return acc

    op = np.maximum if agg == "max" else np.minimum if agg == "min" else np.add
    acc = trailing(v.astype(np.float64, copy=False) if agg == "mean" else v, op)
    if op is np.add and acc.dtype.kind == "f":
        acc += 0.0  # Polars' sums start at +0.0: a window of -0.0 sums to +0.0
    cnt = None if valid is None or valid.all() else trailing(valid.astype(np.int32), np.add)
    if agg == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, cnt if cnt is not None else m, out=acc)
    acc = acc[:, kept]
    has = None if cnt is None else (cnt[:, kept] > 0).ravel()
    return acc.ravel(), None if has is None or has.all() else has
