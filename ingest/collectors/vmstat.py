"""/proc/vmstat -> ``vmstat`` (the counters of ``ingest.schema.VMSTAT_COUNTERS``).

Counters the kernel does not expose (thp_* without THP, numa_* without NUMA,
allocstall_normal before 4.8 ...) are null, not zero."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import Block, Value, proc_path
from ingest.collectors.procfs import (
    LayoutCollector,
    LineLayout,
    ProcFile,
    wanted_counters,
)
from ingest.schema import VMSTAT_COUNTERS, Tier

_WANTED: dict[bytes, str] = {n.encode(): n for n in VMSTAT_COUNTERS}


class VmstatCollector(LayoutCollector[bytes]):
    name = "vmstat"
    measurements: tuple[str, ...] = ("vmstat",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/vmstat"))
        self._layout = LineLayout()

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        return self._layout.block("vmstat", VMSTAT_COUNTERS, raws)

    def _parse_full(self, data: bytes) -> list[Block]:
        got = wanted_counters(data, _WANTED, self._file.path)
        if self._layout.relearn:
            self._layout.learn(data, b" ", _WANTED, got)
        fields: dict[str, list[Value]] = {n: [got.get(n)] for n in VMSTAT_COUNTERS}
        return [Block("vmstat", 1, fields=fields)]

    def close(self) -> None:
        self._file.close()
