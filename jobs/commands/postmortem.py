"""``unveil postmortem``: re-run the analytics over a past interval of some hosts (from the lake,
or from InfluxDB when the lake lacks it) into ``<lake>/_postmortem/<id>/`` and write the report."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from jobs import config as config_mod
from jobs.commands import output_file, warn_corrupt
from jobs.commands.schedule import add_common, sweep_config
from jobs.postmortem import label_interval, postmortem, postmortem_id
from jobs.timeparse import parse_duration, parse_time
from knowledge_base.incidents import episodes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("postmortem", help="re-analyse a past interval of a host and write its report",
                       description=__doc__)
    add_common(p)
    p.add_argument("--host", nargs="+", metavar="HOST", help="host(s) to analyse")
    p.add_argument("--from", dest="start", metavar="T", help="start (ISO-8601 or relative, e.g. 2026-11-30T02:00Z, 6h)")
    p.add_argument("--to", dest="end", metavar="T", help="end (default: now)")
    p.add_argument("--label", metavar="ID", help="take host and interval from this row of the labels table")
    p.add_argument("--margin", default="5m", metavar="DUR", help="with --label: widen the interval by this (5m)")
    p.add_argument("--id", dest="pm_id", metavar="ID", help="post-mortem id (default: from hosts and interval)")
    p.add_argument("--no-peers", action="store_true", help="do not use the lake's other hosts as cohort peers")
    p.add_argument("--out", metavar="FILE.html", help="report path (default: <lake>/_postmortem/<id>/report.html)")
    p.add_argument("--state", metavar="DIR",
                   help="for a lake on object storage (s3://...): the local directory its post-mortems go under "
                   "(<DIR>/_postmortem/<id>/; default: [lake] state)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out_arg = output_file(args.out, "--out")  # before the analytics, not after
    cfg = config_mod.load(args.config)
    lake = config_mod.resolve_lake_and_state(args.lake, args.state, cfg)
    sc = sweep_config(args, cfg, lake)
    label = None
    if args.label:
        if args.start or args.end:
            raise ValueError("give --label or --from/--to, not both")
        host, start, end = label_interval(lake, args.label, parse_duration(args.margin, "--margin"))
        hosts = args.host or [host]
        label = args.label
    else:
        if not args.host or not args.start:
            raise ValueError("give --host H --from T1 [--to T2], or --label ID")
        hosts = args.host
        start, end = parse_time(args.start), parse_time(args.end or "now")
    pm_id = args.pm_id if args.pm_id is not None else postmortem_id(hosts, start, end, label)
    res = postmortem(lake, hosts, start, end, sc, pm_id=pm_id, influx=sc.influx, peers=not args.no_peers,
                     progress=args.progress)
    print(f"post-mortem {res.pm_id}: {', '.join(res.hosts)} {res.start.isoformat()} .. {res.end.isoformat()} "
          f"(from {res.source})")
    lasting = episodes(res.incidents, sc.incident_gap_s)  # a lasting one's parts (every max_incident) as one
    print(f"  {res.windows} windows, {res.findings} findings, {lasting.height} incidents")
    for inc in lasting.iter_rows(named=True):
        what = inc["entry_id"] or "unmatched"
        parts = f", {inc['parts']} parts" if inc["parts"] > 1 else ""
        print(f"  {inc['host']} {inc['start']:%Y-%m-%d %H:%M:%S} .. {inc['end']:%H:%M:%S} {what}"
              f" ({inc['n_windows']} windows{parts}): {(inc['explanation'] or '')[:100]}")
    print(f"  results: {res.path}")
    sys.stdout.flush()
    warn_corrupt("postmortem", res.corrupt)
    out = out_arg or res.path / "report.html"
    try:
        from jobs.report import write_report
    except ImportError:  # the report module is optional here: the text above is the summary
        return 0
    summary = write_report(res.path, out, start=res.start - timedelta(seconds=0), end=res.end, hosts=res.hosts)
    print(f"  report: {summary.path}")
    sys.stdout.flush()
    return 0
