"""Shared helpers of the /proc and /sys collectors.

Every collector takes ``root`` (the filesystem root: "/" on the live host, a recorded
tree in tests, like psutil's ``PROCFS_PATH``). Files read on every tick are opened once
and re-read with ``os.pread`` from offset 0: no open/close per tick, no Python file
object, no decoding (parsing works on ``bytes``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ingest.collectors.base import CollectorError, Reading, SourceUnavailable, Value, proc_path

#: read size; ``whole`` files double it when a file does not fit
_CHUNK = 65536


class ProcFile:
    """A /proc or /sys file kept open and re-read from the start on each :meth:`read`.

    ``whole=True``: the kernel makes the file in one piece (sysfs attributes, and /proc
    files built with single_open: stat, loadavg, meminfo, pressure/*, softirqs,
    net/snmp): a read shorter than the buffer is all of it, so one pread per tick.
    ``whole=False`` (iterator seq_files: interrupts, vmstat, diskstats, net/dev): the
    kernel hands out about a page per read: read on until a read returns nothing. A
    pread at offset 0 resets the kernel's iterator cheaply; one that continues where
    the previous stopped does not regenerate the file."""

    __slots__ = ("path", "_fd", "_size", "_whole")

    def __init__(self, path: str | Path, *, whole: bool = False, size: int = _CHUNK) -> None:
        self.path = str(path)
        self._whole = whole
        self._size = size
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SourceUnavailable(f"{self.path} does not exist") from None
        except OSError as e:
            raise CollectorError(f"cannot open {self.path}: {e}") from e

    def read(self) -> bytes:
        fd = self._fd
        if fd is None:
            raise CollectorError(f"{self.path} is closed")
        try:
            data = os.pread(fd, self._size, 0)
            if self._whole:
                while len(data) == self._size:  # did not fit: a bigger buffer, again
                    self._size *= 2
                    data = os.pread(fd, self._size, 0)
                return data
            if not data:
                return data
            parts = [data]
            off = len(data)
            while True:
                more = os.pread(fd, self._size, off)
                if not more:
                    break
                parts.append(more)
                off += len(more)
        except OSError as e:
            raise CollectorError(f"cannot read {self.path}: {e}") from e
        if len(parts) > 1:
            data = b"".join(parts)
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a dropped collector must not leak fds
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)  # type: ignore[arg-type]
            except OSError:
                pass


def read_text(path: str | Path) -> str | None:
    """Content of a small file, stripped; None when it does not exist or cannot be read
    (sysfs attributes that the driver does not support return EINVAL)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def parse_cpulist(text: str, *, where: str = "cpulist") -> list[int]:
    """'0-47,96-143' -> [0, 1, ..., 47, 96, ..., 143]; '' -> []."""
    cpus: list[int] = []
    text = text.strip()
    if not text:
        return cpus
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                cpus.extend(range(int(lo), int(hi) + 1))
            else:
                cpus.append(int(lo))
        except ValueError:
            raise CollectorError(f"{where}: bad cpu list {text!r}") from None
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the kernel's cpulist format)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [c]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def numa_nodes(root: str | Path) -> dict[int, list[int]]:
    """NUMA node -> its CPUs, from /sys/devices/system/node/node*/cpulist.

    A kernel without NUMA support has no node directory: everything is node 0
    (returned as {0: []}, meaning "all CPUs")."""
    base = proc_path(root, "sys/devices/system/node")
    nodes: dict[int, list[int]] = {}
    try:
        entries = os.listdir(base)
    except OSError:
        return {0: []}
    for name in entries:
        if not name.startswith("node") or not name[4:].isdigit():
            continue
        path = base / name / "cpulist"
        text = read_text(path)
        if text is None:
            continue
        nodes[int(name[4:])] = parse_cpulist(text, where=str(path))
    return dict(sorted(nodes.items())) or {0: []}


def cpu_node_map(root: str | Path) -> dict[int, str]:
    """CPU number -> node tag ('0', '1' ...). CPUs absent from every cpulist map to '0'
    through :func:`node_of`."""
    out: dict[int, str] = {}
    for node, cpus in numa_nodes(root).items():
        for c in cpus:
            out[c] = str(node)
    return out


def node_of(mapping: dict[int, str], cpu: int) -> str:
    return mapping.get(cpu, "0")


def bracketed(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise' (the selected mode of a sysfs knob)."""
    if text is None:
        return None
    start = text.find("[")
    end = text.find("]", start + 1)
    if start < 0 or end < 0:
        return text.strip() or None
    return text[start + 1 : end]


def key_values(data: bytes) -> dict[bytes, bytes] | None:
    """'key value' lines (/proc/vmstat, numastat) -> {key: value} in one C-level pass;
    None when the text is not strictly pairs (the caller parses line by line then)."""
    toks = data.split()
    if len(toks) % 2 or data.count(b"\n") + (not data.endswith(b"\n")) != len(toks) // 2:
        return None
    return dict(zip(toks[0::2], toks[1::2], strict=True))


def wanted_counters(data: bytes, wanted: dict[bytes, str], path: str) -> dict[str, int]:
    """The ``wanted`` keys (file key -> field name) of a 'key value' file (vmstat,
    numastat) as ints; absent keys are left out. :func:`key_values` in C first; text that is
    not strictly pairs, or holds a bad number, goes line by line, which names the line."""
    pairs = key_values(data)
    if pairs is not None:
        try:
            return {n: int(pairs[k]) for k, n in wanted.items() if k in pairs}
        except ValueError:
            pass
    got: dict[str, int] = {}
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        key, _, val = line.partition(b" ")
        name = wanted.get(key)
        if name is None:
            continue
        try:
            got[name] = int(val)
        except ValueError:
            raise parse_error(path, lineno, line, "not a number") from None
    return got


def parse_error(path: str, lineno: int, line: bytes | str, why: str) -> CollectorError:
    """A parse failure naming the file and the (1-based) line."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    return CollectorError(f"{path}:{lineno}: {why}: {line[:120]!r}")


_W32 = 1 << 32


class NodeReducer:
    """Reduces a table of per-CPU counters (rows x CPU columns) to per-NUMA-node sums.

    The kernel keeps interrupt and softirq counts per CPU as 32-bit integers, which wrap
    within hours on a busy NIC queue, while a node's sum over dozens of CPUs passes 2**32
    anyway: a wrap of one CPU's counter cannot be recognised from the node sum. So the
    wrap is corrected here, per CPU, before summing: the sums handed out are monotonic
    64-bit totals. A per-CPU decrease that is not a plausible 32-bit wrap (modular
    delta >= 2**31) is a reset of that CPU's counter: it counts from zero again, so its
    new value is its increase (summing first would turn it into a drop of the node sum
    that the tracker could only read as a reset of the whole sum, over-counting the
    other CPUs). ``resets`` counts them. A change of the CPU columns (hotplug) restarts
    the sums: the tracker then sees a reset."""

    def __init__(self, cpu_node: dict[int, str]) -> None:
        self._cpu_node = cpu_node
        self.nodes: list[str] = sorted({*cpu_node.values()} or {"0"}, key=_node_key)
        self._cols: tuple[int, ...] = ()
        self._onehot = np.zeros((0, len(self.nodes)), dtype=np.int64)
        self._keys: list[object] = []
        self._prev: np.ndarray | None = None
        self._carry: np.ndarray | None = None
        self.resets = 0

    def set_columns(self, cpus: tuple[int, ...]) -> None:
        """The CPU of each column (from the file's header); resets state if it changed."""
        if cpus == self._cols:
            return
        for c in cpus:
            if c not in self._cpu_node and "0" not in self.nodes:
                self.nodes.append("0")
        index = {n: k for k, n in enumerate(self.nodes)}
        onehot = np.zeros((len(cpus), len(self.nodes)), dtype=np.int64)
        for j, c in enumerate(cpus):
            onehot[j, index[self._cpu_node.get(c, "0")]] = 1
        self._cols, self._onehot = cpus, onehot
        self._keys, self._prev, self._carry = [], None, None

    def reduce(self, keys: list[object], values: np.ndarray) -> np.ndarray:
        """``values`` (rows x columns, int64, raw 32-bit counts) -> rows x nodes sums."""
        prev, carry = self._prev, self._carry
        if prev is None or carry is None or keys != self._keys:
            prev, carry = self._realign(keys, values)
        dec = values < prev
        if dec.any():
            wrap = dec & (((values - prev) % _W32) < (1 << 31))
            # a wrap adds 2**32; a reset (IRQ freed and requested again) counts from zero:
            # the old value joins the carry so that the node sum never decreases
            carry = carry + np.where(wrap, _W32, 0) + np.where(dec & ~wrap, prev, 0)
            self.resets += int((dec & ~wrap).sum())
        self._keys, self._prev, self._carry = keys, values, carry
        total: np.ndarray = (values + carry) @ self._onehot
        return total

    def _realign(self, keys: list[object], values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # rows appeared or vanished (IRQ requested/freed): keep the state of known rows
        prev = values.copy()
        carry = np.zeros_like(values)
        if self._prev is not None and self._carry is not None:
            old = {k: i for i, k in enumerate(self._keys)}
            for i, k in enumerate(keys):
                j = old.get(k)
                if j is not None:
                    prev[i] = self._prev[j]
                    carry[i] = self._carry[j]
        return prev, carry


def _node_key(n: str) -> tuple[int, str]:
    return (int(n), n) if n.isdigit() else (1 << 30, n)


def parse_cpu_header(line: bytes, path: str) -> tuple[int, ...]:
    """'           CPU0       CPU1 ...' -> (0, 1, ...)."""
    try:
        return tuple(int(t[3:]) for t in line.split())
    except ValueError:
        raise parse_error(path, 1, line, "expected a CPU header") from None


def fixed_width_counts(regions: list[bytes], ncols: int) -> np.ndarray | None:
    """Parse rows of ``ncols`` cells printed as ' %10u' (the kernel's format for per-CPU
    counts in /proc/interrupts and /proc/softirqs) without splitting strings: the bytes
    become a digit matrix and one product with powers of ten. Most cells of a real
    /proc/interrupts are zero ('         0'): only the others are converted (about 6x
    faster on a 192-CPU host). Returns None when the text does not have that exact
    layout (the caller falls back to splitting)."""
    n = len(regions)
    if not n:
        return np.zeros((0, ncols), dtype=np.int64)
    buf = np.frombuffer(b"".join(regions), dtype=np.uint8)
    if buf.size != n * ncols * 11:
        return None
    cells = buf.reshape(-1, 11)
    if (cells[:, 0] != 32).any():  # every cell starts with its separating space
        return None
    out = np.zeros(cells.shape[0], dtype=np.int64)
    nz = np.flatnonzero((cells[:, 10] != 48) | (cells[:, 9] != 32))
    if nz.size:
        sub = cells[nz, 1:]
        digits = sub - np.uint8(48)  # '0'..'9' -> 0..9; ' ' wraps to 240
        nondigit = digits > 9
        if (nondigit & (sub != 32)).any():
            return None
        digits[nondigit] = 0
        out[nz] = digits.astype(np.int64) @ _POW10
    return out.reshape(n, ncols)


_POW10 = 10 ** np.arange(9, -1, -1, dtype=np.int64)


def node_reading(measurement: str, reducer: NodeReducer, row_tags: dict[str, list[str]],
                 keys: list[object], values: np.ndarray) -> Reading:
    """Reduce per-CPU ``values`` (one row per key) to per-node ``count`` rows: each row's
    tags repeated once per node, plus the ``node`` tag."""
    sums = reducer.reduce(keys, values)
    nodes = reducer.nodes
    nn = len(nodes)
    tags = {name: [v for v in col for _ in range(nn)] for name, col in row_tags.items()}
    tags["node"] = nodes * len(keys)
    counts: list[Value] = sums.ravel().tolist()
    return Reading(measurement, tags=tags, fields={"count": counts})
