"""The host agent: drift-free sampling of the registered collectors into the sinks.

Timing: tick k is due at ``t0 + k * interval`` on the monotonic clock. A tick that
would start more than half an interval late is not taken: it and every tick it overran
are counted as missed and sampling resumes at the next due tick, never bunched. Collectors run on tiers: ``fast``
every tick, ``medium`` every second, ``slow`` every 10 s, ``static`` (host facts)
at start and every minute — each a whole multiple of the fast interval.

Rows are buffered per measurement in columnar lists, turned into typed Polars frames
and written to every sink every ``flush_interval_s``. SIGTERM/SIGINT end the loop after
the current tick; the buffer is flushed and the sinks closed before ``run`` returns.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ingest import journal as journal_mod
from ingest import lake as lake_mod
from ingest import schema
from ingest.collectors.base import Block, Collector, CollectorError, Reading, SourceUnavailable
from ingest.counters import CounterStats, CounterTracker
from ingest.journal import Journal
from ingest.lake import LakeSink
from ingest.sink import Sink, SinkError

log = logging.getLogger(__name__)

#: Default tier of each collector, overriding its own when set here.
#: Only the cheap, fast-changing sources run every 100 ms by default: per-CPU time
#: (/proc/stat) and NVML. Interrupts, memory, NUMA, PSI, network, disk and cgroup
#: counters are read every second: their kernel-side resolution or the inefficiencies
#: they reveal (IRQ locality, THP coverage, drops, throttling) are seconds-scale, and
#: /proc/interrupts alone costs a third of a full read.
DEFAULT_TIERS: dict[str, str] = {"pressure": "medium"}

#: raw samples waiting for parsing at most, by count and by their bytes (a big host's
#: /proc/interrupts is ~0.6 MB a read); a flush parses them anyway
MAX_DEFERRED = 4096
MAX_DEFERRED_BYTES = 32 << 20


@dataclass
class AgentConfig:
    lake: str | Path | None = None  # a directory, or an s3:// URL (its journal: lake.state_root)
    host: str = field(default_factory=socket.gethostname)
    root: str = "/"
    interval_s: float = 0.1
    flush_interval_s: float = 10.0
    commit_interval_s: float = 60.0
    duration_s: float | None = None
    collectors: tuple[str, ...] | None = None  # None = every registered collector
    tiers: dict[str, str] = field(default_factory=dict)  # collector -> tier override
    all_fast: bool = False  # every source at the fast interval (benchmarks)
    compact_every_s: float = 600.0
    collector_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: rows kept in memory at most while the lake cannot take them (full disk); beyond it
    #: the oldest commit's rows are dropped from memory (their journaled part stays on disk)
    max_buffered_rows: int = 500_000
    #: cgroups watched besides the top-level ones (relative to the cgroup mount)
    cgroup_paths: tuple[str, ...] = ()
    #: fsync each journal append and lake file (the lake sink built for this agent uses it)
    durable: bool = False

    def validate(self) -> None:
        # the host names the journal directory and the partitions: checked before either exists
        try:
            lake_mod.check_host_name(self.host)
        except lake_mod.LakeError as exc:
            raise ValueError(f"agent.host: {exc}") from None
        if self.collectors is not None and not self.collectors:
            raise ValueError("agent.collectors is empty: name at least one collector (leave it out for all)")
        if not (0.01 <= self.interval_s <= 60):
            raise ValueError(f"agent.interval_s must be within 0.01..60 s, got {self.interval_s}")
        if self.flush_interval_s < self.interval_s:
            raise ValueError("agent.flush_interval_s must be at least agent.interval_s")
        if self.commit_interval_s < self.flush_interval_s:
            raise ValueError("agent.commit_interval_s must be at least agent.flush_interval_s")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("agent.duration_s must be positive")
        if self.max_buffered_rows < 1:
            raise ValueError("agent.max_buffered_rows must be positive")
        for key, names in (("collectors", self.collectors or ()), ("tiers", tuple(self.tiers))):
            if not names:
                continue
            from ingest.collectors import REGISTRY

            unknown = [n for n in names if n not in REGISTRY]
            if unknown:
                raise ValueError(f"agent.{key}: unknown collector(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(REGISTRY)}")
        for name, tier in self.tiers.items():
            if tier not in schema.TIER_PERIOD_S:
                raise ValueError(f"agent.tiers.{name}: unknown tier {tier!r}; known: {', '.join(schema.TIER_PERIOD_S)}")


@dataclass
class AgentStats:
    ticks: int = 0
    missed_ticks: int = 0
    sample_time_us: int = 0
    flushes: int = 0
    commits: int = 0
    rows_written: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)
    errors: int = 0
    rows_lost: int = 0  # rows neither the lake nor the journal took (memory bound, exit)
    #: rows of each table that this run sampled and wrote to the lake (without a lake: handed
    #: to the sinks); rows_written also counts the rows replayed from earlier runs' journals
    table_rows: dict[str, int] = field(default_factory=dict)
    rows_replayed: int = 0  # rows of earlier runs' journals committed by this run


def close_each(parts: Iterable[Collector | Sink], kind: str) -> None:
    """Close every one of ``parts`` (collectors or sinks); a failure is logged, and the
    others are still closed."""
    for part in parts:
        try:
            part.close()
        except Exception:
            log.exception("%s %s close failed", kind, part.name)


class NothingToCollect(ValueError):
    """Every selected collector is unavailable on this host: the agent would sample nothing."""


@functools.cache
def _column_types(measurement: schema.Measurement) -> tuple[tuple[str, pl.DataType], ...]:
    """A measurement's columns (without host) and their Polars types, in schema order."""
    return tuple(measurement.polars_schema(with_host=False).items())


@dataclass
class _Generation:
    """The rows of one journal file (``token``): those sampled between two commits. Kept
    in memory until every table is in the lake; tables leave ``buffers`` as they are."""

    token: str
    buffers: dict[str, _Buffer]

    def rows(self) -> int:
        return sum(b.n for b in self.buffers.values())

    def unjournaled(self) -> int:
        return sum(b.n - b.jmark for b in self.buffers.values())


@dataclass
class _Commit:
    """A commit pass in progress: the (generation, table) pairs still to write; a pass
    ends at its first failure (``error``)."""

    work: list[tuple[_Generation, str]]
    failed: int = 0
    error: str = ""


class _Buffer:
    """Columnar rows of one measurement since the last Parquet commit.

    ``mark`` counts the rows already handed to the streaming sinks, ``jmark`` those already
    in the journal (behind ``mark`` only while journal writes fail).
    Frames are built one typed Series per column, without Arrow: pyarrow (with
    pyarrow.compute) would add ~65 MiB to the agent's resident memory, and its per-frame
    cost is higher than Polars' own."""

    __slots__ = ("measurement", "columns", "n", "mark", "jmark", "types")

    def __init__(self, measurement: schema.Measurement) -> None:
        self.measurement = measurement
        self.types = _column_types(measurement)
        self.columns: dict[str, list[Any]] = {c: [] for c, _ in self.types}
        self.n = 0
        self.mark = 0
        self.jmark = 0

    def extend(self, times: list[int], n: int, tags: dict[str, list[str]], values: dict[str, list[Any]]) -> None:
        """Append ``n`` rows: their times (µs), tag columns and field columns."""
        cols = self.columns
        cols[schema.TIME].extend(times)
        for name, col in cols.items():
            if name == schema.TIME:
                continue
            src = tags.get(name)
            if src is None:
                src = values.get(name)
            if src is None:
                col.extend([None] * n)
            else:
                col.extend(src)
        self.n += n

    def since(self, i: int) -> dict[str, list[Any]]:
        """Rows ``i`` to the end (column slices)."""
        return {c: col[i:] for c, col in self.columns.items()}

    def take(self, host: str) -> pl.DataFrame:
        """Every buffered row as a frame with the host column; the buffer is emptied."""
        df = self.frame(self.columns, host)
        self.clear()
        return df

    def clear(self) -> None:
        for col in self.columns.values():
            col.clear()
        self.n = self.mark = self.jmark = 0

    def load(self, columns: dict[str, list[Any]]) -> None:
        """Append rows given as columns (a journal's); missing columns become nulls."""
        n = len(columns.get(schema.TIME, ()))
        for name, col in self.columns.items():
            col.extend(columns.get(name) or [None] * n)
        self.n += n

    def frame(self, columns: dict[str, list[Any]], host: str | None) -> pl.DataFrame:
        """A typed frame from column lists (missing columns become nulls), with a
        ``host`` column unless ``host`` is None."""
        n = len(columns.get(schema.TIME, ()))
        series = []
        for name, dtype in self.types:
            col = columns.get(name)
            if col is None:
                series.append(pl.Series(name, [None] * n, dtype=dtype))
            elif name == schema.TIME:
                series.append(pl.Series(name, col, dtype=pl.Int64).cast(dtype))
            else:
                # strict: a value of the wrong type raises, as the Arrow build did (NaN stays NaN)
                series.append(pl.Series(name, col, dtype=dtype))
        if host is not None:
            series.insert(1, pl.Series(schema.HOST, [host] * n, dtype=pl.String))
        return pl.DataFrame(series)

    def commit_to(self, lake: LakeSink, name: str, host: str, token_hex: str) -> int:
        """Commit every row to ``lake`` and empty the buffer. Rows of one hour (the usual
        case) go straight to their partition; others through the lake's split."""
        times = self.columns[schema.TIME]
        lo, hi = min(times), max(times)
        hour_us = 3_600_000_000
        if lo // hour_us == hi // hour_us:
            df = self.frame(self.columns, None)
            part = (host, datetime.fromtimestamp(lo / 1e6, UTC))
            written = lake.commit(name, df, token_hex, partition=part)
        else:
            written = lake.commit(name, self.frame(self.columns, host), token_hex)
        self.clear()
        return written


_COMPACT = "import sys\nfrom ingest import lake\nprint(lake.compact(sys.argv[1], hosts=sys.argv[2:] or None))"


def compact_in_child(root: str | Path, hosts: Sequence[str] | None = None) -> str:
    """``lake.compact(root, hosts=hosts)`` in a fresh interpreter (this one's, with this
    ``ingest`` importable, and the object-storage endpoint configured here); returns its
    stats as text. Raises LakeError when it fails."""
    from ingest import objstore
    from ingest.lake import LakeError

    env = dict(os.environ) | objstore.worker_env()
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _COMPACT, str(root), *(hosts or ())], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise LakeError(f"compaction of {root} (child process) failed: {tail[0]}")
    return proc.stdout.strip()


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        sinks: Sequence[Sink],
        collectors: Iterable[Collector] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config.validate()
        self.config = config
        self.sinks = list(sinks)
        # The first lake sink gets rows through the journal and periodic commits; every
        # other sink (InfluxDB, another lake) gets each flush's rows as frames.
        self._lake: LakeSink | None = next((s for s in self.sinks if isinstance(s, LakeSink)), None)
        self._streams = [s for s in self.sinks if s is not self._lake]
        local: Path | None = None
        if self._lake is not None:
            # on object storage the journal is in the lake's local state directory
            try:
                local = self._lake.root if self._lake.url is None else lake_mod.state_root(self._lake.url)
            except lake_mod.LakeError as exc:
                raise SinkError(f"agent: {exc}") from None
        self.stats = AgentStats()
        # the collectors before the journal: when none is available, nothing is created
        self.collectors: list[Collector] = (
            list(collectors) if collectors is not None else self._build_collectors()
        )
        if not self.collectors and self.stats.unavailable:
            self._close_collectors()
            raise NothingToCollect(
                "no collector is available on this host, nothing to sample: "
                + "; ".join(f"{name}: {why}" for name, why in self.stats.unavailable.items())
            )
        self._journal: Journal | None = None
        if local is not None:
            assert self._lake is not None
            try:
                self._journal = Journal(journal_mod.host_dir(local, config.host), durable=self._lake.durable)
            except BaseException:
                self._close_collectors()
                raise
        self._own_tokens: set[str] = set()  # the journal files of this run's rows
        self._clock = clock
        self._stop = threading.Event()
        self._trackers: dict[str, CounterTracker] = {}
        self._counter_stats = CounterStats()
        self._buffers: dict[str, _Buffer] = {}
        self._periods = {c.name: self._period_ticks(c) for c in self.collectors}
        # Collectors with sample()/parse() only read at the tick; parsing waits for the flush
        # (base.Sampled).
        self._samplers: dict[str, Callable[[], Any]] = {
            c.name: getattr(c, "sample") for c in self.collectors  # noqa: B009
            if callable(getattr(c, "sample", None)) and callable(getattr(c, "parse", None))
        }
        self._deferred: list[tuple[Collector, int, Any]] = []
        self._deferred_bytes = 0  # of the deferred samples that are bytes
        self._sync_requests: list[threading.Event] = []
        self._committing: _Commit | None = None
        self._sealed: list[_Generation] = []  # committed journal files whose rows the lake lacks
        self._journal_failing = False  # log a failing journal or lake once per episode
        self._commit_failing = False
        self._refused: set[str] = set()  # journal files refused once (another user's): not again
        self._failing: dict[str, int] = {}  # table -> the commit pass it last failed in
        self._warm_up()
        self._prime()
        self.replay_journals()
        self._last_commit = clock()

    def _warm_up(self) -> None:
        """Pay the one-time costs of the flush and commit paths (Polars series and frames,
        the Parquet writer's set-up: ~0.1 s of CPU) now, at start, rather than in the
        middle of the first commit where they cost ticks. It takes the very paths a commit
        and a streaming flush take, no others: every Polars code page touched here stays
        in the agent's resident memory."""
        buf = _Buffer(schema.SYSTEM)
        buf.extend([time.time_ns() // 1000], 1, {}, {"ctxt": [None]})
        if self._streams:
            buf.frame(buf.columns, self.config.host)
        if self._lake is not None:
            with tempfile.TemporaryDirectory(prefix="unveil-warmup-") as tmp:
                buf.commit_to(LakeSink(tmp, durable=False), schema.SYSTEM.name, self.config.host, "00000000")

    def _prime(self) -> None:
        """Parse one sample of each collector that learns its files' layout
        (``learns_layout``), and drop it: the full parse that learns it runs now rather
        than in the first flush, which then reads all its samples through the layout.
        Errors are left to the first ticks to report."""
        for c in self.collectors:
            sample = self._samplers.get(c.name)
            if sample is None or not getattr(c, "learns_layout", False):
                continue
            try:
                c.parse([sample()])  # type: ignore[attr-defined]
            except (CollectorError, OSError):
                pass

    # ------------------------------------------------------------------ set-up
    def _build_collectors(self) -> list[Collector]:
        from ingest.collectors import REGISTRY

        names = self.config.collectors or tuple(REGISTRY)
        built: list[Collector] = []
        for name in names:
            cls = REGISTRY.get(name)
            if cls is None:
                raise ValueError(f"unknown collector {name!r}; known: {', '.join(REGISTRY)}")
            try:
                options = dict(self.config.collector_options.get(name, {}))
                if name == "cgroup" and self.config.cgroup_paths:
                    options.setdefault("paths", list(self.config.cgroup_paths))
                built.append(cls(root=self.config.root, **options))
            except SourceUnavailable as exc:
                self.stats.unavailable[name] = str(exc)
                log.info("collector %s unavailable on this host: %s", name, exc)
        return built

    def _close_collectors(self) -> None:
        close_each(self.collectors, "collector")

    def _period_ticks(self, collector: Collector) -> int:
        tier = self.config.tiers.get(collector.name) or DEFAULT_TIERS.get(collector.name) or collector.tier
        if self.config.all_fast and tier != "static":
            tier = "fast"  # every telemetry source; host facts stay facts (a sysfs walk, once a minute)
        if tier == "fast":
            return 1
        return max(1, round(schema.TIER_PERIOD_S[tier] / self.config.interval_s))

    def stop(self) -> None:
        self._stop.set()

    def sync(self, timeout: float = 30.0) -> bool:
        """From another thread: have the sampling loop flush and commit everything
        buffered (after its current tick) and wait for it. True when done in time."""
        done = threading.Event()
        self._sync_requests.append(done)
        return done.wait(timeout)

    def _serve_sync(self) -> None:
        requests, self._sync_requests = self._sync_requests, []
        self.flush()
        self.commit()
        self._finish_commit()
        for done in requests:
            done.set()

    def _compaction_loop(self) -> None:
        """Merge the small files of closed hours in the background (never on the tick path),
        in a child process: Polars' Parquet reader, which a merge needs, would stay in the
        agent's resident memory once loaded (+12 MB, for a job of seconds once an hour).
        The child is started only when a closed partition has files that the last
        compaction did not leave there (a listing, every ``compact_every_s``)."""
        from ingest import lake, objstore

        assert self.config.lake is not None
        # on object storage (no lock) each host compacts its own partitions only
        hosts = [self.config.host] if objstore.is_url(self.config.lake) else None
        left: dict[Path, frozenset[str]] = {}
        while not self._stop.wait(self.config.compact_every_s):
            try:
                todo = lake.compaction_candidates(self.config.lake, hosts=hosts)
                if all(left.get(p) == files for p, files in todo.items()):
                    continue
                log.info("compaction: %s", compact_in_child(self.config.lake, hosts))
                left = lake.compaction_candidates(self.config.lake, hosts=hosts)
            except Exception:  # compaction failing must not stop sampling
                log.exception("compaction of %s failed", self.config.lake)

    # ---------------------------------------------------------------- sampling
    def _ingest(self, readings: list[Reading], ts: int) -> None:
        for r in readings:
            n = r.n_rows
            if n:
                self._ingest_rows(self._measurement(r), [ts], n, r.tags, dict(r.fields))

    @staticmethod
    def _measurement(r: Reading) -> schema.Measurement:
        return Agent._measurement_named(r.measurement)

    @staticmethod
    def _measurement_named(name: str) -> schema.Measurement:
        m = schema.MEASUREMENTS.get(name)
        if m is None:
            raise CollectorError(f"collector produced unknown measurement {name!r}")
        return m

    def _ingest_rows(self, m: schema.Measurement, stamps: list[int], n: int,
                     tags: dict[str, list[str]], values: dict[str, list[Any]]) -> None:
        """Buffer ``len(stamps)`` ticks of the same ``n`` series: ``tags`` for one tick,
        ``values`` (owned: changed in place) tick after tick; counters become deltas."""
        ticks = len(stamps)
        rows = n * ticks
        times = [ts for ts in stamps for _ in range(n)] if n > 1 else list(stamps)
        row_tags = tags if ticks == 1 else {k: v * ticks for k, v in tags.items()}
        if m.counters:
            tracker = self._trackers.get(m.name)
            if tracker is None:
                tracker = self._trackers[m.name] = CounterTracker(m.counters, self._counter_stats, m.polled)
            tag_cols = [tags.get(t, [""] * n) for t in m.tags]
            keys = list(zip(*tag_cols, strict=True)) if tag_cols else [()] * n
            values.update(tracker.deltas_run(keys, ticks, values))
            if m.sparse:  # rows whose counters all stayed still (or are null) are left out
                counters = [values[c] for c in m.counters if c in values]
                if len(counters) == 1:
                    keep = [i for i, v in enumerate(counters[0]) if v]
                else:
                    keep = [i for i in range(rows) if any(col[i] for col in counters)]
                if len(keep) < rows:
                    if not keep:
                        return
                    values = {k: [v[i] for i in keep] for k, v in values.items()}
                    row_tags = {k: [v[i] for i in keep] for k, v in row_tags.items()}
                    times = [times[i] for i in keep]
                    rows = len(keep)
        buf = self._buffers.get(m.name)
        if buf is None:
            buf = self._buffers[m.name] = _Buffer(m)
        buf.extend(times, rows, row_tags, values)

    def _collect(self, collector: Collector, ts: int) -> None:
        sample = self._samplers.get(collector.name)
        try:
            if sample is not None:
                raw = sample()
                self._deferred.append((collector, ts, raw))
                if type(raw) is bytes:
                    self._deferred_bytes += len(raw)
                if len(self._deferred) >= MAX_DEFERRED or self._deferred_bytes >= MAX_DEFERRED_BYTES:
                    self._parse_deferred()  # a long flush interval: bound the memory
            else:
                self._ingest(collector.collect(), ts)
        except CollectorError as exc:
            self.stats.errors += 1
            log.error("collector %s: %s", collector.name, exc)
        except OSError as exc:  # a file vanished (device unplugged, cgroup removed)
            self.stats.errors += 1
            log.error("collector %s: %s", collector.name, exc)

    def _parse_deferred(self) -> None:
        """Parse the raw samples of the collectors that split reading from parsing, in
        tick order (counter deltas need it), all at once: each collector gets all its
        samples in one ``parse(raws, errors)`` call (numpy over runs of samples laid out
        alike, see ingest.collectors.procfs.parse_runs); a sample it cannot parse is
        left out and reported."""
        deferred, self._deferred = self._deferred, []
        self._deferred_bytes = 0
        batches: dict[str, tuple[Collector, list[int], list[Any]]] = {}
        for collector, ts, raw in deferred:
            batch = batches.get(collector.name)
            if batch is None:
                batch = batches[collector.name] = (collector, [], [])
            batch[1].append(ts)
            batch[2].append(raw)
        for collector, stamps, raws in batches.values():
            errors: list[CollectorError] = []
            blocks: list[Block] = collector.parse(raws, errors)  # type: ignore[attr-defined]
            for exc in errors:
                self.stats.errors += 1
                log.error("collector %s: %s", collector.name, exc)
            for b in blocks:
                n = len(b.fields[next(iter(b.fields))]) // b.ticks if b.fields else 0
                if not n:
                    continue
                try:
                    self._ingest_rows(self._measurement_named(b.measurement), stamps[b.at : b.at + b.ticks],
                                      n, b.tags, b.fields)
                except CollectorError as exc:
                    self.stats.errors += 1
                    log.error("measurement %s: %s", b.measurement, exc)

    def _collect_facts(self, ts: int) -> None:
        for c in self.collectors:
            facts = getattr(c, "facts", None)
            if facts is None or "host_facts" in c.measurements:
                continue  # a host-facts collector already emits them from collect() on its tier
            try:
                reading = facts()
            except (CollectorError, OSError) as exc:
                log.error("collector %s facts: %s", c.name, exc)
                continue
            if reading is not None:
                self._ingest([reading], ts)

    def _agent_row(self, ts: int) -> None:
        ru_self = resource.getrusage(resource.RUSAGE_SELF)
        ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_us = int((ru_self.ru_utime + ru_self.ru_stime + ru_kids.ru_utime + ru_kids.ru_stime) * 1e6)
        s = self.stats
        self._ingest(
            [
                Reading(
                    "agent",
                    {},
                    {
                        "ticks": [s.ticks],
                        "missed_ticks": [s.missed_ticks],
                        "sample_time": [s.sample_time_us],
                        "cpu_time": [cpu_us],
                        "counter_wraps": [self._counter_stats.wraps],
                        "counter_resets": [self._counter_stats.resets],
                    },
                )
            ],
            ts,
        )

    # ------------------------------------------------------------------- flush
    def flush(self) -> None:
        """Hand the rows buffered since the last flush to the journal and the streaming
        sinks; commit to the lake when the commit interval has passed."""
        self._agent_row(time.time_ns() // 1000)
        self._parse_deferred()
        # Rows not yet journaled (more than this flush's when journal writes failed) and
        # rows not yet streamed: the same slices unless the journal fell behind.
        to_journal: dict[str, dict[str, list[Any]]] = {}
        starts: dict[str, int] = {}
        pending: dict[str, dict[str, list[Any]]] = {}
        for name, buf in self._buffers.items():
            if buf.n > buf.jmark:
                to_journal[name] = buf.since(buf.jmark)
                starts[name] = buf.jmark
                if buf.mark == buf.jmark:
                    pending[name] = to_journal[name]
            if buf.n > buf.mark and name not in pending:
                pending[name] = buf.since(buf.mark)
            buf.mark = buf.n
        if self._journal is not None and (to_journal or any(g.unjournaled() for g in self._sealed)):
            self._journal_rows(to_journal, starts)
        for name, cols in pending.items():
            if not self._streams:
                break
            df = self._buffers[name].frame(cols, self.config.host)
            for sink in self._streams:
                try:
                    sink.write(name, df)
                except Exception:  # a sink must never stop the agent
                    log.exception("sink %s failed to take %s rows of %s", sink.name, df.height, name)
        for sink in self._streams:
            try:
                sink.flush()
            except Exception:
                log.exception("sink %s flush failed", sink.name)
        if self._lake is None:
            for name, buf in self._buffers.items():
                self.stats.rows_written += buf.mark
                self._count(name, buf.mark)
                buf.clear()
        elif self._clock() - self._last_commit >= self.config.commit_interval_s:
            self.commit()
        self.stats.flushes += 1

    def _journal_rows(self, current: dict[str, dict[str, list[Any]]], starts: dict[str, int]) -> None:
        """Append every row not yet in the journal: first the rows of sealed generations
        whose journal writes failed (into their own files), then the current ones. A
        failure (full disk, I/O error) leaves the file as it was and the rows marked as not
        journaled: they are written again at the next flush. Logged once per episode."""
        assert self._journal is not None
        try:
            for gen in self._sealed:
                if gen.unjournaled():
                    tables = {n: b.since(b.jmark) for n, b in gen.buffers.items() if b.n > b.jmark}
                    self._journal.append(tables, start={n: gen.buffers[n].jmark for n in tables},
                                         token=gen.token)
                    for b in gen.buffers.values():
                        b.jmark = b.n
            if current:
                self._journal.append(current, start=starts)
                for name in current:
                    buf = self._buffers[name]
                    buf.jmark = buf.n
        except OSError as exc:
            if not self._journal_failing:
                log.error("journal write failed, the rows stay in memory and are journaled again "
                          "at the next flush: %s", exc)
                self._journal_failing = True
            return
        if self._journal_failing:
            log.warning("journal %s: writable again, the rows kept in memory are journaled", self._journal.dir)
            self._journal_failing = False

    def commit(self) -> None:
        """Start writing every buffered row to the lake as Parquet (one file per table and
        partition, named with its journal file's token): the journal's current file is
        sealed with the rows sampled since the last commit (a generation), and
        :meth:`_commit_step` writes one table per tick afterwards, so that a commit (tens
        of milliseconds) never makes a tick late. A table that fails (full disk) stays in
        memory with its token, retried at every commit until it succeeds; its journal
        file stays until then (replayed on restart). A pass stops at its first failure;
        tables that failed are tried after the others in the next one."""
        if self._lake is None or self._journal is None:
            return
        self._finish_commit()  # the previous one first (only when commits come this close)
        self._last_commit = self._clock()
        if any(buf.n for buf in self._buffers.values()):
            token = self._journal.rotate()
            self._own_tokens.add(token)
            self._sealed.append(_Generation(token, {name: buf for name, buf in self._buffers.items() if buf.n}))
            self._buffers = {}
        self._bound_memory()
        work = [(g, name) for g in self._sealed for name in g.buffers]
        # tables that failed go last, the longest-failing first: a fault of one table cannot
        # hold up the others, and two failing tables take turns
        work.sort(key=lambda w: self._failing.get(w[1], -1))
        self._committing = _Commit(work)
        if not self._committing.work:
            self._end_commit()

    def _bound_memory(self) -> None:
        """Drop the oldest sealed generations while more than ``max_buffered_rows`` rows
        wait in memory (the lake has been refusing them): what their journal files hold
        is replayed once the lake takes rows again; the rest is lost, counted and logged."""
        limit = self.config.max_buffered_rows
        total = sum(g.rows() for g in self._sealed) + sum(b.n for b in self._buffers.values())
        while self._sealed and total > limit:
            g = self._sealed.pop(0)
            rows, lost = g.rows(), g.unjournaled()
            total -= rows
            self.stats.rows_lost += lost
            assert self._journal is not None
            log.error("agent: more than agent.max_buffered_rows=%d rows wait for the lake: the %d oldest "
                      "are dropped from memory; %d of them are in journal %s (replayed when the lake "
                      "takes rows again), %d are lost (%d lost in all)", limit, rows, rows - lost,
                      self._journal.file(g.token), lost, self.stats.rows_lost)

    def _commit_step(self) -> None:
        c = self._committing
        if c is None:
            return
        while c.work:
            gen, name = c.work.pop(0)
            buf = gen.buffers.get(name)
            if buf is None:
                continue
            error = self._commit_buffer(gen.token, name, buf)
            if error is None:
                del gen.buffers[name]
                self._failing.pop(name, None)
            else:
                # the rest waits for the next commit: on a full disk every table would fail
                # alike, each after building its frame
                c.failed += 1
                c.error = error
                self._failing[name] = self.stats.commits
                c.work.clear()
            break
        if not c.work:
            self._end_commit()

    def _end_commit(self) -> None:
        c, self._committing = self._committing, None
        if c is None or self._journal is None or self._lake is None:
            return
        for g in self._sealed:
            if not g.buffers:
                self._journal.discard(g.token)
        self._sealed = [g for g in self._sealed if g.buffers]
        self.stats.commits += 1
        if c.failed:
            log.error("lake %s: commit failed, %d rows of %d commit(s) kept in memory and retried at the "
                      "next commit: %s", self._lake.root, sum(g.rows() for g in self._sealed),
                      len(self._sealed), c.error)
            self._commit_failing = True
            return
        if self._commit_failing:
            log.warning("lake %s: commits succeed again, the rows kept in memory are in the lake", self._lake.root)
            self._commit_failing = False
        live = {g.token for g in self._sealed}
        for old in self._journal.sealed():  # left by an earlier agent, or dropped from memory
            if old not in live:
                self._replay(old)

    def _finish_commit(self) -> None:
        while self._committing is not None:
            self._commit_step()

    def _commit_buffer(self, token: str, name: str, buf: _Buffer, *, own: bool = True) -> str | None:
        """Write one table's rows under the journal's token; the error (None: done). The
        buffer keeps its rows on failure. ``own``: rows this run sampled (else an earlier
        run's, replayed from its journal)."""
        assert self._lake is not None
        try:
            written = buf.commit_to(self._lake, name, self.config.host, journal_mod.token_hex(token))
        except Exception as exc:
            return f"{buf.n} rows of {name}: {exc}"
        self.stats.rows_written += written
        if own:
            self._count(name, written)
        else:
            self.stats.rows_replayed += written
        return None

    def _count(self, table: str, rows: int) -> None:
        if rows:
            self.stats.table_rows[table] = self.stats.table_rows.get(table, 0) + rows

    def _replay(self, token: str) -> None:
        assert self._journal is not None
        path = self._journal.file(token)
        if token in self._refused:
            return
        try:
            tables = journal_mod.read(path)
        except journal_mod.NotAJournal as exc:
            try:
                aside = self._journal.set_aside(token)
            except OSError as err:
                log.error("%s; cannot set it aside: %s", exc, err)
                self._refused.add(token)
                return
            log.warning("%s: no rows can be read from it; renamed %s", exc, aside.name)
            return
        except journal_mod.JournalError as exc:  # another user's, a symlink, unreadable
            log.error("%s", exc)
            self._refused.add(token)
            return
        ok, rows = True, 0
        for name, cols in tables.items():
            m = schema.MEASUREMENTS.get(name)
            if m is None or not cols.get(schema.TIME):
                log.error("journal %s: table %r is not a measurement; its rows are skipped", path, name)
                continue
            buf = _Buffer(m)
            buf.load(cols)
            rows += buf.n
            error = self._commit_buffer(token, name, buf, own=token in self._own_tokens)
            if error is not None:
                log.error("journal %s: replay failed, the file stays for the next try: %s", path, error)
                ok = False
                break  # the next tables would most likely fail alike (full disk)
        if ok:
            self._journal.discard(token)
            log.info("journal %s: %d rows replayed into the lake", path, rows)

    def replay_journals(self) -> None:
        """Commit the rows of journals left by an agent that died (or failed to commit)."""
        if self._journal is not None:
            for token in self._journal.sealed():
                self._replay(token)

    def close(self) -> None:
        self.flush()
        self.commit()
        self._finish_commit()
        if self._sealed:
            lost = sum(g.unjournaled() for g in self._sealed)
            kept = sum(g.rows() for g in self._sealed) - lost
            self.stats.rows_lost += lost
            log.error("agent exiting while the lake refuses rows: %d rows stay in the journal under %s "
                      "(replayed at the next start), %d that the journal could not take are lost",
                      kept, self._journal.dir if self._journal else "-", lost)
        for done in self._sync_requests:
            done.set()
        if self._journal is not None:
            self._journal.close()
        self._close_collectors()
        close_each(self.sinks, "sink")

    # -------------------------------------------------------------------- loop
    def run(self) -> AgentStats:
        cfg = self.config
        interval = cfg.interval_s
        flush_every = max(1, round(cfg.flush_interval_s / interval))
        medium_every = max(1, round(1.0 / interval))
        facts_every = max(1, round(schema.TIER_PERIOD_S["static"] / interval))
        total_ticks = math.inf if cfg.duration_s is None else max(1, round(cfg.duration_s / interval))
        clock = self._clock
        every_tick = [c for c in self.collectors if self._periods[c.name] == 1]
        # tiers are whole seconds: the slower collectors are only looked at once a second
        slower = [(self._periods[c.name], c) for c in self.collectors if self._periods[c.name] > 1]
        if any(p % medium_every for p, _ in slower):
            medium_every = 1  # an odd interval: check every tick
        if cfg.lake is not None and cfg.compact_every_s > 0:
            threading.Thread(target=self._compaction_loop, name="unveil-compaction", daemon=True).start()
        t0 = clock()
        k = 0
        try:
            while not self._stop.is_set() and k < total_ticks:
                due = t0 + k * interval
                now = clock()
                # time.sleep, not Event.wait: half the CPU per wake-up (10 wake-ups a second);
                # at most 0.5 s per sleep so that stop() from another thread is seen
                while now < due and not self._stop.is_set():
                    time.sleep(min(due - now, 0.5))
                    now = clock()
                if self._stop.is_set():
                    break
                late = now - due
                if late > interval / 2:
                    # too late to be this tick: it and every tick it overran are missed,
                    # and sampling resumes on the grid instead of catching up in a burst
                    skipped = int(late // interval) + 1
                    self.stats.missed_ticks += skipped
                    k += skipped
                    continue
                ts = time.time_ns() // 1000  # wall-clock µs: the row's time
                start = clock()
                if k % facts_every == 0:
                    self._collect_facts(ts)
                for c in every_tick:
                    self._collect(c, ts)
                if k % medium_every == 0:
                    for period, c in slower:
                        if k % period == 0:
                            self._collect(c, ts)
                self.stats.ticks += 1
                self.stats.sample_time_us += int((clock() - start) * 1e6)
                k += 1
                if k % flush_every == 0:
                    self.flush()
                elif self._committing is not None:
                    self._commit_step()
                if self._sync_requests:
                    self._serve_sync()
        finally:
            self.close()
        return self.stats


def install_signal_handlers(agent: Agent) -> None:
    """SIGTERM and SIGINT stop the loop after the current tick (then flush and close)."""

    def handler(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping after this tick", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
