"""One TOML config file, validated once at start into one tree of the typed objects the code
runs with; bad values are rejected with the file and the key named.

Precedence: command-line flags > environment (UNVEIL_LAKE, UNVEIL_CONFIG, UNVEIL_INFLUX_*) >
config file > defaults. ``samples/unveil.toml`` is the annotated sample.

The typed objects live where they are used (``ingest.agent.AgentConfig``,
``ingest.influx.InfluxConfig``, ``analytics.pipeline.AnalyticsConfig``,
``knowledge_base.detector.DetectionConfig``, ``remediation.executor.ExecutorConfig``); this
module only builds them, plus :class:`SweepConfig` (``[scheduler]``), which belongs to jobs.
Commands overlay their flags on the tree with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.agent import AgentConfig
from ingest.influx import InfluxConfig
from remediation.executor import ExecutorConfig

if TYPE_CHECKING:  # heavy (scikit-learn): imported when the analysis sections are built
    from analytics.pipeline import AnalyticsConfig
    from knowledge_base.detector import DetectionConfig


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass
class DrillSection:
    canary: bool = False  # true: `unveil drill` injects faults here without --yes


#: every table of the file; each is built into its typed object by :func:`load`
SECTIONS = ("lake", "agent", "influx", "drill", "analytics", "scheduler", "remediation")
#: the sections whose objects import the analytics (scikit-learn); ``load(analysis=False)``
#: checks their key names only, so the agent does not carry those modules
ANALYSIS = ("analytics", "scheduler")


@dataclass
class Config:
    lake: str | None = None
    #: ``[lake] endpoint`` / ``region``: the S3-compatible server of an ``s3://`` lake (else
    #: the AWS variables); credentials come from the AWS variables only, never from this file
    lake_endpoint: str | None = None
    lake_region: str | None = None
    #: ``[lake] state``: the directory that holds an ``s3://`` lake's local state (an agent's
    #: journal; a sweep's watermarks, lock, staged outputs, remediation queue):
    #: :func:`ingest.lake.state_root`
    lake_state: str | None = None
    agent: AgentConfig = field(default_factory=AgentConfig)
    influx: InfluxConfig = field(default_factory=InfluxConfig)  # url None: no InfluxDB
    drill: DrillSection = field(default_factory=DrillSection)
    remediation: ExecutorConfig = field(default_factory=ExecutorConfig)
    #: ``[scheduler] every``: the period of `unveil schedule`'s cycles
    every: timedelta = timedelta(seconds=60)
    source: Path | None = None
    _analytics: AnalyticsConfig | None = None
    _sweep: SweepConfig | None = None

    @property
    def sweep(self) -> SweepConfig:
        """``[scheduler]`` with ``[analytics]`` (``sweep.analytics``) and ``sweep.detection``."""
        if self._sweep is None:
            raise ConfigError("the analysis sections were not loaded (load(..., analysis=True))")
        return self._sweep

    @property
    def analytics(self) -> AnalyticsConfig:
        """``[analytics]`` as `unveil sweep` uses it (the scheduler's, ``sweep.analytics``, also
        takes ``[scheduler] history``)."""
        self.sweep  # noqa: B018 -- the same error when the analysis sections were not loaded
        assert self._analytics is not None
        return self._analytics

    @property
    def detection(self) -> DetectionConfig:
        return self.sweep.detection


# ------------------------------------------------------------------ value checks


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


def duration(v: Any, where: str, *, zero: bool = False) -> timedelta:
    """A duration ('90s', '1h') or a number of seconds, > 0 (>= 0 with ``zero``); errors name ``where``."""
    from jobs.timeparse import parse_duration

    if isinstance(v, int | float) and not isinstance(v, bool) and (v > 0 or (zero and v == 0)):
        return timedelta(seconds=float(v))
    if isinstance(v, str) and zero and re.fullmatch(r"\s*0+(\.0*)?\s*(ms|s|m|h|d|w)?\s*", v):
        return timedelta(0)
    if isinstance(v, str):
        try:
            return parse_duration(v)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    raise ValueError(f"{where}: expected a duration like '1h' or a number of seconds, got {v!r}")



# --------------------------------------------------------------- [analytics]

ANALYTICS_KEYS = frozenset({
    "window_s", "stride_s", "detectors", "combine", "vote_k", "reference", "history", "threshold_k", "threshold_rule",
    "top_k", "min_windows", "min_cohort", "cohort_sample", "random_state", "max_reference_rows", "one_sided",
    "activity_weight", "min_run", "cohort_by", "cohort_tolerance", "warmup", "smooth", "refit"})


def analytics_from_mapping(d: Mapping[str, Any], where: str = "[analytics]") -> AnalyticsConfig:
    """AnalyticsConfig from the config file's ``[analytics]`` table (window_s, stride_s,
    detectors, combine, vote_k, reference, history, threshold_k, top_k, min_windows,
    min_cohort, random_state ...); errors name the key."""
    from analytics.features import WindowSpec
    from analytics.pipeline import AnalyticsConfig

    bad = sorted(set(d) - ANALYTICS_KEYS)
    if bad:
        raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(ANALYTICS_KEYS))}")
    durations = ("history", "warmup", "smooth")
    kw: dict[str, Any] = {k: v for k, v in d.items()
                          if k not in ("window_s", "stride_s", "detectors", "refit", *durations)}
    for k in ("warmup", "smooth"):
        if k in d:
            kw[k] = duration(d[k], f"{where} {k}", zero=True)
    if "detectors" in d:
        if not isinstance(d["detectors"], list):
            raise ValueError(f"{where} detectors: expected a list of names, got {d['detectors']!r}")
        kw["detectors"] = tuple(d["detectors"])
    if "history" in d:
        kw["history"] = duration(d["history"], f"{where} history")
    if "refit" in d:  # 0 / "off": refit at every analysis step
        kw["refit"] = None if d["refit"] in (0, "off") else duration(d["refit"], f"{where} refit")
    if "window_s" in d or "stride_s" in d:
        kw["window"] = WindowSpec(float(d.get("window_s", 3.0)), float(d.get("stride_s", 1.0)))
    try:
        return AnalyticsConfig(**kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


# --------------------------------------------------------------- [scheduler]


def _default_analytics() -> AnalyticsConfig:
    from analytics.pipeline import AnalyticsConfig

    return AnalyticsConfig()


def _default_detection() -> DetectionConfig:
    from knowledge_base.detector import DetectionConfig

    return DetectionConfig()


@dataclass(frozen=True)
class SweepConfig:
    """What a scheduled sweep does (``[scheduler]`` in the config file, see docs/operations.md)."""

    analytics: AnalyticsConfig = field(default_factory=_default_analytics)
    chunk: timedelta = timedelta(hours=1)  # most data time one commit covers (bounded catch-up)
    # safety lag behind now: late data within it is kept. The agent commits its rows to the
    # lake every minute (commit_interval_s), so a host's newest minute is not there yet.
    lag: timedelta = timedelta(seconds=90)
    start_at: datetime | None = None  # first watermark of a host never swept (None: its earliest data)
    max_chunks: int | None = None  # per cycle; None: catch up fully
    incident_gap_s: float = 5.0
    max_incident: timedelta = timedelta(minutes=15)
    # an incident is raised (open, then closed) once it spans this long; shorter ones never are
    min_incident_s: float = 10.0  # measured: benchmarks/incident_latency.py (docs/operations.md)
    # an unmatched incident (no KB entry explains it: a statistical anomaly) must span this
    # long: a load swing of a minute is no fault to page on (docs/identification.md)
    min_unmatched_s: float = 120.0
    # windows are judged in clock-aligned steps of this length on the data up to the step's
    # end (the live cadence): the verdict does not depend on the chunking. None: per chunk
    analysis_step: timedelta | None = timedelta(minutes=1)
    # an analysis step judges its hosts in batches of this many (with their cohorts' sampled
    # hosts): a worker holds the windows of a batch, not of the fleet (docs/fleet.md)
    batch_hosts: int = 32
    queue_remediations: bool = True
    auto_remediate: bool = False
    remediation_root: str = "/"  # [remediation] root: where scripts act (auto runs, verification rollbacks)
    influx: InfluxConfig | None = None
    kb_path: str | None = None
    compact_every: timedelta | None = timedelta(minutes=10)
    retention: Mapping[str, timedelta] = field(default_factory=dict)
    detection: DetectionConfig = field(default_factory=_default_detection)
    # where the sweep's per-host work runs (jobs.engine): serial, processes[:N] (default: all
    # local cores), ray[:N] (a local Ray) or ray://HOST:PORT (a Ray cluster)
    engine: str = "processes"

    def __post_init__(self) -> None:
        from jobs.engine import parse_spec

        object.__setattr__(self, "engine", parse_spec(self.engine, "scheduler.engine"))
        if self.chunk <= timedelta(0) or self.lag < timedelta(0):
            raise ValueError("scheduler.chunk must be > 0 and scheduler.lag >= 0")
        stride = timedelta(seconds=self.analytics.window.stride_s)
        if self.chunk < stride:
            raise ValueError(f"scheduler.chunk ({self.chunk}) must be at least one stride ({stride})")
        if self.max_chunks is not None and self.max_chunks < 1:
            raise ValueError(f"scheduler.max_chunks must be >= 1, not {self.max_chunks!r}")
        if self.max_incident <= timedelta(0) or self.incident_gap_s < 0:
            raise ValueError("scheduler.max_incident must be > 0 and scheduler.incident_gap_s >= 0")
        if self.analysis_step is not None:
            ratio = self.analysis_step / stride
            if self.analysis_step < stride or abs(ratio - round(ratio)) > 1e-9:
                raise ValueError(f"scheduler.analysis_step ({self.analysis_step}) must be a multiple of the "
                                 f"stride ({stride})")
            refit = self.analytics.refit
            if refit is not None and (refit < self.analysis_step
                                      or abs(refit / self.analysis_step - round(refit / self.analysis_step)) > 1e-9):
                raise ValueError(f"analytics.refit ({refit}) must be a multiple of scheduler.analysis_step "
                                 f"({self.analysis_step})")
        if not 0 <= self.min_incident_s < self.max_incident.total_seconds():
            raise ValueError(f"scheduler.min_incident_s must be >= 0 and below max_incident "
                             f"({self.max_incident}), not {self.min_incident_s!r}")
        if not isinstance(self.batch_hosts, int) or isinstance(self.batch_hosts, bool) or self.batch_hosts < 1:
            raise ValueError(f"scheduler.batch_hosts must be a positive integer, not {self.batch_hosts!r}")
        if self.min_unmatched_s < 0:  # (no upper bound: incidents_of caps it at max_incident)
            raise ValueError(f"scheduler.min_unmatched_s must be >= 0, not {self.min_unmatched_s!r}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], *, analytics: AnalyticsConfig | None = None,
                     influx: InfluxConfig | None = None, auto_remediate: bool = False,
                     where: str = "[scheduler]") -> SweepConfig:
        """From the config file's ``[scheduler]`` table; unknown keys are an error naming them.
        ``warmup`` here is the deprecated spelling of ``[analytics] warmup`` (see :func:`load`)."""
        bad = sorted(set(d) - SCHEDULER_KEYS)
        if bad:
            raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(SCHEDULER_KEYS))}")
        kw: dict[str, Any] = {}
        for k in ("chunk", "lag", "max_incident"):
            if k in d:
                kw[k] = duration(d[k], f"{where} {k}", zero=k == "lag")
        if "analysis_step" in d:
            kw["analysis_step"] = None if d["analysis_step"] in (0, "off") else duration(
                d["analysis_step"], f"{where} analysis_step")
        if "compact_every" in d:
            kw["compact_every"] = None if d["compact_every"] in (0, "off") else duration(
                d["compact_every"], f"{where} compact_every")
        if "retention" in d:
            r = d["retention"]
            if not isinstance(r, dict):
                raise ValueError(f"{where} retention: expected a table of table = duration, got {r!r}")
            kw["retention"] = {t: duration(v, f"{where} retention.{t}") for t, v in r.items()}
        if "max_chunks" in d:
            kw["max_chunks"] = d["max_chunks"]
        if "batch_hosts" in d:
            kw["batch_hosts"] = d["batch_hosts"]
        if "incident_gap_s" in d:
            kw["incident_gap_s"] = float(d["incident_gap_s"])
        for key in ("min_incident_s", "min_unmatched_s"):
            if key in d:
                v = d[key]
                kw[key] = (v if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                           else duration(v, f"{where} {key}", zero=True).total_seconds())
        if "queue_remediations" in d:
            if not isinstance(d["queue_remediations"], bool):
                raise ValueError(f"{where} queue_remediations: expected true or false")
            kw["queue_remediations"] = d["queue_remediations"]
        if "kb_path" in d:
            kw["kb_path"] = str(d["kb_path"])
        if "engine" in d:
            kw["engine"] = d["engine"]
        a = analytics or _default_analytics()
        if "history" in d:
            a = replace(a, history=duration(d["history"], f"{where} history"))
        kw["detection"] = detection_from_mapping(d, where)
        try:
            return cls(analytics=a, influx=influx, auto_remediate=auto_remediate, **kw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None


SCHEDULER_KEYS = frozenset({
    "every", "chunk", "lag", "max_chunks", "incident_gap_s", "max_incident", "queue_remediations",
    "compact_every", "retention", "kb_path", "history", "signature_detector", "signature_min_confidence",
    "warmup", "restart_gap", "min_incident_s", "min_unmatched_s", "analysis_step", "engine", "peer_only_findings",
    "batch_hosts"})


def detection_from_mapping(d: Mapping[str, Any], where: str = "[scheduler]") -> DetectionConfig:
    """DetectionConfig from ``signature_detector`` (bool), ``signature_min_confidence``
    (0..1), ``warmup`` and ``restart_gap`` (durations; warmup may be 0) and
    ``peer_only_findings`` (bool, knowledge_base.detector module doc) of a config table."""
    from knowledge_base.detector import DetectionConfig

    kw: dict[str, Any] = {}
    if "signature_detector" in d:
        if not isinstance(d["signature_detector"], bool):
            raise ValueError(f"{where} signature_detector: expected true or false, got {d['signature_detector']!r}")
        kw["signature"] = d["signature_detector"]
    if "signature_min_confidence" in d:
        v = d["signature_min_confidence"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            raise ValueError(f"{where} signature_min_confidence: expected a number in [0, 1], got {v!r}")
        kw["min_confidence"] = float(v)
    if "warmup" in d:
        kw["warmup_s"] = duration(d["warmup"], f"{where} warmup", zero=True).total_seconds()
    if "restart_gap" in d:
        kw["restart_gap_s"] = duration(d["restart_gap"], f"{where} restart_gap").total_seconds()
    if "peer_only_findings" in d:
        if not isinstance(d["peer_only_findings"], bool):
            raise ValueError(f"{where} peer_only_findings: expected true or false, got {d['peer_only_findings']!r}")
        kw["peer_only"] = d["peer_only_findings"]
    try:
        return DetectionConfig(**kw)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


# ------------------------------------------------- [agent], [influx], [drill]

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
    "influx": {  # credentials never come from the file (UNVEIL_INFLUX_TOKEN ...)
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


def _checked(path: Path, name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The table's values, each of its key's type (lists and tables of non-empty strings)."""
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
    return values


def _agent(p: Path, raw: dict[str, Any]) -> AgentConfig:
    values = _checked(p, "agent", raw)
    try:
        for key in _POSITIVE:
            if key in values:
                check_seconds(values[key], f"[agent].{key}")
        if "compact_every_s" in values:
            check_seconds(values["compact_every_s"], "[agent].compact_every_s", zero=True)
        rows = values.get("max_buffered_rows", 1)
        if isinstance(rows, bool) or rows < 1:
            raise ValueError(f"[agent].max_buffered_rows must be a positive number of rows, got {rows!r}")
    except ValueError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    for key in ("collectors", "cgroup_paths"):
        if key in values:
            values[key] = tuple(values[key])
    agent = AgentConfig(**values)
    _validate(p, "agent", agent.validate)
    return agent


def _validate(p: Path, section: str, check: Any) -> Any:
    """``check()``, its ValueError a ConfigError naming the file and the section."""
    try:
        return check()
    except (TypeError, ValueError) as exc:
        # "[scheduler]: scheduler.chunk ..." / "influx.url: ..." -> "[scheduler] chunk ...", "[influx] url: ..."
        msg = re.sub(rf"^(\[{section}\]:? )?{section}\.", f"[{section}] ", str(exc))
        raise ConfigError(f"{p}: {msg if msg.startswith('[') else f'[{section}] {msg}'}") from None


# --------------------------------------------------------------------- load


def _table(p: Path, raw: dict[str, Any], name: str) -> dict[str, Any]:
    val = raw.get(name, {})
    if not isinstance(val, dict):
        raise ConfigError(f"{p}: [{name}] must be a table")
    return val


def load(path: str | os.PathLike[str] | None = None, *, analysis: bool = True) -> Config:
    """Load and validate the config file (``path``, else $UNVEIL_CONFIG, else defaults) into
    one tree. ``analysis=False`` (the agent) checks the key names of ``[analytics]`` and
    ``[scheduler]`` but does not build them (that imports scikit-learn)."""
    if path is None:
        env = os.environ.get("UNVEIL_CONFIG")
        path = env if env else None
    cfg = Config()
    raw: dict[str, Any] = {}
    p = Path("config")
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
        for key in raw:
            if key not in SECTIONS:
                raise ConfigError(f"{p}: unknown top-level key {key!r} (known: {', '.join(sorted(SECTIONS))})")
        cfg.source = p
    cfg.lake = _lake_path(p, raw.get("lake", {}))
    cfg.lake_endpoint, cfg.lake_region, cfg.lake_state = _lake_storage(p, raw.get("lake", {}))
    tables = {name: _table(p, raw, name) for name in SECTIONS if name != "lake"}
    cfg.agent = _agent(p, tables["agent"])
    influx = _checked(p, "influx", tables["influx"])
    if influx.get("api", "auto") not in ("auto", "v1", "v2"):
        raise ConfigError(f"{p}: [influx].api must be auto, v1 or v2, got {influx['api']!r}")
    env_url = os.environ.get("UNVEIL_INFLUX_URL")
    if env_url:
        influx["url"] = env_url
    cfg.influx = _validate(p, "influx", lambda: InfluxConfig(**influx))
    cfg.drill = DrillSection(**_checked(p, "drill", tables["drill"]))
    cfg.remediation = _validate(p, "remediation", lambda: ExecutorConfig.from_mapping(
        tables["remediation"], where="[remediation]"))
    sched = tables["scheduler"]
    cfg.every = _validate(p, "scheduler", lambda: duration(sched.get("every", 60), "[scheduler].every"))
    if analysis:
        cfg._analytics, cfg._sweep = _sweep(p, tables["analytics"], sched, cfg.remediation)
    else:
        for name, known in (("analytics", ANALYTICS_KEYS), ("scheduler", SCHEDULER_KEYS)):
            bad = sorted(set(tables[name]) - known)
            if bad:
                raise ConfigError(f"{p}: [{name}]: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    env_lake = os.environ.get("UNVEIL_LAKE")
    if env_lake:
        cfg.lake = env_lake
    return cfg


def _sweep(p: Path, analytics: dict[str, Any], sched: dict[str, Any],
           rem: ExecutorConfig) -> tuple[AnalyticsConfig, SweepConfig]:
    """``[analytics]`` and ``[scheduler]`` into one SweepConfig. One warm-up key: ``[analytics]
    warmup`` sets both the analytics' (a host's first windows are never judged) and the
    knowledge-base detector's (statistical flags after a host's data starts or resumes are
    dropped). The old ``[scheduler] warmup`` still sets the detector's alone, as before, with
    a warning."""
    sched = {k: v for k, v in sched.items() if k != "every"}
    if "warmup" in sched:
        warnings.warn(f"{p}: [scheduler] warmup is deprecated: set [analytics] warmup only (one warm-up for "
                      "the statistical and the knowledge-base detectors)", FutureWarning, stacklevel=3)
    elif "warmup" in analytics:
        sched = {**sched, "warmup": analytics["warmup"]}
    a = _validate(p, "analytics", lambda: analytics_from_mapping(analytics))
    sweep = _validate(p, "scheduler", lambda: SweepConfig.from_mapping(sched, analytics=a,
                                                                     auto_remediate=rem.auto_remediate))
    return a, replace(sweep, remediation_root=rem.root)


def _lake_path(p: Path, lake: Any) -> str | None:
    """``[lake] path = "..."`` (or the shorthand ``lake = "..."``): a non-empty string."""
    if isinstance(lake, str):
        lake = {"path": lake}
    if not isinstance(lake, dict):
        raise ConfigError(f"{p}: [lake] must be a table with path = \"...\", got {lake!r}")
    for key in lake:
        if key not in LAKE_KEYS:
            raise ConfigError(f"{p}: unknown key [lake].{key} (known: {', '.join(LAKE_KEYS)})")
    path = lake.get("path")
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{p}: [lake].path must be a string (a directory), got {path!r}")
    return path


LAKE_KEYS = ("path", "endpoint", "region", "state")


def _lake_storage(p: Path, lake: Any) -> tuple[str | None, str | None, str | None]:
    """``[lake] endpoint`` (http(s)://host:port), ``region`` and ``state`` (a directory), for
    a lake on object storage."""
    if not isinstance(lake, dict):
        return None, None, None
    out: list[str | None] = []
    for key in ("endpoint", "region", "state"):
        v = lake.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise ConfigError(f"{p}: [lake].{key} must be a non-empty string, got {v!r}")
        out.append(v)
    endpoint, region, state = out
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{p}: [lake].endpoint must start with http:// or https://, got {endpoint!r}")
    if state is not None and state.startswith("s3://"):
        raise ConfigError(f"{p}: [lake].state must be a directory (local or shared disk), got {state!r}")
    return endpoint, region, state


def use_lake_storage(cfg: Config) -> None:
    """Point ``s3://`` lakes at the config's ``[lake] endpoint`` / ``region`` (the AWS
    variables fill in the rest)."""
    from ingest import objstore

    objstore.configure(endpoint=cfg.lake_endpoint, region=cfg.lake_region)


def resolve_lake_and_state(flag: str | None, state_flag: str | None, cfg: Config) -> str | Path:
    """:func:`resolve_lake` for the commands that also run on a lake on object storage
    (``unveil schedule``, ``agent``, ``postmortem``, ``sweep``): such a lake's local state (a sweep's
    watermarks, lock, staged outputs and remediation queue; an agent's journal; the
    post-mortems' results) goes to
    ``state_flag`` or ``[lake] state`` (required there, refused for a lake directory,
    which holds its own), and its endpoint comes from the config. Returns the URL of such
    a lake, else the directory."""
    value = flag or cfg.lake
    if not value or not value.startswith("s3://"):
        if state_flag:
            raise ConfigError("--state is for a lake on object storage (s3://...): a lake directory keeps its "
                              "state in <lake>/_state")
        return resolve_lake(flag, cfg)
    state = state_flag or cfg.lake_state
    if not state:
        raise ConfigError(f"lake {value} is on object storage: its local state (a sweep's watermarks, lock, staged "
                          "outputs and remediation queue; an agent's journal; post-mortems) needs a directory: "
                          "pass --state DIR or set [lake] state")
    from ingest import lake as lake_mod

    use_lake_storage(cfg)
    lake_mod.set_state_root(value, Path(state))
    return value


def resolve_lake(flag: str | None, cfg: Config) -> Path:
    """The lake path from the flag, else $UNVEIL_LAKE / the config file; an error when none,
    and for a lake on object storage, which only ``unveil query`` reads so far."""
    value = flag or cfg.lake
    if not value:
        raise ConfigError("no lake path: pass --lake PATH, set UNVEIL_LAKE, or set [lake] path in the config")
    if value.startswith("s3://"):
        raise ConfigError(f"lake {value} is on object storage: this command needs a lake directory (local or "
                          "shared disk): drills and remediation act on this host and keep their state there. "
                          "`unveil schedule`, `agent`, `postmortem` and `sweep` (with a state directory), "
                          "`unveil query`, `report`, `simulate` and the ingest.lake API read and write s3:// "
                          "lakes (docs/lake.md, \"Object storage\")")
    return Path(value)
