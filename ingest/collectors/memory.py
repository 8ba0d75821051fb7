"""/proc/meminfo -> ``memory`` (bytes; HugePages_* as page counts).

Keys the kernel does not print (old kernels lack MemAvailable, ShmemHugePages ...)
are null."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ingest.collectors.base import Block, Value, proc_path
from ingest.collectors.procfs import LayoutCollector, LineLayout, ProcFile, parse_error
from ingest.schema import MEMINFO_KEYS, Tier

#: meminfo key (bytes) -> lake field
_KEY_FIELD: dict[bytes, str] = {k.encode(): f for f, k in MEMINFO_KEYS.items()}
_FIELDS: tuple[str, ...] = tuple(_KEY_FIELD.values())


@functools.cache
def _meminfo_line(prefix: bytes) -> re.Pattern[bytes]:
    return re.compile(rb"^" + re.escape(prefix) + rb"([^:\n]+):[ \t]*(\d+)( kB)?[ \t]*$", re.M)


def parse_meminfo(data: bytes, path: str, prefix: bytes = b"") -> dict[bytes, int]:
    """'MemTotal:  24684096 kB' -> {b'MemTotal': 25276514304}; values with 'kB' become
    bytes, others (HugePages_*) stay counts. ``prefix`` strips the 'Node 0 ' of a
    node's meminfo. One regex pass in C; a file where not every line matches goes
    through the line-by-line parser, which names the bad line."""
    found = _meminfo_line(prefix).findall(data)
    if len(found) == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1):
        return {k.strip(): int(v) * 1024 if kb else int(v) for k, v, kb in found}
    return _parse_meminfo_lines(data, path, prefix)


def _parse_meminfo_lines(data: bytes, path: str, prefix: bytes) -> dict[bytes, int]:
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


class MemoryCollector(LayoutCollector[bytes]):
    name = "memory"
    measurements: tuple[str, ...] = ("memory",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/meminfo"), whole=True)
        self._layout = LineLayout()

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        return self._layout.block("memory", _FIELDS, raws)

    def _parse_full(self, data: bytes) -> list[Block]:
        values = parse_meminfo(data, self._file.path)
        got = {f: values[k] for k, f in _KEY_FIELD.items() if k in values}
        if self._layout.relearn:
            self._layout.learn(data, b":", _KEY_FIELD, got)
        fields: dict[str, list[Value]] = {f: [got.get(f)] for f in _FIELDS}
        return [Block("memory", 1, fields=fields)]

    def close(self) -> None:
        self._file.close()
