"""Configuration of the sweeps: the ``[analytics]`` and ``[scheduler]`` tables of the
config file mapped to :class:`analytics.pipeline.AnalyticsConfig`, :class:`SweepConfig`
and :class:`knowledge_base.detector.DetectionConfig` (errors name the key).

The sweep itself lives in modules of its own: :mod:`jobs.step` (the sweep step every
path judges windows with), :mod:`jobs.cycle` (the scheduler cycle), :mod:`jobs.sweep`
(``unveil sweep``), :mod:`jobs.postmortem`, :mod:`jobs.remediations` and
:mod:`jobs.writeback`; :mod:`jobs.telemetry` reads the telemetry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from analytics.pipeline import AnalyticsConfig
from ingest.influx import InfluxConfig
from knowledge_base.detector import DetectionConfig

# ----------------------------------------------------------------------- config


def _duration(v: Any, where: str, *, zero: bool = False) -> timedelta:
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


def analytics_from_mapping(d: Mapping[str, Any], where: str = "[analytics]") -> AnalyticsConfig:
    """AnalyticsConfig from the config file's ``[analytics]`` table (window_s, stride_s,
    detectors, combine, vote_k, reference, history, threshold_k, top_k, min_windows,
    min_cohort, random_state); errors name the key."""
    from analytics.features import WindowSpec

    known = {"window_s", "stride_s", "detectors", "combine", "vote_k", "reference", "history", "threshold_k",
             "top_k", "min_windows", "min_cohort", "random_state", "max_reference_rows", "one_sided",
             "activity_weight", "min_run", "cohort_by", "cohort_tolerance", "warmup", "smooth"}
    bad = sorted(set(d) - known)
    if bad:
        raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    durations = ("history", "warmup", "smooth")
    kw: dict[str, Any] = {k: v for k, v in d.items()
                          if k not in ("window_s", "stride_s", "detectors", *durations)}
    for k in ("warmup", "smooth"):
        if k in d:
            kw[k] = _duration(d[k], f"{where} {k}", zero=True)
    if "detectors" in d:
        if not isinstance(d["detectors"], list):
            raise ValueError(f"{where} detectors: expected a list of names, got {d['detectors']!r}")
        kw["detectors"] = tuple(d["detectors"])
    if "history" in d:
        kw["history"] = _duration(d["history"], f"{where} history")
    if "window_s" in d or "stride_s" in d:
        kw["window"] = WindowSpec(float(d.get("window_s", 3.0)), float(d.get("stride_s", 1.0)))
    try:
        return AnalyticsConfig(**kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class SweepConfig:
    """What a scheduled sweep does (``[scheduler]`` in the config file, see docs/operations.md)."""

    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig)
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
    # windows are judged in clock-aligned steps of this length on the data up to the step's
    # end (the live cadence): the verdict does not depend on the chunking. None: per chunk
    analysis_step: timedelta | None = timedelta(minutes=1)
    queue_remediations: bool = True
    auto_remediate: bool = False
    remediation_root: str = "/"  # [remediation] root: where scripts act (auto runs, verification rollbacks)
    influx: InfluxConfig | None = None
    kb_path: str | None = None
    compact_every: timedelta | None = timedelta(minutes=10)
    retention: Mapping[str, timedelta] = field(default_factory=dict)
    detection: DetectionConfig = field(default_factory=DetectionConfig)

    def __post_init__(self) -> None:
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
        if not 0 <= self.min_incident_s < self.max_incident.total_seconds():
            raise ValueError(f"scheduler.min_incident_s must be >= 0 and below max_incident "
                             f"({self.max_incident}), not {self.min_incident_s!r}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], *, analytics: AnalyticsConfig | None = None,
                     influx: InfluxConfig | None = None, auto_remediate: bool = False,
                     where: str = "[scheduler]") -> SweepConfig:
        """From the config file's ``[scheduler]`` table; unknown keys are an error naming them."""
        known = {"every", "chunk", "lag", "max_chunks", "incident_gap_s", "max_incident", "queue_remediations",
                 "compact_every", "retention", "kb_path", "history", "signature_detector",
                 "signature_min_confidence", "warmup", "restart_gap", "min_incident_s", "analysis_step"}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        kw: dict[str, Any] = {}
        for k in ("chunk", "lag", "max_incident"):
            if k in d:
                kw[k] = _duration(d[k], f"{where} {k}", zero=k == "lag")
        if "analysis_step" in d:
            kw["analysis_step"] = None if d["analysis_step"] in (0, "off") else _duration(
                d["analysis_step"], f"{where} analysis_step")
        if "compact_every" in d:
            kw["compact_every"] = None if d["compact_every"] in (0, "off") else _duration(
                d["compact_every"], f"{where} compact_every")
        if "retention" in d:
            r = d["retention"]
            if not isinstance(r, dict):
                raise ValueError(f"{where} retention: expected a table of table = duration, got {r!r}")
            kw["retention"] = {t: _duration(v, f"{where} retention.{t}") for t, v in r.items()}
        if "max_chunks" in d:
            kw["max_chunks"] = d["max_chunks"]
        if "incident_gap_s" in d:
            kw["incident_gap_s"] = float(d["incident_gap_s"])
        if "min_incident_s" in d:
            v = d["min_incident_s"]
            kw["min_incident_s"] = (v if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                                    else _duration(v, f"{where} min_incident_s", zero=True).total_seconds())
        if "queue_remediations" in d:
            if not isinstance(d["queue_remediations"], bool):
                raise ValueError(f"{where} queue_remediations: expected true or false")
            kw["queue_remediations"] = d["queue_remediations"]
        if "kb_path" in d:
            kw["kb_path"] = str(d["kb_path"])
        a = analytics or AnalyticsConfig()
        if "history" in d:
            a = replace(a, history=_duration(d["history"], f"{where} history"))
        kw["detection"] = detection_from_mapping(d, where)
        return cls(analytics=a, influx=influx, auto_remediate=auto_remediate, **kw)


def detection_from_mapping(d: Mapping[str, Any], where: str = "[scheduler]") -> DetectionConfig:
    """DetectionConfig from ``signature_detector`` (bool), ``signature_min_confidence``
    (0..1), ``warmup`` and ``restart_gap`` (durations; warmup may be 0) of a config table."""
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
        kw["warmup_s"] = _duration(d["warmup"], f"{where} warmup", zero=True).total_seconds()
    if "restart_gap" in d:
        kw["restart_gap_s"] = _duration(d["restart_gap"], f"{where} restart_gap").total_seconds()
    try:
        return DetectionConfig(**kw)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


__all__ = ["SweepConfig", "analytics_from_mapping", "detection_from_mapping"]
