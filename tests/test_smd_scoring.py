"""Scoring helpers the SMD ranking study added (analytics.scoring.ChannelTail,
rolling_mean) and their use as the benchmark's causal ``chan`` detector."""

from __future__ import annotations

import numpy as np
import pytest

from analytics import scoring
from tests.test_smd import smd


def test_rolling_mean_is_trailing_and_causal() -> None:
    x = np.random.default_rng(0).normal(size=(50, 3))
    out = scoring.rolling_mean(x, 7)
    for i in (0, 3, 6, 7, 49):
        np.testing.assert_allclose(out[i], x[max(0, i - 6): i + 1].mean(axis=0))
    y = x.copy()
    y[30:] += 100.0
    np.testing.assert_array_equal(scoring.rolling_mean(y, 7)[:30], out[:30])
    np.testing.assert_allclose(scoring.rolling_mean(x, 1), x, atol=1e-12)
    with pytest.raises(ValueError, match="n must be"):
        scoring.rolling_mean(x, 0)


def test_channel_tail_does_not_let_a_bursty_channel_dominate() -> None:
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(5000, 2))
    ref[rng.random(5000) < 0.03, 0] += 40.0  # channel 0 bursts 40 scales every so often
    ct = scoring.ChannelTail(top_k=1, level=0.99).fit(ref)
    burst, shift = np.array([[40.0, 0.0]]), np.array([[0.0, 8.0]])  # a usual burst; a quiet channel 8 off
    assert ct.score_samples(shift)[0] > 2 * ct.score_samples(burst)[0]
    # what the max of raw robust z does instead: the usual burst outranks the shift
    z = smd.RobustStandardizer().fit(ref)
    assert np.abs(z.transform(burst)).max() > np.abs(z.transform(shift)).max()
    # units of each channel's tail: about 1 - level of the reference above 1 per channel
    one = scoring.ChannelTail(top_k=1, level=0.95).fit(ref[:, 1:])
    assert (one.reference_scores_ > 1.0).mean() == pytest.approx(0.05, abs=0.005)
    # top_k averages the k largest
    two = scoring.ChannelTail(top_k=2, level=0.99).fit(ref)
    t = np.abs(two.scaler_.transform(shift)) / two.tail_
    assert two.score_samples(shift)[0] == pytest.approx(t.mean())
    with pytest.raises(ValueError, match="top_k"):
        scoring.ChannelTail(top_k=0)


def test_channel_score_is_causal_and_matches_a_direct_fit() -> None:
    X = np.random.default_rng(2).normal(size=(400, 4))
    n_train, n_test, window = 200, 201, 1
    base = smd.channel_scores(X, n_train, n_test, window, refit_every=50, slow=10)
    spoiled = X.copy()
    spoiled[320:] += 50.0
    after = smd.channel_scores(spoiled, n_train, n_test, window, refit_every=50, slow=10)
    np.testing.assert_array_equal(base[0][:120], after[0][:120])  # blocks before row 150 of the test
    assert not np.allclose(base[0][150:], after[0][150:])
    # block 2 (test rows 100-149) is fitted on the 300 windows before it, fast and slow copies
    F = np.hstack([X, scoring.rolling_mean(X, 10)])
    rng = np.nanmax(F[:300], axis=0) - np.nanmin(F[:300], axis=0)
    ct = scoring.ChannelTail(floors=0.01 * rng).fit(F[:300])
    np.testing.assert_allclose(base[0][100:150], ct.score_samples(F[300:350]))
    np.testing.assert_allclose(base[1][2], np.sort(ct.reference_scores_))
