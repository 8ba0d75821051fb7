"""/sys/devices/system/node/node*/{numastat,meminfo} -> ``numa`` (one row per node).

A kernel built without NUMA has no node directory: SourceUnavailable."""

from __future__ import annotations

import os
from pathlib import Path

from ingest.collectors.base import Reading, SourceUnavailable, Value, proc_path
from ingest.collectors.memory import parse_meminfo
from ingest.collectors.procfs import ProcFile, wanted_counters
from ingest.schema import NUMA, Tier

_STAT_FIELDS: tuple[str, ...] = NUMA.counters
_WANTED: dict[bytes, str] = {n.encode(): n for n in _STAT_FIELDS}


class NumaCollector:
    name = "numa"
    measurements: tuple[str, ...] = ("numa",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        base = proc_path(root, "sys/devices/system/node")
        try:
            nodes = sorted(
                int(n[4:]) for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit()
            )
        except OSError:
            nodes = []
        if not nodes:
            raise SourceUnavailable(f"{base}: no NUMA node directories (kernel without NUMA)")
        self._nodes = [str(n) for n in nodes]
        self._stat = [ProcFile(base / f"node{n}" / "numastat", whole=True) for n in nodes]
        self._meminfo: list[ProcFile | None] = []
        for n in nodes:
            try:
                self._meminfo.append(ProcFile(base / f"node{n}" / "meminfo", whole=True))
            except SourceUnavailable:
                self._meminfo.append(None)

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> list[tuple[bytes, bytes | None]]:
        """The tick's reads; :meth:`parse` can run later (the agent batches it)."""
        return [(s.read(), m.read() if m else None) for s, m in zip(self._stat, self._meminfo, strict=True)]

    def parse(self, data: list[tuple[bytes, bytes | None]]) -> list[Reading]:
        fields: dict[str, list[Value]] = {n: [] for n in NUMA.field_index}
        for node, stat, mem, (stat_raw, mem_raw) in zip(
            self._nodes, self._stat, self._meminfo, data, strict=True
        ):
            got = wanted_counters(stat_raw, _WANTED, stat.path)
            for n in _STAT_FIELDS:
                fields[n].append(got.get(n))
            info = (
                parse_meminfo(mem_raw, mem.path, prefix=f"Node {node} ".encode())
                if mem and mem_raw is not None
                else {}
            )
            fields["mem_free"].append(info.get(b"MemFree"))
            fields["anon_huge_pages"].append(info.get(b"AnonHugePages"))
        return [Reading("numa", tags={"node": list(self._nodes)}, fields=fields)]

    def close(self) -> None:
        for f in self._stat:
            f.close()
        for m in self._meminfo:
            if m is not None:
                m.close()
