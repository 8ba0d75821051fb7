"""The annotated sample config is valid for every section's loader; bad values name the key."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from analytics.pipeline import AnalyticsConfig
from ingest.agent import AgentConfig
from ingest.influx import InfluxConfig
from jobs import config
from jobs.config import SweepConfig, analytics_from_mapping
from jobs.timeparse import parse_duration
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


#: a commented-out key (or sub-table header) of the sample, not prose
_COMMENTED_KEY = re.compile(r"^# (\[[a-z_.]+\]|[a-z_]+ = .*)$", re.M)


def _td(v: object) -> timedelta:
    return parse_duration(v) if isinstance(v, str) else timedelta(seconds=float(v))  # type: ignore[arg-type]


#: (table, key) -> (where its value lands in the tree, how the file's value reads there)
_SAME = lambda v: v  # noqa: E731
_ARRIVES: dict[tuple[str, str], list[tuple[Callable[[config.Config], object], Callable[[Any], object]]]] = {
    ("lake", "path"): [(lambda c: c.lake, _SAME)],
    ("lake", "endpoint"): [(lambda c: c.lake_endpoint, _SAME)],
    ("lake", "region"): [(lambda c: c.lake_region, _SAME)],
    ("lake", "state"): [(lambda c: c.lake_state, _SAME)],
    **{("agent", k): [(lambda c, k=k: getattr(c.agent, k), _SAME)] for k in (
        "host", "root", "interval_s", "flush_interval_s", "commit_interval_s", "durable", "max_buffered_rows",
        "compact_every_s", "tiers")},
    ("agent", "collectors"): [(lambda c: c.agent.collectors, tuple)],
    ("agent", "cgroup_paths"): [(lambda c: c.agent.cgroup_paths, tuple)],
    **{("influx", k): [(lambda c, k=k: getattr(c.influx, k), _SAME)] for k in ("url", "database", "org", "bucket",
                                                                              "api")},
    ("influx", "spool_dir"): [(lambda c: c.influx.spool_dir, Path)],
    ("drill", "canary"): [(lambda c: c.drill.canary, _SAME)],
    ("analytics", "window_s"): [(lambda c: c.analytics.window.length_s, _SAME)],
    ("analytics", "stride_s"): [(lambda c: c.analytics.window.stride_s, _SAME)],
    ("analytics", "detectors"): [(lambda c: c.analytics.detectors, tuple)],
    **{("analytics", k): [(lambda c, k=k: getattr(c.analytics, k), _SAME)] for k in (
        "combine", "vote_k", "reference", "top_k", "threshold_k", "min_windows", "min_cohort", "cohort_sample", "cohort_by",
        "cohort_tolerance", "one_sided", "activity_weight", "min_run", "threshold_rule", "max_reference_rows",
        "random_state")},
    **{("analytics", k): [(lambda c, k=k: getattr(c.analytics, k), _td)] for k in ("history", "smooth", "refit")},
    # one warm-up: the analytics' and the knowledge-base detector's
    ("analytics", "warmup"): [(lambda c: c.analytics.warmup, _td),
                              (lambda c: timedelta(seconds=c.detection.warmup_s), _td)],
    ("scheduler", "every"): [(lambda c: c.every, _td)],
    **{("scheduler", k): [(lambda c, k=k: getattr(c.sweep, k), _td)] for k in (
        "chunk", "lag", "max_incident", "compact_every", "analysis_step")},
    **{("scheduler", k): [(lambda c, k=k: getattr(c.sweep, k), _SAME)] for k in (
        "incident_gap_s", "queue_remediations", "kb_path", "engine", "min_incident_s", "min_unmatched_s",
        "batch_hosts", "max_chunks")},
    ("scheduler", "retention"): [(lambda c: dict(c.sweep.retention), lambda v: {t: _td(d) for t, d in v.items()})],
    ("scheduler", "signature_detector"): [(lambda c: c.detection.signature, _SAME)],
    ("scheduler", "peer_only_findings"): [(lambda c: c.detection.peer_only, _SAME)],
    ("scheduler", "signature_min_confidence"): [(lambda c: c.detection.min_confidence, _SAME)],
    ("scheduler", "restart_gap"): [(lambda c: timedelta(seconds=c.detection.restart_gap_s), _td)],
    ("remediation", "queue"): [(lambda c: c.remediation.queue, _SAME)],
    ("remediation", "timeout_s"): [(lambda c: c.remediation.timeout_s, _SAME)],
    ("remediation", "root"): [(lambda c: c.remediation.root, _SAME), (lambda c: c.sweep.remediation_root, _SAME)],
    ("remediation", "auto_remediate"): [(lambda c: c.remediation.auto_remediate, _SAME),
                                        (lambda c: c.sweep.auto_remediate, _SAME)],
}


def test_sample_with_every_commented_key_enabled_arrives_in_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("UNVEIL_LAKE", "UNVEIL_INFLUX_URL"):
        monkeypatch.delenv(var, raising=False)
    text, n = _COMMENTED_KEY.subn(r"\1", SAMPLE.read_text())
    assert n >= 14  # the sample documents its optional keys as commented-out lines
    p = tmp_path / "all.toml"
    p.write_text(text)
    raw = tomllib.loads(text)
    cfg = config.load(p)
    assert isinstance(cfg.agent, AgentConfig) and isinstance(cfg.influx, InfluxConfig)
    keys = {(t, k) for t, table in raw.items() for k in table}
    assert keys == set(_ARRIVES), "a key of the sample has no check here (or a check no key)"
    # every key the two big tables accept is documented (the scheduler's history and warmup are
    # the old spellings of the analytics' ones)
    accepted = {("scheduler", k) for k in config.SCHEDULER_KEYS} | {("analytics", k) for k in config.ANALYTICS_KEYS}
    assert accepted - {("scheduler", "history"), ("scheduler", "warmup")} <= keys, "a key the sample lacks"
    for (t, k), checks in _ARRIVES.items():
        for get, want in checks:
            assert get(cfg) == want(raw[t][k]), f"[{t}] {k} = {raw[t][k]!r} did not arrive"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agent]\ncollectors = ['cpu', 'host_facts']\n", r"\[agent\] collectors: unknown collector\(s\) 'host_facts'; known: .*hostfacts"),
        ("[agent.tiers]\nhost_facts = 'slow'\n", r"\[agent\] tiers: unknown collector\(s\) 'host_facts'"),
        ("[agent.tiers]\ncpu = 'sometimes'\n", r"\[agent\] tiers\.cpu: unknown tier 'sometimes'"),
        ("[scheduler]\nanalysis_step = '1500ms'\n", r"\[scheduler\] analysis_step \(0:00:01.500000\) must be a multiple of the stride"),
        ("[scheduler]\nchunck = '1h'\n", r"\[scheduler\]: unknown key\(s\) chunck"),
        ("[scheduler]\nengine = 'threads'\n", r"\[scheduler\] engine: unknown engine 'threads'; expected serial"),
        ("[analytics]\nvote_k = 9\n", r"\[analytics\] vote_k must be between"),
        ("[analytics]\ncohort_sample = 0\n", r"\[analytics\] cohort_sample must be a positive integer, not 0"),
        ("[scheduler]\nbatch_hosts = 0\n", r"\[scheduler\] batch_hosts must be a positive integer, not 0"),
        ("[remediation]\ntimeout_s = -1\n", r"\[remediation\] timeout_s: expected a positive number"),
        ("[remediation]\nqueue = 5\n", r"\[remediation\] queue: expected a file path"),
        ("[influx]\nurl = 'ftp://x'\n", r"\[influx\] url: expected http"),
        ("[lake]\nstate = 's3://b/state'\n", r"\[lake\]\.state must be a directory"),
    ],
)
def test_every_section_is_validated_at_load_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(config.ConfigError, match=message) as exc:
        config.load(p)
    assert str(exc.value).startswith(f"{p}: ")


def test_the_agent_checks_the_analysis_key_names_without_building_them(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[analytics]\nvote_k = 9\n")  # a bad value: only the sweep's load sees it
    assert config.load(p, analysis=False).agent.interval_s == 0.1
    p.write_text("[analytics]\nvotek = 2\n")  # a misspelt key: every load sees it
    with pytest.raises(config.ConfigError, match=r"\[analytics\]: unknown key\(s\) votek"):
        config.load(p, analysis=False)


def test_one_warmup_key_and_the_old_one_still_works(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[analytics]\nwarmup = '3m'\n")
    cfg = config.load(p)
    assert cfg.analytics.warmup == timedelta(minutes=3) and cfg.detection.warmup_s == 180.0
    p.write_text("[scheduler]\nwarmup = '90s'\n")  # before: the detector's warm-up alone
    with pytest.warns(FutureWarning, match=r"\[scheduler\] warmup is deprecated"):
        cfg = config.load(p)
    assert cfg.detection.warmup_s == 90.0 and cfg.analytics.warmup == AnalyticsConfig().warmup


def test_flags_overlay_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.cli import build_parser
    from jobs.commands.agent import build
    from jobs.commands.schedule import sweep_config

    monkeypatch.delenv("UNVEIL_INFLUX_URL", raising=False)
    p = tmp_path / "c.toml"
    p.write_text("[agent]\nhost = 'from-file'\ncgroup_paths = ['a.slice']\ncommit_interval_s = 30\n"
                 "[influx]\ndatabase = 'db1'\norg = 'o'\n[scheduler]\nchunk = '2h'\nlag = '2m'\n")
    args = build_parser().parse_args(["--config", str(p), "agent", "--lake", str(tmp_path), "--interval", "0.5",
                                      "--influx-url", "http://127.0.0.1:9"])
    acfg, sinks, _ = build(args)
    assert (acfg.host, acfg.interval_s, acfg.commit_interval_s, acfg.cgroup_paths) == (
        "from-file", 0.5, 30, ("a.slice",))
    influx = sinks[1].config  # type: ignore[attr-defined]
    assert (influx.url, influx.database, influx.org) == ("http://127.0.0.1:9", "db1", "o")
    for s in sinks:
        s.close()
    args = build_parser().parse_args(["--config", str(p), "schedule", "--lake", str(tmp_path), "--chunk", "10m"])
    sc = sweep_config(args, config.load(p), tmp_path)
    assert (sc.chunk, sc.lag, sc.influx) == (timedelta(minutes=10), timedelta(minutes=2), None)


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
        (["agent", "--interval", "abc"], "unveil agent: error: argument --interval: bad duration 'abc': expected a number of seconds (150)"),
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


def test_scheduler_history_is_the_schedulers_alone(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[analytics]\nhistory = '30m'\n[scheduler]\nhistory = '2h'\n")
    cfg = config.load(p)
    assert cfg.sweep.analytics.history == timedelta(hours=2)  # the scheduler's
    assert cfg.analytics.history == timedelta(minutes=30)  # `unveil sweep` reads [analytics] as before
