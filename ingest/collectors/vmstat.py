"""/proc/vmstat -> ``vmstat`` (the counters of ``ingest.schema.VMSTAT_COUNTERS``).

Counters the kernel does not expose (thp_* without THP, numa_* without NUMA,
allocstall_normal before 4.8 ...) are null, not zero."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import Block, Reading, Value, proc_path
from ingest.collectors.procfs import LineLayout, ProcFile, wanted_counters
from ingest.schema import VMSTAT_COUNTERS, Tier

_WANTED: dict[bytes, str] = {n.encode(): n for n in VMSTAT_COUNTERS}


class VmstatCollector:
    name = "vmstat"
    measurements: tuple[str, ...] = ("vmstat",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/vmstat"))
        self._layout = LineLayout()

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def parse(self, data: bytes) -> list[Reading]:
        got = self._layout.parse(data)
        if got is None:
            got = wanted_counters(data, _WANTED, self._file.path)
            self._layout.learn(data, b" ", _WANTED)
        fields: dict[str, list[Value]] = {n: [got.get(n)] for n in VMSTAT_COUNTERS}
        return [Reading("vmstat", fields=fields)]

    def parse_batch(self, raws: list[bytes]) -> list[Block] | None:
        """Samples laid out like the last parsed one, in one pass; None otherwise."""
        return self._layout.block("vmstat", VMSTAT_COUNTERS, raws)

    def close(self) -> None:
        self._file.close()
