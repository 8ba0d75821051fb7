"""``unveil import``: wide CSV/Parquet files (one column per metric) into a lake table."""

from __future__ import annotations

import argparse

from ingest.importer import DEFAULT_TABLE, import_files
from ingest.lake import LakeError
from jobs.timeparse import parse_duration, parse_time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="import wide CSV/Parquet files into the lake for post-mortem analysis",
        description="Import wide CSV or Parquet files (a time column, or rows timed by --interval "
        "and --start; one numeric column per metric) into a lake table for one host. Rows that "
        "do not parse, or whose time is before 1970 or from 2200 on, are skipped and reported as "
        "FILE:LINE; inf/-inf/nan cells are stored as null and counted; a file that cannot be "
        "imported at all (no data rows, a non-numeric column ...) stops the import before "
        "anything is written.",
    )
    p.add_argument("--lake", required=True, metavar="PATH", help="lake root directory (created if missing)")
    p.add_argument("--host", required=True, metavar="NAME", help="host name the data belongs to")
    p.add_argument("--table", default=DEFAULT_TABLE, metavar="NAME", help=f"lake table (default {DEFAULT_TABLE})")
    p.add_argument("--time-column", metavar="COL", help="time column (default: time, timestamp, datetime, date ...)")
    p.add_argument("--interval", metavar="DUR", help="row spacing when rows have no time column, e.g. 1m")
    p.add_argument("--start", metavar="TIME", help="time of the first row with --interval (ISO-8601 or relative)")
    p.add_argument("--no-header", action="store_true", help="CSV has no header row: columns become c1..cN")
    p.add_argument("--append", action="store_true",
                   help="import even when the host already has rows of the table in that time range "
                        "(they would be stored twice)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except LakeError as exc:  # a bad lake path or a corrupt file: the user's to fix
        raise ValueError(str(exc)) from exc


def _run(args: argparse.Namespace) -> int:
    interval = parse_duration(args.interval, "--interval") if args.interval else None
    start = parse_time(args.start) if args.start else None
    if args.time_column and interval:
        raise ValueError("give either --time-column or --interval, not both")
    if interval is not None and start is None:
        raise ValueError("--interval needs --start (the time of the first row)")
    report = import_files(
        args.lake,
        args.host,
        args.files,
        table=args.table,
        time_column=args.time_column,
        interval=interval,
        start=start,
        has_header=not args.no_header,
        append=args.append,
    )
    for s in report.skipped[:20]:
        print(f"skipped {s}")
    if len(report.skipped) > 20:
        print(f"... and {len(report.skipped) - 20} more skipped rows")
    if report.nonfinite:
        print(f"{report.nonfinite} non-finite values (inf, -inf, nan) stored as null, first: "
              + "; ".join(report.nonfinite_examples[:3]))
    print(
        f"imported {report.rows} rows x {len(report.metrics)} metrics for host {report.host} "
        f"into table {report.table} ({report.start} .. {report.end}); {len(report.skipped)} rows skipped"
    )
    return 0
