"""Replay a drill lake's telemetry through the scheduler's verdict and score it per fault.

Copies the telemetry tables and host facts of a lake written by ``unveil drill`` into a
fresh lake, runs one scheduler cycle over it (``analysis_step`` makes a backfill judge each
minute on its past only, as the live scheduler did), and prints every incident with the
drill phase it overlaps, then per fault the entries matched and the incidents overlapping
no fault. Used to judge knowledge-base changes on real recordings without re-running faults:

    .venv/bin/python benchmarks/drill_replay.py /tmp/drill-real2/lake /tmp/replay-lake
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from ingest import lake as lake_mod
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from jobs.telemetry import telemetry_tables


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a drill's lake (with drill_scorecard)")
    p.add_argument("dst", type=Path, help="scratch lake to write (replaced)")
    p.add_argument("--lag", type=float, default=15.0, help="scheduler lag in seconds (the drill's default)")
    a = p.parse_args()
    if a.dst.exists():
        shutil.rmtree(a.dst)
    a.dst.mkdir(parents=True)
    for t in [*telemetry_tables(a.src), "host_facts"]:
        shutil.copytree(a.src / t, a.dst / t)
    card = lake_mod.read(a.src, "drill_scorecard").select("fault", "onset", "restored", "expected_entry")
    end: datetime = lake_mod.read(a.src, "features")["window_end"].max()  # type: ignore[assignment]
    cfg = SweepConfig(lag=timedelta(seconds=a.lag), queue_remediations=False, compact_every=None)
    run_cycle(a.dst, cfg, now=end + timedelta(minutes=2), progress=False)
    inc = lake_mod.read(a.dst, "incidents").sort("start").unique("incident_id", keep="last", maintain_order=True)
    faults = [r for r in card.iter_rows() if r[0] != "healthy"]

    def phase(s: datetime, e: datetime) -> str:
        return ",".join(f for f, o, r, _ in faults if s < r and e > o) or "-"

    rows = [(phase(s, e), s.strftime("%H:%M:%S"), int((e - s).total_seconds()), st, ent)
            for s, e, st, ent in inc.select("start", "end", "status", "entry_id").iter_rows()]
    for r in rows:
        print(*r)
    for f, _, _, exp in faults:
        print(f"{f:7s} expected {exp:22s} got {[x[4] for x in rows if f in x[0].split(',')]}")
    print("incidents overlapping no fault:", [x[4] for x in rows if x[0] == "-"])


if __name__ == "__main__":
    main()
