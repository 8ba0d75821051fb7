"""``unveil eval``: detection and fingerprint quality against the lake's labels."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta

from analytics.evaluation import (
    DEFAULT_CONFIGS,
    evaluate_lake,
    load_matcher,
    parse_configs,
    render_table,
)
from jobs.timeparse import parse_range, parse_time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="precision/recall/F1, time to detect and fingerprint figures per detector combination",
        description="Run the analytics over the labelled interval once per detector combination and "
        "compare with the lake's labels table (definitions: docs/evaluation.md).",
    )
    p.add_argument("--lake", required=True, metavar="PATH", help="lake root directory")
    p.add_argument("--since", metavar="T", help="start: ISO-8601 or relative (24h); default: the first sample")
    p.add_argument("--until", metavar="T", help="end: ISO-8601 or relative; default: just after the last sample")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--configs", metavar="LIST", default="|".join(DEFAULT_CONFIGS),
                   help="detector combinations separated by | (default: %(default)s)")
    p.add_argument("--matcher", metavar="MODULE:FUNC",
                   help="fingerprint matcher (findings, host_facts) -> matches; without it the four "
                   "fingerprint figures are n/a")
    p.set_defaults(func=run)


def _telemetry_span(lake: str) -> tuple[datetime, datetime]:
    """First sample time and just after the last one, over the lake's telemetry tables."""
    import polars as pl

    from analytics.features import SKIPPED
    from ingest.lake import scan, tables

    lo: list[datetime] = []
    hi: list[datetime] = []
    for t in tables(lake):
        if t in SKIPPED:
            continue
        r = scan(lake, t).select(pl.col("time").min().alias("a"), pl.col("time").max().alias("b")).collect()
        if r["a"][0] is not None:
            lo.append(r["a"][0])
            hi.append(r["b"][0])
    if not lo:
        raise ValueError(f"lake {lake}: no telemetry rows to evaluate")
    return min(lo), max(hi) + timedelta(microseconds=1)


def run(args: argparse.Namespace) -> int:
    if args.since is None or args.until is None:
        lo, hi = _telemetry_span(args.lake)
        start = parse_time(args.since) if args.since else lo
        end = parse_time(args.until) if args.until else hi
        if start >= end:
            raise ValueError(f"empty interval {start.isoformat()} .. {end.isoformat()}")
    else:
        start, end = parse_range(args.since, args.until)
    matcher = load_matcher(args.matcher) if args.matcher else None
    ev = evaluate_lake(args.lake, start, end, configs=parse_configs(args.configs), hosts=args.hosts,
                       matcher=matcher, matcher_name=args.matcher)
    if args.format == "json":
        print(json.dumps(ev.to_json(), indent=2, sort_keys=True))
    else:
        print(render_table(ev))
    return 0
