"""Shared helpers of the /proc and /sys collectors.

Every collector takes ``root`` (the filesystem root: "/" on the live host, a recorded
tree in tests, like psutil's ``PROCFS_PATH``). Files read on every tick are opened once
and re-read with ``os.pread`` from offset 0: no open/close per tick, no Python file
object, no decoding (parsing works on ``bytes``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from ingest.collectors.base import (
    Block,
    CollectorError,
    Reading,
    SourceUnavailable,
    Value,
    merge_blocks,
    proc_path,
    readings,
)

log = logging.getLogger(__name__)

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


R = TypeVar("R")


def parse_runs(
    raws: list[R],
    learnt: Callable[[list[R]], list[Block] | None] | None,
    full: Callable[[R], list[Block]],
    errors: list[CollectorError] | None,
) -> list[Block]:
    """The one parse of a collector's samples (its ``parse(raws, errors)``).

    ``learnt(texts)`` reads samples laid out like the one it learnt last, all in one numpy
    pass, or declines (None, changing nothing) when one of them is laid out otherwise;
    ``full(raw)`` parses any single sample, names a bad line, and learns that sample's
    layout. A declined batch is halved until the sample where the layout changed (a line
    came or went, nothing learnt yet) stands alone: it goes through ``full``, and the
    samples after it through the layout just learnt. A sample that ``full`` cannot parse is
    left out, its error appended to ``errors`` (raised when ``errors`` is None). Blocks
    carry their first sample's index (``at``) and are merged where they follow each other.

    ``learnt`` changes nothing when it declines or raises: a CollectorError (a bad value
    outside the learnt digits) is a decline, and so is any other exception, logged, after
    which this call parses its remaining samples in full (a fault of the learnt layout
    must not lose samples)."""
    out: list[Block] = []
    broken = learnt is None

    def try_learnt(lo: int, hi: int) -> list[Block] | None:
        nonlocal broken
        if broken:
            return None
        try:
            return learnt(raws[lo:hi])  # type: ignore[misc]
        except CollectorError:
            return None
        except Exception:
            log.exception("reading samples through their learnt layout failed; parsing them in full")
            broken = True
            return None

    def one(i: int) -> None:
        try:
            got = full(raws[i])
        except CollectorError as e:
            if errors is None:
                raise
            errors.append(e)
            return
        for b in got:
            b.at = i
        out.extend(got)

    def run(lo: int, hi: int) -> None:
        got = try_learnt(lo, hi)
        if got is not None:
            for b in got:
                b.at = lo
            out.extend(got)
        elif hi - lo == 1:
            one(lo)
        elif broken:
            for i in range(lo, hi):
                one(i)
        else:
            mid = (lo + hi) // 2
            run(lo, mid)
            run(mid, hi)

    if raws:
        run(0, len(raws))
    return merge_blocks(out)


class LayoutCollector(Generic[R]):
    """Base of the collectors that learn their files' layout: ``sample()`` (the tick's
    reads) returns an ``R``; ``parse(raws, errors)`` is :func:`parse_runs` over the
    subclass's ``_parse_learnt`` (samples through the learnt layout, or None) and
    ``_parse_full`` (any one sample, learning its layout); ``collect()`` parses one."""

    learns_layout = True  # the agent parses one sample at start

    def sample(self) -> R:
        raise NotImplementedError

    def _parse_learnt(self, raws: list[R]) -> list[Block] | None:
        raise NotImplementedError

    def _parse_full(self, raw: R) -> list[Block]:
        raise NotImplementedError

    def collect(self) -> list[Reading]:
        return readings(self.parse([self.sample()]))

    def parse(self, raws: list[R], errors: list[CollectorError] | None = None) -> list[Block]:
        return parse_runs(raws, self._parse_learnt, self._parse_full, errors)


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


_DIGITS_SPACE = b"0123456789 "
#: translate table: digits stay, every other byte becomes a space
_DIGITS_ONLY = bytes(b if 48 <= b <= 57 else 32 for b in range(256))


def digit_runs(text: bytes) -> int:
    """How many runs of decimal digits ``text`` holds."""
    return len(text.translate(_DIGITS_ONLY).split())


class DigitTable:
    """A batch of texts that equal a learnt one but for their digits (a /proc file
    between two reads) holds its numbers at the same places: every run of digits of the
    whole batch is converted by numpy in one call, as a texts x runs table, and each
    field is picked from its runs.

    :meth:`learn` takes, from one text that the collector's own parser read, where each
    field's values lie among the runs (:func:`line_runs` helps) and which runs belong to
    names ('cpu12', 'eth0', 'pgalloc_dma32', a disk's major and minor): those must keep
    their values. It checks the picks against that parse (``expected``) and otherwise
    declines every batch of that layout. :meth:`values` declines (None) a batch in which a
    text differs from the learnt one other than in its values, and sets ``relearn``: the
    collector's full parser reads the text where the layout changed and learns from it
    (:func:`parse_runs`).

    Spaces do not count in the comparison: padded values ('MemFree:  812340 kB', the
    kernel's %8lu) shift when a value gains a digit. The count of runs per text must
    match too, so a value split in two or merged is still caught."""

    __slots__ = ("_template", "runs", "_labels", "_label_values", "_picks", "_gather", "_factors",
                 "_single", "_multi", "relearn")

    def __init__(self) -> None:
        self._template = b""  # the learnt text without its digits and spaces
        self.runs = -1  # digit runs per text; -1: nothing usable learnt, batches declined
        self._labels = np.zeros(0, dtype=np.intp)
        self._label_values = np.zeros(0, dtype=np.uint64)
        self._picks: dict[str, np.ndarray] = {}
        # every pick gathered in one take: fields of one value per text first (one column
        # each), then the others (a slice each), a factor per column when some are scaled
        self._gather = np.zeros(0, dtype=np.intp)
        self._factors: np.ndarray | None = None
        self._single: list[str] = []
        self._multi: list[tuple[str, int, int]] = []
        self.relearn = True  # learn at the next full parse

    def learn(
        self,
        text: bytes,
        picks: dict[str, list[int]],
        *,
        labels: list[int] | tuple[int, ...] = (),
        scale: dict[str, int] | None = None,
        expected: dict[str, list[Value]] | None = None,
    ) -> bool:
        """Learn ``text``'s layout: ``picks`` field -> its runs (one per row), ``labels``
        the runs of names, ``scale`` a factor per field (kB -> bytes). True when batches
        can be read (the picks give ``expected``, the parser's values of ``text``)."""
        self.relearn = False
        self._template = text.translate(None, _DIGITS_SPACE)
        self.runs = digit_runs(text)
        self._labels = np.asarray(labels, dtype=np.intp)
        self._picks = {f: np.asarray(ix, dtype=np.intp) for f, ix in picks.items()}
        self._single = [f for f, ix in self._picks.items() if ix.size == 1]
        order = self._single + [f for f, ix in self._picks.items() if ix.size != 1]
        self._gather = np.concatenate([self._picks[f] for f in order]) if order else np.zeros(0, dtype=np.intp)
        self._multi, at = [], len(self._single)
        for f in order[at:]:
            self._multi.append((f, at, at + self._picks[f].size))
            at += self._picks[f].size
        k = scale or {}
        factors = np.concatenate([np.full(self._picks[f].size, k.get(f, 1), dtype=np.uint64) for f in order]) \
            if order else np.zeros(0, dtype=np.uint64)
        self._factors = factors if (factors != 1).any() else None
        if any(ix.size and (ix.min() < 0 or ix.max() >= self.runs) for ix in self._picks.values()) or (
            self._labels.size and (self._labels.min() < 0 or self._labels.max() >= self.runs)
        ):
            self.disable()
            return False
        self._label_values = np.zeros(0, dtype=np.uint64)
        nums = self._numbers([text])
        if nums is None:
            self.disable()
            return False
        self._label_values = nums[0, self._labels]
        if expected is not None:
            got = self.values([text])
            if got is None or any(got.get(f) != list(v) for f, v in expected.items()):
                self.disable()  # e.g. a negative value: its digit run does not say it
                return False
        return True

    def disable(self, text: bytes | None = None) -> None:
        """Decline every batch: ``text``'s layout (the one just learnt when None) is one
        this table cannot read. A text laid out otherwise sets ``relearn`` again."""
        if text is not None:
            self._template = text.translate(None, _DIGITS_SPACE)
        self.runs = -1
        self.relearn = False

    def values(self, texts: list[bytes]) -> dict[str, list[Value]] | None:
        """Field -> its values, text after text (rows in pick order within a text);
        None when a text is not laid out as the learnt one."""
        nums = self._numbers(texts)
        if nums is None:
            self.relearn = self.relearn or self.runs >= 0 or (
                bool(texts) and b"\n".join(texts).translate(None, _DIGITS_SPACE)
                != b"\n".join([self._template] * len(texts)))
            return None
        picked = nums[:, self._gather]
        if self._factors is not None:
            picked = picked * self._factors
        got: dict[str, list[Value]] = dict(zip(self._single, picked[:, : len(self._single)].T.tolist(), strict=True))
        for f, a, b in self._multi:
            got[f] = picked[:, a:b].ravel().tolist()
        return {f: got[f] for f in self._picks}

    def _numbers(self, texts: list[bytes]) -> np.ndarray | None:
        n = len(texts)
        if self.runs < 0 or not n:
            return None
        joined = b"\n".join(texts)  # a newline between texts: runs of two texts never merge
        if joined.translate(None, _DIGITS_SPACE) != b"\n".join([self._template] * n):
            return None
        nums = np.fromstring(joined.translate(_DIGITS_ONLY), dtype=np.uint64, sep=" ")
        if nums.size != n * self.runs:
            return None
        table = nums.reshape(n, self.runs)
        if self._label_values.size and not (table[:, self._labels] == self._label_values).all():
            return None
        return table


def learn_rows(
    table: DigitTable,
    data: bytes,
    row_of: Callable[[bytes], tuple[int, bool] | None],
    columns: dict[str, int],
    expected: dict[str, list[Value]],
) -> None:
    """Teach ``table`` a file of one row per line ('eth0: v0 v1 ...', '8 0 sda v0 ...'):
    ``row_of(line)`` gives how many digit runs the line's name holds (they must keep
    their values) and whether the row is reported, or None for a line that is no row;
    ``columns`` maps each field to its value's place after the name."""
    starts = line_runs(data)
    labels: list[int] = []
    first: list[int] = []  # each reported row's first value run
    for i, line in enumerate(data.split(b"\n")):
        row = row_of(line)
        if row is None:
            continue
        name_runs, reported = row
        labels.extend(range(starts[i], starts[i] + name_runs))
        if reported:
            first.append(starts[i] + name_runs)
    picks = {f: [b + j for b in first] for f, j in columns.items()}
    table.learn(data, picks, labels=labels, expected=expected)


def line_runs(text: bytes) -> list[int]:
    """The index (in :class:`DigitTable` order) of the first digit run of each line of
    ``text`` (lines split at newlines), and, last, the total."""
    starts = [0]
    for line in text.split(b"\n"):
        starts.append(starts[-1] + digit_runs(line))
    return starts


class LineLayout:
    """Where the wanted values of a 'key<sep>value' file (/proc/vmstat, meminfo,
    numastat) lie among its digit runs, for a :class:`DigitTable`: a value is the last run
    of its line, digits in keys are names, ' kB' values are scaled to bytes. Learnt from a
    text that the collector's full parser read (:meth:`learn`, its values check the
    picks); :meth:`block` reads a batch of texts laid out alike."""

    __slots__ = ("_digits",)

    def __init__(self) -> None:
        self._digits = DigitTable()

    @property
    def relearn(self) -> bool:
        """A batch was declined since :meth:`learn` (or nothing is learnt yet)."""
        return self._digits.relearn

    def learn(self, data: bytes, sep: bytes, wanted: dict[bytes, str], expected: dict[str, int],
              strip: bytes = b"") -> None:
        """Learn the places of the ``wanted`` keys (file key -> field) in ``data``, whose
        lines are 'key<sep>value' and whose values the full parser read as ``expected``;
        ``strip`` is a prefix of every key ('Node 0 ')."""
        slots: dict[str, tuple[int, bool]] = {}
        labels: list[int] = []
        starts = line_runs(data)
        for i, line in enumerate(data.split(b"\n")):
            key, found, rest = line.partition(sep)
            if not found:
                continue
            labels.extend(range(starts[i], starts[i] + digit_runs(key)))
            if strip and key.startswith(strip):
                key = key[len(strip) :]
            name = wanted.get(key.strip())
            if name is not None and name in expected:  # a repeated key: the last one counts
                slots[name] = (i, rest.endswith(b" kB"))
        self._digits.learn(
            data,
            {name: [starts[i + 1] - 1] for name, (i, _) in slots.items()},  # the line's last run
            labels=labels,
            scale={name: 1024 for name, (_, kb) in slots.items() if kb},
            expected={k: [v] for k, v in expected.items()},
        )

    def values(self, texts: list[bytes]) -> dict[str, list[Value]] | None:
        """Field -> one value per text, when every text is the learnt one but for its
        values; None otherwise (:meth:`DigitTable.values`)."""
        return self._digits.values(texts)

    def block(self, measurement: str, fields: Iterable[str], texts: list[bytes]) -> list[Block] | None:
        """:meth:`values` as the one-row-per-text block of ``measurement`` (the ``fields``
        the file lacks are null); None when a text is laid out otherwise."""
        got = self.values(texts)
        if got is None:
            return None
        none: list[Value] = [None] * len(texts)
        return [Block(measurement, len(texts), fields={f: got.get(f) or none for f in fields})]


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
        """``values`` (consecutive samples x rows x columns, int64, raw 32-bit counts) ->
        samples x rows x nodes sums."""
        prev, carry = self._prev, self._carry
        if prev is None or carry is None or keys != self._keys:
            prev, carry = self._realign(keys, values[0])
        before = np.concatenate((prev[None], values[:-1]))
        dec = values < before
        if dec.any():
            wrap = dec & (((values - before) % _W32) < (1 << 31))
            reset = dec & ~wrap
            adjust = np.where(wrap, _W32, 0) + np.where(reset, before, 0)
            carries = carry + np.cumsum(adjust, axis=0)
            self.resets += int(reset.sum())
        else:
            carries = np.broadcast_to(carry, values.shape)
        self._keys, self._prev, self._carry = keys, values[-1].copy(), carries[-1].copy()
        total: np.ndarray = (values + carries) @ self._onehot
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
    become a digit matrix and one product with powers of ten (see :func:`_cell_counts`).
    Returns None when the text does not have that exact layout (the caller falls back to
    splitting)."""
    n = len(regions)
    if not n:
        return np.zeros((0, ncols), dtype=np.int64)
    buf = np.frombuffer(b"".join(regions), dtype=np.uint8)
    if buf.size != n * ncols * 11:
        return None
    cells = buf.reshape(-1, 11)
    if (cells[:, 0] != 32).any():  # every cell starts with its separating space
        return None
    out = _cell_counts(cells[:, 1:])
    return None if out is None else out.reshape(n, ncols)


def _cell_counts(cells: np.ndarray) -> np.ndarray | None:
    """(cells x 10) bytes of right-aligned decimal numbers -> int64 per cell; None if a
    byte is neither a digit nor a leading space. Most cells of a real /proc/interrupts
    are zero ('         0'): only the others are converted (about 6x faster on a
    192-CPU host)."""
    out = np.zeros(cells.shape[0], dtype=np.int64)
    nz = np.flatnonzero((cells[:, 9] != 48) | (cells[:, 8] != 32))
    if nz.size:
        sub = cells[nz]
        digits = sub - np.uint8(48)  # '0'..'9' -> 0..9; ' ' wraps to 240
        nondigit = digits > 9
        if (nondigit & (sub != 32)).any():
            return None
        digits[nondigit] = 0
        out[nz] = digits.astype(np.int64) @ _POW10
    return out


class CountGrid:
    """Where the ' %10u' cells of a per-CPU table (/proc/interrupts, /proc/softirqs) lie
    in its text, so that the next text of the same layout is read by gathering them.

    Cells are fixed-width, so the text keeps its length and every byte outside the
    digits (labels, devices, separators) until an IRQ line comes, goes or changes its
    actions. :meth:`counts` checks exactly that (same length, same bytes outside the
    digits) and converts the digits with numpy: no line splitting, no per-line Python.
    Anything else gives None, and the caller parses in full and calls :meth:`learn`."""

    __slots__ = ("_size", "_keep", "_template", "_digits", "_shape")

    def __init__(self) -> None:
        self._size = -1
        self._keep = np.zeros(0, dtype=np.intp)
        self._template = np.zeros(0, dtype=np.uint8)
        self._digits = np.zeros((0, 10), dtype=np.intp)
        self._shape = (0, 0)

    def learn(self, data: bytes, row_starts: list[int], ncols: int) -> None:
        """``row_starts``: the offset in ``data`` of each parsed row's first cell."""
        buf = np.frombuffer(data, dtype=np.uint8)
        first = np.asarray(row_starts, dtype=np.intp)[:, None] + 11 * np.arange(ncols, dtype=np.intp)
        self._digits = first.reshape(-1, 1) + np.arange(1, 11, dtype=np.intp)
        keep = np.ones(buf.size, dtype=bool)
        keep[self._digits.ravel()] = False
        self._keep = np.flatnonzero(keep)
        self._template = buf[self._keep]
        self._size = buf.size
        self._shape = (len(row_starts), ncols)

    def counts_many(self, texts: list[bytes]) -> np.ndarray | None:
        """Samples x rows x columns counts when every text has the learnt layout, else
        None: one numpy pass over the whole batch."""
        size = self._size
        if size < 0 or any(len(t) != size for t in texts):
            return None
        buf = np.frombuffer(b"".join(texts), dtype=np.uint8).reshape(len(texts), size)
        if not (buf[:, self._keep] == self._template).all():
            return None
        out = _cell_counts(buf[:, self._digits].reshape(-1, 10))
        return None if out is None else out.reshape(len(texts), *self._shape)


_POW10 = 10 ** np.arange(9, -1, -1, dtype=np.int64)


class NodeTable:
    """Rows of per-CPU counts (IRQ lines, softirq types) as per-node ``count`` rows: each
    row's tags repeated once per node, plus the ``node`` tag. The tags are built when the
    rows change (:meth:`set_rows`), not at every reading; readings share them (read-only)."""

    def __init__(self, measurement: str, cpu_node: dict[int, str]) -> None:
        self.measurement = measurement
        self.reducer = NodeReducer(cpu_node)
        self._keys: list[object] = []
        self._tags: dict[str, list[str]] = {}

    def set_rows(self, row_tags: dict[str, list[str]], keys: list[object]) -> None:
        """The rows' tags and identities (after :meth:`NodeReducer.set_columns`)."""
        nodes = self.reducer.nodes
        nn = len(nodes)
        tags = {name: [v for v in col for _ in range(nn)] for name, col in row_tags.items()}
        tags["node"] = nodes * len(keys)
        self._keys, self._tags = keys, tags

    def block(self, values: np.ndarray) -> Block:
        """``values``: samples x rows x CPU columns, consecutive samples of the rows last set."""
        sums = self.reducer.reduce(self._keys, values)
        counts: list[Value] = sums.ravel().tolist()
        return Block(self.measurement, values.shape[0], tags=self._tags, fields={"count": counts})
