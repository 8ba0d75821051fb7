"""The agent's write-ahead journal: torn tails, exactly-once replay, failed commits, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from ingest import journal, lake
from ingest.agent import Agent, AgentConfig
from ingest.collectors.base import Reading
from ingest.lake import LakeSink
from ingest.sink import SinkError

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000_000_000  # µs, 2026-05-28


def _system_rows(start: int, n: int) -> dict[str, list[object]]:
    return {
        "time": [T0 + (start + i) * 100_000 for i in range(n)],
        "ctxt": [start + i for i in range(n)],
        "forks": [1] * n,
    }


def test_records_round_trip_and_a_torn_tail_keeps_the_records_before_it(tmp_path: Path) -> None:
    j = journal.Journal(tmp_path / "j")
    j.append({"system": _system_rows(0, 3)})
    j.append({"system": _system_rows(3, 2), "memory": {"time": [T0], "mem_total": [2**30]}})
    path = j.path
    j.close()
    got = journal.read(path)
    assert got["system"]["ctxt"] == [0, 1, 2, 3, 4]
    assert got["memory"]["mem_total"] == [2**30]
    # a record cut in the middle of its payload (the writer was killed): ignored, not fatal
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    got = journal.read(path)
    assert got["system"]["ctxt"] == [0, 1, 2]
    assert "memory" not in got
    path.write_bytes(b"garbage")
    with pytest.raises(journal.JournalError, match="not an unveil journal"):
        journal.read(path)


def test_a_host_journal_has_one_writer(tmp_path: Path) -> None:
    j = journal.Journal(tmp_path / "j")
    with pytest.raises(SinkError, match="another agent"):
        journal.Journal(tmp_path / "j")
    j.close()
    journal.Journal(tmp_path / "j").close()  # released on close


def _left_journal(root: Path, host: str, n: int) -> str:
    """A sealed journal as a dead agent leaves it: n system rows, never committed."""
    j = journal.Journal(journal.host_dir(root, host))
    j.append({"system": _system_rows(0, n)})
    token = j.rotate()
    j.close()
    return token


class _Quiet:
    name = "quiet"
    measurements = ("system",)
    tier = "fast"

    def collect(self) -> list[Reading]:
        return []

    def close(self) -> None:
        pass


def _system(root: Path) -> pl.DataFrame:
    return lake.scan(root, "system").collect().sort("time")


def test_replay_of_an_interrupted_commit_writes_only_what_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    sink = LakeSink(root)
    token = _left_journal(root, "h", 50)
    # the dead agent had committed the rows already but died before dropping its journal
    rows = journal.read(journal.host_dir(root, "h") / f"{token}.wal")["system"]
    df = pl.DataFrame({"time": rows["time"], "host": ["h"] * 50, "ctxt": rows["ctxt"]}).with_columns(
        pl.from_epoch("time", time_unit="us").dt.replace_time_zone("UTC")
    )
    assert sink.commit("system", df, journal.token_hex(token)) == 50
    Agent(AgentConfig(host="h", duration_s=0.05, interval_s=0.05, flush_interval_s=0.05), [sink], [_Quiet()]).run()
    got = _system(root)
    assert got.height == 50
    assert got["ctxt"].to_list() == list(range(50))
    assert not list(journal.host_dir(root, "h").glob("*.wal"))


def test_a_failed_commit_stays_in_the_journal_until_it_succeeds(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    (root / "system").write_text("a file where the table's directory should be")
    token = _left_journal(root, "h", 20)
    sink = LakeSink(root)
    cfg = AgentConfig(host="h", duration_s=0.05, interval_s=0.05, flush_interval_s=0.05)
    Agent(cfg, [sink], [_Quiet()]).run()
    assert (journal.host_dir(root, "h") / f"{token}.wal").exists()  # nothing lost
    (root / "system").unlink()
    Agent(cfg, [LakeSink(root)], [_Quiet()]).run()
    assert _system(root)["ctxt"].to_list() == list(range(20))
    assert not (journal.host_dir(root, "h") / f"{token}.wal").exists()


class _Counting(_Quiet):
    def __init__(self) -> None:
        self.i = 0

    def collect(self) -> list[Reading]:
        self.i += 1
        return [Reading("system", {}, {"ctxt": [self.i], "forks": [1]})]


def test_sync_from_another_thread_commits_what_is_buffered(tmp_path: Path) -> None:
    import threading

    root = tmp_path / "lake"
    cfg = AgentConfig(host="s", interval_s=0.02, flush_interval_s=60, commit_interval_s=3600)
    agent = Agent(cfg, [LakeSink(root)], [_Counting()])
    t = threading.Thread(target=agent.run)
    t.start()
    time.sleep(0.5)
    assert "system" not in lake.tables(root)
    assert agent.sync(timeout=10)
    n = _system(root).height
    assert n >= 10
    time.sleep(0.3)  # more ticks: only the exit commit will hold them
    agent.stop()
    t.join(10)
    assert _system(root).height > n  # the exit commit added the rest, nothing twice
    assert _system(root)["time"].is_unique().all()


@pytest.mark.host
def test_kill_9_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "agent", "--lake", str(root), "--host", "k9",
         "--collectors", "cpu", "--flush-interval", "0.5", "--commit-interval", "3600"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "sampling" in line:
            break
    time.sleep(3.0)
    killed_at = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert "cpu" not in lake.tables(root)  # nothing committed yet: all of it is in the journal
    Agent(AgentConfig(host="k9", duration_s=0.1), [LakeSink(root)], [_Quiet()]).run()
    cpu = lake.scan(root, "cpu").collect()
    ncpu = os.cpu_count() or 1
    assert cpu.height >= 20 * ncpu  # ~3 s at 100 ms, minus at most the last 0.5 s flush
    assert cpu.select("time", "cpu").is_duplicated().sum() == 0
    newest = cpu["time"].max()
    assert newest is not None and killed_at - newest.timestamp() < 1.5  # type: ignore[union-attr]


def test_streaming_sinks_get_every_flush_and_the_lake_the_same_rows_at_commit(tmp_path: Path) -> None:
    class Frames:
        name = "frames"

        def __init__(self) -> None:
            self.frames: list[pl.DataFrame] = []
            self.lake_rows_at_write: list[int] = []

        def write(self, table: str, df: pl.DataFrame) -> None:
            if table != "system":
                return
            self.frames.append(df)
            have = "system" in lake.tables(root)
            self.lake_rows_at_write.append(_system(root).height if have else 0)

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    root = tmp_path / "lake"
    stream = Frames()
    cfg = AgentConfig(host="m", interval_s=0.02, flush_interval_s=0.1, commit_interval_s=3600, duration_s=0.6)
    Agent(cfg, [LakeSink(root), stream], [_Counting()]).run()
    assert len(stream.frames) >= 4  # one frame per flush, while the lake had nothing yet
    assert stream.lake_rows_at_write[:-1] == [0] * (len(stream.frames) - 1)
    sent = pl.concat(stream.frames).sort("time")
    got = _system(root)
    assert got["ctxt"].to_list() == sent["ctxt"].to_list()
    assert got["time"].to_list() == sent["time"].to_list()


def test_a_commit_across_an_hour_boundary_splits_into_both_partitions(tmp_path: Path) -> None:
    from ingest import schema
    from ingest.agent import _Buffer

    root = tmp_path / "lake"
    sink = LakeSink(root)
    hour = 3_600_000_000
    start = (T0 // hour + 1) * hour - 300_000  # 0.3 s before an hour starts
    buf = _Buffer(schema.SYSTEM)
    buf.extend([start + i * 100_000 for i in range(6)], 6, {}, {"ctxt": list(range(6))})
    assert buf.commit_to(sink, "system", "h", "0badcafe") == 6
    buf.extend([start + 400_000], 1, {}, {"ctxt": [4]})
    assert buf.commit_to(sink, "system", "h", "0badcafe") == 0  # a replay: that hour has this token
    buf.extend([start + hour + 400_000 + i * 100_000 for i in range(3)], 3, {}, {"ctxt": [7, 8, 9]})
    assert buf.commit_to(sink, "system", "h", "1badcafe") == 3  # one hour only: written directly
    got = _system(root)
    assert got["ctxt"].to_list() == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    hours = sorted(p.parent.name for p in (root / "system").rglob("*.parquet"))
    assert hours[0] != hours[-1] and len(set(hours)) == 3
    assert buf.n == 0 and buf.columns["time"] == []
