"""Where a sweep reads its telemetry: the lake's telemetry tables and hosts, each host's
first data time (warm-up), corrupt files skipped and named, and an interval loaded from
the lake or read back from InfluxDB."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

from analytics.features import SKIPPED
from ingest import lake as lake_mod
from ingest import schema
from ingest.influx import InfluxConfig, InfluxSource
from jobs.grid import utc

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
