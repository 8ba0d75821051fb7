"""The identification matrix (issue 15, item 7), run the way production runs.

Every cell is a simulated fleet written into a fresh lake (``ingest.simulator.simulate``
through the real ``LakeSink``) and swept by the scheduler's own cycle,
:func:`jobs.cycle.run_cycle`, once per simulated minute - exactly what ``unveil
schedule --every 60s`` does on a live lake: the committed watermarks, the one-minute
analysis steps judged on the past only, open incidents carried from cycle to cycle. A
one-shot backfill (``unveil schedule --once``) would give the same windows (the analysis
step makes the verdict chunk-independent) but only closed incidents, so it could not
measure when an incident became visible. Each cycle's ``now`` is ``horizon + lag`` with the
production lag (90 s), so every latency in seconds is the wall-clock one a live scheduler
with that phase would have.

Scored per label (docs/identification.md): detected, top-1 right, onset -> first visible
incident (cycles and seconds); false incidents per 24 host-hours on healthy fleets;
fleet-wide misconfigurations found on every host; grouped by type x cost band x workload
x onset x overlap x fleet x seed, for a tuning and a held-out seed set, against the
issue's targets.

    .venv/bin/python benchmarks/id_matrix.py --quick                    # both seed sets
    .venv/bin/python benchmarks/id_matrix.py --quick --set tuning --cache /tmp/idm
    .venv/bin/python benchmarks/id_matrix.py --json /tmp/idm.json       # the full matrix (hours)
    .venv/bin/python benchmarks/id_matrix.py --long --jobs 2             # lasting faults, no cohort
    .venv/bin/python benchmarks/id_matrix.py --long --severity 0.7 --types nic_drops   # at another severity
    .venv/bin/python benchmarks/id_matrix.py --quick --config my.toml   # another [analytics] setting

Nothing may be tuned on the held-out seeds (11 12 by default): they are the check.
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import hashlib
import json
import logging
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from jobs.config import SweepConfig

TUNING_SEEDS = (1, 2)
HELD_OUT_SEEDS = (11, 12)
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # the simulator's default start
CYCLE = timedelta(minutes=1)  # `unveil schedule` default every
#: cycles swept after a run's data ends: a segment still growing at the last minute stays
#: open (unmatched incidents are only written when they close), so without these the end
#: of a run would hide incidents; two cycles pass any segment's end + gap + window
TAIL_CYCLES = 2


def cycle_times(minutes: int, lag: timedelta, every: timedelta = CYCLE) -> list[datetime]:
    """The ``now`` of each cycle of a live scheduler over ``minutes`` of data from
    :data:`T0`: one ``every`` (``[scheduler] every``, a minute by default), ``lag`` (the
    sweep's) after its horizon, and :data:`TAIL_CYCLES` more after the data ends."""
    n = math.ceil(timedelta(minutes=minutes) / every) + TAIL_CYCLES
    return [T0 + k * every + lag for k in range(1, n + 1)]

#: cost bands of the issue (fractions of throughput); upper bounds exclusive
BANDS = ((0.01, "<1 %"), (0.03, "1-3 %"), (0.10, "3-10 %"), (math.inf, ">10 %"))
#: until the simulator writes ``labels.cost``: severity stands in for it (a PROXY, printed as
#: such). Cut points from docs/simulator.md's footprints: at severity 0.8 the types cost 1-22 %
#: (median ~5 %), roughly linear in severity, so s >= 0.5 is read as ">= 3 %" and
#: 0.25 <= s < 0.5 as "1-3 %". Not a measurement; the cost column replaces it.
SEVERITY_PROXY = ((0.25, "<1 %"), (0.5, "1-3 %"), (0.75, "3-10 %"), (math.inf, ">10 %"))

#: types whose cause is a host configuration (facts), used for the fleet-wide cells
CONFIG_TYPES = ("thp_coverage_loss", "cpu_governor_powersave", "gpu_power_throttle")
QUICK_TYPES = ("gpu_power_throttle", "cgroup_cpu_throttle", "storage_contention", "thp_coverage_loss")

log = logging.getLogger("id_matrix")


# ----------------------------------------------------------------------- the cells


@dataclass(frozen=True)
class Cell:
    """One simulated fleet of the matrix: which faults where, and the dimensions it covers."""

    hosts: int
    mixed: bool  # heterogeneous fleet: workloads and NIC counts alternate host by host
    workload: str  # llm_serving | training (homogeneous fleets) | mixed
    onset: str  # boot | mid
    overlap: str  # alone | pair (two types on one host) | fleetwide | healthy
    severity: float
    types: tuple[str, ...]
    minutes: int
    seed: int

    @property
    def fleet(self) -> str:
        return f"{self.hosts}h-{'mixed' if self.mixed else 'homog'}"

    @property
    def name(self) -> str:
        t = "+".join(self.types) if self.types else "healthy"
        return (f"{self.fleet}-{self.workload}-{self.onset}-{self.overlap}-s{self.severity:g}-{t}"
                f"-m{self.minutes}-seed{self.seed}")

    def host_names(self) -> list[str]:
        return [f"sim-{i:02d}" for i in range(self.hosts)]

    def host_workload(self, i: int) -> str:
        if self.mixed or self.workload == "mixed":
            return ("llm_serving", "training")[i % 2]
        return self.workload

    def fault_window(self) -> tuple[int, int]:
        """(start, duration) of the (first) fault in seconds."""
        if self.overlap == "fleetwide":
            return 0, self.minutes * 60
        if self.onset == "boot":
            return 0, max(60, (self.minutes // 2) * 60)
        # past the 120 s warm-up and some history; 20 s into a minute, not on the minute: a
        # cycle then sees only the fault's first 40 s (onsets on whole minutes are the best case)
        start = max(3, self.minutes // 2 - 1) * 60 + 20
        return start, max(60, self.minutes * 60 - start - 40)

    def doc(self) -> dict[str, Any]:
        """The scenario document (``ingest.simulator.from_dict``)."""
        hosts = [{"name": n, "workload": self.host_workload(i),
                  **({"nics": 4 if i % 2 else 8} if self.mixed else {})} for i, n in enumerate(self.host_names())]
        doc: dict[str, Any] = {"seed": self.seed, "duration": f"{self.minutes}m", "hosts": hosts}
        start, dur = self.fault_window()

        def at(offset_s: int) -> str:  # an offset must be positive: "from boot" is the run's start time
            return f"{offset_s}s" if offset_s > 0 else T0.isoformat()

        inj: list[dict[str, Any]] = []
        if self.overlap == "fleetwide":
            inj = [{"type": self.types[0], "hosts": "all", "start": at(0), "duration": f"{dur}s",
                    "severity": self.severity}]
        elif self.overlap == "pair":
            a, b = self.types
            inj = [{"type": a, "host": "sim-00", "start": at(start), "duration": f"{dur}s", "severity": self.severity},
                   {"type": b, "host": "sim-00", "start": f"{start + 60}s", "duration": f"{max(60, dur - 60)}s",
                    "severity": self.severity}]
        elif self.overlap == "alone":
            inj = [{"type": t, "host": f"sim-{i:02d}", "start": at(start), "duration": f"{dur}s",
                    "severity": self.severity} for i, t in enumerate(self.types)]
        if inj:
            doc["injections"] = inj
        return doc


def quick_cells(seeds: Sequence[int]) -> list[Cell]:
    """A small matrix (a few minutes per seed on the 2-core VM): four types alone mid-run on
    a 2-host serving fleet (one of them at two severities), one pair on one host, one fault
    from boot, a fleet-wide THP `never` on a mixed 2-host fleet, a healthy fleet, and four
    other types on an 8-host mixed fleet."""
    out: list[Cell] = []
    for seed in seeds:
        base = Cell(2, False, "llm_serving", "mid", "alone", 0.5, (), 8, seed)
        out += [replace(base, types=(t,)) for t in QUICK_TYPES]
        out.append(replace(base, severity=0.3, types=("gpu_power_throttle",)))
        out.append(replace(base, overlap="pair", types=("storage_contention", "cgroup_cpu_throttle")))
        out.append(replace(base, onset="boot", types=("gpu_power_throttle",)))
        out.append(replace(base, mixed=True, workload="mixed", overlap="fleetwide", onset="boot",
                           types=("thp_coverage_loss",)))
        out.append(replace(base, overlap="healthy", severity=0.0, minutes=10))
        # an 8-host mixed fleet: four more types on four hosts (serving and training), four healthy
        out.append(replace(base, hosts=8, mixed=True, workload="mixed",
                           types=("nic_drops", "memory_pressure", "irq_locality_miss", "thermal_throttle")))
    return out


#: the long cells' run: a fault of 45 minutes from minute 44, most of the hour of history
#: (``[analytics] history``) the host's own reference holds by its end
LONG_MINUTES = 90


def long_cells(seeds: Sequence[int], types: Sequence[str], severity: float = 0.5) -> list[Cell]:
    """Lasting faults on a fleet without a cohort: each type alone on a 2-host training fleet
    (fewer than 3 hosts of a hardware: no cohort reference), 45 minutes long. The matrix's
    12-minute runs cannot show a fault reported only while it is new (``covered``)."""
    return [Cell(2, False, "training", "mid", "alone", severity, (t,), LONG_MINUTES, seed)
            for seed in seeds for t in types]


def full_cells(seeds: Sequence[int], types: Sequence[str]) -> list[Cell]:
    """The full matrix: every type alone at three severities, on 2- and 8-host fleets,
    homogeneous (serving, training) and mixed, from boot and mid-run; pairs of types on one
    host; fleet-wide configuration faults; healthy fleets. 8-host fleets carry up to six
    faults on six hosts at once (two stay healthy), 2-host fleets one (one stays healthy)."""
    out: list[Cell] = []
    fleets = [(2, False, "llm_serving"), (2, False, "training"), (2, True, "mixed"),
              (8, False, "llm_serving"), (8, False, "training"), (8, True, "mixed")]
    for seed in seeds:
        for hosts, mixed, wl in fleets:
            base = Cell(hosts, mixed, wl, "mid", "alone", 0.5, (), 12, seed)
            per = 1 if hosts == 2 else 6
            for sev in (0.15, 0.35, 0.7):
                for onset in ("mid", "boot"):
                    for k in range(0, len(types), per):
                        out.append(replace(base, severity=sev, onset=onset, types=tuple(types[k:k + per])))
            for a, b in zip(types, [*types[1:], types[0]], strict=True):
                if hosts == 2:
                    out.append(replace(base, overlap="pair", types=(a, b)))
            for t in CONFIG_TYPES:
                out.append(replace(base, overlap="fleetwide", onset="boot", types=(t,)))
            out.append(replace(base, overlap="healthy", severity=0.0, minutes=30))
    return out


# ------------------------------------------------------------------ pure scoring


def cost_band(cost: float | None, severity: float | None) -> tuple[str, bool]:
    """(band, from the severity proxy?). ``cost`` is the label's throughput-loss fraction
    (0.05 = 5 %); without it the severity proxy bands are used."""
    if cost is not None and not (isinstance(cost, float) and math.isnan(cost)):
        if cost < 0:
            cost = 0.0
        return next(name for hi, name in BANDS if cost < hi), False
    if severity is None:
        raise ValueError("a label has neither a cost nor a severity: cannot place it in a cost band")
    return next(name for hi, name in SEVERITY_PROXY if severity < hi), True


def _overlapping(inc: pl.DataFrame, host: str, start: datetime, end: datetime) -> pl.DataFrame:
    return inc.filter((pl.col("host") == host) & (pl.col("start") < end) & (pl.col("end") > start))


def final_incidents(rows: pl.DataFrame, last_horizon: datetime | None) -> tuple[pl.DataFrame, int]:
    """(each incident's latest row, superseded ones left out; how many were superseded).
    Call it after the sweep has passed the data's end (every segment closed): an incident
    whose latest row is still open then was dropped without a closing row (its segment
    became another incident id, e.g. another entry won or it turned unmatched), and is not
    counted twice; nor is one whose latest row says it was ``superseded``."""
    if rows.is_empty():
        return rows, 0
    from knowledge_base import latest_incidents

    last = latest_incidents(rows, superseded=True)
    stale = pl.col("state") == "superseded"
    if last_horizon is not None:
        stale = stale | ((pl.col("state") == "open") & (pl.col("updated") < last_horizon))
    return last.filter(~stale), last.filter(stale).height


def _answers(labels: pl.DataFrame, final: pl.DataFrame) -> dict[str, list[str]]:
    """label_id -> the ids of the matched final incidents that answer it (see
    :func:`score_labels`)."""
    out: dict[str, list[str]] = {}
    if final.is_empty() or labels.is_empty():
        return out
    labs = list(labels.iter_rows(named=True))
    for inc in final.filter(pl.col("status") == "matched").iter_rows(named=True):
        cands = []
        for lab in labs:
            if lab["host"] != inc["host"] or not (inc["start"] < lab["end"] and inc["end"] > lab["time"]):
                continue
            ov = (min(inc["end"], lab["end"]) - max(inc["start"], lab["time"])).total_seconds()
            cands.append((lab["type"] == inc["label_type"], ov, -lab["time"].timestamp(), lab["label_id"]))
        if cands:
            out.setdefault(max(cands)[3], []).append(inc["incident_id"])
    return out


def _union(spans: Iterable[tuple[datetime, datetime]]) -> timedelta:
    """The length of the union of ``spans`` (empty or reversed ones add nothing)."""
    total, cur_s, cur_e = timedelta(0), None, None
    for a, b in sorted(spans):
        if b <= a:
            continue
        if cur_e is None or a > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def covered(final: pl.DataFrame, host: str, kind: str, start: datetime, end: datetime) -> float:
    """The share of ``[start, end)`` that final incidents of ``host`` naming ``kind`` cover
    (their union: a lasting incident's parts, or several incidents, count once)."""
    if final.is_empty() or end <= start:
        return 0.0
    hit = _overlapping(final, host, start, end).filter(pl.col("label_type") == kind)
    return _union((max(r["start"], start), min(r["end"], end)) for r in hit.iter_rows(named=True)) / (end - start)


def score_labels(labels: pl.DataFrame, rows: pl.DataFrame, horizons: Sequence[datetime],
                 lag: timedelta) -> list[dict[str, Any]]:
    """One dict per label: ``detected`` (a final incident of its host overlaps it),
    ``top1`` (of the matched final incidents that answer it, the one with the longest
    overlap names its type; ties: the earliest start), ``got`` (that incident's type, else
    the type of the longest-overlapping matched incident, ``unmatched`` or ``none``),
    ``top1_longest`` (the rule before answering: the longest-overlapping matched incident,
    whichever label it answers). Each matched incident answers one label of its host: the
    one whose type it names among those it overlaps (the longest overlap), else the one it
    overlaps longest — two faults on one host are both right only with an incident each,
    and a wrong incident over a single fault still outranks a shorter right one.
    ``latency_cycles`` / ``latency_s`` (onset -> the first cycle whose incident rows hold an
    incident overlapping it; cycle 1 = the first cycle whose horizon passes the onset;
    seconds = that cycle's ``now`` (horizon + lag) - onset), and the same for the first
    incident naming the right type (``right_cycles``); ``covered``: the share of the label's
    time that incidents naming its type cover (a lasting fault reported only while it was
    new covers part of it). ``rows`` is every row the sweeps
    wrote to ``incidents``; ``horizons[k]`` is cycle k+1's horizon."""
    final, _ = final_incidents(rows, horizons[-1] if horizons else None)
    answers = _answers(labels, final)
    out = []
    for lab in labels.iter_rows(named=True):
        host, s, e = lab["host"], lab["time"], lab["end"]
        ov = _overlapping(final, host, s, e) if final.height else final
        got, top1, top1_longest = "none", False, False
        if ov.height:
            m = ov.filter(pl.col("status") == "matched")
            if m.height:
                m = m.with_columns((pl.min_horizontal(pl.col("end"), pl.lit(e)) - pl.max_horizontal(
                    pl.col("start"), pl.lit(s))).dt.total_microseconds().alias("_ov")).sort(
                    ["_ov", "start"], descending=[True, False])
                got = str(m["label_type"][0])
                top1_longest = got == lab["type"]
                mine = m.filter(pl.col("incident_id").is_in(answers.get(lab["label_id"], [])))
                if mine.height:
                    got = str(mine["label_type"][0])
                    top1 = got == lab["type"]
            else:
                got = "unmatched"
        first = next((k for k, h in enumerate(horizons) if h > s), None)

        def visible(df: pl.DataFrame, s: datetime = s, e: datetime = e, host: str = host,
                    first: int | None = first) -> tuple[int | None, float | None]:
            if first is None or df.is_empty():
                return None, None
            hit = _overlapping(df, host, s, e)
            if hit.is_empty():
                return None, None
            upd = hit["updated"].min()
            k = next((i for i, h in enumerate(horizons) if h >= upd), None)  # type: ignore[operator]
            if k is None:
                return None, None
            return max(1, k - first + 1), (horizons[k] + lag - s).total_seconds()

        cyc, sec = visible(rows)
        right, _ = visible(rows.filter(pl.col("label_type") == lab["type"]) if rows.height else rows)
        out.append({"label_id": lab["label_id"], "host": host, "type": lab["type"],
                    "severity": lab.get("severity"), "cost": lab.get("cost"),
                    "detected": ov.height > 0, "top1": top1, "got": got, "top1_longest": top1_longest,
                    "latency_cycles": cyc, "latency_s": sec, "right_cycles": right,
                    "covered": covered(final, host, lab["type"], s, e)})
    return out


def healthy_hours(labels: pl.DataFrame, hosts: Iterable[str], start: datetime, end: datetime) -> float:
    """Host-hours of ``hosts`` in [start, end) outside every label of the host."""
    total = 0.0
    for h in hosts:
        busy = _union((max(r["time"], start), min(r["end"] or end, end))
                      for r in labels.filter(pl.col("host") == h).iter_rows(named=True))
        total += (end - start - busy).total_seconds()
    return total / 3600.0


def false_incidents(final: pl.DataFrame, labels: pl.DataFrame) -> list[str]:
    """Final incidents overlapping no label of their host, as ``host:status:entry:@HH:MM:SS:Ns``
    (start time of day, length)."""
    out = []
    for r in final.iter_rows(named=True):
        if labels.height and labels.filter((pl.col("host") == r["host"]) & (pl.col("time") < r["end"])
                                           & (pl.col("end") > r["start"])).height:
            continue
        out.append(f"{r['host']}:{r['status']}:{r['entry_id'] or '-'}:@{r['start']:%H:%M:%S}:"
                   f"{(r['end'] - r['start']).total_seconds():.0f}s")
    return out


def _rate(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def group(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per combination of ``keys``: labels, detected, top-1 and median latency."""
    buckets: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        buckets.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key in sorted(buckets, key=lambda t: tuple(str(x) for x in t)):
        b = buckets[key]
        lat = [r["latency_cycles"] for r in b if r["latency_cycles"] is not None]
        sec = [r["latency_s"] for r in b if r["latency_s"] is not None]
        out.append({**dict(zip(keys, key, strict=True)), "labels": len(b),
                    "detected": sum(r["detected"] for r in b), "top1": sum(r["top1"] for r in b),
                    "detected_rate": _rate(sum(r["detected"] for r in b), len(b)),
                    "top1_rate": _rate(sum(r["top1"] for r in b), len(b)),
                    "median_cycles": statistics.median(lat) if lat else None,
                    "median_s": statistics.median(sec) if sec else None,
                    "covered": statistics.mean(r["covered"] for r in b)})
    return out


@dataclass
class Target:
    name: str
    value: float | None
    threshold: str
    verdict: str  # PASS | FAIL | n/a
    note: str = ""


def check_targets(rows: Sequence[dict[str, Any]], healthy_false: int, healthy_host_hours: float,
                  fleetwide: Sequence[dict[str, Any]]) -> list[Target]:
    """The issue's targets on the label rows of one seed set (``band`` and ``proxy`` set),
    the false incidents of its healthy fleets and its fleet-wide labels."""
    proxy = any(r["proxy"] for r in rows)
    note = "severity proxy bands (no labels.cost)" if proxy else ""

    def ratio(sel: list[dict[str, Any]], key: str) -> float | None:
        return _rate(sum(r[key] for r in sel), len(sel))

    def verdict(v: float | None, ok: bool) -> str:
        return "n/a" if v is None else ("PASS" if ok else "FAIL")

    hi = [r for r in rows if r["band"] in ("3-10 %", ">10 %") and r["overlap"] != "fleetwide"]
    mid = [r for r in rows if r["band"] == "1-3 %" and r["overlap"] != "fleetwide"]
    out = []
    for name, sel, key, lim in (("cost >= 3 %: detected", hi, "detected", 0.95),
                                ("cost >= 3 %: top-1 right", hi, "top1", 0.95),
                                ("cost 1-3 %: detected", mid, "detected", 0.80)):
        v = ratio(sel, key)
        out.append(Target(name, v, f">= {lim:.0%} (n={len(sel)})", verdict(v, v is not None and v >= lim), note))
    per24 = None if healthy_host_hours <= 0 else healthy_false / healthy_host_hours * 24
    out.append(Target("healthy fleets: false incidents / 24 host-h", per24,
                      f"<= 1 ({healthy_false} in {healthy_host_hours:.2f} host-h)",
                      verdict(per24, per24 is not None and per24 <= 1)))
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in fleetwide:
        runs.setdefault(r["run"], []).append(r)
    found = sum(all(r["top1"] for r in rs) for rs in runs.values())
    v = _rate(found, len(runs))
    out.append(Target("fleet-wide misconfiguration named on every host", v, f"= 100 % of runs (n={len(runs)})",
                      verdict(v, v == 1.0)))
    lat = [r["latency_cycles"] for r in rows if r["latency_cycles"] is not None and r["overlap"] != "fleetwide"]
    med = statistics.median(lat) if lat else None
    out.append(Target("median onset -> visible incident (cycles)", med, f"<= 2 (n={len(lat)})",
                      verdict(med, med is not None and med <= 2)))
    return out


# -------------------------------------------------------------------- running


def sim_version() -> str:
    """Hash of what makes a simulated lake: the simulator, the schema and the lake writer.
    A cached lake made by other code is simulated again, not silently reused."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for f in sorted([*root.glob("ingest/simulator/**/*.py"), *root.glob("ingest/simulator/**/*.toml"),
                     root / "ingest/schema.py", root / "ingest/lake.py"]):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def simulated_lake(cell: Cell, dest: Path, cache: Path | None) -> None:
    """Write the cell's simulated telemetry into the fresh lake ``dest`` (from the cache when
    a lake of the same scenario and simulator version is there)."""
    cached_lake(cell.doc(), cell.name, dest, cache)


def cached_lake(doc: dict[str, Any], name: str, dest: Path, cache: Path | None) -> None:
    """Simulate the scenario ``doc`` into the fresh lake ``dest``, or copy it from ``cache``
    when a lake of the same scenario and simulator version is there (and store it there)."""
    from ingest import lake
    from ingest.simulator import from_dict, simulate

    key = hashlib.sha1((json.dumps(doc, sort_keys=True) + sim_version()).encode()).hexdigest()[:16]
    src = cache / f"{name}-{key}" if cache is not None else None
    if src is not None and (src / ".complete").exists():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".complete"))
        return
    sink = lake.LakeSink(dest)
    simulate(from_dict(doc, name=name), [sink])
    sink.close()
    if src is not None:
        tmp = src.with_name(src.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(dest, tmp)
        (tmp / ".complete").write_text(key)
        shutil.rmtree(src, ignore_errors=True)
        tmp.rename(src)


@dataclass
class CellResult:
    cell: Cell
    labels: list[dict[str, Any]] = field(default_factory=list)
    false: list[str] = field(default_factory=list)
    healthy_host_hours: float = 0.0
    superseded: int = 0
    cycles: int = 0
    seconds: float = 0.0


def run_cell(cell: Cell, cfg: Any, cache: Path | None, tmp: Path, engine: str = "serial",
             every: timedelta = CYCLE) -> CellResult:
    """Simulate, sweep cycle by cycle as the scheduler does (a cycle ``every``, its per-host
    work on ``engine``, as ``unveil schedule --engine`` runs it), score."""
    from ingest import lake
    from jobs.cycle import run_cycle
    from jobs.engine import make_engine

    t0 = time.perf_counter()
    root = tmp / cell.name
    shutil.rmtree(root, ignore_errors=True)
    simulated_lake(cell, root, cache)
    end = T0 + timedelta(minutes=cell.minutes)
    horizons: list[datetime] = []
    with make_engine(engine) as eng:
        for k, now in enumerate(cycle_times(cell.minutes, cfg.lag, every), 1):
            summary = run_cycle(root, cfg, now=now, engine=eng)
            if summary is None or summary.horizon is None:
                raise RuntimeError(f"{cell.name}: cycle {k} did not run (lake lock held?)")
            horizons.append(summary.horizon)
    tables = lake.tables(root)
    rows = lake.read(root, "incidents") if "incidents" in tables else pl.DataFrame()
    labels = lake.read(root, "labels") if "labels" in tables else pl.DataFrame(
        schema={"host": pl.String, "time": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC"),
                "type": pl.String, "severity": pl.Float64, "label_id": pl.String})
    labels = labels.with_columns(pl.col("end").fill_null(end))
    if "cost" not in labels.columns:
        labels = labels.with_columns(pl.lit(None, pl.Float64).alias("cost"))
    res = CellResult(cell, cycles=len(horizons))
    scored = score_labels(labels, rows, horizons, cfg.lag) if labels.height else []
    wl = {n: cell.host_workload(i) for i, n in enumerate(cell.host_names())}
    for r in scored:
        band, proxy = cost_band(r["cost"], r["severity"])
        r.update(run=cell.name, band=band, proxy=proxy, workload=wl[r["host"]], onset=cell.onset,
                 overlap=cell.overlap, fleet=cell.fleet, seed=cell.seed)
    res.labels = scored
    final, res.superseded = final_incidents(rows, horizons[-1]) if rows.height else (rows, 0)
    res.false = false_incidents(final, labels) if final.height else []
    res.healthy_host_hours = healthy_hours(labels, cell.host_names(), T0, end)
    res.seconds = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return res


# ------------------------------------------------------------------- reporting


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:g}"


def table(rows: list[dict[str, Any]], keys: Sequence[str]) -> str:
    head = [*keys, "labels", "detected", "top-1", "median cycles", "median s", "covered"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in group(rows, keys):
        out.append("| " + " | ".join([*(str(g[k]) for k in keys), str(g["labels"]),
                                      f"{g['detected']} ({_pct(g['detected_rate'])})",
                                      f"{g['top1']} ({_pct(g['top1_rate'])})",
                                      _num(g["median_cycles"]), _num(g["median_s"]), _pct(g["covered"])]) + " |")
    return "\n".join(out)


def summarise(name: str, seeds: Sequence[int], results: list[CellResult]) -> dict[str, Any]:
    rows = [r for res in results for r in res.labels]
    healthy = [res for res in results if res.cell.overlap == "healthy"]
    fw = [r for r in rows if r["overlap"] == "fleetwide"]
    h_false = sum(len(res.false) for res in healthy)
    h_hours = sum(res.healthy_host_hours for res in healthy)
    a_false = sum(len(res.false) for res in results)
    a_hours = sum(res.healthy_host_hours for res in results)
    targets = check_targets(rows, h_false, h_hours, fw)
    return {"set": name, "seeds": list(seeds), "labels": rows, "targets": [asdict(t) for t in targets],
            "healthy_fleets": {"false_incidents": h_false, "host_hours": h_hours,
                               "per_24_host_hours": None if h_hours <= 0 else h_false / h_hours * 24,
                               "incidents": [f for res in healthy for f in res.false]},
            "all_runs_healthy_time": {"false_incidents": a_false, "host_hours": a_hours,
                                      "per_24_host_hours": None if a_hours <= 0 else a_false / a_hours * 24,
                                      "incidents": [f"{res.cell.name}:{f}" for res in results for f in res.false]},
            "superseded_open_incidents": sum(res.superseded for res in results),
            "cells": [{"name": res.cell.name, "seconds": round(res.seconds, 1), "cycles": res.cycles,
                       "false": res.false} for res in results]}


def render(s: dict[str, Any]) -> str:
    rows = s["labels"]
    role = ("tuning set: thresholds may be chosen on these" if s["set"] == "tuning"
            else "HELD-OUT set: nothing may be tuned on these")
    proxy = any(r["proxy"] for r in rows)
    out = [f"\n## {s['set']} seeds {' '.join(map(str, s['seeds']))} ({role})",
           f"cost bands from {'the SEVERITY PROXY (labels have no cost column yet)' if proxy else 'labels.cost'}",
           "", "### per label"]
    for r in rows:
        out.append(f"- {r['run']}  {r['host']} {r['type']} [{r['band']}]: "
                   f"{'detected' if r['detected'] else 'MISSED'}, top-1 {r['got']}"
                   f"{' (right)' if r['top1'] else ' (WRONG)' if r['detected'] else ''}, visible after "
                   f"{_num(r['latency_cycles'])} cycle(s) / {_num(r['latency_s'])} s, right type after "
                   f"{_num(r['right_cycles'])} cycle(s), covered {_pct(r['covered'])}")
    for keys in (("type", "band"), ("band",), ("workload",), ("onset",), ("overlap",), ("fleet",), ("seed",)):
        out += ["", f"### by {' x '.join(keys)}", table(rows, keys)]
    hf, af = s["healthy_fleets"], s["all_runs_healthy_time"]
    out += ["", f"healthy fleets: {hf['false_incidents']} false incident(s) in {hf['host_hours']:.2f} host-h "
                f"= {_num(None if hf['per_24_host_hours'] is None else round(hf['per_24_host_hours'], 1))} "
                f"per 24 host-h {hf['incidents'][:8]}",
            f"all runs, time outside labels: {af['false_incidents']} false incident(s) in {af['host_hours']:.2f} "
            f"host-h = {_num(None if af['per_24_host_hours'] is None else round(af['per_24_host_hours'], 1))} per 24 "
            f"host-h {af['incidents'][:8]}",
            f"open incidents superseded by another id (not counted twice): {s['superseded_open_incidents']}",
            "top-1 by the longest overlap alone (the rule before each incident answered one label): "
            + ", ".join(f"{band} {sum(r['top1_longest'] for r in b)}/{len(b)}" for band, b in (
                (band, [r for r in rows if r["band"] == band]) for band in dict.fromkeys(r["band"] for r in rows))),
            "", "### targets (issue 15)", "| target | value | threshold | verdict |", "|---|---|---|---|"]
    for t in s["targets"]:
        v = t["value"]
        shown = "n/a" if v is None else (f"{100 * v:.0f} %" if "cycles" not in t["name"] and "24" not in t["name"]
                                         else f"{v:.3g}")
        out.append(f"| {t['name']} | {shown} | {t['threshold']} | {t['verdict']}"
                   f"{' (' + t['note'] + ')' if t['note'] else ''} |")
    return "\n".join(out)


def sweep_config(p: argparse.ArgumentParser, path: Path | None) -> tuple[SweepConfig, timedelta]:
    """Production's sweep and the period of its cycles: the default SweepConfig (what `unveil
    schedule` runs without a config file) and a cycle a minute, or the ``--config`` file's
    (its ``[scheduler] every``), without writing remediation proposals (not scored here) or
    compacting; a bad file is a usage error of ``p``."""
    from jobs.config import ConfigError, SweepConfig, load

    try:
        conf = load(path) if path is not None else None
    except ConfigError as exc:
        p.error(str(exc))
    base, every = (conf.sweep, conf.every) if conf is not None else (SweepConfig(), CYCLE)
    return replace(base, queue_remediations=False, compact_every=None), every


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the small matrix (minutes per seed) instead of the full one")
    p.add_argument("--long", action="store_true",
                   help="lasting faults instead: each type alone for 45 min on a 2-host fleet (no cohort); "
                        "read the 'covered' column")
    p.add_argument("--severity", type=float, default=None,
                   help="with --long: the faults' severity (default 0.5; the full matrix has 0.15, 0.35 and 0.7)")
    p.add_argument("--set", dest="sets", choices=("tuning", "held-out", "both"), default="both")
    p.add_argument("--tuning-seeds", type=int, nargs="+", default=list(TUNING_SEEDS))
    p.add_argument("--held-out-seeds", type=int, nargs="+", default=list(HELD_OUT_SEEDS))
    p.add_argument("--types", nargs="*", help="injection types of the full matrix (default: all)")
    p.add_argument("--lag", type=float, default=None, help="scheduler lag in s (default: production's, 90)")
    p.add_argument("--cache", type=Path, help="keep simulated lakes here (keyed by scenario + simulator code)")
    p.add_argument("--json", type=Path, help="write every figure as JSON here")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once in worker processes (default 1)")
    p.add_argument("--engine", default="serial",
                   help="where each cycle's per-host work runs (unveil schedule --engine; default serial): "
                        "the verdicts must not depend on it")
    p.add_argument("--batch-hosts", type=int, default=None, metavar="N",
                   help="the sweep's [scheduler] batch_hosts (default: production's, 32); a small N makes every "
                        "step several batches and, with --engine processes:2, a live step two slices of hosts: "
                        "run it serially and on 2 workers to check the verdicts do not depend on either")
    p.add_argument("--config", type=Path, help="sweep with this config file's [analytics] and [scheduler] "
                   "(default: none, production's defaults)")
    p.add_argument("--only", metavar="REGEX", help="run only the cells whose name matches (re.search)")
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ingest.simulator import INEFFICIENCIES

    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, not {args.jobs}")
    from jobs.engine import parse_spec

    try:
        args.engine = parse_spec(args.engine, "--engine")
    except ValueError as exc:
        p.error(str(exc))
    overlap_seeds = set(args.tuning_seeds) & set(args.held_out_seeds)
    if overlap_seeds:
        p.error(f"seed(s) {sorted(overlap_seeds)} are in both the tuning and the held-out set")
    types = list(args.types) if args.types else list(INEFFICIENCIES)
    bad = sorted(set(types) - set(INEFFICIENCIES))
    if bad:
        p.error(f"--types: unknown type(s) {', '.join(bad)}; known: {', '.join(INEFFICIENCIES)}")
    cfg, every = sweep_config(p, args.config)
    if args.lag is not None:
        cfg = replace(cfg, lag=timedelta(seconds=args.lag))
    if args.batch_hosts is not None:
        cfg = replace(cfg, batch_hosts=args.batch_hosts)
    sets = [("tuning", args.tuning_seeds), ("held-out", args.held_out_seeds)]
    sets = [s for s in sets if args.sets in ("both", s[0])]
    if args.quick and args.long:
        p.error("--quick and --long are two matrices: choose one")
    if args.severity is not None and not args.long:
        p.error("--severity sets the --long cells' severity (the other matrices have their own)")
    if args.severity is not None and not 0.0 < args.severity <= 1.0:
        p.error(f"--severity must be in (0, 1], not {args.severity}")

    def cells_of(seeds: Sequence[int]) -> list[Cell]:
        if args.quick:
            return quick_cells(seeds)
        return long_cells(seeds, types, args.severity or 0.5) if args.long else full_cells(seeds, types)

    plan = [(name, seeds, cells_of(seeds)) for name, seeds in sets]
    if args.only:
        try:
            only = re.compile(args.only)
        except re.error as exc:
            p.error(f"--only: {exc}")
        plan = [(name, seeds, [c for c in cells if only.search(c.name)]) for name, seeds, cells in plan]
    if args.list:
        for name, _, cells in plan:
            for c in cells:
                print(name, c.name)
        print(f"{sum(len(c) for *_, c in plan)} cells, "
              f"{sum(c.hosts * c.minutes for *_, cs in plan for c in cs) / 60:.1f} simulated host-hours")
        return 0
    t0 = time.perf_counter()
    out: dict[str, Any] = {"matrix": "quick" if args.quick else "long" if args.long else "full",
                           "lag_s": cfg.lag.total_seconds(),
                           "cycle_s": every.total_seconds(), "sets": {}}
    with tempfile.TemporaryDirectory(prefix="id_matrix-") as tmp:
        for name, seeds, cells in plan:
            # cells are independent (own lake, own copy): --jobs N runs N at once; the
            # results are the same in any order
            with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
                if pool is not None:
                    futures = [pool.submit(run_cell, cell, cfg, args.cache, Path(tmp), args.engine, every) for cell in cells]
                    done: Iterable[CellResult] = (f.result() for f in futures)
                else:
                    done = (run_cell(cell, cfg, args.cache, Path(tmp), args.engine, every) for cell in cells)
                results = []
                for i, res in enumerate(done, 1):
                    results.append(res)
                    print(f"[{name} {i}/{len(cells)}] {res.cell.name}: {res.seconds:.0f} s, "
                          f"{len(res.labels)} label(s), {len(res.false)} false "
                          f"[{time.perf_counter() - t0:.0f} s total]", file=sys.stderr, flush=True)
            s = summarise(name, seeds, results)
            out["sets"][name] = s
            print(render(s), flush=True)
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print(f"\nelapsed {out['elapsed_s']} s; lag {cfg.lag.total_seconds():g} s, one cycle per {every.total_seconds():g} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
