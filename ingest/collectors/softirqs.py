"""/proc/softirqs -> ``softirqs``: per softirq type, counts reduced to NUMA nodes.

Same layout and the same reduction as /proc/interrupts (one ' %10u' column per
possible CPU), see :mod:`ingest.collectors.interrupts`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ingest.collectors.base import Block, proc_path
from ingest.collectors.procfs import (
    CountGrid,
    LayoutCollector,
    NodeTable,
    ProcFile,
    cpu_node_map,
    fixed_width_counts,
    parse_cpu_header,
    parse_error,
)
from ingest.schema import Tier


class SoftirqsCollector(LayoutCollector[bytes]):
    name = "softirqs"
    measurements: tuple[str, ...] = ("softirqs",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/softirqs"), whole=True)
        self._table = NodeTable("softirqs", cpu_node_map(root))
        self._grid = CountGrid()

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        values = self._grid.counts_many(raws)
        return None if values is None else [self._table.block(values)]

    def _parse_full(self, data: bytes) -> list[Block]:
        path = self._file.path
        lines = data.split(b"\n")
        cpus = parse_cpu_header(lines[0], path)
        ncpu = len(cpus)
        self._table.reducer.set_columns(cpus)
        names: list[str] = []
        regions: list[bytes] = []
        starts: list[int] = []
        pos = len(lines[0]) + 1
        for lineno, line in enumerate(lines[1:], start=2):
            here, pos = pos, pos + len(line) + 1
            colon = line.find(b":")
            if colon < 0:
                if line.strip():
                    raise parse_error(path, lineno, line, "no 'NAME:' label")
                continue
            names.append(line[:colon].strip().decode())
            regions.append(line[colon + 1 :].rstrip())
            starts.append(here + colon + 1)
        values = fixed_width_counts(regions, ncpu)
        if values is not None:
            self._grid.learn(data, starts, ncpu)
        else:
            # not the usual layout: split (slower, and names the bad line)
            self._grid = CountGrid()
            values = np.zeros((len(regions), ncpu), dtype=np.int64)
            for i, r in enumerate(regions):
                parts = r.split()
                if len(parts) != ncpu or not all(p.isdigit() for p in parts):
                    raise parse_error(path, i + 2, r, f"expected {ncpu} counts")
                values[i] = [int(p) for p in parts]
        self._table.set_rows({"softirq": names}, list(names))
        return [self._table.block(values[None])]

    def close(self) -> None:
        self._file.close()
