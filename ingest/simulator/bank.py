"""Raw cumulative counters and smoothed state carried across chunks.

Every counter field of the simulated lake is produced the way the real agent produces it:
per-tick increments are accumulated into a *raw* cumulative counter (uint64, or modulo
2**32 where a scenario makes a counter 32-bit), which is then turned into deltas by
:func:`ingest.counters.deltas_array` - the same wrap/reset rule the collectors use. A
scenario can make a raw counter wrap or reset at a given tick; since only deltas reach the
lake, the raw history before a wrap may be re-based freely (see :meth:`CounterBank.deltas`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ingest.counters import CounterStats, deltas_array


@dataclass(frozen=True)
class CounterEvent:
    """A raw-counter artefact: ``kind`` "wrap" or "reset" of ``table.field`` for the series
    named ``series`` at tick ``tick`` of that table's tier."""

    kind: str
    table: str
    field: str
    series: str
    tick: int
    bits: int = 64


@dataclass
class _Counter:
    total: np.ndarray  # uint64 integer increments since the run start, per series
    frac: np.ndarray  # carried fractional part
    offset: np.ndarray  # uint64 raw = offset + total (mod 2**bits)
    bits: np.ndarray  # 32 or 64 per series
    last_raw: np.ndarray  # uint64 last raw value per series


@dataclass
class CounterBank:
    seed: np.random.SeedSequence
    events: list[CounterEvent] = field(default_factory=list)
    keep_raw: bool = False
    raw: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)
    stats: CounterStats = field(default_factory=CounterStats)
    realised: list[tuple[str, int, str]] = field(default_factory=list)  # (table, tick, kind) applied
    _state: dict[tuple[str, str], _Counter] = field(default_factory=dict)
    _ewm: dict[str, np.ndarray] = field(default_factory=dict)

    def deltas(self, table: str, name: str, series: list[str], a: int, inc: np.ndarray, *,
               time_major: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Deltas (and validity) of one counter for rows [a, a+n) of its tier.

        ``inc`` holds the true non-negative increments, series x rows (rows x series when
        ``time_major``); the result has the same layout."""
        ax = 0 if time_major else 1
        inc = np.asarray(inc)
        s = inc.shape[1 - ax]
        n = inc.shape[ax]
        st = self._state.get((table, name))
        first = st is None
        if st is None:
            rng = np.random.default_rng(_sub(self.seed, table, name))
            bits = np.full(s, 64, dtype=np.int64)
            # >= 2**32, so that a reset reads as a reset and not as a 32-bit wrap
            offset: np.ndarray = np.asarray(rng.integers(1 << 33, 1 << 44, size=s, dtype=np.uint64))
            for ev in self.events:
                if ev.table == table and ev.field == name and ev.bits == 32 and ev.series in series:
                    k = series.index(ev.series)
                    bits[k] = 32
                    offset[k] = np.uint64(int(offset[k]) & 0x7FFFFFFF)
            st = _Counter(np.zeros(s, np.uint64), np.zeros(s), offset, bits, np.zeros(s, np.uint64))
        expand = (lambda v: v[None, :]) if time_major else (lambda v: v[:, None])
        cum = np.cumsum(np.maximum(inc, 0.0), axis=ax, dtype=np.float64)
        cum += expand(st.frac)
        last = (cum[-1] if time_major else cum[:, -1]).copy()
        st.frac = last - np.floor(last)  # in [0, 1): the raw counter never steps back
        np.floor(cum, out=cum)
        total = cum.astype(np.uint64)
        total += expand(st.total)
        raw = total + expand(st.offset)  # uint64: wraps modulo 2**64 by itself
        evs = [e for e in self.events if e.table == table and e.field == name and a <= e.tick < a + n
               and e.series in series]
        for ev in evs:
            i, k = series.index(ev.series), ev.tick - a
            col_total = total[:, i] if time_major else total[i]
            col_raw = raw[:, i] if time_major else raw[i]
            before = int(col_total[k - 1]) if k > 0 else int(st.total[i])
            if ev.kind == "reset":
                # the source restarted: counting from zero since the previous sample
                st.offset[i] = np.uint64((-before) % (1 << 64))
            else:
                # re-base (only deltas are observable) so the raw value sits just below
                # 2**bits before tick k and wraps at k
                st.offset[i] = np.uint64(((1 << int(st.bits[i])) - 1 - before) % (1 << 64))
                with np.errstate(over="ignore"):
                    col_raw[:k] = col_total[:k] + st.offset[i]
                    st.last_raw[i] = st.total[i] + st.offset[i]
            with np.errstate(over="ignore"):
                col_raw[k:] = col_total[k:] + st.offset[i]
            self.realised.append((table, ev.tick, ev.kind))
        mask32 = st.bits == 32
        if mask32.any():
            if time_major:
                raw[:, mask32] &= np.uint64(0xFFFFFFFF)
            else:
                raw[mask32] &= np.uint64(0xFFFFFFFF)
            st.last_raw[mask32] &= np.uint64(0xFFFFFFFF)
        d, valid = deltas_array(raw, None if first else st.last_raw, self.stats, axis=ax)
        st.total = (total[-1] if time_major else total[:, -1]).copy()
        st.last_raw = (raw[-1] if time_major else raw[:, -1]).copy()
        self._state[(table, name)] = st
        if self.keep_raw:
            self.raw.setdefault((table, name), []).append(raw.T.copy() if time_major else raw.copy())
        return d, valid

    def ewm(self, key: str, x: np.ndarray, tau_ticks: float) -> np.ndarray:
        """Exponential smoothing along the last axis with time constant ``tau_ticks``,
        continued from the previous chunk's last value (exact AR(1) continuation)."""
        alpha = 1.0 - float(np.exp(-1.0 / tau_ticks))
        x2 = np.atleast_2d(np.asarray(x, dtype=np.float64))
        prev = self._ewm.get(key)
        if prev is not None:
            x2 = np.concatenate([prev[:, None], x2], axis=1)
        df = pl.DataFrame({str(i): x2[i] for i in range(x2.shape[0])})
        y = df.select(pl.all().ewm_mean(alpha=alpha, adjust=False)).to_numpy().T
        if prev is not None:
            y = y[:, 1:]
        self._ewm[key] = y[:, -1].copy()
        return y.reshape(np.shape(x)) if np.ndim(x) == 1 else y


def _sub(seed: np.random.SeedSequence, *names: str) -> np.random.SeedSequence:
    """A child seed named by strings: independent of the order in which streams are made."""
    words = [int.from_bytes(n.encode()[:16].ljust(16, b"\0")[i : i + 4], "little") for n in names for i in (0, 4, 8, 12)]
    return np.random.SeedSequence(entropy=seed.entropy, spawn_key=(*seed.spawn_key, *words))
