"""Counter semantics: raw cumulative counters -> per-sample deltas, wraps and resets handled.

A decrease of a counter is either a *wrap* (a 32- or 64-bit counter overflowed; the
delta is taken modulo the width) or a *reset* (the source restarted: driver reload,
interface re-created, reboot; the delta is the new value, i.e. counted from zero).
A decrease is read as a 32-bit wrap when both values fit in 32 bits and the modular
delta is under 2**31, as a 64-bit wrap when the modular 64-bit delta is under 2**62,
and as a reset otherwise. The first sample of a series, and any value that is missing
(None), give a null delta, except for the *polled* counters of a tracker: a collector reads
those less often than every tick (NVML's energy and violation counters cost milliseconds a
call), so a null means "not read this tick" and the next read's delta covers the whole time
since the previous read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

_M32 = 1 << 32
_M64 = 1 << 64


@dataclass
class CounterStats:
    wraps: int = 0
    resets: int = 0


def counter_delta(prev: int | None, new: int | None, stats: CounterStats | None = None) -> int | None:
    """Delta of one counter between two samples (see module docstring)."""
    if prev is None or new is None:
        return None
    if new >= prev:
        return new - prev
    if prev < _M32 and new < _M32:
        d32 = (new - prev) % _M32
        if d32 < (1 << 31):
            if stats is not None:
                stats.wraps += 1
            return d32
    d64 = (new - prev) % _M64
    if prev >= _M32 and d64 < (1 << 62):
        if stats is not None:
            stats.wraps += 1
        return d64
    if stats is not None:
        stats.resets += 1
    return new


@dataclass
class CounterTracker:
    """Keeps the previous raw value of every counter of every series of one measurement."""

    counters: tuple[str, ...]
    stats: CounterStats = field(default_factory=CounterStats)
    polled: tuple[str, ...] = ()  # null = not read: the state keeps the previous value
    _prev: dict[tuple[str, ...], list[int | None]] = field(default_factory=dict)
    # the previous reading as columns, for the common case of the same series in the same order
    _prev_keys: list[tuple[str, ...]] | None = None
    _prev_cols: dict[str, list[int | None]] = field(default_factory=dict)

    def deltas(
        self, keys: Sequence[tuple[str, ...]], raw: Mapping[str, Sequence[object]]
    ) -> dict[str, list[int | None]]:
        """Turn the raw counter columns of one reading into delta columns.

        ``keys`` identifies each row's series (its tag values); ``raw`` maps counter
        field -> raw value per row. Series absent from this reading keep their state."""
        names = [c for c in self.counters if c in raw]
        new_cols: dict[str, list[int | None]] = {
            c: [None if v is None else int(v) for v in raw[c]]  # type: ignore[call-overload]
            for c in names
        }
        keys = list(keys)
        if keys == self._prev_keys and all(c in self._prev_cols for c in names):
            # the common case (same series, same order): one pass over all columns at once
            prev_flat = [v for c in names for v in self._prev_cols[c]]
            new_flat = [v for c in names for v in new_cols[c]]
            flat = self._column_deltas(prev_flat, new_flat)
            n = len(keys)
            out = {c: flat[i * n : (i + 1) * n] for i, c in enumerate(names)}
            for c in self.polled:  # (empty for every measurement but the GPUs')
                if c in new_cols:
                    new_cols[c] = _held(self._prev_cols[c], new_cols[c])
        else:
            out = self._row_deltas(keys, names, new_cols)
        self._prev_keys = keys
        self._prev_cols = new_cols
        return out

    def deltas_run(
        self, keys: Sequence[tuple[str, ...]], ticks: int, raw: Mapping[str, Sequence[object]]
    ) -> dict[str, list[int | None]]:
        """:meth:`deltas` of ``ticks`` consecutive readings of the same series at once:
        ``raw`` holds their columns one reading after the other (``ticks * len(keys)``
        values each). Same result as calling :meth:`deltas` once per reading."""
        n = len(keys)
        if ticks == 1:
            return self.deltas(keys, raw)
        names = [c for c in self.counters if c in raw]
        out = self.deltas(keys, {c: raw[c][:n] for c in names})  # aligns the series' state
        for c in names:
            col = [None if v is None else int(v) for v in raw[c]]  # type: ignore[call-overload]
            prev = col[:-n]
            if c in self.polled:  # each reading's state: the last value read up to it
                prev = list(self._prev_cols[c])
                for t in range(1, ticks - 1):
                    prev += _held(prev[-n:], col[t * n : (t + 1) * n])
            out[c] = out[c] + self._column_deltas(prev, col[n:])
            self._prev_cols[c] = _held(prev[-n:], col[-n:]) if c in self.polled else col[-n:]
        return out

    def _column_deltas(self, prev: list[int | None], new: list[int | None]) -> list[int | None]:
        return [
            n - p if (p is not None and n is not None and n >= p) else counter_delta(p, n, self.stats)
            for p, n in zip(prev, new, strict=True)
        ]

    def _row_deltas(
        self, keys: list[tuple[str, ...]], names: list[str], new_cols: dict[str, list[int | None]]
    ) -> dict[str, list[int | None]]:
        # series appeared, vanished or moved: align by key, remembering every series seen
        if self._prev_keys is not None:
            for i, key in enumerate(self._prev_keys):
                self._prev[key] = [self._prev_cols[c][i] if c in self._prev_cols else None for c in names]
        out: dict[str, list[int | None]] = {c: [] for c in names}
        outs = [out[c] for c in names]
        cols = [new_cols[c] for c in names]
        polled = [j for j, c in enumerate(names) if c in self.polled]
        for i, key in enumerate(keys):
            new_vals = [col[i] for col in cols]
            prev_vals = self._prev.get(key)
            for j, o in enumerate(outs):
                o.append(None if prev_vals is None else counter_delta(prev_vals[j], new_vals[j], self.stats))
            if prev_vals is not None and polled:
                for j in polled:
                    if new_vals[j] is None:
                        new_vals[j] = prev_vals[j]
                        cols[j][i] = prev_vals[j]  # the state kept for the aligned path too
            self._prev[key] = new_vals
        return out


def _held(prev: list[int | None], new: list[int | None]) -> list[int | None]:
    """``new`` with each null replaced by the previous state's value (a polled counter)."""
    return [p if v is None else v for p, v in zip(prev, new, strict=True)]


def deltas_array(
    raw: np.ndarray, prev: np.ndarray | None = None, stats: CounterStats | None = None, *, axis: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`counter_delta` along ``axis`` (the sample axis) of ``raw``.

    ``raw`` holds unsigned raw counter values (cast to uint64). ``prev`` is the sample
    before the first one, per series (``raw`` without the sample axis), or None (then the
    first delta is null). Returns ``(deltas, valid)``: int64 deltas (the uint64 delta
    reinterpreted; a reset's delta is the new value) and a mask that is False where the
    delta is null. Wraps and resets are counted into ``stats`` like :func:`counter_delta`.
    (Used by the simulator; the rule is the one above, tests keep both in agreement.)"""
    r = np.asarray(raw).astype(np.uint64, copy=False)
    ax = axis % r.ndim

    def cut(x: np.ndarray, a: int | None, b: int | None) -> np.ndarray:
        idx: list[slice] = [slice(None)] * x.ndim
        idx[ax] = slice(a, b)
        return x[tuple(idx)]

    p0 = None if prev is None else np.expand_dims(np.asarray(prev).astype(np.uint64, copy=False), ax)
    d = np.empty(r.shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.subtract(cut(r, 1, None), cut(r, None, -1), out=cut(d, 1, None))  # modular 2**64 difference
        if p0 is None:
            cut(d, 0, 1)[...] = 0
        else:
            np.subtract(cut(r, 0, 1), p0, out=cut(d, 0, 1))
    # x < y exactly when (x - y) mod 2**64 > x: one pass finds every decrease
    dec = d > r
    if dec.any():
        p = np.empty_like(r)
        cut(p, 1, None)[...] = cut(r, None, -1)
        cut(p, 0, 1)[...] = cut(r, 0, 1) if p0 is None else p0
        m32 = np.uint64(_M32)
        fits32 = (p < m32) & (r < m32)
        d32 = d & np.uint64(_M32 - 1)
        w32 = dec & fits32 & (d32 < np.uint64(1 << 31))
        w64 = dec & ~w32 & (p >= m32) & (d < np.uint64(1 << 62))
        reset = dec & ~w32 & ~w64
        d = np.where(w32, d32, d)
        d = np.where(reset, r, d)
        if stats is not None:
            stats.wraps += int(w32.sum() + w64.sum())
            stats.resets += int(reset.sum())
    valid = np.ones(r.shape, dtype=bool)
    if p0 is None:
        cut(valid, 0, 1)[...] = False
    return d.view(np.int64), valid
