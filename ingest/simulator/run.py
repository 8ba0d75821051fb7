"""Run a scenario: every host, chunk by chunk (one UTC hour at most), into the sinks.

Per host the whole duration is planned first (workload schedule, injections); then each
chunk is materialised with numpy over all its ticks, turned into one frame per measurement
and handed to every sink (``sink.write(table, df)``), like the agent does. Streams of
random numbers are named (host, purpose, chunk), so a run is a pure function of the
scenario and the seed, and an injected run shares every noise stream with the healthy run
of the same seed.
"""

from __future__ import annotations

import copy
import logging
import time as _time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl

from ingest import schema
from ingest.simulator import injections as inj_mod
from ingest.simulator.bank import CounterBank, CounterEvent, _sub
from ingest.simulator.physics import State, derive
from ingest.simulator.render import RENDERERS, Chunk
from ingest.simulator.scenario import Scenario
from ingest.simulator.topology import HostSpec, build_host, fact_rows, healthy_facts
from ingest.simulator.workloads import TICKS_PER_S, Schedule, Trace
from ingest.sink import Sink

log = logging.getLogger(__name__)

_US = 1_000_000
#: runs a function over items and returns the results in order (``jobs.engine.Engine.map``)
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]
FACTS_PERIOD_S = schema.TIER_PERIOD_S["static"]


@dataclass
class HostRun:
    """A host's planned run (also what tests inspect)."""

    spec: HostSpec
    schedule: Schedule
    injections: list[inj_mod.Injection]
    events: list[CounterEvent]
    seed: np.random.SeedSequence
    bank: CounterBank


@dataclass
class SimResult:
    scenario: Scenario
    rows: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    labels: pl.DataFrame | None = None

    @property
    def host_hours(self) -> float:
        return len(self.scenario.hosts) * self.scenario.duration_s / 3600.0


def plan_host(sc: Scenario, index: int, *, keep_raw: bool = False) -> HostRun:
    hp = sc.hosts[index]
    # a host's streams depend on the seed and its name, not on its position in the fleet
    seed = np.random.SeedSequence(entropy=[sc.seed, zlib.crc32(hp.name.encode())])
    spec = build_host(hp.name, index, cpus_per_node=hp.cpus_per_node, n_nics=hp.nics, nic_queues=hp.nic_queues,
                      gpu_model=hp.gpu_model, baseline_drops=hp.baseline_drops, smooth_throttle=hp.smooth_throttle,
                      inlet_offsets_c=inlet_offsets(_sub(seed, "thermal_layout"), 8) if hp.gpu_temp_spread else ())
    total = int(round(sc.duration_s * TICKS_PER_S))
    sched = Schedule(hp.workload, total, sc.start.timestamp(), _sub(seed, "workload"), hp.params)
    injs: list[inj_mod.Injection] = []
    events: list[CounterEvent] = []
    for i in sc.injections:
        if i.host != hp.name:
            continue
        if i.type in ("counter_wrap", "counter_reset"):
            p = i.params
            table = str(p["table"])
            period = schema.TIER_PERIOD_S[schema.get(table).tier]
            tick = max(1, int(round(i.start_s / period)))
            events.append(CounterEvent("wrap" if i.type == "counter_wrap" else "reset", table, str(p["field"]),
                                       str(p.get("series", "")), tick, int(p.get("bits", 64))))
        else:
            injs.append(inj_mod.validate(i, spec))
    bank = CounterBank(_sub(seed, "counters"), events=events, keep_raw=keep_raw)
    return HostRun(spec, sched, injs, events, seed, bank)


#: gpu_temp_spread: the host's rack inlet is drawn from 20-29 C (ASHRAE recommends 18-27 C; the
#: uniform host sits at 27 C); GPUs in the rear slots of the board (2, 3, 6, 7) breathe air the
#: front ones heated by ~5 C; each GPU adds +-1.5 C (heatsink contact, ASIC leakage). Assumed
#: magnitudes: docs/simulator.md.
RACK_INLET_C = (20.0, 29.0)
REAR_PREHEAT_C = 5.0
GPU_SPREAD_C = 1.5


def inlet_offsets(seed: np.random.SeedSequence, n_gpus: int) -> tuple[float, ...]:
    """Per-GPU inlet offsets (C) against the uniform host's 27 C inlet."""
    rng = np.random.default_rng(seed)
    rack = rng.uniform(*RACK_INLET_C) - 27.0
    rear = np.array([REAR_PREHEAT_C if g % 4 >= 2 else 0.0 for g in range(n_gpus)])
    return tuple(float(x) for x in rack + rear + rng.uniform(-GPU_SPREAD_C, GPU_SPREAD_C, n_gpus))


def chunks(sc: Scenario) -> list[tuple[int, int]]:
    """Fast-tick ranges of the chunks: cut at UTC hour boundaries (one lake partition each)."""
    total = int(round(sc.duration_s * TICKS_PER_S))
    first = 3600 - (int(sc.start.timestamp()) % 3600)
    edges = [0]
    t = first * TICKS_PER_S
    while t < total:
        edges.append(t)
        t += 3600 * TICKS_PER_S
    edges.append(total)
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def host_frames(sc: Scenario, hr: HostRun, tables: Sequence[str] | None = None) -> Iterator[tuple[str, pl.DataFrame]]:
    """(table, frame) of one host, chunk by chunk, measurements then facts/labels."""
    want = [t for t in RENDERERS if (tables is None or t in tables) and (t != "perf" or sc.perf)]
    t0_us = int(sc.start.timestamp()) * _US
    meter = CostMeter(hr) if tables is None or "labels" in tables else None
    for ci, (a, b) in enumerate(chunks(sc)):
        if not want and (meter is None or meter.done(a)):
            break
        rng = np.random.default_rng(_sub(hr.seed, "trace", f"chunk{ci}"))
        tr = hr.schedule.trace(a, b, rng)
        if meter is not None:
            meter.feed(ci, a, tr)
        if not want:
            continue
        eff = inj_mod.apply_all(hr.injections, hr.spec, a, b - a)
        st = derive(hr.spec, tr, eff, np.random.default_rng(_sub(hr.seed, "physics", f"chunk{ci}")), hr.bank)
        ch = Chunk(hr.spec, a, b - a, t0_us, hr.schedule, tr, eff, st, hr.bank, hr.seed, ci)
        for t in want:
            yield t, RENDERERS[t](ch)
    if tables is None or "host_facts" in tables:
        yield "host_facts", facts_frame(sc, hr)
    if meter is not None:
        lab = labels_frame(sc, hr, meter.costs())
        if lab.height:
            yield "labels", lab


def facts_frame(sc: Scenario, hr: HostRun) -> pl.DataFrame:
    """host_facts snapshots every static period, and when an injection changes a fact."""
    times = set(np.arange(0.0, sc.duration_s, FACTS_PERIOD_S).tolist())
    for i in hr.injections:
        if inj_mod.TYPES[i.type].facts is not None:
            times.update(x for x in (i.start_s, i.end_s) if x < sc.duration_s)
    base = healthy_facts(hr.spec)
    # facts only change where an injection starts or ends: build each distinct state's rows
    # once and repeat them for every snapshot time in its span
    changes = sorted({x for i in hr.injections if inj_mod.TYPES[i.type].facts is not None
                      for x in (i.start_s, i.end_s)})
    sch = schema.get("host_facts").polars_schema()
    names = ("category", "device", "key", "value", "value_num")
    frames: list[pl.DataFrame] = []
    ordered = sorted(times)
    for lo, hi in zip([0.0, *changes], [*changes, float("inf")], strict=True):
        span = [t for t in ordered if lo <= t < hi]
        if not span:
            continue
        rows = fact_rows(hr.spec, inj_mod.facts_at(base, hr.injections, hr.spec, float(span[0])))
        if not rows:
            continue
        block = pl.DataFrame(list(zip(*rows, strict=True)), schema={n: sch[n] for n in names}, orient="col")
        stamps = pl.DataFrame({"time": pl.Series([sc.start + timedelta(seconds=float(t)) for t in span],
                                                 dtype=pl.Datetime("us", "UTC"))})
        frames.append(stamps.join(block, how="cross"))
    if not frames:
        return pl.DataFrame(schema=sch)
    df = pl.concat(frames).with_columns(pl.lit(hr.spec.name, dtype=pl.String).alias("host"))
    return df.select(list(sch))


class CostMeter:
    """The throughput cost of each labelled injection: the host run with that injection
    alone against the same-seed healthy run, over the injection's span (clipped to the run).

    Both runs are the physics of the real run (same trace, same noise streams) with other
    causes; before an injection starts its run *is* the healthy run, so its smoothed state
    (GPU temperatures) is forked from the healthy one there. Fed chunk by chunk with the
    trace the real run renders, so the trace is built once."""

    def __init__(self, hr: HostRun) -> None:
        self.hr = hr
        self.injs = [i for i in hr.injections if inj_mod.TYPES[i.type].label]
        self.healthy = CounterBank(_sub(hr.seed, "counters"))
        self.banks: dict[int, CounterBank] = {}
        self.sums = np.zeros((len(self.injs), 2))  # (injected, healthy) throughput over the span

    def done(self, a: int) -> bool:
        return all(i.ticks()[1] <= a for i in self.injs)

    def feed(self, ci: int, a: int, tr: Trace) -> None:
        live = [(k, i) for k, i in enumerate(self.injs) if i.ticks()[0] < a + tr.n and i.ticks()[1] > a]
        if not live:
            if not self.done(a):
                self._derive(ci, tr, [], a, self.healthy)  # keep the healthy state moving
            return
        for k, _ in live:
            if k not in self.banks:
                self.banks[k] = copy.deepcopy(self.healthy)
        h = self._derive(ci, tr, [], a, self.healthy)
        for k, i in live:
            x = self._derive(ci, tr, [i], a, self.banks[k])
            s, e = i.ticks()
            sl = slice(max(s, a) - a, min(e, a + tr.n) - a)
            self.sums[k] += (float(x.throughput[sl].sum()), float(h.throughput[sl].sum()))

    def _derive(self, ci: int, tr: Trace, injs: list[inj_mod.Injection], a: int, bank: CounterBank) -> State:
        eff = inj_mod.apply_all(injs, self.hr.spec, a, tr.n)
        return derive(self.hr.spec, tr, eff, np.random.default_rng(_sub(self.hr.seed, "physics", f"chunk{ci}")), bank)

    def costs(self) -> dict[int, float | None]:
        """id(injection) -> fractional throughput lost (None where the healthy run does no work)."""
        return {id(i): (1.0 - x / h if h > 0 else None) for i, (x, h) in zip(self.injs, self.sums, strict=True)}


def labels_frame(sc: Scenario, hr: HostRun, costs: dict[int, float | None] | None = None) -> pl.DataFrame:
    """One label per injected inefficiency, with its throughput cost (see :class:`CostMeter`)."""
    if costs is None:
        meter = CostMeter(hr)
        for ci, (a, b) in enumerate(chunks(sc)):
            if meter.done(a):
                break
            meter.feed(ci, a, hr.schedule.trace(a, b, np.random.default_rng(_sub(hr.seed, "trace", f"chunk{ci}"))))
        costs = meter.costs()
    rows = []
    for k, i in enumerate(sorted(hr.injections, key=lambda x: (x.start_s, x.type))):
        if not inj_mod.TYPES[i.type].label:
            continue
        end = min(i.end_s, sc.duration_s)
        rows.append({
            "time": sc.start + timedelta(seconds=i.start_s),
            "host": hr.spec.name,
            "type": i.type,
            "devices": ",".join(i.devices),
            "end": sc.start + timedelta(seconds=end),
            "severity": i.severity,
            "label_id": f"{sc.name}/{sc.seed}/{hr.spec.name}/{k:03d}-{i.type}",
            "cost": costs.get(id(i)),
        })
    return schema.conform("labels", pl.DataFrame(rows, schema={c: d for c, d in
                                                               schema.get("labels").polars_schema().items()}))


def simulate(sc: Scenario, sinks: Sequence[Sink] | Callable[[], Sequence[Sink]], *,
             tables: Sequence[str] | None = None, mapper: Mapper | None = None) -> SimResult:
    """Simulate every host of ``sc`` into ``sinks``; returns row counts and the labels.

    ``sinks`` is a list of sinks (flushed, not closed: they are the caller's), or a
    callable that opens them (they are then closed here). Hosts are independent (a run is a
    pure function of the scenario, the seed and the host's name), so with ``mapper`` (an
    engine's map, ``jobs.engine``) each host runs as one item, possibly in another process
    that opens its own sinks: ``sinks`` must then be a picklable callable that returns
    them (a top-level function, or a ``functools.partial`` of one)."""
    t0 = _time.perf_counter()
    res = SimResult(sc)
    if mapper is not None:
        if not callable(sinks):
            raise TypeError("simulate: with a mapper, sinks must be a picklable callable that returns the sinks "
                            "(each worker opens its own), not sink objects")
        done = mapper(_host_job, [HostJob(sc, i, sinks, tables) for i in range(len(sc.hosts))])
    elif callable(sinks):
        done = [_host_job(HostJob(sc, i, sinks, tables)) for i in range(len(sc.hosts))]
    else:
        done = [_simulate_host(sc, i, sinks, tables) for i in range(len(sc.hosts))]
        for s in sinks:
            s.flush()
    labels: list[pl.DataFrame] = []
    for rows, lab in done:
        for table, n in rows.items():
            res.rows[table] = res.rows.get(table, 0) + n
        labels.extend(lab)
    res.labels = pl.concat(labels) if labels else schema.empty_frame("labels")
    res.wall_s = _time.perf_counter() - t0
    return res


def _simulate_host(sc: Scenario, index: int, sinks: Sequence[Sink], tables: Sequence[str] | None
                   ) -> tuple[dict[str, int], list[pl.DataFrame]]:
    """Host ``index`` of ``sc`` into ``sinks``: its rows per table and its labels."""
    hr = plan_host(sc, index)
    log.info("simulating %s (%s) for %.0f s with %d injection(s)", hr.spec.name, hr.schedule.kind,
             sc.duration_s, len(hr.injections))
    rows: dict[str, int] = {}
    labels: list[pl.DataFrame] = []
    for table, df in host_frames(sc, hr, tables):
        if table == "labels":
            labels.append(df)
        for s in sinks:
            s.write(table, df)
        rows[table] = rows.get(table, 0) + df.height
    return rows, labels


@dataclass(frozen=True)
class HostJob:
    """One host of a scenario, into sinks it opens itself (a mapper's item)."""

    sc: Scenario
    index: int
    open_sinks: Callable[[], Sequence[Sink]]
    tables: Sequence[str] | None = None

    def __repr__(self) -> str:  # what an error names
        return f"<host {self.sc.hosts[self.index].name} of scenario {self.sc.name!r}>"


def _host_job(job: HostJob) -> tuple[dict[str, int], list[pl.DataFrame]]:
    """``job`` run (top-level, so it pickles): its sinks are flushed and closed."""
    sinks = list(job.open_sinks())
    try:
        out = _simulate_host(job.sc, job.index, sinks, job.tables)
        for s in sinks:
            s.flush()
        return out
    finally:
        for s in sinks:
            s.close()


def simulate_frames(sc: Scenario, *, tables: Sequence[str] | None = None, keep_raw: bool = False
                    ) -> tuple[dict[str, pl.DataFrame], list[HostRun]]:
    """The whole run in memory (tests, notebooks): table -> frame of all hosts."""
    out: dict[str, list[pl.DataFrame]] = {}
    runs = []
    for i in range(len(sc.hosts)):
        hr = plan_host(sc, i, keep_raw=keep_raw)
        runs.append(hr)
        for table, df in host_frames(sc, hr, tables):
            out.setdefault(table, []).append(df)
    return {t: pl.concat(v) for t, v in out.items()}, runs
