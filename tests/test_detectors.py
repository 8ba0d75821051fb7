"""Detectors: the scikit-learn estimator contract, one score direction, label-free
thresholds, and defined behaviour on bad input (constant, NaN, single sample)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

from analytics.baselines import GaussianMixtureNLL, PCAReconstruction
from analytics.detectors import (
    IsolationForestDetector,
    MahalanobisDetector,
    RobustStandardizer,
    RobustZScore,
    ThresholdRule,
    calibrate_threshold,
    gpd_pwm,
    scores_to_labels,
)


def all_detectors():
    return [
        RobustZScore(),
        IsolationForestDetector(n_estimators=20, random_state=0),
        MahalanobisDetector(random_state=0),
        PCAReconstruction(),
        GaussianMixtureNLL(random_state=0),
    ]


def _checks_that_apply() -> pytest.MarkDecorator:
    """sklearn's estimator checks minus the array-API ones: those only run with SCIPY_ARRAY_API
    set and array-api-strict installed, and our detectors are NumPy-only by design."""
    mark = parametrize_with_checks([RobustStandardizer(), *all_detectors()])
    argnames, params = mark.args
    keep = [p for p in params if "array_api" not in getattr(p[1], "func", p[1]).__name__]
    return pytest.mark.parametrize(argnames, keep, **mark.kwargs)


@_checks_that_apply()
def test_sklearn_estimator_checks(estimator, check) -> None:
    check(estimator)


def healthy(n: int = 1500, p: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, p))
    base[:, 1] = base[:, 0] * 0.8 + 0.2 * base[:, 1]  # some correlation
    return base


@pytest.mark.parametrize("det", all_detectors(), ids=lambda d: type(d).__name__)
def test_healthy_false_positive_rate_is_low_and_shift_is_flagged(det) -> None:
    X = healthy()
    det.fit(X)
    new = healthy(seed=1)
    assert det.predict(new).mean() <= 0.01
    shifted = new.copy()
    shifted[:, 5] += 12.0  # a planted shift of one channel
    s_new, s_shift = det.score_samples(new), det.score_samples(shifted)
    assert np.median(s_shift) > np.median(s_new)  # higher = more anomalous, for every detector
    if isinstance(det, RobustZScore | MahalanobisDetector):  # PCA/GMM/IF: weaker by design
        assert det.predict(shifted).mean() > 0.95
    np.testing.assert_allclose(det.decision_function(shifted), s_shift - det.threshold_)


@pytest.mark.parametrize("det", all_detectors()[:3], ids=lambda d: type(d).__name__)
def test_contaminated_reference_still_flags_the_anomaly(det) -> None:
    # self-history where 30 % of the windows are already anomalous
    X = healthy(2000)
    X[1400:, 3] += 20.0
    det.fit(X)
    flags = det.predict(X)
    assert flags[:1400].mean() <= 0.02
    if isinstance(det, IsolationForestDetector):
        return  # a 30 % cluster is not "few and different": documented IF limitation
    assert flags[1400:].mean() > 0.9


@pytest.mark.parametrize("det", all_detectors(), ids=lambda d: type(d).__name__)
def test_constant_nan_single_sample_and_mid_interval_channels(det) -> None:
    X = healthy(400, 8)
    X[:, 2] = 7.0  # constant channel
    X[:, 4] = np.nan  # never seen
    X[::7, 5] = np.nan  # gaps
    X[:200, 6] = np.nan  # appears mid-interval
    det.fit(X)
    flags = det.predict(X)
    assert flags.mean() < 0.05  # not "100 % anomalous"
    assert np.isfinite(det.score_samples(X)).all()
    # the constant channel changing by a rounding error is not an anomaly ...
    Y = healthy(50, 8, seed=3)
    Y[:, 2] = 7.0 + 1e-9
    Y[:, 4] = np.nan
    assert det.predict(Y).mean() < 0.1
    # ... but a real step in it is, for the per-feature detectors
    if isinstance(det, RobustZScore | MahalanobisDetector | PCAReconstruction):
        Y[:, 2] = 9.0
        assert det.predict(Y).all()
    one = det.fit(X[:1])  # a single reference sample: defined, finite
    assert np.isfinite(one.score_samples(X[:5])).all()


def test_all_constant_reference_flags_nothing() -> None:
    X = np.ones((100, 5))
    for det in all_detectors():
        assert not det.fit(X).predict(X).any(), type(det).__name__


def test_robust_standardizer_uses_floors_and_ignores_contamination() -> None:
    X = np.zeros((100, 2))
    X[:, 1] = np.r_[np.full(70, 1.0), np.full(30, 0.5)]
    s = RobustStandardizer(floors=[0.02, 0.02]).fit(X)
    assert s.center_[1] == 1.0
    z = s.transform(np.array([[0.04, 0.5]]))
    assert z[0, 0] == pytest.approx(2.0)  # floor 0.02
    assert abs(z[0, 1]) > 10  # the 30 % shift stays far from the healthy median
    with pytest.raises(ValueError, match="floors has shape"):
        RobustStandardizer(floors=[1.0]).fit(X)


def test_calibrate_threshold_and_labels() -> None:
    rng = np.random.default_rng(0)
    s = np.exp(rng.normal(0, 0.2, 1000))
    t = calibrate_threshold(s, 4.0)
    assert (s > t).mean() < 0.005
    contaminated = np.r_[s, np.full(300, 50.0)]  # 23 % anomalous scores barely move it
    assert calibrate_threshold(contaminated, 4.0) < 5 * t
    assert calibrate_threshold(np.full(10, 3.0)) > 3.0
    assert calibrate_threshold(np.array([np.nan])) == float("inf")
    assert scores_to_labels([1.0, 5.0, np.nan], 2.0).tolist() == [False, True, False]


def test_bad_parameters_are_rejected_in_fit() -> None:
    X = healthy(50, 3)
    with pytest.raises(ValueError, match="aggregate"):
        RobustZScore(aggregate="mean").fit(X)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        MahalanobisDetector(method="x").fit(X)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold_k"):
        IsolationForestDetector(threshold_k=-1).fit(X)


def test_mahalanobis_mcd_option_agrees_on_a_clear_outlier() -> None:
    X = healthy(600, 10)
    Y = X[:5].copy()
    Y[0, 3] += 20
    for method in ("trimmed_lw", "mcd"):
        det = MahalanobisDetector(method=method, random_state=0).fit(X)
        flags = det.predict(Y)
        assert flags[0] and flags[1:].sum() <= 1, method


def test_isolation_forest_matches_the_algorithm_and_sklearns_forest() -> None:
    """The forest is Liu et al.'s; sklearn's IsolationForest (the reference) ranks the
    same rows as outliers and gives scores of the same distribution."""
    from sklearn.ensemble import IsolationForest
    from sklearn.ensemble._iforest import _average_path_length

    from analytics.detectors import average_path_length

    n = np.array([1, 2, 3, 10, 256, 4096])
    np.testing.assert_allclose(average_path_length(n), _average_path_length(n))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 12))
    Y = rng.normal(size=(200, 12))
    Y[:100, 3:5] += 6.0  # outliers along two varying channels
    s = IsolationForestDetector(random_state=0, standardize=False).fit(X).score_samples(Y)
    ref = -IsolationForest(n_estimators=50, max_samples=256, random_state=0).fit(X).score_samples(Y)
    assert ((s > 0) & (s <= 1)).all()
    for scores in (s, ref):
        assert (scores[:100, None] > scores[None, 100:]).mean() > 0.9
    assert np.corrcoef(s, ref)[0, 1] > 0.85  # (two random forests: 0.90 on this seed)
    assert abs(np.median(s[100:]) - np.median(ref[100:])) < 0.03  # inliers: the same score level
    # same seed, same forest
    a = IsolationForestDetector(random_state=3).fit(X).score_samples(Y)
    b = IsolationForestDetector(random_state=3).fit(X).score_samples(Y)
    np.testing.assert_array_equal(a, b)


def test_threshold_survives_a_mostly_anomalous_reference() -> None:
    rng = np.random.default_rng(1)
    clean = np.exp(rng.normal(0, 0.2, 400))
    t = calibrate_threshold(clean, 4.0)
    mostly_bad = np.r_[clean, np.full(600, 50.0)]  # 60 %: beyond any median rule
    assert calibrate_threshold(mostly_bad, 4.0) < min(5 * t, 50.0)


def test_zscore_threshold_is_bounded() -> None:
    # two incidents in different channels cover 85 % of a short self history: each is a
    # minority of its channel (so the z-scores are right), yet most windows are anomalous
    X = np.random.default_rng(0).normal(0, 1, (100, 3))
    X[:40, 0] += 40.0
    X[40:85, 1] += 50.0
    assert RobustZScore(floors=[1.0, 1.0, 1.0]).fit(X).threshold_ > 8.0  # uncapped by default
    det = RobustZScore(floors=[1.0, 1.0, 1.0], max_threshold=8.0).fit(X)  # the pipeline's cap on telemetry
    assert det.threshold_ == 8.0 and det.predict(X)[:85].all()
    # ... and a reference with almost no spread does not flag the slightest wobble
    det = RobustZScore(floors=[1.0, 1.0, 1.0]).fit(np.zeros((100, 3)))
    assert det.threshold_ >= 3.0
    assert not det.predict(np.full((5, 3), 2.5)).any()


@pytest.mark.parametrize("shape", [(2160, 250), (40, 3), (12, 1), (5, 8)])
def test_ledoit_wolf_covariance_is_sklearns_bit_for_bit(shape: tuple[int, int]) -> None:
    from sklearn.covariance import ledoit_wolf

    from analytics.detectors import _ledoit_wolf_cov

    rng = np.random.default_rng(shape[1])
    X = (rng.standard_normal(shape) * rng.uniform(0.1, 5.0, shape[1])).astype(np.float32)
    X[:, : shape[1] // 3] = 0.0  # channels constant in the trimmed core, as in telemetry
    X -= X.mean(axis=0, dtype=np.float64).astype(np.float32)
    ref = np.asarray(ledoit_wolf(X, assume_centered=True)[0], dtype=np.float64)
    got = _ledoit_wolf_cov(X)
    assert got.dtype == np.float64 and got.shape == (shape[1], shape[1])
    assert np.array_equal(got, ref)


def _plain_walk(det: IsolationForestDetector, z: np.ndarray) -> np.ndarray:
    """Reference: each row down each tree, one node at a time."""
    T, N = det.feature_.shape
    node = np.zeros((T, z.shape[0]), dtype=np.int64)
    for t in range(T):
        for i in range(z.shape[0]):
            j = 0
            while det.feature_[t, j] >= 0:
                j = 2 * j + 1 + int(z[i, det.feature_[t, j]] > det.threshold_tree_[t, j])
            node[t, i] = j
    return node


def test_forest_leaf_routing_equals_the_plain_walk_across_row_blocks() -> None:
    """The vectorised walk (leaves routed to themselves, rows in cache-sized blocks)
    reaches the leaves of the plain walk, so scores are those of the algorithm."""
    from analytics import detectors as D

    rng = np.random.default_rng(7)
    X = rng.normal(size=(2 * D._LEAF_BLOCK + 17, 9))
    X[:, 2] = 1.0  # a constant channel: never split on
    X[: D._LEAF_BLOCK // 2, 4] += 5.0
    det = IsolationForestDetector(random_state=1, standardize=False, n_estimators=6).fit(X)
    node = _plain_walk(det, X)
    T, N = det.feature_.shape
    np.testing.assert_array_equal(det._leaves(X), np.arange(T)[:, None] * N + node)
    path = det.leaf_path_.ravel().take(np.arange(T)[:, None] * N + node).mean(axis=0)
    np.testing.assert_array_equal(det.score_samples(X), 2.0 ** (-path / det.c_psi_))
    # a forest without a usable feature: every row at the roots
    flat = IsolationForestDetector(random_state=1, standardize=False).fit(np.ones((40, 3)))
    assert (flat._leaves(np.ones((5, 3))) % flat.feature_.shape[1] == 0).all()


@pytest.mark.parametrize("n", [1, 2, 7, 8, 4096])
def test_column_median_by_one_selection_is_numpys(n: int) -> None:
    from analytics.detectors import _median_rows

    A = np.random.default_rng(n).normal(size=(n, 5)).astype(np.float32)
    A[:, 1] = np.round(A[:, 1])  # ties
    got = _median_rows(np.array(A.T, order="C"))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.median(A.astype(np.float64), axis=0))


def _repeated(seed: int, n_rows: int, n: int, p: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows (ties, a NaN-holed column, an all-NaN column, a constant one) and
    which of them each of ``n`` rows is: most rows repeat, as in the pipeline's smoothed
    detection matrix."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_t(3, size=(n_rows, p)) * 10.0 ** rng.integers(-3, 4, p)
    rows[:, 1] = np.round(rows[:, 1])
    rows[rng.random(n_rows) < 0.3, 2] = np.nan
    rows[:, 3] = np.nan
    rows[:, 4] = 7.0
    index = np.sort(rng.integers(0, n_rows, n))
    index[:n_rows] = np.arange(n_rows)  # every row used at least once
    return rows, rng.permutation(index)


@pytest.mark.parametrize(("n_rows", "n"), [(1, 1), (2, 3), (30, 300), (50, 4500), (4000, 4300)])
def test_repeated_rows_fit_and_score_as_the_dense_matrix(n_rows: int, n: int) -> None:
    """Every detector fits a matrix given as its repeated rows (RepeatedRows) as it fits
    the matrix itself: the same medians, scales within rounding, the same Isolation
    Forest, scores and thresholds within rounding. Above STATS_MAX_ROWS rows the thinning
    picks the same positions either way."""
    from analytics.detectors import RepeatedRows

    rows, index = _repeated(n, n_rows, n)
    R = RepeatedRows(rows, index)
    X = rows[index]
    assert R.shape == X.shape
    np.testing.assert_array_equal(R.dense(), X)
    s_dense = RobustStandardizer().fit(X)
    s_rows = RobustStandardizer().fit(R)
    np.testing.assert_array_equal(s_rows.center_, s_dense.center_)
    np.testing.assert_allclose(s_rows.scale_, s_dense.scale_, rtol=1e-12)
    for det in all_detectors():
        a, b = clone(det).fit(X), clone(det).fit(R)
        np.testing.assert_allclose(b.reference_scores_, a.reference_scores_, rtol=1e-9, atol=1e-12)
        assert b.threshold_ == pytest.approx(a.threshold_, rel=1e-9)
        np.testing.assert_allclose(b.score_samples(X[:9]), a.score_samples(X[:9]), rtol=1e-9, atol=1e-12)
        if isinstance(det, IsolationForestDetector):
            np.testing.assert_array_equal(b.feature_, a.feature_)


def test_repeated_rows_take_gather_and_expand() -> None:
    """``take`` is ``X[positions]`` (unused rows dropped, order and repeats kept),
    ``gather`` the dense rows, ``expand`` per-row values per row of X."""
    from analytics.detectors import RepeatedRows

    rows = np.arange(12.0).reshape(4, 3)
    R = RepeatedRows(rows, [2, 2, 0, 3, 0, 1, 1])
    X = rows[R.index]
    for pos in ([0, 1, 2], [6, 3, 3, 0], [5], [0, 2, 3, 5]):
        T = R.take(pos)
        np.testing.assert_array_equal(T.dense(), X[pos])
        assert T.rows.shape[0] == len({int(R.index[i]) for i in pos})  # only the rows used
        np.testing.assert_array_equal(R.gather(pos), X[pos])
    np.testing.assert_array_equal(R.expand(rows[:, 0]), X[:, 0])
    assert R.weights() is not None and R.weights().tolist() == [2, 2, 2, 1]
    assert RepeatedRows(rows).weights() is None and RepeatedRows(rows).dense() is rows


@pytest.mark.parametrize("p", [1, 5, 40])
def test_weighted_ledoit_wolf_is_sklearns_on_the_repeated_rows(p: int) -> None:
    """Ledoit-Wolf of rows counted several times (the trimmed core of a matrix of
    repeated rows) is sklearn's estimate of the repeated rows, up to rounding."""
    from sklearn.covariance import ledoit_wolf

    from analytics.detectors import _ledoit_wolf_cov

    rng = np.random.default_rng(p)
    rows = rng.normal(size=(30, p)) @ rng.normal(size=(p, p))
    counts = rng.integers(1, 12, 30)
    want = ledoit_wolf(np.repeat(rows, counts, axis=0), assume_centered=True)[0]
    np.testing.assert_allclose(_ledoit_wolf_cov(rows, counts), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(_ledoit_wolf_cov(rows), ledoit_wolf(rows, assume_centered=True)[0])


def test_gpd_pwm_recovers_known_tails() -> None:
    from scipy.stats import genpareto  # the reference distribution, tests only

    rng = np.random.default_rng(1)
    for xi in (-0.2, 0.0, 0.3):
        y = genpareto.rvs(xi, scale=2.0, size=20000, random_state=rng)
        shape, scale = gpd_pwm(y)
        assert shape == pytest.approx(xi, abs=0.05) and scale == pytest.approx(2.0, rel=0.05)
    with pytest.raises(ValueError, match="exceedances"):
        gpd_pwm([1.0])


def test_threshold_rules_flag_what_they_promise() -> None:
    healthy = np.exp(np.random.default_rng(2).normal(size=50000))  # log-normal reference scores
    budget = ThresholdRule.parse("quantile:0.01").threshold(healthy)
    assert (healthy > budget).mean() == pytest.approx(0.01, abs=1e-3)
    pot = ThresholdRule.parse("pot:0.98:1e-3").threshold(healthy)  # ~0.1 % per window above it
    assert (healthy > pot).mean() == pytest.approx(1e-3, abs=5e-4)
    assert ThresholdRule.parse("mad").threshold(healthy, 4.0) == calibrate_threshold(healthy, 4.0)
    assert str(ThresholdRule.parse("pot:0.98:1e-3")) == "pot:0.98:0.001"
    assert ThresholdRule.parse("quantile:0.01").threshold([np.nan]) == np.inf
    for bad in ("median", "quantile", "quantile:2", "pot:0.98", "pot:0.98:0"):
        with pytest.raises(ValueError, match="threshold rule"):
            ThresholdRule.parse(bad)


def test_detectors_calibrate_with_their_threshold_rule() -> None:
    X = np.random.default_rng(3).normal(size=(4000, 5))
    for cls in (RobustZScore, IsolationForestDetector, MahalanobisDetector):
        mad = cls(threshold_k=4.0).fit(X)
        q = cls(threshold_rule="quantile:0.05").fit(X)
        # a 5 % budget flags about 5 % of the reference (above the detector's floor)
        assert q.threshold_ == max(np.quantile(q.reference_scores_, 0.95), cls._min_threshold)
        assert q.threshold_ < mad.threshold_
    with pytest.raises(ValueError, match="threshold rule"):
        RobustZScore(threshold_rule="nonsense").fit(X)


def test_threshold_rule_config_key() -> None:
    from analytics.pipeline import AnalyticsConfig
    from jobs.config import analytics_from_mapping

    cfg = analytics_from_mapping({"threshold_rule": "quantile:0.01"})
    assert cfg.threshold_rule == "quantile:0.01"
    assert {cfg.make_detector(d).threshold_rule for d in ("zscore", "iforest", "mahalanobis")} == {"quantile:0.01"}
    assert AnalyticsConfig().threshold_rule == "mad"
    with pytest.raises(ValueError, match=r"\[analytics\].*threshold_rule"):
        analytics_from_mapping({"threshold_rule": "quantile:1.5"})


@pytest.mark.parametrize("weighted", [False, True])
def test_shrunk_precision_is_the_inverse_of_the_floored_ledoit_wolf_covariance(weighted: bool) -> None:
    """Few rows, many features (a cohort's peers in one analysis step): the Woodbury
    inverse is the inverse of the covariance the Cholesky path inverts."""
    from analytics.detectors import _ledoit_wolf_cov, _shrunk_precision, _spd_inverse

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 300)).astype(np.float32)
    X[:, :10] *= 0.01  # low-variance channels: their variances are raised to the floor
    w = rng.integers(1, 10, size=40) if weighted else None
    cov = _ledoit_wolf_cov(X, w)
    np.fill_diagonal(cov, np.maximum(np.diag(cov), 0.25))
    P = _shrunk_precision(X, w, 0.25)
    assert np.abs(P @ cov - np.eye(300)).max() < 1e-9
    assert np.abs(P - _spd_inverse(cov)).max() < 1e-9 * np.abs(P).max()


@pytest.mark.parametrize("repeated", [False, True])
def test_robust_stats_of_constant_columns_are_numpys(repeated: bool) -> None:
    """Columns that never change are not sorted: their median, MAD and std are still
    numpy's over the float32 values the others' sorts use (a column constant only in
    float32 as well), beside moving columns, for a dense matrix and for repeated rows."""
    from analytics.detectors import RepeatedRows, _robust_stats, _thin

    rng = np.random.default_rng(3)
    rows = rng.normal(size=(300, 5)) * 10.0
    rows[:, 1] = 0.1  # not a float32 value
    rows[:, 3] = 1.0 + rng.integers(0, 2, 300) * 1e-12  # constant once in float32
    X = RepeatedRows(rows, rng.integers(0, 300, 2000)) if repeated else RepeatedRows(rows)
    thinned = _thin(X).dense()  # (the rows the statistics are taken on)
    med, mad, std = _robust_stats(X, np.isfinite(X.rows))
    f32 = thinned.astype(np.float32)  # (the middle pair of an even count is averaged in float64)
    want = np.median(f32.astype(np.float64), axis=0)
    np.testing.assert_array_equal(med, want)
    dev = np.abs(f32 - want.astype(np.float32)).astype(np.float64)
    np.testing.assert_array_equal(mad, np.median(dev, axis=0))
    assert mad[1] == 0.0 and mad[3] == 0.0 and med[1] == np.float64(np.float32(0.1))
    np.testing.assert_allclose(std, thinned.std(axis=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [5, 64, 599, 600, 1000])
def test_robust_stats_of_columns_with_gaps_are_nanmedians(rows: int) -> None:
    """Columns with missing values take numpy's ``nanmedian`` of the values they have,
    bit for bit (even and odd counts, ties, an empty column, both of numpy's own paths:
    it masks below 600 rows and goes column by column above)."""
    from analytics.detectors import RepeatedRows, _robust_stats, _thin

    rng = np.random.default_rng(rows)
    dense = rng.normal(size=(rows, 6)) * 1e3
    dense[:, 1] = np.round(dense[:, 1] / 500.0)  # a few levels: ties
    dense[:, 2] = 7.0
    for j, share in enumerate((0.01, 0.5, 0.0, 0.9, 1.0, 0.3)):
        dense[rng.random(rows) < share, j] = np.nan
    dense[0, 0] = np.nan  # (every column has a gap)
    X = RepeatedRows(dense)
    med, mad, _ = _robust_stats(X, np.isfinite(X.rows))
    thinned = _thin(X).dense()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the empty column)
        want = np.nanmedian(thinned, axis=0)
        np.testing.assert_array_equal(med, want)
        np.testing.assert_array_equal(mad, np.nanmedian(np.abs(thinned - want), axis=0))
    assert np.isnan(med[4]) and np.isnan(mad[4])


def test_the_pipelines_matrices_skip_validation_with_the_same_outcome() -> None:
    """A matrix of repeated rows (the pipeline's own) is not passed through scikit-learn's
    validation when it would pass unchanged; what a fit records is the same, and a matrix
    it would refuse (an infinite value) is still refused."""
    from analytics.detectors import RepeatedRows

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(40, 3))
    rows[3, 1] = np.nan
    fast = RobustStandardizer().fit(RepeatedRows(rows, rng.integers(0, 40, 100)))
    slow = RobustStandardizer().fit(rows[rng.integers(0, 40, 100)].tolist())  # (a list: validated)
    assert fast.n_features_in_ == slow.n_features_in_ == 3
    np.testing.assert_array_equal(fast.transform_rows(RepeatedRows(rows)).rows, fast.transform(rows))
    bad = rows.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        RobustStandardizer().fit(RepeatedRows(bad))
    with pytest.raises(ValueError, match="infinity"):
        fast.transform_rows(RepeatedRows(bad))
    with pytest.raises(ValueError, match="features"):
        fast.transform_rows(RepeatedRows(rows[:, :2]))
