"""The sweep: analyse a lake interval and write features, scores and findings back.

:func:`run_sweep` is the by-hand sweep (``unveil sweep``): the scheduler's verdict
(:func:`jobs.step.sweep_step`: statistical detectors with warm-up, OR the knowledge base
as a signature detector, findings matched) over one interval, in one analysis, without
watermarks or incidents.
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

from analytics.pipeline import AnalyticsConfig
from ingest.lake import CorruptFileError, write_table
from ingest.schema import HOST
from jobs.config import SweepConfig
from jobs.engine import make_engine
from jobs.step import StepResult, sweep_step, with_time
from jobs.telemetry import HostChunk, batch_features, batches, first_times, fleet_hosts, joined
from knowledge_base.detector import DetectionConfig

if TYPE_CHECKING:
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


def summarize(det: StepResult, start: datetime, end: datetime) -> SweepSummary:
    summary = SweepSummary(start, end)
    if det.features.height:
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
    engine: str = "processes",
) -> SweepSummary:
    """Analyse ``[start, end)`` (plus the config's history as reference) and write the
    features, scores and findings tables to the lake (unless ``write`` is False).

    All three tables are computed before the first is written, so an analysis error
    writes nothing. Re-running over the same interval appends a second copy (the
    scheduler's watermarks prevent that; ``unveil sweep`` refuses it on a lake the
    scheduler manages)."""
    from knowledge_base import load_kb

    config = config or AnalyticsConfig()
    cfg = SweepConfig(analytics=config, detection=detection or DetectionConfig(), analysis_step=None, engine=engine)
    # each host's features alone (its raw rows only; by the engine when there are several),
    # judged together; a corrupt file is skipped and named, the rest analysed
    names = list(hosts) if hosts else fleet_hosts(lake)
    jobs = [HostChunk(str(lake), h, start, end, config.history, config.window, stored_history=False) for h in names]
    with make_engine(engine if len(jobs) > 1 else "serial") as eng:
        loaded = joined([p for got in eng.map(batch_features, batches(jobs, eng.workers)) for p in got])
    det = sweep_step(loaded, cfg, kb or load_kb(), since=start, hosts=hosts,
                     history_known=first_times(lake, hosts), incidents=False)
    summary = summarize(det, start, end)
    summary.corrupt = det.corrupt
    if write:
        for table, df in zip(OUTPUT_TABLES, (det.features, det.scores, det.findings), strict=True):
            if df.height:
                write_table(lake, table, with_time(df))
            summary.rows_written[table] = df.height
    log.info("sweep %s..%s: %d windows, %d flagged, %d signature, %d findings", start, end, summary.windows,
             summary.flagged, summary.signature, summary.findings)
    return summary
