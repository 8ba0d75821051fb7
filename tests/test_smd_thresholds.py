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
