"""``unveil simulate``: write a simulated GPU fleet's telemetry (with ground truth) into the lake.

Without ``--scenario`` the fleet is healthy. ``--scenario`` takes a TOML file or the name of
a scenario shipped with the package (``--list`` shows them). ``--duration``, ``--seed`` and
``--start`` override the scenario's values, and ``--hosts`` its number of hosts (a scenario
that names its hosts keeps them). Injections that would start after a shorter
``--duration`` are left out, and the command says which.
"""

from __future__ import annotations

import argparse
import functools
import sys

from ingest.durations import readable
from ingest.lake import LakeSink
from ingest.simulator import INEFFICIENCIES, Scenario, named, resolve_scenario, simulate
from ingest.simulator.scenario import counted_hosts, parse_duration_s, parse_start
from ingest.sink import Sink
from jobs.engine import make_engine, parse_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a fleet of 8-GPU hosts (with labelled inefficiencies) into the lake",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lake", metavar="PATH", help="lake root directory (created if missing)")
    p.add_argument("--hosts", type=int, metavar="N", help="number of hosts (default: the scenario's, else 1)")
    p.add_argument("--duration", metavar="DUR", help="simulated time, e.g. 10m, 1h (default: the scenario's, else 1h)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed (default: the scenario's, else 0)")
    p.add_argument("--scenario", metavar="FILE|NAME", help="scenario TOML file or shipped scenario name")
    p.add_argument("--start", metavar="ISO", help="UTC start time, e.g. 2026-01-05T08:00:00Z")
    p.add_argument("--workload", choices=["llm_serving", "training", "idle", "mixed"],
                   help="workload of counted hosts without a scenario (default llm_serving)")
    p.add_argument("--influx-url", metavar="URL", help="also write to InfluxDB at this URL")
    p.add_argument("--engine", metavar="SPEC", default=None,
                   help="where hosts are simulated, each independently: serial, processes[:N], ray[:N] or "
                   "ray://HOST:PORT (default processes: one worker per local core); the lake is the same")
    p.add_argument("--list", action="store_true", help="list shipped scenarios and injection types, then exit")
    p.set_defaults(func=run)


def open_sinks(lake: str, influx_url: str | None = None) -> list[Sink]:
    """The lake (and InfluxDB at ``influx_url``) as sinks; top-level, so a worker process
    can be told to call it."""
    sinks: list[Sink] = [LakeSink(lake)]
    if influx_url:
        from ingest.influx import InfluxConfig, InfluxSink

        sinks.append(InfluxSink(InfluxConfig(url=influx_url)))
    return sinks


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("shipped scenarios: " + ", ".join(named()))
        print("injection types:   " + ", ".join(INEFFICIENCIES))
        return 0
    if not args.lake:
        raise ValueError("--lake PATH is required")
    if args.scenario:
        sc = resolve_scenario(args.scenario)
    else:
        wl = args.workload or "llm_serving"
        sc = Scenario(name="healthy", hosts=counted_hosts(1, wl), workload=wl)
    before = sc
    sc = sc.with_overrides(
        hosts=args.hosts,
        duration_s=parse_duration_s(args.duration, "--duration") if args.duration else None,
        seed=args.seed,
        start=parse_start(args.start, "--start") if args.start else None,
    )
    dropped = [i for i in before.injections if i not in sc.injections]
    if dropped:
        print(f"unveil simulate: warning: {len(dropped)} injection(s) of scenario {sc.name!r} left out "
              f"(they start after the {readable(sc.duration_s)} simulated, or on a host not simulated): "
              + ", ".join(f"{i.type} on {i.host} at {readable(i.start_s)}" for i in dropped), file=sys.stderr)
    spec = parse_spec(args.engine, "--engine")
    # hosts are independent: each runs as one item of the engine, with sinks of its own
    with make_engine(spec) as engine:
        res = simulate(sc, functools.partial(open_sinks, args.lake, args.influx_url), mapper=engine.map)
    n_lab = 0 if res.labels is None else res.labels.height
    print(
        f"simulated {len(sc.hosts)} host(s) x {readable(sc.duration_s)} (scenario {sc.name!r}, seed {sc.seed}) "
        f"into {args.lake}: {sum(res.rows.values()):,} rows in {len(res.rows)} tables, {n_lab} label(s); "
        f"{res.wall_s:.1f} s ({res.host_hours / max(res.wall_s, 1e-9):.2f} host-hours/s)",
        file=sys.stdout,
    )
    return 0
