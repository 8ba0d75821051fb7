"""One TOML config file, validated once at start; bad values are rejected with the key named.

Precedence: command-line flags > environment (UNVEIL_LAKE, UNVEIL_CONFIG, UNVEIL_INFLUX_*) >
config file > defaults. ``samples/unveil.toml`` is the annotated sample.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass
class InfluxSection:
    url: str | None = None
    database: str = "unveil"
    org: str = ""
    bucket: str = ""
    api: str = "auto"
    spool_dir: str | None = None


@dataclass
class AgentSection:
    host: str | None = None
    root: str = "/"
    interval_s: float = 0.1
    flush_interval_s: float = 10.0
    commit_interval_s: float = 60.0
    collectors: list[str] | None = None
    tiers: dict[str, str] = field(default_factory=dict)
    compact_every_s: float = 600.0
    cgroup_paths: list[str] = field(default_factory=list)
    durable: bool = False
    max_buffered_rows: int = 500_000


@dataclass
class DrillSection:
    canary: bool = False  # true: `unveil drill` injects faults here without --yes


@dataclass
class Config:
    lake: str | None = None
    agent: AgentSection = field(default_factory=AgentSection)
    influx: InfluxSection = field(default_factory=InfluxSection)
    drill: DrillSection = field(default_factory=DrillSection)
    analytics: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    remediation: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None


_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "agent": {
        "host": (str,),
        "root": (str,),
        "interval_s": (int, float),
        "flush_interval_s": (int, float),
        "commit_interval_s": (int, float),
        "collectors": (list,),
        "tiers": (dict,),
        "compact_every_s": (int, float),
        "cgroup_paths": (list,),
        "durable": (bool,),
        "max_buffered_rows": (int,),
    },
    "influx": {
        "url": (str,),
        "database": (str,),
        "org": (str,),
        "bucket": (str,),
        "api": (str,),
        "spool_dir": (str,),
    },
    "drill": {
        "canary": (bool,),
    },
}


#: [agent] periods that must be positive seconds; compact_every_s may also be 0 (off)
_POSITIVE = ("interval_s", "flush_interval_s", "commit_interval_s")


def check_seconds(value: float, name: str, *, zero: bool = False) -> float:
    """``value`` if it is a finite number of seconds > 0 (>= 0 with ``zero``), else a
    ValueError naming ``name`` (a flag or a config key). NaN fails every comparison, so it
    is rejected too."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not (value >= 0 if zero else value > 0):
        raise ValueError(f"{name} must be {'>= 0 (0: off)' if zero else '> 0'}, got {value!r}")
    return value


def _section(path: Path, name: str, raw: dict[str, Any], cls: type) -> Any:
    types = _TYPES[name]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in types:
            raise ConfigError(f"{path}: unknown key [{name}].{key} (known: {', '.join(types)})")
        if not isinstance(value, types[key]) or (isinstance(value, bool) and bool not in types[key]):
            want = " or ".join(t.__name__ for t in types[key])
            raise ConfigError(f"{path}: [{name}].{key} must be {want}, got {value!r}")
        # lists and tables hold names and paths: a number there fails much later, obscurely
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(f"{path}: [{name}].{key} must hold non-empty strings, got {item!r}")
        if key == "host" and isinstance(value, str) and not value.strip():
            raise ConfigError(f"{path}: [{name}].host must not be empty (leave it out for the hostname)")
        values[key] = value
    obj = cls(**values)
    return obj


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate the config file (``path``, else $UNVEIL_CONFIG, else defaults)."""
    if path is None:
        env = os.environ.get("UNVEIL_CONFIG")
        path = env if env else None
    cfg = Config()
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
        known = {"lake", "agent", "influx", "drill", "analytics", "scheduler", "remediation"}
        for key in raw:
            if key not in known:
                raise ConfigError(f"{p}: unknown top-level key {key!r} (known: {', '.join(sorted(known))})")
        cfg.lake = _lake_path(p, raw.get("lake", {}))
        for sec in ("agent", "influx", "drill"):
            if not isinstance(raw.get(sec, {}), dict):
                raise ConfigError(f"{p}: [{sec}] must be a table")
        cfg.agent = _section(p, "agent", raw.get("agent", {}), AgentSection)
        cfg.influx = _section(p, "influx", raw.get("influx", {}), InfluxSection)
        cfg.drill = _section(p, "drill", raw.get("drill", {}), DrillSection)
        try:
            for key in _POSITIVE:
                check_seconds(getattr(cfg.agent, key), f"[agent].{key}")
            check_seconds(cfg.agent.compact_every_s, "[agent].compact_every_s", zero=True)
            if isinstance(cfg.agent.max_buffered_rows, bool) or cfg.agent.max_buffered_rows < 1:
                raise ValueError(f"[agent].max_buffered_rows must be a positive number of rows, "
                                 f"got {cfg.agent.max_buffered_rows!r}")
        except ValueError as exc:
            raise ConfigError(f"{p}: {exc}") from None
        if cfg.influx.api not in ("auto", "v1", "v2"):
            raise ConfigError(f"{p}: [influx].api must be auto, v1 or v2")
        for sec in ("analytics", "scheduler", "remediation"):
            val = raw.get(sec, {})
            if not isinstance(val, dict):
                raise ConfigError(f"{p}: [{sec}] must be a table")
            setattr(cfg, sec, val)
        cfg.source = p
    env_lake = os.environ.get("UNVEIL_LAKE")
    if env_lake:
        cfg.lake = env_lake
    env_url = os.environ.get("UNVEIL_INFLUX_URL")
    if env_url:
        cfg.influx.url = env_url
    return cfg


def _lake_path(p: Path, lake: Any) -> str | None:
    """``[lake] path = "..."`` (or the shorthand ``lake = "..."``): a non-empty string."""
    if isinstance(lake, str):
        lake = {"path": lake}
    if not isinstance(lake, dict):
        raise ConfigError(f"{p}: [lake] must be a table with path = \"...\", got {lake!r}")
    for key in lake:
        if key != "path":
            raise ConfigError(f"{p}: unknown key [lake].{key} (known: path)")
    path = lake.get("path")
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{p}: [lake].path must be a string (a directory), got {path!r}")
    return path


def resolve_lake(flag: str | None, cfg: Config) -> Path:
    """The lake path from the flag, else $UNVEIL_LAKE / the config file; an error when none."""
    value = flag or cfg.lake
    if not value:
        raise ConfigError("no lake path: pass --lake PATH, set UNVEIL_LAKE, or set [lake] path in the config")
    return Path(value)
