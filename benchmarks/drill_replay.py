"""Replay a drill lake's telemetry through the current scheduler and score it like the drill.

Copies the telemetry tables and host facts of a lake written by ``unveil drill`` into a
fresh lake and sweeps it as the drill's live scheduler did: one cycle every ``--every``
seconds of the recording (``now`` = the drill's start + k x every, lag ``--lag``), so each
minute is judged on its past only and an incident becomes visible at the first cycle that
writes it. The drill's own scoring (:func:`jobs.drill.scorecard`) then scores the replay,
with ``visible_at`` = that cycle's time. ``--backfill`` sweeps the whole recording in one
cycle instead (the verdict must not depend on it; the latencies then mean nothing).

Printed: the scorecard, then every incident (phase it overlaps, start, length, entry, how
many of its windows matched, and what fired: the matched signals, or the fingerprint of an
unmatched one). Used to judge knowledge-base changes on real recordings without re-running
faults (the source lake is only read):

    .venv/bin/python benchmarks/drill_replay.py /tmp/drill-s6/lake /tmp/replay-lake
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import re
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from ingest import lake as lake_mod
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from jobs.drill import FaultWindow, format_scorecard, scorecard
from jobs.telemetry import telemetry_tables
from knowledge_base import latest_incidents


def fault_windows(card: pl.DataFrame, recovery: timedelta) -> list[FaultWindow]:
    """The drill's fault windows back from its scorecard: a fault's recovery lasted until the
    next fault's onset (the last one: ``recovery``)."""
    rows = card.filter(pl.col("fault") != "healthy").sort("onset").iter_rows(named=True)
    out: list[FaultWindow] = []
    for r in rows:
        if out:
            out[-1].recovered = r["onset"]
        out.append(FaultWindow(r["fault"], r["expected_entry"], r["method"] or "", r["onset"], r["restored"],
                               r["restored"] + recovery, r["skipped"]))
    return out


def replay(src: Path, dst: Path, *, every: timedelta, lag: timedelta, backfill: bool = False) -> tuple[
        pl.DataFrame, dict[str, datetime]]:
    """Copy ``src``'s telemetry to ``dst`` (replaced) and sweep it; returns the source scorecard and
    incident id -> the cycle time it was first written."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for t in [*telemetry_tables(src), "host_facts"]:
        shutil.copytree(src / t, dst / t)
    card = lake_mod.read(src, "drill_scorecard")
    started: datetime = card.filter(pl.col("fault") == "healthy")["onset"][0]
    end: datetime = lake_mod.read(src, "features")["window_end"].max()  # type: ignore[assignment]
    cfg = SweepConfig(lag=lag, queue_remediations=False, compact_every=None)
    seen: dict[str, datetime] = {}
    times = [end + 2 * every] if backfill else [
        started + k * every for k in range(int((end - started) / every) + 4)]
    for now in times:
        run_cycle(dst, cfg, now=now, progress=False)
        if "incidents" in lake_mod.tables(dst):
            for i in lake_mod.read(dst, "incidents")["incident_id"].unique().to_list():
                seen.setdefault(i, now)
    return card, seen


def what_fired(explanation: str) -> str:
    """The matched signals (or an unmatched incident's fingerprint) of an incident's explanation."""
    m = re.search(r": matched (.*?)(; missing|; excluded|; contradicted|$)", explanation)
    if m:
        return m.group(1)
    m = re.search(r"fingerprint: (.*)", explanation)
    return m.group(1) if m else explanation[:120]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a drill's lake (with drill_scorecard); only read")
    p.add_argument("dst", type=Path, help="scratch lake to write (replaced)")
    p.add_argument("--lag", type=float, default=15.0, help="scheduler lag in seconds (the drill's default)")
    p.add_argument("--every", type=float, default=60.0, help="scheduler period in seconds (the drill's default)")
    p.add_argument("--recovery", type=float, default=60.0, help="the drill's recovery seconds (the last fault's)")
    p.add_argument("--backfill", action="store_true", help="one cycle over the whole recording")
    a = p.parse_args()
    card, seen = replay(a.src, a.dst, every=timedelta(seconds=a.every), lag=timedelta(seconds=a.lag),
                        backfill=a.backfill)
    host = str(card["host"][0])
    windows = fault_windows(card, timedelta(seconds=a.recovery))
    started = card.filter(pl.col("fault") == "healthy")["onset"][0]
    out = scorecard(a.dst, host, str(card["run_id"][0]), started, windows,
                    healthy_end=windows[0].onset if windows else started, first_seen=seen)
    print(format_scorecard(out))
    inc = (latest_incidents(lake_mod.read(a.dst, "incidents")).sort("start")
           if "incidents" in lake_mod.tables(a.dst) else pl.DataFrame())

    def phase(s: datetime, e: datetime) -> str:
        hit = [w.fault for w in windows if s < w.restored and e > w.onset]
        if hit:
            return ",".join(hit)
        rec = [f"after {w.fault}" for w in windows if s < w.recovered and e > w.restored]
        return ",".join(rec) or "healthy"

    print("incidents (phase, start, seconds, entry, windows matched/all, what fired):")
    for r in inc.iter_rows(named=True):
        n_m = round(r["match_share"] * r["n_windows"])
        print(f"  {phase(r['start'], r['end']):14s} {r['start']:%H:%M:%S} {(r['end'] - r['start']).total_seconds():4.0f} s "
              f"{r['entry_id'] or 'unmatched':22s} {n_m:3d}/{r['n_windows']:<3d} {what_fired(r['explanation'])[:160]}")


if __name__ == "__main__":
    main()
