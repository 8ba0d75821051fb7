"""The two numpy kernels of the feature engine, behind narrow typed interfaces.

* :func:`reduce_buckets`: rows -> one row per (group, bucket) with each column's
  bucket aggregation; the meaning of one Polars ``group_by(group, bucket).agg(...)``.
* :func:`rolling`: trailing aggregations over ``m`` buckets at chosen rows; the
  meaning of Polars' ``rolling_*(m, min_samples=1)``.

The tests hold those Polars references. Both kernels take and return plain arrays and
frames; they know nothing of plans or features (docs/analytics.md says why they exist).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa

Agg = Literal["sum", "count", "mean", "max", "min"]
T = "_t"  # sample time, µs
B = "_b"  # bucket start, µs
GROUP = "_g"  # the group a row's series belongs to (see reduce_buckets)

#: max/min skip NaN as Polars' group_by does (fmax: NaN only where all are NaN)
_OPS: dict[str, np.ufunc] = {"sum": np.add, "count": np.add, "mean": np.add, "max": np.fmax, "min": np.fmin}


def values(s: pl.Series) -> tuple[np.ndarray, np.ndarray | None]:
    """A column as int64/float64 values (read-only; whatever lies under a null) and its
    validity (None: no nulls), read from the Arrow buffers without a copy."""
    if s.dtype not in (pl.Int64, pl.Float64):
        s = s.cast(pl.Float64 if s.dtype.is_float() else pl.Int64)
    if not s.null_count():
        return s.to_numpy(), None
    arr = s.rechunk().to_arrow()
    dt = np.dtype(np.float64 if s.dtype == pl.Float64 else np.int64)
    v = np.frombuffer(arr.buffers()[1], dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    return v, np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")[arr.offset:].view(bool)


def filled(v: np.ndarray, valid: np.ndarray | None, agg: Agg) -> np.ndarray:
    """``v`` with :func:`identity` where not ``valid``."""
    return v if valid is None else np.where(valid, v, identity(v.dtype.kind == "f", agg))


def identity(is_float: bool, agg: Agg) -> float:
    """What stands in for a missing value: 0 for sums and means, the identity of max/min."""
    if agg not in ("max", "min"):
        return 0
    big = np.iinfo(np.int64)
    if agg == "max":
        return -np.inf if is_float else int(big.min)
    return np.inf if is_float else int(big.max)


def reduce_buckets(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
                   group_of: Callable[[pl.DataFrame], pl.Series], out: str = GROUP) -> pl.DataFrame:
    """``rows`` (``keys``, ``_t``, ``_b`` and the ``aggs`` columns; no null times)
    reduced to one row per (group, bucket): the series (distinct ``keys`` values) are
    named by ``group_of`` (a frame of distinct key values -> one group name per row,
    null: dropped), then every column aggregated over the rows of each group and bucket.
    Returns ``keys[0]`` (the host: each group is per host), the group (named ``out``),
    ``_b`` and the aggregations (sums keep their integer dtype, means are floats, counts
    int64; null where a group's bucket has no value; NaN skipped by max/min).

    Each host's rows are reduced as a (samples x series) grid by reshapes; rows in any
    other order, or series sampled at different times, are first sorted and padded into
    one (a missing sample is a null row)."""
    if not rows.height:
        return pl.DataFrame([rows[keys[0]], pl.Series(out, [], dtype=pl.String), rows[B], *[rows[n] for n in aggs]])
    at, hosts = runs(rows[keys[0]])
    if len(set(hosts)) != len(hosts):  # hosts interleaved
        rows = rows.sort(keys[0], maintain_order=True)
        at, hosts = runs(rows[keys[0]])
    ends = np.r_[at[1:], rows.height]
    parts = [_reduce_grid(*_as_grid(rows.slice(lo, hi - lo), keys), keys, aggs, group_of, out)
             for lo, hi in zip(at.tolist(), ends.tolist(), strict=True)]
    return pl.concat(parts, rechunk=True) if len(parts) != 1 else parts[0]


def runs(s: pl.Series) -> tuple[np.ndarray, list[str]]:
    """The first row of each run of equal values of ``s`` and the runs' values, by
    64-bit hashes (a false merge of two runs needs a hash collision of neighbours)."""
    h = s.hash().to_numpy()
    at = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    return at, s.gather(at).to_list()


def _grid_shape(t: np.ndarray, b: np.ndarray) -> tuple[int, int, bool] | None:
    """(samples, series, time_major) of one host's rows, or None: time-major (one sample
    of k series per run of equal times, buckets never going back) or series-major
    (every series with the first one's buckets)."""
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
    if n % t_len == 0 and (b.reshape(n // t_len, t_len) == b[:t_len]).all():
        return t_len, n // t_len, False
    return None


def _keys_follow(rows: pl.DataFrame, keys: Sequence[str], n_t: int, k: int, time_major: bool) -> bool:
    """Whether every row carries its series' key values (time-major: the row k back;
    series-major: the previous row, except where a series starts), by 64-bit hashes."""
    for key in keys:
        h = rows[key].hash().to_numpy()
        if time_major:
            if not np.array_equal(h[k:], h[:-k]):
                return False
        else:
            d = (h[1:] != h[:-1]).reshape(-1) if h.size > 1 else np.zeros(0, dtype=bool)
            d[n_t - 1::n_t] = False  # (a new series starts there)
            if d.any():
                return False
    return True


def _as_grid(rows: pl.DataFrame, keys: Sequence[str]
             ) -> tuple[pl.DataFrame, tuple[int, int, bool], np.ndarray | None]:
    """One host's rows as a grid: (rows, (samples, series, time_major), which rows are
    real: None when all are, else the grid was padded with null rows)."""
    shape = _grid_shape(rows[T].to_numpy(), rows[B].to_numpy())
    if shape is not None and _keys_follow(rows, keys[1:], *shape):
        return rows, shape, None
    n = rows.height
    h = rows.select(pl.struct(keys[1:]).hash()).to_series().to_numpy() if len(keys) > 1 else np.zeros(n, np.uint64)
    _, first, sid = np.unique(h, return_index=True, return_inverse=True)  # series (by hash) of each row
    t = rows[T].to_numpy()
    order = np.lexsort((t, sid))  # by series, then time
    ts, ss = t[order], sid[order]
    # a slot is (time, how many earlier rows of the series had that time): a duplicate stays a sample
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
    b = np.empty(n_t, dtype=np.int64)
    b[slot] = rows[B].to_numpy()[order]
    grid = pl.DataFrame([*rows.select(keys).gather(np.tile(first, n_t)).get_columns(),
                         pl.Series(T, np.repeat(np.repeat(times, width), k)), pl.Series(B, np.repeat(b, k)),
                         *rows.drop([*keys, T, B]).gather(pl.Series(src).set(pl.Series(~real), None)).get_columns()])
    return grid, (n_t, k, True), real


def _reduce_grid(rows: pl.DataFrame, shape: tuple[int, int, bool], real: np.ndarray | None, keys: Sequence[str],
                 aggs: Mapping[str, Agg], group_of: Callable[[pl.DataFrame], pl.Series], out: str) -> pl.DataFrame:
    """One host's (samples x series) grid reduced over each bucket's samples by reshapes,
    then over the series of each group (a group's series in order of first appearance)."""
    n_t, k, time_major = shape
    b = rows[B].to_numpy()
    first = np.arange(k) if time_major else np.arange(k) * n_t  # each series' first row
    series = rows[list(keys)].gather(first)
    idx: dict[tuple[object, str], int] = {}
    code = np.array([-1 if g is None else idx.setdefault((h, g), len(idx))
                     for h, g in zip(series[keys[0]].to_list(), group_of(series).to_list(), strict=True)],
                    dtype=np.int64)  # each series' group (-1: dropped)
    kept = np.flatnonzero(code >= 0)
    perm = kept[np.argsort(code[kept], kind="stable")]  # series sorted by group
    g_at = np.flatnonzero(np.r_[True, np.diff(code[perm]) != 0])
    bb = b[::k][:n_t] if time_major else b[:n_t]
    r_at = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1]])  # bucket starts among samples
    n_r = r_at.size
    run = n_t // n_r if n_t % n_r == 0 and (np.diff(r_at) == n_t // n_r).all() else 0  # equal buckets
    alone = g_at.size == k and bool((perm == np.arange(k)).all())  # each series its own group, in order

    def reduce(v: np.ndarray, op: np.ufunc) -> np.ndarray:
        """(groups, buckets): over each bucket's samples (views), then each group's series."""
        if run == 1:
            r = v.reshape(n_t, k).T if time_major else v.reshape(k, n_t)
        elif run and time_major:  # (buckets, samples, series), C order
            m3 = v.reshape(n_r, run, k)
            r = (np.einsum("rlk->rk", m3) if op is np.add else op.reduce(m3, axis=1)).T
        elif run:
            m3 = v.reshape(k, n_r, run)
            r = np.einsum("krl->kr", m3) if op is np.add else op.reduce(m3, axis=2)
        else:
            r = op.reduceat(v.reshape(n_t, k).T if time_major else v.reshape(k, n_t), r_at, axis=1)
        return r if alone else op.reduceat(r[perm], g_at, axis=0)

    # samples per (group, bucket) of a column without nulls
    full = np.outer(np.diff(np.r_[g_at, perm.size]), np.diff(np.r_[r_at, n_t]))
    group = np.full(k, -1, dtype=np.int64)  # each series' output row (-1: dropped)
    group[perm] = np.repeat(np.arange(g_at.size), np.diff(np.r_[g_at, perm.size]))
    has = None if real is None else reduce(real.astype(np.int64), np.add) > 0
    cols = []
    for name, agg in aggs.items():
        v, valid = values(rows[name])
        cnt, fix = full, None
        if valid is not None and (~valid).sum() * 16 <= v.size:  # few nulls (a counter's first delta
            null = np.flatnonzero(~valid)  # per series): corrected at their cells, not masked
            t, j = np.divmod(null, k) if time_major else np.divmod(null, n_t)[::-1]
            cnt, keep = full.copy(), group[j] >= 0
            at = (group[j][keep], np.searchsorted(r_at, t[keep], side="right") - 1)
            np.subtract.at(cnt, at, 1)
            if agg == "sum" and v.dtype.kind == "i":  # integers: what lies there is taken off after
                fix = (at, v[null[keep]])
            else:
                v = v.copy()
                v[null] = identity(v.dtype.kind == "f", agg)
            valid = None
        elif valid is not None:
            cnt = reduce(valid.astype(np.int64), np.add)
        r = cnt if agg == "count" else reduce(filled(v, valid, agg), _OPS[agg])
        if fix is not None:
            r = np.array(r)  # (not a view of Polars' buffer)
            np.subtract.at(r, *fix)
        if agg == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                r = r / cnt
        ok = has if agg in ("sum", "count") else (cnt > 0) if has is None else (cnt > 0) & has
        cols.append(masked(name, r.ravel(), None if ok is None else ok.ravel()))
    groups = pl.Series(out, [g for _, g in idx], dtype=pl.String)
    host = pl.Series(keys[0], [rows[keys[0]][0]], dtype=rows.schema[keys[0]]).new_from_index(0, len(groups) * n_r)
    return pl.DataFrame([host, groups.gather(np.repeat(np.arange(len(groups)), n_r)),
                         pl.Series(B, np.tile(bb[r_at], len(groups))), *cols])


def rolling(v: np.ndarray, valid: np.ndarray | None, agg: Agg, n_dev: int, m: int,
            kept: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """One bucket column (``n_dev`` devices' rows of equal length, device-major; nulls
    replaced, ``valid`` their validity) aggregated over the trailing ``m`` rows of every
    row ``m-1 ..`` of each device, of those only ``kept`` (None: all): sum (and counts)
    or mean of the valid values, max, min; invalid where all ``m`` are. NaN propagates,
    as in Polars' ``rolling_*(m, min_samples=1)`` (sums add left to right: Polars'
    running sum may differ in the last bits). Returns values and validity, device-major."""
    if agg == "mean" and v.dtype.kind != "f":
        v = v.astype(np.float64)
    d = v.reshape(n_dev, -1)
    w = d.shape[1] - m + 1  # windows ending at rows m-1 ..
    op = np.maximum if agg == "max" else np.minimum if agg == "min" else np.add
    acc = d[:, :w].copy()
    for j in range(1, m):
        op(acc, d[:, j:j + w], out=acc)
    if op is np.add and acc.dtype.kind == "f":
        acc += 0.0  # Polars' sums start at +0.0: a window of -0.0 sums to +0.0
    cnt = None
    if valid is not None:
        ok = valid.reshape(n_dev, -1).view(np.int8)
        cnt = ok[:, :w].astype(np.int32)
        for j in range(1, m):
            cnt += ok[:, j:j + w]
    if agg == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, cnt if cnt is not None else m, out=acc)
    if kept is not None:
        acc = acc[:, kept]
        cnt = cnt[:, kept] if cnt is not None else None
    has = None if cnt is None else (cnt > 0).ravel()
    return acc.ravel(), None if has is None or has.all() else has


def masked(name: str, v: np.ndarray, valid: np.ndarray | None) -> pl.Series:
    """A series of ``v``, null where ``valid`` is False (a validity mask: a NaN stays NaN)."""
    if valid is None or valid.all():
        return pl.Series(name, v)
    return pl.Series(name, pa.array(v, mask=~valid))

