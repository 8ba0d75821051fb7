"""``unveil eval``: detection and fingerprint quality against the lake's labels."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta

from analytics.evaluation import (
    DEFAULT_CONFIGS,
    RESEARCH_CONFIGS,
    Matcher,
    evaluate_lake,
    load_matcher,
    parse_configs,
    render_table,
)
from ingest.lake import LakeError
from jobs.timeparse import parse_range, parse_time

#: the knowledge base's evaluation matcher (issue 5)
KB_MATCHER = "knowledge_base.matcher:eval_matcher"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="precision/recall/F1, time to detect and fingerprint figures per detector combination",
        description="Run the analytics over the labelled interval once per detector combination and "
        "compare with the lake's labels table (definitions: docs/evaluation.md).",
    )
    p.add_argument("--lake", metavar="PATH", help="lake root (default: $UNVEIL_LAKE or [lake] path of --config)")
    p.add_argument("--since", metavar="T", help="start: ISO-8601 or relative (24h); default: the first sample")
    p.add_argument("--until", metavar="T", help="end: ISO-8601 or relative; default: just after the last sample")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--configs", metavar="LIST",
                   help="detector combinations separated by |; KB = the knowledge base as a signature detector "
                   f"(default: {'|'.join(DEFAULT_CONFIGS)}; with --matcher other than kb: "
                   f"{'|'.join(RESEARCH_CONFIGS)})")
    p.add_argument("--matcher", metavar="MODULE:FUNC", default="kb",
                   help="fingerprint matcher: 'kb' (default) is the shipped knowledge base, evaluated exactly as "
                   "a sweep runs it (warm-up, signature detector, matching, incidents); MODULE:FUNC a matcher "
                   "(findings, host_facts[, features]) -> matches on the statistical findings "
                   f"(e.g. {KB_MATCHER}); 'none' prints the fingerprint figures as n/a")
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
    try:
        return _run(args)
    except LakeError as exc:  # a bad lake path or a corrupt file: the user's to fix
        raise ValueError(str(exc)) from exc


def _run(args: argparse.Namespace) -> int:
    from jobs.commands.sweep import _settings

    lake, analytics, detection, _ = _settings(args)
    if args.since is None or args.until is None:
        lo, hi = _telemetry_span(lake)
        start = parse_time(args.since) if args.since else lo
        end = parse_time(args.until) if args.until else hi
        if start >= end:
            raise ValueError(f"empty interval {start.isoformat()} .. {end.isoformat()}")
    else:
        start, end = parse_range(args.since, args.until)
    detect = None
    matcher: Matcher | None
    if args.matcher == "kb":
        from jobs.config import SweepConfig
        from jobs.step import eval_detector
        from knowledge_base import load_kb

        name = "knowledge base (sweep verdict: vote∨KB signature, warm-up, incidents)"
        configs = parse_configs(args.configs)
        matcher = load_matcher(KB_MATCHER)
        detect = eval_detector(load_kb(), SweepConfig(analytics=analytics, detection=detection), lake)
    else:
        name = args.matcher
        configs = parse_configs(args.configs or "|".join(RESEARCH_CONFIGS))
        matcher = None if name in ("none", "") else load_matcher(name)
    ev = evaluate_lake(lake, start, end, configs=configs, hosts=args.hosts,
                       matcher=matcher, matcher_name=name if matcher is not None else None,
                       base_config=analytics, detect=detect, default_signature=detection.signature)
    if args.format == "json":
        print(json.dumps(ev.to_json(), indent=2, sort_keys=True))
    else:
        print(render_table(ev))
    return 0
