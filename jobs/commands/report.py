"""``unveil report``: the self-contained HTML report of a lake interval, plus a terminal summary."""

from __future__ import annotations

import argparse

from jobs.commands import check_hosts, output_file
from jobs.report import write_report
from jobs.timeparse import parse_time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the HTML report (scores, incidents, audit, remediations) of the lake")
    p.add_argument("--lake", required=True, metavar="PATH", help="lake root directory")
    p.add_argument("--out", required=True, metavar="FILE.html", help="where to write the report")
    p.add_argument("--since", metavar="T", help="start: ISO-8601 or relative (24h, 90m); default: all")
    p.add_argument("--until", metavar="T", help="end: ISO-8601 or relative; default: no bound")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts (default: all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    start = parse_time(args.since) if args.since else None
    end = parse_time(args.until) if args.until else None
    if start is not None and end is not None and start >= end:
        raise ValueError(f"empty interval: --since {start.isoformat()} is not before --until {end.isoformat()}")
    check_hosts(args.lake, args.hosts)
    out = output_file(args.out, "--out")
    assert out is not None  # required
    summary = write_report(args.lake, out, start, end, args.hosts)
    print(summary.text())
    return 0
