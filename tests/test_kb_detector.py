"""The knowledge base as a signature detector next to the statistical ones: warm-up, the
final verdict (statistical OR signature), the "before a fact changed" reference, and
remediation parameters taking a fact's previous value. Recorded pipeline output from
tests/data/knowledge_base plus small hand-built frames."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analytics.pipeline import SCORES_SCHEMA, AnalysisResult, AnalyticsConfig, cohorts
from jobs.config import SweepConfig
from knowledge_base import HostFacts, fill_params, load_kb, match_windows
from knowledge_base.detector import (
    FINDINGS_OUT_SCHEMA,
    DetectionConfig,
    data_starts,
    detect,
    in_warmup,
)
from knowledge_base.facts import FactError

DATA = Path(__file__).parent / "data" / "knowledge_base"
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def ts(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def keys(host: str, starts: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"host": host, "window_start": [ts(s) for s in starts],
                         "window_end": [ts(s + 3) for s in starts]},
                        schema={"host": pl.String, "window_start": pl.Datetime("us", "UTC"),
                                "window_end": pl.Datetime("us", "UTC")})


@pytest.fixture(scope="module")
def rec() -> dict[str, pl.DataFrame]:
    return {t: pl.read_parquet(DATA / f"{t}.parquet") for t in ("features", "findings", "host_facts", "labels")}


# ----------------------------------------------------------------------- warm-up
def test_warmup_starts_at_data_start_restart_and_known_history() -> None:
    # h1 starts inside the frame, stops 10 min, restarts; h2's data begins at the frame's
    # read start and its first telemetry (from the lake) is 1 h earlier; h3 likewise but
    # the lake says it started 20 s before the frame
    f = pl.concat([keys("h1", [*range(100, 400), *range(1000, 1100)]), keys("h2", list(range(0, 300))),
                   keys("h3", list(range(0, 300)))])
    starts = data_starts(f, frame_start=ts(0), history_known={"h2": ts(-3600), "h3": ts(-20)},
                         restart_gap_s=300, slack=timedelta(seconds=6))
    got = {(h, s) for h, s, _ in starts.iter_rows()}
    assert got == {("h1", ts(100)), ("h1", ts(1000)), ("h2", ts(-3600)), ("h3", ts(-20))}
    probe = pl.concat([keys("h1", [100, 219, 220, 999, 1000, 1099]), keys("h2", [0, 5]), keys("h3", [0, 99, 100])])
    warm = in_warmup(probe, starts, 120).to_list()
    assert warm == [True, True, False, False, True, True, False, False, True, True, False]
    assert not in_warmup(probe, starts, 0).any()
    # without a read start the frame holds the whole data: its first window is the start
    s2 = data_starts(keys("h2", list(range(0, 300))), frame_start=None, history_known=None, restart_gap_s=300,
                     slack=timedelta(seconds=6))
    assert s2["run_start"].to_list() == [ts(0)]


def test_detection_config_and_scheduler_keys_are_validated() -> None:
    with pytest.raises(ValueError, match="min_confidence"):
        DetectionConfig(min_confidence=1.5)
    cfg = SweepConfig.from_mapping({"signature_detector": False, "warmup": "90s", "signature_min_confidence": 0.6})
    assert cfg.detection == DetectionConfig(signature=False, min_confidence=0.6, warmup_s=90.0)
    assert SweepConfig.from_mapping({"warmup": 0}).detection.warmup_s == 0.0
    with pytest.raises(ValueError, match=r"\[scheduler\] signature_detector: expected true or false"):
        SweepConfig.from_mapping({"signature_detector": "yes"})
    with pytest.raises(ValueError, match=r"\[scheduler\] warmup"):
        SweepConfig.from_mapping({"warmup": "soon"})


# ------------------------------------------------------------------------ verdict
def _result(rec: dict[str, pl.DataFrame], findings: pl.DataFrame | None = None) -> AnalysisResult:
    # the recorded run was analysed with the default settings (behaviour cohorts)
    return AnalysisResult(rec["features"], pl.DataFrame(schema=SCORES_SCHEMA),
                          rec["findings"] if findings is None else findings, AnalyticsConfig(),
                          cohorts(rec["features"], rec["host_facts"]))


def test_signature_detector_alone_finds_the_injection_and_writes_kb_scores(rec: dict[str, pl.DataFrame]) -> None:
    kb = load_kb()
    lab = rec["labels"].row(0, named=True)
    # no statistical finding at all: the signature detector must still report the throttle
    res = _result(rec, rec["findings"].clear())
    det = detect(res, rec["host_facts"], kb, DetectionConfig(warmup_s=0), keep=pl.lit(True))
    assert det.findings.schema == pl.Schema(FINDINGS_OUT_SCHEMA)
    inside = det.findings.filter((pl.col("host") == lab["host"]) & (pl.col("window_start") >= lab["time"] + timedelta(seconds=10))
                                 & (pl.col("window_end") <= lab["end"]))
    assert inside.height > 60
    assert set(inside["entry_id"].drop_nulls()) == {"gpu_power_throttle"}
    assert inside["detectors"].to_list()[0] == ["kb:gpu_power_throttle"]
    assert (inside["reference"] == "signature").all() and (inside["top_factors"].list.len() == 0).all()
    # one "kb" scores row per window, flagged exactly where a signature matched
    kbrows = det.scores.filter(pl.col("detector") == "kb")
    assert kbrows.height == rec["features"].height and (kbrows["reference"] == "signature").all()
    assert kbrows.schema == pl.Schema(SCORES_SCHEMA)
    assert kbrows["flagged"].sum() == det.findings.height
    assert (kbrows.filter("flagged")["score"] >= kbrows.filter("flagged")["threshold"]).all()
    assert (kbrows.filter(~pl.col("flagged"))["score"] == 0).all()
    # nothing on the healthy hosts
    assert set(det.findings["host"]) == {lab["host"]}


def test_statistical_findings_are_kept_tagged_and_warmup_suppresses_them(rec: dict[str, pl.DataFrame]) -> None:
    kb = load_kb()
    res = _result(rec)
    on = detect(res, rec["host_facts"], kb, DetectionConfig(warmup_s=0), keep=pl.lit(True))
    stat = rec["findings"].select("host", "window_start")
    assert stat.join(on.findings, on=["host", "window_start"], how="anti").is_empty()  # all kept
    tagged = on.findings.filter(pl.col("detectors").list.last().str.starts_with("kb:"))
    both = tagged.filter(pl.col("detectors").list.len() > 1)  # statistical detectors kept in front
    assert both.height > 0 and set(both["detectors"].list.first()) <= {"zscore", "iforest", "mahalanobis"}
    assert (tagged["detectors"].list.last().str.slice(3) == tagged["entry_id"]).mean() > 0.9  # type: ignore[operator]
    assert on.suppressed == 0
    # statistical only: the same findings, none tagged, no kb scores
    off = detect(res, rec["host_facts"], kb, DetectionConfig(signature=False, warmup_s=0), keep=pl.lit(True))
    assert off.findings.height == rec["findings"].height
    assert not off.findings["detectors"].list.eval(pl.element().str.starts_with("kb:")).list.any().any()
    assert off.scores.is_empty()
    # warm-up over the first 2 minutes: statistical flags there go (the recorded run starts
    # at 08:00 on every host, so no peer covers them), signature matches stay
    warm = detect(res, rec["host_facts"], kb, DetectionConfig(warmup_s=120), keep=pl.lit(True))
    early = rec["findings"].filter(pl.col("window_start") < ts(120))
    assert warm.suppressed == early.height > 0
    early_out = warm.findings.filter(pl.col("window_start") < ts(120))
    assert early_out.height < early.height
    assert all(any(d.startswith("kb:") for d in ds) for ds in early_out["detectors"].to_list())
    late = on.findings.filter(pl.col("window_start") >= ts(120)).select("host", "window_start")
    assert late.join(warm.findings, on=["host", "window_start"], how="anti").is_empty()


# --------------------------------------------------------- a single host, THP off
def _thp_host(change_at: float | None, n: int = 100, off_from: int = 40) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One host, no peers: huge-page coverage 0.55 then 0.015 from window ``off_from`` on
    (more than half of the frame); THP ``madvise`` until ``change_at`` then ``never``."""
    f = keys("solo", list(range(n))).with_columns(
        pl.Series("mem.hugepage_coverage", [0.55 + 0.005 * (i % 3) if i < off_from else 0.015 for i in range(n)]),
        pl.Series("mem.thp_fallback_share", [0.0] * n))
    rows = [(ts(0), "solo", "thp", "", "enabled", "madvise", None), (ts(0), "solo", "thp", "", "defrag", "madvise", None)]
    if change_at is not None:
        rows += [(ts(change_at), "solo", "thp", "", "enabled", "never", None),
                 (ts(change_at), "solo", "thp", "", "defrag", "never", None)]
    facts = pl.DataFrame(rows, orient="row", schema={"time": pl.Datetime("us", "UTC"), "host": pl.String,
                                                      "category": pl.String, "device": pl.String, "key": pl.String,
                                                      "value": pl.String, "value_num": pl.Float64})
    return f, facts


def test_a_fact_change_gives_a_single_host_its_reference_back() -> None:
    kb = load_kb()
    f, facts = _thp_host(change_at=42)
    m = match_windows(f, facts, kb).filter(pl.col("rank") == 1)
    thp = m.filter(pl.col("entry_id") == "thp_coverage_loss")
    assert thp.height >= 55 and (thp["window_start"] >= ts(42)).all()
    assert "mem.hugepage_coverage" in thp["matched_signals"].to_list()[0][0]
    # the same data without the change: the host's own history is mostly "off", no reference
    # says the coverage fell; on an idle host (page tables of ~2.5 % of RAM in 4 KiB pages)
    # nothing matches, with a footprint the level itself names it (from 0.015 on, not before)
    f2, facts2 = _thp_host(change_at=None)
    facts2 = facts2.with_columns(pl.lit("never").alias("value"))
    idle = f2.with_columns(pl.lit(5e-5).alias("mem.page_tables_share"))
    assert match_windows(idle, facts2, kb).filter(pl.col("entry_id") == "thp_coverage_loss").is_empty()
    loaded = match_windows(f2.with_columns(pl.lit(2e-4).alias("mem.page_tables_share")), facts2, kb)
    level = loaded.filter((pl.col("rank") == 1) & (pl.col("entry_id") == "thp_coverage_loss"))
    assert level.height == 60 and (level["window_start"] >= ts(40)).all()


def test_remediation_restores_the_mode_in_force_before_the_change() -> None:
    entry = load_kb().by_id["thp_coverage_loss"]
    assert entry.remediation is not None
    _, facts = _thp_host(change_at=42)
    hf = HostFacts.from_frame(facts, "solo", ts(60))
    assert hf.value("thp", "enabled") == "never"
    assert fill_params(entry.remediation.params, "", hf) == {"enabled": "madvise", "defrag": "madvise"}
    always = facts.with_columns(pl.when(pl.col("value") == "madvise").then(pl.lit("always"))
                                .otherwise(pl.col("value")).alias("value"))
    hf = HostFacts.from_frame(always, "solo", ts(60))
    assert fill_params(entry.remediation.params, "", hf)["enabled"] == "always"
    # before the change nothing has changed yet: the entry's fallback (madvise)
    hf0 = HostFacts.from_frame(always, "solo", ts(10))
    assert fill_params(entry.remediation.params, "", hf0) == {"enabled": "madvise", "defrag": "madvise"}
    with pytest.raises(FactError, match="never changed on solo and there is no fallback"):
        fill_params({"enabled": "{fact_before:thp.enabled}"}, "", hf0)


def test_fact_before_fallback_is_validated_on_load(tmp_path: Path) -> None:
    from knowledge_base import KBError, load_entry

    src = (Path(__file__).parent.parent / "knowledge_base" / "entries" / "thp_coverage_loss.toml").read_text()
    bad = tmp_path / "thp_coverage_loss.toml"
    bad.write_text(src.replace("{fact_before:thp.enabled|madvise}", "{fact_before:thp.enabled|sometimes}"))
    with pytest.raises(KBError, match=r"remediation.params.enabled: bad fallback 'sometimes'"):
        load_entry(bad)
    with pytest.raises(KBError, match="bad template"):
        bad.write_text(src.replace("{fact_before:thp.enabled|madvise}", "{fact_before:thp.enabled|}"))
        load_entry(bad)


# ------------------------------------------------------------------ cohorts
def test_warmup_cover_uses_the_cohorts_analytics_judged_with() -> None:
    """A host starting late, CFS-throttled, among three peers of the same hardware but other
    behaviour (GPU utilisation 0.1 against 0.9): with ``cohort_by = "hardware"`` analytics judges it
    against those peers, so the peers (out of their warm-up) cover its warm-up findings.
    The detector must take that cohort, not recompute behaviour cohorts (which would
    leave the host alone and drop the findings)."""
    from analytics.features import WindowSpec
    from analytics.pipeline import analyze

    rng = np.random.default_rng(3)
    parts = []
    for h, first, util, throttled in (("a", 600, 0.1, 0.6), ("b", 0, 0.9, 0.0), ("c", 0, 0.9, 0.0),
                                      ("d", 0, 0.9, 0.0)):
        starts = list(range(first, 900))
        parts.append(keys(h, starts).with_columns(
            pl.Series("gpu.util@gpu0", util + rng.normal(0, 0.01, len(starts))),
            pl.Series("cgroup.throttled_share@workload.slice", throttled + np.abs(rng.normal(0, 0.01, len(starts))))))
    feats = pl.concat(parts)
    cfg = AnalyticsConfig(window=WindowSpec(3, 1), cohort_by="hardware", reference="cohort",
                          warmup=timedelta(0), detectors=("zscore",), combine="any")
    res = analyze({}, cfg, features=feats)
    early = res.findings.filter((pl.col("host") == "a") & (pl.col("window_start") < ts(720)))
    assert early.height > 0 and (early["reference"] == "cohort").all()
    det = detect(res, None, load_kb(), DetectionConfig(signature=False, warmup_s=120), keep=pl.lit(True))
    assert det.suppressed == 0
    assert early.select("host", "window_start").join(det.findings, on=["host", "window_start"], how="anti").is_empty()


def _diverse_fleet(shift_at: int | None) -> pl.DataFrame:
    """Four hosts of one cohort for 400 s; h3 spends 9 points more of its CPU time in the
    kernel than its peers (a different network stack: benign diversity) from the start, or
    15 points more only from ``shift_at`` (a change its own history sees). (No entry reads
    ``cpu.system_share``; GPU temperature, used here before, is context since 2026-12-04.)"""
    rng = np.random.default_rng(0)
    parts = []
    for h in range(4):
        starts = list(range(400))
        more = np.zeros(400)
        if h == 3:
            more[(shift_at or 0):] = 0.09 if shift_at is None else 0.15
        parts.append(keys(f"h{h}", starts).with_columns(
            pl.Series("cpu.system_share@node0", 0.05 + more + rng.normal(0, 0.004, 400)),
            pl.Series("gpu.util@gpu0", 90 + rng.normal(0, 2, 400))))
    return pl.concat(parts)


def test_a_host_that_always_differed_from_its_peers_is_no_finding() -> None:
    """Only the cohort flags h3 (its own history says it has always been this way) and no
    entry names a cause: benign diversity, not an incident (on a healthy simulated fleet
    these windows made long unmatched incidents, flipping on analysis-step edges). With
    ``peer_only = True`` they are kept; a host that *changes*, so that its own detectors'
    vote flags the window too, is still a finding."""
    from analytics.pipeline import analyze

    res = analyze({}, AnalyticsConfig(warmup=timedelta(0)), features=_diverse_fleet(None), score_since=ts(300))
    flagged = res.findings.filter(pl.col("host") == "h3")
    assert flagged.height > 50 and (flagged["reference"] == "cohort").all()  # the cohort does flag it
    det = detect(res, None, load_kb(), keep=pl.lit(True))
    assert det.findings.is_empty() and det.peer_only == flagged.height
    kept = detect(res, None, load_kb(), DetectionConfig(peer_only=True), keep=pl.lit(True))
    assert kept.findings.height == flagged.height and kept.peer_only == 0
    moved = analyze({}, AnalyticsConfig(warmup=timedelta(0)), features=_diverse_fleet(330), score_since=ts(300))
    got = detect(moved, None, load_kb(), keep=pl.lit(True)).findings
    assert got.filter((pl.col("host") == "h3") & (pl.col("window_start") >= ts(335))).height > 30
    assert SweepConfig.from_mapping({"peer_only_findings": True}).detection.peer_only is True
    with pytest.raises(ValueError, match=r"\[scheduler\] peer_only_findings: expected true or false"):
        SweepConfig.from_mapping({"peer_only_findings": "yes"})
