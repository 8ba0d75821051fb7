"""False incidents on healthy simulated fleets, swept the way production runs (issue 15).

A healthy fleet (no injection) is simulated into a fresh lake and swept by the scheduler's
own cycle (:func:`jobs.cycle.run_cycle`) once per simulated minute with the default
``SweepConfig`` (as ``benchmarks/id_matrix.py`` does), then every final incident is a false
one. Printed per seed and per split (tuning / held-out): false incidents per 24 host-hours
and their breakdown by entry (or ``unmatched``), length, second of the minute they start
at, and the detectors that flagged their windows.

    PYTHONPATH=. .venv/bin/python benchmarks/healthy_fleet.py --seeds 1 2 --held-out 11 12
    PYTHONPATH=. .venv/bin/python benchmarks/healthy_fleet.py --hosts 8 --minutes 60 --profile realistic
    PYTHONPATH=. .venv/bin/python benchmarks/healthy_fleet.py --config my.toml   # another [analytics] setting

The fleet is id_matrix's mixed one (serving and training hosts alternating, 8 and 4 NICs),
with the simulator's ``realistic`` profile (benign diversity) unless ``--profile uniform``.
Nothing may be tuned on the held-out seeds.
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.id_matrix import (  # noqa: E402
    CYCLE,
    cached_lake,
    cycle_times,
    final_incidents,
    sweep_config,
)


def fleet_doc(seed: int, hosts: int, minutes: int, profile: str) -> dict[str, Any]:
    """The scenario document of a healthy mixed fleet."""
    return {"seed": seed, "duration": f"{minutes}m", "profile": profile,
            "hosts": [{"name": f"sim-{i:02d}", "workload": ("llm_serving", "training")[i % 2],
                       "nics": 4 if i % 2 else 8} for i in range(hosts)]}


def lake_of(doc: dict[str, Any], dest: Path, cache: Path | None) -> None:
    """Simulate ``doc`` into the fresh lake ``dest`` (copied from ``cache`` when there)."""
    cached_lake(doc, "healthy", dest, cache)


def breakdown(final: pl.DataFrame, findings: pl.DataFrame) -> list[dict[str, Any]]:
    """One dict per final incident: host, status, entry, start, length, start second, and
    the detectors that flagged its windows (counts over its findings)."""
    out: list[dict[str, Any]] = []
    if final.is_empty():
        return out
    for r in final.sort("host", "start").iter_rows(named=True):
        f = findings.filter((pl.col("host") == r["host"]) & (pl.col("window_start") >= r["start"])
                            & (pl.col("window_end") <= r["end"])) if findings.height else findings
        dets: collections.Counter[str] = collections.Counter()
        refs: collections.Counter[str] = collections.Counter()
        for ds, ref in zip(f["detectors"].to_list() if f.height else [], f["reference"].to_list() if f.height else [],
                           strict=True):
            dets["+".join(sorted(ds)) or "-"] += 1
            refs[str(ref)] += 1
        out.append({"host": r["host"], "status": r["status"], "entry": r["entry_id"] or "unmatched",
                    "start": r["start"].isoformat(), "length_s": (r["end"] - r["start"]).total_seconds(),
                    "start_second": r["start"].second, "n_windows": r["n_windows"], "detectors": dict(dets),
                    "references": dict(refs)})
    return out


def run(seed: int, hosts: int, minutes: int, profile: str, cfg: Any, cache: Path | None, tmp: Path,
        keep: Path | None = None, every: timedelta = CYCLE) -> dict[str, Any]:
    from ingest import lake
    from jobs.cycle import run_cycle

    t0 = time.perf_counter()
    root = tmp / f"healthy-{seed}"
    shutil.rmtree(root, ignore_errors=True)
    lake_of(fleet_doc(seed, hosts, minutes, profile), root, cache)
    horizons: list[datetime] = []
    for k, now in enumerate(cycle_times(minutes, cfg.lag, every), 1):
        s = run_cycle(root, cfg, now=now)
        if s is None or s.horizon is None:
            raise RuntimeError(f"seed {seed}: cycle {k} did not run")
        horizons.append(s.horizon)
    tables = lake.tables(root)
    rows = lake.read(root, "incidents") if "incidents" in tables else pl.DataFrame()
    findings = lake.read(root, "findings") if "findings" in tables else pl.DataFrame()
    final, superseded = final_incidents(rows, horizons[-1]) if rows.height else (rows, 0)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        if findings.height:
            findings.write_parquet(keep / f"findings-{seed}.parquet")
        if rows.height:
            rows.write_parquet(keep / f"incidents-{seed}.parquet")
    shutil.rmtree(root, ignore_errors=True)
    host_hours = hosts * minutes / 60
    return {"seed": seed, "hosts": hosts, "minutes": minutes, "profile": profile, "host_hours": host_hours,
            "false": final.height, "per_24_host_hours": final.height / host_hours * 24, "superseded": superseded,
            "findings": findings.height, "incidents": breakdown(final, findings),
            "seconds": round(time.perf_counter() - t0, 1)}


def summary(name: str, runs: list[dict[str, Any]]) -> str:
    incs = [i for r in runs for i in r["incidents"]]
    hh = sum(r["host_hours"] for r in runs)
    n = len(incs)
    out = [f"\n## {name} seeds {' '.join(str(r['seed']) for r in runs)}: {n} false incident(s) in {hh:.2f} host-h"
           f" = {n / hh * 24 if hh else float('nan'):.1f} per 24 host-h (target <= 1)"]
    for r in runs:
        out.append(f"- seed {r['seed']}: {r['false']} ({r['per_24_host_hours']:.1f} / 24 host-h), "
                   f"{r['findings']} findings, superseded {r['superseded']}, {r['seconds']:.0f} s")

    def tally(key: Any, label: str) -> None:
        c = collections.Counter(key(i) for i in incs)
        out.append(f"by {label}: " + ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))

    tally(lambda i: i["entry"], "entry")
    tally(lambda i: ("<30 s" if i["length_s"] < 30 else "30-59 s" if i["length_s"] < 60 else
                     "60-65 s" if i["length_s"] <= 65 else "66-180 s" if i["length_s"] <= 180 else ">180 s"), "length")
    tally(lambda i: i["start_second"], "start second")
    det: collections.Counter[str] = collections.Counter()
    for i in incs:
        det.update(i["detectors"])
    out.append("windows by detectors: " + ", ".join(f"{k}: {v}" for k, v in det.most_common()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="*", default=[1, 2], help="tuning seeds")
    p.add_argument("--held-out", type=int, nargs="*", default=[11, 12], help="held-out seeds (never tuned on)")
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--minutes", type=int, default=30)
    p.add_argument("--profile", default="realistic", choices=("realistic", "uniform"))
    p.add_argument("--cache", type=Path, help="keep simulated lakes here")
    p.add_argument("--keep", type=Path, help="write each run's findings and incident rows here")
    p.add_argument("--json", type=Path)
    p.add_argument("--config", type=Path, help="sweep with this config file's [analytics] and [scheduler] "
                   "(default: none, production's defaults)")
    args = p.parse_args(argv)
    if set(args.seeds) & set(args.held_out):
        p.error("a seed is in both the tuning and the held-out set")
    cfg, every = sweep_config(p, args.config)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="healthy_fleet-") as tmp:
        for name, seeds in (("tuning", args.seeds), ("held-out", args.held_out)):
            runs = []
            for seed in seeds:
                runs.append(run(seed, args.hosts, args.minutes, args.profile, cfg, args.cache, Path(tmp), args.keep,
                                every))
                print(f"[{name}] seed {seed}: {runs[-1]['false']} false, {runs[-1]['seconds']:.0f} s",
                      file=sys.stderr, flush=True)
            out[name] = runs
            if runs:
                print(summary(name, runs), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
