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
    # 4-minute synthetic fleet without a start-up phase: judge it from its first window
    return analyze(frames, AnalyticsConfig(warmup=timedelta(0)), host_facts=facts), cut


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
    # the detectors see 120-s running medians of 10-s block means: a step is found from
    # its own block on, at most one block (10 windows) + the window length early
    assert f.filter(pl.col("window_end") <= cut).height <= 13
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
        cfg = AnalyticsConfig(detectors=("pca", "gmm", "zscore"), combine=combine, reference="self", min_run=1,
                              warmup=timedelta(0))
        res = analyze(frames, cfg, host_facts=facts)
        assert set(res.scores["detector"]) == {"pca", "gmm", "zscore", "combined"}
        per = res.scores.pivot(on="detector", index=["host", "window_start"], values="flagged")
        agg = per.select(pl.any_horizontal("pca", "gmm", "zscore") if combine == "any"
                         else pl.all_horizontal("pca", "gmm", "zscore")).to_series()
        assert agg.to_list() == per["combined"].to_list()


# ------------------------------------------------------------- references and verdicts
def window_frame(host_cols: dict[str, dict[str, np.ndarray]], start=None) -> pl.DataFrame:
    """A wide features frame: per host, one row per 1-s window."""
    synth = load_synth()
    t0 = start or synth.T0
    parts = []
    for h, cols in host_cols.items():
        n = len(next(iter(cols.values())))
        ws = pl.datetime_range(t0, t0 + timedelta(seconds=n - 1), "1s", time_zone="UTC", eager=True)
        parts.append(pl.DataFrame({"host": [h] * n, "window_start": ws, "window_end": ws + timedelta(seconds=3),
                                   **{c: v.astype(np.float64) for c, v in cols.items()}}))
    return pl.concat(parts, how="diagonal").with_columns(pl.col("window_start", "window_end").cast(pl.Datetime("us", "UTC")))


def test_persistent_keeps_only_runs_of_consecutive_windows() -> None:
    from analytics.pipeline import persistent

    flags = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    starts = np.arange(11) * 1_000_000
    starts[9:] += 5_000_000  # a gap: windows 8 and 9 are not consecutive
    assert persistent(flags, starts, 1_000_000, 3).astype(int).tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
    assert persistent(flags, starts, 1_000_000, 1).tolist() == flags.tolist()


def test_evidence_is_one_sided_and_activity_is_down_weighted() -> None:
    from analytics.pipeline import evidence_weights

    cols = ["irq.locality@mlx5_0", "disk.latency_ms@nvme0n1", "gpu.util@gpu0", "smd.x"]
    sign, weight = evidence_weights(cols, AnalyticsConfig())
    assert sign.tolist() == [-1.0, 1.0, 0.0, 0.0]
    assert weight.tolist() == [1.0, 1.0, 0.25, 1.0]
    sign, _ = evidence_weights(cols, AnalyticsConfig(one_sided=False))
    assert sign.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_levels_that_follow_load_are_context_on_their_side() -> None:
    """GPU temperature and power-cap time follow a healthy GPU's load: weighed as activity
    (no deviation of theirs flags a window alone), still one-sided; the thermal throttle
    reasons and a lowered limit stay evidence."""
    from analytics.pipeline import _evidence, evidence_weights

    cols = ["gpu.temperature_max@gpu0", "gpu.throttle_power_share@gpu0", "gpu.power_violation_share@gpu0",
            "gpu.throttle_thermal_share@gpu0", "gpu.thermal_violation_share@gpu0", "gpu.power_limit_ratio@gpu0"]
    sign, weight = evidence_weights(cols, AnalyticsConfig())
    assert sign.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, -1.0]
    assert weight.tolist() == [0.25, 0.25, 0.25, 1.0, 1.0, 1.0]
    z = _evidence(np.array([[50.0, 50.0, 50.0, 50.0, 50.0, -50.0], [-50.0] * 5 + [50.0]]), sign, weight)
    assert (z[0, :3] < 3.0).all() and (z[0, 3:5] == 50.0).all() and z[0, 5] == -50.0  # 3: the Z-score's least threshold
    assert (z[1] == 0.0).all()  # a cooler, uncapped GPU is no trouble


def test_behaviour_cohorts_split_serving_from_training_but_keep_a_faulty_host() -> None:
    from analytics.pipeline import cohorts

    rng = np.random.default_rng(0)
    n = 300
    hosts = {}
    for i in range(6):
        training = i >= 3
        hosts[f"h{i}"] = {
            "gpu.util@gpu0": rng.normal(0.95 if training else 0.6, 0.02, n),
            "nvlink.tx_rate@gpu0": rng.normal(5e8 if training else 2e6, 1e5, n),
            # an inefficiency (lowered power cap) is no behaviour: h5 stays with its peers
            "gpu.power_limit_ratio@gpu0": np.full(n, 0.6 if i == 5 else 1.0),
        }
    c = cohorts(window_frame(hosts))
    assert c["h0"] == c["h1"] == c["h2"] != c["h3"] == c["h4"] == c["h5"]
    assert len(set(cohorts(window_frame(hosts), by="hardware").values())) == 1


def test_a_short_phase_is_not_flagged_but_a_sustained_step_is() -> None:
    rng = np.random.default_rng(1)
    n = 1200  # 20 minutes of 1-s windows
    cols = {f"disk.latency_ms@nvme{i}n1": rng.normal(1.0, 0.1, n) for i in range(4)}
    cols["gpu.power_limit_ratio@gpu0"] = np.ones(n)
    cols["mem.hugepage_coverage"] = rng.normal(0.9, 0.005, n)
    cols["disk.latency_ms@nvme0n1"][400:430] += 20.0  # a 30-s burst (a checkpoint)
    cols["gpu.power_limit_ratio@gpu0"][720:960] = 0.6  # a 4-minute lowered power cap
    feats = window_frame({"h": cols})
    res = analyze({}, AnalyticsConfig(reference="self"), features=feats)
    found = set(res.findings["window_start"].to_list())
    ws = feats["window_start"].to_list()
    assert not found & set(ws[390:440])  # the burst
    assert len(found & set(ws[720:960])) >= 0.95 * 240  # the step, from its first windows
    assert len(found - set(ws[700:980])) == 0  # nothing else
    # the first 5 minutes are warm-up: scored, never flagged
    warmup = res.scores.filter(pl.col("window_start") < ws[300])
    assert warmup.height and not warmup.filter(pl.col("detector") == "combined")["flagged"].any()
    top = res.findings["top_factors"].list.first().struct.field("feature")
    assert (top == "gpu.power_limit_ratio@gpu0").all()
    # without smoothing and persistence the burst is flagged: the mechanism, not luck
    raw = analyze({}, AnalyticsConfig(reference="self", smooth=timedelta(0), min_run=1), features=feats)
    assert set(raw.findings["window_start"].to_list()) & set(ws[400:430])


@pytest.mark.parametrize("order", ["sorted", "hosts_interleaved", "shuffled"])
def test_block_means_of_the_smoothing_equal_the_hash_grouping_bit_for_bit(order: str) -> None:
    """The smoothing's block means come from an order-keeping ``group_by`` (about twice
    as fast as the hash grouping on a sorted frame): each group's rows are summed in row
    order either way, so the means - and the detection matrix - are the same bits,
    whatever the row order of the frame."""
    from analytics.pipeline import _detection_matrix

    rng = np.random.default_rng(11)
    t0 = pl.datetime(2025, 1, 6, time_zone="UTC")
    n, cols = 700, ["cpu.load1", "gpu.util@gpu0", "net.rx_bytes_rate@mlx5_0", "disk.util@nvme0n1"]
    parts = [pl.DataFrame({"host": [h] * n, **{c: rng.lognormal(0, 3, n) * 10.0 ** rng.integers(-3, 9)
                                                for c in cols}}).with_columns(
        window_start=t0 + pl.duration(seconds=pl.int_range(pl.len()) + 7 * i),
        window_end=t0 + pl.duration(seconds=pl.int_range(pl.len()) + 7 * i + 3)) for i, h in enumerate("abc")]
    feats = pl.concat(parts).select("host", "window_start", "window_end", *cols)
    if order == "hosts_interleaved":
        feats = feats.sort("window_start", "host")
    elif order == "shuffled":
        feats = feats.sample(fraction=1.0, shuffle=True, seed=5)
    bid = (pl.col("window_start").dt.epoch("us") // 10_000_000).alias("_blk")
    ref = feats.group_by("host", bid).agg(pl.col(cols).cast(pl.Float64).mean()).sort("host", "_blk")
    got = feats.group_by("host", bid, maintain_order=True).agg(pl.col(cols).cast(pl.Float64).mean()).sort(
        "host", "_blk")
    assert got.equals(ref)
    # and the matrix: each window's smoothed values are its host's (12-block medians of
    # the block means): one host's matrix alone is the same
    X = _detection_matrix(feats, cols, AnalyticsConfig())[0].dense()
    host_a = feats["host"].to_numpy() == "a"
    Xa = _detection_matrix(feats.filter(pl.col("host") == "a"), cols, AnalyticsConfig())[0].dense()
    assert np.isfinite(X).all() and np.array_equal(X[host_a], Xa)
    # ... and, up to the order of the sums, the matrix of the sorted frame, row for row
    srt = feats.with_row_index("_r").sort("host", "window_start")
    Xs = _detection_matrix(srt.drop("_r"), cols, AnalyticsConfig())[0].dense()
    back = np.empty_like(Xs)
    back[srt["_r"].to_numpy()] = Xs
    np.testing.assert_allclose(X, back, rtol=1e-12)


def test_smoothing_of_constant_columns_equals_the_running_median() -> None:
    """Columns whose block means never change skip the running median: the matrix is
    the one the plain per-host rolling median gives, bit for bit (two hosts; a constant,
    a moving, a partly null and an all-null column; a frame of one column)."""
    from analytics.pipeline import _detection_matrix

    rng = np.random.default_rng(3)
    t0 = pl.datetime(2025, 1, 6, time_zone="UTC")
    n = 400
    parts = []
    for host, off in (("a", 0.0), ("b", 5.0)):
        moving = rng.normal(off, 1.0, n)
        partly = np.where(np.arange(n) < 130, np.nan, rng.normal(0, 1, n))
        parts.append(pl.DataFrame({
            "host": [host] * n, "cpu.busy_share": np.full(n, 0.5), "cpu.load1": moving,
            "cpu.iowait_share": partly, "cpu.steal_share": np.full(n, np.nan),
        }).with_columns(pl.col("cpu.iowait_share", "cpu.steal_share").fill_nan(None),
                        window_start=t0 + pl.duration(seconds=pl.int_range(pl.len())),
                        window_end=t0 + pl.duration(seconds=pl.int_range(pl.len()) + 3)))
    feats = pl.concat(parts).select("host", "window_start", "window_end", pl.exclude("host", "window_start",
                                                                                    "window_end"))
    cfg = AnalyticsConfig()
    for cols in (["cpu.busy_share", "cpu.load1", "cpu.iowait_share", "cpu.steal_share"], ["cpu.load1"]):
        R, edge = _detection_matrix(feats, cols, cfg)
        X = R.dense()
        # the reference: every column through Polars' running median of the 10-s block means
        bid = (pl.col("window_start").dt.epoch("us") // 10_000_000).alias("_blk")
        blocks = feats.group_by("host", bid).agg(pl.col(cols).mean()).sort("host", "_blk")
        trail = blocks.select(pl.col(cols).rolling_median(12, min_samples=1).over("host")).to_numpy()
        if len(cols) == 1:
            assert np.isfinite(X).all() and np.ptp(X) > 1.0  # a moving column, smoothed
        else:
            assert np.isfinite(X[:, 0]).all() and (X[:, 0] == 0.5).all()
            assert not np.isfinite(X[:, 3]).any()  # all null stays null
            ref_at = blocks.with_row_index("_i").select("host", "_blk", "_i")
            at = feats.select("host", bid).join(ref_at, on=["host", "_blk"], how="left", maintain_order="left")["_i"]
            # interior blocks take the centred window: compare where no edge shift applies
            inner = ~edge
            hb = blocks["host"].to_numpy()
            shift = np.zeros(len(hb), dtype=int)
            for h in ("a", "b"):
                idx = np.flatnonzero(hb == h)
                shift[idx] = np.clip(np.arange(idx.size) + 6, 11, idx.size - 1) + idx[0]
            ref = trail[shift[at.to_numpy()]]
            np.testing.assert_array_equal(X[inner], ref[inner])


def test_detectors_on_the_block_rows_give_the_dense_matrix_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline fits and scores each smoothed block once (RepeatedRows); with the
    detection matrix handed over dense instead (every window its own row), the scores
    agree to rounding and every flag and finding is the same (self and cohort references,
    a fault mid-run and a host misconfigured from boot)."""
    import analytics.pipeline as P
    from analytics.detectors import RepeatedRows

    frames, facts, _ = fleet()
    cfg = AnalyticsConfig(warmup=timedelta(0))
    fast = analyze(frames, cfg, host_facts=facts)
    blocks, _ = P._detection_matrix(fast.features, P.feature_columns(fast.features), cfg)
    assert blocks.rows.shape[0] * 5 < blocks.shape[0]  # the block rows are far fewer than the windows
    original = P._detection_matrix

    def dense_matrix(*args: object) -> tuple[RepeatedRows, np.ndarray]:
        X, edge = original(*args)
        return RepeatedRows(X.dense()), edge

    monkeypatch.setattr(P, "_detection_matrix", dense_matrix)
    dense = analyze(frames, cfg, host_facts=facts, features=fast.features)
    assert fast.scores.drop("score", "threshold").equals(dense.scores.drop("score", "threshold"))
    for c in ("score", "threshold"):
        np.testing.assert_allclose(fast.scores[c].to_numpy(), dense.scores[c].to_numpy(), rtol=1e-9, atol=1e-12)
    assert fast.findings.height > 0
    assert fast.findings.select("host", "window_start", "reference", "detectors").equals(
        dense.findings.select("host", "window_start", "reference", "detectors"))
    assert (fast.findings["top_factors"].list.first().struct.field("feature")
            == dense.findings["top_factors"].list.first().struct.field("feature")).all()


@pytest.mark.parametrize("n", [1, 5, 11, 12, 13, 400])
@pytest.mark.parametrize("k", [1, 2, 3, 12])
def test_numpy_running_median_is_polars_bit_for_bit(n: int, k: int) -> None:
    """The smoothing's running median (sorted windows in numpy) equals Polars'
    ``rolling_median(k, min_samples=1)``: odd and even counts, the truncated first
    windows, ties, signed zeros, large and tiny values, and gaps (null in Polars, NaN
    here: skipped; NaN where a window has no value)."""
    from analytics.pipeline import _rolling_median

    rng = np.random.default_rng(n * 100 + k)
    B = rng.standard_t(2, size=(n, 7)) * 10.0 ** rng.integers(-8, 9, 7)
    B[:, 1] = np.round(B[:, 1])
    B[::2, 2], B[1::2, 2] = -0.0, 0.0
    B[rng.random(n) < 0.3, 5] = np.nan  # a column with gaps
    B[: n // 2, 6] = np.nan  # a column without values for a while
    want = pl.DataFrame(B, schema=list("abcdefg")).fill_nan(None).select(
        pl.all().rolling_median(k, min_samples=1)).fill_null(np.nan).to_numpy()
    np.testing.assert_array_equal(_rolling_median(B, k), want)
