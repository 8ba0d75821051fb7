"""Attribution and the pipeline: exact decompositions, planted shifts attributed to the
right channel and subsystem under both references, and the table contracts."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from analytics import attribution, catalog
from analytics.baselines import PCAReconstruction
from analytics.detectors import IsolationForestDetector, MahalanobisDetector, RobustZScore
from analytics.pipeline import FINDINGS_SCHEMA, SCORES_SCHEMA, AnalyticsConfig, analyze
from tests.test_features import load_synth


def data(n: int = 1000, p: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    X[:, 1] += 0.7 * X[:, 0]
    return X


def test_mahalanobis_and_pca_contributions_sum_exactly_to_the_score() -> None:
    X = data()
    Y = data(50, seed=1) * 3
    for det in (MahalanobisDetector(random_state=0), PCAReconstruction(n_components=4)):
        det.fit(X)
        np.testing.assert_allclose(det.contributions(Y).sum(axis=1), det.score_samples(Y), rtol=1e-10)
    # the same with a feature constant in the reference (handled outside the covariance)
    Xc = X.copy()
    Xc[:, 3] = 1.0
    det = MahalanobisDetector(random_state=0).fit(Xc)
    np.testing.assert_allclose(det.contributions(Y).sum(axis=1), det.score_samples(Y), rtol=1e-10)


@pytest.mark.parametrize("det", [RobustZScore(), IsolationForestDetector(random_state=0),
                                 MahalanobisDetector(random_state=0), PCAReconstruction(n_components=3)],
                         ids=lambda d: type(d).__name__)
def test_planted_shift_is_attributed_to_its_feature(det) -> None:
    X = data()
    Y = data(40, seed=2)
    Y[:, 7] += 10.0
    det.fit(X)
    s = attribution.shares(det.contributions(Y))
    np.testing.assert_allclose(s.sum(axis=1), 1.0)
    assert (s.argmax(axis=1) == 7).mean() >= 0.9


def test_shares_profile_and_top_factors() -> None:
    feats = ["gpu.power_ratio@gpu3", "irq.locality@mlx5_0", "mem.hugepage_coverage", "smd.x"]
    c = np.array([[6.0, 2.0, -1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    s = attribution.shares(c)
    np.testing.assert_allclose(s[0], [0.6, 0.2, 0.0, 0.2])
    assert s[1].sum() == 0.0
    prof = attribution.subsystem_profile(s, feats)
    assert prof[0].sum() == pytest.approx(1.0)
    assert dict(zip(catalog.SUBSYSTEMS, prof[0], strict=True)) == pytest.approx(
        {"cpu": 0, "gpu": 0.6, "memory": 0, "interconnect": 0.2, "network": 0, "storage": 0, "other": 0.2})
    top = attribution.top_factors(s[0], np.array([0.4, 0.3, 0.9, 5.0]), np.array([0.8, 0.95, 0.9, 1.0]), feats, k=5)
    assert [f.feature for f in top] == feats[:1] + feats[1:2] + feats[3:]  # zero share not listed
    assert top[0].family == "gpu.power_ratio" and top[0].device == "gpu3" and top[0].direction == "down"
    assert top[2].direction == "up" and top[2].subsystem == "other"
    series = attribution.factors_series([top])
    assert series.dtype == pl.List(attribution.FACTOR_DTYPE)


def fleet(seconds: int = 240):
    """Three identical 8-GPU hosts: a power cap lowered on gpu3 of host a from 60 % of the
    interval, host c's mlx5_0 interrupts serviced on the far node from the start."""
    synth = load_synth()
    frames: dict[str, list[pl.DataFrame]] = {}
    for i, h in enumerate("abc"):
        for k, v in synth.synth_frames(host=h, seconds=seconds, seed=i).items():
            frames.setdefault(k, []).append(v)
    out = {k: pl.concat(v) for k, v in frames.items()}
    cut = synth.T0 + timedelta(seconds=int(seconds * 0.6))
    capped = (pl.col("host") == "a") & (pl.col("gpu") == "gpu3") & (pl.col("time") >= cut)
    out["gpu"] = out["gpu"].with_columns(
        pl.when(capped).then(pl.lit(450.0, pl.Float32)).otherwise(pl.col("power_limit_w")).alias("power_limit_w"),
        pl.when(capped).then(pl.min_horizontal("power_w", pl.lit(445.0, pl.Float32))).otherwise(pl.col("power_w"))
        .alias("power_w"))
    far = (pl.col("host") == "c") & pl.col("device").str.starts_with("mlx5_0-")
    out["interrupts"] = out["interrupts"].with_columns(
        pl.when(far).then(pl.when(pl.col("node") == "0").then(pl.lit("1")).otherwise(pl.lit("0")))
        .otherwise(pl.col("node")).alias("node"))
    facts = out.pop("host_facts")
    return {k: v.lazy() for k, v in out.items()}, facts, cut


@pytest.fixture(scope="module")
def result():
    frames, facts, cut = fleet()
    return analyze(frames, AnalyticsConfig(), host_facts=facts), cut


def test_pipeline_tables_follow_the_contract(result) -> None:
    res, _ = result
    assert dict(res.scores.schema) == SCORES_SCHEMA
    assert dict(res.findings.schema) == FINDINGS_SCHEMA
    assert set(res.scores["detector"]) == {"zscore", "iforest", "mahalanobis", "combined"}
    assert set(res.scores["reference"]) == {"self", "cohort"}
    assert res.scores.filter(pl.col("detector") == "combined")["threshold"].unique().to_list() == [1.0]
    shares = res.findings.select(pl.sum_horizontal(list(attribution.SHARE_COLUMNS)))
    assert shares.to_series().to_numpy() == pytest.approx(1.0)


def test_power_cap_mid_run_is_found_and_attributed(result) -> None:
    res, cut = result
    f = res.findings.filter(pl.col("host") == "a")
    after = f.filter(pl.col("window_start") >= cut)
    windows_after = res.features.filter((pl.col("host") == "a") & (pl.col("window_start") >= cut)).height
    assert after.height >= 0.9 * windows_after
    assert f.filter(pl.col("window_end") <= cut).height <= 2
    top = after["top_factors"].list.first().struct.field("feature")
    assert (top == "gpu.power_limit_ratio@gpu3").mean() > 0.9
    assert after["share_gpu"].median() > 0.5
    first = after["top_factors"][0][0]
    assert first["direction"] == "down" and first["reference"] == pytest.approx(1.0)
    assert first["value"] == pytest.approx(450 / 700, abs=0.01)


def test_cohort_reference_catches_a_host_misconfigured_from_boot(result) -> None:
    res, _ = result
    c_scores = res.scores.filter((pl.col("host") == "c") & (pl.col("detector") == "combined"))
    assert c_scores.filter(pl.col("reference") == "self")["flagged"].mean() < 0.05  # invisible to itself
    assert c_scores.filter(pl.col("reference") == "cohort")["flagged"].mean() > 0.9
    f = res.findings.filter(pl.col("host") == "c")
    assert (f["reference"] == "cohort").all()
    top = f["top_factors"].list.first()
    assert (top.struct.field("feature") == "irq.locality@mlx5_0").mean() > 0.9
    assert (top.struct.field("subsystem") == "interconnect").all()
    assert f["share_interconnect"].median() > 0.5


def test_healthy_host_is_quiet(result) -> None:
    res, _ = result
    b = res.scores.filter((pl.col("host") == "b") & (pl.col("detector") == "combined"))
    assert b["flagged"].mean() <= 0.01


def test_config_validation_names_the_key() -> None:
    with pytest.raises(ValueError, match="analytics.detectors: unknown"):
        AnalyticsConfig(detectors=("zscore", "lstm"))
    with pytest.raises(ValueError, match="analytics.vote_k"):
        AnalyticsConfig(vote_k=4)
    with pytest.raises(ValueError, match="analytics.reference"):
        AnalyticsConfig(reference="fleet")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="analytics.top_k"):
        AnalyticsConfig(top_k=0)


def test_single_window_and_empty_input_give_empty_scores() -> None:
    res = analyze({})
    assert res.features.height == 0 and res.scores.height == 0 and res.findings.height == 0
    assert dict(res.findings.schema) == FINDINGS_SCHEMA
    synth = load_synth()
    frames = synth.synth_frames(seconds=2)
    facts = frames.pop("host_facts")
    res = analyze({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
    assert res.features.height == 1 and res.scores.height == 0


def test_baselines_run_in_the_pipeline_and_any_all_combinations() -> None:
    frames, facts, _ = fleet(seconds=60)
    for combine in ("any", "all"):
        cfg = AnalyticsConfig(detectors=("pca", "gmm", "zscore"), combine=combine, reference="self")
        res = analyze(frames, cfg, host_facts=facts)
        assert set(res.scores["detector"]) == {"pca", "gmm", "zscore", "combined"}
        per = res.scores.pivot(on="detector", index=["host", "window_start"], values="flagged")
        agg = per.select(pl.any_horizontal("pca", "gmm", "zscore") if combine == "any"
                         else pl.all_horizontal("pca", "gmm", "zscore")).to_series()
        assert agg.to_list() == per["combined"].to_list()
