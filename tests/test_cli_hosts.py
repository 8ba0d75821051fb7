"""A --hosts name with no data, and a sweep of an interval without telemetry, say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.lake import scan
from jobs.cli import main


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hosts") / "lake"
    argv = ["simulate", "--lake", str(root), "--hosts", "1", "--duration", "2m", "--seed", "1",
            "--start", "2026-01-05T08:00:00Z"]
    assert main(argv) == 0
    return root


def test_unknown_host_is_an_error_naming_the_lakes_hosts(
    lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    interval = ["--since", "2026-01-05T08:00:00Z", "--until", "2026-01-05T08:02:00Z"]
    assert main(["sweep", "--lake", str(lake), "--dry-run", "--hosts", "nosuch", *interval]) == 2
    err = capsys.readouterr().err
    assert "host(s) nosuch" in err and "it has: sim-00" in err
    # one known and one unknown: still an error, the typo is not silently dropped
    out = tmp_path / "r.html"
    assert main(["report", "--lake", str(lake), "--out", str(out), "--hosts", "sim-00", "sim-0"]) == 2
    assert "host(s) sim-0 " in capsys.readouterr().err and not out.exists()
    assert main(["sweep", "--lake", str(lake), "--dry-run", "--hosts", "sim-00", *interval]) == 0
    assert "1 hosts" in capsys.readouterr().out


def test_scheduler_warns_about_a_host_without_data(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a scheduler may start before an agent: a warning, and the cycle runs
    assert main(["schedule", "--lake", str(lake), "--once", "--hosts", "later",
                 "--until", "2026-01-05T08:02:00Z"]) == 0
    assert "warning: no data" in capsys.readouterr().err


def test_sweep_of_an_empty_interval_says_where_the_data_is(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "--lake", str(lake), "--dry-run", "--since", "2026-02-01T00:00:00Z",
            "--until", "2026-02-01T01:00:00Z"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0 windows" in out and "has data on 2026-01-05" in out


def test_report_of_a_swept_lake_does_not_call_labels_missed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `unveil sweep` writes findings, never incidents: the labels are not judged, not "missed"
    lake = tmp_path / "lake"
    assert main(["simulate", "--lake", str(lake), "--scenario", "gpu_power_throttle",
                 "--duration", "20m"]) == 0
    swept = ["sweep", "--lake", str(lake), "--since", "2026-01-05T08:00:00Z", "--until", "2026-01-05T08:20:00Z"]
    assert main(swept) == 0
    capsys.readouterr()
    findings = scan(lake, "findings").collect().height
    # the same interval again (or any overlap) would store every row twice: refused
    assert main([*swept[:-1], "2026-01-05T08:30:00Z"]) == 2
    assert "already has scores in this interval" in capsys.readouterr().err
    assert scan(lake, "findings").collect().height == findings
    out = tmp_path / "r.html"
    assert main(["report", "--lake", str(lake), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not judged: no incidents in the lake" in text and "missed" not in text
    assert "not judged" in out.read_text() and ">missed<" not in out.read_text()


def test_sweep_of_a_file_says_it_is_not_a_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a.csv"
    f.write_text("time,x\n")
    assert main(["sweep", "--lake", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"lake root {f} does not exist or is not a directory" in err and "watermark" not in err


def test_what_the_scheduler_creates_keeps_the_lakes_modes(tmp_path: Path) -> None:
    # operations.md: whatever the umask, directories 0750 and files 0640 (here: its state,
    # its lock, its features cache and the partitions it publishes)
    import os
    import stat

    lake = tmp_path / "lake"
    old = os.umask(0o022)
    try:
        assert main(["simulate", "--lake", str(lake), "--duration", "2m", "--engine", "serial"]) == 0
        assert main(["schedule", "--lake", str(lake), "--once", "--engine", "serial", "--no-progress"]) == 0
    finally:
        os.umask(old)
    modes = {}
    for dirpath, dirnames, filenames in os.walk(lake):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            modes[str(p.relative_to(lake))] = (p.is_dir(), stat.S_IMODE(p.lstat().st_mode))
    assert any(k.startswith("scores/") for k in modes) and "_state/scheduler.lock" in modes
    assert any(k.endswith(".arrow") for k in modes)  # the features cache
    wrong = {k: oct(m) for k, (d, m) in modes.items() if m != (0o750 if d else 0o640)}
    assert not wrong
