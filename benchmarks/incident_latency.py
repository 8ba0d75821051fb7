"""Onset -> visible latency of incidents, in scheduler cycles, and false incidents on
healthy runs: simulated lakes swept cycle by cycle exactly as ``unveil schedule`` does
(one :func:`jobs.cycle.run_cycle` per minute of data, lag 0: add the configured lag for
wall-clock latency).

Per injection type and seed: 3 hosts (``mixed`` workload), the fault on sim-01 from
3m20s for 5 minutes of a 10-minute run. An incident is *visible* at the first cycle whose
latest ``incidents`` rows hold a matched incident of the injected type on sim-01 (open or
closed). Latency in cycles: 1 = the first cycle whose data reaches past the onset.

    .venv/bin/python benchmarks/incident_latency.py --seeds 1 2          # ~10 min on a 2-core VM
    .venv/bin/python benchmarks/incident_latency.py --seeds 11 12 --min-incident 0 30

One sweep per run (min_incident_s 0) serves every threshold: an incident is raised under
``min_incident_s = X`` once it spans X seconds. Healthy runs: 4 hosts, no injection.
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import math
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from ingest import lake
from ingest.simulator import INEFFICIENCIES, from_dict, simulate
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from knowledge_base import INCIDENT_SCHEMA, latest_incidents

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


def sweep(root: Path, cfg: SweepConfig, minutes: int) -> list[pl.DataFrame]:
    """Cycle by cycle (min_incident_s 0: every incident); the latest incidents after each."""
    seen = []
    for k in range(1, minutes + 1):
        run_cycle(root, cfg, now=T0 + k * CYCLE)
        inc = (latest_incidents(lake.read(root, "incidents")) if "incidents" in lake.tables(root)
               else pl.DataFrame(schema=INCIDENT_SCHEMA))
        seen.append(inc)
    return seen


def persisted(inc: pl.DataFrame, min_s: float) -> pl.DataFrame:
    """The incidents a sweep with ``min_incident_s = min_s`` raises (open ones as far as they
    spanned then)."""
    if inc.is_empty():
        return inc
    return inc.filter((pl.col("end") - pl.col("start")).dt.total_microseconds() >= round(min_s * 1e6))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--types", nargs="*", default=list(INEFFICIENCIES))
    p.add_argument("--minutes", type=int, default=10, help="length of the fault runs")
    p.add_argument("--healthy-minutes", type=int, default=20, help="length of the healthy runs (4 hosts)")
    p.add_argument("--min-incident", type=float, nargs="+", default=[0.0, 5.0, 10.0, 20.0, 30.0, 60.0], metavar="S",
                   help="min_incident_s values to compare (one sweep per run serves them all)")
    args = p.parse_args(argv)
    cfg = SweepConfig(lag=timedelta(0), compact_every=None, queue_remediations=False, min_incident_s=0.0,
                      min_unmatched_s=0.0)
    t0 = time.perf_counter()
    first_cycle = math.floor(ONSET / CYCLE) + 1  # the first cycle whose horizon passes the onset
    lat: dict[float, list[int | None]] = {m: [] for m in args.min_incident}
    false_fault: dict[float, int] = dict.fromkeys(args.min_incident, 0)
    false_healthy: dict[float, list[str]] = {m: [] for m in args.min_incident}
    with tempfile.TemporaryDirectory() as tmp:
        for typ in args.types:
            for seed in args.seeds:
                seen = sweep(make(Path(tmp) / f"{typ}-{seed}", seed, typ, args.minutes), cfg, args.minutes)
                row = []
                for m in args.min_incident:
                    k = next((i + 1 for i, inc in enumerate(seen) if persisted(inc, m).filter(
                        (pl.col("host") == "sim-01") & (pl.col("label_type") == typ)).height), None)
                    lat[m].append(None if k is None else k - first_cycle + 1)
                    # incidents on the hosts without a fault
                    false_fault[m] += persisted(seen[-1], m).filter(pl.col("host") != "sim-01").height
                    row.append("never" if k is None else str(k - first_cycle + 1))
                print(f"{typ} seed {seed}: visible after " + ", ".join(
                    f"{m:g}s: {r}" for m, r in zip(args.min_incident, row, strict=True))
                      + f" cycle(s)  [{time.perf_counter() - t0:.0f} s]", flush=True)
        hh = 0.0
        for seed in args.seeds:
            seen = sweep(make(Path(tmp) / f"healthy-{seed}", seed, None, args.healthy_minutes, hosts=4), cfg,
                         args.healthy_minutes)
            hh += 4 * args.healthy_minutes / 60
            for m in args.min_incident:
                inc = persisted(seen[-1], m)
                false_healthy[m] += [f"{r['status']}:{r['entry_id'] or '-'}:{r['n_windows']}w"
                                     for r in inc.iter_rows(named=True)]
            print(f"healthy seed {seed}: {seen[-1].height} incident(s) at min 0  [{time.perf_counter() - t0:.0f} s]",
                  flush=True)
    print(f"\n| min_incident_s | median latency (cycles) | max | visible | false incidents, healthy runs "
          f"({hh:.2f} host-h) | per host-hour | false incidents, fault runs' other hosts |")
    print("|---|---|---|---|---|---|---|")
    for m in args.min_incident:
        got = [x for x in lat[m] if x is not None]
        med = f"{statistics.median(got):g}" if got else "n/a"
        print(f"| {m:g} | {med} | {max(got) if got else 'n/a'} | {len(got)}/{len(lat[m])} | "
              f"{len(false_healthy[m])} {sorted(false_healthy[m])[:6]} | {len(false_healthy[m]) / hh:.2f} | "
              f"{false_fault[m]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
