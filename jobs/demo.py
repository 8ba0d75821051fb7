"""``unveil demo``: the whole pipeline on a simulated fleet, in about a minute, no server.

Stages (each a function over the other packages' public APIs):

1. :func:`simulate_fleet` — ingest.simulator writes a small fleet with injected silent
   inefficiencies (:data:`DEMO_SCENARIO`: 4 hosts x 15 min, 5 injection types) to the lake;
2. :func:`scheduled_sweeps` — the scheduler's own cycle (:func:`jobs.cycle.run_cycle`)
   catches up over the run in :data:`SWEEP_CHUNK` sweeps, exactly as ``unveil schedule``
   would after an outage: features, scores and findings, knowledge-base matching,
   incidents, and remediations proposed to the queue (dry-run: nothing is executed;
   review with ``unveil remediate``), all written back to the lake;
3. :func:`jobs.report.write_report` — the HTML report and its terminal summary.

The default lake is ``./unveil-demo/lake`` with the report at ``./unveil-demo/report.html``.
A demo directory is marked (``.unveil-demo``) and is replaced on the next run; an existing
directory without the mark is never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ingest import lake as lake_mod
from jobs.report import ReportSummary, write_report

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("unveil-demo")
SWEEP_CHUNK = timedelta(minutes=5)  # one scheduled sweep per 5 minutes of telemetry
MARKER = ".unveil-demo"

#: The demo fleet: one host per injected inefficiency type (plus a second one on host 0),
#: each starting after a healthy stretch so the self reference sees both.
DEMO_SCENARIO: dict[str, Any] = {
    "name": "demo",
    "seed": 7,
    "start": "2026-01-05T08:00:00Z",
    "duration": "15m",
    "hosts": 4,
    "workload": "llm_serving",
    "injections": [
        {"type": "gpu_power_throttle", "host": "sim-00", "start": "5m", "duration": "6m", "severity": 0.6},
        {"type": "nic_drops", "host": "sim-00", "start": "12m", "duration": "150s", "severity": 0.7},
        {"type": "irq_locality_miss", "host": "sim-01", "start": "4m", "duration": "7m", "severity": 0.8},
        {"type": "thp_coverage_loss", "host": "sim-02", "start": "5m", "duration": "7m", "severity": 0.8},
        {"type": "cpu_governor_powersave", "host": "sim-03", "start": "6m", "duration": "5m", "severity": 0.8},
    ],
}


class DemoError(ValueError):
    """The demo cannot run (e.g. its directory holds data it did not create)."""


@dataclass
class StageTime:
    name: str
    seconds: float
    note: str = ""


@dataclass
class DemoResult:
    lake: Path
    report: Path
    start: datetime
    end: datetime
    injected: list[tuple[str, str]] = field(default_factory=list)  # (host, type)
    cycle: Any = None  # jobs.cycle.CycleSummary
    incidents: int = 0
    remediations: int = 0
    summary: ReportSummary | None = None
    stages: list[StageTime] = field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        return sum(s.seconds for s in self.stages)


# ---------------------------------------------------------------------------- stages


def demo_scenario(*, hosts: int | None = None, duration: str | None = None, seed: int | None = None) -> Any:
    """The demo :class:`ingest.simulator.Scenario`, optionally smaller/shorter (tests)."""
    from ingest.simulator import from_dict
    from ingest.simulator.scenario import parse_duration_s

    doc = dict(DEMO_SCENARIO)
    sc = from_dict(doc, source="jobs.demo.DEMO_SCENARIO")
    return sc.with_overrides(hosts=hosts, seed=seed,
                             duration_s=parse_duration_s(duration, "duration") if duration else None)


def simulate_fleet(lake: str | os.PathLike[str], scenario: Any) -> Any:
    """Stage 1: write the scenario's telemetry, host facts and labels to the lake."""
    from ingest.simulator import simulate

    sink = lake_mod.LakeSink(lake)
    try:
        return simulate(scenario, [sink])
    finally:
        sink.close()


def scheduled_sweeps(lake: str | os.PathLike[str], start: datetime, end: datetime,
                     chunk: timedelta | None = None) -> Any:
    """Stage 2: one scheduler cycle from ``start`` (the hosts' first watermark) up to
    ``end``, in sweeps of ``chunk``: analysis, matching, incidents, remediation proposals,
    write-back. Returns the :class:`jobs.cycle.CycleSummary`."""
    from jobs.config import SweepConfig
    from jobs.cycle import run_cycle

    cfg = SweepConfig(chunk=chunk or SWEEP_CHUNK, lag=timedelta(0), start_at=start, compact_every=None,
                      queue_remediations=True, auto_remediate=False)
    summary = run_cycle(lake, cfg, now=end, progress=False)
    if summary is None:  # only if another scheduler holds this fresh lake's lock
        raise DemoError(f"another scheduler is sweeping {lake}; run the demo on another --lake")
    return summary


# ------------------------------------------------------------------------------ run


def prepare_dir(path: Path) -> None:
    """Create ``path`` for a demo, replacing a previous demo there; refuse anything else."""
    if path.exists():
        if not path.is_dir():
            raise DemoError(f"{path} exists and is not a directory")
        if any(path.iterdir()):
            if not (path / MARKER).exists():
                raise DemoError(f"{path} is not empty and was not made by `unveil demo`: "
                                "choose another --lake (the demo never overwrites other data)")
            shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by `unveil demo`; replaced on the next run\n", encoding="utf-8")


def run_demo(lake: str | os.PathLike[str] | None = None, report: str | os.PathLike[str] | None = None, *,
             hosts: int | None = None, duration: str | None = None, seed: int | None = None,
             progress: Callable[[str], None] | None = None) -> DemoResult:
    """Run every stage; ``progress`` gets one line per finished stage."""
    say = progress or (lambda line: log.info("%s", line))
    lake_p = Path(lake) if lake is not None else DEFAULT_DIR / "lake"
    report_p = Path(report) if report is not None else (
        DEFAULT_DIR / "report.html" if lake is None else lake_p.parent / f"{lake_p.name}-report.html")
    prepare_dir(lake_p)
    sc = demo_scenario(hosts=hosts, duration=duration, seed=seed)
    start, end = sc.start, sc.start + timedelta(seconds=sc.duration_s)
    res = DemoResult(lake_p, report_p, start, end,
                     injected=[(i.host, i.type) for i in sc.injections])

    def stage(name: str, fn: Callable[[], Any], note: Callable[[Any], str]) -> Any:
        t = time.perf_counter()
        out = fn()
        st = StageTime(name, time.perf_counter() - t, note(out))
        res.stages.append(st)
        say(f"[{res.elapsed_s:5.1f} s] {name}: {st.note} ({st.seconds:.1f} s)")
        return out

    stage("simulate", lambda: simulate_fleet(lake_p, sc),
          lambda r: f"{len(sc.hosts)} hosts x {sc.duration_s / 60:g} min, {len(sc.injections)} injections "
                    f"({', '.join(sorted({i.type for i in sc.injections}))}), {sum(r.rows.values())} rows")
    cycle = stage("scheduled sweeps", lambda: scheduled_sweeps(lake_p, start, end),
                  lambda c: f"{len(c.chunks)} sweeps: {c.windows} windows, {c.findings} findings, "
                            f"{c.incidents} incidents opened or updated, {sum(ch.remediations for ch in c.chunks)} remediations "
                            "proposed (dry-run: none executed)")
    res.cycle = cycle
    res.incidents = cycle.incidents
    res.remediations = sum(ch.remediations for ch in cycle.chunks)
    res.summary = stage("report", lambda: write_report(lake_p, report_p, start, end),
                        lambda s: f"{s.plots} plots -> {report_p}")
    return res
