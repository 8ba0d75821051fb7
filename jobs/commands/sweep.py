"""``unveil sweep``: analyse an interval of the lake and write features, scores, findings."""

from __future__ import annotations

import argparse

from analytics.pipeline import AnalyticsConfig
from ingest.lake import LakeError
from jobs.sweep import run_sweep
from jobs.timeparse import parse_range


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="score an interval of the lake and write features, scores and findings")
    p.add_argument("--lake", metavar="PATH", help="lake root (default: $UNVEIL_LAKE or [lake] path of --config)")
    p.add_argument("--since", metavar="T", help="start: ISO-8601 or relative (24h, 90m); default 1h")
    p.add_argument("--until", metavar="T", help="end: ISO-8601 or relative; default now")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts (default: all)")
    p.add_argument("--dry-run", action="store_true", help="analyse and print, write nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except LakeError as exc:  # a bad lake path or a corrupt file: the user's to fix
        raise ValueError(str(exc)) from exc


def _settings(args: argparse.Namespace) -> tuple[str, AnalyticsConfig]:
    """The lake path and the analytics settings ([analytics] of --config, else defaults)."""
    from jobs import config as config_mod
    from jobs.pipeline import analytics_from_mapping

    cfg = config_mod.load(getattr(args, "config", None))
    where = f"{cfg.source} [analytics]" if cfg.source else "[analytics]"
    return str(config_mod.resolve_lake(args.lake, cfg)), analytics_from_mapping(cfg.analytics, where)


def _run(args: argparse.Namespace) -> int:
    lake, analytics = _settings(args)
    start, end = parse_range(args.since, args.until, default_since="1h")
    summary = run_sweep(lake, start, end, args.hosts, analytics, write=not args.dry_run)
    print(f"sweep {start.isoformat()} .. {end.isoformat()}: {len(summary.hosts)} hosts, "
          f"{summary.windows} windows, {summary.flagged} flagged, {summary.findings} findings")
    if summary.hosts:
        width = max(len(h) for h in summary.hosts)
        print(f"{'host'.ljust(width)}  {'windows':>8}  {'flagged':>8}  {'findings':>8}")
        for h, s in sorted(summary.hosts.items()):
            print(f"{h.ljust(width)}  {s.windows:>8}  {s.flagged:>8}  {s.findings:>8}")
    if summary.rows_written:
        print("written: " + ", ".join(f"{t} {n} rows" for t, n in summary.rows_written.items()))
    return 0
