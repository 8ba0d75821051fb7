"""The contract between collectors and the agent (or the simulator).

A collector reads one source and returns :class:`Reading` objects: for one measurement,
one row per series with its tag values and its field values. Counter fields carry the
raw cumulative value as read; :class:`ingest.counters.CounterTracker` turns them into
deltas. ``host`` and ``time`` are added by the agent. A collector that splits reading
from parsing (:class:`Sampled`) parses the samples of a flush at once into
:class:`Block` objects, the rows of consecutive samples of the same series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
    """The rows of ``ticks`` consecutive samples of the same series, from a collector's
    ``parse(raws)``: ``tags`` hold one tick's rows (``n``), every field holds
    ``ticks * n`` values, tick after tick; ``at`` is the index in ``raws`` of the first of
    those samples. Tag lists may be shared between blocks and readings: never modified."""

    measurement: str
    ticks: int
    tags: dict[str, list[str]] = field(default_factory=dict)
    fields: dict[str, list[Value]] = field(default_factory=dict)
    at: int = 0


def readings(blocks: list[Block]) -> list[Reading]:
    """The blocks of one sample as readings (``collect()`` of a collector that parses
    batches: ``readings(self.parse([self.sample()]))``)."""
    return [Reading(b.measurement, tags=dict(b.tags), fields=b.fields) for b in blocks]


def merge_blocks(blocks: list[Block]) -> list[Block]:
    """Blocks of one measurement that follow each other (contiguous samples, the same
    series and fields) joined into one, so that counter deltas and buffering take them
    in one pass; the measurements' blocks keep their order."""
    out: list[Block] = []
    last: dict[str, int] = {}  # measurement -> its last block in ``out``
    joined: set[int] = set()  # blocks of ``out`` whose field lists are this call's own
    for b in blocks:
        i = last.get(b.measurement)
        if i is not None:
            a = out[i]
            if (a.at + a.ticks == b.at and a.fields.keys() == b.fields.keys()
                    and (a.tags is b.tags or a.tags == b.tags)):
                if i not in joined:  # copy once (a block's lists may be shared), then extend
                    a = out[i] = Block(a.measurement, a.ticks, a.tags, {f: list(v) for f, v in a.fields.items()}, a.at)
                    joined.add(i)
                for f, v in b.fields.items():
                    a.fields[f].extend(v)
                a.ticks += b.ticks
                continue
        last[b.measurement] = len(out)
        out.append(b)
    return out


class Collector(Protocol):
    #: registry name, e.g. "cpu"
    name: str
    #: measurements this collector fills
    measurements: tuple[str, ...]
    #: default tier (sampling period class)
    tier: Tier

    def collect(self) -> list[Reading]: ...

    def close(self) -> None: ...


class Sampled(Collector, Protocol):
    """A collector whose reading is split in two: ``sample()`` only reads (at the tick),
    ``parse(raws, errors)`` turns the raw samples of a flush, in tick order, into blocks.
    A sample that cannot be parsed is left out: its CollectorError is appended to
    ``errors``, or raised when ``errors`` is None. ``learns_layout``: ``parse`` learns
    the layout of the files from a sample (the agent parses one at start)."""

    def sample(self) -> Any: ...

    def parse(self, raws: list[Any], errors: list[CollectorError] | None = None) -> list[Block]: ...


def proc_path(root: str | Path, *parts: str) -> Path:
    """Path below a root ("/" on the live host, a recorded tree in tests)."""
    return Path(root).joinpath(*parts)
