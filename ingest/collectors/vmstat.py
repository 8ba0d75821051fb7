"""/proc/vmstat -> ``vmstat`` (the counters of ``ingest.schema.VMSTAT_COUNTERS``).

Counters the kernel does not expose (thp_* without THP, numa_* without NUMA,
allocstall_normal before 4.8 ...) are null, not zero."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import Reading, Value, proc_path
from ingest.collectors.procfs import ProcFile, key_values, parse_error
from ingest.schema import VMSTAT_COUNTERS, Tier

_WANTED: dict[bytes, str] = {n.encode(): n for n in VMSTAT_COUNTERS}


class VmstatCollector:
    name = "vmstat"
    measurements: tuple[str, ...] = ("vmstat",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/vmstat"))

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def parse(self, data: bytes) -> list[Reading]:
        pairs = key_values(data)
        if pairs is not None:  # the usual 'key value' lines: dict built in C
            try:
                fast: dict[str, list[Value]] = {
                    n: [int(pairs[k]) if k in pairs else None] for k, n in _WANTED.items()
                }
                return [Reading("vmstat", fields=fast)]
            except ValueError:
                pass  # the line-by-line pass below names the bad line
        path = self._file.path
        fields: dict[str, list[Value]] = {n: [None] for n in VMSTAT_COUNTERS}
        wanted = _WANTED
        for lineno, line in enumerate(data.split(b"\n"), start=1):
            key, _, val = line.partition(b" ")
            name = wanted.get(key)
            if name is None:
                continue
            try:
                fields[name][0] = int(val)
            except ValueError:
                raise parse_error(path, lineno, line, "not a number") from None
        return [Reading("vmstat", fields=fields)]

    def close(self) -> None:
        self._file.close()
