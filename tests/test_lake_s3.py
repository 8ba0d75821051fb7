"""The lake on S3-compatible object storage, against a real S3 server on loopback (moto's
server mode, a separate process: tests/s3server.py). Each test has its own bucket."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs
import pytest
from polars.testing import assert_frame_equal

from ingest import lake, objstore
from tests.s3server import S3Server, s3_server  # noqa: F401  (the session fixture)
from tests.servers import InfluxdServer
from tests.test_engine import SCENARIO
from tests.test_lake import T0, cpu_rows, sample

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def s3_lake(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # noqa: F811
    """``s3://<new bucket>/lake``, with the standard AWS variables pointing at the server."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    yield f"s3://{s3_server.create_bucket()}/lake"


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns)


def test_write_then_read_is_the_local_result(s3_lake: str, tmp_path: Path) -> None:
    """Every read API gives on S3 exactly what it gives on a local lake with the same writes."""
    local = str(tmp_path / "lake")
    rows = cpu_rows(3, hosts=("a", "b"))
    facts = sample("host_facts", host="a")
    for root in (local, s3_lake):
        lake.write_table(root, "cpu", rows)
        lake.write_table(root, "host_facts", facts, partition_by_hour=False)
    assert lake.tables(s3_lake) == lake.tables(local) == ["cpu", "host_facts"]
    assert lake.hosts(s3_lake, "cpu") == ["a", "b"]
    for kw in ({}, {"start": T0 + timedelta(minutes=70), "end": T0 + timedelta(minutes=130), "hosts": ["b"]}):
        want = lake.read(local, "cpu", **kw)  # type: ignore[arg-type]
        got = lake.read(s3_lake, "cpu", **kw)  # type: ignore[arg-type]
        assert got.height > 0
        assert_frame_equal(_sorted(got), _sorted(want))
    assert_frame_equal(lake.read(s3_lake, "host_facts"), lake.read(local, "host_facts"))
    # the scan is lazy and typed like a local one, also when empty
    assert lake.scan(s3_lake, "cpu", start=T0 + timedelta(days=9)).collect().schema == \
        lake.scan(local, "cpu").collect().schema


def test_pruning_lists_only_the_asked_host_and_hour(s3_lake: str) -> None:
    lake.write_table(s3_lake, "cpu", cpu_rows(5, hosts=("a", "b", "c")))
    files = lake.files(s3_lake, "cpu", start=T0 + timedelta(hours=2), end=T0 + timedelta(hours=3), hosts=["b"])
    assert len(files) == 1
    assert files[0].parent.as_posix().endswith("cpu/host=b/date=2024-01-01/hour=02")
    # on the server, not in a local directory named "s3:" (what a Path of the URL would make)
    assert len(_objects(s3_lake, "cpu", "b")) == 5
    assert not Path("s3:").exists()


def test_missing_table_and_bucket_errors_name_them(s3_lake: str, s3_server: S3Server) -> None:  # noqa: F811
    lake.write_table(s3_lake, "cpu", cpu_rows(1))
    with pytest.raises(lake.LakeError, match="no table 'mem'.*tables: cpu"):
        lake.read(s3_lake, "mem")
    with pytest.raises(lake.LakeError, match="bucket 'no-such-bucket' does not exist"):
        lake.tables("s3://no-such-bucket/lake")
    with pytest.raises(lake.LakeError, match="bad lake URL"):
        lake.tables("s3:///lake")


def test_sink_commit_is_idempotent_per_token(s3_lake: str) -> None:
    """The agent's replay contract holds on S3: a second commit with the same token writes nothing."""
    sink = lake.LakeSink(s3_lake)
    rows = cpu_rows(2)
    assert sink.commit("cpu", rows, "0123abcd") == rows.height
    assert sink.commit("cpu", rows, "0123abcd") == 0
    sink.write("cpu", cpu_rows(1).with_columns(pl.col("user") + 1000))
    sink.close()
    assert lake.read(s3_lake, "cpu").height == rows.height + 10


# ------------------------------------------------------------------ compaction


def _objects(s3_lake: str, table: str, host: str) -> list[str]:
    st = objstore.store(s3_lake)
    sel = pafs.FileSelector((st.root / table / f"host={host}").as_posix(), recursive=True)
    return sorted(i.path for i in st.fs.get_file_info(sel) if i.path.endswith(".parquet"))


def _write_small_files(root: str, host: str, n: int = 6) -> pl.DataFrame:
    rows = cpu_rows(1, hosts=(host,), per_hour=n * 3)
    for k in range(n):
        lake.write_table(root, "cpu", rows.slice(3 * k, 3))
    return rows


LATER = T0 + timedelta(days=1)


def test_compaction_merges_one_hosts_files_and_deletes_inputs_after_the_grace(s3_lake: str) -> None:
    a = _write_small_files(s3_lake, "a")
    _write_small_files(s3_lake, "b")
    before = lake.read(s3_lake, "cpu")
    assert len(lake.compaction_candidates(s3_lake, now=LATER)) == 2  # a listing: one per host
    with pytest.raises(lake.LakeError, match="pass hosts="):
        lake.compact(s3_lake, "cpu", now=LATER)
    stats = lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER, grace=timedelta(minutes=5))
    assert (stats.merges, stats.files_before, stats.rows) == (1, 6, a.height)
    # the inputs are still there (a scan listed before the merge can read them) but hidden
    assert len(_objects(s3_lake, "cpu", "a")) == 7
    assert len(lake.files(s3_lake, "cpu", hosts=["a"])) == 1
    assert len(lake.files(s3_lake, "cpu", hosts=["b"])) == 6  # not this writer's host
    assert_frame_equal(_sorted(lake.read(s3_lake, "cpu")), _sorted(before))
    # within the grace nothing changes; after it the inputs go
    assert lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER + timedelta(minutes=1)).merges == 0
    assert len(_objects(s3_lake, "cpu", "a")) == 7
    stats = lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER + timedelta(minutes=6))
    assert stats.recovered == 1
    assert len(_objects(s3_lake, "cpu", "a")) == 1
    assert_frame_equal(_sorted(lake.read(s3_lake, "cpu")), _sorted(before))


_CRASHING_COMPACTOR = """
import os, sys
from datetime import datetime, timedelta
from ingest import lake, objstore
url, point, now = sys.argv[1], sys.argv[2], datetime.fromisoformat(sys.argv[3])
put = objstore.ObjectStore.put
def crashing_put(self, path, data):
    if path.name.startswith("part-") and point == "before-output":
        os._exit(9)  # the process dies: no cleanup, like a kill -9
    put(self, path, data)
    if path.name.startswith("part-") and point == "after-output":
        os._exit(9)
objstore.ObjectStore.put = crashing_put
lake.compact(url, "cpu", hosts=["a"], now=now, grace=timedelta(0))
"""


@pytest.mark.parametrize("point", ["before-output", "after-output"])
def test_a_compactor_killed_at_either_side_of_its_commit(s3_lake: str, point: str) -> None:
    """Killed after its journal but before the output's PUT, or after the PUT but before the
    inputs' deletion: readers see every row exactly once, and the next compaction of the
    host finishes (or undoes) the merge."""
    _write_small_files(s3_lake, "a")
    before = lake.read(s3_lake, "cpu")
    proc = subprocess.run([sys.executable, "-c", _CRASHING_COMPACTOR, s3_lake, point, LATER.isoformat()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    objects = _objects(s3_lake, "cpu", "a")
    assert len(objects) == (7 if point == "after-output" else 6)
    assert_frame_equal(_sorted(lake.read(s3_lake, "cpu")), _sorted(before))  # no duplicates, nothing lost
    stats = lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER, grace=timedelta(0))
    assert stats.recovered == 1
    assert stats.merges == (0 if point == "after-output" else 1)  # rolled forward, or undone and redone
    assert len(_objects(s3_lake, "cpu", "a")) == 1
    assert_frame_equal(_sorted(lake.read(s3_lake, "cpu")), _sorted(before))


# ------------------------------------------------------- readers during writes

_WRITER = """
import sys
from datetime import datetime, timedelta, timezone
import numpy as np, polars as pl
from ingest import lake, objstore
url, rows = sys.argv[1], int(sys.argv[2])
t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
rng = np.random.default_rng(0)
for k in range(1000):
    df = pl.DataFrame({"time": [t0 + timedelta(hours=k % 3)] * rows, "host": "w", "commit": k,
                       "v": rng.random(rows)})  # random floats: a file of several MB, uploaded in parts
    lake.write_table(url, "blobs", df)
    print(k, flush=True)
"""


@pytest.mark.slow
def test_readers_never_see_half_a_commit_and_a_killed_writer_loses_nothing_committed(s3_lake: str) -> None:
    """A writer process uploads multi-megabyte files (multipart uploads) and is SIGKILLed at
    a random moment; a reader reading all the while sees only whole commits, and afterwards
    every commit the writer reported is there, whole."""
    rows = 1_400_000  # ~10.5 MB of random float64 per file: two parts of a multipart upload
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, s3_lake, str(rows)], stdout=subprocess.PIPE, text=True)
    try:
        seen, reads = 0, 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (reads < 5 or seen < 3):
            with contextlib.suppress(lake.LakeError):  # the table's first object is not there yet
                df = lake.read(s3_lake, "blobs", columns=["commit"])
                counts = df.group_by("commit").len()
                assert (counts["len"] == rows).all(), counts.filter(pl.col("len") != rows)
                seen = max(seen, counts.height)
                reads += 1
        time.sleep(random.uniform(0.0, 0.5))
    finally:
        proc.kill()
        out, _ = proc.communicate()
    reported = [int(x) for x in out.split()]
    assert reads >= 5 and len(reported) >= 3
    counts = lake.read(s3_lake, "blobs", columns=["commit"]).group_by("commit").len()
    assert (counts["len"] == rows).all()
    assert set(reported) <= set(counts["commit"].to_list())  # + at most the one whose PUT ended unreported
    assert counts.height <= len(reported) + 1


# ------------------------------------------------- query, the sweep's read, config


def test_unveil_query_reads_an_s3_lake_like_a_local_one(s3_lake: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    local = str(tmp_path / "lake")
    for root in (local, s3_lake):
        lake.write_table(root, "cpu", cpu_rows(3, hosts=("a", "b")))
    sql = "SELECT host, count(*) AS n, sum(\"user\") AS s FROM cpu GROUP BY host ORDER BY host"
    outs = []
    for root in (local, s3_lake):
        assert main(["query", "--lake", root, "--since", "2024-01-01T01:00:00Z", "--hosts", "b",
                     "--format", "csv", sql]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[1].splitlines()[1].startswith("b,20,")  # hours 1 and 2


def test_the_sweeps_telemetry_read_works_on_s3(s3_lake: str, tmp_path: Path) -> None:
    """jobs.telemetry (what a sweep chunk reads: hosts, first times, data presence, frames)."""
    from jobs import telemetry

    local = str(tmp_path / "lake")
    for root in (local, s3_lake):
        lake.write_table(root, "cpu", cpu_rows(3, hosts=("a", "b")))
        lake.write_table(root, "host_facts", sample("host_facts", host="a"), partition_by_hour=False)
    assert telemetry.fleet_hosts(s3_lake) == telemetry.fleet_hosts(local) == ["a", "b"]
    assert telemetry.first_times(s3_lake, None) == telemetry.first_times(local, None) == {"a": T0, "b": T0}
    t1, t2 = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    assert telemetry.has_data(s3_lake, t1, t2, ["a"])
    assert not telemetry.has_data(s3_lake, T0 + timedelta(days=2), T0 + timedelta(days=3), ["a"])
    got, want = telemetry.load_lake(s3_lake, t1, t2, ["b"]), telemetry.load_lake(local, t1, t2, ["b"])
    assert_frame_equal(got.frames["cpu"].collect(), want.frames["cpu"].collect())
    assert got.facts is not None and want.facts is not None
    assert_frame_equal(got.facts, want.facts)


def test_lake_endpoint_and_region_come_from_the_config(s3_server: S3Server, tmp_path: Path,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs import config as config_mod

    bucket = s3_server.create_bucket()
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    p = tmp_path / "unveil.toml"
    p.write_text(f'[lake]\npath = "s3://{bucket}/lake"\nendpoint = "{s3_server.endpoint}"\nregion = "us-east-1"\n')
    cfg = config_mod.load(p, analysis=False)
    assert (cfg.lake, cfg.lake_endpoint, cfg.lake_region) == (f"s3://{bucket}/lake", s3_server.endpoint, "us-east-1")
    try:
        config_mod.use_lake_storage(cfg)
        assert cfg.lake is not None
        lake.write_table(cfg.lake, "cpu", cpu_rows(1))
        assert lake.read(cfg.lake, "cpu").height == 10
    finally:
        objstore.configure()
    p.write_text('[lake]\nendpoint = "127.0.0.1:9000"\n')
    with pytest.raises(config_mod.ConfigError, match=r"\[lake\]\.endpoint must start with http"):
        config_mod.load(p, analysis=False)


def test_commands_that_need_a_lake_directory_refuse_an_s3_lake_clearly(
        s3_lake: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Sweep state (staging, watermarks, locks) and the agent's journal need a directory:
    an s3:// lake is refused with the reason, never treated as a relative path."""
    from jobs.cli import main
    from jobs.cycle import run_cycle

    for cmd in (["drill", "--restore", "--lake", s3_lake], ["remediate", "--lake", s3_lake, "list"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "is on object storage: this command needs a lake directory" in err, (cmd, err)
    # the scheduled sweep, the agent and post-mortems take one, with a directory for their local state
    for cmd in (["schedule", "--once"], ["agent", "--duration", "1"], ["sweep"],
                ["postmortem", "--host", "h", "--from", "2026-01-05T08:00:00Z", "--to", "2026-01-05T09:00:00Z"]):
        assert main([*cmd, "--lake", s3_lake]) == 2
        assert "needs a directory: pass --state DIR or set [lake] state" in capsys.readouterr().err
    with pytest.raises(lake.LakeError, match=r"set \[lake\] state in the config or pass --state DIR"):
        run_cycle(s3_lake)
    from ingest.agent import Agent, AgentConfig
    from ingest.sink import SinkError

    with pytest.raises(SinkError, match=r"agent: lake s3://.* needs a directory: set \[lake\] state"):
        Agent(AgentConfig(host="h1", duration_s=0.1), [lake.LakeSink(s3_lake)], [])
    assert not Path("s3:").exists()


def test_the_grace_keeps_inputs_for_scans_listed_before_a_merge(s3_lake: str) -> None:
    """Why merged inputs are deleted late on object storage: a lazy scan listed before the
    merge reads them at collect. Without the grace it fails (the local behaviour, which
    read() absorbs by listing again)."""
    _write_small_files(s3_lake, "a")
    want = _sorted(lake.read(s3_lake, "cpu"))
    listed_before = lake.scan(s3_lake, "cpu")
    assert lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER).merges == 1  # default grace
    assert_frame_equal(_sorted(listed_before.collect()), want)
    assert lake.compact(s3_lake, "cpu", hosts=["a"], now=LATER + timedelta(minutes=6)).recovered == 1
    with pytest.raises((FileNotFoundError, pl.exceptions.ComputeError)):
        listed_before.collect()  # its inputs are gone now
    assert_frame_equal(_sorted(lake.read(s3_lake, "cpu")), want)


def test_a_sink_keeps_its_rows_while_the_server_is_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local sink's failure contract on S3: a failed PUT keeps the rows, a later flush
    writes them, close() raises if they are still unwritten."""
    from tests.servers import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = S3Server(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                fs = pafs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                                       endpoint_override=server.endpoint, allow_bucket_creation=True)
                fs.create_dir("down-test")
                return proc
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise
                time.sleep(0.2)

    for k, v in S3Server(f"http://127.0.0.1:{port}").env().items():
        monkeypatch.setenv(k, v)
    proc = start()
    try:
        url = "s3://down-test/lake"
        sink = lake.LakeSink(url, max_buffer_rows=1000)
        proc.kill()
        proc.wait()
        sink.write("cpu", cpu_rows(1))
        sink.flush()  # fails: logged, rows kept
        assert sink._rows["cpu"] == 10
        proc = start()  # a new (empty) server on the same port: the bucket is back
        sink.flush()
        sink.close()
        assert lake.read(url, "cpu").height == 10
    finally:
        proc.kill()
        proc.wait()


def test_unveil_simulate_writes_a_fleet_into_an_s3_lake(s3_lake: str, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    assert main(["simulate", "--lake", s3_lake, "--hosts", "2", "--duration", "2m", "--seed", "3"]) == 0
    capsys.readouterr()
    assert lake.hosts(s3_lake, "cpu") == ["sim-00", "sim-01"]
    assert main(["query", "--lake", s3_lake, "--format", "csv", "SELECT count(*) AS n FROM gpu"]) == 0
    n = int(capsys.readouterr().out.splitlines()[1])
    assert n == 2 * 8 * 1200  # 2 hosts x 8 GPUs x 2 min of 100 ms samples


LIVE_MINUTES = ("2026-01-05T09:00:00Z", "2026-01-05T09:01:00Z")  # two cycles of the live scheduler


def _simulated(tmp_path: Path, *roots: str) -> None:
    from jobs.cli import main

    scenario = tmp_path / "three.toml"
    scenario.write_text(SCENARIO)  # (three hosts, one thermal throttle)
    for root in roots:
        assert main(["simulate", "--lake", root, "--scenario", str(scenario), "--engine", "serial"]) == 0


def _swept(root: str) -> dict[str, pl.DataFrame]:
    out = {}
    for t in ("features", "scores", "findings"):
        df = lake.read(root, t)
        out[t] = df.select(sorted(df.columns)).sort(sorted(df.columns))
    return out


def _keys(s3_lake: str) -> list[str]:
    st = objstore.store(s3_lake)
    infos = st.fs.get_file_info(pafs.FileSelector(st.root.as_posix(), recursive=True))
    return [i.path for i in infos if i.type == pafs.FileType.File]


def test_unveil_schedule_sweeps_an_s3_lake_as_it_sweeps_a_directory(
        s3_lake: str, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """Telemetry and the sweep's outputs on S3 (its features history read back from there),
    its state in a directory: two live cycles write what they write to a local lake. The
    endpoint is in the config file only, and the per-host work runs on 2 spawned workers,
    which get it from the command."""
    from jobs import watermarks as wm
    from jobs.cli import main

    local = str(tmp_path / "lake")
    _simulated(tmp_path, local, s3_lake)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    state = tmp_path / "state"
    config = tmp_path / "unveil.toml"
    config.write_text(f'[lake]\nendpoint = "{s3_server.endpoint}"\nstate = "{state}"\n')
    try:
        for until in LIVE_MINUTES:
            assert main(["schedule", "--once", "--lake", local, "--until", until, "--no-progress",
                         "--engine", "serial"]) == 0
            assert main(["--config", str(config), "schedule", "--once", "--lake", s3_lake, "--until", until,
                         "--no-progress", "--engine", "processes:2", "--maintain"]) == 0
        keys, want, got = _keys(s3_lake), _swept(local), _swept(s3_lake)
        # the report reads the bucket (its remediations from the table: no state directory here)
        assert main(["--config", str(config), "report", "--lake", s3_lake, "--out", str(tmp_path / "r.html")]) == 0
    finally:
        objstore.configure()
    out = capsys.readouterr().out
    assert out.count("cycle to 2026-01-05T09:01:00+00:00: 1 chunk(s), 180 windows") == 2, out
    assert "Unveil report: 3 host(s)" in out, out
    # maintenance compacts the sweep's own tables there (the tables above read after it)
    merges = [int(m) for m in re.findall(r"compaction: (\d+) merge\(s\)", out)]
    assert len(merges) == 2 and sum(merges) > 0, out
    assert want["findings"].height > 0 and want["features"]["host"].n_unique() == 3
    for t, df in want.items():
        assert got[t].equals(df), f"table {t} differs"
    # the state is in the directory; the bucket has only the name of the directory that sweeps it
    assert wm.load(s3_lake) == wm.load(local) and len(wm.load(local)) == 3
    assert (state / "_state" / "watermarks.json").is_file() and wm.pending(s3_lake) == []
    assert [k.split("/lake/", 1)[1] for k in keys if {"_state", "_remediation", "_spool"} & set(k.split("/"))] \
        == ["_state/owner.json"], keys
    assert any("/features/host=a-01/" in k for k in keys)


@pytest.mark.slow
@pytest.mark.server
def test_a_sweep_killed_while_publishing_to_s3_is_published_once_by_the_next_cycle(
        s3_lake: str, tmp_path: Path, influxd_server: InfluxdServer) -> None:
    """kill -9 after the first upload of a sealed sweep: the next cycle puts the staged
    files again (the same keys: objects are replaced, not added) and moves the watermarks;
    every window is in the bucket once, as a local lake swept without a crash has it. The
    write-back to InfluxDB reads the published findings from the staged copies."""
    from ingest.influx import InfluxConfig, InfluxSource
    from jobs import watermarks as wm
    from jobs.cli import main

    local = str(tmp_path / "lake")
    _simulated(tmp_path, local, s3_lake)
    until = LIVE_MINUTES[0]
    assert main(["schedule", "--once", "--lake", local, "--until", until, "--no-progress", "--engine", "serial"]) == 0
    state = tmp_path / "state"
    args = [sys.executable, "-m", "jobs.cli", "schedule", "--once", "--lake", s3_lake, "--state", str(state),
            "--until", until, "--no-progress", "--engine", "serial", "--influx-url", influxd_server.url,
            "--influx-database", "s3_sweep"]
    crashed = subprocess.run(args, capture_output=True, text=True, timeout=300,
                             env={**os.environ, wm.CRASH_ENV: "mid_publish"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    lake.set_state_root(s3_lake, state)
    staged = wm.pending(s3_lake)
    assert len(staged) == 1 and wm.load(s3_lake) == {}
    assert len([k for k in _keys(s3_lake) if "/features/" in k]) == 1  # the first file, before the kill
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"recovered interrupted sweep(s): {staged[0]}" in rerun.stdout
    want, got = _swept(local), _swept(s3_lake)
    for t, df in want.items():
        assert got[t].equals(df), f"table {t} differs"
    assert wm.load(s3_lake) == wm.load(local) and wm.pending(s3_lake) == []
    src = InfluxSource(InfluxConfig(url=influxd_server.url, database="s3_sweep"))
    try:
        back = src.read("unveil_findings", start=datetime(2026, 1, 5, tzinfo=UTC), end=datetime(2026, 1, 6, tzinfo=UTC))
    finally:
        src.close()
    assert back.height == want["findings"].height > 0


@pytest.mark.host
@pytest.mark.slow
def test_unveil_agent_samples_this_host_into_an_s3_lake_and_replays_its_journal_after_kill_9(
        s3_lake: str, tmp_path: Path) -> None:
    """The agent on an s3:// lake: its journal in the state directory, its commits PUT to
    the bucket. Killed (-9) before its first commit, it loses nothing it journaled: the
    next start replays those rows into the bucket, once."""
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "jobs.cli", "agent", "--lake", s3_lake, "--state", str(state), "--host", "s3h",
           "--collectors", "cpu", "--flush-interval", "0.5", "--commit-interval", "600"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # start-up (imports) can take seconds on a loaded machine
        if "sampling" in line:
            break
    time.sleep(3.0)
    proc.kill()
    proc.wait(timeout=30)
    killed_at = datetime.now(UTC)
    assert any((state / "_journal" / "s3h").iterdir())
    assert "cpu" not in lake.tables(s3_lake)  # journaled, never committed
    again = subprocess.run([*cmd, "--duration", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    cpu = lake.read(s3_lake, "cpu", hosts=["s3h"])
    before = cpu.filter(pl.col("time") < killed_at)
    assert before.height >= 20 * (os.cpu_count() or 1)  # >= 2 s of 100 ms samples per CPU
    assert cpu.select("time", "cpu").is_unique().all()
    assert not any(k for k in _keys(s3_lake) if "/_journal/" in k)


def test_a_sweep_of_an_s3_lake_whose_server_does_not_answer_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main
    from tests.servers import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # (nothing listens there)
    for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x",
                 "AWS_SECRET_ACCESS_KEY": "x"}.items():
        monkeypatch.setenv(k, v)
    assert main(["schedule", "--once", "--lake", "s3://lake-down/lake", "--state", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert f"unveil schedule: error: lake s3://lake-down/lake: cannot reach {endpoint}" in err, err


def test_a_second_state_directory_does_not_sweep_an_s3_lake_twice(
        s3_lake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A standby on another machine, or a state directory made anew, would sweep every
    window again: the bucket names the directory that sweeps it, and another one stops
    before it writes anything."""
    from jobs.cli import main

    _simulated(tmp_path, s3_lake)
    args = ["schedule", "--once", "--lake", s3_lake, "--until", LIVE_MINUTES[0], "--no-progress", "--engine", "serial"]
    assert main([*args, "--state", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    before = _swept(s3_lake)
    assert main([*args, "--state", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"is swept from another state directory ({tmp_path / 'a'} on host" in err, err
    assert f"delete {s3_lake}/_state/owner.json" in err
    after = _swept(s3_lake)
    for t, df in before.items():
        assert after[t].equals(df), f"table {t} changed"
    assert main([*args, "--state", str(tmp_path / "a")]) == 0  # the owner goes on


def test_a_postmortem_of_an_s3_lake_is_the_one_of_a_local_lake(s3_lake: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The telemetry read from the bucket, the post-mortem's own lake and report under the
    state directory: the same features, scores and findings as from a local lake."""
    from jobs.cli import main

    local = str(tmp_path / "lake")
    _simulated(tmp_path, local, s3_lake)
    args = ["postmortem", "--host", "a-01", "--from", "2026-01-05T08:59:00Z", "--to", "2026-01-05T09:01:00Z",
            "--id", "pm-throttle", "--no-progress"]
    state = tmp_path / "state"
    assert main([*args, "--lake", local]) == 0
    assert main([*args, "--lake", s3_lake, "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert f"results: {state / '_postmortem' / 'pm-throttle'}" in out, out
    assert (state / "_postmortem" / "pm-throttle" / "report.html").is_file()
    want, got = _swept(str(Path(local) / "_postmortem" / "pm-throttle")), _swept(str(state / "_postmortem" / "pm-throttle"))
    assert want["findings"].height > 0
    for t, df in want.items():
        assert got[t].equals(df), f"table {t} differs"


def test_a_one_shot_sweep_of_an_s3_lake_keeps_to_the_schedulers_watermarks(
        s3_lake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``unveil sweep`` reads and writes the bucket and, as on a lake directory, refuses the
    windows the scheduler already swept; with another state directory than the
    scheduler's it cannot see those watermarks, so it is refused too."""
    from jobs.cli import main

    _simulated(tmp_path, s3_lake)
    state = tmp_path / "state"
    assert main(["schedule", "--once", "--lake", s3_lake, "--state", str(state), "--until", LIVE_MINUTES[0],
                 "--no-progress", "--engine", "serial"]) == 0
    capsys.readouterr()
    before = lake.read(s3_lake, "scores").height
    again = ["sweep", "--lake", s3_lake, "--since", "2026-01-05T08:59:00Z", "--until", LIVE_MINUTES[1],
             "--engine", "serial"]
    assert main([*again, "--state", str(state)]) == 2
    assert "is managed by the scheduler" in capsys.readouterr().err
    assert main([*again, "--state", str(tmp_path / "other")]) == 2
    assert "is swept from another state directory" in capsys.readouterr().err
    assert main([*again, "--state", str(state), "--dry-run"]) == 0
    assert lake.read(s3_lake, "scores").height == before
    assert main(["sweep", "--lake", s3_lake, "--state", str(state), "--since", LIVE_MINUTES[0], "--until",
                 LIVE_MINUTES[1], "--engine", "serial"]) == 0
    assert "written: features" in capsys.readouterr().out
    assert lake.read(s3_lake, "scores").height > before
