"""Counter semantics: raw cumulative counters -> per-sample deltas, wraps and resets handled.

A decrease of a counter is either a *wrap* (a 32- or 64-bit counter overflowed; the
delta is taken modulo the width) or a *reset* (the source restarted: driver reload,
interface re-created, reboot; the delta is the new value, i.e. counted from zero).
A decrease is read as a 32-bit wrap when both values fit in 32 bits and the modular
delta is under 2**31, as a 64-bit wrap when the modular 64-bit delta is under 2**62,
and as a reset otherwise. The first sample of a series, and any value that is missing
(None), give a null delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
    _prev: dict[tuple[str, ...], list[int | None]] = field(default_factory=dict)

    def deltas(
        self, keys: Sequence[tuple[str, ...]], raw: dict[str, Sequence[object]]
    ) -> dict[str, list[int | None]]:
        """Turn the raw counter columns of one reading into delta columns.

        ``keys`` identifies each row's series (its tag values); ``raw`` maps counter
        field -> raw value per row. Series absent from this reading keep their state."""
        names = [c for c in self.counters if c in raw]
        cols = [raw[c] for c in names]
        out: dict[str, list[int | None]] = {c: [] for c in names}
        outs = [out[c] for c in names]
        prev_map = self._prev
        for i, key in enumerate(keys):
            new_vals = [None if col[i] is None else int(col[i]) for col in cols]  # type: ignore[call-overload]
            prev_vals = prev_map.get(key)
            if prev_vals is None:
                for o in outs:
                    o.append(None)
            else:
                for j, o in enumerate(outs):
                    p, n = prev_vals[j], new_vals[j]
                    if p is not None and n is not None and n >= p:
                        o.append(n - p)
                    else:
                        o.append(counter_delta(p, n, self.stats))
            prev_map[key] = new_vals
        return out
