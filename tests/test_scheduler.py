"""The periodic scheduler (APScheduler 3.x), its config, SIGTERM handling, and write-back of
findings, incidents and remediations to a real influxd."""

from __future__ import annotations

import json
import shutil
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from analytics.pipeline import AnalyticsConfig
from ingest import lake
from ingest.influx import InfluxConfig, InfluxSource, line_protocol_series
from jobs import watermarks as wm
from jobs.config import SweepConfig, analytics_from_mapping
from jobs.cycle import CycleSummary
from jobs.scheduler import Scheduler
from jobs.writeback import influx_frame
from knowledge_base import latest_incidents
from tests.servers import InfluxdServer
from tests.test_watermarks import T0, assert_exactly_once, make_lake, popen, schedule_once


@pytest.fixture(scope="module")
def lake_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lake(tmp_path_factory.mktemp("sched-sim") / "lake")


@pytest.fixture
def sim_lake(lake_template: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "lake"
    shutil.copytree(lake_template, dst)
    return dst


def test_sweep_config_rejects_unknown_and_bad_keys() -> None:
    with pytest.raises(ValueError, match=r"\[scheduler\]: unknown key\(s\) chunck"):
        SweepConfig.from_mapping({"chunck": "1h"})
    with pytest.raises(ValueError, match=r"\[scheduler\] chunk: bad duration"):
        SweepConfig.from_mapping({"chunk": "soon"})
    with pytest.raises(ValueError, match="analytics.*unknown"):
        analytics_from_mapping({"detectors": ["zscore", "nope"]})
    cfg = SweepConfig.from_mapping({"chunk": "10m", "lag": "0s", "history": "5m", "retention": {"scores": "7d"}})
    assert cfg.chunk == timedelta(minutes=10) and cfg.lag == timedelta(0)
    assert cfg.analytics.history == timedelta(minutes=5)
    assert cfg.retention == {"scores": timedelta(days=7)}


def test_scheduler_runs_cycles_in_process(tmp_path: Path) -> None:
    seen: list[CycleSummary | None] = []
    cfg = SweepConfig(compact_every=timedelta(seconds=0.2))
    s = Scheduler(tmp_path, cfg, every=timedelta(seconds=0.2), on_cycle=seen.append, max_cycles=3)
    assert s.run(install_signals=False) == 0
    assert s.cycles == 3 and s.failures == 0
    assert all(c is not None and c.chunks == [] for c in seen)  # an empty lake: nothing to do
    job = s._sched  # shut down, but the job defaults stay as configured
    assert job._job_defaults == {"coalesce": True, "max_instances": 1, "misfire_grace_time": 1}


@pytest.mark.slow
def test_sigterm_stops_after_the_running_chunk(sim_lake: Path) -> None:
    until = T0 + timedelta(minutes=2)  # two chunks of backlog
    p = popen("schedule", "--every", "1s", "--lake", str(sim_lake), "--until", until.isoformat(), "--no-progress",
              env={wm.PAUSE_ENV: "before_seal:3"})
    try:
        deadline = time.monotonic() + 120
        while not wm.pending(sim_lake):  # the first chunk is being staged
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "stopping after the running job" in err
    assert "1 chunk(s)" in out and "backlog left" in out  # the running chunk finished and committed
    assert {m.watermark for m in wm.load(sim_lake).values()} == {T0 + timedelta(minutes=1)}
    assert wm.pending(sim_lake) == []
    r = schedule_once(sim_lake, until)  # a restart continues where it stopped
    assert r.returncode == 0 and "1 chunk(s)" in r.stdout, r.stderr
    assert_exactly_once(sim_lake, until)


@pytest.mark.server
@pytest.mark.slow
def test_write_back_to_influxdb_survives_a_crash_and_matches_the_lake(sim_lake: Path,
                                                                      influxd_server: InfluxdServer) -> None:
    until = T0 + timedelta(minutes=3)  # the throttle (1m-2m) closes into a matched incident
    db = "wb_test"
    args = ("--influx-url", influxd_server.url, "--influx-database", db)
    crashed = schedule_once(sim_lake, until, *args, env={wm.CRASH_ENV: "after_publish"})
    assert crashed.returncode == -signal.SIGKILL
    r = schedule_once(sim_lake, until, *args)
    assert r.returncode == 0, r.stderr
    assert "written to InfluxDB" in r.stdout
    assert_exactly_once(sim_lake, until)
    src = InfluxSource(InfluxConfig(url=influxd_server.url, database=db))
    try:
        findings = lake.read(sim_lake, "findings")
        back = src.read("unveil_findings", start=T0, end=until)
        assert back.height == findings.height > 0
        assert set(back["host"].unique()) <= {"sim-00", "sim-01"}
        assert set(back["reference"]) == set(findings["reference"])
        # InfluxDB stores no nulls: a signature-only finding of a window the statistical
        # detectors did not score has no score field
        if "score" not in back.columns:
            back = back.with_columns(pl.lit(None, pl.Float64).alias("score"))
        joined = back.join(findings.select("host", pl.col("window_start").alias("time"), "score"),
                           on=["host", "time"], how="inner", suffix="_lake")
        assert joined.height == findings.height
        assert (joined["score"].is_null() == joined["score_lake"].is_null()).all()
        assert ((joined["score"] - joined["score_lake"]).abs().max() or 0.0) < 1e-9  # type: ignore[operator]
        # an open incident's rows share its tags and time: InfluxDB keeps the latest, as readers do
        incidents = latest_incidents(lake.read(sim_lake, "incidents"))
        ib = src.read("unveil_incidents", start=T0 - timedelta(hours=1), end=until)
        assert ib.height == incidents.height > 0
        assert sorted(ib["incident_id"].to_list()) == sorted(incidents["incident_id"].to_list())
        assert "entry_id" in ib.columns  # a field: an open incident's best-ranked entry can change
        throttle = ib.filter(pl.col("entry_id") == "gpu_power_throttle")
        assert throttle.height >= 1 and set(throttle["host"]) == {"sim-01"}
        if "remediations" in lake.tables(sim_lake):  # proposals depend on the KB's facts
            rem = lake.read(sim_lake, "remediations")
            # InfluxDB keeps ms: widen the range by a second on each side
            t0, t1 = rem["time"].min(), rem["time"].max()
            assert isinstance(t0, datetime) and isinstance(t1, datetime)
            rb = src.read("unveil_remediations", start=t0 - timedelta(seconds=1), end=t1 + timedelta(seconds=1))
            assert sorted(rb["incident_id"].to_list()) == sorted(rem["incident_id"].to_list())
            assert set(rb["state"]) == {"proposed"}
    finally:
        src.close()


def test_influx_frame_flattens_lists_and_factors() -> None:
    df = pl.DataFrame({
        "time": [T0], "host": ["h"], "detectors": [["zscore", "iforest"]],
        "top_factors": [[{"feature": "gpu.power@0", "contribution": 0.7}]], "score": [2.5],
    }).with_columns(pl.col("time").cast(pl.Datetime("us", "UTC")))
    out = influx_frame("findings", df)
    assert out.columns == ["time", "host", "detectors", "top_factor", "score"]
    line = line_protocol_series("unveil_findings", out, tags=["host"])[0]
    assert line.startswith('unveil_findings,host=h detectors="zscore,iforest",top_factor="gpu.power@0",score=2.5 ')


def test_sweep_config_chunk_must_cover_a_stride() -> None:
    with pytest.raises(ValueError, match="at least one stride"):
        SweepConfig(analytics=AnalyticsConfig(), chunk=timedelta(milliseconds=10))


def test_matched_incidents_are_queued_once_as_dry_run_proposals(tmp_path: Path) -> None:
    from jobs.remediations import queue_remediations
    from knowledge_base import INCIDENT_SCHEMA, load_kb
    from remediation.queue import Queue, default_path

    facts = pl.DataFrame({
        "time": [T0] * 4, "host": ["h1"] * 4, "category": ["nic", "nic", "numa", "numa"],
        "device": ["ens1np0", "ens1np0", "1", "0"], "key": ["pci", "numa_node", "cpulist", "cpulist"],
        "value": ["0000:3b:00.0", "1", "16-31", "0-15"], "value_num": [None, 1.0, None, None],
    }).with_columns(pl.col("time").cast(pl.Datetime("us", "UTC")))
    base = {c: None for c in INCIDENT_SCHEMA}
    incidents = pl.DataFrame([
        {**base, "incident_id": "inc-a", "host": "h1", "start": T0, "end": T0 + timedelta(seconds=30),
         "n_windows": 28, "status": "matched", "entry_id": "irq_locality_miss", "devices": ["ens1np0"]},
        {**base, "incident_id": "inc-b", "host": "h1", "start": T0, "end": T0 + timedelta(seconds=9),
         "n_windows": 7, "status": "unmatched", "devices": []},
    ], schema=INCIDENT_SCHEMA)
    kb = load_kb()
    first = queue_remediations(tmp_path, incidents, facts, kb)
    again = queue_remediations(tmp_path, incidents, facts, kb)  # a retried sweep
    assert first.height == 1 and again["action_id"].to_list() == first["action_id"].to_list()
    row = first.row(0, named=True)
    assert row["script_id"] == "irq_affinity" and row["state"] == "proposed" and not row["executed"]
    # (each device to its own node's CPUs, which the script reads when it runs)
    assert json.loads(row["params"]) == {"pci": "0000:3b:00.0"}
    assert row["time"] == row["created"]
    with Queue(default_path(tmp_path)) as q:
        assert len(q.actions()) == 1


# ------------------------------------------------------------ started before the agent's first commit


def test_scheduler_waits_for_the_lake_in_process(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under a service manager the scheduler and the agent start together: the scheduler
    waits for the lake directory (saying so once), then runs."""
    import threading

    root = tmp_path / "lake"
    seen: list[CycleSummary | None] = []
    s = Scheduler(root, SweepConfig(compact_every=None), every=timedelta(seconds=0.2), on_cycle=seen.append,
                  max_cycles=1, lake_poll=0.02)
    appear = threading.Timer(0.4, root.mkdir)  # the agent's first commit, later
    appear.start()
    try:
        with caplog.at_level("INFO", logger="jobs.scheduler"):
            assert s.run(install_signals=False) == 0
    finally:
        appear.cancel()
    assert s.cycles == 1 and s.failures == 0 and seen[0] is not None
    waiting = [r.getMessage() for r in caplog.records if "waiting for the lake" in r.getMessage()]
    assert waiting == [f"waiting for the lake at {root} (the agent creates it at its first commit)"]


def test_scheduler_stopped_while_waiting_for_the_lake(tmp_path: Path) -> None:
    import threading

    s = Scheduler(tmp_path / "never", SweepConfig(), every=timedelta(seconds=1), lake_poll=0.02)
    threading.Timer(0.2, s.stop).start()
    t0 = time.monotonic()
    assert s.run(install_signals=False) == 0
    assert s.cycles == 0 and time.monotonic() - t0 < 5
    assert not (tmp_path / "never").exists()  # waiting creates nothing


def test_scheduler_refuses_a_lake_path_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "lake"
    f.write_text("not a directory")
    with pytest.raises(ValueError, match=f"lake {f} exists but is not a directory"):
        Scheduler(f, SweepConfig(), every=timedelta(seconds=1), lake_poll=0.02).run(install_signals=False)


def test_schedule_once_on_a_missing_lake_fails_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    t0 = time.monotonic()
    assert main(["schedule", "--lake", str(tmp_path / "none"), "--once", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"lake {tmp_path / 'none'} does not exist" in err and "--once does not wait" in err
    assert time.monotonic() - t0 < 10


def test_schedule_process_started_before_the_lake_waits_for_it(tmp_path: Path) -> None:
    """A real `unveil schedule` process: it says once that it waits, starts its cycles when
    the lake appears, and stops on SIGTERM."""
    import os
    import selectors

    root = tmp_path / "lake"
    p = popen("schedule", "--lake", str(root), "--every", "1s", "--no-progress")
    try:
        assert p.stderr is not None and p.stdout is not None
        os.set_blocking(p.stderr.fileno(), False)
        os.set_blocking(p.stdout.fileno(), False)
        sel = selectors.DefaultSelector()
        sel.register(p.stderr, selectors.EVENT_READ, "err")
        sel.register(p.stdout, selectors.EVENT_READ, "out")
        out = {"err": "", "out": ""}

        def pump(until: str, where: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while until not in out[where]:
                assert time.monotonic() < deadline and p.poll() is None, (out, p.poll())
                for key, _ in sel.select(0.1):
                    out[key.data] += key.fileobj.read() or ""  # type: ignore[union-attr]

        pump("waiting for the lake", "err", 60)
        time.sleep(2.5)  # it keeps polling (every second) and keeps quiet
        assert not root.exists() and p.poll() is None
        root.mkdir()
        pump("cycle to ", "out", 60)
        p.send_signal(signal.SIGTERM)
        rest_out, rest_err = p.communicate(timeout=60)
        out["out"] += rest_out or ""
        out["err"] += rest_err or ""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out["err"]
    assert out["err"].count("waiting for the lake") == 1
    assert f"waiting for the lake at {root}" in out["err"]


# ------------------------------------------------------------ corrupt files: one policy


def damage_two_files(root: Path) -> tuple[Path, Path]:
    """sim-00's first gpu file damaged inside a column chunk (valid footer), sim-01's first
    net file truncated (a torn write)."""
    from tests.test_lake import damage_column_chunk, truncate

    damaged = sorted((root / "gpu" / "host=sim-00").rglob("*.parquet"))[0]
    torn = sorted((root / "net" / "host=sim-01").rglob("*.parquet"))[0]
    damage_column_chunk(damaged)
    truncate(torn)
    return damaged, torn


def assert_warned_once(paths: tuple[Path, ...], command: str, text: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each path appears once in everything the user sees (printed and logged), on one
    line naming the command, the path and the reason."""
    import re

    logged = "\n".join(r.getMessage() for r in caplog.records)
    for p in paths:
        assert (text + logged).count(str(p)) == 1, (p, text, logged)
        assert re.search(rf"^unveil {command}: warning: corrupt file skipped: {re.escape(str(p))} \(.+\)$",
                         text, re.M), text


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from jobs.cli import main
    from tests.test_watermarks import CONFIG

    rc = main(["--config", str(CONFIG), *args])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


@pytest.mark.parametrize("command", ["sweep", "schedule"])
def test_corrupt_files_are_skipped_and_warned_once(sim_lake: Path, command: str, capsys: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """`unveil sweep` and `unveil schedule` skip a damaged and a truncated file alike, warn
    once per file, and analyse the rest (both hosts, every window)."""
    paths = damage_two_files(sim_lake)
    until = (T0 + timedelta(minutes=1)).isoformat()
    with caplog.at_level("INFO"):
        if command == "sweep":
            rc, text = run_cli(capsys, "sweep", "--lake", str(sim_lake), "--since", T0.isoformat(), "--until", until)
        else:
            rc, text = run_cli(capsys, "schedule", "--once", "--lake", str(sim_lake), "--until", until,
                               "--no-progress")
    assert rc == 0, text
    assert_warned_once(paths, command, text, caplog)
    feats = lake.read(sim_lake, "features")
    per_host = dict(feats.group_by("host").len().iter_rows())
    assert per_host == {"sim-00": 58, "sim-01": 58}
    assert all(p.exists() for p in paths)  # reported, never deleted


def test_a_running_scheduler_warns_of_a_file_once_across_cycles(capsys: pytest.CaptureFixture[str]) -> None:
    """A file in the reference history is read (and skipped) again by later cycles: the
    long-running scheduler warns once per process, not every minute."""
    from jobs.commands.schedule import print_summary

    bad = lake.CorruptFileError(Path("/lake/gpu/x.parquet"), "Parquet magic bytes not found")
    other = lake.CorruptFileError(Path("/lake/net/y.parquet"), "Invalid thrift")
    warned: set[Path] = set()
    print_summary(CycleSummary(corrupt=[bad]), warned)
    print_summary(CycleSummary(corrupt=[bad, other]), warned)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "unveil schedule: warning: corrupt file skipped: /lake/gpu/x.parquet (Parquet magic bytes not found)",
        "unveil schedule: warning: corrupt file skipped: /lake/net/y.parquet (Invalid thrift)"]


def test_cycles_run_just_past_the_lag_of_each_step_boundary() -> None:
    """A cycle every step, anchored on the data grid: its horizon (the last whole step before
    now - lag) is the step that ended lag + margin seconds earlier, whatever second the
    scheduler started at (started 11 s past a minute with a 15-s lag, cycles at second 11
    saw each minute a cycle late)."""
    from jobs.grid import floor_grid
    from jobs.scheduler import CYCLE_MARGIN, cycle_anchor

    step, t0 = timedelta(minutes=1), datetime(2026, 12, 4, 3, 9, 0, tzinfo=UTC)
    for lag_s in (15, 90, 0):
        lag = timedelta(seconds=lag_s)
        for start_s in (0, 8, 11, 16, 17, 18, 59):
            now = t0 + timedelta(seconds=start_s)
            a = cycle_anchor(now, step, lag)
            assert a <= now < a + step
            assert (a - lag - CYCLE_MARGIN - t0) % step == timedelta(0)
            cycle = a + 3 * step  # any later cycle
            horizon = floor_grid(cycle - lag, 60)
            assert cycle - horizon == lag + CYCLE_MARGIN  # the newest minute, as early as the lag allows


def test_the_first_cycle_runs_at_once_and_the_next_on_the_data_grid(tmp_path: Path) -> None:
    """An interval job counts from its previous run: without a first job of its own the
    cycles would stay at the second the scheduler started (the drill: 11 s past each minute)."""
    from jobs.scheduler import CYCLE_MARGIN

    lag = timedelta(seconds=15)
    nxt: list[datetime] = []

    def on_cycle(_: CycleSummary | None) -> None:
        job = s._sched.get_job("sweep")
        nxt.append(job.next_run_time)
        s.stop()

    s = Scheduler(tmp_path, SweepConfig(compact_every=None, lag=lag), every=timedelta(seconds=60), on_cycle=on_cycle)
    t0 = datetime.now(UTC)
    assert s.run(install_signals=False) == 0
    assert s.cycles == 1  # the first, at once
    assert t0 < nxt[0] <= t0 + timedelta(seconds=61)
    after = nxt[0] - lag - CYCLE_MARGIN
    assert (after.second, after.microsecond) == (0, 0)


def test_a_gap_of_days_is_caught_up_in_one_chunk_not_one_per_hour(tmp_path: Path) -> None:
    # a simulated or imported lake is months old: its empty hours were swept one chunk
    # (and one commit) each, 8 059 of them for 11 months (72 s)
    from jobs.cli import main
    from jobs.cycle import run_cycle

    root = tmp_path / "lake"
    for start in ("2026-01-05T08:00:00Z", "2026-01-08T08:00:00Z"):  # 3 days apart
        assert main(["simulate", "--lake", str(root), "--hosts", "2", "--duration", "4m", "--seed", "3",
                     "--start", start, "--engine", "serial"]) == 0
    until = datetime(2026, 1, 8, 9, tzinfo=UTC)
    summary = run_cycle(root, SweepConfig(), until=until, progress=False)
    assert summary is not None and summary.caught_up
    # the first segment, the gap, the second segment (each chunk at most an hour of data)
    assert len(summary.chunks) <= 4, [(c.start, c.end) for c in summary.chunks]
    assert all(c.windows == 0 for c in summary.chunks if c.end - c.start > timedelta(hours=1))
    feats = lake.read(root, "features")
    days = feats.get_column("time").dt.date().unique().sort().to_list()
    assert [d.day for d in days] == [5, 8]  # both segments judged
    assert set(wm.load(root)) == {"sim-00", "sim-01"}
    assert all(m.watermark == until for m in wm.load(root).values())
