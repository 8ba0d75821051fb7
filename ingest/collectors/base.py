"""The contract between collectors and the agent (or the simulator).

A collector reads one source and returns :class:`Reading` objects: for one measurement,
one row per series with its tag values and its field values. Counter fields carry the
raw cumulative value as read; :class:`ingest.counters.CounterTracker` turns them into
deltas. ``host`` and ``time`` are added by the agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ingest.schema import Tier


class SourceUnavailable(Exception):
    """A source does not exist on this host (no GPU, no PMU, no PSI ...).

    Raised by a collector's constructor; the agent reports it once and goes on."""


class CollectorError(Exception):
    """A source exists but could not be read or parsed; the message names the path."""


Value = int | float | str | None


@dataclass(slots=True)
class Reading:
    measurement: str
    tags: dict[str, list[str]] = field(default_factory=dict)
    fields: dict[str, list[Value]] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        for values in self.fields.values():
            return len(values)
        for tag_values in self.tags.values():
            return len(tag_values)
        return 0


@dataclass(slots=True)
class Block:
    """The readings of ``ticks`` consecutive samples of the same series, from a
    collector's optional ``parse_batch``: ``tags`` hold one tick's rows (``n``), every
    field holds ``ticks * n`` values, tick after tick. Tag lists may be shared between
    blocks and readings: never modified."""

    measurement: str
    ticks: int
    tags: dict[str, list[str]] = field(default_factory=dict)
    fields: dict[str, list[Value]] = field(default_factory=dict)


class Collector(Protocol):
    #: registry name, e.g. "cpu"
    name: str
    #: measurements this collector fills
    measurements: tuple[str, ...]
    #: default tier (sampling period class)
    tier: Tier

    def collect(self) -> list[Reading]: ...

    def close(self) -> None: ...


def proc_path(root: str | Path, *parts: str) -> Path:
    """Path below a root ("/" on the live host, a recorded tree in tests)."""
    return Path(root).joinpath(*parts)
