"""The agent under storage faults, on a real small tmpfs: full disk at a commit and at a
journal write, partial writes, torn and garbage journals, file modes and journal ownership."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ingest import journal, lake
from ingest.agent import Agent, AgentConfig
from ingest.collectors.base import Reading
from ingest.lake import LakeSink
from tests.fs import fill, needs_root

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000_000_000  # µs, 2026-05-28

class _Counting:
    """One system row per tick, procs_running = 1, 2, 3 ...: every row is identifiable."""

    name = "counting"
    measurements = ("system",)
    tier = "fast"

    def __init__(self) -> None:
        self.i = 0

    def collect(self) -> list[Reading]:
        self.i += 1
        return [Reading("system", {}, {"procs_running": [float(self.i)]})]

    def close(self) -> None:
        pass


def _seq(root: Path) -> list[int]:
    col = lake.scan(root, "system").select("procs_running").collect()["procs_running"]
    return [int(v) for v in col.sort().to_list()]


def _errors(caplog: pytest.LogCaptureFixture, level: int = logging.ERROR) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


# ------------------------------------------------------------------ item 1: full disk at commit


@needs_root
def test_full_disk_at_commits_keeps_the_agent_sampling_and_loses_nothing(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmpfs / "lake"
    col = _Counting()
    cfg = AgentConfig(host="f", interval_s=0.02, flush_interval_s=0.1, commit_interval_s=0.3)
    agent = Agent(cfg, [LakeSink(root)], [col])
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            agent.run()
        except BaseException as exc:  # the bug: the agent died
            crashed.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        time.sleep(0.6)
        filler = fill(tmpfs)
        ticks_full = col.i
        time.sleep(1.5)  # several flushes and commits against a full disk
        assert t.is_alive() and not crashed, crashed
        assert col.i - ticks_full >= 40  # still sampling
        filler.unlink()
        time.sleep(1.2)  # space is back: the next commits write what was kept
    finally:
        agent.stop()
        t.join(30)
    assert not crashed, crashed
    got = _seq(root)
    assert got == list(range(1, col.i + 1))  # every row, once
    assert not list(journal.host_dir(root, "f").glob("*.wal"))  # journal consistent: all committed
    errors = _errors(caplog)
    assert errors and any(str(tmpfs) in e and "No space left" in e for e in errors)
    # one error per failing commit or journal episode, not one per table per tick
    assert len(errors) <= 12, errors


def test_a_table_that_cannot_be_committed_does_not_hold_up_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    (root / "system").write_text("a file where the table's directory should be")
    col = _Counting()
    cfg = AgentConfig(host="t", interval_s=0.02, flush_interval_s=0.04, commit_interval_s=0.08)
    agent = Agent(cfg, [LakeSink(root)], [col])
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        time.sleep(0.8)
        # the agent's own rows are committed meanwhile, at every commit (two flushes)
        assert "agent" in lake.tables(root)
        assert lake.scan(root, "agent").collect().height >= agent.stats.flushes - 6
        assert any("rows of system" in e and str(root / "system") in e for e in _errors(caplog))
        (root / "system").unlink()
        time.sleep(0.4)
    finally:
        agent.stop()
        t.join(30)
    assert _seq(root) == list(range(1, col.i + 1))
    assert agent.stats.flushes == lake.scan(root, "agent").collect().height


@needs_root
def test_rows_beyond_the_memory_bound_are_dropped_oldest_first_and_counted(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmpfs / "lake"
    col = _Counting()
    cfg = AgentConfig(host="b", interval_s=0.02, flush_interval_s=0.04, commit_interval_s=0.12,
                      max_buffered_rows=40)
    agent = Agent(cfg, [LakeSink(root)], [col])
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        time.sleep(0.4)
        filler = fill(tmpfs)
        time.sleep(2.0)  # ~100 rows (+ the agent's own) against a bound of 40
        assert t.is_alive()
        filler.unlink()
        time.sleep(0.8)
    finally:
        agent.stop()
        t.join(30)
    lost = agent.stats.rows_lost
    assert lost > 0
    assert any("max_buffered_rows=40" in e and "lost" in e for e in _errors(caplog))
    got = _seq(root)
    assert len(got) == len(set(got))  # nothing twice
    # what is missing is exactly what was counted: system rows and the agent's own rows
    # (one per flush); dropped rows that had reached the journal were replayed, not lost
    agent_rows = lake.scan(root, "agent").select("time").collect().height
    missing = set(range(1, col.i + 1)) - set(got)
    assert len(missing) + (agent.stats.flushes - agent_rows) == lost
    assert missing and max(missing) < max(got) and got[-1] == col.i  # oldest dropped, newest kept


@needs_root
def test_a_journal_that_cannot_be_created_leaves_no_empty_file(tmpfs: Path) -> None:
    d = tmpfs / "j"
    j = journal.Journal(d)
    j.append({"system": {"time": [T0], "ctxt": [1]}})
    filler = fill(tmpfs)
    try:
        j.rotate()
        with pytest.raises(OSError, match=str(d)):
            # the new file's first record cannot be written: no empty .wal stays behind
            j.append({"system": {"time": [T0 + 1] * 5000, "ctxt": list(range(5000))}})
        assert all(p.stat().st_size > 0 for p in d.glob("*.wal"))
    finally:
        filler.unlink()
        j.close()


# ----------------------------------------------------- item 2: partial writes, torn records


@needs_root
def test_a_partial_journal_write_is_cut_back_to_the_last_whole_record(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j = journal.Journal(tmpfs / "j")
    j.append({"system": {"time": [T0], "ctxt": [0]}})
    filler = fill(tmpfs)
    big = {"system": {"time": [T0 + i for i in range(1, 20_001)], "ctxt": list(range(1, 20_001))}}
    try:
        with pytest.raises(OSError, match="No space left"):
            j.append(big)  # some bytes fit in the file's last page: a partial write
        caplog.clear()
        assert journal.read(j.path)["system"]["ctxt"] == [0]
        assert not _errors(caplog, logging.WARNING)  # no torn record left in the file
    finally:
        filler.unlink()
    j.append(big)  # space is back: the same rows are journaled again
    path = j.path
    j.close()
    assert journal.read(path)["system"]["ctxt"] == list(range(20_001))


def _records(path: Path) -> list[tuple[int, int]]:
    """(offset, length) of each record of a journal file, from its header."""
    import struct

    data = path.read_bytes()
    off = len(journal.MAGIC)
    out = []
    while off < len(data):
        hdr = data[off : off + journal.HEADER_SIZE]
        length = struct.unpack_from("<I", hdr, journal.HEADER_SIZE - 12)[0]
        out.append((off, journal.HEADER_SIZE + length))
        off += journal.HEADER_SIZE + length
    return out


def test_replay_skips_a_torn_record_and_keeps_the_intact_records_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j = journal.Journal(tmp_path / "j")
    for k in range(3):
        j.append({"system": {"time": [T0 + 10 * k + i for i in range(10)], "ctxt": list(range(10 * k, 10 * k + 10))}})
    path = j.path
    j.close()
    (o1, n1), (o2, n2), _ = _records(path)
    data = bytearray(path.read_bytes())
    # the middle record loses its second half (a partial write followed by later appends)
    torn = data[:o2 + n2 // 2] + data[o2 + n2:]
    path.write_bytes(bytes(torn))
    got = journal.read(path)
    assert got["system"]["ctxt"] == list(range(10)) + list(range(20, 30))
    warnings = _errors(caplog, logging.WARNING)
    assert len(warnings) == 1 and str(path) in warnings[0] and f"byte {o2}" in warnings[0]
    # a flipped byte in a payload: the record's checksum catches it, the next one is kept
    data[o2 + n2 - 3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert journal.read(path)["system"]["ctxt"] == list(range(10)) + list(range(20, 30))


def test_rows_journaled_twice_are_replayed_once(tmp_path: Path) -> None:
    """A write that reported failure but reached the file, then written again: records say
    which rows they hold, so the reader keeps each row once."""
    j = journal.Journal(tmp_path / "j")
    rows = {"time": [T0 + i for i in range(30)], "ctxt": list(range(30))}
    j.append({"system": {k: v[:10] for k, v in rows.items()}}, start={"system": 0})
    j.append({"system": {k: v[:20] for k, v in rows.items()}}, start={"system": 0})
    j.append({"system": {k: v[20:] for k, v in rows.items()}}, start={"system": 20})
    path = j.path
    j.close()
    assert journal.read(path)["system"]["ctxt"] == list(range(30))


@needs_root
@pytest.mark.host
@pytest.mark.slow
def test_kill_9_after_a_transient_full_disk_loses_at_most_the_last_flush(tmpfs: Path) -> None:
    root = tmpfs / "lake"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "agent", "--lake", str(root), "--host", "k9",
         "--collectors", "cpu", "--flush-interval", "0.5", "--commit-interval", "3600"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "sampling" in line:
            break
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    try:
        time.sleep(1.5)
        filler = fill(tmpfs)
        full_from = time.time()
        time.sleep(3.0)  # flushes fail: the rows stay in memory
        filler.unlink()
        full_to = time.time()
        time.sleep(1.5)  # the next flushes journal them again
        assert proc.poll() is None, "".join(lines)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert any("No space left" in line for line in lines), "".join(lines)
    assert "cpu" not in lake.tables(root)  # nothing committed: all of it is in the journal
    Agent(AgentConfig(host="k9", duration_s=0.1), [LakeSink(root)], []).run()
    cpu = lake.scan(root, "cpu").collect()
    assert cpu.select("time", "cpu").is_duplicated().sum() == 0
    stamps = sorted({t.timestamp() for t in cpu["time"].to_list()})
    assert killed_at - stamps[-1] < 1.5  # lost: at most the last 0.5 s flush (+ start-up slack)
    # the rows sampled while the disk was full are there: no hole in the series
    inside = [s for s in stamps if full_from <= s <= full_to]
    assert len(inside) >= 0.8 * (full_to - full_from) / 0.1
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert max(gaps) < 0.5


# ------------------------------------------------------- leftovers: empty and garbage .wal files


def test_empty_and_garbage_journals_are_cleaned_up_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "lake"
    d = journal.host_dir(root, "g")
    d.mkdir(parents=True)
    (d / "20260101T000000000000Z-00000001.wal").write_bytes(b"")
    (d / "20260101T000000000001Z-00000002.wal").write_bytes(journal.MAGIC[:5])
    (d / "20260101T000000000002Z-00000003.wal").write_bytes(journal.MAGIC)
    garbage = d / "20260101T000000000003Z-00000004.wal"
    garbage.write_bytes(b"\x00" * 100)
    cfg = AgentConfig(host="g", interval_s=0.02, flush_interval_s=0.02, duration_s=0.02)
    caplog.set_level(logging.INFO)
    Agent(cfg, [LakeSink(root)], []).run()
    assert not _errors(caplog)
    warnings = _errors(caplog, logging.WARNING)
    assert len(warnings) == 1 and str(garbage) in warnings[0]
    assert not list(d.glob("*.wal"))  # all gone from replay's way (the garbage kept aside)
    assert list(d.glob("*.corrupt")) == [garbage.with_suffix(".wal.corrupt")]
    caplog.clear()
    Agent(cfg, [LakeSink(root)], []).run()
    assert not _errors(caplog, logging.WARNING)  # the second start is quiet


# ------------------------------------------------------- item 8: modes and journal ownership


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def test_lake_journal_and_queue_are_not_world_accessible_under_umask_000(tmp_path: Path) -> None:
    from remediation.queue import Queue, default_path

    root = tmp_path / "lake"
    old = os.umask(0)
    try:
        cfg = AgentConfig(host="u", interval_s=0.02, flush_interval_s=0.04, commit_interval_s=0.08,
                          duration_s=0.3)
        agent = Agent(cfg, [LakeSink(root)], [_Counting()])
        # a journal left with rows: sealed and kept on disk while the agent runs
        agent.run()
        lake.compact(root)
        j = journal.Journal(journal.host_dir(root, "v"))
        j.append({"system": {"time": [T0], "ctxt": [1]}})
        j.rotate()
        j.append({"system": {"time": [T0 + 1], "ctxt": [2]}})
        q = Queue(default_path(root))
        q.close()
        j.close()
    finally:
        os.umask(old)
    modes = _modes(root)
    assert any(k.endswith(".parquet") for k in modes)
    assert any(k.endswith(".wal") for k in modes)
    assert any(k.endswith("queue.db") for k in modes)
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
    wrong = {k: oct(m) for k, m in modes.items()
             if m != (0o750 if (root / k).is_dir() else 0o640)}
    assert not wrong


def test_a_journal_owned_by_another_user_is_refused_and_not_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "lake"
    j = journal.Journal(journal.host_dir(root, "o"))
    j.append({"system": {"time": [T0 + i for i in range(5)], "ctxt": list(range(5))}})
    token = j.rotate()
    j.close()
    path = j.file(token)
    other = os.geteuid() + 4242
    os.chown(path, other, -1)
    cfg = AgentConfig(host="o", interval_s=0.02, flush_interval_s=0.02, duration_s=0.02)
    Agent(cfg, [LakeSink(root)], []).run()
    assert "system" not in lake.tables(root)  # not replayed
    assert path.exists()  # left for the operator
    errors = _errors(caplog)
    assert any(str(path) in e and f"uid {other}" in e for e in errors), errors
    with pytest.raises(journal.JournalError, match=f"owned by uid {other}"):
        journal.read(path)


def test_a_journal_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.wal"
    j = journal.Journal(tmp_path / "j")
    j.append({"system": {"time": [T0], "ctxt": [1]}})
    os.replace(j.path, target)
    link = tmp_path / "j" / "20260101T000000000000Z-0000000a.wal"
    link.symlink_to(target)
    j.close()
    with pytest.raises(journal.JournalError, match="not a regular file"):
        journal.read(link)
