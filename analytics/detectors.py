"""Unsupervised window detectors in the scikit-learn estimator style.

**One score direction everywhere: higher = more anomalous.** ``score_samples(X)`` is
the anomaly score, ``decision_function(X) = score_samples(X) - threshold_`` (> 0 means
flagged), ``predict(X)`` the boolean flags (``scores_to_labels``). This deliberately
differs from scikit-learn's OutlierMixin (where lower is more abnormal and predict
returns -1/+1), so the detectors do not inherit OutlierMixin; everything else follows
the contract: parameters only in ``__init__``, validation in ``fit``, fitted state in
attributes ending in ``_``.

Shared pieces (one implementation for every detector and for the pipeline):

* :class:`RobustStandardizer` — per-feature median and a robust scale
  ``max(1.4826·MAD, std_frac·std, floor_j, rel_floor·|median|, 1e-12)``
  (no IQR: a quartile moves as soon as a quarter of the reference is anomalous, the
  MAD only at half).
  ``floor_j`` comes from the feature catalog (the smallest change worth noticing), so a
  channel that never changes in the reference is not "infinitely anomalous" when it
  moves by a rounding error, while a real step (a power cap, a link trained down) is
  still many scales away. Missing values (NaN/null: undefined ratios, absent devices)
  are imputed with the reference median, i.e. they contribute nothing. Features with
  no finite reference value are ignored.
* :func:`calibrate_threshold` — the label-free threshold: on the log of the reference
  scores, ``median + k·1.4826·MAD`` (MAD floored), iterated with clipping of the scores
  above it, back-transformed. It tolerates a contaminated reference (a long incident in
  the host's own history), unlike a quantile of the reference scores, which would place
  the threshold above the anomaly.
* :func:`scores_to_labels` — ``score > threshold``; NaN scores are never flagged.

Detectors: :class:`RobustZScore` (score = max |z|), :class:`IsolationForestDetector`
(sklearn IsolationForest, score = -score_samples, in (0, 1]) and
:class:`MahalanobisDetector` (squared robust Mahalanobis distance; covariance by
Ledoit-Wolf on the trimmed central windows, or MinCovDet on a subsample). Each exposes
``contributions(X)`` for attribution (see :mod:`analytics.attribution`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.covariance import LedoitWolf, MinCovDet
from sklearn.ensemble import IsolationForest
from sklearn.utils.validation import check_is_fitted, check_random_state, validate_data

log = logging.getLogger(__name__)

Array = NDArray[np.float64]

_MAD_TO_SIGMA = 1.4826
_TINY = 1e-12


def scores_to_labels(scores: ArrayLike, threshold: float | ArrayLike) -> NDArray[np.bool_]:
    """Flags from scores (higher = more anomalous): ``score > threshold``; NaN -> False."""
    s = np.asarray(scores, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.asarray(s > np.asarray(threshold, dtype=np.float64), dtype=bool) & ~np.isnan(s)


def calibrate_threshold(scores: ArrayLike, k: float = 4.0, *, log_scale: bool = True,
                        min_spread: float = 0.05, max_iter: int = 10) -> float:
    """Label-free threshold from reference scores: ``median + k·1.4826·MAD`` on the log
    scale (``log_scale``; scores must then be positive) or the linear one, **iterated
    with clipping**: scores above the threshold are set aside and median/MAD recomputed
    on the rest until the set is stable (at most ``max_iter`` rounds). A reference that
    is partly anomalous (a long incident in the host's own history) first raises the
    median and MAD; clipping removes the anomalous scores so the threshold settles on
    the healthy part. The MAD is floored (``min_spread`` on the log scale, i.e. ~5 %;
    relative to |median| on the linear scale) so identical reference scores do not give
    a threshold equal to them."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return float("inf")
    if log_scale:
        s = np.log(np.maximum(s, _TINY))
    keep = s
    thr = float("inf")
    for _ in range(max(1, max_iter)):
        med = float(np.median(keep))
        mad = _MAD_TO_SIGMA * float(np.median(np.abs(keep - med)))
        floor = min_spread if log_scale else min_spread * max(abs(med), 1.0)
        thr = med + k * max(mad, floor)
        nxt = s[s <= thr]
        if nxt.size == keep.size or nxt.size == 0:
            break
        keep = nxt
    return float(np.exp(thr)) if log_scale else thr


def _float_matrix(X: ArrayLike) -> Array:
    return np.asarray(X, dtype=np.float64)


def _robust_stats(X: Array, finite: NDArray[np.bool_]) -> tuple[Array, Array, Array]:
    """Per-column median, MAD and std over the finite values (fast path for complete
    columns: np.nanmedian is several times slower than np.median)."""
    p = X.shape[1]
    med, mad, std = np.empty(p), np.empty(p), np.empty(p)
    full = finite.all(axis=0)
    if full.any():
        Xf = X[:, full]
        m = np.median(Xf, axis=0)
        med[full], mad[full], std[full] = m, np.median(np.abs(Xf - m), axis=0), Xf.std(axis=0)
    if (~full).any():
        Xp = np.where(finite[:, ~full], X[:, ~full], np.nan)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m = np.nanmedian(Xp, axis=0)
            med[~full], mad[~full], std[~full] = m, np.nanmedian(np.abs(Xp - m), axis=0), np.nanstd(Xp, axis=0)
    return med, mad, std


class RobustStandardizer(TransformerMixin, BaseEstimator):
    """Median / robust-scale standardisation shared by every detector and the pipeline.

    ``floors``: per-feature lower bounds of the scale (from the catalog), or None."""

    def __init__(self, floors: ArrayLike | None = None, std_frac: float = 0.1, rel_floor: float = 1e-3) -> None:
        self.floors = floors
        self.std_frac = std_frac
        self.rel_floor = rel_floor

    def fit(self, X: ArrayLike, y: object = None) -> RobustStandardizer:
        X = np.asarray(validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64))
        if self.std_frac < 0 or self.rel_floor < 0:
            raise ValueError("RobustStandardizer: std_frac and rel_floor must be >= 0")
        p = X.shape[1]
        floors: Array = np.zeros(p) if self.floors is None else np.asarray(self.floors, dtype=np.float64)
        if floors.shape != (p,):
            raise ValueError(f"RobustStandardizer: floors has shape {floors.shape}, expected ({p},)")
        finite = np.isfinite(X)
        self.in_use_ = finite.any(axis=0)
        med, mad, std = _robust_stats(X[:, self.in_use_], finite[:, self.in_use_])
        center = np.zeros(p)
        scale = np.ones(p)
        center[self.in_use_] = med
        scale[self.in_use_] = np.nanmax(
            np.vstack([
                _MAD_TO_SIGMA * mad,
                self.std_frac * std,
                floors[self.in_use_],
                self.rel_floor * np.abs(med),
                np.full(med.shape, _TINY),
            ]),
            axis=0,
        )
        self.center_ = center
        self.scale_ = scale
        return self

    def transform(self, X: ArrayLike) -> Array:
        """z-scores; missing values and features unused in the reference give 0."""
        check_is_fitted(self)
        X = np.asarray(validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64))
        with np.errstate(invalid="ignore", over="ignore"):
            z = (X - self.center_) / self.scale_
        z[:, ~self.in_use_] = 0.0
        z[~np.isfinite(z)] = 0.0
        return np.asarray(z)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


class _Detector(BaseEstimator):
    """Common machinery: standardise (or take z-scores as given), fit, calibrate."""

    #: calibration on the log scale (positive scores)
    _log_scale = True

    standardize: bool
    floors: ArrayLike | None
    threshold_k: float
    scaler_: RobustStandardizer | None

    def _fit_scaler(self, X: Array) -> Array:
        if self.standardize:
            self.scaler_ = RobustStandardizer(floors=self.floors).fit(X)
            return self.scaler_.transform(X)
        self.scaler_ = None
        z = np.array(X, dtype=np.float64)
        z[~np.isfinite(z)] = 0.0
        return z

    def _z(self, X: ArrayLike) -> Array:
        check_is_fitted(self)
        X = np.asarray(validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64))
        if self.scaler_ is not None:
            return self.scaler_.transform(X)
        z = np.array(X, dtype=np.float64)
        z[~np.isfinite(z)] = 0.0
        return z

    def _validate(self, X: ArrayLike) -> Array:
        X = validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64, ensure_min_samples=1)
        if not (np.isfinite(self.threshold_k) and self.threshold_k > 0):
            raise ValueError(f"{type(self).__name__}: threshold_k must be a positive number, not {self.threshold_k!r}")
        return np.asarray(X)

    def _calibrate(self, train_scores: Array) -> None:
        self.reference_scores_ = train_scores
        self.threshold_ = calibrate_threshold(train_scores, self.threshold_k, log_scale=self._log_scale)
        finite = train_scores[np.isfinite(train_scores)]
        self.score_median_ = float(np.median(finite)) if finite.size else 0.0

    def _score_z(self, z: Array) -> Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def score_samples(self, X: ArrayLike) -> Array:
        """Anomaly score per row: higher = more anomalous."""
        return self._score_z(self._z(X))

    def decision_function(self, X: ArrayLike) -> Array:
        """``score_samples(X) - threshold_``: > 0 = flagged (higher = more anomalous)."""
        return self.score_samples(X) - self.threshold_

    def predict(self, X: ArrayLike) -> NDArray[np.bool_]:
        """True where the row is flagged."""
        return scores_to_labels(self.score_samples(X), self.threshold_)

    def margin(self, scores: ArrayLike) -> Array:
        """Scores rescaled so the reference median is 0 and the threshold is 1 (used to
        combine detectors with different score scales)."""
        s = np.asarray(scores, dtype=np.float64)
        span = self.threshold_ - self.score_median_
        if not np.isfinite(span) or span <= 0:
            return np.where(s > self.threshold_, np.inf, 0.0)
        return (s - self.score_median_) / span

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


class RobustZScore(_Detector):
    """Per-feature robust z-score against the reference.

    Score = ``max_j |z_j|`` (``aggregate="max"``, default: one channel far off is enough,
    which is what a single misconfigured knob looks like) or the RMS of z
    (``aggregate="rms"``). Contributions: ``z_j²`` (their shares are the attribution)."""

    def __init__(self, aggregate: Literal["max", "rms"] = "max", standardize: bool = True,
                 floors: ArrayLike | None = None, threshold_k: float = 4.0) -> None:
        self.aggregate = aggregate
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k

    def fit(self, X: ArrayLike, y: object = None) -> RobustZScore:
        X = self._validate(X)
        if self.aggregate not in ("max", "rms"):
            raise ValueError(f"RobustZScore: aggregate must be 'max' or 'rms', not {self.aggregate!r}")
        z = self._fit_scaler(X)
        self._calibrate(self._score_z(z))
        return self

    def _score_z(self, z: Array) -> Array:
        if z.shape[1] == 0:
            return np.zeros(z.shape[0])
        if self.aggregate == "max":
            return np.asarray(np.abs(z).max(axis=1))
        return np.asarray(np.sqrt(np.mean(z * z, axis=1)))

    def contributions(self, X: ArrayLike) -> Array:
        """``z²`` per feature (attribution uses their shares)."""
        z = self._z(X)
        return z * z


class IsolationForestDetector(_Detector):
    """scikit-learn's IsolationForest on the standardised features.

    Score = ``-IsolationForest.score_samples`` = 2^(-E[path length]/c(n)) in (0, 1],
    higher = more anomalous (0.5 is "no structure"). Contributions are an
    approximation (IF has no exact decomposition): path credit × z². Path credit: for
    each tree, every feature split on along the row's path gets an equal share,
    averaged over the trees (the features the forest used to isolate the row); alone it
    is noisy, because random splits on unremarkable features sit on every path, so it
    is weighted by the feature's squared robust z (how far the row is from the
    reference on it). A feature never split on gets nothing."""

    def __init__(self, n_estimators: int = 50, max_samples: int | float | str = 256,
                 standardize: bool = True, floors: ArrayLike | None = None,
                 threshold_k: float = 4.0, random_state: int | None = None) -> None:
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state

    def fit(self, X: ArrayLike, y: object = None) -> IsolationForestDetector:
        X = self._validate(X)
        z = self._fit_scaler(X)
        ms = self.max_samples
        if isinstance(ms, int) and not isinstance(ms, bool):
            ms = min(ms, z.shape[0])
        self.forest_ = IsolationForest(n_estimators=self.n_estimators, max_samples=ms,
                                       random_state=self.random_state).fit(z)
        self._calibrate(self._score_z(z))
        return self

    def _score_z(self, z: Array) -> Array:
        return np.asarray(-self.forest_.score_samples(z))

    def contributions(self, X: ArrayLike) -> Array:
        """Path credit × z² per feature; each row sums to 1 (approximation, see class doc)."""
        z = self._z(X)
        n, p = z.shape
        out = np.zeros((n, p))
        if n == 0:
            return out
        for tree, feats in zip(self.forest_.estimators_, self.forest_.estimators_features_, strict=True):
            t = tree.tree_
            path = tree.decision_path(z[:, feats])  # csr (n, nodes)
            split_nodes = t.children_left >= 0
            node_feat = np.where(split_nodes, feats[np.maximum(t.feature, 0)], -1)
            rows, nodes = path.nonzero()
            keep = split_nodes[nodes]
            rows, nodes = rows[keep], nodes[keep]
            counts = np.bincount(rows, minlength=n).astype(np.float64)
            w = 1.0 / np.maximum(counts[rows], 1.0)
            np.add.at(out, (rows, node_feat[nodes]), w)
        out *= z * z
        total = out.sum(axis=1, keepdims=True)
        return np.asarray(np.divide(out, total, out=np.zeros_like(out), where=total > 0))


class MahalanobisDetector(_Detector):
    """Squared Mahalanobis distance of the standardised features from a robust centre.

    Features that do not vary in the reference ("constant channels": a power limit, a
    PCIe link width) enter with unit variance on their own (their standardised scale is
    the catalog floor), the varying ones through a covariance:

    * ``method="trimmed_lw"`` (default): keep the ``support_fraction`` of reference rows
      with the smallest RMS z, fit Ledoit-Wolf shrinkage covariance on them, then
      ``c_steps`` concentration steps (keep the rows with the smallest distance, refit),
      as in FAST-MCD. Well conditioned with ~200 features and few windows, and fast
      (about 0.1 s for 3600 x 350 on one core; at most ``max_fit_rows`` rows are used);
    * ``method="mcd"``: MinCovDet on at most ``max_fit_rows`` rows — the exact robust
      estimator, but far slower at 200 dimensions (see docs/analytics.md).

    Score = ``d² = (z-μ)ᵀ Σ⁻¹ (z-μ)``; contributions ``c_j = (z-μ)_j (Σ⁻¹(z-μ))_j`` sum
    exactly to d² (single terms can be negative when correlated features move against
    their usual correlation)."""

    def __init__(self, method: Literal["trimmed_lw", "mcd"] = "trimmed_lw", support_fraction: float = 0.6,
                 c_steps: int = 1, max_fit_rows: int = 2000, standardize: bool = True,
                 floors: ArrayLike | None = None, threshold_k: float = 4.0, random_state: int | None = None) -> None:
        self.method = method
        self.support_fraction = support_fraction
        self.c_steps = c_steps
        self.max_fit_rows = max_fit_rows
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state

    def fit(self, X: ArrayLike, y: object = None) -> MahalanobisDetector:
        X = self._validate(X)
        if self.method not in ("trimmed_lw", "mcd"):
            raise ValueError(f"MahalanobisDetector: method must be 'trimmed_lw' or 'mcd', not {self.method!r}")
        if not 0.0 < self.support_fraction <= 1.0:
            raise ValueError(f"MahalanobisDetector: support_fraction must be in (0, 1], not {self.support_fraction!r}")
        z = self._fit_scaler(X)
        n, p = z.shape
        rng = check_random_state(self.random_state)
        fit_rows = z if n <= self.max_fit_rows else z[np.sort(rng.choice(n, self.max_fit_rows, replace=False))]
        self.active_ = np.ptp(fit_rows, axis=0) > 1e-9 if n else np.zeros(p, dtype=bool)
        za = fit_rows[:, self.active_]
        q = za.shape[1]
        loc, prec = np.zeros(q), np.eye(q)
        if q and za.shape[0] > 2:
            if self.method == "mcd" and za.shape[0] > q + 1:
                mcd = MinCovDet(support_fraction=self.support_fraction, random_state=self.random_state).fit(za)
                loc, prec = mcd.location_, mcd.get_precision()
            else:
                h = max(2, int(np.ceil(self.support_fraction * za.shape[0])))
                dist = np.mean(za * za, axis=1)
                for _ in range(1 + max(0, self.c_steps)):
                    core = za[np.argsort(dist, kind="stable")[:h]]
                    lw = LedoitWolf(assume_centered=False).fit(core)
                    loc, prec = lw.location_, lw.get_precision()
                    d = za - loc
                    dist = np.einsum("ij,ij->i", d @ prec, d)
        self.location_ = np.zeros(p)
        self.location_[self.active_] = loc
        self.precision_ = prec
        self._calibrate(self._score_z(z))
        return self

    def _split(self, z: Array) -> tuple[Array, Array]:
        d = z - self.location_
        return d[:, self.active_], d[:, ~self.active_]

    def _score_z(self, z: Array) -> Array:
        da, di = self._split(z)
        return np.asarray(np.einsum("ij,ij->i", da @ self.precision_, da) + np.einsum("ij,ij->i", di, di))

    def contributions(self, X: ArrayLike) -> Array:
        """Exact decomposition of d²: ``c_j = d_j (Σ⁻¹ d)_j`` (``d_j²`` for the features
        constant in the reference); rows sum to the score."""
        z = self._z(X)
        da, di = self._split(z)
        out = np.empty_like(z)
        out[:, self.active_] = da * (da @ self.precision_)
        out[:, ~self.active_] = di * di
        return out


def standardizer(floors: ArrayLike | None = None) -> RobustStandardizer:
    """The shared standardiser (the pipeline fits it once per reference)."""
    return RobustStandardizer(floors=floors)
