"""/proc/interrupts -> ``interrupts``: per IRQ line, counts reduced to NUMA nodes.

The file has one column per online CPU: hundreds of lines x hundreds of CPUs on a big
host, a third of the agent's read time. It is reduced at the source to one count per
(line, node), enough for IRQ locality (count on the device's node / count on all
nodes) at a fraction of the volume. The counts are parsed as a fixed-width digit
matrix with numpy, converting only the non-zero cells (see
:func:`ingest.collectors.procfs.fixed_width_counts`): about 1.5 ms per collect for 192
CPUs x 300 lines against about 5 ms when splitting and calling ``int()``; a split-based
parser takes over for any other layout. Samples of the lines parsed last are read
through the learnt cell grid, a whole batch at once (:class:`CountGrid`).
"""

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

_TRIGGERS = (b"edge", b"level", b"eoi", b"simple", b"none")


def irq_device(tail: bytes) -> str:
    """The action name(s) from the text after the counts of a numbered IRQ line.

    New kernels print ``chip hwirq-trigger actions`` ('PCI-MSIX-0000:00:03.0 1-edge
    virtio2-input.0'), old ones ``chip-trigger actions`` ('IR-PCI-MSI-edge eth0-TxRx-0'),
    ARM ``chip hwirq Level actions``. Several actions are joined by ', '."""
    parts = tail.split()
    start = None
    for i, t in enumerate(parts[:3]):
        if t.lower().endswith(_TRIGGERS):
            start = i + 1
            break
    if start is None:
        start = 2 if len(parts) >= 3 and parts[1].isdigit() else 1
    return b" ".join(parts[start:]).decode("utf-8", "replace")


class InterruptsCollector(LayoutCollector[bytes]):
    name = "interrupts"
    measurements: tuple[str, ...] = ("interrupts",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/interrupts"))
        self._table = NodeTable("interrupts", cpu_node_map(root))
        self._grid = CountGrid()
        self._devices: dict[bytes, str] = {}

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
        self._table.reducer.set_columns(cpus)
        parsed = self._parse_grid(data, lines, len(cpus))
        if parsed is None:
            self._grid = CountGrid()
            parsed = self._parse_split(lines, len(cpus))
        irqs, devices, values = parsed
        self._table.set_rows({"irq": irqs, "device": devices}, list(zip(irqs, devices, strict=True)))
        return [self._table.block(values[None])]

    def _device(self, label: bytes, tail: bytes) -> str:
        if not label.isdigit():
            return ""  # named lines (NMI, LOC ...): the text is a description
        dev = self._devices.get(tail)
        if dev is None:
            dev = self._devices[tail] = irq_device(tail)
        return dev

    def _parse_grid(
        self, data: bytes, lines: list[bytes], ncpu: int
    ) -> tuple[list[str], list[str], np.ndarray] | None:
        """The kernel's layout: ' %10u' per CPU after 'IRQ:'. None if the text differs.
        The layout is learnt (:class:`CountGrid`) for the next texts."""
        width = 11 * ncpu
        irqs: list[str] = []
        devices: list[str] = []
        regions: list[bytes] = []
        starts: list[int] = []
        pos = len(lines[0]) + 1
        for line in lines[1:]:
            here, pos = pos, pos + len(line) + 1
            colon = line.find(b":")
            if colon < 0:
                if line.strip():
                    return None
                continue
            end = colon + 1 + width
            if len(line) < end or (len(line) > end and line[end] != 32):
                # ERR:/MIS: hold one global count, not one per CPU: not attributable to a
                # node. Anything else this short means another layout.
                if len(line[colon + 1 :].split()) >= ncpu:
                    return None
                continue
            label = line[:colon].strip()
            irqs.append(label.decode())
            devices.append(self._device(label, line[end:]))
            regions.append(line[colon + 1 : end])
            starts.append(here + colon + 1)
        values = fixed_width_counts(regions, ncpu)
        if values is None:
            return None
        self._grid.learn(data, starts, ncpu)
        return irqs, devices, values

    def _parse_split(
        self, lines: list[bytes], ncpu: int
    ) -> tuple[list[str], list[str], np.ndarray]:
        """Any whitespace-separated layout (slower); names the line it cannot read."""
        path = self._file.path
        irqs: list[str] = []
        devices: list[str] = []
        rows: list[list[int]] = []
        for lineno, line in enumerate(lines[1:], start=2):
            label, sep, rest = line.partition(b":")
            if not sep:
                if line.strip():
                    raise parse_error(path, lineno, line, "no 'IRQ:' label")
                continue
            label = label.strip()
            parts = rest.split()
            try:
                row = [int(p) for p in parts[:ncpu]] if len(parts) >= ncpu else None
            except ValueError:
                row = None
            if row is None:
                if label.isdigit():
                    raise parse_error(
                        path, lineno, line, f"IRQ {label.decode()}: expected {ncpu} counts"
                    )
                continue  # ERR:, MIS: one global count
            irqs.append(label.decode())
            devices.append(self._device(label, b" ".join(parts[ncpu:])))
            rows.append(row)
        return irqs, devices, np.array(rows, dtype=np.int64).reshape(len(rows), ncpu)

    def close(self) -> None:
        self._file.close()
