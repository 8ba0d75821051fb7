"""The sweep: analyse a lake interval and write features, scores and findings back.

The core is :func:`run_sweep`; the scheduler (watermarks, periodic runs) builds on it.
Downstream tables get a ``time`` column equal to ``window_start`` (the lake partitions
and prunes on ``time``) next to ``window_start``/``window_end``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from analytics.pipeline import AnalysisResult, AnalyticsConfig, analyze_lake
from ingest.lake import write_table
from ingest.schema import HOST, TIME

log = logging.getLogger(__name__)

OUTPUT_TABLES: tuple[str, ...] = ("features", "scores", "findings")


@dataclass
class HostSummary:
    windows: int = 0
    flagged: int = 0  # windows the combined detector flagged under any reference
    findings: int = 0


@dataclass
class SweepSummary:
    start: datetime
    end: datetime
    hosts: dict[str, HostSummary] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)

    @property
    def windows(self) -> int:
        return sum(h.windows for h in self.hosts.values())

    @property
    def flagged(self) -> int:
        return sum(h.flagged for h in self.hosts.values())

    @property
    def findings(self) -> int:
        return sum(h.findings for h in self.hosts.values())


def with_time(df: pl.DataFrame) -> pl.DataFrame:
    """A downstream table as the lake wants it: ``time`` (= window_start) first."""
    return df.select(pl.col("window_start").alias(TIME), pl.all())


def summarize(result: AnalysisResult, start: datetime, end: datetime) -> SweepSummary:
    summary = SweepSummary(start, end)
    for h, n in result.features.group_by(HOST).len().iter_rows():
        summary.hosts.setdefault(h, HostSummary()).windows = n
    comb = result.scores.filter(pl.col("detector") == "combined")
    flagged = comb.group_by(HOST, "window_start").agg(pl.col("flagged").any()).group_by(HOST).agg(pl.col("flagged").sum())
    for h, n in flagged.iter_rows():
        summary.hosts.setdefault(h, HostSummary()).flagged = int(n)
    for h, n in result.findings.group_by(HOST).len().iter_rows():
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
) -> SweepSummary:
    """Analyse ``[start, end)`` (plus the config's history as reference) and write the
    features, scores and findings tables to the lake (unless ``write`` is False).

    All three tables are computed before the first is written, so an analysis error
    writes nothing. Re-running over the same interval appends a second copy (the
    scheduler's watermarks prevent that)."""
    result = analyze_lake(lake, start, end, hosts=hosts, config=config or AnalyticsConfig())
    summary = summarize(result, start, end)
    if write:
        for table, df in zip(OUTPUT_TABLES, (result.features, result.scores, result.findings), strict=True):
            if df.height:
                write_table(lake, table, with_time(df))
            summary.rows_written[table] = df.height
    log.info("sweep %s..%s: %d windows, %d flagged, %d findings", start, end, summary.windows, summary.flagged,
             summary.findings)
    return summary
