"""Threshold rules that adapt to the reference's tail (issue 16):
``analytics.detectors.ThresholdRule`` kinds beyond mad / quantile / pot."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.detectors import ThresholdRule
from tests.test_smd import smd


def _lognormal(sigma: float, n: int = 40000, seed: int = 0) -> np.ndarray:
    return np.exp(sigma * np.random.default_rng(seed).normal(size=n))


def test_tail_rule_extrapolates_the_reference_tail() -> None:
    s = _lognormal(1.0)
    ls = np.log(s)
    q99, q50 = np.quantile(ls, [0.99, 0.5])
    thr = ThresholdRule.parse("tail:0.01:1.5").threshold(s)
    # log threshold = Q(1-S) + C·(Q(1-S) - median) of the log scores
    assert np.log(thr) == pytest.approx(q99 + 1.5 * (q99 - q50), rel=1e-9)
    # C = 0 is the alert budget
    assert ThresholdRule.parse("tail:0.01:0").threshold(s) == pytest.approx(ThresholdRule.parse("quantile:0.01").threshold(s))
    # a heavier tail (log-scores twice as spread) moves the threshold twice as far from the median in log
    heavy = _lognormal(2.0)
    assert np.log(ThresholdRule.parse("tail:0.01:1.5").threshold(heavy)) == pytest.approx(2 * np.log(thr), rel=0.05)
    # units do not matter: scores ×1000 give a threshold ×1000
    assert ThresholdRule.parse("tail:0.01:1.5").threshold(1000 * s) == pytest.approx(1000 * thr, rel=1e-9)
    # healthy windows above it: far fewer than the budget
    assert (s > thr).mean() < 1e-3
    assert str(ThresholdRule.parse("tail:0.01:1.5")) == "tail:0.01:1.5"
    assert ThresholdRule.parse("tail:0.01:1.5").threshold([np.nan]) == np.inf


@pytest.mark.parametrize("bad", ["tail", "tail:0.01", "tail:1.5:1", "tail:0.01:-1", "tail:0.01:x"])
def test_tail_rule_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="threshold rule"):
        ThresholdRule.parse(bad)


def test_benchmark_rule_is_the_detector_rule() -> None:
    s = _lognormal(1.0, seed=3)
    rule = smd.parse_rule("tail:0.02:1")
    assert rule.name == "tail:0.02:1"
    assert rule.threshold(s) == ThresholdRule.parse("tail:0.02:1").threshold(s)
    with pytest.raises(ValueError, match="threshold rule"):
        smd.parse_rule("tail:0.02")


def test_either_rule_is_the_lower_of_mad_and_the_budget() -> None:
    # a reference 15 % of which is past incidents: the MAD rule is the lower (the budget's
    # quantile sits inside the incidents)
    contaminated = np.concatenate([_lognormal(0.3, seed=4), np.exp(8.0) * _lognormal(0.3, n=7000, seed=7)])
    clean = _lognormal(1.0, seed=5)  # incident-free: 10 MADs lie far above the budget's quantile
    rule = ThresholdRule.parse("either:0.01")
    for s in (contaminated, clean):
        mad, budget = ThresholdRule().threshold(s, 10.0), ThresholdRule.parse("quantile:0.01").threshold(s)
        assert rule.threshold(s, 10.0) == min(mad, budget)
    assert ThresholdRule().threshold(contaminated, 10.0) < ThresholdRule.parse("quantile:0.01").threshold(contaminated)
    assert ThresholdRule().threshold(clean, 10.0) > ThresholdRule.parse("quantile:0.01").threshold(clean)
    # so at least the budget's share of the reference is above it, whatever k
    assert (clean > rule.threshold(clean, 10.0)).mean() == pytest.approx(0.01, abs=1e-3)
    heavy = clean
    assert str(rule) == "either:0.01"
    bench = smd.parse_rule("either:10:0.01")
    assert bench.name == "either:10:0.01" and bench.threshold(heavy) == rule.threshold(heavy, 10.0)
    for bad in ("either", "either:1.5", "either:0"):
        with pytest.raises(ValueError, match="threshold rule"):
            ThresholdRule.parse(bad)
    with pytest.raises(ValueError, match="threshold rule"):
        smd.parse_rule("either:10")
