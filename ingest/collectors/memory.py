"""/proc/meminfo -> ``memory`` (bytes; HugePages_* as page counts).

Keys the kernel does not print (old kernels lack MemAvailable, ShmemHugePages ...)
are null."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import Reading, Value, proc_path
from ingest.collectors.procfs import ProcFile, parse_error
from ingest.schema import MEMINFO_KEYS, Tier

#: meminfo key (bytes) -> lake field
_KEY_FIELD: dict[bytes, str] = {k.encode(): f for f, k in MEMINFO_KEYS.items()}


def parse_meminfo(data: bytes, path: str, prefix: bytes = b"") -> dict[bytes, int]:
    """'MemTotal:  24684096 kB' -> {b'MemTotal': 25276514304}; values with 'kB' become
    bytes, others (HugePages_*) stay counts. ``prefix`` strips the 'Node 0 ' of a
    node's meminfo."""
    out: dict[bytes, int] = {}
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line:
            continue
        if prefix:
            if not line.startswith(prefix):
                raise parse_error(path, lineno, line, f"expected {prefix.decode()!r}")
            line = line[len(prefix) :]
        key, sep, rest = line.partition(b":")
        parts = rest.split()
        if not sep or not parts:
            raise parse_error(path, lineno, line, "expected 'Key: value [kB]'")
        try:
            v = int(parts[0])
        except ValueError:
            raise parse_error(path, lineno, line, "not a number") from None
        out[key.strip()] = v * 1024 if len(parts) > 1 and parts[1] == b"kB" else v
    return out


class MemoryCollector:
    name = "memory"
    measurements: tuple[str, ...] = ("memory",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/meminfo"), whole=True)

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def parse(self, data: bytes) -> list[Reading]:
        values = parse_meminfo(data, self._file.path)
        fields: dict[str, list[Value]] = {f: [values.get(k)] for k, f in _KEY_FIELD.items()}
        return [Reading("memory", fields=fields)]

    def close(self) -> None:
        self._file.close()
