"""/proc/softirqs -> ``softirqs``: per softirq type, counts reduced to NUMA nodes.

Same layout and the same reduction as /proc/interrupts (one ' %10u' column per
possible CPU), see :mod:`ingest.collectors.interrupts`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ingest.collectors.base import Reading, proc_path
from ingest.collectors.procfs import (
    NodeReducer,
    ProcFile,
    cpu_node_map,
    fixed_width_counts,
    node_reading,
    parse_cpu_header,
    parse_error,
)
from ingest.schema import Tier


class SoftirqsCollector:
    name = "softirqs"
    measurements: tuple[str, ...] = ("softirqs",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/softirqs"), whole=True)
        self._reducer = NodeReducer(cpu_node_map(root))

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def parse(self, data: bytes) -> list[Reading]:
        path = self._file.path
        lines = data.split(b"\n")
        cpus = parse_cpu_header(lines[0], path)
        ncpu = len(cpus)
        self._reducer.set_columns(cpus)
        names: list[str] = []
        regions: list[bytes] = []
        for lineno, line in enumerate(lines[1:], start=2):
            colon = line.find(b":")
            if colon < 0:
                if line.strip():
                    raise parse_error(path, lineno, line, "no 'NAME:' label")
                continue
            names.append(line[:colon].strip().decode())
            regions.append(line[colon + 1 :].rstrip())
        values = fixed_width_counts(regions, ncpu)
        if values is None:
            # not the usual layout: split (slower, and names the bad line)
            values = np.zeros((len(regions), ncpu), dtype=np.int64)
            for i, r in enumerate(regions):
                parts = r.split()
                if len(parts) != ncpu or not all(p.isdigit() for p in parts):
                    raise parse_error(path, i + 2, r, f"expected {ncpu} counts")
                values[i] = [int(p) for p in parts]
        return [node_reading("softirqs", self._reducer, {"softirq": list(names)}, list(names), values)]

    def close(self) -> None:
        self._file.close()
