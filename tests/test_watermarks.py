"""Watermarks and the staged commit: every window exactly once across kill -9, outages and
concurrent schedulers. Real `unveil schedule` processes on a real simulated lake."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from jobs import watermarks as wm
from jobs.grid import floor_grid
from jobs.progress import Progress
from jobs.step import incidents_of, segment
from knowledge_base import load_kb

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "jobs" / "fast.toml"
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # the simulator's default start
HOSTS = ("sim-00", "sim-01")


def make_lake(root: Path, minutes: int = 3) -> Path:
    """Two simulated hosts, ``minutes`` of telemetry, a GPU power throttle on sim-01 at 1m-2m."""
    from ingest.simulator import from_dict, simulate

    sc = from_dict({"seed": 3, "duration": f"{minutes}m", "hosts": 2, "injections": [
        {"type": "gpu_power_throttle", "hosts": ["sim-01"], "start": "1m", "duration": "1m", "severity": 0.9}]})
    root.mkdir(parents=True, exist_ok=True)
    sink = lake.LakeSink(root)
    simulate(sc, [sink])
    sink.close()
    return root


@pytest.fixture(scope="session")
def sim_lake_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lake(tmp_path_factory.mktemp("jobs-sim") / "lake")


@pytest.fixture
def sim_lake(sim_lake_template: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "lake"
    shutil.copytree(sim_lake_template, dst)
    return dst


def unveil(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
           config: Path | None = CONFIG) -> subprocess.CompletedProcess[str]:
    pre = ["--config", str(config)] if config is not None else []
    return subprocess.run([sys.executable, "-m", "jobs.cli", *pre, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "jobs.cli", "--config", str(CONFIG), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def schedule_once(root: Path, until: datetime, *extra: str, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
    return unveil("schedule", "--once", "--lake", str(root), "--until", until.isoformat(), "--no-progress",
                  *extra, env=env)


def assert_exactly_once(root: Path, until: datetime) -> pl.DataFrame:
    """Every (host, window, detector, reference) of [T0, until) scored once, none missing."""
    scores = lake.read(root, "scores")
    dup = scores.group_by("host", "window_start", "detector", "reference").len().filter(pl.col("len") > 1)
    assert dup.is_empty(), f"duplicated windows:\n{dup}"
    feats = lake.read(root, "features")
    assert feats.group_by("host", "window_start").len()["len"].max() == 1
    expected = pl.datetime_range(T0, until - timedelta(seconds=3), "1s", eager=True, time_zone="UTC")
    for h in HOSTS:
        got = feats.filter(pl.col("host") == h)["window_start"].sort()
        assert got.len() == expected.len(), f"{h}: {got.len()} windows, expected {expected.len()}"
        assert (got.cast(pl.Datetime("us", "UTC")) == expected.cast(pl.Datetime("us", "UTC"))).all()
        per_window = scores.filter(pl.col("host") == h).group_by("window_start").len()
        assert per_window.height == expected.len()
        assert per_window["len"].n_unique() == 1  # same detector x reference set everywhere
    if "findings" in lake.tables(root):
        f = lake.read(root, "findings")
        assert f.group_by("host", "window_start").len()["len"].max() == 1
    if "incidents" in lake.tables(root):
        inc = lake.read(root, "incidents")
        # an open incident has a row per update; each is written once and closed at most once
        assert inc.select("incident_id", "updated").is_unique().all()
        assert inc.filter(pl.col("state") == "closed")["incident_id"].is_unique().all()
    marks = wm.load(root)
    assert {h: m.watermark for h, m in marks.items()} == dict.fromkeys(HOSTS, until)
    assert wm.pending(root) == []
    return scores


# ----------------------------------------------------------------------------- processes


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_seal", "mid_publish", "after_publish"])
def test_kill9_between_outputs_and_commit_leaves_no_gap_and_no_duplicate(sim_lake: Path, point: str) -> None:
    until = T0 + timedelta(minutes=2)
    crashed = schedule_once(sim_lake, until, env={wm.CRASH_ENV: point})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert wm.load(sim_lake) == {}  # the first chunk never committed its watermark
    staged = wm.pending(sim_lake)
    assert len(staged) == 1
    if point != "before_seal":
        # outputs (some or all) are visible in the lake before the watermark moved
        assert "features" in lake.tables(sim_lake) or point == "mid_publish"
    rerun = schedule_once(sim_lake, until)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    if point == "before_seal":
        assert "recovered" not in rerun.stdout
    else:
        assert f"recovered interrupted sweep(s): {staged[0]}" in rerun.stdout
    assert_exactly_once(sim_lake, until)


@pytest.mark.slow
def test_catch_up_after_outage_in_bounded_chunks_with_progress(sim_lake: Path) -> None:
    until = T0 + timedelta(minutes=3)
    # a cycle bounded to one chunk leaves the backlog for the next one
    first = schedule_once(sim_lake, until, "--max-chunks", "1")
    assert first.returncode == 0, first.stderr
    assert "1 chunk(s)" in first.stdout and "backlog left" in first.stdout
    assert {m.watermark for m in wm.load(sim_lake).values()} == {T0 + timedelta(minutes=1)}
    # the scheduler was down for 2 minutes: the backlog is processed chunk by chunk
    r = unveil("schedule", "--once", "--lake", str(sim_lake), "--until", until.isoformat(), "--progress")
    assert r.returncode == 0, r.stderr
    assert "2 chunk(s)" in r.stdout and "caught up" in r.stdout
    assert "1/2 chunks" in r.stderr and "2/2 chunks" in r.stderr
    assert_exactly_once(sim_lake, until)


def _lock_held(root: Path) -> bool:
    path = wm.state_dir(root) / wm.LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.slow
def test_two_schedulers_on_one_lake_never_double_process(sim_lake: Path) -> None:
    until = T0 + timedelta(minutes=2)
    args = ("schedule", "--once", "--lake", str(sim_lake), "--until", until.isoformat(), "--no-progress")
    a = popen(*args, env={wm.PAUSE_ENV: "after_lock:6"})
    try:
        deadline = time.monotonic() + 60
        while not _lock_held(sim_lake):
            assert a.poll() is None, a.communicate()
            assert time.monotonic() < deadline, "first scheduler never took the lock"
            time.sleep(0.1)
        b = unveil(*args, timeout=120)
        assert b.returncode == 0, b.stderr
        assert "another scheduler holds" in b.stderr
        assert "skipped" in b.stderr
        assert a.poll() is None  # B did not wait for A
        out, err = a.communicate(timeout=300)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 0, err
    assert "2 chunk(s)" in out
    assert_exactly_once(sim_lake, until)


@pytest.mark.slow
def test_corrupt_file_is_reported_and_the_rest_processed(sim_lake: Path) -> None:
    victim = sorted((sim_lake / "net" / "host=sim-00").rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:200])  # a torn write: no footer
    until = T0 + timedelta(minutes=1)
    r = schedule_once(sim_lake, until)
    assert r.returncode == 0, r.stderr
    assert f"unveil schedule: warning: corrupt file skipped: {victim} (" in r.stderr
    feats = lake.read(sim_lake, "features")
    assert set(feats["host"].unique()) == set(HOSTS)  # sim-00 still analysed from its other tables
    assert feats.filter(pl.col("host") == "sim-00").height == 58
    assert victim.exists()  # reported, never deleted


# ----------------------------------------------------------------------------- in-process


def test_watermarks_round_trip_and_merge(tmp_path: Path) -> None:
    wm.save(tmp_path, {"a": wm.HostMark(T0), "b": wm.HostMark(T0, T0 - timedelta(seconds=5))})
    wm.save(tmp_path, {"a": wm.HostMark(T0 + timedelta(minutes=1))})
    marks = wm.load(tmp_path)
    assert marks == {"a": wm.HostMark(T0 + timedelta(minutes=1)), "b": wm.HostMark(T0, T0 - timedelta(seconds=5))}
    assert not any(p.name.startswith(".tmp") for p in wm.state_dir(tmp_path).iterdir())


def test_a_marks_first_telemetry_time_round_trips_and_older_files_have_none(tmp_path: Path) -> None:
    first = T0 - timedelta(hours=3)
    wm.save(tmp_path, {"a": wm.HostMark(T0, None, first)})
    path = wm.state_dir(tmp_path) / wm.WATERMARKS
    assert json.loads(path.read_text())["hosts"]["a"]["first"] == first.isoformat()
    assert wm.load(tmp_path)["a"].first == first
    # a file written before the field existed: the time is read from the lake again
    path.write_text(json.dumps({"version": wm.VERSION, "hosts": {"a": {"watermark": T0.isoformat()}}}))
    assert wm.load(tmp_path) == {"a": wm.HostMark(T0)}
    path.write_text(json.dumps({"version": wm.VERSION, "hosts": {"a": {"watermark": T0.isoformat(),
                                                                        "first": "yesterday"}}}))
    with pytest.raises(wm.StateError, match="first|bad time"):
        wm.load(tmp_path)


def test_bad_watermark_file_names_the_file(tmp_path: Path) -> None:
    path = wm.state_dir(tmp_path) / wm.WATERMARKS
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(wm.StateError, match=str(path)):
        wm.load(tmp_path)
    path.write_text(json.dumps({"version": 1, "hosts": {"h": {"watermark": "yesterday"}}}))
    with pytest.raises(wm.StateError, match="host 'h'.*bad time"):
        wm.load(tmp_path)


def test_recover_drops_unsealed_and_publishes_sealed(tmp_path: Path) -> None:
    df = pl.DataFrame({"time": [T0], "host": ["h"], "window_start": [T0], "score": [1.0]})
    unsealed = wm.StagedSweep(tmp_path, "sw-a")
    unsealed.write("scores", df)
    sealed = wm.StagedSweep(tmp_path, "sw-b")
    sealed.write("scores", df)
    sealed.seal({"h": wm.HostMark(T0 + timedelta(minutes=1))})
    seen: list[wm.Published] = []
    assert wm.recover(tmp_path, seen.append) == ["sw-b"]
    assert wm.pending(tmp_path) == []
    assert lake.read(tmp_path, "scores").height == 1  # only the sealed sweep's row
    assert wm.load(tmp_path)["h"].watermark == T0 + timedelta(minutes=1)
    assert len(seen) == 1 and seen[0].files[0].exists()
    # publishing again is a no-op (idempotent roll-forward)
    assert wm.recover(tmp_path) == []


def test_lock_is_exclusive_within_and_across_descriptors(tmp_path: Path) -> None:
    with wm.scheduler_lock(tmp_path) as first:
        assert first
        with wm.scheduler_lock(tmp_path) as second:
            assert not second
    with wm.scheduler_lock(tmp_path) as again:
        assert again


def test_floor_grid() -> None:
    assert floor_grid(T0 + timedelta(seconds=7, milliseconds=900), 1.0) == T0 + timedelta(seconds=7)
    assert floor_grid(T0 + timedelta(seconds=7), 5.0) == T0 + timedelta(seconds=5)


def _findings(host: str, starts: list[int]) -> pl.DataFrame:
    ws = [T0 + timedelta(seconds=s) for s in starts]
    return pl.DataFrame({"host": host, "window_start": ws, "window_end": [w + timedelta(seconds=3) for w in ws],
                         "score": 2.0}).with_columns(pl.col("window_start", "window_end").cast(pl.Datetime("us", "UTC")))


def test_segment_cuts_on_gap_and_max_length() -> None:
    f = pl.concat([_findings("h", [0, 1, 2, 20, 21]), _findings("g", list(range(0, 100)))])
    segs = segment(f, 5.0, timedelta(seconds=30))
    spans = sorted((s["host"][0], s.height) for s in segs)
    assert spans == [("g", 10), ("g", 30), ("g", 30), ("g", 30), ("h", 2), ("h", 3)]


def test_incident_open_at_the_horizon_is_carried_not_written() -> None:
    kb = load_kb()
    f = _findings("h", [0, 1, 2, 50, 51])
    closed, open_since = incidents_of(f, kb, gap_s=5.0, max_len=timedelta(minutes=15),
                                      horizon=T0 + timedelta(seconds=54), window_length=timedelta(seconds=3),
                                      stride=timedelta(seconds=1))
    assert closed.height == 1 and closed["n_windows"][0] == 3
    assert open_since == {"h": T0 + timedelta(seconds=50)}
    closed2, open2 = incidents_of(f, kb, gap_s=5.0, max_len=timedelta(minutes=15), horizon=None,
                                  window_length=timedelta(seconds=3), stride=timedelta(seconds=1))
    assert closed2.height == 2 and open2 == {}


def test_unmatched_incidents_need_their_own_persistence() -> None:
    """min_unmatched_s: a statistical anomaly no entry explains is raised once it spans that
    long (a load swing of a minute is not); a matched incident of the same span is raised at
    min_incident_s."""
    kb = load_kb()
    kw = {"gap_s": 5.0, "max_len": timedelta(minutes=15), "horizon": None, "window_length": timedelta(seconds=3),
          "stride": timedelta(seconds=1), "min_incident_s": 10.0, "min_unmatched_s": 120.0}
    minute = _findings("h", list(range(58)))  # 58 windows spanning 60 s
    got, _ = incidents_of(minute, kb, **kw)  # type: ignore[arg-type]
    assert got.is_empty()
    got, _ = incidents_of(_findings("h", list(range(125))), kb, **kw)  # type: ignore[arg-type]
    assert got["status"].to_list() == ["unmatched"]
    assert (got["end"][0] - got["start"][0]).total_seconds() >= 120
    got, _ = incidents_of(_matched(minute, "thp_coverage_loss"), kb, **kw)  # type: ignore[arg-type]
    assert got.select("status", "entry_id").rows() == [("matched", "thp_coverage_loss")]
    # without min_unmatched_s both kinds share min_incident_s
    got, _ = incidents_of(minute, kb, **{**kw, "min_unmatched_s": None})  # type: ignore[arg-type]
    assert got["status"].to_list() == ["unmatched"]


def _matched(f: pl.DataFrame, entry_id: str) -> pl.DataFrame:
    return f.with_columns(pl.lit(entry_id).alias("entry_id"), pl.lit(0.9).alias("match_confidence"),
                          pl.lit([], pl.List(pl.String)).alias("match_devices"),
                          pl.lit("matched").alias("match_explanation"))


def test_an_entry_may_ask_for_longer_persistence() -> None:
    """An entry's min_duration_s (storage_contention: 60 s, a checkpoint's burst is no
    contention) holds its incidents back until they span that long, open or closed; other
    entries keep the scheduler's min_incident_s; an entry asking for less gets the larger."""
    kb = load_kb()
    assert kb.by_id["storage_contention"].min_duration_s == 60.0
    kw = {"gap_s": 5.0, "max_len": timedelta(minutes=15), "window_length": timedelta(seconds=3),
          "stride": timedelta(seconds=1), "min_incident_s": 10.0, "min_unmatched_s": 120.0}
    burst = _findings("h", list(range(20)))  # 22 s: a checkpoint
    got, _ = incidents_of(_matched(burst, "storage_contention"), kb, horizon=None, **kw)  # type: ignore[arg-type]
    assert got.is_empty()
    got, _ = incidents_of(_matched(burst, "cpu_noisy_neighbour"), kb, horizon=None, **kw)  # type: ignore[arg-type]
    assert got["entry_id"].to_list() == ["cpu_noisy_neighbour"]
    lasting = _matched(_findings("h", list(range(70))), "storage_contention")  # 72 s
    got, _ = incidents_of(lasting, kb, horizon=None, **kw)  # type: ignore[arg-type]
    assert got.select("status", "entry_id").rows() == [("matched", "storage_contention")]
    # still growing at the horizon: visible (open) once it spans 60 s, not before
    at = T0 + timedelta(seconds=72)
    got, _ = incidents_of(lasting, kb, horizon=at, **kw)  # type: ignore[arg-type]
    assert got["state"].to_list() == ["open"]
    got, _ = incidents_of(lasting.filter(pl.col("window_start") < T0 + timedelta(seconds=40)), kb,
                          horizon=T0 + timedelta(seconds=42), **kw)  # type: ignore[arg-type]
    assert got.is_empty()
    # the scheduler's own bound wins when it is the longer one
    got, _ = incidents_of(lasting, kb, horizon=None, **{**kw, "min_incident_s": 100.0})  # type: ignore[arg-type]
    assert got.is_empty()


def test_progress_draws_on_request_and_logs_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    buf = io.StringIO()
    with Progress(4, "catch-up", unit="chunks", enabled=True, stream=buf) as p:
        p.advance(detail="first")
        p.advance()
    assert "catch-up  [############............]  2/4 chunks   50%" in buf.getvalue()
    assert buf.getvalue().endswith("\n")
    quiet = io.StringIO()
    with caplog.at_level(logging.INFO, logger="jobs.progress"):
        with Progress(2, "pm", unit="chunks", stream=quiet) as p:  # StringIO is no TTY
            p.advance()
            p.advance()
    assert quiet.getvalue() == ""
    assert any("2/2 chunks" in r.message for r in caplog.records)


def test_incidents_across_chunk_boundaries_equal_one_pass() -> None:
    """The carry of open incidents (open_since) gives the same incidents as one pass over
    all findings: none split at a chunk boundary, none written twice."""
    kb = load_kb()
    bursts = [*range(10, 20), *range(55, 70), *range(118, 122), *range(175, 300)]
    f = pl.concat([_findings("h", bursts), _findings("g", [*range(0, 5), *range(58, 64)])])
    kw = {"gap_s": 5.0, "max_len": timedelta(seconds=50), "window_length": timedelta(seconds=3),
          "stride": timedelta(seconds=1)}
    one, _ = incidents_of(f, kb, horizon=None, **kw)  # type: ignore[arg-type]
    written = []
    open_since: dict[str, datetime] = {}
    for k in range(6):  # chunks [60k, 60k + 60) on window ends
        s, e = T0 + timedelta(seconds=60 * k), T0 + timedelta(seconds=60 * (k + 1))
        new = f.filter((pl.col("window_end") > s) & (pl.col("window_end") <= e))
        prior = f.filter(pl.lit(False))
        for h, since in open_since.items():
            prior = pl.concat([prior, f.filter((pl.col("host") == h) & (pl.col("window_start") >= since)
                                               & (pl.col("window_end") <= s))])
        inc, open_since = incidents_of(pl.concat([prior, new]), kb, horizon=e, **kw)  # type: ignore[arg-type]
        written.append(inc)
    assert open_since == {}  # the last chunk ends long after the last finding: all closed
    chunked = pl.concat(written)
    cols = ["incident_id", "host", "start", "end", "n_windows"]
    assert chunked["incident_id"].is_unique().all()
    assert chunked.select(cols).sort("host", "start").equals(one.select(cols).sort("host", "start"))
