"""/proc/diskstats -> ``disk`` (whole disks only).

A whole disk is a name under /sys/block (partitions are not); loop, ram and zram
devices are memory or file backed and skipped. Device-mapper and md devices are kept:
their stalls are the storage stalls the workload sees."""

from __future__ import annotations

import os
from pathlib import Path

from ingest.collectors.base import Block, Value, proc_path
from ingest.collectors.procfs import (
    DigitTable,
    LayoutCollector,
    ProcFile,
    digit_runs,
    learn_rows,
    parse_error,
)
from ingest.schema import Tier

#: lake field -> column of /proc/diskstats after major, minor, name
_COLS: dict[str, int] = {
    "reads": 0,
    "read_sectors": 2,
    "read_time": 3,
    "writes": 4,
    "write_sectors": 6,
    "write_time": 7,
    "io_time": 9,
    "weighted_io_time": 10,
}
_IN_FLIGHT = 8
SKIP_PREFIXES: tuple[str, ...] = ("loop", "ram", "zram")


class DiskCollector(LayoutCollector[bytes]):
    name = "disk"
    measurements: tuple[str, ...] = ("disk",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/diskstats"))
        self._block = proc_path(root, "sys/block")
        self._whole: dict[bytes, bool] = {}
        self._digits = DigitTable()  # batches, learnt from a full parse
        self._names: list[str] = []  # the disks of the learnt layout

    def _is_whole(self, name: bytes) -> bool:
        known = self._whole.get(name)
        if known is None:
            text = name.decode()
            # 'cciss/c0d0' is 'cciss!c0d0' under /sys/block
            known = not text.startswith(SKIP_PREFIXES) and os.path.exists(
                self._block / text.replace("/", "!")
            )
            self._whole[name] = known
        return known

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_full(self, data: bytes) -> list[Block]:
        path = self._file.path
        names: list[str] = []
        fields: dict[str, list[Value]] = {f: [] for f in _COLS}
        in_flight: list[Value] = []
        cols = list(_COLS.items())
        for lineno, line in enumerate(data.split(b"\n"), start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) < 14:
                raise parse_error(
                    path, lineno, line, f"expected at least 14 columns, got {len(parts)}"
                )
            if not self._is_whole(parts[2]):
                continue
            vals = parts[3:]
            try:
                for f, j in cols:
                    fields[f].append(int(vals[j]))
                in_flight.append(float(vals[_IN_FLIGHT]))
            except ValueError:
                raise parse_error(path, lineno, line, "not a number") from None
            names.append(parts[2].decode())
        fields["in_flight"] = in_flight
        if self._digits.relearn:
            self._learn(data, names, fields)
        return [Block("disk", 1, tags={"device": names}, fields=fields)]

    def _learn(self, data: bytes, names: list[str], fields: dict[str, list[Value]]) -> None:
        def row_of(line: bytes) -> tuple[int, bool] | None:
            parts = line.split(None, 3)
            if len(parts) < 4:
                return None
            return 2 + digit_runs(parts[2]), self._is_whole(parts[2])  # major, minor, the name's digits

        self._names = names
        learn_rows(self._digits, data, row_of, {**_COLS, "in_flight": _IN_FLIGHT}, fields)

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        """Samples laid out like the learnt one (same disks), in one numpy pass."""
        got = self._digits.values(raws)
        if got is None:
            return None
        got["in_flight"] = [float(v) for v in got["in_flight"]]  # type: ignore[arg-type]
        return [Block("disk", len(raws), tags={"device": self._names}, fields=got)]

    def close(self) -> None:
        self._file.close()
