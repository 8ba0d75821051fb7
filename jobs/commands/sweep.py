"""``unveil sweep``: analyse an interval of the lake and write features, scores, findings."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from analytics.pipeline import AnalyticsConfig
from ingest import lake as lake_mod
from ingest.lake import LakeError
from jobs.commands import check_hosts, warn_corrupt
from jobs.commands.schedule import add_engine
from jobs.engine import parse_spec
from jobs.sweep import run_sweep
from jobs.telemetry import partition_start
from jobs.timeparse import parse_range

if TYPE_CHECKING:
    from knowledge_base.detector import DetectionConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="score an interval of the lake and write features, scores and findings")
    p.add_argument("--lake", metavar="PATH", help="lake root (default: $UNVEIL_LAKE or [lake] path of --config)")
    p.add_argument("--since", metavar="T", help="start: ISO-8601 or relative (24h, 90m); default 1h")
    p.add_argument("--until", metavar="T", help="end: ISO-8601 or relative; default now")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts (default: all)")
    p.add_argument("--dry-run", action="store_true", help="analyse and print, write nothing")
    p.add_argument("--force", action="store_true",
                   help="sweep windows the scheduler already processed (below a host's watermark): "
                   "their rows are appended a second time")
    p.add_argument("--no-signature", action="store_true",
                   help="statistical detectors only (the knowledge base still matches their findings)")
    p.add_argument("--state", metavar="DIR",
                   help="for a lake on object storage (s3://...): the scheduler's state directory, whose "
                   "watermarks say what is already swept (default: [lake] state)")
    add_engine(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except LakeError as exc:  # a bad lake path or a corrupt file: the user's to fix
        raise ValueError(str(exc)) from exc


def _settings(args: argparse.Namespace) -> tuple[str, AnalyticsConfig, DetectionConfig, str]:
    """The lake path, the analytics settings ([analytics] of --config, else defaults), the
    detection settings (signature_detector, signature_min_confidence, warmup, restart_gap of
    its [scheduler] table) and the engine (--engine, else [scheduler] engine)."""
    from dataclasses import replace

    from jobs import config as config_mod

    cfg = config_mod.load(getattr(args, "config", None))
    det = cfg.detection
    if getattr(args, "no_signature", False):
        det = replace(det, signature=False)
    engine = parse_spec(args.engine, "--engine") if getattr(args, "engine", None) else cfg.sweep.engine
    lake = config_mod.resolve_lake_and_state(args.lake, getattr(args, "state", None), cfg)  # (eval has no --state)
    return str(lake), cfg.analytics, det, engine


def check_watermarks(lake: str, start: datetime, hosts: list[str] | None) -> None:
    """Refuse (ValueError) to re-sweep windows below a host's scheduler watermark: the
    scheduler already wrote them, a second sweep would duplicate their rows."""
    from jobs import watermarks as wm

    wm.claim(lake, take=False)  # (object storage: the scheduler's watermarks are in its state directory)
    marks = wm.load(lake)
    behind = sorted((h, m.watermark) for h, m in marks.items() if (hosts is None or h in hosts) and start < m.watermark)
    if not behind:
        return
    shown = ", ".join(f"{h} up to {w.isoformat()}" for h, w in behind[:5]) + (" ..." if len(behind) > 5 else "")
    latest = max(w for _, w in behind)
    raise ValueError(
        f"lake {lake} is managed by the scheduler ({wm.STATE_DIR}/{wm.WATERMARKS}): already swept {shown}. "
        f"Sweeping from {start.isoformat()} would write those windows' features, scores and findings a second "
        f"time. Use --since {latest.isoformat()} (or later), --dry-run to look without writing, or --force "
        f"to append anyway.")


def check_swept(lake: str, start: datetime, end: datetime, hosts: list[str] | None) -> None:
    """Refuse (ValueError) to sweep an interval whose windows already have scores (an
    earlier sweep by hand): the lake appends, so every feature, score and finding of the
    overlap would be stored twice."""
    import polars as pl

    from ingest import schema

    if "scores" not in lake_mod.tables(lake):
        return
    done = (lake_mod.scan(lake, "scores", start=start, end=end, hosts=hosts)
            .group_by(schema.HOST).agg(pl.col(schema.TIME).min().alias("lo"), pl.col(schema.TIME).max().alias("hi"))
            .sort(schema.HOST).collect())
    if not done.height:
        return
    shown = ", ".join(f"{r['host']} {r['lo']:%Y-%m-%dT%H:%M:%S} .. {r['hi']:%H:%M:%S}"
                      for r in done.head(5).iter_rows(named=True)) + (" ..." if done.height > 5 else "")
    raise ValueError(
        f"lake {lake} already has scores in this interval ({shown}): sweeping it again would store those "
        f"windows' features, scores and findings a second time. Use --dry-run to look without writing, "
        f"another --since/--until, or --force to append anyway.")


def _telemetry_days(lake: str, hosts: list[str] | None) -> list[str]:
    """The days (partition names) with telemetry, for a sweep that found none."""
    try:
        paths = lake_mod.files(lake, "system", hosts=hosts)
    except (LakeError, OSError):
        return []
    return sorted({t.date().isoformat() for p in paths if (t := partition_start(Path(p))) is not None})


def _run(args: argparse.Namespace) -> int:
    lake, analytics, detection, engine = _settings(args)
    start, end = parse_range(args.since, args.until, default_since="1h")
    lake_mod.require(lake)  # before the watermarks, which would name a file inside it
    check_hosts(lake, args.hosts)
    if not (args.dry_run or args.force):
        check_watermarks(lake, start, args.hosts)
        check_swept(lake, start, end, args.hosts)
    summary = run_sweep(lake, start, end, args.hosts, analytics, write=not args.dry_run, detection=detection,
                        engine=engine)
    print(f"sweep {start.isoformat()} .. {end.isoformat()}: {len(summary.hosts)} hosts, "
          f"{summary.windows} windows, {summary.flagged} flagged, {summary.signature} signature matches, "
          f"{summary.findings} findings")
    if not summary.windows and (days := _telemetry_days(lake, args.hosts)):
        print(f"no telemetry in that interval; the lake's `system` table has data on {days[0]}"
              + (f" .. {days[-1]}" if len(days) > 1 else "") + " (--since/--until choose the interval)")
    if summary.hosts:
        width = max(len(h) for h in summary.hosts)
        print(f"{'host'.ljust(width)}  {'windows':>8}  {'flagged':>8}  {'kb':>8}  {'findings':>8}")
        for h, s in sorted(summary.hosts.items()):
            print(f"{h.ljust(width)}  {s.windows:>8}  {s.flagged:>8}  {s.signature:>8}  {s.findings:>8}")
    if summary.rows_written:
        print("written: " + ", ".join(f"{t} {n} rows" for t, n in summary.rows_written.items()))
    sys.stdout.flush()
    warn_corrupt("sweep", summary.corrupt)
    return 0
