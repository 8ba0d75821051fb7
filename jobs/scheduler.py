"""The periodic scheduler: APScheduler 3.x running :func:`jobs.cycle.run_cycle` every
``every`` seconds and :func:`jobs.cycle.maintain` (compaction, retention) every
``compact_every``.

One worker thread runs the jobs, so a sweep and a compaction never overlap; each job has
``max_instances=1`` (a run still going when the next is due is not doubled),
``coalesce=True`` (runs missed while the process was suspended collapse into one) and a
``misfire_grace_time`` of one period. Exactly-once processing does not depend on any of
that: the watermarks and the lake's scheduler lock (jobs.watermarks) carry it, even across
processes. SIGTERM/SIGINT stop the scheduler after the running job finishes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from ingest import lake as lake_mod
from jobs.config import SweepConfig
from jobs.cycle import CycleSummary, maintain, run_cycle
from jobs.engine import Engine, make_engine
from jobs.grid import floor_grid

log = logging.getLogger(__name__)


#: seconds a cycle waits past its horizon's lag: the agent's last commit before it is in
CYCLE_MARGIN = timedelta(seconds=2)


def cycle_anchor(now: datetime, step: timedelta, lag: timedelta) -> datetime:
    """A time, at most one ``step`` before ``now``, from which cycles every ``step`` (or a
    multiple) run ``lag`` + :data:`CYCLE_MARGIN` after a step boundary of the data grid: the
    first cycle to see a minute runs as soon as that minute is past the lag. Cycles at
    ``start + k x every`` ran at whatever second the scheduler started; started 11 s past a
    minute with the drill's 15-s lag, each cycle's horizon was the minute before, and every
    incident appeared a cycle later than it could (the drill: 122 s from the onset, against
    64 s on another day)."""
    base = floor_grid(now, step.total_seconds()) + (lag + CYCLE_MARGIN) % step
    return base if base <= now else base - step


class Scheduler:
    """Owns the APScheduler instance; :meth:`run` blocks until :meth:`stop` (or a signal)."""

    def __init__(self, lake: str | os.PathLike[str], cfg: SweepConfig, *, every: timedelta,
                 until: datetime | None = None, hosts: Sequence[str] | None = None,
                 progress: bool | None = None, on_cycle: Callable[[CycleSummary | None], None] | None = None,
                 max_cycles: int | None = None, lake_poll: float = 1.0) -> None:
        if every <= timedelta(0):
            raise ValueError(f"--every must be positive, not {every}")
        self.lake = lake_mod.as_root(lake)
        self.cfg = cfg
        self.every = every
        self.until = until
        self.hosts = hosts
        self.progress = progress
        self.on_cycle = on_cycle
        self.max_cycles = max_cycles
        self.lake_poll = lake_poll  # seconds between looks for a lake that is not there yet
        self.cycles = 0
        self.failures = 0
        self._engine: Engine | None = None  # opened by run(): the per-host work of every cycle
        self._stop = threading.Event()
        grace = max(1, int(every.total_seconds()))
        self._sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": grace},
            timezone=UTC,
        )

    def _sweep(self) -> None:
        if self._stop.is_set():
            return
        try:
            summary = run_cycle(self.lake, self.cfg, until=self.until, hosts=self.hosts, progress=self.progress,
                                should_stop=self._stop.is_set,
                                engine=self._engine)
        except Exception:  # a failed cycle is retried next period; the watermarks did not move
            self.failures += 1
            log.exception("sweep cycle failed; retrying in %s", self.every)
            summary = None
        self.cycles += 1
        if self.on_cycle is not None:
            self.on_cycle(summary)
        if self.max_cycles is not None and self.cycles >= self.max_cycles:
            self._stop.set()

    def _maintain(self) -> None:
        if self._stop.is_set():
            return
        try:
            maintain(self.lake, self.cfg)
        except Exception:
            log.exception("maintenance (compaction/retention) failed; retrying next period")

    def _wait_for_lake(self) -> bool:
        """Block until the lake directory exists: under a service manager the scheduler may
        start before the agent's first commit creates it. Says so once; False when stopped
        while waiting. A path that exists but is no directory is an error, not a wait (on
        object storage: the lake's bucket, which an operator creates)."""
        said = False
        while not lake_mod.exists(self.lake):
            if isinstance(self.lake, Path) and self.lake.exists():
                raise ValueError(f"lake {self.lake} exists but is not a directory")
            if not said:
                log.warning("waiting for the lake at %s (the agent creates it at its first commit)", self.lake)
                said = True
            if self._stop.wait(self.lake_poll):
                return False
        if said:
            log.info("lake %s is there: starting", self.lake)
        return True

    def stop(self, *_: Any) -> None:
        self._stop.set()

    def run(self, *, install_signals: bool = True) -> int:
        """Wait for the lake directory, then run until stopped; returns 0 (1 when every cycle
        failed)."""
        if install_signals:
            def handler(signum: int, _frame: FrameType | None) -> None:
                log.warning("signal %s: stopping after the running job", signal.Signals(signum).name)
                self._stop.set()

            signal.signal(signal.SIGTERM, handler)
            signal.signal(signal.SIGINT, handler)
        if not self._wait_for_lake():
            log.info("scheduler stopped before the lake appeared")
            return 0
        now = datetime.now(UTC)
        self._engine = make_engine(self.cfg.engine)  # (a process pool starts at its first map)
        # the first cycle at once, the others on the data grid (cycle_anchor): an interval
        # job counts from its previous run, so the first is a job of its own
        anchor = cycle_anchor(now, self.cfg.analysis_step or timedelta(minutes=1), self.cfg.lag)
        self._sched.add_job(self._sweep, DateTrigger(now, timezone=UTC), id="sweep-first", name="first sweep")
        self._sched.add_job(self._sweep, IntervalTrigger(seconds=self.every.total_seconds(), start_date=anchor,
                                                         timezone=UTC),
                            id="sweep", name="sweep")
        if self.cfg.compact_every is not None:
            self._sched.add_job(self._maintain,
                                IntervalTrigger(seconds=self.cfg.compact_every.total_seconds(), timezone=UTC),
                                id="maintenance", name="compaction and retention")
        self._sched.start()
        log.info("scheduler started on %s: sweep every %s", self.lake, self.every)
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self._sched.shutdown(wait=True)  # lets the running job finish
            self._engine.close()
            self._engine = None
            log.info("scheduler stopped after %d cycle(s)", self.cycles)
        return 1 if self.cycles and self.failures == self.cycles else 0
