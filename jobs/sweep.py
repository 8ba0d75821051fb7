"""The sweep: analyse a lake interval and write features, scores and findings back.

:func:`run_sweep` is the by-hand sweep (``unveil sweep``): the same verdict as the
scheduler's (statistical detectors with warm-up, OR the knowledge base as a signature
detector, findings matched; :mod:`knowledge_base.detector`), without watermarks.
Downstream tables get a ``time`` column equal to ``window_start`` (the lake partitions
and prunes on ``time``) next to ``window_start``/``window_end``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl

from analytics.pipeline import AnalyticsConfig, analyze
from ingest.lake import CorruptFileError, write_table
from ingest.schema import HOST, TIME

if TYPE_CHECKING:
    from knowledge_base.detector import Detection, DetectionConfig
    from knowledge_base.loader import KnowledgeBase

log = logging.getLogger(__name__)

OUTPUT_TABLES: tuple[str, ...] = ("features", "scores", "findings")


@dataclass
class HostSummary:
    windows: int = 0
    flagged: int = 0  # windows the combined detector flagged under any reference
    signature: int = 0  # windows a knowledge-base signature matched
    findings: int = 0  # the final verdict (statistical out of warm-up, or signature)


@dataclass
class SweepSummary:
    start: datetime
    end: datetime
    hosts: dict[str, HostSummary] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    corrupt: list[CorruptFileError] = field(default_factory=list)  # files skipped, one entry each

    @property
    def windows(self) -> int:
        return sum(h.windows for h in self.hosts.values())

    @property
    def flagged(self) -> int:
        return sum(h.flagged for h in self.hosts.values())

    @property
    def findings(self) -> int:
        return sum(h.findings for h in self.hosts.values())

    @property
    def signature(self) -> int:
        return sum(h.signature for h in self.hosts.values())


def with_time(df: pl.DataFrame) -> pl.DataFrame:
    """A downstream table as the lake wants it: ``time`` (= window_start) first."""
    return df.select(pl.col("window_start").alias(TIME), pl.all())


def summarize(det: Detection, start: datetime, end: datetime) -> SweepSummary:
    summary = SweepSummary(start, end)
    for h, n in det.features.group_by(HOST).len().iter_rows():
        summary.hosts.setdefault(h, HostSummary()).windows = n
    if det.scores.height:
        for name, attr in (("combined", "flagged"), ("kb", "signature")):
            sel = det.scores.filter(pl.col("detector") == name)
            flagged = sel.group_by(HOST, "window_start").agg(pl.col("flagged").any()).group_by(HOST).agg(
                pl.col("flagged").sum())
            for h, n in flagged.iter_rows():
                setattr(summary.hosts.setdefault(h, HostSummary()), attr, int(n))
    for h, n in det.findings.group_by(HOST).len().iter_rows():
        summary.hosts.setdefault(h, HostSummary()).findings = n
    return summary


def run_sweep(
    lake: str | os.PathLike[str],
    start: datetime,
    end: datetime,
    hosts: Sequence[str] | None = None,
    config: AnalyticsConfig | None = None,
    *,
    write: bool = True,
    detection: DetectionConfig | None = None,
    kb: KnowledgeBase | None = None,
) -> SweepSummary:
    """Analyse ``[start, end)`` (plus the config's history as reference) and write the
    features, scores and findings tables to the lake (unless ``write`` is False).

    All three tables are computed before the first is written, so an analysis error
    writes nothing. Re-running over the same interval appends a second copy (the
    scheduler's watermarks prevent that; ``unveil sweep`` refuses it on a lake the
    scheduler manages)."""
    from jobs.pipeline import _first_times, load_lake
    from knowledge_base import load_kb
    from knowledge_base.detector import detect

    config = config or AnalyticsConfig()
    # the scheduler's reader: a corrupt file is skipped and named, the rest analysed
    loaded = load_lake(lake, start - config.history, end, hosts)
    facts = loaded.facts
    result = analyze(loaded.frames, config, host_facts=facts, score_since=start)
    det = detect(result, facts, kb or load_kb(), detection, keep=pl.col("window_start") >= start,
                 frame_start=start - config.history,
                 history_known=_first_times(lake, hosts), window_length_s=config.window.length_s,
                 min_cohort=config.min_cohort)
    summary = summarize(det, start, end)
    summary.corrupt = loaded.corrupt
    if write:
        for table, df in zip(OUTPUT_TABLES, (det.features, det.scores, det.findings), strict=True):
            if df.height:
                write_table(lake, table, with_time(df))
            summary.rows_written[table] = df.height
    log.info("sweep %s..%s: %d windows, %d flagged, %d signature, %d findings", start, end, summary.windows,
             summary.flagged, summary.signature, summary.findings)
    return summary
