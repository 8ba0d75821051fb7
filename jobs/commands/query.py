"""``unveil query``: ad hoc SQL or a named query (sql/NAME.sql) over every lake table."""

from __future__ import annotations

import argparse
import sys

from ingest import objstore
from ingest.lake import CorruptFileError
from jobs import config as config_mod
from jobs.commands import output_file, warn_corrupt
from jobs.query import FORMATS, is_named, named_queries, parse_param_args, run_query, write_output
from jobs.timeparse import parse_time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "query",
        help="run SQL or a named query (sql/*.sql) over the lake's tables",
        description="Run Polars SQL over every lake table (measurements, host_facts, features, scores, "
                    "findings, incidents, remediations, labels; views feature_values, finding_factors), "
                    "or a named query from sql/. --since/--until/--hosts prune the scans before the SQL runs. "
                    "See docs/query.md.",
    )
    p.add_argument("query", nargs="?", metavar="SQL|NAME", help="a SQL statement, or the name of a query in sql/")
    p.add_argument("--lake", default="lake", metavar="PATH", help="lake root: a directory (default ./lake) or s3://bucket/prefix")
    p.add_argument("--since", metavar="T", help="only rows from T on: ISO-8601 or relative (24h, 90m); default: all")
    p.add_argument("--until", metavar="T", help="only rows before T; default: no bound")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts (default: all)")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="a query parameter (repeatable)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout (needed for parquet)")
    p.add_argument("--list", action="store_true", help="list the named queries and their parameters")
    p.set_defaults(func=run)


def _list() -> int:
    for q in named_queries().values():
        print(f"{q.name}: {q.summary}")
        for prm in q.params:
            default = "required" if prm.default is None else f"default {prm.default}"
            print(f"    --param {prm.name}=<{prm.type}>  ({default}) {prm.doc}")
    return 0


def _query_from_hosts(args: argparse.Namespace) -> None:
    """``--hosts`` takes every word after it, so SQL or a query name written after the
    hosts lands in ``args.hosts``: when no query was given and the last of them is a named
    query or has whitespace in it (no host name has), it is the query."""
    if args.query or not args.hosts:
        return
    last = args.hosts[-1]
    if any(c.isspace() for c in last) or (is_named(last) and last.strip() in named_queries()):
        args.query = last
        args.hosts = args.hosts[:-1]
        if not args.hosts:
            raise ValueError(f"--hosts needs at least one host before {last!r}")
    else:
        raise ValueError(f"give SQL or a query name: --hosts took {last!r} as a host; put the SQL or "
                         f"query name before --hosts (unveil query --list shows the named queries)")


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    _query_from_hosts(args)
    if not args.query:
        raise ValueError("give SQL or a query name (unveil query --list shows the named queries)")
    output_file(args.out, "--out")  # before the query runs
    start = parse_time(args.since) if args.since else None
    end = parse_time(args.until) if args.until else None
    if start is not None and end is not None and start >= end:
        raise ValueError(f"empty interval: --since {start.isoformat()} is not before --until {end.isoformat()}")
    if objstore.is_url(args.lake):
        config_mod.use_lake_storage(config_mod.load(args.config, analysis=False))
    corrupt: list[CorruptFileError] = []
    df = run_query(args.lake, args.query, start=start, end=end, hosts=args.hosts,
                   params=parse_param_args(args.param), corrupt=corrupt)
    warn_corrupt("query", corrupt)
    try:
        write_output(df, args.format, args.out)
    except OSError as exc:
        if not args.out:
            raise
        raise ValueError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from None
    if args.out:
        print(f"{df.height} rows written to {args.out}", file=sys.stderr)
    return 0
