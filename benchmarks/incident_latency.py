"""Onset -> visible latency of incidents, in scheduler cycles, and false incidents on
healthy runs: simulated lakes swept cycle by cycle exactly as ``unveil schedule`` does
(one :func:`jobs.pipeline.run_cycle` per minute of data, lag 0: add the configured lag for
wall-clock latency).

Per injection type and seed: 3 hosts (``mixed`` workload), the fault on sim-01 from
3m20s for 5 minutes of a 10-minute run. An incident is *visible* at the first cycle whose
latest ``incidents`` rows hold a matched incident of the injected type on sim-01 (open or
closed). Latency in cycles: 1 = the first cycle whose data reaches past the onset.

    .venv/bin/python benchmarks/incident_latency.py --seeds 1 2
    .venv/bin/python benchmarks/incident_latency.py --seeds 11 12 --healthy-only --min-incident 0 30 60
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import math
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from ingest import lake
from ingest.simulator import INEFFICIENCIES, from_dict, simulate
from jobs.pipeline import SweepConfig, run_cycle
from knowledge_base import latest_incidents

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # the simulator's default start
ONSET = timedelta(minutes=3, seconds=20)
CYCLE = timedelta(minutes=1)


def make(root: Path, seed: int, typ: str | None, minutes: int, hosts: int = 3) -> Path:
    doc: dict[str, Any] = {"seed": seed, "duration": f"{minutes}m", "hosts": hosts, "workload": "mixed"}
    if typ is not None:
        doc["injections"] = [{"type": typ, "host": "sim-01", "start": "200s", "duration": "5m", "severity": 0.5}]
    sink = lake.LakeSink(root)
    simulate(from_dict(doc), [sink])
    sink.close()
    return root


def sweep(root: Path, cfg: SweepConfig, minutes: int,
          visible: Any = None) -> tuple[int | None, pl.DataFrame]:
    """Cycle by cycle; returns (first cycle ``visible(latest incidents)`` held, final latest)."""
    first = None
    inc = pl.DataFrame()
    for k in range(1, minutes + 1):
        run_cycle(root, cfg, now=T0 + k * CYCLE)
        if "incidents" in lake.tables(root):
            inc = latest_incidents(lake.read(root, "incidents"))
            if first is None and visible is not None and visible(inc):
                first = k
    return first, inc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--types", nargs="*", default=list(INEFFICIENCIES))
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--min-incident", type=float, nargs="+", default=[None], metavar="S",
                   help="min_incident_s values to compare (default: the SweepConfig default)")
    p.add_argument("--healthy-only", action="store_true", help="only the healthy runs (false incidents)")
    args = p.parse_args(argv)
    base = SweepConfig(lag=timedelta(0), compact_every=None, queue_remediations=False)
    t0 = time.perf_counter()
    first_cycle = math.floor(ONSET / CYCLE) + 1  # the first cycle whose horizon passes the onset
    with tempfile.TemporaryDirectory() as tmp:
        for mi in args.min_incident:
            cfg = base if mi is None else replace(base, min_incident_s=mi)
            print(f"\n## min_incident_s = {cfg.min_incident_s:g}; seeds {' '.join(map(str, args.seeds))}")
            lat: list[int] = []
            if not args.healthy_only:
                print("| type | seed | visible at cycle | latency (cycles) |")
                print("|---|---|---|---|")
                for typ in args.types:
                    for seed in args.seeds:
                        root = make(Path(tmp) / f"{typ}-{seed}-{mi}", seed, typ, args.minutes)

                        def seen(inc: pl.DataFrame, typ: str = typ) -> bool:
                            return inc.filter((pl.col("host") == "sim-01") & (pl.col("label_type") == typ)).height > 0

                        k, _ = sweep(root, cfg, args.minutes, seen)
                        if k is not None:
                            lat.append(k - first_cycle + 1)
                        print(f"| {typ} | {seed} | {k if k is not None else 'never'} | "
                              f"{k - first_cycle + 1 if k is not None else 'never'} |", flush=True)
                if lat:
                    print(f"\nmedian onset->visible latency: {statistics.median(lat):g} cycle(s) "
                          f"(max {max(lat)}; {len(lat)} of {len(args.types) * len(args.seeds)} runs visible)")
            false_inc = 0
            host_hours = 0.0
            for seed in args.seeds:
                root = make(Path(tmp) / f"healthy-{seed}-{mi}", seed, None, args.minutes)
                _, inc = sweep(root, cfg, args.minutes)
                n = inc.height
                false_inc += n
                host_hours += 3 * args.minutes / 60
                kinds = inc.group_by("status", "entry_id").len().sort("len", descending=True).rows() if n else []
                print(f"healthy seed {seed}: {n} incident(s) {kinds}", flush=True)
            print(f"healthy false incidents: {false_inc} in {host_hours:.2f} host-hours "
                  f"({false_inc / host_hours:.2f} per host-hour)  [{time.perf_counter() - t0:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
