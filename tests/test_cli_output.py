"""What every command does with its output: a reader that goes away, an --out that cannot
be written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import main


def test_reader_that_goes_away_stops_quietly() -> None:
    # `unveil kb show X | head -1`: the pipe is closed before the command writes a byte.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "kb", "show", "gpu_power_throttle"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141  # as a command stopped by SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_out_that_is_a_directory_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    for argv in (
        ["report", "--lake", str(lake), "--out", str(tmp_path)],
        ["postmortem", "--lake", str(lake), "--host", "h", "--from", "30m", "--out", str(tmp_path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--out {tmp_path} is a directory" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]  # nothing written, no temp file

    (tmp_path / "file").write_text("x")
    assert main(["report", "--lake", str(lake), "--out", str(tmp_path / "file" / "r.html")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_out_in_a_missing_directory_creates_it(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    out = tmp_path / "a" / "b" / "r.html"
    assert main(["report", "--lake", str(lake), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(("argv", "want"), [
    (["remediate", "list", "--lake", "L"], {"lake": "L", "queue": None}),
    (["remediate", "--lake", "L", "list"], {"lake": "L", "queue": None}),
    (["remediate", "--lake", "OLD", "show", "3", "--lake", "L", "--queue", "Q"], {"lake": "L", "queue": "Q"}),
    (["remediate", "list"], {"lake": None, "queue": None}),
    (["kb", "show", "nic_drops", "--kb", "K"], {"kb": "K"}),
    (["kb", "--kb", "K", "list"], {"kb": "K"}),
    (["kb", "list"], {"kb": None}),
])
def test_a_commands_options_go_before_or_after_its_verb(argv: list[str], want: dict[str, str | None]) -> None:
    # `unveil remediate list --lake L` was refused ("unrecognized arguments: --lake L")
    from jobs.cli import build_parser

    args = build_parser(argv).parse_args(argv)
    assert {k: getattr(args, k) for k in want} == want
