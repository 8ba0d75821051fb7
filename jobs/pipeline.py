"""The end-to-end sweep: analyse -> match -> incidents -> remediation queueing -> write-back.

:func:`run_cycle` is one scheduler cycle: under the lake's scheduler lock it recovers an
interrupted sweep, then walks every host from its watermark to ``now - lag`` (rounded
down to the stride grid) in chunks of at most ``chunk``, and commits each chunk through
:mod:`jobs.watermarks`' staged protocol, so every window is processed exactly once.

Per chunk ``[s, e)`` of a group of hosts sharing the watermark ``s``:

* telemetry ``[s - L + 1us - history, e)`` is read from the lake (corrupt files skipped
  and returned to the caller, who warns once per file), the windows ending in ``(s, e]`` are scored (``L`` = window length:
  a window straddling ``s`` was incomplete in the previous chunk and is scored now);
* the knowledge base also runs as a *signature detector* on every window: a window is a
  finding when the statistical detectors flag it (outside the host's warm-up) or a
  signature matches it (:mod:`knowledge_base.detector`; scores get a ``kb`` row per
  window, findings' ``detectors`` a ``kb:<entry>`` tag);
* findings are matched against the knowledge base (rank-1 matched candidate stored on the
  finding: ``entry_id``, ``match_confidence``, ``match_devices``, ``match_explanation``);
* findings are grouped into incidents (gap <= ``incident_gap_s``, at most
  ``max_incident`` long, raised once they span ``min_incident_s``); a matched incident is
  written with ``state = 'open'`` as soon as it has persisted and again each chunk it
  changes (same ``incident_id``, ``updated`` = the chunk's end), and with ``state =
  'closed'`` once no later window can join it (unmatched ones only then); the start of a
  still-open segment is carried in the host's state (``open_since``) and its findings are
  read back from the lake by the next chunk;
* matched incidents whose KB entry names a script, open ones included, are queued for
  remediation (dry-run proposals, one per cause: later rows and fragments attach);
* features, scores, findings, incidents and remediations go to the lake; findings,
  incidents and remediations also to InfluxDB (``unveil_findings``, ``unveil_incidents``,
  ``unveil_remediations``) when a URL is configured.

:func:`postmortem` re-runs the same analysis over a past interval into a separate lake
under ``<lake>/_postmortem/<id>/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from analytics.attribution import SHARE_COLUMNS
from analytics.evaluation import DetectHook
from analytics.features import SKIPPED
from analytics.pipeline import AnalysisResult, AnalyticsConfig, analyze
from ingest import lake as lake_mod
from ingest import schema
from ingest.influx import InfluxConfig, InfluxSink, InfluxSource
from jobs import watermarks as wm
from jobs.progress import Progress
from jobs.sweep import with_time
from knowledge_base import INCIDENT_SCHEMA, build_incidents, latest_incidents, load_kb
from knowledge_base.detector import MATCH_COLUMNS, DetectionConfig, detect, empty_findings
from knowledge_base.detector import attach_matches as _attach
from knowledge_base.facts import FactError, HostFacts, fill_params, in_force
from knowledge_base.loader import KnowledgeBase
from knowledge_base.matcher import MATCH_SCHEMA, MatchConfig

log = logging.getLogger(__name__)

HOST, WS, WE = schema.HOST, "window_start", "window_end"
TS = schema.TIME_DTYPE
US = timedelta(microseconds=1)
#: downstream tables this module writes (never read as telemetry)
NOT_TELEMETRY = frozenset(SKIPPED | {"audit", "matches"})
INFLUX_MEASUREMENTS = {"findings": "unveil_findings", "incidents": "unveil_incidents",
                       "remediations": "unveil_remediations"}
# an incident's entry is a field: an open incident's best-ranked entry can change (a better
# reading joins it), and its rows must share one series to replace each other (host, status
# and start are its key: one window has one rank-1 entry, so no two incidents share them)
INFLUX_TAGS = {"findings": ("host", "reference", "entry_id"), "incidents": ("host", "status"),
               "remediations": ("host", "entry_id", "script_id", "mode")}


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


# ------------------------------------------------------------------------ times


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def floor_grid(ts: datetime, stride_s: float) -> datetime:
    """``ts`` rounded down to the stride grid (windows start on multiples of the stride)."""
    step = round(stride_s * 1e6)
    us = int((_utc(ts) - datetime(1970, 1, 1, tzinfo=UTC)) / US)
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us - us % step)


def _stamp(ts: datetime) -> str:
    return _utc(ts).strftime("%Y%m%dT%H%M%S") + (f"{ts.microsecond:06d}" if ts.microsecond else "")


# ------------------------------------------------------------------------- lake


def telemetry_tables(lake: str | os.PathLike[str]) -> list[str]:
    """Tables the analytics read as telemetry (the same rule as analytics.load_frames)."""
    return [t for t in lake_mod.tables(lake) if t not in NOT_TELEMETRY]


def fleet_hosts(lake: str | os.PathLike[str]) -> list[str]:
    out: set[str] = set()
    for t in telemetry_tables(lake):
        out.update(lake_mod.hosts(lake, t))
    return sorted(out)


def earliest(lake: str | os.PathLike[str], host: str) -> datetime | None:
    """The first telemetry time of ``host`` (from the first file of each table)."""
    best: datetime | None = None
    for t in telemetry_tables(lake):
        try:
            files = lake_mod.files(lake, t, hosts=[host])
        except lake_mod.LakeError:
            continue
        for f in files[:3]:  # the first partition holds the first rows
            try:
                v = pl.scan_parquet(f).select(pl.col(schema.TIME).min()).collect().item()
            except (OSError, pl.exceptions.PolarsError):
                continue
            if v is not None:
                v = _utc(v)
                best = v if best is None or v < best else best
    return best


def has_data(lake: str | os.PathLike[str], start: datetime, end: datetime, hosts: Sequence[str] | None) -> bool:
    """Any telemetry file in [start, end) for ``hosts`` (directory listing only)."""
    for t in telemetry_tables(lake):
        with contextlib.suppress(lake_mod.LakeError):
            if lake_mod.files(lake, t, start=start, end=end, hosts=hosts):
                return True
    return False


Corrupt = lake_mod.CorruptFileError


def merge_corrupt(into: list[Corrupt], new: Iterable[Corrupt]) -> list[Corrupt]:
    """``into`` plus the files of ``new`` it does not name yet (one entry per file)."""
    seen = {e.path for e in into}
    for e in new:
        if e.path not in seen:
            seen.add(e.path)
            into.append(e)
    return into


@dataclass
class Loaded:
    frames: dict[str, pl.LazyFrame]
    facts: pl.DataFrame | None
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped, one entry each


def load_lake(lake: str | os.PathLike[str], start: datetime, end: datetime,
              hosts: Sequence[str] | None) -> Loaded:
    """Telemetry of [start, end) read eagerly. A corrupt file (damaged pages, truncated) is
    skipped and returned in ``corrupt``, not logged: the command warns once per file."""
    found: list[Corrupt] = []
    frames: dict[str, pl.LazyFrame] = {}
    for t in telemetry_tables(lake):
        df = lake_mod.read(lake, t, start=start, end=end, hosts=hosts, on_corrupt="skip", report=found)
        if df.height:
            frames[t] = df.lazy()
    facts = None
    if "host_facts" in lake_mod.tables(lake):
        facts = lake_mod.read(lake, "host_facts", hosts=hosts, on_corrupt="skip", report=found)
    return Loaded(frames, facts, merge_corrupt([], sorted(found, key=lambda e: e.path)))


def load_influx(config: InfluxConfig, start: datetime, end: datetime, hosts: Sequence[str] | None) -> Loaded:
    """Telemetry of [start, end) read back from InfluxDB (when the lake lacks the interval)."""
    src = InfluxSource(config)
    try:
        frames: dict[str, pl.LazyFrame] = {}
        for name, m in schema.MEASUREMENTS.items():
            if m.ground_truth or name in NOT_TELEMETRY or m.tier == "static":
                continue
            df = src.read(name, start=start, end=end, hosts=hosts)
            if df.height:
                frames[name] = df.lazy()
        facts = src.read("host_facts", start=datetime(1970, 1, 1, tzinfo=UTC), end=end, hosts=hosts)
    finally:
        src.close()
    return Loaded(frames, facts if facts.height else None)


# -------------------------------------------------------------------- analysis


@dataclass
class ChunkOutput:
    features: pl.DataFrame
    scores: pl.DataFrame  # with one detector="kb" row per window when the signature detector is on
    findings: pl.DataFrame  # with the MATCH_COLUMNS
    corrupt: list[Corrupt]
    suppressed: int = 0  # statistical findings dropped by the warm-up


def _empty_findings() -> pl.DataFrame:
    return empty_findings()


def analyze_chunk(loaded: Loaded, s: datetime, e: datetime, config: AnalyticsConfig, kb: KnowledgeBase,
                  hosts: Sequence[str] | None, *, detection: DetectionConfig | None = None,
                  read_start: datetime | None = None,
                  history_known: Mapping[str, datetime] | None = None,
                  features: pl.DataFrame | None = None, past_signature_reference: bool = False) -> ChunkOutput:
    """Score the windows ending in (s, e] of ``hosts`` (None: all), run the knowledge base
    as a signature detector on each of them, and match the findings (statistical flags out
    of warm-up, or signature matches; see :mod:`knowledge_base.detector`). ``read_start``:
    when ``loaded`` starts (None: the hosts' whole data is loaded); ``history_known``: host
    -> its first telemetry time in the lake (warm-up of hosts whose start is not loaded).
    ``features``: the windows to analyse, already computed (then ``loaded.frames`` is not
    read; ``read_start`` is their first window's start). ``past_signature_reference``: the
    signature matcher judges each window against the host's own windows before ``s`` (its
    past), never the chunk's own or later windows (:class:`MatchConfig` reference_before)."""
    length = timedelta(seconds=config.window.length_s)
    if features is None and not loaded.frames:
        return ChunkOutput(pl.DataFrame(), pl.DataFrame(), _empty_findings(), loaded.corrupt)
    if features is not None and features.is_empty():
        return ChunkOutput(pl.DataFrame(), pl.DataFrame(), _empty_findings(), loaded.corrupt)
    since = s - length + US
    res: AnalysisResult = analyze(loaded.frames if features is None else {}, config, host_facts=loaded.facts,
                                  score_since=since, features=features)
    keep = (pl.col(WE) > s) & (pl.col(WE) <= e)
    if hosts is not None:
        keep = keep & pl.col(HOST).is_in(list(hosts))
    det = detect(res, loaded.facts, kb, detection or DetectionConfig(), keep=keep, frame_start=read_start,
                 history_known=history_known, window_length_s=config.window.length_s, min_cohort=config.min_cohort,
                 match_config=MatchConfig(reference_before=since) if past_signature_reference else None)
    return ChunkOutput(det.features, det.scores, det.findings, loaded.corrupt, det.suppressed)


def steps(s: datetime, e: datetime, step: timedelta) -> list[tuple[datetime, datetime]]:
    """[s, e) cut at the multiples of ``step`` (on the UTC clock, not relative to ``s``)."""
    out = []
    step_us = round(step / US)
    b = s
    while b < e:
        us = int((_utc(b) - datetime(1970, 1, 1, tzinfo=UTC)) / US)
        nxt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us - us % step_us + step_us)
        out.append((b, min(nxt, e)))
        b = nxt
    return out


def analyze_steps(loaded: Loaded, s: datetime, e: datetime, config: AnalyticsConfig, kb: KnowledgeBase,
                  hosts: Sequence[str] | None, *, step: timedelta | None, detection: DetectionConfig | None = None,
                  history_known: Mapping[str, datetime] | None = None) -> ChunkOutput:
    """:func:`analyze_chunk` of (s, e] in clock-aligned analysis steps, so the verdict does not
    depend on how a sweep cuts time into chunks: the windows ending in a step [b, b') are
    judged on the windows of ``[b - history, b')`` only (statistical references, running
    medians, cohorts: what the live scheduler sees at the step's end), the signature
    matcher against the host's own past ``[b - history, b)`` only, whether the step is
    analysed alone (the live scheduler, every minute) or inside a backfill's chunk. Features are computed once for the chunk
    (they are functions of a window's own samples) and cut per step. ``loaded`` must start
    at or before ``s - history - window length``. ``step=None``: one analysis of the whole
    chunk (faster backfills; verdicts then depend on the chunking)."""
    length = timedelta(seconds=config.window.length_s)
    if step is None:
        return analyze_chunk(loaded, s, e, config, kb, hosts, detection=detection,
                             read_start=s - length + US - config.history, history_known=history_known)
    if not loaded.frames:
        return ChunkOutput(pl.DataFrame(), pl.DataFrame(), _empty_findings(), loaded.corrupt)
    from analytics.features import compute_features

    feats = compute_features(loaded.frames, config.window, host_facts=loaded.facts)
    if feats.is_empty():
        return ChunkOutput(pl.DataFrame(), pl.DataFrame(), _empty_findings(), loaded.corrupt)
    feats = feats.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    outs: list[ChunkOutput] = []
    for b, b2 in steps(s, e, step):
        first = floor_grid(b - config.history, config.window.stride_s)
        part = feats.filter((pl.col(WS) >= first) & (pl.col(WE) <= b2))
        outs.append(analyze_chunk(loaded, b, b2, config, kb, hosts, detection=detection, read_start=first,
                                  history_known=history_known, features=part, past_signature_reference=True))
    findings = _concat([o.findings for o in outs])
    return ChunkOutput(_concat([o.features for o in outs]), _concat([o.scores for o in outs]),
                       findings if findings.height else _empty_findings(), loaded.corrupt,
                       sum(o.suppressed for o in outs))


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame()
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def attach_matches(findings: pl.DataFrame, matches: pl.DataFrame) -> pl.DataFrame:
    """``findings`` with the rank-1 matched candidate of ``matches`` in MATCH_COLUMNS."""
    return _attach(findings, matches)


def matches_of(findings: pl.DataFrame) -> pl.DataFrame:
    """The matcher's rank-1 matched rows back from findings carrying MATCH_COLUMNS."""
    if findings.is_empty() or "entry_id" not in findings.columns:
        return pl.DataFrame(schema=MATCH_SCHEMA)
    m = findings.filter(pl.col("entry_id").is_not_null())
    return m.select(
        HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS), pl.lit(1, pl.Int32).alias("rank"), "entry_id",
        pl.lit(None, pl.String).alias("label_type"), pl.col("match_confidence").alias("confidence"),
        pl.lit(True).alias("matched"), pl.col("match_devices").alias("devices"),
        pl.lit([], pl.List(pl.String)).alias("matched_signals"), pl.lit([], pl.List(pl.String)).alias("missing_signals"),
        pl.lit([], pl.List(pl.String)).alias("contradicted_signals"), pl.col("match_explanation").alias("explanation"),
    ).cast(MATCH_SCHEMA)  # type: ignore[arg-type]


# -------------------------------------------------------------------- incidents


def segment(findings: pl.DataFrame, gap_s: float, max_len: timedelta) -> list[pl.DataFrame]:
    """Findings cut into incidents: a new one starts after a gap > ``gap_s`` or once the
    current one is ``max_len`` long (so a permanent problem is reported every max_len).
    Deterministic: the same findings always give the same cuts."""
    out: list[pl.DataFrame] = []
    gap = timedelta(seconds=gap_s)
    for _, rows in findings.sort(HOST, WS).group_by(HOST, maintain_order=True):
        starts, ends = rows[WS].to_list(), rows[WE].to_list()
        cut = 0
        seg_start, prev_end = starts[0], ends[0]
        for i in range(1, rows.height):
            if starts[i] > prev_end + gap or starts[i] - seg_start >= max_len:
                out.append(rows.slice(cut, i - cut))
                cut, seg_start = i, starts[i]
            prev_end = max(prev_end, ends[i])
        out.append(rows.slice(cut))
    return out


def incidents_of(findings: pl.DataFrame, kb: KnowledgeBase, *, gap_s: float, max_len: timedelta,
                 horizon: datetime | None, window_length: timedelta,
                 stride: timedelta, min_incident_s: float = 0.0) -> tuple[pl.DataFrame, dict[str, datetime]]:
    """(incidents, host -> start of its still-open segment). With ``horizon=None`` every
    incident is closed (a post-mortem over a finished interval).

    A segment that may still grow (a later window can join it) is *open*: its matched
    incidents that have persisted are returned with ``state = 'open'`` (updated = the
    horizon), so they are visible while they last; its unmatched windows wait for the close
    (a matched span may still absorb them). Closed segments give ``state = 'closed'`` rows.
    An incident persisted when it spans at least ``min_incident_s`` (first window's start to
    last window's end); a shorter one is never raised, open or closed."""
    rows: list[pl.DataFrame] = []
    open_since: dict[str, datetime] = {}
    if findings.is_empty():
        return pl.DataFrame(schema=INCIDENT_SCHEMA), open_since
    findings = findings.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    gap = timedelta(seconds=gap_s)
    persisted = (pl.col("end") - pl.col("start")) >= timedelta(seconds=min_incident_s)
    for seg in segment(findings, gap_s, max_len):
        host = str(seg[HOST][0])
        start, end = seg[WS].min(), seg[WE].max()
        assert isinstance(start, datetime) and isinstance(end, datetime)
        # the next window not yet scored starts at horizon - L + stride: can it still join?
        may_grow = (horizon is not None and end + gap >= horizon - window_length + stride
                    and horizon - start < max_len)
        inc = build_incidents(matches_of(seg), seg.drop([c for c in MATCH_COLUMNS if c in seg.columns]), kb,
                              max_gap_s=1e9)  # segment() already cut it: one incident per entry
        inc = inc.filter(persisted)
        if may_grow:
            open_since[host] = min(open_since.get(host, start), start)
            inc = inc.filter(pl.col("status") == "matched").with_columns(
                pl.lit("open").alias("state"), pl.lit(horizon).cast(TS).alias("updated"))
        elif horizon is not None:
            inc = inc.with_columns(pl.lit(horizon).cast(TS).alias("updated"))
        rows.append(inc)
    out = pl.concat(rows) if rows else pl.DataFrame(schema=INCIDENT_SCHEMA)
    return out.sort(HOST, "start", "incident_id"), open_since


# ------------------------------------------------------------------ remediation


def queue_remediations(lake: str | os.PathLike[str], incidents: pl.DataFrame, facts: pl.DataFrame | None,
                       kb: KnowledgeBase, queue_path: Path | None = None, *,
                       now: datetime | None = None) -> pl.DataFrame:
    """Propose (dry-run, idempotent) the KB remediation of every matched incident; returns the
    ``remediations`` rows of those actions (time = when proposed).

    Per cause, not per incident fragment: while an action of the same entry on the same host is
    open (proposed, approved, running, verifying) the incident attaches to it; a new proposal
    after a succeeded fix links it (came back after N s). ``{fact_before:...}`` parameters are
    the values in force before the incident's onset (past the entry's fault values); a
    proposal that would set a fault value is refused, and one whose targets the host already
    has at ``now`` (the sweep's horizon; None: the latest facts) is not queued. Both are
    logged."""
    from remediation.errors import ParamError
    from remediation.queue import Queue, default_path

    matched = incidents.filter((pl.col("status") == "matched") & pl.col("entry_id").is_not_null())
    if matched.is_empty():
        return pl.DataFrame()
    ids: list[int] = []
    with Queue(queue_path or default_path(Path(lake))) as q:
        for inc in matched.iter_rows(named=True):
            entry = kb.by_id.get(inc["entry_id"])
            if entry is None or entry.remediation is None or entry.remediation.script is None:
                continue
            rem = entry.remediation
            script = entry.remediation.script
            # one action per cause: a fragment of a fault already answered joins that action
            known = q.attach_to_open(host=inc[HOST], entry_id=entry.id, incident_id=inc["incident_id"],
                                     onset=inc["start"])
            if known is not None:
                if known.incident_id != inc["incident_id"]:
                    log.info("incident %s (%s on %s): attached to remediation %d (%s)", inc["incident_id"],
                             entry.id, inc[HOST], known.id, known.state)
                ids.append(known.id)
                continue
            devices = list(inc["devices"] or [])
            device = devices[0] if devices else ""
            hf = HostFacts.from_frame(facts, inc[HOST], inc["start"], onset=inc["start"])
            try:
                params = fill_params(rem.params, device, hf, fault_values=rem.fault_values)
                current = HostFacts.from_frame(facts, inc[HOST], now, with_before=False)
                if in_force(rem.params, params, device, current):
                    log.info("incident %s (%s on %s): remediation %s %s not queued: already in force on the host",
                             inc["incident_id"], entry.id, inc[HOST], rem.script, params)
                    continue
                verification = entry.verification.spec(devices) if entry.verification is not None else None
                a = q.propose(host=inc[HOST], entry_id=entry.id, incident_id=inc["incident_id"],
                              script_id=script, params=params, mode=rem.mode, verification=verification,
                              actor="scheduler", fault_values=rem.fault_values, attach=True, onset=inc["start"])
                ids.append(a.id)
            except (FactError, ParamError, ValueError) as exc:
                log.warning("incident %s (%s on %s): remediation %s not queued: %s", inc["incident_id"],
                            entry.id, inc[HOST], rem.script, exc)
        frame = q.to_frame()
    rows = frame.filter(pl.col("action_id").is_in(ids))
    return rows.with_columns(pl.col("created").alias(schema.TIME)).select(schema.TIME, pl.exclude(schema.TIME))


# -------------------------------------------------------------------- write-back


def _host_of(path: Path) -> str | None:
    return next((p[5:] for p in path.parts if p.startswith("host=")), None)


def _table_of(lake: Path, path: Path) -> str:
    return path.relative_to(lake).parts[0]


def influx_frame(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """A downstream table as InfluxDB can take it: lists joined with ',', structs reduced
    to the first factor's feature name, everything else as is."""
    exprs = []
    for c, dt in df.schema.items():
        if c == "top_factors":
            exprs.append(pl.col(c).list.first().struct.field("feature").alias("top_factor"))
        elif isinstance(dt, pl.List):
            exprs.append(pl.col(c).cast(pl.List(pl.String)).list.join(",").alias(c))
        elif isinstance(dt, pl.Struct | pl.Array):
            continue
        else:
            exprs.append(pl.col(c))
    return df.select(exprs)


class WriteBack:
    """Publishes a sweep's findings, incidents and remediations to InfluxDB (idempotent:
    the same point written twice is stored once)."""

    def __init__(self, lake: str | os.PathLike[str], influx: InfluxConfig | None) -> None:
        self.lake = Path(lake)
        self.sink = InfluxSink(influx) if influx is not None else None
        self.points = 0

    def __call__(self, pub: wm.Published) -> None:
        if self.sink is None:
            return
        try:
            self._write(pub)
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            # an exporter never stops the pipeline: the lake has the rows; say what is missing
            log.error("write-back of sweep %s to InfluxDB failed (the lake has its rows): %s", pub.sweep_id, exc)

    def _write(self, pub: wm.Published) -> None:
        assert self.sink is not None
        for path in pub.files:
            table = _table_of(self.lake, path)
            if table not in INFLUX_MEASUREMENTS:
                continue
            df = pl.read_parquet(path)
            host = _host_of(path)
            if host is not None and HOST not in df.columns:
                df = df.with_columns(pl.lit(host).alias(HOST))
            self._send(table, df)
        self.sink.flush()

    def _send(self, table: str, df: pl.DataFrame) -> None:
        assert self.sink is not None
        out = influx_frame(table, df)
        tags = [t for t in INFLUX_TAGS[table] if t in out.columns]
        self.sink.write(INFLUX_MEASUREMENTS[table], out, tags=tags)
        self.points += out.height

    def write_rows(self, table: str, df: pl.DataFrame) -> None:
        """Mirror rows that reach the lake outside a sweep's publication (the remediations'
        state changes the cycle exports at its end); a failure is logged like a sweep's."""
        if self.sink is None or df.is_empty():
            return
        try:
            self._send(table, df)
            self.sink.flush()
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            log.error("write-back of %d %s row(s) to InfluxDB failed (the lake has them): %s", df.height, table, exc)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


# ------------------------------------------------------------------------ cycle


@dataclass
class ChunkSummary:
    sweep_id: str
    start: datetime
    end: datetime
    hosts: list[str]
    windows: int = 0
    findings: int = 0
    incidents: int = 0
    remediations: int = 0


@dataclass
class CycleSummary:
    horizon: datetime | None = None
    chunks: list[ChunkSummary] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped this cycle, one entry each
    caught_up: bool = True
    influx_points: int = 0
    verifications: dict[str, int] = field(default_factory=dict)  # concluded this cycle: state -> count
    remediation_rows: int = 0  # action snapshots appended to the remediations table at the cycle's end

    @property
    def windows(self) -> int:
        return sum(c.windows for c in self.chunks)

    @property
    def findings(self) -> int:
        return sum(c.findings for c in self.chunks)

    @property
    def incidents(self) -> int:
        return sum(c.incidents for c in self.chunks)


def sweep_id(start: datetime, end: datetime, hosts: Sequence[str]) -> str:
    """Deterministic: a retry of the same chunk reuses (and first clears) its staging dir."""
    h = hashlib.sha1(",".join(sorted(hosts)).encode()).hexdigest()[:8]
    return f"sw-{_stamp(start)}-{_stamp(end)}-{h}"


def _read_open_findings(lake: Path, marks: Mapping[str, wm.HostMark], hosts: Sequence[str],
                        before: datetime, corrupt: list[Corrupt]) -> pl.DataFrame:
    parts = []
    if "findings" not in lake_mod.tables(lake):
        return _empty_findings()
    for h in hosts:
        since = marks[h].open_since if h in marks else None
        if since is None:
            continue
        df = lake_mod.read(lake, "findings", start=since, end=before, hosts=[h], on_corrupt="skip", report=corrupt)
        if df.height:
            parts.append(df.drop(schema.TIME))
    if not parts:
        return _empty_findings()
    return pl.concat(parts, how="diagonal_relaxed")


def _changed_incidents(lake: Path, marks: Mapping[str, wm.HostMark], hosts: Sequence[str],
                       incidents: pl.DataFrame, corrupt: list[Corrupt]) -> pl.DataFrame:
    """``incidents`` without the rows that repeat the latest stored row of the same incident
    (an open incident no window joined since the last sweep): the table gets a row per change."""
    if incidents.is_empty() or "incidents" not in lake_mod.tables(lake):
        return incidents
    parts = []
    for h in hosts:
        since = marks[h].open_since if h in marks else None
        if since is not None:  # only incidents of a carried (open) segment can have rows already
            parts.append(lake_mod.read(lake, "incidents", start=since, hosts=[h], on_corrupt="skip", report=corrupt))
    have = pl.concat([p for p in parts if p.height], how="diagonal_relaxed") if any(p.height for p in parts) else None
    if have is None:
        return incidents
    key = ["incident_id", "state", "end", "n_windows"]
    last = latest_incidents(have).select(*key)
    return incidents.join(last.with_columns(pl.col("end").cast(TS)), on=key, how="anti", nulls_equal=True)


def _new_remediation_rows(lake: Path, rows: pl.DataFrame, corrupt: list[Corrupt]) -> pl.DataFrame:
    """``rows`` (queue_remediations') without the actions whose row the lake already has
    unchanged: an open incident asks for its proposal every sweep, the table gets it once."""
    if rows.is_empty() or "remediations" not in lake_mod.tables(lake):
        return rows
    have = lake_mod.read(lake, "remediations", columns=["action_id", "updated", "attached_incidents"],
                         on_corrupt="skip", report=corrupt)
    if have.is_empty():
        return rows
    return rows.join(have.select("action_id", pl.col("updated").cast(rows.schema["updated"]),
                                 "attached_incidents").unique(),
                     on=["action_id", "updated", "attached_incidents"], how="anti", nulls_equal=True)


def process_chunk(lake: str | os.PathLike[str], cfg: SweepConfig, kb: KnowledgeBase, hosts: Sequence[str],
                  s: datetime, e: datetime, marks: Mapping[str, wm.HostMark], hook: wm.PublishHook | None,
                  queue_path: Path | None = None,
                  history_known: dict[str, datetime] | None = None
                  ) -> tuple[ChunkSummary, dict[str, wm.HostMark], list[Corrupt]]:
    """Analyse, stage, seal and publish one chunk; returns its summary and the new marks.
    ``history_known`` caches each host's first telemetry time (warm-up); filled here."""
    lake_p = Path(lake)
    a = cfg.analytics
    length, stride = timedelta(seconds=a.window.length_s), timedelta(seconds=a.window.stride_s)
    sid = sweep_id(s, e, hosts)
    first = s - length + US
    if has_data(lake, first, e, hosts):  # nothing to score: skip the (history) read
        loaded = load_lake(lake, first - a.history, e, hosts)
    else:
        loaded = Loaded({}, None)
    known = _first_times(lake, hosts, history_known)
    out = analyze_steps(loaded, s, e, a, kb, hosts, step=cfg.analysis_step, detection=cfg.detection,
                        history_known=known)
    corrupt = list(out.corrupt)
    prior = _read_open_findings(lake_p, marks, hosts, s, corrupt)
    all_findings = pl.concat([prior, out.findings], how="diagonal_relaxed") if prior.height else out.findings
    incidents, open_since = incidents_of(all_findings, kb, gap_s=cfg.incident_gap_s, max_len=cfg.max_incident,
                                         horizon=e, window_length=length, stride=stride,
                                         min_incident_s=cfg.min_incident_s)
    incidents = _changed_incidents(lake_p, marks, hosts, incidents, corrupt)
    remediations = pl.DataFrame()
    if cfg.queue_remediations and incidents.height:
        # open incidents too: a proposal is due as soon as the fault has persisted
        remediations = _new_remediation_rows(
            lake_p, queue_remediations(lake, incidents, loaded.facts, kb, queue_path, now=e), corrupt)
    staged = wm.StagedSweep(lake, sid)
    if out.features.height:
        staged.write("features", with_time(out.features))
        staged.write("scores", with_time(out.scores))
    if out.findings.height:
        staged.write("findings", with_time(out.findings))
    if incidents.height:
        staged.write("incidents", incidents.select(pl.col("start").alias(schema.TIME), pl.all()))
    if remediations.height:
        staged.write("remediations", remediations)
    wm.checkpoint("before_seal")
    new = {h: wm.HostMark(e, open_since.get(h)) for h in hosts}
    summary = ChunkSummary(sid, s, e, list(hosts), out.features.height, out.findings.height, incidents.height,
                           remediations.height)
    staged.seal(new, {"start": s.isoformat(), "end": e.isoformat(), "windows": summary.windows,
                      "findings": summary.findings, "incidents": summary.incidents})
    wm.checkpoint("after_seal")
    wm.publish(lake, sid, hook)
    log.info("sweep %s: %s..%s %d host(s): %d windows, %d findings, %d incidents, %d remediations", sid,
             s.isoformat(), e.isoformat(), len(hosts), summary.windows, summary.findings, summary.incidents,
             summary.remediations)
    return summary, new, merge_corrupt([], corrupt)


def _first_times(lake: str | os.PathLike[str], hosts: Sequence[str] | None,
                 cache: dict[str, datetime] | None = None) -> dict[str, datetime]:
    """host -> its first telemetry time in the lake (cached: it never moves later)."""
    cache = {} if cache is None else cache
    for h in hosts or fleet_hosts(lake):
        if h not in cache:
            t = earliest(lake, h)
            if t is not None:
                cache[h] = t
    return cache


def initial_marks(lake: str | os.PathLike[str], cfg: SweepConfig, hosts: Sequence[str],
                  marks: Mapping[str, wm.HostMark]) -> dict[str, wm.HostMark]:
    """Committed marks plus a starting mark for every host never swept."""
    out = dict(marks)
    stride = cfg.analytics.window.stride_s
    for h in hosts:
        if h in out:
            continue
        t0 = cfg.start_at if cfg.start_at is not None else earliest(lake, h)
        if t0 is not None:
            out[h] = wm.HostMark(floor_grid(t0, stride))
    return out


def _chunks_left(marks: Mapping[str, wm.HostMark], horizon: datetime, chunk: timedelta) -> int:
    behind = [m.watermark for m in marks.values() if m.watermark < horizon]
    if not behind:
        return 0
    return max(1, math.ceil((horizon - min(behind)) / chunk))


def run_cycle(lake: str | os.PathLike[str], cfg: SweepConfig | None = None, *, now: datetime | None = None,
              until: datetime | None = None, hosts: Sequence[str] | None = None,
              progress: bool | None = None, queue_path: Path | None = None,
              should_stop: Callable[[], bool] | None = None) -> CycleSummary | None:
    """One scheduler cycle (see the module doc). Returns None when another process holds the
    lake's scheduler lock (this cycle is skipped, with a log line). ``should_stop`` is asked
    between chunks (SIGTERM during a long catch-up stops after the current chunk)."""
    cfg = cfg or SweepConfig()
    lake_p = Path(lake)
    if not lake_p.is_dir():
        raise ValueError(f"lake {lake_p} does not exist or is not a directory")
    with wm.scheduler_lock(lake_p) as got:
        if not got:
            log.warning("another scheduler holds %s; skipping this cycle",
                        wm.state_dir(lake_p) / wm.LOCK)
            return None
        wm.checkpoint("after_lock")
        kb = load_kb(cfg.kb_path) if cfg.kb_path else load_kb()
        hook = WriteBack(lake_p, cfg.influx)
        summary = CycleSummary()
        try:
            summary.recovered = wm.recover(lake_p, hook)
            stride = cfg.analytics.window.stride_s
            wanted = list(hosts) if hosts is not None else fleet_hosts(lake_p)
            marks = initial_marks(lake_p, cfg, wanted, wm.load(lake_p))
            marks = {h: m for h, m in marks.items() if h in wanted}
            live = _utc(now or datetime.now(UTC)) - cfg.lag
            horizon = floor_grid(live, stride)
            if cfg.analysis_step is not None:
                # whole analysis steps only, so each step is judged once on all its data (as a
                # backfill judges it); but data that does not yet complete a step past every
                # host's watermark (a host's first seconds) is not held back
                whole = floor_grid(live, cfg.analysis_step.total_seconds())
                if any(m.watermark < whole for m in marks.values()):
                    horizon = whole
            if until is not None:
                horizon = min(horizon, _utc(until))
            horizon = floor_grid(horizon, stride)
            summary.horizon = horizon
            first_times: dict[str, datetime] = {}
            total = _chunks_left(marks, horizon, cfg.chunk)
            if cfg.max_chunks is not None:
                total = min(total, cfg.max_chunks)
            with Progress(total, "sweep", unit="chunks", enabled=progress) as bar:
                for group, s, e in _plan(marks, horizon, cfg.chunk):
                    if cfg.max_chunks is not None and len(summary.chunks) >= cfg.max_chunks:
                        summary.caught_up = False
                        log.info("max_chunks=%d reached: the rest of the backlog waits for the next cycle",
                                 cfg.max_chunks)
                        break
                    if should_stop is not None and should_stop():
                        summary.caught_up = False
                        break
                    chunk, new, corrupt = process_chunk(lake_p, cfg, kb, group, s, e, marks, hook, queue_path,
                                                        first_times)
                    marks.update(new)
                    summary.chunks.append(chunk)
                    merge_corrupt(summary.corrupt, corrupt)
                    bar.advance(detail=f"{e.isoformat()} {len(group)} host(s)")
            if cfg.auto_remediate:
                _auto_remediate(lake_p, queue_path, cfg.remediation_root)
            summary.verifications = _conclude_verifications(lake_p, queue_path, now or datetime.now(UTC),
                                                            cfg.remediation_root)
            try:
                summary.remediation_rows = export_remediations(
                    lake_p, queue_path, mirror=lambda df: hook.write_rows("remediations", df))
            except (lake_mod.LakeError, OSError) as exc:  # the next cycle exports what is still missing
                log.error("exporting the remediation queue to the lake failed: %s", exc)
            summary.influx_points = hook.points
        finally:
            hook.close()
        return summary


def _plan(marks: dict[str, wm.HostMark], horizon: datetime,
          chunk: timedelta) -> Iterator[tuple[list[str], datetime, datetime]]:
    """Chunks in time order: the hosts furthest behind first, up to the next host's mark,
    so hosts at the same watermark are analysed together (cohort references need peers).
    ``marks`` is read afresh after each yield (the caller updates it)."""
    while True:
        behind = {h: m.watermark for h, m in marks.items() if m.watermark < horizon}
        if not behind:
            return
        s = min(behind.values())
        group = sorted(h for h, w in behind.items() if w == s)
        e = min([s + chunk, horizon, *[w for w in behind.values() if w > s]])
        yield group, s, e


def _auto_remediate(lake: Path, queue_path: Path | None, root: str = "/") -> None:
    from remediation.executor import Executor, ExecutorConfig
    from remediation.queue import Queue, default_path

    with Queue(queue_path or default_path(lake)) as q:
        ran = Executor(q, ExecutorConfig(root=root, auto_remediate=True)).auto_run()
    if ran:
        log.info("auto-remediation ran %d action(s)", len(ran))


def export_remediations(lake: str | os.PathLike[str], queue_path: Path | None = None, *,
                        mirror: Callable[[pl.DataFrame], None] | None = None) -> int:
    """The ``remediations`` table follows the queue: one row (time = its ``updated``) for every
    action changed since the newest row the lake has of it (a state change, a verdict, an
    attached incident). Readers take each action's latest row. Returns the rows appended.

    ``mirror`` (the InfluxDB write-back) gets the rows before the lake does: a crash between
    the two sends them again next cycle, the same points, which InfluxDB stores once."""
    from remediation.queue import Queue, default_path

    lake_p = Path(lake)
    qpath = queue_path or default_path(lake_p)
    if not qpath.is_file():
        return 0
    with Queue(qpath) as q:
        frame = q.to_frame()
    if frame.is_empty():
        return 0
    if "remediations" in lake_mod.tables(lake_p):
        have = lake_mod.read(lake_p, "remediations", columns=["action_id", "updated"], on_corrupt="skip")
        seen = have.group_by("action_id").agg(pl.col("updated").max().alias("seen"))
        frame = frame.join(seen, on="action_id", how="left").filter(
            pl.col("seen").is_null() | (pl.col("updated") > pl.col("seen"))).drop("seen")
    if frame.is_empty():
        return 0
    rows = frame.with_columns(pl.col("updated").alias(schema.TIME)).select(schema.TIME, pl.exclude(schema.TIME))
    if mirror is not None:
        mirror(rows)
    lake_mod.write_table(lake_p, "remediations", rows)
    return frame.height


def _conclude_verifications(lake: Path, queue_path: Path | None, now: datetime, root: str) -> dict[str, int]:
    """Each cycle: judge the verifying actions that are due (jobs.verification); returns
    outcome state -> count. A failure here is logged and does not undo the cycle's sweeps."""
    from jobs.verification import conclude_verifications
    from remediation.errors import RemediationError

    try:
        outcomes = conclude_verifications(lake, queue_path, now=_utc(now), root=root)
    except (RemediationError, lake_mod.LakeError, OSError) as exc:
        log.error("concluding remediation verifications failed (retried next cycle): %s", exc)
        return {}
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.state != "verifying":
            counts[o.state] = counts.get(o.state, 0) + 1
    return counts


def maintain(lake: str | os.PathLike[str], cfg: SweepConfig) -> dict[str, Any]:
    """Compaction of every table, then retention per configured table."""
    out: dict[str, Any] = {}
    stats = lake_mod.compact(lake)
    out["compaction"] = {"merges": stats.merges, "files_before": stats.files_before, "files_after": stats.files_after}
    removed = {}
    for table, keep in cfg.retention.items():
        if table in lake_mod.tables(lake):
            removed[table] = lake_mod.retention(lake, table, keep=keep)
    out["retention"] = removed
    log.info("maintenance: %s", out)
    return out


# ------------------------------------------------------------------ evaluation


def eval_detector(kb: KnowledgeBase, cfg: SweepConfig | None = None,
                  lake: str | os.PathLike[str] | None = None) -> DetectHook:
    """The sweep's verdict as an :data:`analytics.evaluation.DetectHook`: warm-up, the
    signature detector when the combination has it (``KB`` alone: statistical findings
    dropped), matching, and incidents as a post-mortem builds them, so ``unveil eval``
    measures what sweeps report: windows starting at or after ``score_since`` (None: all of
    ``result.features``). ``lake``: read each host's first telemetry time there."""
    from analytics.evaluation import Detected

    cfg = cfg or SweepConfig()
    a = cfg.analytics
    label_of = {e.id: e.label_type for e in kb}
    known = _first_times(lake, None) if lake is not None else None
    cache: dict[int, pl.DataFrame] = {}

    def hook(result: AnalysisResult, host_facts: pl.DataFrame | None, spec: Any, *,
             frame_start: datetime | None = None, score_since: datetime | None = None) -> Detected:
        det_cfg = replace(cfg.detection, signature=bool(spec.signature))
        if not spec.statistical:
            result = AnalysisResult(result.features, result.scores, result.findings.clear())
        keep = None if score_since is None else pl.col(WS) >= score_since
        det = detect(result, host_facts, kb, det_cfg, keep=keep, frame_start=frame_start, history_known=known,
                     window_length_s=a.window.length_s, min_cohort=a.min_cohort,
                     signature=cache.get(id(result.features)))
        if det_cfg.signature:
            cache.clear()
            cache[id(result.features)] = det.signature
        incidents, _ = incidents_of(det.findings, kb, gap_s=cfg.incident_gap_s, max_len=cfg.max_incident,
                                    horizon=None, window_length=timedelta(seconds=a.window.length_s),
                                    stride=timedelta(seconds=a.window.stride_s), min_incident_s=cfg.min_incident_s)
        f = det.findings
        matches = f.filter(pl.col("entry_id").is_not_null()).select(
            HOST, pl.col(WS).cast(TS),
            pl.col("entry_id").replace_strict(label_of, default=pl.col("entry_id"), return_dtype=pl.String)
            .alias("match_type"), pl.col("match_confidence").alias("confidence"))
        return Detected(f.select(HOST, pl.col(WS).cast(TS)), matches, incidents)

    return hook


# ------------------------------------------------------------------- post-mortem

POSTMORTEM_DIR = "_postmortem"
_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")
# An id names one directory under <lake>/_postmortem/, never a path: ASCII letters, digits,
# '_', '.', '-', starting with a letter or digit (so no '/', '..', hidden '.tmp-'/'.old-'
# names or option-like '-x').
_PM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


@dataclass
class PostmortemResult:
    pm_id: str
    path: Path  # a lake of its own: features, scores, findings, incidents
    hosts: list[str]
    start: datetime
    end: datetime
    source: str  # "lake" | "influxdb"
    windows: int = 0
    findings: int = 0
    incidents: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INCIDENT_SCHEMA))
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped, one entry each


def postmortem_id(hosts: Sequence[str], start: datetime, end: datetime, label: str | None = None) -> str:
    base = f"pm-{label}" if label else f"pm-{'+'.join(sorted(hosts))}-{_stamp(start)}-{_stamp(end)}"
    return _ID_RE.sub("_", base)[:200]


def postmortem_dir(lake: str | os.PathLike[str], pm_id: str) -> Path:
    """``<lake>/_postmortem/<pm_id>``, after checking the id against a strict pattern and
    that the directory (symlinks resolved) lies inside the lake. Touches nothing."""
    if not isinstance(pm_id, str) or not _PM_ID.fullmatch(pm_id):
        raise ValueError(f"bad post-mortem id {pm_id!r}: 1-200 of A-Z a-z 0-9 _ . - starting with a letter or "
                         f"digit (it names a directory under {Path(lake) / POSTMORTEM_DIR})")
    root = Path(lake).resolve()
    final = Path(lake) / POSTMORTEM_DIR / pm_id
    for p in (final.parent, final):  # a symlinked _postmortem/ or <id> must not lead out
        real = p.resolve()
        if not real.is_relative_to(root):
            raise ValueError(f"post-mortem id {pm_id!r}: {p} resolves to {real}, outside the lake {root}")
    return final


def label_interval(lake: str | os.PathLike[str], label_id: str,
                   margin: timedelta) -> tuple[str, datetime, datetime]:
    """(host, start - margin, end + margin) of a row of the ``labels`` table."""
    if "labels" not in lake_mod.tables(lake):
        raise ValueError(f"lake {lake} has no labels table: use --host/--from/--to")
    df = lake_mod.read(lake, "labels").filter(pl.col("label_id") == label_id)
    if df.is_empty():
        known = lake_mod.read(lake, "labels", columns=["label_id"])["label_id"].unique().sort().head(10).to_list()
        raise ValueError(f"no label {label_id!r} in {lake}/labels (some ids: {', '.join(map(str, known))})")
    row = df.sort(schema.TIME).row(0, named=True)
    end = row["end"] or row[schema.TIME]
    return str(row[HOST]), _utc(row[schema.TIME]) - margin, _utc(end) + margin


def postmortem(lake: str | os.PathLike[str], hosts: Sequence[str], start: datetime, end: datetime,
               cfg: SweepConfig | None = None, *, pm_id: str | None = None, influx: InfluxConfig | None = None,
               peers: bool = True, progress: bool | None = None) -> PostmortemResult:
    """Re-run the analytics over [start, end) for ``hosts`` (with the other hosts of the lake
    as cohort peers when ``peers``), from the lake, or from InfluxDB when the lake holds no
    telemetry of those hosts there. Writes ``<lake>/_postmortem/<id>/`` atomically
    (replacing an earlier run of the same id)."""
    cfg = cfg or SweepConfig()
    lake_p = Path(lake)
    start, end = _utc(start), _utc(end)
    if start >= end:
        raise ValueError(f"empty interval: {start.isoformat()} is not before {end.isoformat()}")
    if not hosts:
        raise ValueError("postmortem: give at least one host")
    pid = pm_id if pm_id is not None else postmortem_id(hosts, start, end)
    final = postmortem_dir(lake_p, pid)  # before any filesystem operation
    a = cfg.analytics
    length = timedelta(seconds=a.window.length_s)
    source = "lake"
    if not (lake_p.is_dir() and has_data(lake_p, start, end, hosts)):
        if influx is None:
            raise ValueError(f"the lake {lake_p} holds no telemetry of {', '.join(hosts)} in "
                             f"[{start.isoformat()}, {end.isoformat()}) and no InfluxDB URL was given (--influx-url)")
        source = "influxdb"
    kb = load_kb(cfg.kb_path) if cfg.kb_path else load_kb()
    load_hosts = None if peers and source == "lake" else list(hosts)
    # chunks take windows ending in (s, e]: the first full window starts on the first grid
    # point at or after `start` and ends L later, so the first s is one stride before that end
    stride = timedelta(seconds=a.window.stride_s)
    grid0 = floor_grid(start + stride - US, a.window.stride_s) + length - stride
    bounds = []
    t = grid0
    while t < end:
        bounds.append((t, min(t + cfg.chunk, end)))
        t += cfg.chunk
    tmp = lake_p / POSTMORTEM_DIR / f".tmp-{pid}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    # each chunk's features and scores go to disk at once (days of windows do not fit in
    # memory); only the findings are kept to build the incidents at the end
    finds: list[pl.DataFrame] = []
    corrupt: list[Corrupt] = []
    first_times = _first_times(lake_p, load_hosts) if source == "lake" else {}
    windows = 0
    facts: pl.DataFrame | None = None
    with Progress(len(bounds), f"post-mortem {', '.join(hosts)}", unit="chunks", enabled=progress) as bar:
        for s, e in bounds:
            lo = s - length + US - a.history
            loaded = (load_lake(lake_p, lo, e, load_hosts) if source == "lake"
                      else load_influx(influx, lo, e, load_hosts))  # type: ignore[arg-type]
            out = analyze_steps(loaded, s, e, a, kb, hosts, step=cfg.analysis_step, detection=cfg.detection,
                                history_known=first_times)
            if facts is None and loaded.facts is not None:
                facts = loaded.facts.filter(pl.col(HOST).is_in(list(hosts)))
            if out.features.height:
                lake_mod.write_table(tmp, "features", with_time(out.features))
                windows += out.features.height
            if out.scores.height:
                lake_mod.write_table(tmp, "scores", with_time(out.scores))
            if out.findings.height:
                finds.append(out.findings)
            merge_corrupt(corrupt, out.corrupt)
            bar.advance(detail=e.isoformat())
    findings = pl.concat(finds, how="diagonal_relaxed") if finds else _empty_findings()
    incidents, _ = incidents_of(findings, kb, gap_s=cfg.incident_gap_s, max_len=cfg.max_incident, horizon=None,
                                window_length=length, stride=stride, min_incident_s=cfg.min_incident_s)
    if findings.height:
        lake_mod.write_table(tmp, "findings", with_time(findings))
    if incidents.height:
        lake_mod.write_table(tmp, "incidents", incidents.select(pl.col("start").alias(schema.TIME), pl.all()))
    # facts and ground truth of the interval travel along: the post-mortem lake stands alone
    if facts is not None and facts.height:
        lake_mod.write_table(tmp, "host_facts", facts, partition_by_hour=False)
    if source == "lake" and "labels" in lake_mod.tables(lake_p):
        found: list[Corrupt] = []
        labels = lake_mod.read(lake_p, "labels", end=end, hosts=hosts, on_corrupt="skip", report=found)
        merge_corrupt(corrupt, found)
        labels = labels.filter(pl.col("end").is_null() | (pl.col("end") > start))
        if labels.height:
            lake_mod.write_table(tmp, "labels", labels, partition_by_hour=False)
    wm.write_json_atomic(tmp / "_postmortem.json", {
        "id": pid, "hosts": list(hosts), "start": start.isoformat(), "end": end.isoformat(), "source": source,
        "windows": windows, "findings": findings.height, "incidents": incidents.height,
        "corrupt": [{"path": str(e.path), "reason": e.reason} for e in corrupt], "created": datetime.now(UTC).isoformat(),
    })
    if final.exists():  # replace an earlier run: old moved aside, new renamed in, old removed
        old = lake_p / POSTMORTEM_DIR / f".old-{pid}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return PostmortemResult(pid, final, list(hosts), start, end, source, windows, findings.height,
                            incidents, corrupt)


__all__ = [
    "MATCH_COLUMNS", "SHARE_COLUMNS", "ChunkSummary", "Corrupt", "CycleSummary", "PostmortemResult", "SweepConfig", "WriteBack",
    "analyze_chunk", "analyze_steps", "detection_from_mapping", "eval_detector", "incidents_of", "label_interval", "maintain", "merge_corrupt", "postmortem", "postmortem_dir", "process_chunk", "run_cycle", "segment",
]
