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
