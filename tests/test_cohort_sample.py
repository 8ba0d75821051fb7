"""The cohort reference drawn from a bounded sample of the cohort: which hosts, and that a
host's verdict does not depend on the hosts outside the sample (fleet size), in the
analytics and in the signature matcher."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace
from datetime import timedelta

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analytics.pipeline import (
    AnalyticsConfig,
    analyze,
    cohort_references,
    cohort_sample,
    matcher_sample,
)
from jobs.config import SweepConfig
from jobs.step import sweep_step
from jobs.telemetry import Loaded
from knowledge_base import load_kb, matcher
from knowledge_base.detector import DetectionConfig
from knowledge_base.matcher import (
    MatchConfig,
    cohort_peers,
    hardware_cohorts,
    match_findings,
    reference_columns,
)
from tests.test_features import load_synth

HOSTS = list("abcdef")


def test_cohort_sample_is_bounded_stable_and_in_name_order() -> None:
    assert cohort_sample(["x", "b", "a"], 3) == ["a", "b", "x"]
    members = [f"gpu-{i:03d}" for i in range(40)]
    chosen = cohort_sample(members, 16)
    assert len(chosen) == 16 and set(chosen) < set(members) and chosen == sorted(chosen)
    shuffled = members[:]
    random.Random(1).shuffle(shuffled)
    assert cohort_sample(shuffled, 16) == chosen
    # a host joining the fleet either enters the sample (displacing one) or changes nothing
    for new in (f"gpu-{i:03d}" for i in range(40, 60)):
        after = set(cohort_sample([*members, new], 16))
        assert after == set(chosen) or (new in after and len(after - set(chosen)) == 1)
    # not the first names: a sample of 16 out of 40 that were the 16 first is unlikely by chance
    assert chosen != members[:16]


def test_a_sample_keeps_the_shares_of_the_behaviour_cohorts_inside_a_hardware_cohort() -> None:
    # 96 serving and 32 training hosts of one GPU model: the matcher's sample of 16 holds
    # 12 and 4 (a hash alone draws what it draws), the lowest hashes of each
    serving = [f"gpu-{i:03d}" for i in range(96)]
    training = [f"gpu-{i:03d}" for i in range(96, 128)]
    strata = {**{h: "8xH100/serving" for h in serving}, **{h: "8xH100/training" for h in training}}
    chosen = cohort_sample([*serving, *training], 16, strata)
    assert len(chosen) == 16 and chosen == sorted(chosen)
    assert len(set(chosen) & set(serving)) == 12 and len(set(chosen) & set(training)) == 4
    assert set(chosen) & set(serving) == set(cohort_sample(serving, 12))
    assert set(chosen) & set(training) == set(cohort_sample(training, 4))
    # uneven shares: largest remainder (16 x 5/40 = 2, 16 x 7/40 = 2.8, 16 x 28/40 = 11.2)
    groups = {"a": 5, "b": 7, "c": 28}
    members = [f"{g}-{i}" for g, n in groups.items() for i in range(n)]
    got = cohort_sample(members, 16, {m: m[0] for m in members})
    assert {g: sum(m[0] == g for m in got) for g in groups} == {"a": 2, "b": 3, "c": 11}
    # a cohort within its bound, or one stratum: exactly the unstratified sample
    assert cohort_sample(serving[:10], 16, strata) == sorted(serving[:10])
    assert cohort_sample(serving, 16, strata) == cohort_sample(serving, 16)
    # per hardware cohort: another GPU model is sampled on its own
    other = [f"a100-{i}" for i in range(20)]
    hardware = {**dict.fromkeys([*serving, *training], "8xH100"), **dict.fromkeys(other, "8xA100")}
    assert matcher_sample(hardware, strata, 16) == set(chosen) | set(cohort_sample(other, 16))


def fleet(hosts: list[str], far: str, seconds: int = 240) -> tuple[dict[str, pl.LazyFrame], pl.DataFrame]:
    """Identical synthetic 8-GPU hosts; host ``far``'s mlx5_0 interrupts serviced on the far
    NUMA node from the start (invisible to its own history, only its peers show it)."""
    synth = load_synth()
    frames: dict[str, list[pl.DataFrame]] = {}
    for i, h in enumerate(hosts):
        for k, v in synth.synth_frames(host=h, seconds=seconds, seed=i).items():
            frames.setdefault(k, []).append(v)
    out = {k: pl.concat(v) for k, v in frames.items()}
    flip = (pl.col("host") == far) & pl.col("device").str.starts_with("mlx5_0-")
    out["interrupts"] = out["interrupts"].with_columns(
        pl.when(flip).then(pl.when(pl.col("node") == "0").then(pl.lit("1")).otherwise(pl.lit("0")))
        .otherwise(pl.col("node")).alias("node"))
    facts = out.pop("host_facts")
    return {k: v.lazy() for k, v in out.items()}, facts


def _cohort_scores(res, host: str) -> pl.DataFrame:
    return res.scores.filter((pl.col("host") == host) & (pl.col("reference") == "cohort")).sort(
        "window_start", "detector")


def test_hosts_outside_the_sample_are_judged_against_it_and_change_no_verdict() -> None:
    cfg = AnalyticsConfig(warmup=timedelta(0), cohort_by="hardware", cohort_sample=3)
    sample = cohort_sample(HOSTS, 3)
    outside = [h for h in HOSTS if h not in sample]
    far = outside[0]  # the faulty host is outside the sample: judged against the sample's fit
    frames, facts = fleet(HOSTS, far)
    res = analyze(frames, cfg, host_facts=facts)
    assert res.cohorts and len(set(res.cohorts.values())) == 1
    flagged = _cohort_scores(res, far).filter(pl.col("detector") == "combined")["flagged"]
    assert flagged.mean() > 0.9
    others = res.scores.filter((pl.col("host") != far) & (pl.col("reference") == "cohort")
                               & (pl.col("detector") == "combined"))
    assert others["flagged"].mean() < 0.05
    # the hosts outside the sample share one reference (hence one threshold per detector)
    thr = res.scores.filter(pl.col("host").is_in(outside) & (pl.col("reference") == "cohort")
                            & (pl.col("detector") == "zscore"))["threshold"]
    assert thr.n_unique() == 1
    # a healthy host outside the sample leaves the fleet: nobody else's verdict moves
    gone = outside[1]
    keep = [h for h in HOSTS if h != gone]
    res2 = analyze({k: v.filter(pl.col("host") != gone) for k, v in frames.items()}, cfg,
                   host_facts=facts.filter(pl.col("host") != gone))
    for h in keep:
        assert_frame_equal(_cohort_scores(res, h), _cohort_scores(res2, h), check_exact=True)
    # without the bound (every host a peer) the same departure moves the others' scores
    full = AnalyticsConfig(warmup=timedelta(0), cohort_by="hardware", cohort_sample=16)
    a, b = analyze(frames, full, host_facts=facts), analyze(
        {k: v.filter(pl.col("host") != gone) for k, v in frames.items()}, full,
        host_facts=facts.filter(pl.col("host") != gone))
    assert not _cohort_scores(a, sample[0])["score"].equals(_cohort_scores(b, sample[0])["score"])


def test_matcher_cohort_reference_ignores_hosts_outside_the_sample() -> None:
    sample = cohort_sample(HOSTS, 3)
    far = [h for h in HOSTS if h not in sample][0]
    gone = [h for h in HOSTS if h not in sample][1]
    frames, facts = fleet(HOSTS, far)
    res = analyze(frames, AnalyticsConfig(warmup=timedelta(0), cohort_by="hardware"), host_facts=facts)
    findings = res.findings.filter(pl.col("host") == far)
    assert findings.height
    cfg = MatchConfig(cohort_sample=3)
    m1 = match_findings(findings, res.features, facts, config=cfg)
    m2 = match_findings(findings, res.features.filter(pl.col("host") != gone),
                        facts.filter(pl.col("host") != gone), config=cfg)
    assert_frame_equal(m1, m2, check_exact=True)
    # the bound is what makes it so: with every host a peer, the departure moves the confidences
    m3 = match_findings(findings, res.features, facts, config=MatchConfig())
    m4 = match_findings(findings, res.features.filter(pl.col("host") != gone),
                        facts.filter(pl.col("host") != gone), config=MatchConfig())
    assert not np.array_equal(m3["confidence"].to_numpy(), m4["confidence"].to_numpy())


def test_a_step_judged_in_batches_of_hosts_gives_the_verdict_of_one_frame() -> None:
    """The scheduler's analysis step holds a batch of hosts at a time (bounded memory);
    cohorts, samples, cohort references and warm-up runs are formed over every host, so
    the scores, findings (matches included) and incidents equal those of one frame."""
    synth = load_synth()
    sample = cohort_sample(HOSTS, 3)
    frames, facts = fleet(HOSTS, [h for h in HOSTS if h not in sample][0], seconds=300)
    a = AnalyticsConfig(warmup=timedelta(0), cohort_sample=3)
    kb = load_kb()
    out = {}
    for n in (len(HOSTS), 2, 1):
        cfg = SweepConfig(analytics=a, batch_hosts=n, detection=DetectionConfig(warmup_s=0.0))
        out[n] = sweep_step(Loaded(frames, facts), cfg, kb, since=synth.T0, until=synth.T0 + timedelta(minutes=5),
                            horizon=None)
    one = out[len(HOSTS)]
    assert one.findings.height and one.findings["entry_id"].drop_nulls().len()  # a fault found and named
    for n in (2, 1):
        for name in ("scores", "findings", "incidents"):
            x, y = getattr(one, name), getattr(out[n], name)
            keys = [c for c in ("host", "window_start", "detector", "reference", "incident_id") if c in x.columns]
            assert_frame_equal(x.sort(keys), y.sort(keys), check_exact=True)


def test_a_cohorts_reference_is_the_same_fitted_with_the_other_cohorts_or_alone() -> None:
    """A step's cohort references are fitted all at once, or a cohort an item on the workers
    (the live step on a pool). Each cohort draws from a generator of its own, so a reference
    that subsamples its peers' windows (more than ``max_reference_rows``) is the same either
    way, bit for bit."""
    frames, facts = fleet(HOSTS, "a", seconds=240)
    feats = analyze(frames, AnalyticsConfig(warmup=timedelta(0)), host_facts=facts).features
    cohort_of = {h: "x" if h in "abc" else "y" for h in HOSTS}
    cfg = AnalyticsConfig(warmup=timedelta(0), cohort_sample=3, max_reference_rows=200)
    since = feats["window_start"].min() + timedelta(seconds=60)
    together = cohort_references(feats, cfg, cohort_of, score_since=since)
    assert sorted(together) == ["x", "y"]
    for label in ("x", "y"):
        mine = [h for h, c in cohort_of.items() if c == label]
        alone = cohort_references(feats.filter(pl.col("host").is_in(mine)), cfg, dict.fromkeys(mine, label),
                                  score_since=since)
        assert len(together[label].fits) == 3  # (each fitted on 2 x ~180 windows: subsampled to 200)
        assert pickle.dumps(alone[label]) == pickle.dumps(together[label]), label


def test_a_host_known_from_its_facts_only_does_not_break_the_cohorts() -> None:
    """Facts name a host with no window in the frame (its agent stopped): the others are
    still clustered (this raised an IndexError)."""
    frames, facts = fleet(list("abcd"), "a", seconds=120)
    res = analyze({k: v.filter(pl.col("host") != "d") for k, v in frames.items()},
                  AnalyticsConfig(warmup=timedelta(0)), host_facts=facts)
    assert set(res.cohorts) == {"a", "b", "c"} and len(set(res.cohorts.values())) == 1
    assert res.findings.filter(pl.col("host") == "a").height  # and the faulty host is still judged


def test_the_matchers_cohort_references_read_once_for_a_step_match_as_the_batch_frame_holding_the_sample() -> None:
    """A sweep step reads the matcher sample's history once (``cohort_peers``) instead of in
    every batch's frame: a batch matched against its own windows and the step's peers gets
    the matches a frame holding the batch and the sample gives, for a sampled host and for one
    outside the sample."""
    sample = cohort_sample(HOSTS, 3)
    outside = [h for h in HOSTS if h not in sample]
    frames, facts = fleet(HOSTS, outside[0])
    res = analyze(frames, AnalyticsConfig(warmup=timedelta(0), cohort_by="hardware"), host_facts=facts)
    kb = load_kb()
    feats = res.features
    batch = [outside[0], sample[0]]  # the faulty host (outside the sample) and a sampled one
    # every window of the batch, as the signature detector matches them
    findings = feats.filter(pl.col("host").is_in(batch)).select("host", "window_start", "window_end")
    hardware = hardware_cohorts(feats, facts)
    cfg = MatchConfig(cohort_sample=3, sampled=frozenset(sample))
    with_sample = match_findings(findings, feats.filter(pl.col("host").is_in([*batch, *sample])), facts, kb, cfg)
    peers = cohort_peers(feats.filter(pl.col("host").is_in(sample)).select(
        "host", "window_start", "window_end", *reference_columns(feats.columns, kb)), hardware, kb)
    alone = feats.filter(pl.col("host").is_in(batch))
    got = match_findings(findings, alone, facts, kb, replace(cfg, peers=peers))
    assert with_sample.filter(pl.col("host") == outside[0])["matched"].any()
    assert with_sample.filter(pl.col("host") == sample[0]).height
    assert_frame_equal(with_sample, got, check_exact=True)
    # without them the batch's frame has no peers outside the batch: other confidences
    bare = match_findings(findings, alone, facts, kb, cfg)
    assert not np.array_equal(bare["confidence"].to_numpy(), got["confidence"].to_numpy())
    # peers read with other columns than the frame's are refused, not silently misaligned
    narrow = cohort_peers(feats.filter(pl.col("host").is_in(sample)).select(
        "host", "window_start", "window_end", *reference_columns(feats.columns, kb)[1:]), hardware, kb)
    with pytest.raises(ValueError, match="other feature columns"):
        match_findings(findings, alone, facts, kb, replace(cfg, peers=narrow))


def test_references_read_their_rows_from_the_frame() -> None:
    """A host's own past (one run of the frame's rows) and rows of several hosts, in any
    order (a cohort's, the windows matched), are read from the frame: the frame's values,
    infinities as NaN."""
    sample = cohort_sample(HOSTS, 3)
    frames, facts = fleet(HOSTS, sample[0])
    feats = analyze(frames, AnalyticsConfig(warmup=timedelta(0), cohort_by="hardware"), host_facts=facts).features
    kb = load_kb()
    cols = reference_columns(feats.columns, kb)
    sel = feats.sort("host", "window_start").select("host", *cols)
    at = int(sel.with_row_index("_i").filter(pl.col("host") == sample[0])["_i"][15])  # an inf in the run below
    sel = sel.with_columns(pl.when(pl.int_range(pl.len()) == at).then(float("inf")).otherwise(pl.col(cols[0]))
                           .alias(cols[0]))
    peers = matcher._peers(sel, cols, hardware_cohorts(feats, facts), lambda present: present)
    rows = peers.rows_of[sample[0]]
    run, scattered = rows[5:60], np.array([rows[40], rows[3], peers.rows_of[sample[1]][7]])
    own, picked = peers.take(run), peers.gather(scattered)
    X = sel.select(cols).to_numpy()
    X[~np.isfinite(X)] = np.nan
    np.testing.assert_array_equal(own, X[run])
    np.testing.assert_array_equal(picked, X[scattered])
    cohort = np.sort(np.concatenate([rows[::7], peers.rows_of[sample[1]][::5]]))
    np.testing.assert_array_equal(peers.take(cohort), X[cohort])
    assert own.dtype == picked.dtype == np.float64 and own.flags.writeable
    assert np.isnan(own[10, 0]) and np.isfinite(own).sum() > own.size // 2
