"""The scheduler's chunks computed host by host (issue 18): each host's features from its
raw telemetry of the chunk only, its history read back from the lake's ``features`` table
(raw telemetry where the table lacks it), then all hosts judged together. The reference,
here in the test, is the fleet-wide path the sweep used before: every host's raw
telemetry of ``[first - history, end)`` loaded at once and featurised together."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analytics.features import compute_features, concat_features
from ingest import lake
from jobs import watermarks as wm
from jobs.config import SweepConfig, analytics_from_mapping
from jobs.cycle import run_cycle
from jobs.engine import make_engine
from jobs.grid import US
from jobs.step import sweep_step
from jobs.sweep import run_sweep
from jobs.telemetry import (
    HostChunk,
    HostFiles,
    Loaded,
    batch_features,
    batches,
    first_times,
    host_features,
    load_lake,
    telemetry_tables,
)
from knowledge_base import load_kb
from knowledge_base.loader import KnowledgeBase

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
MINUTES = 10
HOSTS = ["sim-00", "sim-01", "sim-02"]


def _cfg(**kw: object) -> SweepConfig:
    a = analytics_from_mapping({"history": "4m", "warmup": "30s"})
    return SweepConfig(analytics=a, lag=timedelta(0), compact_every=None, queue_remediations=False,
                       chunk=timedelta(minutes=2), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three hosts (a cohort), 10 minutes; a GPU power throttle on sim-01 from minute 4."""
    from ingest.simulator import from_dict, simulate

    root = tmp_path_factory.mktemp("per-host") / "lake"
    sc = from_dict({"seed": 5, "duration": f"{MINUTES}m", "hosts": len(HOSTS), "injections": [
        {"type": "gpu_power_throttle", "hosts": ["sim-01"], "start": "4m", "duration": "6m", "severity": 0.9}]})
    sink = lake.LakeSink(root)
    simulate(sc, [sink])
    sink.close()
    return root


def _reference(root: Path, cfg: SweepConfig, first: datetime, end: datetime) -> Loaded:
    """The fleet-wide path: all hosts' raw telemetry of [first - history, end) featurised
    together (windows from ``first - history`` on: the history the step may use)."""
    a = cfg.analytics
    loaded = load_lake(root, first - a.history, end, HOSTS)
    feats = compute_features(loaded.frames, a.window, host_facts=loaded.facts)
    return Loaded({}, loaded.facts, [], feats.filter(pl.col("window_start") >= first - a.history))


def _per_host(root: Path, cfg: SweepConfig, first: datetime, end: datetime,
              since: dict[str, datetime] | None = None) -> tuple[Loaded, int, int]:
    a = cfg.analytics
    since = since or {}
    parts = [host_features(HostChunk(str(root), h, first, end, a.history, a.window, data_since=since.get(h)))
             for h in HOSTS]
    facts = pl.concat([p.facts for p in parts if p.facts is not None])
    return (Loaded({}, facts, [], concat_features([p.features for p in parts])),
            sum(p.reused for p in parts), sum(p.refeaturised for p in parts))


def _same_features(got: pl.DataFrame, ref: pl.DataFrame) -> None:
    """Equal on the common columns; a column only one side has carries no evidence there
    (null, or 0 for a zero-fill family): a device without rows in the interval."""
    common = [c for c in ref.columns if c in got.columns]
    assert_frame_equal(got.select(common), ref.select(common))
    for df in (got, ref):
        for c in set(df.columns) - set(common):
            assert df.filter(pl.col(c).is_not_null() & (pl.col(c) != 0)).is_empty(), c


def _same_verdicts(root: Path, cfg: SweepConfig, got: Loaded, ref: Loaded, first: datetime, end: datetime) -> None:
    kb = load_kb()
    known = first_times(root, HOSTS)
    kw = {"since": first, "until": end, "hosts": HOSTS, "history_known": known, "horizon": end}
    a = sweep_step(got, cfg, kb, **kw)  # type: ignore[arg-type]
    b = sweep_step(ref, cfg, kb, **kw)  # type: ignore[arg-type]
    _same_features(a.features, b.features)
    assert_frame_equal(a.scores, b.scores)
    assert_frame_equal(a.findings, b.findings)
    assert_frame_equal(a.incidents, b.incidents)


@pytest.fixture(scope="module")
def swept(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template swept by the scheduler in 2-minute chunks (per-host work run serially)."""
    root = tmp_path_factory.mktemp("swept") / "lake"
    shutil.copytree(template, root)
    summary = run_cycle(root, _cfg(), now=T0 + timedelta(minutes=MINUTES))
    assert summary is not None and len(summary.chunks) == MINUTES // 2 and summary.findings > 0
    return root


def test_per_host_work_runs_in_other_processes(template: Path, swept: Path, tmp_path: Path) -> None:
    """The per-host step pickles (a top-level function of plain data): swept with a process
    pool as the engine (what ``unveil schedule`` passes: per-host features and blocks of steps), the lake gets the same features,
    scores and findings."""
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    with make_engine("processes:2") as eng:
        run_cycle(root, _cfg(), now=T0 + timedelta(minutes=MINUTES), engine=eng)
    for t in ("features", "scores", "findings"):
        keys = ["host", "window_start", *(["detector", "reference"] if t == "scores" else [])]
        # (columns in any order: a table read unites its files' columns in file-name order,
        # and the names end in a random suffix)
        assert_frame_equal(lake.read(root, t).sort(keys), lake.read(swept, t).sort(keys), check_column_order=False)


def test_per_host_features_and_verdicts_equal_the_fleet_wide_path(swept: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a lake the scheduler swept in 2-minute chunks: the same features (history
    included), scores, findings and incidents as the fleet-wide path, the history read
    from the features table, none from raw telemetry: once the history lies within the data,
    each host's raw rows are read and featurised once, for its chunk (the history's start is
    off the window grid, and the grid's first window after it is no hole to fill)."""
    import jobs.telemetry

    featurised: list[int] = []
    for name in ("compute_features", "features_by_host"):  # (one host's chunk, or a batch's)
        monkeypatch.setattr(jobs.telemetry, name, functools.partial(
            lambda real, *a, **k: featurised.append(1) or real(*a, **k), getattr(jobs.telemetry, name)))
    root, cfg = swept, _cfg()
    length = timedelta(seconds=cfg.analytics.window.length_s)
    since = first_times(root, HOSTS)
    for k in (1, MINUTES // 2 - 1):  # history from the table; and with chunk files older than the history
        s, e = T0 + timedelta(minutes=2 * k), T0 + timedelta(minutes=2 * k + 2)
        first = s - length + US
        ref = _reference(root, cfg, first, e)
        # a history reaching before the data (k = 1) reads raw rows there unless the hosts'
        # first telemetry times are known, as the scheduler's chunks know them
        for known in ({}, since):
            featurised.clear()
            got, reused, fresh = _per_host(root, cfg, first, e, known)
            if first - cfg.analytics.history >= T0 or known:
                assert len(featurised) == len(HOSTS), (k, bool(known))
            else:
                assert len(featurised) > len(HOSTS), k
            _same_features(got.features, ref.features)  # type: ignore[arg-type]
            assert reused > 0 and fresh == 0, k
        _same_verdicts(root, cfg, got, ref, first, e)


def _without_gpu(src: Path, dst: Path, host: str, gpu: str) -> Path:
    """``src`` with every row of ``host``'s GPU ``gpu`` removed (a host with one GPU fewer)."""
    for t in [*telemetry_tables(src), "host_facts"]:
        df = lake.read(src, t)
        if t == "gpu":
            df = df.filter(~((pl.col("host") == host) & (pl.col("gpu") == gpu)))
        lake.write_table(dst, t, df.drop([c for c in ("date", "hour") if c in df.columns]))
    return dst


def test_a_batch_of_hosts_gets_what_each_host_gets_alone(template: Path, swept: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`batch_features` of three hosts: for each host, the features (the same
    columns: a host lacking a GPU gets none of that GPU's columns), facts, staged windows
    and counts of one call per host, with the chunk featurised once for the batch: history
    from the features table, from raw telemetry (never swept), and on a host with one GPU
    fewer than its batch."""
    import jobs.telemetry

    cfg = _cfg()
    a = cfg.analytics
    length = timedelta(seconds=a.window.length_s)
    odd = _without_gpu(template, tmp_path / "odd", "sim-02", "3")
    run_cycle(odd, cfg, now=T0 + timedelta(minutes=MINUTES))
    calls: list[int] = []
    real = jobs.telemetry.features_by_host
    monkeypatch.setattr(jobs.telemetry, "features_by_host", lambda *a, **k: calls.append(1) or real(*a, **k))
    for root, minute, stored in ((swept, 6, True), (template, 7, False), (odd, 6, True), (odd, 4, False)):
        first, end = T0 + timedelta(minutes=minute) - length + US, T0 + timedelta(minutes=minute + 2)
        jobs_of = {}
        for name in ("one", "batch"):
            out = tmp_path / f"{root.name}-{minute}-{name}"
            (out / "stage").mkdir(parents=True)
            jobs_of[name] = [HostChunk(str(root), h, first, end, a.history, a.window, stored_history=stored,
                                       stage=str(out / "stage")) for h in HOSTS]
        alone = [host_features(j) for j in jobs_of["one"]]
        calls.clear()
        together = batch_features(jobs_of["batch"])
        assert len(calls) == 1, (root.name, minute)
        assert [p.host for p in together] == HOSTS
        for x, y in zip(alone, together, strict=True):
            assert_frame_equal(y.features, x.features)
            assert y.columns == x.columns and y.chunk_columns == x.chunk_columns
            assert (y.windows, y.reused, y.refeaturised) == (x.windows, x.reused, x.refeaturised) and x.windows
            assert x.facts is not None and y.facts is not None
            assert_frame_equal(y.facts, x.facts)
            stage_x, stage_y = (Path(j[0].stage or "") for j in (jobs_of["one"], jobs_of["batch"]))
            assert_frame_equal(*(pl.concat([pl.read_parquet(st / f) for f in p.staged])
                                 for st, p in ((stage_y, y), (stage_x, x))))
        if root is odd:
            gpu3 = [c for c in together[2].chunk_columns if c.endswith("@gpu3")]
            assert not gpu3 and any(c.endswith("@gpu3") for c in together[0].chunk_columns)


def test_the_next_chunk_reads_its_history_from_the_kept_files(template: Path, swept: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler keeps each host's features file of its last committed chunk; the next
    chunk reads its history there, not from the ``features`` table: the lake gets the same
    features, scores, findings and incidents as when every chunk reads the table. A file
    kept for another chunk end, or another history, is not read."""
    import jobs.cycle
    import jobs.telemetry

    used: list[int] = []
    real = jobs.telemetry._kept_history
    monkeypatch.setattr(jobs.telemetry, "_kept_history",
                        lambda *a: (lambda got: used.append(0 if got is None else got.height) or got)(real(*a)))
    cache = swept / "_state" / jobs.cycle.FEATURES_CACHE
    doc = json.loads((cache / "manifest.json").read_text())
    named = {name for _, parts, facts in doc["hosts"].values() for name in (*(p[0] for p in parts), facts)}
    assert sorted(doc["hosts"]) == HOSTS and {f.name for f in cache.glob("*.arrow")} == named
    assert len(list(cache.glob("*.facts.arrow"))) == len(HOSTS)
    # (2-minute chunks of a 4-minute history: each rewrote its hosts' whole history, one file)
    assert all(len(parts) == 1 and parts[0][1:] == [None, None] for _, parts, _ in doc["hosts"].values())
    assert not list(cache.glob("pending-*"))
    # the swept lake used them (this test's spy came later): sweep a copy again, cache off
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    monkeypatch.setattr(jobs.cycle, "_cached_history", lambda *a: {})
    run_cycle(root, _cfg(), now=T0 + timedelta(minutes=MINUTES))
    for t in ("features", "scores", "findings", "incidents"):
        keys = ["host", "window_start", *(["detector", "reference"] if t == "scores" else [])]
        if t == "incidents":
            keys = ["incident_id", "state", "updated"]
        assert_frame_equal(lake.read(root, t).sort(keys), lake.read(swept, t).sort(keys), check_column_order=False)
    monkeypatch.undo()
    monkeypatch.setattr(jobs.telemetry, "_kept_history",
                        lambda *a: (lambda got: used.append(0 if got is None else got.height) or got)(real(*a)))
    root2 = tmp_path / "lake2"
    shutil.copytree(template, root2)
    run_cycle(root2, _cfg(), now=T0 + timedelta(minutes=4))
    used.clear()
    run_cycle(root2, _cfg(), now=T0 + timedelta(minutes=6))  # the chunk after a kept one
    assert len(used) == len(HOSTS) and all(n > 0 for n in used)
    # a manifest of another end, or another history, is not trusted
    cfg = _cfg()
    s = T0 + timedelta(minutes=6)
    cached = jobs.cycle._cached_history(root2, cfg, s)
    assert len(cached) == len(HOSTS) and all(facts is not None for _, facts in cached.values())
    assert jobs.cycle._cached_history(root2, cfg, s + timedelta(minutes=2)) == {}
    other = SweepConfig(analytics=analytics_from_mapping({"history": "5m", "warmup": "30s"}))
    assert jobs.cycle._cached_history(root2, other, s) == {}


def test_a_live_minute_writes_only_the_windows_since_the_last_whole_history(template: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One-minute chunks after a kept one write a host's windows since its last whole
    history file (the delta) and keep that file (the base) bounded before them; a chunk
    whose delta would span more than ``DELTA_SHARE`` of the history rewrites the whole
    history instead. Every table equals what chunks that read no kept file give."""
    import jobs.cycle
    import jobs.telemetry

    monkeypatch.setattr(jobs.telemetry, "DELTA_SHARE", 1.0)  # (a 4-minute history: deltas of up to 3 minutes)
    cfg = replace(_cfg(), chunk=timedelta(minutes=1))
    seen: list[dict[str, list[Any]]] = []
    keep = jobs.cycle._keep_features

    def spy(root: Path, c: SweepConfig, kept: Path, e: datetime) -> None:
        keep(root, c, kept, e)
        d = wm.state_dir(root) / jobs.cycle.FEATURES_CACHE
        hosts = json.loads((d / "manifest.json").read_text())["hosts"]
        named = {name for _, parts, facts in hosts.values() for name in (*(p[0] for p in parts), facts)}
        assert {f.name for f in d.glob("*.arrow")} == named  # (a replaced delta is deleted)
        for _, parts, _ in hosts.values():
            if len(parts) == 2:
                (_, _, hi), (delta, lo, top) = parts
                ws = pl.read_ipc(d / delta)["window_start"].dt.epoch("us")
                assert hi == lo and top is None and ws.min() >= lo  # (the delta holds no base window)
        seen.append(hosts)

    monkeypatch.setattr(jobs.cycle, "_keep_features", spy)
    swept = tmp_path / "swept"
    shutil.copytree(template, swept)
    summary = run_cycle(swept, cfg, now=T0 + timedelta(minutes=MINUTES))
    assert summary is not None and len(summary.chunks) == MINUTES
    files = [len(hosts["sim-01"][1]) for hosts in seen]
    # the first chunk has no kept file; then deltas, and a whole history when one grows past its share
    assert files[0] == 1 and 2 in files and any(a == 2 and b == 1 for a, b in zip(files, files[1:], strict=False))
    # a host without rows in a chunk (its agent down) gets an empty delta, not its history again
    a = cfg.analytics
    s, e = T0 + timedelta(minutes=MINUTES), T0 + timedelta(minutes=MINUTES + 1)
    first = s - timedelta(seconds=a.window.length_s) + US
    previous, _ = jobs.cycle._cached_history(swept, cfg, s)["sim-01"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    got, = batch_features([HostChunk(str(swept), "sim-01", first, e, a.history, a.window, scratch=str(scratch),
                                     previous=previous)])
    assert got.windows == 0 and got.path is not None and len(got.parts) == 2 and got.parts[0][0] == previous[0][0]
    history = jobs.telemetry._kept_history(previous, first - a.history, first)
    assert history is not None and history.height > 0
    assert_frame_equal(HostFiles({"sim-01": got.parts}, tuple(got.columns)).rows(None), concat_features([history]))
    assert pl.read_ipc(got.path).height < history.height
    monkeypatch.undo()
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    monkeypatch.setattr(jobs.cycle, "_cached_history", lambda *a: {})
    run_cycle(root, cfg, now=T0 + timedelta(minutes=MINUTES))
    for t in ("features", "scores", "findings", "incidents"):
        keys = ["host", "window_start", *(["detector", "reference"] if t == "scores" else [])]
        if t == "incidents":
            keys = ["incident_id", "state", "updated"]
        assert_frame_equal(lake.read(root, t).sort(keys), lake.read(swept, t).sort(keys), check_column_order=False)


def test_a_chunk_reads_the_facts_written_since_the_chunk_before(template: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts changes a chunk wrote (``HostFeatures.facts_path``), given to the next
    chunk with its end (``HostChunk.previous_facts``), plus the ``host_facts`` rows from
    that end on: the same changes as reading every row before the chunk's end, a change
    after the boundary included, and only rows from the boundary on are read. Facts
    written after the chunk's end are not its facts."""
    import jobs.telemetry

    a = _cfg().analytics
    length = timedelta(seconds=a.window.length_s)
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    facts = lake.read(root, "host_facts")
    last = facts.filter(pl.col("host") == "sim-01").sort("time").tail(1)
    changed = last.with_columns(pl.lit(T0 + timedelta(minutes=7)).cast(facts["time"].dtype).alias("time"),
                                pl.lit("changed").alias("value"))
    later = changed.with_columns(pl.lit(T0 + timedelta(minutes=9)).cast(facts["time"].dtype).alias("time"),
                                 pl.lit("after the chunk").alias("value"))
    lake.write_table(root, "host_facts", pl.concat([changed, later]).drop(
        [c for c in ("date", "hour") if c in facts.columns]))
    boundary, end = T0 + timedelta(minutes=6), T0 + timedelta(minutes=8)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = batch_features([HostChunk(str(root), h, boundary - length + US, boundary, a.history, a.window,
                                       stored_history=False, scratch=str(scratch)) for h in HOSTS])
    assert all(p.facts_path is not None for p in before)
    starts: list[object] = []
    real = jobs.telemetry.lake_mod.read
    monkeypatch.setattr(jobs.telemetry.lake_mod, "read", lambda root, table, **k: (
        starts.append(k.get("start")) if table == "host_facts" else None) or real(root, table, **k))
    first = end - timedelta(minutes=2) - length + US
    kept = batch_features([HostChunk(str(root), p.host, first, end, a.history, a.window, stored_history=False,
                                     previous_facts=(str(p.facts_path), boundary)) for p in before])
    assert starts == [boundary]
    starts.clear()
    every = batch_features([HostChunk(str(root), h, first, end, a.history, a.window, stored_history=False)
                            for h in HOSTS])
    assert starts == [None]
    for x, y in zip(every, kept, strict=True):
        assert x.facts is not None and y.facts is not None and x.facts.height
        assert_frame_equal(y.facts, x.facts)
        assert x.facts["time"].max() < end  # type: ignore[operator]
    got = kept[1].facts
    assert got is not None and got.filter(pl.col("value") == "changed").height == 1
    assert got.filter(pl.col("value") == "after the chunk").height == 0


def test_the_kept_files_follow_the_fleet(tmp_path: Path) -> None:
    """A committed chunk's files replace the hosts' entries; a host not swept for its
    history (it left the fleet) loses its entry and file, and files no entry names (a
    crash before the manifest, another configuration's) are deleted."""
    import json

    import jobs.cycle
    from jobs import watermarks as wm

    cfg = _cfg()  # 4 minutes of history
    e = T0 + timedelta(hours=3)
    d = wm.state_dir(tmp_path) / jobs.cycle.FEATURES_CACHE
    d.mkdir(parents=True)
    entries = {"gone": [(e - timedelta(minutes=4)).isoformat(), "gone.arrow"],
               "lagging": [(e - timedelta(minutes=3)).isoformat(), "lagging.arrow"],
               "sim-00": [(e - timedelta(minutes=1)).isoformat(), "sim-00.arrow"],
               "broken": ["not a time", "broken.arrow"]}
    for name in ("gone.arrow", "lagging.arrow", "sim-00.arrow", "broken.arrow", "orphan.arrow"):
        (d / name).write_bytes(b"old")
    wm.write_json_atomic(d / "manifest.json", {"key": jobs.cycle._cache_key(cfg), "hosts": entries})
    kept = d / "pending-x"
    kept.mkdir()
    (kept / "sim-00.arrow").write_bytes(b"new")
    wm.write_json_atomic(kept / "hosts.json", {"sim-00": ["sim-00.arrow", None]})
    jobs.cycle._keep_features(tmp_path, cfg, kept, e)
    doc = json.loads((d / "manifest.json").read_text())
    # (entries of one file by name, as kept before a host's history had parts, are read as one part)
    assert doc["hosts"] == {"lagging": [entries["lagging"][0], [["lagging.arrow", None, None]], None],
                            "sim-00": [e.isoformat(), [["sim-00.arrow", None, None]], None]}
    assert sorted(f.name for f in d.iterdir()) == ["lagging.arrow", "manifest.json", "sim-00.arrow"]
    assert (d / "sim-00.arrow").read_bytes() == b"new"
    assert jobs.cycle._cached_history(tmp_path, cfg, e) == {"sim-00": (((str(d / "sim-00.arrow"), None, None),), None)}


def test_batches_hold_an_hour_of_raw_telemetry_and_feed_every_worker() -> None:
    """One-minute chunks: 60 hosts a batch, at least one batch per worker, near-equal; an
    hour's chunk, or one whose history is read raw: one host a batch."""
    from analytics.features import WindowSpec

    def jobs(n: int, chunk: timedelta, stored: bool = True) -> list[HostChunk]:
        return [HostChunk("lake", f"h{i:03d}", T0, T0 + chunk, timedelta(hours=1), WindowSpec(), stored_history=stored)
                for i in range(n)]

    def sizes(n: int, chunk: timedelta, workers: int, stored: bool = True) -> list[int]:
        got = batches(jobs(n, chunk, stored), workers)
        assert [j.host for b in got for j in b] == [j.host for j in jobs(n, chunk, stored)]
        return [len(b) for b in got]

    assert sizes(64, timedelta(minutes=1), 2) == [32, 32]
    assert sizes(256, timedelta(minutes=1), 2) == [51, 51, 52, 51, 51]
    assert sizes(3, timedelta(minutes=1), 8) == [1, 1, 1]
    assert sizes(4, timedelta(hours=1), 2) == [1, 1, 1, 1]
    assert sizes(4, timedelta(minutes=1), 1, stored=False) == [1, 1, 1, 1]
    assert batches([], 2) == []


def test_history_the_features_table_lacks_is_featurised_from_raw(template: Path) -> None:
    """A lake never swept (no features table): the history comes from raw telemetry, the
    same as the fleet-wide path's."""
    cfg = _cfg()
    first = T0 + timedelta(minutes=7) - timedelta(seconds=cfg.analytics.window.length_s) + US
    end = T0 + timedelta(minutes=9)
    got, reused, fresh = _per_host(template, cfg, first, end)
    assert reused == 0 and fresh > 0
    ref = _reference(template, cfg, first, end)
    _same_features(got.features, ref.features)  # type: ignore[arg-type]
    _same_verdicts(template, cfg, got, ref, first, end)


def test_a_host_resuming_after_a_gap_gets_the_fleet_wide_windows(template: Path, tmp_path: Path) -> None:
    """sim-00 sends nothing from 7m50s to 8m20s, across a chunk boundary at 8m: the chunk
    from 8m still gets the windows the fleet-wide path gives it (its grid starts in the
    history, so windows over the gap exist), and the same verdicts."""
    root = tmp_path / "gap"
    lo, hi = T0 + timedelta(minutes=7, seconds=50), T0 + timedelta(minutes=8, seconds=20)
    for t in [*telemetry_tables(template), "host_facts"]:
        df = lake.read(template, t)
        if t != "host_facts":
            df = df.filter(~((pl.col("host") == "sim-00") & (pl.col("time") >= lo) & (pl.col("time") < hi)))
        lake.write_table(root, t, df.drop([c for c in ("date", "hour") if c in df.columns]))
    cfg = _cfg()
    run_cycle(root, cfg, now=T0 + timedelta(minutes=MINUTES))
    first = T0 + timedelta(minutes=8) - timedelta(seconds=cfg.analytics.window.length_s) + US
    end = T0 + timedelta(minutes=10)
    got, reused, _ = _per_host(root, cfg, first, end)
    ref = _reference(root, cfg, first, end)
    assert reused > 0
    gap = ref.features.filter((pl.col("host") == "sim-00") & (pl.col("window_start") < hi)
                              & (pl.col("window_start") >= first))
    assert gap.height > 0  # (the fleet-wide path has windows over the gap: the case under test)
    _same_features(got.features, ref.features)  # type: ignore[arg-type]
    _same_verdicts(root, cfg, got, ref, first, end)


def test_unveil_sweep_per_host_on_a_process_pool_equals_the_fleet_wide_path(template: Path, tmp_path: Path) -> None:
    """The by-hand sweep: its hosts featurised one by one on the engine, history from raw
    telemetry (never from a features table a repeated sweep may have doubled), gives the
    fleet-wide path's features, scores and findings; serially too."""
    cfg = _cfg()
    a = cfg.analytics
    start, end = T0 + timedelta(minutes=5), T0 + timedelta(minutes=MINUTES)
    ref_loaded = load_lake(template, start - a.history, end, HOSTS)
    ref = sweep_step(ref_loaded, SweepConfig(analytics=a, detection=cfg.detection, analysis_step=None), load_kb(),
                     since=start, hosts=HOSTS, history_known=first_times(template, HOSTS), incidents=False)
    assert ref.findings.height > 0  # (the throttle on sim-01: the case under test)
    for spec in ("processes:2", "serial"):
        root = tmp_path / spec.replace(":", "-") / "lake"
        shutil.copytree(template, root)
        if spec == "serial":  # a features table from an earlier sweep of the same interval is not read
            run_sweep(root, start, end, config=a, detection=cfg.detection, engine=spec)
        summary = run_sweep(root, start, end, config=a, detection=cfg.detection, engine=spec, write=False)
        assert summary.windows > 0
        got = run_sweep(root, start, end, config=a, detection=cfg.detection, engine=spec, write=True)
        assert got.rows_written["findings"] == ref.findings.height
        feats = lake.read(root, "features").filter(pl.col("time").is_not_null())
        n = 2 if spec == "serial" else 1  # (the serial lake was swept twice: two copies)
        assert feats.height == n * ref.features.height
        scores = lake.read(root, "scores").drop("time", "date", "hour", strict=False)
        keys = ["host", "window_start", "detector", "reference"]
        want = ref.scores
        if n == 2:
            want = pl.concat([want, want])
        assert_frame_equal(scores.sort(keys), want.select(scores.columns).sort(keys), check_dtypes=False)


class _Recording:
    """An engine that runs a real process pool and keeps the items it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.items = inner, []  # type: ignore[var-annotated]

    @property
    def workers(self) -> int:
        return int(self.inner.workers)

    def map(self, fn: Any, items: Any) -> list[Any]:
        self.items.extend(items)
        return list(self.inner.map(fn, items))


def _six_steps(template: Path) -> tuple[SweepConfig, KnowledgeBase, Loaded, dict[str, Any]]:
    """The pool tests' sweep: six one-minute steps of the template's hosts, from their files."""
    cfg = _cfg()
    first = T0 + timedelta(minutes=4) - timedelta(seconds=cfg.analytics.window.length_s) + US
    end = T0 + timedelta(minutes=MINUTES)
    loaded, _, _ = _per_host(template, cfg, first, end)
    return cfg, load_kb(), loaded, {"since": first, "until": end, "hosts": HOSTS,
                                    "history_known": first_times(template, HOSTS), "horizon": end}


def test_blocks_of_steps_on_a_pool_read_one_shared_file_and_give_the_same_verdicts(template: Path,
                                                                                   tmp_path: Path) -> None:
    """Six one-minute analysis steps in four blocks on a process pool: the blocks get the
    features as the path of one Arrow file in ``scratch`` (not a copy each), the file is gone
    afterwards, and features, scores, findings and incidents equal the steps run here."""
    cfg, kb, loaded, kw = _six_steps(template)
    here = sweep_step(loaded, cfg, kb, **kw)  # type: ignore[arg-type]
    assert here.findings.height > 0  # (the throttle on sim-01)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with make_engine("processes:2") as pool:
        eng = _Recording(pool)
        pooled = sweep_step(loaded, cfg, kb, engine=eng, scratch=scratch, **kw)  # type: ignore[arg-type]
    # two blocks per worker (a worker that is done takes the next), each every 4th step:
    # every step once, and each block's steps 4 minutes apart (early and late steps mixed)
    steps = sorted(s for b in eng.items for s in b.bounds)
    assert len(eng.items) == 4 and len(steps) == 6 and steps == sorted(set(steps))
    for block in eng.items:
        starts = [b for b, _ in block.bounds]
        assert all(y - x == timedelta(minutes=4) for x, y in zip(starts, starts[1:], strict=False))
    assert sorted(len(b.bounds) for b in eng.items) == [1, 1, 2, 2]
    for block in eng.items:
        assert isinstance(block.features, str) and Path(block.features).parent.parent == scratch
    assert list(scratch.iterdir()) == []
    for t in ("features", "scores", "findings", "incidents"):
        assert_frame_equal(getattr(pooled, t), getattr(here, t))


def test_proposals_read_the_facts_of_the_hosts_files(template: Path, tmp_path: Path) -> None:
    """A matched incident's remediation proposal fills its parameters from the host's facts,
    which the scheduler's chunk keeps in the hosts' files until the proposals are made."""
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    cfg = replace(_cfg(), queue_remediations=True)
    summary = run_cycle(root, cfg, now=T0 + timedelta(minutes=MINUTES), queue_path=tmp_path / "queue.json")
    assert summary is not None and summary.incidents > 0
    assert sum(c.remediations for c in summary.chunks) > 0
    assert not list((root / "_state").rglob("host-features"))  # the scratch files are gone


def test_blocks_on_a_pool_stage_their_own_scores(template: Path, tmp_path: Path) -> None:
    """With a staged lake root (the scheduler's), each block of steps writes its scores
    there and sends back the files, not the rows: the staged table holds exactly the scores
    of the steps run here, and findings and incidents are unchanged."""
    cfg, kb, loaded, kw = _six_steps(template)
    here = sweep_step(loaded, cfg, kb, **kw)  # type: ignore[arg-type]
    assert here.scores.height > 0
    stage = tmp_path / "stage"
    stage.mkdir()
    with make_engine("processes:2") as pool:
        eng = _Recording(pool)
        pooled = sweep_step(loaded, cfg, kb, engine=eng, scratch=tmp_path, stage=stage, **kw)  # type: ignore[arg-type]
    assert len(eng.items) == 4 and pooled.scores.is_empty()
    assert len(pooled.staged) >= 2 and all((stage / f).is_file() for f in pooled.staged)
    staged = lake.read(stage, "scores").drop("time")
    keys = staged.columns  # (every column: a total order)
    assert_frame_equal(staged.sort(keys), here.scores.select(staged.columns).sort(keys), check_dtypes=False)
    for t in ("findings", "incidents"):
        assert_frame_equal(getattr(pooled, t), getattr(here, t))



def test_host_files_hand_back_a_short_part_as_a_copy_and_the_history_as_the_map(template: Path,
                                                                              tmp_path: Path) -> None:
    """A step reads its batch's history from the hosts' files memory-mapped (no copy), but
    the last minutes of its peers' windows as a copy: a few rows of every column fault in
    nearly the whole file, which would stay mapped as long as the frame lives. Either way
    the rows are those of the file, in host then window order."""
    from jobs.step import WS
    from jobs.telemetry import joined

    cfg = _cfg()
    a = cfg.analytics
    first, end = T0 + timedelta(minutes=4), T0 + timedelta(minutes=MINUTES)
    parts = [host_features(HostChunk(str(template), h, first, end, a.history, a.window, stored_history=False,
                                     scratch=str(tmp_path))) for h in HOSTS]
    files = joined(parts).files
    assert files is not None

    paths = {path for parts in files.paths.values() for path, _, _ in parts}

    def mapped() -> set[str]:
        return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if line.split()[-1] in paths}

    everything = files.rows(None)
    late = pl.col(WS) >= end - timedelta(minutes=1)
    assert mapped() == paths  # the history: the maps themselves
    short = files.rows(HOSTS[1:], late)
    del everything
    assert mapped() == set()  # the short part holds no map
    assert_frame_equal(short, files.rows(None).filter(pl.col("host").is_in(HOSTS[1:]) & late))


def test_hosts_first_times_are_read_once_per_process(template: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's first telemetry time (its warm-up) never moves later: the live scheduler's
    cycles read it from the lake once, not at every one-minute cycle, the first cycle's
    starting marks and chunks share that one read, and the committed marks keep it for the
    next process."""
    import jobs.cycle
    import jobs.telemetry

    read: list[str] = []
    real = jobs.telemetry.earliest
    for mod in (jobs.telemetry, jobs.cycle):  # (wherever it is called from)
        if hasattr(mod, "earliest"):
            monkeypatch.setattr(mod, "earliest", lambda lake, h: read.append(h) or real(lake, h))
    root = tmp_path / "lake"
    shutil.copytree(template, root)
    for minute in (8, 9, 10):
        assert run_cycle(root, _cfg(), now=T0 + timedelta(minutes=minute)) is not None
    assert sorted(read) == HOSTS
    # kept with the committed marks: a command started afresh (cron's --once) reads none
    marks = wm.load(root)
    assert sorted(marks) == HOSTS and all(marks[h].first == real(template, h) for h in HOSTS)
    monkeypatch.setattr(jobs.cycle, "_FIRST_TIMES", {})
    assert run_cycle(root, _cfg(), now=T0 + timedelta(minutes=11)) is not None
    assert sorted(read) == HOSTS
    assert all(wm.load(root)[h].first == marks[h].first for h in HOSTS)


def test_one_step_on_a_pool_splits_its_hosts_and_gives_the_same_verdicts(template: Path, tmp_path: Path) -> None:
    """A live cycle is one analysis step: on a pool of two its shared part is formed once, on
    the workers too (the hosts' profiles a batch an item, then each cohort's reference), then
    its hosts go to the workers in two slices, each slice stages its own scores, and scores,
    findings and incidents equal the step run here."""
    cfg = _cfg(batch_hosts=2)  # (a slice is at least half a batch: two slices of three hosts)
    end = T0 + timedelta(minutes=MINUTES)
    first = end - timedelta(minutes=1) - timedelta(seconds=cfg.analytics.window.length_s) + US
    loaded, _, _ = _per_host(template, cfg, first, end)
    kb = load_kb()
    kw: dict[str, Any] = {"since": first, "until": end, "hosts": HOSTS, "horizon": end,
                          "history_known": first_times(template, HOSTS)}
    here = sweep_step(loaded, cfg, kb, **kw)
    assert here.findings.height > 0 and here.findings["host"].unique().to_list() == ["sim-01"]
    stage = tmp_path / "stage"
    stage.mkdir()
    with make_engine("processes:2") as pool:
        eng = _Recording(pool)
        pooled = sweep_step(loaded, cfg, kb, engine=eng, scratch=tmp_path, stage=stage, **kw)
    kinds = [type(b).__name__ for b in eng.items]
    assert kinds == ["ProfileBlock", "ProfileBlock", "CohortBlock", "BatchBlock", "BatchBlock"], kinds
    assert [b.hosts for b in eng.items[:2]] == [["sim-00", "sim-01"], ["sim-02"]]
    cohort = eng.items[2]
    assert sorted(cohort.cohort_of) == cohort.sampled == HOSTS and len(set(cohort.cohort_of.values())) == 1  # (one cohort of three, all sampled)
    slices = [[h for batch in b.batches for h in batch] for b in eng.items[3:]]
    assert slices == [["sim-00", "sim-01"], ["sim-02"]]
    assert pooled.scores.is_empty() and len(pooled.staged) >= 2
    staged = lake.read(stage, "scores").drop("time")
    keys = staged.columns
    assert_frame_equal(staged.sort(keys), here.scores.select(staged.columns).sort(keys), check_dtypes=False)
    for t in ("findings", "incidents"):
        assert_frame_equal(getattr(pooled, t), getattr(here, t))
