"""/sys/devices/system/node/node*/{numastat,meminfo} -> ``numa`` (one row per node).

A kernel built without NUMA has no node directory: SourceUnavailable."""

from __future__ import annotations

import os
from pathlib import Path

from ingest.collectors.base import (
    Block,
    SourceUnavailable,
    Value,
    proc_path,
)
from ingest.collectors.memory import parse_meminfo
from ingest.collectors.procfs import (
    LayoutCollector,
    LineLayout,
    ProcFile,
    wanted_counters,
)
from ingest.schema import NUMA, Tier

_STAT_FIELDS: tuple[str, ...] = NUMA.counters
_WANTED: dict[bytes, str] = {n.encode(): n for n in _STAT_FIELDS}
_MEM_WANTED: dict[bytes, str] = {b"MemFree": "mem_free", b"AnonHugePages": "anon_huge_pages"}


class NumaCollector(LayoutCollector[list[tuple[bytes, bytes | None]]]):
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
        self._stat_layout = [LineLayout() for _ in nodes]
        self._mem_layout = [LineLayout() for _ in nodes]
        for n in nodes:
            try:
                self._meminfo.append(ProcFile(base / f"node{n}" / "meminfo", whole=True))
            except SourceUnavailable:
                self._meminfo.append(None)

    def sample(self) -> list[tuple[bytes, bytes | None]]:
        """The tick's reads; :meth:`parse` can run later (the agent batches it)."""
        return [(s.read(), m.read() if m else None) for s, m in zip(self._stat, self._meminfo, strict=True)]

    def _parse_learnt(self, raws: list[list[tuple[bytes, bytes | None]]]) -> list[Block] | None:
        n = len(raws)
        none: list[Value] = [None] * n
        per_node: list[dict[str, list[Value]]] = []
        for j, (stat_layout, mem_layout, mem) in enumerate(
            zip(self._stat_layout, self._mem_layout, self._meminfo, strict=True)
        ):
            stat = stat_layout.values([r[j][0] for r in raws])
            if stat is None:
                return None
            cols: dict[str, list[Value]] = {f: stat.get(f) or none for f in _STAT_FIELDS}
            cols["mem_free"] = cols["anon_huge_pages"] = none
            if mem is not None:
                texts = [r[j][1] for r in raws]
                info = mem_layout.values(texts) if None not in texts else None  # type: ignore[arg-type]
                if info is None:
                    return None
                cols["mem_free"] = info.get("mem_free") or none
                cols["anon_huge_pages"] = info.get("anon_huge_pages") or none
            per_node.append(cols)
        # rows: tick after tick, the nodes in order within a tick
        fields = {f: [v for t in range(n) for v in (c[f][t] for c in per_node)] for f in NUMA.field_index}
        return [Block("numa", n, tags={"node": self._nodes}, fields=fields)]

    def _parse_full(self, data: list[tuple[bytes, bytes | None]]) -> list[Block]:
        fields: dict[str, list[Value]] = {n: [] for n in NUMA.field_index}
        for node, stat, mem, (stat_raw, mem_raw), stat_layout, mem_layout in zip(
            self._nodes, self._stat, self._meminfo, data, self._stat_layout, self._mem_layout,
            strict=True,
        ):
            got = wanted_counters(stat_raw, _WANTED, stat.path)
            if stat_layout.relearn:
                stat_layout.learn(stat_raw, b" ", _WANTED, got)
            for n in _STAT_FIELDS:
                fields[n].append(got.get(n))
            info: dict[str, int] = {}
            if mem and mem_raw is not None:
                prefix = f"Node {node} ".encode()
                full = parse_meminfo(mem_raw, mem.path, prefix=prefix)
                info = {f: full[k] for k, f in _MEM_WANTED.items() if k in full}
                if mem_layout.relearn:
                    mem_layout.learn(mem_raw, b":", _MEM_WANTED, info, strip=prefix)
            fields["mem_free"].append(info.get("mem_free"))
            fields["anon_huge_pages"].append(info.get("anon_huge_pages"))
        return [Block("numa", 1, tags={"node": self._nodes}, fields=fields)]

    def close(self) -> None:
        for f in self._stat:
            f.close()
        for m in self._meminfo:
            if m is not None:
                m.close()
