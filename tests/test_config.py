"""The annotated sample config is valid for every section's loader; bad values name the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from jobs import config
from jobs.pipeline import SweepConfig, analytics_from_mapping
from remediation.executor import ExecutorConfig

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "unveil.toml"


def test_sample_config_loads_in_every_section() -> None:
    cfg = config.load(SAMPLE)
    assert cfg.agent.interval_s == 0.1 and cfg.lake == "/var/lib/unveil/lake"
    assert cfg.agent.max_buffered_rows == 500_000
    raw = tomllib.loads(SAMPLE.read_text())
    a = analytics_from_mapping(raw["analytics"])
    s = SweepConfig.from_mapping({k: v for k, v in raw["scheduler"].items() if k != "every"}, analytics=a)
    assert s.detection.signature and a.window.length_s == 3.0
    r = ExecutorConfig.from_mapping({k: v for k, v in raw["remediation"].items() if k != "queue"})
    assert r.auto_remediate is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agent]\ninterval_s = 'fast'\n", r"\[agent\]\.interval_s must be int or float"),
        ("[agent]\nintervall_s = 0.1\n", r"unknown key \[agent\]\.intervall_s"),
        ("[influx]\napi = 'v3'\n", r"\[influx\]\.api must be auto, v1 or v2"),
        ("[lakes]\npath = 'x'\n", r"unknown top-level key 'lakes'"),
        ("[agent\n", r"not valid TOML"),
    ],
)
def test_bad_config_is_rejected_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(config.ConfigError, match=message) as exc:
        config.load(p)
    assert str(p) in str(exc.value)


def test_env_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNVEIL_LAKE", str(tmp_path / "lake"))
    assert config.resolve_lake(None, config.load(SAMPLE)) == tmp_path / "lake"
    monkeypatch.delenv("UNVEIL_LAKE")
    with pytest.raises(config.ConfigError, match="no lake path"):
        config.resolve_lake(None, config.load(None))


# ------------------------------------------------------ config and flag edges (issue item 9)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[lake]\npath = 5\n", r"\[lake\]\.path must be a string \(a directory\), got 5"),
        ("[lake]\npth = '/x'\n", r"unknown key \[lake\]\.pth"),
        ("lake = 5\n", r"\[lake\] must be a table"),
        ("[agent]\ncommit_interval_s = -1\n", r"\[agent\]\.commit_interval_s must be > 0, got -1"),
        ("[agent]\nflush_interval_s = 0\n", r"\[agent\]\.flush_interval_s must be > 0, got 0"),
        ("[agent]\ninterval_s = nan\n", r"\[agent\]\.interval_s must be > 0, got nan"),
        ("[agent]\ncommit_interval_s = inf\n", r"\[agent\]\.commit_interval_s must be a finite number, got inf"),
        ("[agent]\ncompact_every_s = -5\n", r"\[agent\]\.compact_every_s must be >= 0 \(0: off\), got -5"),
        ("[agent]\ncgroup_paths = [1]\n", r"\[agent\]\.cgroup_paths must hold non-empty strings, got 1"),
        ("[agent]\ncollectors = ['cpu', '']\n", r"\[agent\]\.collectors must hold non-empty strings, got ''"),
        ("[agent]\ntiers = {cpu = 5}\n", r"\[agent\]\.tiers must hold non-empty strings, got 5"),
        ("[agent]\nhost = ''\n", r"\[agent\]\.host must not be empty"),
        ("[agent]\nmax_buffered_rows = 0\n", r"\[agent\]\.max_buffered_rows must be a positive number of rows, got 0"),
        ("[agent]\nmax_buffered_rows = 1.5\n", r"\[agent\]\.max_buffered_rows"),
    ],
)
def test_bad_lake_path_and_intervals_are_rejected_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(config.ConfigError, match=message) as exc:
        config.load(p)
    assert str(p) in str(exc.value)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from jobs.cli import main

    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_cli_reports_a_bad_config_value_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[lake]\npath = 5\n")
    rc, err = _cli(capsys, "--config", str(p), "schedule", "--once")
    assert rc == 2 and err.strip().splitlines() == [
        f"unveil schedule: error: {p}: [lake].path must be a string (a directory), got 5"
    ]


@pytest.mark.parametrize("flag", ["--interval", "--flush-interval", "--commit-interval", "--duration"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_agent_zero_or_negative_interval_flags_are_rejected_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    argv = ["agent", "--lake", str(lake), "--quiet", flag, value]
    if flag != "--duration":
        argv += ["--duration", "0.05"]
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "Traceback" not in err and "usage:" not in err
    assert err.strip().splitlines() == [f"unveil agent: error: {flag} must be a positive number of seconds, got {value}"]
    assert list(lake.iterdir()) == []  # nothing was sampled


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["import", "--lake", "L", "--host", "h", "--interval", "-1m", "--start", "now", "f.csv"],
         "--interval: bad duration '-1m': must be positive"),
        (["import", "--lake", "L", "--host", "h", "--interval", "0s", "--start", "now", "f.csv"],
         "--interval: bad duration '0s': must be positive"),
        (["schedule", "--lake", ".", "--every", "-5m"], "--every: bad duration '-5m': must be positive"),
        (["schedule", "--lake", ".", "--chunk", "-1h", "--once"], "--chunk: bad duration '-1h': must be positive"),
        (["postmortem", "--lake", ".", "--label", "x", "--margin", "-5m"],
         "--margin: bad duration '-5m': must be positive"),
    ],
)
def test_negative_durations_are_one_line_errors_not_usage_dumps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "L").mkdir()
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "usage:" not in err
    assert err.strip().splitlines() == [f"unveil {argv[0]}: error: {message}"]


def test_relative_times_with_a_minus_are_values_not_options() -> None:
    from jobs.cli import build_parser

    args = build_parser().parse_args(["query", "--since", "-24h", "--until", "-1.5h", "cpu"])
    assert (args.since, args.until) == ("-24h", "-1.5h")


@pytest.mark.parametrize("every", ["0", "-5", "'-5m'"])
def test_scheduler_every_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str], every: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text(f"[scheduler]\nevery = {every}\n")
    rc, err = _cli(capsys, "--config", str(p), "schedule", "--lake", str(tmp_path), "--until", "2026-01-01")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"unveil schedule: error: {p}: [scheduler].every: ")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["agent", "--interval", "abc"], "unveil agent: error: argument --interval: invalid float value: 'abc'"),
        (["import", "--lake", "L"], "unveil import: error: the following arguments are required: --host, FILE"),
        (["schedule", "--every"], "unveil schedule: error: argument --every: expected one argument"),
        (["nosuch"], "unveil: error: argument COMMAND: invalid choice: 'nosuch'"),
    ],
)
def test_argparse_errors_are_one_line_with_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith(line), err
    assert err.rstrip().endswith("--help')")
