"""Label-free post-processing of window scores for anomalies that last (incidents are
contiguous runs of windows, not isolated points).

* :func:`mean_margin` — combine detectors by the mean of their margins (each detector's
  score rescaled so its reference median is 0 and its threshold 1, see
  ``_Detector.margin``): a window is flagged when the detectors *together* are past
  their thresholds, so one detector's heavy-tailed wobble is damped by the other's
  calm, while a real excursion moves both. Unlike a vote, a strong excursion seen by
  one detector still counts.
* :func:`close_gaps` — morphological closing of the flags in time: a run of at most
  ``max_gap`` unflagged windows between two flagged ones is flagged too (an incident's
  score dips below the threshold for a few minutes; the windows in between belong to it).
  It looks back only: a gap is filled once the window after it is flagged.
* :func:`run_mean` — per flagged run, the mean of a per-window quantity (e.g. the
  squared robust z of each metric) over the run so far (``causal``) or over the whole
  run: the explanation of an incident is what deviated *during the incident*, not in
  its noisiest single window.
* :func:`runs` — maximal runs of True.
* :class:`ChannelTail` — a per-channel score in units of each channel's own reference
  tail, and :func:`rolling_mean` (a trailing mean, for a slower copy of the features).

Measured on the Server Machine Dataset (docs/smd.md): the mean of the IF and
Mahalanobis margins and closing gaps of up to 30 windows lift label-free point-wise F1;
run-level attribution (z² averaged over the run) lifts HitRate@150 % from 0.75 (one
window's detector shares) to 0.88 on the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analytics.detectors import RobustStandardizer

Array = NDArray[np.float64]


def _flags(flags: ArrayLike, name: str) -> NDArray[np.bool_]:
    f = np.asarray(flags)
    if f.ndim != 1:
        raise ValueError(f"{name}: flags must be one-dimensional, got shape {f.shape}")
    return f.astype(bool)


def runs(flags: ArrayLike) -> list[tuple[int, int]]:
    """Maximal runs of True as (start, end exclusive), in order."""
    f = _flags(flags, "runs")
    d = np.diff(np.concatenate([[0], f.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def close_gaps(flags: ArrayLike, max_gap: int) -> NDArray[np.bool_]:
    """Flags with every run of at most ``max_gap`` False *between* two True filled in
    (leading and trailing False are kept). ``max_gap`` 0 returns the flags unchanged."""
    if max_gap < 0:
        raise ValueError(f"close_gaps: max_gap must be >= 0, not {max_gap!r}")
    out = _flags(flags, "close_gaps").copy()
    if max_gap == 0:
        return out
    rs = runs(out)
    for (_, end), (start, _) in zip(rs[:-1], rs[1:], strict=True):
        if start - end <= max_gap:
            out[end:start] = True
    return out


def mean_margin(margins: Sequence[ArrayLike]) -> Array:
    """Element-wise mean of the detectors' margins (threshold at 1). A NaN margin (no
    score for that window) makes the mean NaN, i.e. never flagged."""
    if not margins:
        raise ValueError("mean_margin: no margins given")
    m = np.vstack([np.asarray(x, dtype=np.float64) for x in margins])
    return np.asarray(m.mean(axis=0))


def run_mean(values: ArrayLike, flags: ArrayLike, *, causal: bool = True) -> Array:
    """``values`` (n_windows, n_features) with each flagged run's rows replaced by the
    mean over the run: of its rows up to and including each one (``causal``), or of the
    whole run. Unflagged rows keep their own values."""
    v = np.array(values, dtype=np.float64)
    f = _flags(flags, "run_mean")
    if v.ndim != 2 or v.shape[0] != f.size:
        raise ValueError(f"run_mean: values of shape {v.shape} do not match {f.size} flags")
    for a, b in runs(f):
        block = v[a:b]
        if causal:
            v[a:b] = np.cumsum(block, axis=0) / np.arange(1, b - a + 1)[:, None]
        else:
            v[a:b] = block.mean(axis=0)
    return v


def rolling_mean(values: ArrayLike, n: int) -> Array:
    """Trailing mean of each column over the last ``n`` rows, the row included (fewer at
    the start): causal, a row never reads a later one."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"rolling_mean: values must be two-dimensional, got shape {v.shape}")
    if n < 1:
        raise ValueError(f"rolling_mean: n must be >= 1, not {n!r}")
    c = np.concatenate([np.zeros((1, v.shape[1])), np.cumsum(v, axis=0)])
    i = np.arange(v.shape[0])
    lo = np.maximum(0, i - n + 1)
    return np.asarray((c[i + 1] - c[lo]) / (i + 1 - lo)[:, None])


class ChannelTail:
    """Per-channel deviation measured in units of the channel's own reference tail.

    Each channel's robust z (:class:`analytics.detectors.RobustStandardizer`) is divided
    by the ``level`` quantile of its |z| over the reference (at least 1), and a window's
    score is the mean of its ``top_k`` largest. A bursty channel (|z| of 50 every day in
    the reference) then counts for as much as a quiet one at its usual |z| of 2: no
    channel dominates by its heavy tail, which a max of raw z or a covariance fitted to
    a trimmed core lets it do. Measured on SMD (docs/smd.md): it ranks the sustained
    moderate shifts of machine 2-1 far better than the Mahalanobis distance, and worse
    where incidents are correlated moves of many metrics."""

    def __init__(self, top_k: int = 3, level: float = 0.99, floors: ArrayLike | None = None) -> None:
        if top_k < 1 or not 0.0 < level < 1.0:
            raise ValueError(f"ChannelTail: top_k must be >= 1 and level in (0, 1), not {top_k!r} and {level!r}")
        self.top_k = top_k
        self.level = level
        self.floors = floors

    def fit(self, ref: ArrayLike) -> ChannelTail:
        r = np.asarray(ref, dtype=np.float64)
        if r.ndim != 2 or r.shape[0] < 1:
            raise ValueError(f"ChannelTail.fit: need a two-dimensional reference with rows, got shape {r.shape}")
        self.scaler_ = RobustStandardizer(floors=self.floors).fit(r)
        z = np.abs(self.scaler_.transform(r))
        self.tail_ = np.maximum(np.quantile(z, self.level, axis=0), 1.0)
        self.reference_scores_ = self._aggregate(z)
        return self

    def _aggregate(self, z: Array) -> Array:
        t = z / self.tail_
        k = min(self.top_k, t.shape[1])
        if k == 0:
            return np.zeros(t.shape[0])
        return np.asarray(-np.partition(-t, k - 1, axis=1)[:, :k].mean(axis=1))

    def score_samples(self, X: ArrayLike) -> Array:
        """The score of each row of ``X`` (missing values count as no deviation)."""
        return self._aggregate(np.abs(self.scaler_.transform(np.asarray(X, dtype=np.float64))))
