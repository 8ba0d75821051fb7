"""``unveil agent``: its flags are checked before anything is made on disk, it refuses to
sample nothing, and its summary is this run's."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from ingest.agent import Agent, AgentConfig, NothingToCollect
from ingest.lake import LakeSink


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from jobs.cli import main

    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def _files(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


# ------------------------------------------------------------------- --host


@pytest.mark.parametrize("host", ["../../escape", "a/b", "..", ".hidden", "_x"])
def test_an_invalid_host_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    top = tmp_path / "top"
    (top / "x").mkdir(parents=True)
    rc, _, err = _cli(capsys, "agent", "--lake", str(top / "x" / "lake_h"), "--duration", "0.5", "--host", host)
    # no lake, no journal lock inside it, none outside it (../../escape made top/x/escape/lock)
    assert _files(top) == ["x"]
    assert rc == 2
    assert err.strip().splitlines() == [
        f"unveil agent: error: --host: invalid host name {host!r}: use letters, digits, '_', '.', '-' (not first)"
    ]


def test_an_empty_host_is_an_error_not_the_hostname(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(capsys, "agent", "--lake", str(tmp_path / "lake"), "--duration", "0.5", "--host", "")
    assert rc == 2
    assert err.strip().splitlines() == [
        "unveil agent: error: --host is empty: give a host name, or leave --host out for this machine's hostname"
    ]
    assert _files(tmp_path) == []


def test_an_invalid_host_in_the_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[agent]\nhost = '../up'\n")
    rc, _, err = _cli(capsys, "--config", str(p), "agent", "--lake", str(tmp_path / "lake"), "--duration", "0.5")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"unveil agent: error: {p}: [agent] host: invalid host name '../up'")
    assert _files(tmp_path) == ["c.toml"]


def test_the_agent_checks_its_host_before_making_its_journal(tmp_path: Path) -> None:
    sink = LakeSink(tmp_path / "lake")
    with pytest.raises(ValueError, match=r"agent\.host: invalid host name '\.\./\.\./escape'"):
        Agent(AgentConfig(host="../../escape", duration_s=0.1), [sink])
    sink.close()
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "lake" / "_journal").exists()


# ------------------------------------------------------------ --root, --collectors


def test_a_root_that_does_not_exist_is_an_error_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "nonexistent"
    rc, _, err = _cli(capsys, "agent", "--lake", str(tmp_path / "lake"), "--duration", "0.5", "--root", str(root))
    assert rc == 2
    assert err.strip().splitlines() == [f"unveil agent: error: --root {root}: no such directory"]
    assert _files(tmp_path) == []


def test_a_root_without_proc_is_an_error_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    (root / "sys").mkdir(parents=True)
    rc, _, err = _cli(capsys, "agent", "--lake", str(tmp_path / "lake"), "--duration", "0.5", "--root", str(root))
    assert rc == 2
    assert err.strip().splitlines() == [
        f"unveil agent: error: --root {root}: has no proc directory: not a filesystem root to read /proc and /sys under"
    ]
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("value", ["", ",", "cpu,", " "])
def test_an_empty_collector_list_is_an_error_not_all_collectors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    rc, _, err = _cli(capsys, "agent", "--lake", str(tmp_path / "lake"), "--duration", "0.5", "--collectors", value)
    assert rc == 2
    assert err.strip().splitlines() == [
        f"unveil agent: error: --collectors {value!r}: an empty collector name; give a comma-separated list of "
        "collectors, or leave --collectors out for all of them"
    ]
    assert _files(tmp_path) == []


def test_when_no_selected_collector_is_available_the_agent_says_so_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a root with an empty proc: cpu and memory are unavailable (as gpu and perf are on a VM)
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    lake_dir = tmp_path / "lake"
    rc, out, err = _cli(capsys, "agent", "--lake", str(lake_dir), "--duration", "5", "--root", str(root),
                        "--collectors", "cpu,memory")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("unveil agent: error: no collector is available on this host, nothing to sample: "
                               f"cpu: {root}/proc/stat does not exist; memory: ")
    assert not (lake_dir / "_journal").exists()  # no journal, and no rows: nothing was sampled
    assert lake.tables(lake_dir) == []


def test_the_agent_refuses_to_start_with_no_collector_available(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    sink = LakeSink(tmp_path / "lake")
    cfg = AgentConfig(host="h", root=str(tmp_path), collectors=("cpu", "net"), duration_s=1.0)
    with pytest.raises(NothingToCollect, match="no collector is available") as got:
        Agent(cfg, [sink])
    sink.close()
    assert "cpu: " in str(got.value) and "net: " in str(got.value)
    assert not (tmp_path / "lake" / "_journal").exists()


def test_some_collector_available_is_enough(tmp_path: Path) -> None:
    cfg = AgentConfig(host="h", collectors=("cpu", "gpu", "perf"), duration_s=0.3, flush_interval_s=1.0)
    stats = Agent(cfg, [LakeSink(tmp_path / "lake")]).run()
    assert stats.table_rows.get("cpu", 0) > 0


# ------------------------------------------------------------------ summary


def _summary(out: str) -> dict[str, int]:
    """The per-table counts of the end-of-run summary."""
    rows = {}
    for line in out.splitlines():
        m = re.fullmatch(r"  (\w+)\s+(\d+) rows", line)
        if m:
            rows[m[1]] = int(m[2])
    return rows


def _lake_rows(root: Path) -> dict[str, int]:
    return {t: lake.scan(root, t, hosts=["sum"]).select(pl.len()).collect().item() for t in lake.tables(root)}


@pytest.mark.host
def test_the_summary_counts_this_runs_rows_and_the_influx_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "lake"
    common = ["agent", "--lake", str(root), "--host", "sum", "--duration", "1.5", "--flush-interval", "0.5"]
    rc, out, err = _cli(capsys, *common, "--collectors", "cpu")
    assert rc == 0, err
    first = _lake_rows(root)
    assert _summary(out) == first and first["cpu"] > 0

    # the second run samples memory only (and says how many points InfluxDB got: none, it is down)
    rc, out, err = _cli(capsys, *common, "--collectors", "memory", "--influx-url", "http://127.0.0.1:9")
    assert rc == 0, err
    after = _lake_rows(root)
    this_run = {t: n - first.get(t, 0) for t, n in after.items() if n - first.get(t, 0)}
    got = _summary(out)
    assert got == this_run and "cpu" not in got and "system" not in got and got["memory"] > 0
    m = re.search(r"^influx http://127\.0\.0\.1:9: (\d+) points sent, (\d+) spooled", out, re.M)
    assert m, out
    assert int(m[1]) == 0 and int(m[2]) >= got["memory"]
    head = re.search(r"(\d+) rows in (\d+) flushes", out)
    assert head and int(head[1]) == sum(got.values())


# ------------------------------------------------------------------- periods


def test_period_flags_take_seconds_or_durations_as_every_command_does(tmp_path: Path) -> None:
    from jobs.cli import build_parser
    from jobs.commands.agent import build

    argv = ["agent", "--lake", str(tmp_path / "lake"), "--duration", "1m30s", "--interval", "500ms",
            "--flush-interval", "2", "--commit-interval", "1m"]
    cfg, sinks, _ = build(build_parser(argv).parse_args(argv))
    for s in sinks:
        s.close()
    assert (cfg.duration_s, cfg.interval_s, cfg.flush_interval_s, cfg.commit_interval_s) == (90.0, 0.5, 2.0, 60.0)


@pytest.mark.parametrize(("value", "why"), [
    ("5x", "bad duration '5x': expected a number of seconds (150) or a number and a unit"),
    ("-5m", "bad duration '-5m': must be positive"),
])
def test_a_bad_period_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, why: str) -> None:
    rc, _, err = _cli(capsys, "agent", "--lake", str(tmp_path / "lake"), "--duration", value)
    assert rc == 2
    assert f"argument --duration: {why}" in err
    assert _files(tmp_path) == []
