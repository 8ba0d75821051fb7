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
(an Isolation Forest, score in (0, 1] as sklearn's -score_samples) and
:class:`MahalanobisDetector` (squared robust Mahalanobis distance; covariance by
Ledoit-Wolf on the trimmed central windows, or MinCovDet on a subsample). Each exposes
``contributions(X)`` for attribution (see :mod:`analytics.attribution`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn import get_config
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.covariance import MinCovDet, ledoit_wolf
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
    """Label-free threshold from reference scores (on the log scale when ``log_scale``;
    scores must then be positive), the lower of two robust rules:

    * ``median + k·1.4826·MAD``, iterated with clipping: scores above the threshold are
      set aside and median/MAD recomputed on the rest until stable. Right for skewed
      healthy scores; tolerates up to half of the reference being anomalous;
    * ``centre + (k + 2)·spread`` of the healthy part estimated from the low end of the
      scores (:func:`robust_center_spread`): anomalous windows only ever *raise* scores,
      so this one stays put while up to ~70 % of the reference is anomalous (several
      incidents in a short self history, every host of a small cohort with its own
      incident), where the first breaks. The extra 2 spreads keep it above the first on
      clean data, whose right tail a fit to the low end underestimates.

    The spread is floored (``min_spread`` on the log scale, i.e. ~5 %; relative to
    |median| on the linear scale) so identical reference scores do not give a threshold
    equal to them."""
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
    centre, spread = robust_center_spread(s, log_scale=False, min_spread=min_spread)
    if not log_scale:
        spread = max(spread, min_spread * max(abs(centre), 1.0))
    thr = min(thr, centre + (k + 2.0) * spread)
    return float(np.exp(thr)) if log_scale else thr


def gpd_pwm(excess: ArrayLike) -> tuple[float, float]:
    """(shape ξ, scale σ) of a generalised Pareto distribution fitted to positive
    exceedances by probability-weighted moments (Hosking & Wallis 1987): a closed form,
    no optimiser, stable on a few dozen points. ξ >= 1 (no finite mean) is returned as 1."""
    y = np.sort(np.asarray(excess, dtype=np.float64))
    n = y.size
    if n < 2:
        raise ValueError(f"gpd_pwm: need at least 2 exceedances, got {n}")
    a0 = float(y.mean())
    a1 = float(np.mean(y * (1.0 - (np.arange(1, n + 1) - 0.35) / n)))
    if a0 <= 2.0 * a1:
        return 1.0, a0
    k = a0 / (a0 - 2.0 * a1) - 2.0  # Hosking's k = -ξ
    return -k, 2.0 * a0 * a1 / (a0 - 2.0 * a1)


@dataclass(frozen=True)
class ThresholdRule:
    """How a detector turns its reference scores into a label-free threshold
    (``[analytics] threshold_rule``; text form in :meth:`parse`):

    * ``mad``: :func:`calibrate_threshold` with the detector's ``threshold_k``;
    * ``quantile:S``: an alert budget — the reference's ``1 - S`` quantile, i.e. about a
      share S of reference windows above it whatever the shape of their distribution
      (0.01 = about 14 minutes per host-day);
    * ``pot:L:R``: peaks over threshold — a generalised Pareto tail (:func:`gpd_pwm`)
      fitted to the (log) scores above their ``L`` quantile; the threshold is where the
      fitted tail's exceedance probability per window is ``R``;
    * ``tail:S:C``: the budget's quantile pushed out by the reference's own tail width —
      on the log scores, ``Q(1-S) + C·(Q(1-S) - median)``. A heavy-tailed reference (a
      few bursty metrics) moves it up in proportion; unlike ``pot`` it extrapolates no
      fitted shape, so one extreme reference window cannot move it (C = 0: ``quantile``);
    * ``either:S``: the lower of ``mad`` (the detector's k) and ``quantile:S`` — flag a
      window past either. ``mad`` holds where the reference holds many incidents, the
      budget where its tail is so heavy that k MADs lie above every incident. Note: a
      share S of reference-like windows is always above it (an alert *floor*, not a
      cap), so it needs run/persistence filtering before it can be quiet on live hosts."""

    kind: str = "mad"
    share: float = 0.01
    level: float = 0.98
    risk: float = 1e-4
    #: ``tail``: how many tail widths (Q(1-S) - median, log scale) above Q(1-S)
    width: float = 1.0

    @classmethod
    def parse(cls, text: str) -> ThresholdRule:
        parts = str(text).strip().split(":")
        try:
            if parts == ["mad"]:
                return cls()
            if parts[0] == "quantile" and len(parts) == 2:
                rule = cls("quantile", share=float(parts[1]))
            elif parts[0] == "pot" and len(parts) == 3:
                rule = cls("pot", level=float(parts[1]), risk=float(parts[2]))
            elif parts[0] == "tail" and len(parts) == 3:
                rule = cls("tail", share=float(parts[1]), width=float(parts[2]))
            elif parts[0] == "either" and len(parts) == 2:
                rule = cls("either", share=float(parts[1]))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"threshold rule {text!r}: use mad, quantile:SHARE, pot:LEVEL:RISK, "
                             "tail:SHARE:WIDTH or either:SHARE") from None
        if not (0.0 < rule.share < 1.0 and 0.0 < rule.level < 1.0 and 0.0 < rule.risk < 1.0):
            raise ValueError(f"threshold rule {text!r}: share, level and risk must be in (0, 1)")
        if not (math.isfinite(rule.width) and rule.width >= 0.0):
            raise ValueError(f"threshold rule {text!r}: width must be a number >= 0")
        return rule

    def __str__(self) -> str:
        return {"mad": "mad", "quantile": f"quantile:{self.share:g}",
                "pot": f"pot:{self.level:g}:{self.risk:g}",
                "tail": f"tail:{self.share:g}:{self.width:g}", "either": f"either:{self.share:g}"}[self.kind]

    def threshold(self, scores: ArrayLike, k: float = 4.0, *, log_scale: bool = True) -> float:
        """The threshold of reference ``scores`` (non-finite ignored; none: +inf)."""
        s = np.asarray(scores, dtype=np.float64)
        s = s[np.isfinite(s)]
        if s.size == 0:
            return float("inf")
        if self.kind == "mad":
            return calibrate_threshold(s, k, log_scale=log_scale)
        if self.kind == "quantile":
            return float(np.quantile(s, 1.0 - self.share))
        if self.kind == "either":
            return min(calibrate_threshold(s, k, log_scale=log_scale), float(np.quantile(s, 1.0 - self.share)))
        ls = np.log(np.maximum(s, _TINY)) if log_scale else s
        if self.kind == "tail":
            q, med = np.quantile(ls, [1.0 - self.share, 0.5])
            thr = float(q + self.width * (q - med))
            return float(np.exp(thr)) if log_scale else thr
        t = float(np.quantile(ls, self.level))
        exc = ls[ls > t] - t
        if exc.size < 10:  # too few to fit a tail: the largest reference score
            thr = float(ls.max())
        else:
            xi, sigma = gpd_pwm(exc)
            ratio = self.risk * ls.size / exc.size
            thr = t + (sigma / xi * (ratio ** (-xi) - 1.0) if abs(xi) > 1e-9 else -sigma * math.log(ratio))
        return float(np.exp(thr)) if log_scale else thr


#: standard-normal quantiles used by robust_center_spread
_Z05, _Z30 = -1.6448536, -0.5244005


def robust_center_spread(scores: ArrayLike, *, log_scale: bool = True,
                         min_spread: float = 0.05) -> tuple[float, float]:
    """(centre, spread) of the healthy scores from the 5th and 30th percentiles (of the
    log scores when ``log_scale``): spread = (q30 - q05) / 1.12, centre = q30 + 0.52 ·
    spread, the mean and standard deviation of a normal distribution with those
    quantiles. Unmoved by anomalous windows as long as they are above the 30th
    percentile. Finite input with at least one value."""
    s = np.asarray(scores, dtype=np.float64)
    if log_scale:
        s = np.log(np.maximum(s, _TINY))
    q05, q30 = np.quantile(s, [0.05, 0.30])
    spread = max(float(q30 - q05) / (_Z30 - _Z05), min_spread if log_scale else 0.0)
    return float(q30) - _Z30 * spread, spread


class RepeatedRows:
    """A tall matrix stored as the rows it repeats: ``X = rows[index]``, every row of
    ``rows`` used at least once. The pipeline's detection matrix is one: its smoothed
    features change once per 10-s block while windows start every second, so about nine
    rows of ten are repeats. The detectors accept it wherever they accept a matrix and
    fit and score ``rows`` with their multiplicities: the results of ``X`` (row order
    included: samples are drawn from the positions of ``X``) at a fraction of the cost.
    Results equal those of the dense matrix up to rounding (weighted sums, matrix
    products over fewer rows)."""

    __slots__ = ("rows", "index", "_identity")

    def __init__(self, rows: ArrayLike, index: ArrayLike | None = None) -> None:
        self.rows: NDArray[Any] = np.asarray(rows)
        if index is None:
            self.index = np.arange(self.rows.shape[0] if self.rows.ndim else 0, dtype=np.intp)
            self._identity = True
        else:
            self.index = np.asarray(index, dtype=np.intp)
            self._identity = self.index.size == self.rows.shape[0] and bool(
                (self.index == np.arange(self.index.size)).all())

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.index.size), int(self.rows.shape[1]))

    def weights(self) -> NDArray[np.int64] | None:
        """How many rows of ``X`` each of ``rows`` stands for; None when each stands for one."""
        if self._identity or self.index.size == self.rows.shape[0]:
            return None
        return np.bincount(self.index, minlength=self.rows.shape[0])

    def take(self, positions: ArrayLike) -> RepeatedRows:
        """``X[positions]`` (rows no longer used are dropped)."""
        sel = self.index[np.asarray(positions, dtype=np.intp)]
        if sel.size and np.all(sel[1:] > sel[:-1]):  # increasing: each row once, in order
            return RepeatedRows(self.rows[sel])
        used, inverse = np.unique(sel, return_inverse=True)
        return RepeatedRows(self.rows[used], inverse)

    def gather(self, positions: ArrayLike) -> NDArray[Any]:
        """``X[positions]`` as a dense array."""
        return np.asarray(self.rows[self.index[np.asarray(positions, dtype=np.intp)]])

    def dense(self) -> NDArray[Any]:
        return self.rows if self._identity else np.asarray(self.rows[self.index])

    def expand(self, values: NDArray[Any]) -> NDArray[Any]:
        """Per-row values of ``rows`` as values per row of ``X``."""
        return values if self._identity else np.asarray(values[self.index])

    def with_rows(self, rows: ArrayLike) -> RepeatedRows:
        """The same repetition of other rows (a row-wise transform of ``rows``)."""
        out = RepeatedRows.__new__(RepeatedRows)
        out.rows, out.index, out._identity = np.asarray(rows), self.index, self._identity
        return out


def _valid_rows(rows: object, n_features: int | None = None) -> bool:
    """Whether the rows of a :class:`RepeatedRows` (the pipeline's own matrices, never a
    user's input) pass ``validate_data`` unchanged: a float64 matrix with at least one row
    and column (``n_features`` of them, if given) and no infinite value (not looked for
    under ``assume_finite``). Their validation is then skipped: it reads them in one
    vectorised check, but costs ~0.1 ms of Python per call (dataframe detection, feature
    names), and a sweep fits and scores such matrices several times per host and step."""
    return (type(rows) is np.ndarray and rows.ndim == 2 and rows.dtype == np.float64 and min(rows.shape) > 0
            and (n_features is None or rows.shape[1] == n_features)
            and (get_config()["assume_finite"] or not np.isinf(rows).any()))


def _validated(estimator: BaseEstimator, X: ArrayLike | RepeatedRows, **checks: Any) -> RepeatedRows:
    """``validate_data`` (resetting the estimator's input checks: a fit) of a matrix or of
    the rows of a :class:`RepeatedRows`, as float64 with NaN allowed."""
    kw: dict[str, Any] = {"ensure_all_finite": "allow-nan", "dtype": np.float64, **checks}
    if isinstance(X, RepeatedRows):  # (every row is used: as many rows as X has, at least one)
        if _valid_rows(X.rows):  # what validate_data would set, and the same rows
            estimator.n_features_in_ = X.rows.shape[1]
            if hasattr(estimator, "feature_names_in_"):
                del estimator.feature_names_in_
            return X
        return X.with_rows(np.asarray(validate_data(estimator, X.rows, **kw)))
    return RepeatedRows(np.asarray(validate_data(estimator, X, **kw)))


#: rows used for the per-feature median/MAD/std: above it a deterministic every-k-th
#: thinning (the sorts dominate the cost). The median of 1024 independent rows is
#: within ~0.04 sigma of the full one, and a sweep's rows are not independent: an hour of
#: one host's 3-s windows, a new one every second, holds ~1 200 disjoint windows, and the
#: detectors' smoothed rows change once per 10-s block (~360 distinct values an hour)
STATS_MAX_ROWS = 1024


def _thin(X: RepeatedRows, limit: int = STATS_MAX_ROWS) -> RepeatedRows:
    n = X.shape[0]
    return X if n <= limit else X.take(np.linspace(0, n - 1, limit).astype(np.int64))


def _median_rows(A: NDArray[np.floating[Any]]) -> Array:
    """Row medians of a C-ordered (columns x values) array, sorted IN PLACE (each row
    keeps its values, reordered). numpy's vectorised sort beats its selection here:
    a feature's values are full of ties (a counter that rarely moves, a few levels),
    which slow the partition's pivoting (2.5x on a live cycle's references), not the
    sort. Contiguous rows sort several times faster than strided columns."""
    n = A.shape[1]
    k = n // 2
    A.sort(axis=1)
    if n % 2:
        return np.asarray(A[:, k], dtype=np.float64)
    return (A[:, k - 1].astype(np.float64) + A[:, k].astype(np.float64)) / 2.0


def _nan_median_rows(A: NDArray[np.float64]) -> Array:
    """Row medians of a C-ordered (columns x values) float64 array over its non-NaN values
    (NaN for a row without one), sorted IN PLACE: ``np.nanmedian`` of each row, bit for
    bit (the middle value, or the two middle values' sum halved), at a fraction of its
    cost (it masks, or goes column by column, where one sort puts the NaN last)."""
    if not A.shape[1]:
        return np.full(A.shape[0], np.nan)
    A.sort(axis=1)
    count = A.shape[1] - np.isnan(A).sum(axis=1)
    lo = np.take_along_axis(A, np.maximum(count - 1, 0)[:, None] // 2, axis=1)[:, 0]
    hi = np.take_along_axis(A, (count // 2)[:, None], axis=1)[:, 0]  # (count // 2 < columns)
    with np.errstate(over="ignore"):
        return np.asarray(np.where(count == 0, np.nan, np.where(count % 2 == 1, lo, (lo + hi) / 2.0)))


def _weighted_std(U: NDArray[np.floating[Any]], counts: NDArray[np.int64]) -> Array:
    """Column standard deviations (ddof 0) of the rows of ``U``, row j counted ``counts[j]``
    times, NaN ignored (with unit counts and no NaN, exactly ``U.std(axis=0)``)."""
    w = np.where(np.isnan(U), 0.0, counts[:, None].astype(np.float64))
    x = np.where(w > 0, U, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = w.sum(axis=0)
        mean = (w * x).sum(axis=0) / total
        return np.asarray(np.sqrt((w * (x - mean) ** 2).sum(axis=0) / total))


def _robust_stats(X: RepeatedRows, finite: NDArray[np.bool_]) -> tuple[Array, Array, Array]:
    """Per-column median, MAD and std over the finite values (``finite``: of ``X.rows``)
    of at most ``STATS_MAX_ROWS`` evenly spaced rows of ``X`` (each column by one in-place
    sort, complete columns in float32: np.nanmedian is several times slower). The distinct rows
    are transposed, then repeated (a transposed copy of the tall matrix costs several
    times more); the std weighs the distinct rows by their counts."""
    p = X.rows.shape[1]
    med, mad, std = np.empty(p), np.empty(p), np.empty(p)
    full = finite.all(axis=0)
    T = _thin(X)
    w = T.weights()  # None: each distinct row once (a median is of the multiset: order aside)
    counts = np.ones(T.rows.shape[0], dtype=np.int64) if w is None else w
    if full.any():
        U = T.rows if full.all() else T.rows[:, full]
        # float32 columns as rows, sorted in place: the median reorders each row, which
        # leaves the multiset of |x - median| (the MAD's input) as it was
        rows = np.array(U.T, dtype=np.float32, order="C")
        # a column that never changes (a power limit, a link width: half of a live
        # cycle's references) has its value as median and a MAD of 0: only the others are sorted
        const = rows.min(axis=1) == rows.max(axis=1)
        meds, mads = rows[:, 0].astype(np.float64), np.zeros(rows.shape[0])
        if not const.all():
            moving = rows if not const.any() else rows[~const]
            if w is not None:
                moving = moving.take(T.index, axis=1)
            meds[~const] = m = _median_rows(moving)
            np.subtract(moving, m.astype(np.float32)[:, None], out=moving)
            mads[~const] = _median_rows(np.abs(moving, out=moving))
        med[full], mad[full] = meds, mads
        # (one pass when each row counts once: the same values as the weighted form)
        std[full] = U.std(axis=0) if w is None else _weighted_std(U, counts)
    if (~full).any():
        Up = T.rows[:, ~full]
        Up = np.where(np.isfinite(Up), Up, np.nan)
        cols = np.array((Up if w is None else Up[T.index]).T, order="C")  # (columns as rows)
        med[~full] = m = _nan_median_rows(cols)
        with np.errstate(invalid="ignore"):
            np.subtract(cols, m[:, None], out=cols)
        mad[~full] = _nan_median_rows(np.abs(cols, out=cols))
        std[~full] = _weighted_std(Up, counts)
    return med, mad, std


class RobustStandardizer(TransformerMixin, BaseEstimator):
    """Median / robust-scale standardisation shared by every detector and the pipeline.

    ``floors``: per-feature lower bounds of the scale (from the catalog), or None."""

    def __init__(self, floors: ArrayLike | None = None, std_frac: float = 0.1, rel_floor: float = 1e-3) -> None:
        self.floors = floors
        self.std_frac = std_frac
        self.rel_floor = rel_floor

    def fit(self, X: ArrayLike | RepeatedRows, y: object = None) -> RobustStandardizer:
        R = _validated(self, X)
        if self.std_frac < 0 or self.rel_floor < 0:
            raise ValueError("RobustStandardizer: std_frac and rel_floor must be >= 0")
        p = R.shape[1]
        floors: Array = np.zeros(p) if self.floors is None else np.asarray(self.floors, dtype=np.float64)
        if floors.shape != (p,):
            raise ValueError(f"RobustStandardizer: floors has shape {floors.shape}, expected ({p},)")
        finite = np.isfinite(R.rows)
        self.in_use_ = finite.any(axis=0)
        med, mad, std = (_robust_stats(R, finite) if self.in_use_.all()  # (no copy of the matrix)
                         else _robust_stats(R.with_rows(R.rows[:, self.in_use_]), finite[:, self.in_use_]))
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

    def transform_rows(self, X: RepeatedRows) -> RepeatedRows:
        """:meth:`transform` of a matrix of repeated rows (row-wise: its rows only)."""
        if _valid_rows(X.rows, getattr(self, "n_features_in_", None)):
            check_is_fitted(self)
            return X.with_rows(self._standardised(X.rows))
        return X.with_rows(self.transform(X.rows))

    def transform(self, X: ArrayLike) -> Array:
        """z-scores; missing values and features unused in the reference give 0."""
        check_is_fitted(self)
        return self._standardised(
            np.asarray(validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64)))

    def _standardised(self, X: NDArray[np.float64]) -> Array:
        with np.errstate(invalid="ignore", over="ignore"):
            z = np.subtract(X, self.center_)
            np.divide(z, self.scale_, out=z)
        if not self.in_use_.all():
            z[:, ~self.in_use_] = 0.0
        np.copyto(z, 0.0, where=~np.isfinite(z))
        return np.asarray(z)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


def _finite(X: Array) -> Array:
    """X with non-finite values as 0; X itself (no copy) when it is all finite, as the
    pipeline's standardised evidence is (callers only read the result)."""
    X = np.asarray(X, dtype=np.float64)
    bad = ~np.isfinite(X)
    if not bad.any():
        return X
    z = X.copy()
    z[bad] = 0.0
    return z


class _Detector(BaseEstimator):
    """Common machinery: standardise (or take z-scores as given), fit, calibrate."""

    #: calibration on the log scale (positive scores)
    _log_scale = True

    standardize: bool
    floors: ArrayLike | None
    threshold_k: float
    #: the label-free threshold rule (:class:`ThresholdRule`, text form); a constructor
    #: parameter of the detectors that take one, "mad" for the others
    threshold_rule: str = "mad"
    scaler_: RobustStandardizer | None

    def _fit_scaler_rows(self, X: RepeatedRows) -> RepeatedRows:
        """The standardised matrix to fit on (the scaler fitted on it), or the given
        z-scores with non-finite values as 0 (``standardize=False``)."""
        if self.standardize:
            self.scaler_ = RobustStandardizer(floors=self.floors).fit(X)
            return self.scaler_.transform_rows(X)
        self.scaler_ = None
        return X.with_rows(_finite(X.rows))

    def _z(self, X: ArrayLike) -> Array:
        check_is_fitted(self)
        X = np.asarray(validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64))
        if self.scaler_ is not None:
            return self.scaler_.transform(X)
        return _finite(X)

    def _validate_rows(self, X: ArrayLike | RepeatedRows) -> RepeatedRows:
        R = _validated(self, X, ensure_min_samples=1)
        if not (np.isfinite(self.threshold_k) and self.threshold_k > 0):
            raise ValueError(f"{type(self).__name__}: threshold_k must be a positive number, not {self.threshold_k!r}")
        ThresholdRule.parse(self.threshold_rule)
        return R

    #: the smallest threshold that makes sense for the score whatever the reference
    #: (a reference with almost no spread would otherwise flag the slightest wobble)
    _min_threshold = -np.inf
    #: the cap the pipeline sets (``max_threshold``) on telemetry with catalog floors: a
    #: score above it is anomalous whatever the reference says (a short self history made
    #: mostly of start-up and incidents must not hide a big step). Not on imported
    #: metrics, whose scales have no floor.
    _cap = np.inf

    def _calibrate(self, train_scores: Array) -> None:
        self.reference_scores_ = train_scores
        rule = ThresholdRule.parse(self.threshold_rule)
        self.threshold_ = self._bounded(rule.threshold(train_scores, self.threshold_k, log_scale=self._log_scale))
        finite = train_scores[np.isfinite(train_scores)]
        self.score_median_ = float(np.median(finite)) if finite.size else 0.0

    def _bounded(self, threshold: float) -> float:
        thr = max(threshold, self._min_threshold)
        cap = getattr(self, "max_threshold", None)
        if cap is not None:
            thr = min(thr, max(float(cap), self._min_threshold))
        return float(thr)

    def _score_z(self, z: Array) -> Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def _score_rows(self, z: RepeatedRows) -> Array:
        """Scores of every row of a matrix of repeated rows (each distinct row scored once)."""
        return z.expand(self._score_z(z.rows))

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
        return margin(scores, self.score_median_, self.threshold_)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


def margin(scores: ArrayLike, median: float, threshold: float) -> Array:
    """``scores`` rescaled so ``median`` is 0 and ``threshold`` is 1. A degenerate reference
    (threshold not above its median) gives +inf above the threshold and 0 elsewhere."""
    s = np.asarray(scores, dtype=np.float64)
    span = threshold - median
    if not np.isfinite(span) or span <= 0:
        return np.where(s > threshold, np.inf, 0.0)
    return (s - median) / span


class RobustZScore(_Detector):
    """Per-feature robust z-score against the reference.

    Score = ``max_j |z_j|`` (``aggregate="max"``, default: one channel far off is enough,
    never flagged below 3 robust scales, and always above ``max_threshold`` when set (the
    pipeline sets 8 on telemetry, whose scales the catalog floors);
    which is what a single misconfigured knob looks like) or the RMS of z
    (``aggregate="rms"``). Contributions: ``z_j²`` (their shares are the attribution)."""

    _min_threshold = 3.0
    _cap = 8.0

    def __init__(self, aggregate: Literal["max", "rms"] = "max", standardize: bool = True,
                 floors: ArrayLike | None = None, threshold_k: float = 4.0,
                 max_threshold: float | None = None, threshold_rule: str = "mad") -> None:
        self.aggregate = aggregate
        self.threshold_rule = threshold_rule
        self.max_threshold = max_threshold
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k

    def fit(self, X: ArrayLike | RepeatedRows, y: object = None) -> RobustZScore:
        R = self._validate_rows(X)
        if self.aggregate not in ("max", "rms"):
            raise ValueError(f"RobustZScore: aggregate must be 'max' or 'rms', not {self.aggregate!r}")
        self._calibrate(self._score_rows(self._fit_scaler_rows(R)))
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


def average_path_length(n: ArrayLike) -> Array:
    """c(n): mean path length of an unsuccessful BST search among n points, the
    isolation-depth normaliser of Liu et al. (2008); c(1) = 0, c(2) = 1."""
    n = np.asarray(n, dtype=np.float64)
    out = np.zeros_like(n)
    out[n == 2] = 1.0
    big = n > 2
    nb = n[big]
    out[big] = 2.0 * (np.log(nb - 1.0) + np.euler_gamma) - 2.0 * (nb - 1.0) / nb
    return out


class IsolationForestDetector(_Detector):
    """Isolation Forest (Liu, Ting & Zhou 2008) on the standardised features.

    Score = 2^(-E[h(x)]/c(ψ)) in (0, 1], higher = more anomalous (0.5 = "no structure"),
    the same quantity as ``-sklearn.ensemble.IsolationForest.score_samples`` and the
    same kind of forest (ψ = ``max_samples`` rows per tree drawn without replacement,
    random feature, uniform random threshold between the node's min and max, depth
    limit ceil(log2 ψ), leaf depth corrected by c(leaf size)), grown level by level for
    all trees at once, every row routed by a vectorised walk of all trees (scikit-learn's
    per-tree Python costs about twice as much per fit; the tests hold it as the
    reference). A node draws ``n_candidates`` random features and splits on the first
    that is not constant in it (scikit-learn keeps drawing; with many constant
    channels a node rarely runs out of candidates).

    Contributions are an approximation (IF has no exact decomposition): path credit ×
    z². Path credit: for each tree, every feature split on along the row's path gets an
    equal share, averaged over the trees (the features the forest used to isolate the
    row); alone it is noisy, because random splits on unremarkable features sit on
    every path, so it is weighted by the feature's squared robust z (how far the row is
    from the reference on it). A feature never split on gets nothing."""

    def __init__(self, n_estimators: int = 50, max_samples: int | float | str = 256,
                 standardize: bool = True, floors: ArrayLike | None = None,
                 threshold_k: float = 4.0, random_state: int | None = None, n_candidates: int = 4,
                 threshold_rule: str = "mad") -> None:
        self.n_estimators = n_estimators
        self.threshold_rule = threshold_rule
        self.max_samples = max_samples
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state
        self.n_candidates = n_candidates

    def _psi(self, n: int) -> int:
        ms = self.max_samples
        if isinstance(ms, str):
            if ms != "auto":
                raise ValueError(f"IsolationForestDetector: max_samples must be an int, a fraction or 'auto', not {ms!r}")
            return min(256, n)
        if isinstance(ms, float) and not isinstance(ms, bool):
            if not 0.0 < ms <= 1.0:
                raise ValueError(f"IsolationForestDetector: a fractional max_samples must be in (0, 1], not {ms!r}")
            return max(1, int(ms * n))
        if not (isinstance(ms, int | np.integer) and not isinstance(ms, bool) and ms >= 1):
            raise ValueError(f"IsolationForestDetector: max_samples must be a positive int, not {ms!r}")
        return min(int(ms), n)

    def fit(self, X: ArrayLike | RepeatedRows, y: object = None) -> IsolationForestDetector:
        R = self._validate_rows(X)
        if not (isinstance(self.n_estimators, int | np.integer) and self.n_estimators >= 1):
            raise ValueError(f"IsolationForestDetector: n_estimators must be a positive int, not {self.n_estimators!r}")
        if not (isinstance(self.n_candidates, int | np.integer) and self.n_candidates >= 1):
            raise ValueError(f"IsolationForestDetector: n_candidates must be a positive int, not {self.n_candidates!r}")
        z = self._fit_scaler_rows(R)
        self._grow(z, self._psi(z.shape[0]), check_random_state(self.random_state))
        self._calibrate(self._score_rows(z))
        return self

    def _grow(self, z: RepeatedRows, psi: int, rng: np.random.RandomState) -> None:
        """Grow every tree at once, level by level. Trees are complete binary trees in
        array layout (children of node i: 2i+1, 2i+2); ``feature_ = -1`` marks a leaf.
        Samples are drawn among the rows of the full matrix, values read from its
        distinct rows: a tree walks each distinct row of its sample once, with the number
        of samples it stands for (a node's range and split do not depend on repeats, only
        its sample count does; most windows repeat their 10-s block's row, so a tree's 256
        samples are ~190 rows over an hour of reference, fewer over a shorter one)."""
        n, p = z.shape
        T, K = int(self.n_estimators), int(self.n_candidates)
        depth = max(1, int(np.ceil(np.log2(max(psi, 2)))))
        N = 2 ** (depth + 1) - 1
        usable = np.flatnonzero(np.ptp(z.rows, axis=0) > 0) if n else np.zeros(0, dtype=np.int64)
        zf = np.ascontiguousarray(z.rows).ravel()
        feature = np.full((T, N), -1, dtype=np.int64)
        threshold = np.zeros((T, N))
        if psi < n:
            drawn = np.argpartition(rng.random_sample((T, n)), psi - 1, axis=1)[:, :psi]
        else:
            drawn = np.tile(np.arange(n), (T, 1))
        drawn = np.sort(z.index[drawn], axis=1)  # positions in the matrix -> its distinct rows
        first = np.ones(drawn.shape, dtype=bool)
        first[:, 1:] = drawn[:, 1:] != drawn[:, :-1]
        at = np.flatnonzero(first)  # (tree, distinct row) pairs, tree by tree
        count = np.diff(np.append(at, drawn.size)).astype(np.float64)
        tree, sample = at // drawn.shape[1], drawn.ravel()[at]
        node = np.zeros(at.size, dtype=np.int64)
        active = np.ones(at.size, dtype=bool)
        for d in range(depth):
            if not usable.size or not active.any():
                break
            lo = 2**d - 1
            width = 2**d
            t_a, n_a, s_a = tree[active], node[active], sample[active]
            slot = t_a * width + (n_a - lo)  # (tree, node of this level)
            size = np.bincount(slot, weights=count[active], minlength=T * width)
            cand = usable[rng.randint(0, usable.size, size=(T * width, K))]
            vals = zf.take(s_a[:, None] * p + cand.take(slot, axis=0))  # (active samples, K)
            flat = (slot[:, None] * K + np.arange(K)).ravel()
            mn = np.full(T * width * K, np.inf)
            mx = np.full(T * width * K, -np.inf)
            np.minimum.at(mn, flat, vals.ravel())
            np.maximum.at(mx, flat, vals.ravel())
            mn, mx = mn.reshape(-1, K), mx.reshape(-1, K)
            ok = (mx > mn) & (size > 1)[:, None]
            split: NDArray[np.bool_] = np.asarray(ok.any(axis=1))
            k = ok.argmax(axis=1)
            rows = np.arange(T * width)
            lo_v, hi_v = mn[rows, k], mx[rows, k]
            with np.errstate(invalid="ignore"):  # nodes without samples: inf - inf, never used
                thr = lo_v + rng.random_sample(T * width) * (hi_v - lo_v)
                thr = np.where(thr >= hi_v, lo_v, thr)  # keep both children non-empty
            t_s, n_s = np.divmod(np.flatnonzero(split), width)
            feature[t_s, lo + n_s] = cand[split, k[split]]
            threshold[t_s, lo + n_s] = thr[split]
            # samples of split nodes move down; the others sit in leaves for good
            go = split[slot]
            right = vals[np.arange(slot.size), k[slot]] > thr[slot]
            moved = np.where(go, 2 * n_a + 1 + right, n_a)
            node[active] = moved
            still = active.copy()
            still[active] = go
            active = still
        leaf_size = np.zeros((T, N))
        np.add.at(leaf_size, (tree, node), count)
        self.n_features_in_tree_ = p
        self.feature_ = feature
        self.threshold_tree_ = threshold
        self.depth_ = depth
        # depth of each node + c(samples that ended there): the path length of a leaf
        level = np.floor(np.log2(np.arange(N) + 1.0))
        self.leaf_path_ = level[None, :] + average_path_length(leaf_size)
        self.c_psi_ = float(average_path_length(np.array([psi]))[0])

    def _leaves(self, z: Array, met: NDArray[np.int64] | None = None) -> NDArray[np.int64]:
        """The leaf of every (tree, row) as a flat node index (tree * nodes + node), and in
        ``met`` (levels, trees, rows; optional) the feature split on at each level of the
        path (-1: at a leaf). Leaves route to themselves (threshold +inf: never right),
        so every level is the same four gathers. Rows go in blocks of ``_LEAF_BLOCK``,
        whose values stay in cache while every tree reads them."""
        T, N = self.feature_.shape
        n, p = z.shape
        inner = self.feature_.ravel() >= 0
        flat = np.arange(T * N, dtype=np.int64)
        feat = np.where(inner, self.feature_.ravel(), 0)
        thr = np.where(inner, self.threshold_tree_.ravel(), np.inf)
        left = np.where(inner, flat + flat % N + 1, flat)  # tree * N + 2 * node + 1
        roots = (np.arange(T, dtype=np.int64) * N)[:, None]
        z = np.ascontiguousarray(z)
        out = np.repeat(roots, n, axis=1)
        for lo in range(0, n if inner.any() else 0, _LEAF_BLOCK):
            zf = z[lo:lo + _LEAF_BLOCK].ravel()
            m = zf.size // p
            row_off = (np.arange(m, dtype=np.int64) * p)[None, :]
            g = out[:, lo:lo + m]
            for d in range(self.depth_):
                if met is not None:
                    met[d, :, lo:lo + m] = np.where(inner.take(g), feat.take(g), -1)
                right = zf.take(row_off + feat.take(g)) > thr.take(g)
                g = left.take(g) + right
            out[:, lo:lo + m] = g
        return out

    def _score_z(self, z: Array) -> Array:
        if z.shape[0] == 0:
            return np.zeros(0)
        path = self.leaf_path_.ravel().take(self._leaves(z)).mean(axis=0)
        if self.c_psi_ <= 0:
            return np.full(z.shape[0], 0.5)
        return np.asarray(2.0 ** (-path / self.c_psi_))

    def contributions(self, X: ArrayLike) -> Array:
        """Path credit × z² per feature; each row sums to 1 (approximation, see class doc)."""
        z = self._z(X)
        n, p = z.shape
        out = np.zeros((n, p))
        if n == 0:
            return out
        f = np.full((self.depth_, *self.feature_.shape[:1], n), -1, dtype=np.int64)  # (levels, trees, rows)
        self._leaves(z, f)
        steps = (f >= 0).sum(axis=0, keepdims=True)
        w = np.where(f >= 0, 1.0 / np.maximum(steps, 1), 0.0)
        rows = np.broadcast_to(np.arange(n), f.shape)
        np.add.at(out, (rows.ravel(), np.maximum(f, 0).ravel()), w.ravel())
        out *= z * z
        total = out.sum(axis=1, keepdims=True)
        return np.asarray(np.divide(out, total, out=np.zeros_like(out), where=total > 0))


#: rows per block of the Isolation Forest's walk (512 rows x 350 features: ~1.4 MB)
_LEAF_BLOCK = 512


def _ledoit_wolf_cov(X: NDArray[np.floating[Any]], weights: NDArray[np.int64] | None = None) -> Array:
    """``sklearn.covariance.ledoit_wolf(X, assume_centered=True)[0]``, bit for bit, with
    its Gram matrix ``X.T @ X`` computed once (sklearn computes it for the shrinkage and
    again for the covariance) and without its per-call validation. Like
    ``LedoitWolf.fit`` (which subtracts a float64 zero location), it works in float64.
    With ``weights``, row i stands for ``weights[i]`` rows (every sum of the estimator is
    a sum over rows: the same estimate up to rounding)."""
    X = np.asarray(X, dtype=np.float64)
    if weights is not None:
        n, p = int(weights.sum()), X.shape[1]
        if p == 1 or p >= 1000:
            return _ledoit_wolf_cov(np.repeat(X, weights, axis=0))
        w = weights.astype(np.float64)[:, None]
    else:
        n, p = X.shape
        w = None
    if p == 1:
        return np.atleast_2d((X**2).mean())
    if p >= 1000:  # sklearn sums the Gram matrix in blocks there: let it
        return np.asarray(ledoit_wolf(X, assume_centered=True)[0], dtype=np.float64)
    X2 = X**2
    trace = np.sum(X2 if w is None else w * X2, axis=0) / n
    mu = np.sum(trace) / p
    gram = np.dot(X.T, X if w is None else w * X)
    delta_ = 0.0 + np.sum(gram**2)
    delta_ /= n**2
    beta_ = 0.0 + np.sum(np.dot(X2.T, X2 if w is None else w * X2))
    beta = 1.0 / (p * n) * (beta_ / n - delta_)
    delta = delta_ - 2.0 * mu * trace.sum() + p * mu**2
    delta /= p
    beta = min(beta, delta)
    shrinkage = 0 if beta == 0 else beta / delta
    emp_cov = gram / n
    mu = np.sum(np.trace(emp_cov)) / p
    cov = (1.0 - shrinkage) * emp_cov
    cov.flat[:: p + 1] += shrinkage * mu
    return np.asarray(cov, dtype=np.float64)


def _spd_inverse(cov: Array) -> Array:
    """Inverse of a shrunk (hence positive definite) covariance by Cholesky; the
    pseudo-inverse only if it is numerically singular. (LedoitWolf.get_precision uses
    an eigendecomposition: 5x slower at 350 dimensions.)"""
    try:
        c = np.linalg.cholesky(cov)
        ci = np.linalg.inv(c)
        return np.asarray(ci.T @ ci)
    except np.linalg.LinAlgError:
        return np.asarray(np.linalg.pinv(cov, hermitian=True))


def _shrunk_precision(X: NDArray[np.floating[Any]], weights: NDArray[np.int64] | None, min_variance: float) -> Array:
    """Inverse of the Ledoit-Wolf covariance of ``X`` (:func:`_ledoit_wolf_cov`) with its
    variances raised to ``min_variance``. That covariance is ``U Uᵀ + D``: the scaled Gram
    matrix of the k (distinct) rows plus a positive diagonal (the shrinkage target and
    the raised variances); with fewer rows than half the features (a cohort's peers in
    one analysis step: ~40 rows, ~300 features) it is inverted by the Woodbury identity,
    O(p² k) instead of the O(p³) of a Cholesky factorisation; otherwise (or when the
    diagonal is not positive) as before."""
    cov = None
    k, p = X.shape
    if 1 < p < 1000 and 2 * k < p:
        X64 = np.asarray(X, dtype=np.float64)
        w = np.ones(k) if weights is None else weights.astype(np.float64)
        n = float(w.sum())
        X2 = X64**2
        trace = (w @ X2) / n  # the covariance's diagonal before shrinkage
        mu = float(trace.sum()) / p
        # the shrinkage as _ledoit_wolf_cov computes it, its sums over p x p products taken
        # over k x k ones: sum(gram²) = Σ_ij w_i w_j (x_i·x_j)², sum(X2ᵀ W X2) = Σ_i w_i |x_i|⁴
        G = X64 @ X64.T
        delta_ = float(w @ (G * G) @ w) / n**2
        beta_ = float(w @ X2.sum(axis=1) ** 2)
        beta = 1.0 / (p * n) * (beta_ / n - delta_)
        delta = (delta_ - 2.0 * mu * trace.sum() + p * mu**2) / p
        beta = min(beta, delta)
        shrinkage = 0 if beta == 0 else beta / delta
        diag = (1.0 - shrinkage) * trace + shrinkage * mu
        d = shrinkage * mu + np.maximum(diag, min_variance) - diag
        if np.all(d > 0) and np.all(np.isfinite(d)):
            U = X64.T * np.sqrt((1.0 - shrinkage) * w / n)  # p x k
            A = U / d[:, None]
            M = np.eye(k) + U.T @ A
            try:
                out = -A @ np.linalg.solve(M, A.T)
                out.flat[:: p + 1] += 1.0 / d
                return np.asarray(out)
            except np.linalg.LinAlgError:
                pass
    cov = _ledoit_wolf_cov(X, weights)
    np.fill_diagonal(cov, np.maximum(np.diag(cov), min_variance))
    return _spd_inverse(cov)


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

    Score = ``d² = (z-μ)ᵀ Σ⁻¹ (z-μ)`` (never flagged below 9, one feature 3 scales off;
    always above ``max_threshold`` when set: the pipeline sets 64 on telemetry);
    contributions ``c_j = (z-μ)_j (Σ⁻¹(z-μ))_j`` sum
    exactly to d² (single terms can be negative when correlated features move against
    their usual correlation)."""

    _min_threshold = 9.0
    _cap = 64.0

    def __init__(self, method: Literal["trimmed_lw", "mcd"] = "trimmed_lw", support_fraction: float = 0.6,
                 c_steps: int = 1, max_fit_rows: int = 2000, standardize: bool = True,
                 floors: ArrayLike | None = None, threshold_k: float = 4.0, random_state: int | None = None,
                 min_variance: float = 0.25, max_threshold: float | None = None,
                 threshold_rule: str = "mad") -> None:
        self.method = method
        self.threshold_rule = threshold_rule
        self.max_threshold = max_threshold
        self.min_variance = min_variance
        self.support_fraction = support_fraction
        self.c_steps = c_steps
        self.max_fit_rows = max_fit_rows
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state

    def fit(self, X: ArrayLike | RepeatedRows, y: object = None) -> MahalanobisDetector:
        R = self._validate_rows(X)
        if self.method not in ("trimmed_lw", "mcd"):
            raise ValueError(f"MahalanobisDetector: method must be 'trimmed_lw' or 'mcd', not {self.method!r}")
        if not 0.0 < self.support_fraction <= 1.0:
            raise ValueError(f"MahalanobisDetector: support_fraction must be in (0, 1], not {self.support_fraction!r}")
        z = self._fit_scaler_rows(R)
        n, p = z.shape
        # (a seeded generator costs ~50 µs to build: only when there are rows to draw)
        fit_rows = z if n <= self.max_fit_rows else z.take(np.sort(
            check_random_state(self.random_state).choice(n, self.max_fit_rows, replace=False)))
        n_fit = fit_rows.shape[0]
        self.active_ = np.ptp(fit_rows.rows, axis=0) > 1e-9 if n else np.zeros(p, dtype=bool)
        za = fit_rows.rows[:, self.active_]  # (distinct rows; fit_rows.index says which row is which)
        q = za.shape[1]
        loc, prec = np.zeros(q), np.eye(q)
        if q and n_fit > 2:
            if self.method == "mcd" and n_fit > q + 1:
                mcd = MinCovDet(support_fraction=self.support_fraction, random_state=self.random_state).fit(
                    fit_rows.expand(za))
                loc, prec = mcd.location_, mcd.get_precision()
            else:
                h = max(2, int(np.ceil(self.support_fraction * n_fit)))
                dist = fit_rows.expand(np.mean(za * za, axis=1))
                # the trimmed core and the ranking distances of the C-steps in float32 (ample
                # precision for ranking); the covariance is float64, as LedoitWolf.fit made it
                # (it subtracts a float64 location); the scores below are float64
                za32 = za.astype(np.float32)
                repeats = fit_rows.weights() is not None
                count: NDArray[np.int64] | None = None
                steps = 1 + max(0, self.c_steps)
                for step in range(steps):
                    inner = fit_rows.index[np.argsort(dist, kind="stable")[:h]]
                    if repeats:  # the core's distinct rows, and how often each is in it
                        inner, count = np.unique(inner, return_counts=True)
                    core = za32[inner]
                    loc = core.mean(axis=0, dtype=np.float64) if count is None else (count @ core.astype(np.float64)) / h
                    # variances no smaller than the robust scale (1 in z units): a bursty
                    # channel (zero in the trimmed core, bursts elsewhere) must not get a
                    # near-zero variance that makes every burst look extreme
                    prec = _shrunk_precision(core - loc.astype(np.float32), count, self.min_variance)
                    if step + 1 < steps:
                        d32 = za32 - loc.astype(np.float32)
                        dist = fit_rows.expand(np.einsum("ij,ij->i", d32 @ prec.astype(np.float32), d32))
        self.location_ = np.zeros(p)
        self.location_[self.active_] = loc
        self.precision_ = prec
        self._calibrate(self._score_rows(z))
        return self

    def _split(self, z: Array) -> tuple[Array, Array]:
        # each part's deviation directly (no full z - location_ to copy from)
        a = self.active_
        if a.all():
            return z - self.location_, np.zeros((z.shape[0], 0))
        return z[:, a] - self.location_[a], z[:, ~a] - self.location_[~a]

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

