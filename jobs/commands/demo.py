"""``unveil demo``: simulate a fleet with injected inefficiencies, sweep, match, queue
remediations (dry-run) and write the report — no server needed."""

from __future__ import annotations

import argparse
import time

from jobs.commands import output_file
from jobs.demo import DEFAULT_DIR, run_demo


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on a simulated fleet and write a report (~1 min)")
    p.add_argument("--lake", metavar="PATH",
                   help=f"demo lake directory (default {DEFAULT_DIR}/lake); replaced if a previous demo made it, "
                        "refused if it holds anything else")
    p.add_argument("--report", metavar="PATH", help=f"HTML report (default {DEFAULT_DIR}/report.html, "
                                                    "or <lake>-report.html next to --lake)")
    p.add_argument("--hosts", type=int, metavar="N", help="number of simulated hosts (default 4)")
    p.add_argument("--duration", metavar="D", help="simulated time, e.g. 10m (default 15m)")
    p.add_argument("--seed", type=int, help="simulation seed (default 7)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    res = run_demo(args.lake, output_file(args.report, "--report"), hosts=args.hosts, duration=args.duration, seed=args.seed,
                   progress=lambda line: print(line, flush=True))
    print()
    if res.summary is not None:
        print(res.summary.text())
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s; lake {res.lake}")
    print(f"open the report: {res.report.resolve()}")
    print(f"try: unveil query --lake {res.lake} top-incidents   (unveil query --list for more)")
    return 0
