"""Attribution: which features, devices and subsystems made a window anomalous.

Per detector, ``contributions(X)`` gives one non-normalised number per feature
(:mod:`analytics.detectors`): z² for the robust Z-score, the exact decomposition
``c_j = d_j (Σ⁻¹d)_j`` of the squared Mahalanobis distance (sums to d²), path-based
credit for Isolation Forest (an approximation), squared residuals for PCA.
Here they become **shares**: negative terms (possible for Mahalanobis) are clipped to
0 and each row is normalised to sum to 1. The shares of the detectors that flagged a
window are averaged; that average gives

* the **top-k factors**: feature, family, device, subsystem, share (``contribution``),
  ``direction`` (``up`` when the value is above the reference median, else ``down``),
  the window's ``value`` and the ``reference`` median;
* the **subsystem profile**: the shares summed per subsystem (cpu, gpu, memory,
  interconnect, network, storage, other); it sums to 1 (all zeros only when no detector
  attributed anything, e.g. every contribution was exactly 0).

Profile + top factors is the fingerprint the knowledge base matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl
from numpy.typing import NDArray

from analytics.catalog import SUBSYSTEMS, lookup

Array = NDArray[np.float64]

FACTOR_DTYPE = pl.Struct(
    {
        "feature": pl.String,
        "family": pl.String,
        "device": pl.String,
        "subsystem": pl.String,
        "contribution": pl.Float64,
        "direction": pl.String,
        "value": pl.Float64,
        "reference": pl.Float64,
    }
)

SHARE_COLUMNS: tuple[str, ...] = tuple(f"share_{s}" for s in SUBSYSTEMS)


@dataclass(frozen=True)
class Factor:
    feature: str
    family: str
    device: str
    subsystem: str
    contribution: float
    direction: str
    value: float
    reference: float


def shares(contributions: Array) -> Array:
    """Row-normalised positive parts: each row sums to 1 (or is all 0)."""
    c = np.where(np.isfinite(contributions), np.maximum(contributions, 0.0), 0.0)
    total = c.sum(axis=1, keepdims=True)
    return np.asarray(np.divide(c, total, out=np.zeros_like(c), where=total > 0))


def combine_shares(per_detector: Sequence[Array]) -> Array:
    """Average of the detectors' share matrices (each row re-normalised)."""
    if not per_detector:
        raise ValueError("combine_shares: no contributions given")
    return shares(np.mean([shares(c) for c in per_detector], axis=0))


def subsystem_matrix(features: Sequence[str]) -> Array:
    """(n_features, n_subsystems) one-hot of each feature's subsystem."""
    return _subsystem_matrix(tuple(features))


@lru_cache(maxsize=32)
def _subsystem_matrix(features: tuple[str, ...]) -> Array:
    m = np.zeros((len(features), len(SUBSYSTEMS)))
    idx = {s: i for i, s in enumerate(SUBSYSTEMS)}
    for j, f in enumerate(features):
        m[j, idx.get(lookup(f).subsystem, idx["other"])] = 1.0
    return m


def subsystem_profile(share_rows: Array, features: Sequence[str]) -> Array:
    """(n_rows, 7) shares per subsystem in :data:`SUBSYSTEMS` order."""
    return np.asarray(share_rows @ subsystem_matrix(features))


def top_factors(share_row: Array, value_row: Array, reference_row: Array, features: Sequence[str],
                k: int = 5) -> list[Factor]:
    """The k largest shares of one window (ties broken by feature order); zero shares
    are never listed."""
    order = np.argsort(-share_row, kind="stable")[:k]
    out = []
    for j in order:
        if share_row[j] <= 0:
            break
        info = lookup(features[j])
        v, r = float(value_row[j]), float(reference_row[j])
        out.append(Factor(info.feature, info.family, info.device, info.subsystem, float(share_row[j]),
                          "up" if not (v < r) else "down", v, r))
    return out


def explain(
    contributions: Mapping[str, Array],
    values: Array,
    reference: Array,
    features: Sequence[str],
    k: int = 5,
) -> tuple[list[list[Factor]], Array]:
    """Fingerprints of a block of windows from the contributions of the detectors
    that flagged them (name -> (n_rows, n_features)): top-k factors per row and the
    (n_rows, 7) subsystem profile."""
    s = combine_shares(list(contributions.values()))
    prof = subsystem_profile(s, features)
    tops = [top_factors(s[i], values[i], reference, features, k) for i in range(s.shape[0])]
    return tops, prof


def factors_series(rows: Sequence[Sequence[Factor]], name: str = "top_factors") -> pl.Series:
    """A List[Struct] series (the ``findings.top_factors`` column)."""
    data = [[f.__dict__ for f in r] for r in rows]
    return pl.Series(name, data, dtype=pl.List(FACTOR_DTYPE))
