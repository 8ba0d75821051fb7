"""Incidents visible while they are open: a simulated lake swept cycle by cycle as the
scheduler does (one run_cycle per minute), the incident appears open once it persisted, is
updated, then closed; one remediation proposal; readers see each incident's latest row."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from jobs import query
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from knowledge_base import latest_incidents
from remediation.queue import Queue, default_path

START = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
ONSET = START + timedelta(minutes=3)
FAULT_END = START + timedelta(minutes=8)

# sim-00: THP off from minute 3 to minute 8; sim-01 healthy (the cohort)
SCENARIO = """
name = "open-incident"
seed = 7
start = "2026-01-05T08:00:00Z"
duration = "11m"

[[hosts]]
name = "sim-00"
workload = "llm_serving"

[[hosts]]
name = "sim-01"
workload = "llm_serving"

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "3m"
duration = "5m"
severity = 0.8
"""


@pytest.fixture(scope="module")
def thp_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jobs.cli import main

    d = tmp_path_factory.mktemp("open-inc")
    (d / "s.toml").write_text(SCENARIO)
    assert main(["simulate", "--lake", str(d / "lake"), "--scenario", str(d / "s.toml")]) == 0
    return d / "lake"


@pytest.fixture
def thp_lake(thp_template: Path, tmp_path: Path) -> Path:
    shutil.copytree(thp_template, tmp_path / "lake")
    return tmp_path / "lake"


def _thp_rows(root: Path) -> pl.DataFrame:
    if "incidents" not in lake.tables(root):
        return pl.DataFrame()
    rows = lake.read(root, "incidents").filter(pl.col("entry_id") == "thp_coverage_loss")
    return rows.sort("updated") if "updated" in rows.columns else rows


def test_incident_is_open_after_persistence_updated_then_closed_with_one_proposal(thp_lake: Path) -> None:
    cfg = SweepConfig(lag=timedelta(0), compact_every=None)
    seen_open_at: int | None = None
    states: list[list[str]] = []
    # cycle k sweeps up to START + k minutes, as the scheduler does every minute
    for k in range(1, 12):
        assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=k)) is not None
        rows = _thp_rows(thp_lake)
        states.append(rows["state"].to_list() if "state" in rows.columns else ["closed"] * rows.height)
        if seen_open_at is None and rows.height:
            seen_open_at = k
            assert states[-1] == ["open"], states
            # the proposal comes from the open incident, at once
            with Queue(default_path(thp_lake)) as q:
                [action] = q.actions()
            assert (action.host, action.entry_id, action.incident_id) == ("sim-00", "thp_coverage_loss",
                                                                          rows["incident_id"][0])
    # onset at minute 3: the cycle to minute 4 is the first whose data covers a minute of it
    assert seen_open_at is not None and seen_open_at <= 5, states
    rows = _thp_rows(thp_lake)
    assert rows["incident_id"].n_unique() == 1  # one incident, updated in place (same id)
    opens = rows.filter(pl.col("state") == "open")
    assert opens.height >= 3  # updated while it lasted
    assert opens["n_windows"].is_sorted() and opens["n_windows"][-1] > opens["n_windows"][0]
    assert opens["updated"].is_unique().all()
    [closed] = rows.filter(pl.col("state") == "closed").iter_rows(named=True)
    assert closed["updated"] > opens["updated"].max()
    assert abs((closed["start"] - ONSET).total_seconds()) < 30
    assert abs((closed["end"] - FAULT_END).total_seconds()) < 30
    # ranked on the host fact (one cause, one incident: knowledge_base.incidents)
    assert "fact thp.enabled == 'never' held in" in closed["explanation"]
    latest = latest_incidents(lake.read(thp_lake, "incidents"))
    assert latest["incident_id"].is_unique().all()
    assert latest.filter(pl.col("entry_id") == "thp_coverage_loss")["state"].to_list() == ["closed"]
    with Queue(default_path(thp_lake)) as q:
        assert len(q.actions()) == 1  # one proposal across every update
    rem = lake.read(thp_lake, "remediations")
    assert rem.unique(["action_id", "updated", "attached_incidents"]).height == rem.height  # no repeated rows
    # SQL readers see the latest row of each incident
    got = query.run_query(thp_lake, "SELECT incident_id, state, n_windows FROM incidents "
                                    "WHERE entry_id = 'thp_coverage_loss'")
    assert got.rows() == [(closed["incident_id"], "closed", closed["n_windows"])]


def test_persistence_threshold_holds_back_short_incidents(thp_lake: Path) -> None:
    """min_incident_s: an incident is raised once it spans that long; until then nothing is
    written, and the open row's span is at least the threshold."""
    cfg = SweepConfig(lag=timedelta(0), compact_every=None, min_incident_s=90.0)
    assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=4)) is not None
    assert _thp_rows(thp_lake).is_empty()  # ~60 s of fault: not persisted yet
    with Queue(default_path(thp_lake)) as q:
        assert q.actions() == []
    assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=5)) is not None
    rows = _thp_rows(thp_lake)
    assert rows["state"].to_list() == ["open"]
    assert (rows["end"][0] - rows["start"][0]).total_seconds() >= 90


def test_latest_incidents_takes_each_incidents_last_row() -> None:
    t = START
    df = pl.DataFrame({
        "incident_id": ["a", "a", "a", "b"],
        "end": [t, t + timedelta(seconds=5), t + timedelta(seconds=5), t],
        "n_windows": [1, 5, 5, 2],
        "state": ["open", "open", "closed", None],  # b: a row written before states existed
        "updated": [t, t + timedelta(seconds=60), t + timedelta(seconds=60), None],
    })
    got = latest_incidents(df).sort("incident_id")
    assert got.select("incident_id", "state", "n_windows").rows() == [("a", "closed", 5), ("b", "closed", 2)]


def test_an_open_incident_no_longer_raised_is_superseded_not_left_open(tmp_path: Path) -> None:
    """A stored open incident of a host's carried segment that the next step does not raise
    (its windows joined an earlier incident) gets a ``superseded`` row; readers drop it."""
    from jobs.cycle import _changed_incidents
    from jobs.watermarks import HostMark
    from knowledge_base import INCIDENT_SCHEMA, build_incidents
    from tests.test_one_cause import KB, T0, _frames, memory_hog_story

    m, f = _frames(memory_hog_story())
    upto = pl.col("window_start") < T0 + timedelta(seconds=31)  # CPU windows, then storage's first
    early = build_incidents(m.filter(upto), f.filter(upto), KB, max_gap_s=1e9)
    assert sorted(early["entry_id"].to_list()) == ["cpu_noisy_neighbour", "storage_contention"]
    h1 = early["start"].min()
    stored = early.with_columns(pl.lit("open").alias("state"), pl.col("end").alias("updated"))
    lake.write_table(tmp_path, "incidents", stored.select(pl.col("start").alias("time"), pl.all()))
    later = build_incidents(m, f, KB, max_gap_s=1e9).with_columns(pl.lit("open").alias("state"))
    assert later["entry_id"].to_list() == ["memory_pressure"]  # the hog's one incident took storage in
    horizon = h1 + timedelta(minutes=3)
    rows = _changed_incidents(tmp_path, {"h1": HostMark(horizon, h1)}, ["h1"], later.cast(INCIDENT_SCHEMA), [],
                              horizon)
    got = dict(rows.select("incident_id", "state").iter_rows())
    storage_id = early.filter(pl.col("entry_id") == "storage_contention")["incident_id"][0]
    assert got == {later["incident_id"][0]: "open", storage_id: "superseded"}
    assert rows.filter(pl.col("state") == "superseded")["updated"].to_list() == [horizon]
    lake.write_table(tmp_path, "incidents", rows.select(pl.col("start").alias("time"), pl.all()))
    everything = lake.read(tmp_path, "incidents")
    assert latest_incidents(everything)["entry_id"].to_list() == ["memory_pressure"]
    assert latest_incidents(everything, superseded=True).height == 2
    # the next step writes nothing more for it
    again = _changed_incidents(tmp_path, {"h1": HostMark(horizon, h1)}, ["h1"], later.cast(INCIDENT_SCHEMA), [],
                               horizon + timedelta(minutes=1))
    assert again.is_empty()


def test_sweep_config_min_incident_s() -> None:
    assert SweepConfig.from_mapping({"min_incident_s": "2m"}).min_incident_s == 120.0
    assert SweepConfig.from_mapping({"min_incident_s": 30}).min_incident_s == 30.0
    with pytest.raises(ValueError, match="min_incident_s"):
        SweepConfig.from_mapping({"min_incident_s": "1h"})  # not below max_incident (15 min)
    with pytest.raises(ValueError, match="min_incident_s"):
        SweepConfig.from_mapping({"min_incident_s": "soon"})
    assert SweepConfig().min_unmatched_s == 120.0
    assert SweepConfig.from_mapping({"min_unmatched_s": "3m"}).min_unmatched_s == 180.0
    with pytest.raises(ValueError, match="min_unmatched_s"):
        SweepConfig.from_mapping({"min_unmatched_s": -1})


def _fast_cfg(**kw: object) -> SweepConfig:
    from jobs.config import analytics_from_mapping

    a = analytics_from_mapping({"detectors": ["zscore", "mahalanobis"], "vote_k": 1, "history": "4m",
                                "warmup": "30s"})
    return SweepConfig(analytics=a, lag=timedelta(0), compact_every=None, queue_remediations=False,
                       **kw)  # type: ignore[arg-type]


MINUTES = 8


@pytest.fixture(scope="module")
def throttle_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hosts, 8 minutes; a GPU power throttle on sim-01 from 3m to the end (most of the
    host's data: a reference taken over all of it would be the fault)."""
    from ingest.simulator import from_dict, simulate

    root = tmp_path_factory.mktemp("chunking") / "lake"
    sc = from_dict({"seed": 3, "duration": f"{MINUTES}m", "hosts": 2, "injections": [
        {"type": "gpu_power_throttle", "hosts": ["sim-01"], "start": "3m", "duration": "5m", "severity": 0.9}]})
    sink = lake.LakeSink(root)
    simulate(sc, [sink])
    sink.close()
    return root


def _sweep_three_ways(template: Path, tmp: Path, first_cycle: int = 1,
                      **kw: object) -> dict[str, tuple[pl.DataFrame, pl.DataFrame]]:
    """The lake swept live (a cycle every minute, at odd seconds, from minute
    ``first_cycle``), in 2-minute chunks and in one backfill: (findings, latest incidents)
    of each."""
    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    out = {}
    for way in ("live", "2m", "backfill"):
        root = tmp / way
        shutil.copytree(template, root)
        if way == "live":
            cfg = _fast_cfg(**kw)
            for k in range(first_cycle, MINUTES + 1):
                run_cycle(root, cfg, now=t0 + timedelta(minutes=k, seconds=23), until=t0 + timedelta(minutes=MINUTES))
        else:
            cfg = _fast_cfg(chunk=timedelta(minutes=2) if way == "2m" else timedelta(hours=1), **kw)
            run_cycle(root, cfg, now=t0 + timedelta(minutes=MINUTES))
        f = lake.read(root, "findings").drop("time").sort("host", "window_start")
        inc = latest_incidents(lake.read(root, "incidents")).drop("time", "updated").sort("host", "start", "incident_id")
        out[way] = (f, inc)
    return out


def _assert_same_verdicts(ways: dict[str, tuple[pl.DataFrame, pl.DataFrame]]) -> None:
    """Live and 2-minute chunks gave the backfill's findings (scores to 1e-9) and incidents."""
    f0, i0 = ways["backfill"]
    for way in ("live", "2m"):
        f, inc = ways[way]
        assert f.select("host", "window_start", "reference", "entry_id").equals(
            f0.select("host", "window_start", "reference", "entry_id")), way
        assert ((f["score"] - f0["score"]).abs().max() or 0.0) < 1e-9, way  # type: ignore[operator]
        cols = ["incident_id", "host", "start", "end", "n_windows", "status", "entry_id", "state"]
        assert inc.select(cols).equals(i0.select(cols)), way


def test_verdict_does_not_depend_on_chunking(throttle_template: Path, tmp_path: Path) -> None:
    """The same lake swept live every minute, in 2-minute chunks and in one backfill gives the
    same findings (windows, scores, matches) and the same incidents."""
    ways = _sweep_three_ways(throttle_template, tmp_path)
    f0, i0 = ways["backfill"]
    [throttle] = i0.filter(pl.col("entry_id") == "gpu_power_throttle").iter_rows(named=True)
    # matched from its onset for at least half the 4-minute history (then its past is mostly the fault)
    assert throttle["host"] == "sim-01" and throttle["n_windows"] >= 100
    assert abs((throttle["start"] - datetime(2026, 1, 5, 8, 3, tzinfo=UTC)).total_seconds()) <= 5
    _assert_same_verdicts(ways)


def test_steps_longer_than_the_cadence_are_judged_whole(throttle_template: Path, tmp_path: Path) -> None:
    """2-minute analysis steps swept by a cycle every minute: a cycle that finds every host
    at a step's start waits for the step to end instead of judging its first minute alone,
    so live, 2-minute chunks and a backfill give the same verdicts. (From minute 2: a lake
    whose every host started inside the current step has its data so far processed, the
    first seconds of a new fleet, inside its warm-up.)"""
    step = timedelta(minutes=2)
    ways = _sweep_three_ways(throttle_template, tmp_path, first_cycle=2, analysis_step=step)
    assert ways["backfill"][0].filter(pl.col("entry_id") == "gpu_power_throttle").height >= 100
    _assert_same_verdicts(ways)
    # a new fleet's first step is not held back, twice in the step; the next waits for its end
    root = tmp_path / "fresh"
    shutil.copytree(throttle_template, root)
    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    horizons = []
    for at in (timedelta(minutes=1, seconds=23), timedelta(minutes=1, seconds=50), timedelta(minutes=2, seconds=23)):
        s = run_cycle(root, _fast_cfg(analysis_step=step), now=t0 + at)
        assert s is not None and s.chunks
        horizons.append(s.horizon - t0)
    assert horizons == [timedelta(minutes=1, seconds=23), timedelta(minutes=1, seconds=50), step]


def test_analysis_step_config() -> None:
    assert SweepConfig.from_mapping({"analysis_step": "off"}).analysis_step is None
    assert SweepConfig.from_mapping({"analysis_step": "5m"}).analysis_step == timedelta(minutes=5)
    with pytest.raises(ValueError, match="analysis_step"):
        SweepConfig.from_mapping({"analysis_step": "1500ms"})  # not a multiple of the 1-s stride


def test_signature_matching_judges_against_the_past_only(throttle_template: Path) -> None:
    """With reference_before (what each analysis step uses), a window's match does not change
    when later windows join the features frame: its host's reference is its past only."""
    from analytics.features import compute_features
    from jobs.telemetry import load_lake
    from knowledge_base import load_kb
    from knowledge_base.matcher import MatchConfig, match_findings

    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    onset = t0 + timedelta(minutes=3)
    loaded = load_lake(throttle_template, t0, t0 + timedelta(minutes=MINUTES), None)
    feats = compute_features(loaded.frames, host_facts=loaded.facts)
    now = feats.filter(pl.col("window_end") <= onset + timedelta(seconds=40))  # what a live step sees
    keys = now.filter((pl.col("host") == "sim-01") & (pl.col("window_start") >= onset + timedelta(seconds=5))
                      ).select("host", "window_start", "window_end")
    kb = load_kb()
    cfg = MatchConfig(reference_before=onset)
    cols = ["host", "window_start", "rank", "entry_id", "confidence", "matched"]
    live = match_findings(keys, now, loaded.facts, kb, cfg).select(cols).sort(cols)
    later = match_findings(keys, feats, loaded.facts, kb, cfg).select(cols).sort(cols)
    assert live.filter(pl.col("matched") & (pl.col("entry_id") == "gpu_power_throttle")).height == keys.height
    assert live.equals(later)


# ------------------------------------------------------------- fit once, score many


def _refit_cfg(**kw: object) -> SweepConfig:
    from jobs.config import analytics_from_mapping

    a = analytics_from_mapping({"detectors": ["zscore", "mahalanobis"], "vote_k": 1, "history": "4m",
                                "warmup": "30s", "refit": "2m"})
    return SweepConfig(analytics=a, lag=timedelta(0), compact_every=None, queue_remediations=False,
                       **kw)  # type: ignore[arg-type]


def test_refit_epochs_verdict_does_not_depend_on_chunking(throttle_template: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With references refitted every 2 minutes on the clock, live, 2-minute chunks and one
    backfill still give the same findings and incidents; each refit epoch's references are
    fitted once (plus one fit per step while the hosts have less than their warm-up of
    history before the epoch: the fleet's first epoch), not once per one-minute step."""
    import jobs.step as step

    calls: list[int] = []
    real_fit = step.fit

    def counted(features: pl.DataFrame, *a: object, **kw: object) -> object:
        if features.height:  # (the first epoch's reference is empty)
            calls.append(features.height)
        return real_fit(features, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(step, "fit", counted)
    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    out: dict[str, tuple[pl.DataFrame, pl.DataFrame]] = {}
    fits: dict[str, int] = {}
    for way in ("live", "2m", "backfill"):
        step._FITS.clear()
        calls.clear()
        root = tmp_path / way
        shutil.copytree(throttle_template, root)
        if way == "live":
            cfg = _refit_cfg()
            for k in range(1, MINUTES + 1):
                run_cycle(root, cfg, now=t0 + timedelta(minutes=k, seconds=23), until=t0 + timedelta(minutes=MINUTES))
        else:
            cfg = _refit_cfg(chunk=timedelta(minutes=2) if way == "2m" else timedelta(hours=1))
            run_cycle(root, cfg, now=t0 + timedelta(minutes=MINUTES))
        fits[way] = len(calls)
        f = lake.read(root, "findings").drop("time").sort("host", "window_start")
        inc = latest_incidents(lake.read(root, "incidents")).drop("time", "updated").sort("host", "start", "incident_id")
        out[way] = (f, inc)
    # steps 8:00 and 8:01 (no history before the 8:00 epoch) fit per step; epochs 8:02, 8:04, 8:06 once
    # (live: once more where a cycle's load has other feature columns, here a rare softirq
    # type; the per-step protocol would fit 8 times)
    assert fits["backfill"] == fits["2m"] == 5 and fits["live"] <= 6, fits
    i0 = out["backfill"][1]
    assert i0.filter((pl.col("entry_id") == "gpu_power_throttle") & (pl.col("host") == "sim-01")).height >= 1
    _assert_same_verdicts(out)


def test_score_against_a_fit_on_the_same_windows_is_analyze(throttle_template: Path) -> None:
    """fit + score with the reference fitted on the scored windows themselves gives what
    analyze gives (the one-shot path and the live path judge with the same detectors)."""
    from analytics.features import compute_features
    from analytics.pipeline import AnalyticsConfig, analyze, fit, score
    from jobs.telemetry import load_lake

    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    loaded = load_lake(throttle_template, t0, t0 + timedelta(minutes=MINUTES), None)
    feats = compute_features(loaded.frames, host_facts=loaded.facts)
    cfg = AnalyticsConfig(reference="self", detectors=("zscore", "iforest", "mahalanobis"))
    since = t0 + timedelta(minutes=2)
    want = analyze({}, cfg, features=feats, score_since=since)
    ref = fit(feats, cfg)
    got = score(feats, cfg, dict.fromkeys(ref.fits, ref), score_since=since)
    key = ["host", "window_start", "detector"]
    a, b = want.scores.sort(key), got.scores.sort(key)
    assert a.height > 0 and a.select(key).equals(b.select(key))
    assert ((a["score"] - b["score"]).abs().max() or 0.0) < 1e-9  # type: ignore[operator]
    assert a["flagged"].equals(b["flagged"])
    assert want.findings.select("host", "window_start").equals(got.findings.select("host", "window_start"))
    with pytest.raises(ValueError, match="feature columns"):
        score(feats.drop(feats.columns[-1]), cfg, dict.fromkeys(ref.fits, ref))


def test_refit_config() -> None:
    from jobs.config import analytics_from_mapping

    assert analytics_from_mapping({"refit": "5m"}).refit == timedelta(minutes=5)
    assert analytics_from_mapping({"refit": "off"}).refit is None
    assert analytics_from_mapping({}).refit is None
    with pytest.raises(ValueError, match=r"\[analytics\] refit"):
        analytics_from_mapping({"refit": "soon"})
    with pytest.raises(ValueError, match="analytics.refit .* multiple of scheduler.analysis_step"):
        SweepConfig(analytics=analytics_from_mapping({"refit": "90s"}))


def test_the_parts_of_a_lasting_incident_are_read_as_one(throttle_template: Path, tmp_path: Path) -> None:
    """A sweep that cuts incidents every minute (``max_incident``) writes the throttle in
    parts; the report, ``top-incidents`` and the ``lasting_incidents`` view join them into
    the incident a sweep without cuts writes (same start, end and windows)."""
    from jobs.report import gather
    from knowledge_base.incidents import episodes

    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    got = {}
    for way, cut in (("whole", timedelta(minutes=15)), ("cut", timedelta(minutes=1))):
        root = tmp_path / way
        shutil.copytree(throttle_template, root)
        run_cycle(root, _fast_cfg(max_incident=cut), now=t0 + timedelta(minutes=MINUTES))
        got[way] = latest_incidents(lake.read(root, "incidents")).filter(pl.col("entry_id") == "gpu_power_throttle")
    [whole] = got["whole"].iter_rows(named=True)
    parts = got["cut"].sort("start")
    assert parts.height >= 4 and parts["n_windows"].max() < whole["n_windows"]  # type: ignore[operator]
    # (not the state: the last part closed when it reached max_incident; the next window starts another)
    cols = ["host", "start", "end", "n_windows", "entry_id"]
    [joined] = episodes(parts).iter_rows(named=True)
    assert {c: joined[c] for c in cols} == {c: whole[c] for c in cols}
    assert joined["parts"] == parts.height and joined["incident_id"] == parts["incident_id"][0]
    assert joined["peak_score"] == parts["peak_score"].max()
    top = query.run_query(tmp_path / "cut", "top-incidents", params={"limit": "100"})
    row = top.filter(pl.col("entry_id") == "gpu_power_throttle")
    assert row.height == 1 and row["parts"][0] == parts.height and row["n_windows"][0] == whole["n_windows"]
    view = query.run_query(tmp_path / "cut", "SELECT count(*) AS n FROM lasting_incidents")["n"][0]
    table = query.run_query(tmp_path / "cut", "SELECT count(*) AS n FROM incidents")["n"][0]
    assert view == top.height < table
    s = gather(tmp_path / "cut", tmp_path / "r.html").summary
    assert s.incidents == top.height and s.incident_parts == table and s.by_entry["gpu_power_throttle"] == 1
    assert f"incidents {s.incidents} ({table} parts: " in s.text()
    # a gap longer than the scheduler's incident_gap_s is a new incident, and causes stay apart
    first, second = parts.row(0, named=True), parts.row(1, named=True)
    apart = pl.concat([parts.head(1), parts.slice(1, 1).with_columns(
        pl.col("start") + timedelta(seconds=6) + (first["end"] - second["start"]))])
    assert episodes(apart)["parts"].to_list() == [1, 1]
    other = parts.slice(1, 1).with_columns(pl.lit("thermal_throttle").alias("entry_id"))
    assert episodes(pl.concat([parts.head(1), other]))["parts"].to_list() == [1, 1]
    # unmatched parts join too, and have no confidence (not NaN)
    un = parts.head(2).with_columns(pl.lit("unmatched").alias("status"), pl.lit(None, pl.String).alias("entry_id"),
                                    pl.lit(None, pl.Float64).alias("confidence"))
    [u] = episodes(un).iter_rows(named=True)
    assert u["parts"] == 2 and u["confidence"] is None and u["n_windows"] == un["n_windows"].sum()


def test_a_fault_longer_than_half_the_history_stays_one_incident(tmp_path: Path) -> None:
    """Two hosts (no cohort: fewer than 3 of a hardware) and IRQs moved to the far node for
    8 minutes of a 4-minute history: once the fault is most of the host's own reference, a
    relative signal no longer sees it; the placement read directly still names it, so the
    incident lasts as long as the fault instead of closing while it goes on."""
    from ingest.simulator import from_dict, simulate

    t0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    root = tmp_path / "lake"
    sc = from_dict({"seed": 5, "duration": "11m", "hosts": 2, "workload": "training", "injections": [
        {"type": "irq_locality_miss", "hosts": ["sim-01"], "start": "2m", "duration": "9m", "severity": 0.8}]})
    sink = lake.LakeSink(root)
    simulate(sc, [sink])
    sink.close()
    run_cycle(root, _fast_cfg(), now=t0 + timedelta(minutes=11))
    inc = query.run_query(root, "SELECT * FROM lasting_incidents WHERE host = 'sim-01'")
    irq = inc.filter(pl.col("entry_id") == "irq_locality_miss")
    assert irq.height == 1, inc.select("entry_id", "start", "end", "parts")
    [row] = irq.iter_rows(named=True)
    # from the fault's first windows to the data's last (windows are 3 s long)
    assert row["start"] <= t0 + timedelta(minutes=2, seconds=5)
    assert row["end"] >= t0 + timedelta(minutes=10, seconds=50)
    assert query.run_query(root, "SELECT * FROM lasting_incidents WHERE host = 'sim-00'").is_empty()
