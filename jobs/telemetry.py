"""Where a sweep reads its telemetry: the lake's telemetry tables and hosts, each host's
first data time (warm-up), corrupt files skipped and named, and an interval loaded from
the lake or read back from InfluxDB; or, for the scheduler's chunks, one host's features
(:func:`host_features`: its raw telemetry of the chunk only, its history from the lake's
``features`` table), so memory holds one host's raw rows at a time."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from analytics.features import (
    KEYS,
    SKIPPED,
    WINDOW_START,
    WindowSpec,
    compute_features,
    concat_features,
    features_by_host,
)
from ingest import lake as lake_mod
from ingest import schema
from ingest.atomic import write_atomic
from ingest.influx import InfluxConfig, InfluxSource
from jobs.grid import US, floor_grid, utc
from knowledge_base.facts import changes_only

log = logging.getLogger(__name__)

#: downstream tables the jobs write (never read as telemetry)
NOT_TELEMETRY = frozenset(SKIPPED | {"audit", "matches"})


def telemetry_tables(lake: str | os.PathLike[str]) -> list[str]:
    """Tables the analytics read as telemetry (the same rule as analytics.load_frames)."""
    return [t for t in lake_mod.tables(lake) if t not in NOT_TELEMETRY]


def fleet_hosts(lake: str | os.PathLike[str]) -> list[str]:
    out: set[str] = set()
    for t in telemetry_tables(lake):
        out.update(lake_mod.hosts(lake, t))
    return sorted(out)


def earliest(lake: str | os.PathLike[str], host: str) -> datetime | None:
    """The first telemetry time of ``host`` (from the first file of each table)."""
    best: datetime | None = None
    for t in telemetry_tables(lake):
        try:
            files = lake_mod.files(lake, t, hosts=[host])
        except lake_mod.LakeError:
            continue
        for f in files[:3]:  # the first partition holds the first rows
            try:
                v = lake_mod.scan_file(lake, f).select(pl.col(schema.TIME).min()).collect().item()
            except (OSError, pl.exceptions.PolarsError):
                continue
            if v is not None:
                v = utc(v)
                best = v if best is None or v < best else best
    return best



def partition_start(path: Path) -> datetime | None:
    """Where a lake file's partition begins (its ``date=`` and ``hour=`` directories)."""
    day = next((p[5:] for p in path.parts if p.startswith("date=")), None)
    if day is None:
        return None
    hour = next((int(p[5:]) for p in path.parts if p.startswith("hour=")), 0)
    return datetime.fromisoformat(day).replace(tzinfo=UTC) + timedelta(hours=hour)


def next_data(lake: str | os.PathLike[str], after: datetime, hosts: Sequence[str]) -> datetime | None:
    """A lower bound on the hosts' first telemetry at or after ``after``: the start of the
    first partition there that holds a file (directory listing only); None when there is none."""
    best: datetime | None = None
    for t in telemetry_tables(lake):
        with contextlib.suppress(lake_mod.LakeError):
            for f in lake_mod.files(lake, t, start=after, hosts=hosts):
                p0 = partition_start(Path(f))
                if p0 is not None and (best is None or p0 < best):
                    best = p0
    return best


def first_times(lake: str | os.PathLike[str], hosts: Sequence[str] | None,
                cache: dict[str, datetime] | None = None) -> dict[str, datetime]:
    """host -> its first telemetry time in the lake (cached: it never moves later)."""
    cache = {} if cache is None else cache
    for h in hosts or fleet_hosts(lake):
        if h not in cache:
            t = earliest(lake, h)
            if t is not None:
                cache[h] = t
    return cache


def has_data(lake: str | os.PathLike[str], start: datetime, end: datetime, hosts: Sequence[str] | None) -> bool:
    """Any telemetry file in [start, end) for ``hosts`` (directory listing only)."""
    for t in telemetry_tables(lake):
        with contextlib.suppress(lake_mod.LakeError):
            if lake_mod.files(lake, t, start=start, end=end, hosts=hosts):
                return True
    return False


Corrupt = lake_mod.CorruptFileError


def merge_corrupt(into: list[Corrupt], new: Iterable[Corrupt]) -> list[Corrupt]:
    """``into`` plus the files of ``new`` it does not name yet (one entry per file)."""
    seen = {e.path for e in into}
    for e in new:
        if e.path not in seen:
            seen.add(e.path)
            into.append(e)
    return into


@dataclass
class Loaded:
    frames: dict[str, pl.LazyFrame]
    facts: pl.DataFrame | None
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped, one entry each
    #: the wide features of the interval, already computed (then ``frames`` is empty):
    #: :func:`host_features` per host, joined by :func:`analytics.features.concat_features`
    features: pl.DataFrame | None = None
    #: or the same features as one file per host (the scheduler's chunks)
    files: HostFiles | None = None


#: a host's features file and the window starts it answers for, ``[lo, hi)`` in µs since the
#: epoch (None: unbounded). A host's windows are one file, or two: the file of the chunk that
#: last rewrote its whole history (the base), then the windows since, which each chunk
#: rewrites with its own added (the delta)
Part = tuple[str, int | None, int | None]

#: a chunk rewrites its host's whole history (one file) once the delta would span more than
#: this share of the history. A live minute with an hour's history then writes a delta of
#: 1 to 9 minutes and, every 10th minute, the hour: ~12 minutes of windows a cycle on
#: average instead of 61, and a read opens two files at most (each file costs a read ~1 ms:
#: 8 files of one minute each cost more CPU than the bytes saved, docs/fleet.md)
DELTA_SHARE = 1 / 6


def _bounded(df: pl.DataFrame, lo: int | None, hi: int | None) -> pl.DataFrame:
    """The rows of ``df`` (sorted by window start) starting in ``[lo, hi)`` (µs; None:
    unbounded): a zero-copy slice."""
    if lo is None and hi is None:
        return df
    ws = df[WINDOW_START].dt.epoch("us").to_numpy()
    a = 0 if lo is None else int(np.searchsorted(ws, lo))
    b = len(ws) if hi is None else int(np.searchsorted(ws, hi))
    return df.slice(a, max(0, b - a))


@dataclass(frozen=True)
class HostFiles:
    """A sweep's features as Arrow IPC files, one per host or two (a base and a delta,
    :data:`Part`; :func:`host_features` with a scratch directory), and their host facts. :meth:`rows` reads some hosts' windows
    memory-mapped (the maps live as long as the frame returned), so a process holds a
    batch of hosts' windows, not the fleet's. Plain data: sent to worker processes as is."""

    paths: Mapping[str, tuple[Part, ...]]  # host -> its files (:data:`Part`), hosts sorted
    columns: tuple[str, ...]  # the fleet's feature columns
    facts: Mapping[str, str] = field(default_factory=dict)  # host -> its host_facts file

    def facts_of(self, hosts: Sequence[str] | None) -> pl.DataFrame | None:
        """The host_facts rows of ``hosts`` (None: all); None when they have none."""
        want = sorted(self.facts) if hosts is None else sorted(h for h in set(hosts) if h in self.facts)
        parts = [pl.read_ipc(self.facts[h]) for h in want]
        return pl.concat(parts, how="diagonal_relaxed") if parts else None

    def rows(self, hosts: Sequence[str] | None, where: pl.Expr | None = None,
             columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The windows of ``hosts`` (None: all) matching ``where``, as the rows of the
        fleet's joined frame (:func:`analytics.features.concat_features`), in host order;
        ``columns``: only these feature columns."""
        parts = [self._read(h, where, columns) for h in sorted(set(self.paths if hosts is None else hosts))
                 if h in self.paths]
        wanted = None if columns is None else set(columns)
        cols = self.columns if wanted is None else [c for c in self.columns if c in wanted]
        return concat_features(parts, columns=cols)

    def _read(self, host: str, where: pl.Expr | None, columns: Sequence[str] | None) -> pl.DataFrame:
        parts = [_read_part(part, where, columns) for part in self.paths[host]]
        # (a column one file lacks is null in its rows: the fleet's concat_features fills as for a host)
        return parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal_relaxed", rechunk=False)

    def keys(self) -> pl.DataFrame:
        """host, window_start, window_end of every window."""
        return self.rows(None, columns=[])


def _read_part(part: Part, where: pl.Expr | None, columns: Sequence[str] | None) -> pl.DataFrame:
    """The windows of one features file (:data:`Part`) matching ``where``, memory-mapped
    (``columns``: only these feature columns; None: all)."""
    path, lo, hi = part
    with pa.memory_map(path) as src:
        table = pa.ipc.open_file(src).read_all()
        if columns is not None:
            have = set(table.schema.names)  # (a list built anew at each access)
            table = table.select([c for c in (*KEYS, *columns) if c in have])
        df = pl.from_arrow(table, rechunk=False)
        assert isinstance(df, pl.DataFrame)
        df = _bounded(df, lo, hi)
        if where is None:
            return df
        # rows the filter keeps are the map's pages (zero copy), and the map lives as long
        # as the returned frame. A column of a host-hour is ~30 kB: reading a few minutes
        # of every column faults in (the kernel maps 64 kB around a fault) nearly the
        # whole file, so a short part is copied out and the map goes now (256 hosts: a
        # batch's sampled peers mapped ~0.35 GB for ~50 MB of rows)
        df = df.filter(where)
        return df[np.arange(df.height)] if 2 * df.height < table.num_rows else df


def load_lake(lake: str | os.PathLike[str], start: datetime, end: datetime,
              hosts: Sequence[str] | None) -> Loaded:
    """Telemetry of [start, end) read eagerly. A corrupt file (damaged pages, truncated) is
    skipped and returned in ``corrupt``, not logged: the command warns once per file."""
    found: list[Corrupt] = []
    frames: dict[str, pl.LazyFrame] = {}
    for t in telemetry_tables(lake):
        df = lake_mod.read(lake, t, start=start, end=end, hosts=hosts, on_corrupt="skip", report=found)
        if df.height:
            frames[t] = df.lazy()
    facts = None
    if "host_facts" in lake_mod.tables(lake):
        facts = lake_mod.read(lake, "host_facts", hosts=hosts, on_corrupt="skip", report=found)
    return Loaded(frames, facts, merge_corrupt([], sorted(found, key=lambda e: e.path)))


def load_influx(config: InfluxConfig, start: datetime, end: datetime, hosts: Sequence[str] | None) -> Loaded:
    """Telemetry of [start, end) read back from InfluxDB (when the lake lacks the interval)."""
    src = InfluxSource(config)
    try:
        frames: dict[str, pl.LazyFrame] = {}
        for name, m in schema.MEASUREMENTS.items():
            if m.ground_truth or name in NOT_TELEMETRY or m.tier == "static":
                continue
            df = src.read(name, start=start, end=end, hosts=hosts)
            if df.height:
                frames[name] = df.lazy()
        facts = src.read("host_facts", start=datetime(1970, 1, 1, tzinfo=UTC), end=end, hosts=hosts)
    finally:
        src.close()
    return Loaded(frames, facts if facts.height else None)


# ------------------------------------------------------------ one host's features


@dataclass(frozen=True)
class HostChunk:
    """One host's part of a scheduler chunk: windows starting at or after ``first`` and
    ending at or before ``end`` are judged, those starting in ``[first - history, first)``
    are its history (reference only). Plain data: picklable, so :func:`host_features`
    can run in another process."""

    lake: str
    host: str
    first: datetime
    end: datetime
    history: timedelta
    window: WindowSpec
    #: read the history back from the ``features`` table (the scheduler's chunks wrote it
    #: exactly once); False computes it from raw telemetry (a by-hand sweep: that table
    #: may hold a repeated sweep's copy, or nothing)
    stored_history: bool = True
    #: a directory: the features go there as an Arrow IPC file (``HostFeatures.path``),
    #: not back to the caller, who then never holds the fleet's features
    scratch: str | None = None
    #: a (staging) lake root: the judged windows' features (the host's own columns) are
    #: written to its ``features`` table (``HostFeatures.staged``)
    stage: str | None = None
    #: the host's features files (``HostFeatures.parts``) of the committed chunk that ended
    #: where this one starts: its windows of the history are read there, not from the
    #: ``features`` table (the same windows: that chunk wrote them; the scheduler's cache)
    previous: tuple[Part, ...] | None = None
    #: the host's facts changes (:func:`knowledge_base.facts.changes_only`) before a time,
    #: as that chunk wrote them (``HostFeatures.facts_path``), and that time (its end):
    #: only the ``host_facts`` rows from then on are read. Without it, every row is: the
    #: agent writes ~540 facts a minute, so that read grows with the lake's age
    previous_facts: tuple[str, datetime] | None = None
    #: the host's first telemetry time (:func:`first_times`; None: unknown). No window
    #: starts before its bucket, so history before that is not looked for in raw
    #: telemetry: a host younger than the history would read and featurise its first
    #: rows again at every chunk (a live cycle of a fleet's first hour: ~40 % of its CPU)
    data_since: datetime | None = None


@dataclass
class HostFeatures:
    host: str
    features: pl.DataFrame  # history and chunk windows, sorted by window_start
    facts: pl.DataFrame | None
    corrupt: list[Corrupt] = field(default_factory=list)
    chunk_columns: list[str] = field(default_factory=list)  # the host's own columns in the chunk (what is written)
    reused: int = 0  # history windows read from the features table
    refeaturised: int = 0  # history windows computed from raw telemetry (the features table lacked them)
    path: str | None = None  # the features' Arrow IPC file (HostChunk.scratch); ``features`` is then empty
    #: the files holding its windows (:data:`Part`): ``path`` alone, or, when ``path`` got only
    #: the windows since the host's last whole history (the delta), that history's file (the
    #: base) bounded before them, then ``path``
    parts: tuple[Part, ...] = ()
    facts_path: str | None = None  # and the facts' (``facts`` is then None)
    columns: list[str] = field(default_factory=list)  # its feature columns (history included)
    staged: list[str] = field(default_factory=list)  # files written under HostChunk.stage
    windows: int = 0  # judged windows (starting at or after ``first``, ending at or before ``end``)


def _raw(lake: str, hosts: Sequence[str], start: datetime, end: datetime,
         found: list[Corrupt]) -> dict[str, pl.LazyFrame]:
    frames: dict[str, pl.LazyFrame] = {}
    for t in telemetry_tables(lake):
        df = lake_mod.read(lake, t, start=start, end=end, hosts=hosts, on_corrupt="skip", report=found)
        if df.height:
            frames[t] = df.lazy()
    return frames


def _anchored(frames: dict[str, pl.LazyFrame], at: datetime, hosts: Sequence[str]) -> dict[str, pl.LazyFrame]:
    """``frames`` with, for each of ``hosts``, a copy of one of its real rows moved to
    ``at`` (its first row of the first table that has its rows): the host's bucket grid
    then starts there, as it does when its history is read with the chunk (a host resuming
    after a gap gets the same windows). The copy's bucket ends before every judged window
    starts, so no judged value changes; it is a row of an existing device (no new column)."""
    out, left = dict(frames), set(hosts)
    for name, lf in frames.items():
        if not left:
            break
        rows = (lf.filter(pl.col(schema.HOST).is_in(sorted(left))).sort(schema.TIME)
                .filter(pl.col(schema.HOST).is_first_distinct()).collect())
        if rows.height:
            left -= set(rows[schema.HOST].to_list())
            rows = rows.with_columns(pl.lit(at).cast(schema.TIME_DTYPE).alias(schema.TIME))
            out[name] = pl.concat([rows.lazy(), lf], how="vertical_relaxed")
    return out


def _us(t: datetime) -> int:
    return (utc(t) - datetime(1970, 1, 1, tzinfo=UTC)) // US


def _kept_history(parts: Sequence[Part], start: datetime, first: datetime) -> pl.DataFrame | None:
    """The windows starting in ``[start, first)`` of a host's features files kept from its
    previous chunk (each sorted by window start: slices of the memory maps, which stay
    valid when the files are replaced); None when one cannot be read."""
    got = []
    for path, lo, hi in parts:
        a, b = _us(start) if lo is None else max(lo, _us(start)), _us(first) if hi is None else min(hi, _us(first))
        try:
            got.append(_read_part((path, a, b), None, None))
        except (OSError, pa.ArrowException, pl.exceptions.PolarsError) as exc:
            log.warning("features cache: cannot read %s (%s): the history is read from the lake", path, exc)
            return None
    if not got:
        return None
    return got[0] if len(got) == 1 else pl.concat(got, how="diagonal_relaxed", rechunk=False)


def _facts_changes(jobs: Sequence[HostChunk], found: list[Corrupt]) -> pl.DataFrame:
    """The batch's host facts before its chunk's end, as their changes (what the features
    and the step read: the facts at any time and when they changed, at ~1 % of the
    snapshots' rows). A host with a changes file of the chunk before adds only the rows
    from that file's end on (the same changes: a change is a row unlike the previous
    reading of its fact, and the file keeps each fact's last value); an unreadable file
    is logged and the host's rows are all read."""
    lake, end = jobs[0].lake, jobs[0].end
    since: dict[datetime | None, list[str]] = {}
    parts: list[pl.DataFrame] = []
    for j in jobs:
        start = None
        if j.previous_facts is not None:
            path, until = j.previous_facts
            try:
                parts.append(pl.read_ipc(path))
                start = until
            except (OSError, pl.exceptions.PolarsError) as exc:
                log.warning("facts cache: cannot read %s (%s): the host's facts are read from the lake", path, exc)
        since.setdefault(start, []).append(j.host)
    for start, hosts in since.items():
        parts.append(lake_mod.read(lake, "host_facts", start=start, end=end, hosts=hosts, on_corrupt="skip",
                                   report=found))
    parts = [p for p in parts if p.width]
    return changes_only(pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame())


def _by_host(df: pl.DataFrame | None) -> dict[str, pl.DataFrame]:
    if df is None or df.is_empty() or schema.HOST not in df.columns:
        return {}
    return {str(k[0]): part for k, part in df.partition_by(schema.HOST, as_dict=True, maintain_order=True).items()}


def _host_of(path: Path, hosts: Sequence[str]) -> str:
    """The host whose partition ``path`` is in (the first of ``hosts`` when none is named)."""
    for part in path.parts:
        if part.startswith("host=") and part[5:] in hosts:
            return part[5:]
    return hosts[0]


#: a batch of :func:`batch_features` reads at most this many host-minutes of raw
#: telemetry at once (one host's hour: what a one-host call of an hour's chunk held)
BATCH_HOST_MINUTES = 60


def _hosts_per_read(span: timedelta) -> int:
    """Hosts whose raw telemetry of ``span`` fit in :data:`BATCH_HOST_MINUTES`."""
    return max(1, int(BATCH_HOST_MINUTES * 60 // max(span.total_seconds(), 1.0)))


def batches(jobs: Sequence[HostChunk], workers: int = 1) -> list[list[HostChunk]]:
    """``jobs`` (hosts of one chunk) cut into the batches of :func:`batch_features`: as
    large as keep a batch's raw read within :data:`BATCH_HOST_MINUTES` (a live one-minute
    chunk: 60 hosts; an hour's chunk, or one whose history is read raw: 1), and at least
    ``workers`` of them (every worker gets one), of near-equal sizes, in order."""
    if not jobs:
        return []
    j = jobs[0]
    size = _hosts_per_read(j.end - j.first + (timedelta(0) if j.stored_history else j.history))
    k = min(len(jobs), max(-(-len(jobs) // size), workers))
    cuts = [round(i * len(jobs) / k) for i in range(k + 1)]
    return [list(jobs[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]


def host_features(job: HostChunk) -> HostFeatures:
    """The features of one host over a chunk and its history (see :class:`HostChunk` and
    :func:`batch_features`)."""
    return batch_features([job])[0]


def batch_features(jobs: Sequence[HostChunk]) -> list[HostFeatures]:
    """The features of several hosts of one chunk, each over the chunk and its history
    (see :class:`HostChunk`; the jobs differ only by host), in the jobs' order.

    The chunk's windows are computed from its raw telemetry ``[first, end)`` only (a
    window needs only its own rows); the history is read back from the lake's
    ``features`` table, which earlier chunks wrote, and computed from raw telemetry only
    where the table lacks it (the first chunk, history before the first sweep). Raw rows
    are dropped once reduced: memory holds the raw rows of at most
    :data:`BATCH_HOST_MINUTES` host-minutes. The hosts' tables are read and their chunk
    featurised together (:func:`analytics.features.features_by_host`), each host's results
    the ones it gets alone: a call's fixed cost is then paid once per batch, not per host.

    Values are those of the fleet-wide computation (``tests/test_sweep_per_host.py``);
    the column set may differ by columns without evidence: a stored file carries the
    columns of its whole chunk, so history read from part of it can name a device that
    sent no rows in this interval (and a device whose only rows carry no value, a first
    sample, gets no column); such columns are null, or 0 for the zero-fill families,
    and the detectors ignore columns constant in their reference."""
    if not jobs:
        return []
    j0 = jobs[0]
    if any((j.lake, j.first, j.end, j.history, j.window, j.stored_history, j.scratch, j.stage)
           != (j0.lake, j0.first, j0.end, j0.history, j0.window, j0.stored_history, j0.scratch, j0.stage)
           for j in jobs) or len({j.host for j in jobs}) != len(jobs):
        raise ValueError("batch_features: the jobs of a batch are distinct hosts of one chunk")
    found: list[Corrupt] = []
    lake, win, hosts = j0.lake, j0.window, [j.host for j in jobs]
    w, stride = timedelta(seconds=win.length_s), timedelta(seconds=win.stride_s)
    start = j0.first - j0.history
    tables = lake_mod.tables(lake)
    facts_all = _facts_changes(jobs, found) if "host_facts" in tables else None
    facts_of = _by_host(facts_all)
    hist_of: dict[str, pl.DataFrame] = {}
    stored = j0.stored_history and j0.history > timedelta(0)
    if stored:
        for j in jobs:
            kept = None if j.previous is None else _kept_history(j.previous, start, j0.first)
            if kept is not None and kept.height:
                hist_of[j.host] = kept
    cached = {j.host: j.previous for j in jobs if j.host in hist_of and j.previous is not None}
    table_hosts = [h for h in hosts if h not in hist_of]
    if stored and "features" in tables and table_hosts:
        hist = lake_mod.read(lake, "features", start=start, end=j0.first, hosts=table_hosts, on_corrupt="skip",
                             report=found)
        if hist.height:
            hist = hist.drop(schema.TIME).filter(pl.col(WINDOW_START) >= start).sort(schema.HOST, WINDOW_START)
            for h, part in _by_host(hist).items():  # (a column only other hosts have is theirs)
                nulls = part.null_count().row(0)
                hist_of[h] = part.select(c for c, n in zip(part.columns, nulls, strict=True) if n < part.height)

    def facts_for(h: str) -> pl.DataFrame | None:
        return None if facts_all is None else facts_of.get(h, facts_all.clear())

    def raw_windows(h: str, lo: datetime, hi: datetime) -> pl.DataFrame:
        """Windows starting in [lo, hi) from raw telemetry (rows through the last one's end)."""
        frames = _raw(lake, [h], lo, min(floor_grid(hi - US, win.stride_s) + w, j0.end), found)
        if not frames:
            return pl.DataFrame()
        feats = compute_features(frames, win, host_facts=facts_for(h))
        return feats.filter((pl.col(WINDOW_START) >= lo) & (pl.col(WINDOW_START) < hi))

    # history the table lacks, from raw telemetry: before its first window (never swept),
    # and between two of its windows (a gap in the data across a chunk's start: the
    # fleet-wide computation has windows over it, as its grid spans the gap)
    fresh: dict[str, list[pl.DataFrame]] = {}
    lo_of: dict[str, datetime] = {}  # where each host's raw read of the chunk starts
    for j in jobs:
        h, hist_h = j.host, hist_of.get(j.host)
        lo_of[h] = j0.first
        if hist_h is not None:
            ws = hist_h[WINDOW_START]
            first_ws, last_ws = utc(ws[0]), utc(ws[-1])
            # (start is off the grid, s - window + 1 us - history: the grid's first window at
            # or after it is no hole, and reading raw rows for it would find no window to add;
            # nor is the time before the host's first bucket)
            lead = floor_grid(start - US, win.stride_s) + stride
            if j.data_since is not None:
                lead = max(lead, floor_grid(j.data_since, win.stride_s))
            holes = [(start, first_ws)] if first_ws > lead else []
            gaps = np.flatnonzero(np.diff(ws.dt.epoch("us").to_numpy()) > round(win.stride_s * 1e6))
            holes += [(utc(ws[i]) + stride, utc(ws[i + 1])) for i in gaps.tolist()]
            fresh[h] = [raw_windows(h, a, b) for a, b in holes]
            if last_ws + stride < j0.first:  # the windows up to the chunk: with it (its rows end the gap)
                lo_of[h] = last_ws + stride
        else:
            lo_of[h] = start  # no stored history: read it with the chunk, as the fleet-wide path does
    # the chunk's raw rows, the hosts with the same start together, at most a batch's worth at once
    chunk_of: dict[str, pl.DataFrame] = {}
    groups: dict[datetime, list[str]] = {}
    for h in hosts:
        groups.setdefault(lo_of[h], []).append(h)
    for lo, members in groups.items():
        size = _hosts_per_read(j0.end - lo)
        for k in range(0, len(members), size):
            some = members[k:k + size]
            frames = _raw(lake, some, lo, j0.end, found)
            if not frames:
                continue
            anchored = [h for h in some if h in hist_of]
            if anchored:
                frames = _anchored(frames, lo - US, anchored)
            for h, f in features_by_host(frames, win, host_facts=facts_all).items():
                chunk_of[h] = f.filter(pl.col(WINDOW_START) >= lo)
            del frames
    out: list[HostFeatures] = []
    first_us, start_us = _us(j0.first), _us(start)
    for h in hosts:
        # (each host's frames are let go once its file is written, not at the batch's end)
        hist_h, chunk, lo = hist_of.pop(h, pl.DataFrame()), chunk_of.pop(h, pl.DataFrame()), lo_of[h]
        n_fresh = sum(f.height for f in fresh.get(h, [])) + (
            chunk.filter(pl.col(WINDOW_START) < j0.first).height if lo < j0.first and chunk.height else 0)
        previous = cached.get(h)
        # a history read whole from the kept files and only new windows after it: the file
        # gets the windows since the base's, and the base answers for the rest (a live minute
        # rewrote the hour of every host otherwise: 10 MiB a host-minute, docs/fleet.md)
        delta_lo = None if previous is None else first_us if len(previous) == 1 else previous[-1][1]
        # (a host without new rows gets an empty delta: rewriting its hour every minute while its
        # agent is down saves nothing; rows of the chunk before the delta's start need a rewrite)
        append = (j0.scratch is not None and previous is not None and len(previous) <= 2 and delta_lo is not None
                  and not fresh.get(h) and (chunk.height == 0 or _us(lo) >= delta_lo)
                  and _us(j0.end) - delta_lo <= DELTA_SHARE * (j0.history // US))
        if append:
            feats = concat_features([p for p in (_bounded(hist_h, delta_lo, None), chunk) if p.height])
            columns = sorted({*hist_h.columns, *feats.columns} - set(KEYS))
        else:
            feats = concat_features([p for p in (*fresh.get(h, []), hist_h, chunk) if p.height])
            columns = [c for c in feats.columns if c not in KEYS]
        fresh.pop(h, None)
        own = [c for c in chunk.columns if c not in KEYS]
        facts = facts_for(h)
        one = HostFeatures(h, feats, facts, [c for c in found if _host_of(c.path, hosts) == h], own, hist_h.height,
                           n_fresh, columns=columns)
        judged = feats.filter((pl.col(WINDOW_START) >= j0.first) & (pl.col("window_end") <= j0.end))
        one.windows = judged.height
        if j0.stage is not None and judged.height:
            root = Path(j0.stage)
            one.staged = [str(p.relative_to(root)) for p in lake_mod.write_table(
                root, "features", judged.select(pl.col(WINDOW_START).alias(schema.TIME), *KEYS, *own))]
        if j0.scratch is not None and (feats.height or append):
            name = hashlib.sha1(h.encode()).hexdigest()[:16]
            one.path = str(Path(j0.scratch) / f"{name}-{first_us}.arrow")  # (a kept file keeps its name)
            write_atomic(one.path, feats.write_ipc, durable=False)  # uncompressed: read back memory-mapped
            # (the base bounded to this chunk's history before the delta: older windows are not its own)
            if append and previous is not None and delta_lo is not None:
                base, a, _ = previous[0]
                one.parts = ((base, start_us if a is None else max(a, start_us), delta_lo), (one.path, delta_lo, None))
            else:
                one.parts = ((one.path, None, None),)
            one.features = feats.clear()
            if facts is not None and facts.height:
                one.facts_path = str(Path(j0.scratch) / f"{name}.facts.arrow")
                write_atomic(one.facts_path, facts.write_ipc, durable=False)
                one.facts = None
        out.append(one)
    for one in out:
        one.corrupt = merge_corrupt([], sorted(one.corrupt, key=lambda e: e.path))
    return out


def joined(parts: Sequence[HostFeatures]) -> Loaded:
    """The hosts' features (:func:`host_features`) as one :class:`Loaded` for the sweep
    step: features joined (:func:`concat_features`), or their files listed when they went
    to files, facts and skipped files merged. The parts' feature frames are emptied: the
    joined frame is the one copy kept."""
    facts = [p.facts for p in parts if p.facts is not None and p.facts.height]
    files = {p.host: p.parts for p in sorted(parts, key=lambda p: p.host) if p.path is not None}
    fact_files = {p.host: p.facts_path for p in parts if p.facts_path is not None}
    loaded = Loaded({}, pl.concat(facts, how="diagonal_relaxed") if facts else None,
                    merge_corrupt([], [c for p in parts for c in p.corrupt]),
                    None if files else concat_features([p.features for p in parts if p.features.height]))
    if files:
        loaded.files = HostFiles(files, tuple(sorted({c for p in parts for c in p.columns})), fact_files)
    for p in parts:
        p.features = p.features.clear()
    return loaded
