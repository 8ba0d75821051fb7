"""The two numpy kernels of the feature engine, behind narrow typed interfaces.

* :func:`reduce_buckets`: rows -> one row per (group, bucket) with each column's
  bucket aggregation (sum, count of non-null, mean, max, min); the semantics of one
  Polars ``group_by(keys, bucket).agg(...)`` (tested against it), at a third of its cost
  on telemetry: a host's rows are a (samples x series) grid, reduced by reshapes.
* :func:`rolling`: trailing aggregations over ``m`` buckets at chosen rows; the
  semantics of Polars' ``rolling_*(m, min_samples=1)`` (tested against it), at a
  quarter of its cost (Polars computes every row, here only the kept ones).

Both take and return plain arrays and frames; they know nothing of plans or features.
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
    validity (None: no nulls), from the Arrow buffers without a copy: Polars'
    ``fill_null``/``is_not_null`` cost ~0.2 ms each even on small tables, and a filled
    copy of every column with nulls tripled the page faults of the features."""
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
    series-major: the previous row, except where a series starts). Compared by 64-bit
    hashes: a tenth of the cost of comparing long strings (a false match needs a hash
    collision at the same offset)."""
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


def reduce_buckets(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
                   group_of: Callable[[pl.DataFrame], pl.Series], out: str = GROUP) -> pl.DataFrame:
    """``rows`` (``keys``, ``_t``, ``_b`` and the ``aggs`` columns; no null times)
    reduced to one row per (group, bucket): the series (distinct ``keys`` values) are
    named by ``group_of`` (a frame of distinct key values -> one group name per row,
    null: dropped), then every column aggregated over the rows of each group and bucket.
    Returns ``keys[0]`` (the host: each group is per host), the group (named ``out``), ``_b`` and the
    aggregations (sums keep their integer dtype, means are floats, counts int64; null
    where a group's bucket has no value; NaN skipped by max/min). Float sums add in an
    order of their own (equal to a ``group_by``'s up to rounding)."""
    if rows.height:
        at, hosts = runs(rows[keys[0]])
        if len(set(hosts)) == len(hosts):  # each host in one run
            ends = np.r_[at[1:], rows.height]
            parts = [_grid_host(rows.slice(lo, hi - lo), keys, aggs, group_of, out)
                     for lo, hi in zip(at.tolist(), ends.tolist(), strict=True)]
            grids = [p for p in parts if p is not None]
            if len(grids) == len(parts):
                return pl.concat(grids, rechunk=True) if len(grids) != 1 else grids[0]
    return _sorted_cells(rows, keys, aggs, group_of, out)


def _name_series(rows: pl.DataFrame, keys: Sequence[str], first: np.ndarray,
                 group_of: Callable[[pl.DataFrame], pl.Series]) -> tuple[list[str], np.ndarray]:
    """Each series' group (host, name) as an index in order of first appearance (-1:
    dropped), and the groups' names."""
    series = rows[list(keys)].gather(first)
    idx: dict[tuple[object, str], int] = {}
    code = np.array([-1 if g is None else idx.setdefault((h, g), len(idx))
                     for h, g in zip(series[keys[0]].to_list(), group_of(series).to_list(), strict=True)],
                    dtype=np.int64)
    return [g for _, g in idx], code


def _grid_host(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
               group_of: Callable[[pl.DataFrame], pl.Series], out: str) -> pl.DataFrame | None:
    """One host's rows as a (samples x series) grid: reduce over each bucket's samples
    by reshapes, then over the series of each group. None: not a grid."""
    b = rows[B].to_numpy()
    shape = _grid_shape(rows[T].to_numpy(), b)
    if shape is None or not _keys_follow(rows, keys[1:], *shape):
        return None
    n_t, k, time_major = shape
    first = np.arange(k) if time_major else np.arange(k) * n_t  # each series' first row
    groups, code = _name_series(rows, keys, first, group_of)
    kept = np.flatnonzero(code >= 0)
    perm = kept[np.argsort(code[kept], kind="stable")]  # series sorted by group
    g_at = np.flatnonzero(np.r_[True, np.diff(code[perm]) != 0])
    bb = b[::k][:n_t] if time_major else b[:n_t]
    r_at = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1]])  # bucket starts among samples
    n_r = r_at.size
    run = n_t // n_r if n_t % n_r == 0 and (np.diff(r_at) == n_t // n_r).all() else 0  # equal buckets
    alone = perm.size == k and g_at.size == k and bool((perm == np.arange(k)).all())

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
        return np.asarray(r) if alone else op.reduceat(r[perm], g_at, axis=0)

    # samples per (group, bucket) of a column without nulls
    full = np.outer(np.diff(np.r_[g_at, perm.size]), np.diff(np.r_[r_at, n_t]))
    group = np.empty(k, dtype=np.int64)  # each series' output row (-1: dropped)
    group[perm] = np.repeat(np.arange(g_at.size), np.diff(np.r_[g_at, perm.size]))
    group[code < 0] = -1
    cols = []
    for name, agg in aggs.items():
        v, valid = values(rows[name])
        cnt, fix = full, None
        if valid is not None:
            if (~valid).sum() * 16 <= v.size:  # few nulls (a counter's first delta per series)
                null = np.flatnonzero(~valid)  # are corrected at their cells, not masked
                t, j = np.divmod(null, k) if time_major else np.divmod(null, n_t)[::-1]
                g, keep = group[j], group[j] >= 0
                at = (g[keep], np.searchsorted(r_at, t[keep], side="right") - 1)
                cnt = full.copy()
                np.subtract.at(cnt, at, 1)
                if agg == "sum" and v.dtype.kind == "i":  # (integers: subtract exactly what lies there)
                    fix = (at, v[null[keep]])
                else:
                    v = v.copy()
                    v[null] = identity(v.dtype.kind == "f", agg)
            else:
                cnt = reduce(valid.astype(np.int64), np.add)
                v = filled(v, valid, agg)
        r = cnt if agg == "count" else reduce(v, _OPS[agg])
        if fix is not None:
            r = np.array(r)  # (not a view of Polars' buffer)
            np.subtract.at(r, fix[0], fix[1])
        if agg == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                r = r / cnt
        cols.append(_masked(name, r.ravel(), None if agg in ("sum", "count") else (cnt > 0).ravel()))
    n_g = len(groups)
    host = pl.Series(keys[0], [rows[keys[0]][0]], dtype=rows.schema[keys[0]]).new_from_index(0, n_g * n_r)
    return pl.DataFrame([host, _repeat_each(out, groups, n_r), pl.Series(B, np.tile(bb[r_at], n_g)), *cols])


def _sorted_cells(rows: pl.DataFrame, keys: Sequence[str], aggs: Mapping[str, Agg],
                  group_of: Callable[[pl.DataFrame], pl.Series], out: str) -> pl.DataFrame:
    """Any other layout (sparse tables, shuffled rows, hosts interleaved): the rows
    sorted by (group, bucket), then each run of equal cells reduced."""
    if not rows.height:
        return pl.DataFrame([rows[keys[0]], pl.Series(out, [], dtype=pl.String), rows[B],
                             *[rows[n] for n in aggs]])
    sid = rows.select(pl.struct(list(keys)).rank("dense").cast(pl.Int64) - 1).to_series().to_numpy()
    _, first = np.unique(sid, return_index=True)
    groups, code = _name_series(rows, keys, first, group_of)
    gid = code[sid]
    b = rows[B].to_numpy()
    b0, b_us = int(b.min()), int(np.gcd.reduce(b - b.min())) or 1
    cell = gid * ((int(b.max()) - b0) // b_us + 1) + (b - b0) // b_us
    order = np.argsort(cell, kind="stable")
    order = order[gid[order] >= 0]
    cell = cell[order]
    at = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]]) if cell.size else np.empty(0, dtype=np.int64)
    cols = []
    for name, agg in aggs.items():
        v, valid = values(rows[name])
        v = filled(v, valid, agg)
        cnt = np.add.reduceat(np.ones(order.size, np.int64) if valid is None else valid[order].astype(np.int64), at)
        r = cnt if agg == "count" else _OPS[agg].reduceat(v[order], at) if at.size else v[:0]
        if agg == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                r = r / cnt
        cols.append(_masked(name, r, None if agg in ("sum", "count") else cnt > 0))
    src = order[at]
    return pl.DataFrame([rows[keys[0]].gather(src), pl.Series(out, groups, dtype=pl.String).gather(gid[src]),
                         pl.Series(B, b[src]), *cols])


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


def runs(s: pl.Series) -> tuple[np.ndarray, list[str]]:
    """The first row of each run of equal values of ``s`` and the runs' values (rows
    come in runs: a few per table), by 64-bit hashes (Polars' ``rle`` costs several
    queries; a false merge of two runs needs a hash collision of neighbours)."""
    h = s.hash().to_numpy()
    at = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    return at, s.gather(at).to_list()


def _masked(name: str, v: np.ndarray, valid: np.ndarray | None) -> pl.Series:
    """A series of ``v``, null where ``valid`` is False (a validity mask: a NaN stays NaN)."""
    if valid is None or valid.all():
        return pl.Series(name, v)
    return pl.Series(name, pa.array(v, mask=~valid))


def _repeat_each(name: str, names: Sequence[str], each: int) -> pl.Series:
    """A string column of ``names``, each repeated ``each`` times."""
    s = pl.Series(name, names, dtype=pl.String)
    if len(names) <= 64:  # a few constant blocks: ~4x cheaper than a gather of every row
        return pl.concat([s.new_from_index(i, each) for i in range(len(names))] or [s], rechunk=True)
    return s.gather(np.repeat(np.arange(len(names)), each))
