"""/proc/stat, /proc/loadavg, cpufreq -> ``cpu`` (per CPU) and ``system`` (host-wide).

Fast tier (every 100 ms by default): the files stay open and are re-read with one
pread; parsing splits bytes, no regex, no decoding of numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ingest.collectors.base import (
    Block,
    CollectorError,
    SourceUnavailable,
    Value,
    proc_path,
)
from ingest.collectors.procfs import (
    DigitTable,
    LayoutCollector,
    ProcFile,
    cpu_node_map,
    line_runs,
    parse_error,
)
from ingest.schema import CPU, Tier

#: /proc/stat per-CPU columns in order (guest time is already inside user/nice)
_CPU_FIELDS: tuple[str, ...] = tuple(f.name for f in CPU.fields if f.kind == "counter")
_NCOL = len(_CPU_FIELDS)


class CpuCollector(LayoutCollector[tuple[bytes, bytes | None, dict[bytes, Value] | None]]):
    name = "cpu"
    measurements: tuple[str, ...] = ("cpu", "system")
    tier: Tier = "fast"

    def __init__(
        self, root: str | Path = "/", *, freq: bool = True, freq_every: int = 10, **options: object
    ) -> None:
        """``freq=False`` skips the cpufreq reads. They cost one sysfs read per CPU (about
        a millisecond per tick on a 192-CPU host), so they are re-read every
        ``freq_every`` ticks (1 s at the default 100 ms) and repeated in between."""
        if freq_every < 1:
            raise ValueError(f"cpu collector: freq_every must be >= 1, got {freq_every}")
        self._freq_every = freq_every
        self._tick = 0
        self._last_freq: list[Value] = []
        self._root = root
        self._stat = ProcFile(proc_path(root, "proc/stat"), whole=True)
        try:
            self._loadavg: ProcFile | None = ProcFile(proc_path(root, "proc/loadavg"), whole=True)
        except SourceUnavailable:
            self._loadavg = None
        self._cpu_node = cpu_node_map(root)
        self._want_freq = freq
        self._freq: dict[bytes, ProcFile | None] = {}
        self._tags_key: tuple[bytes, ...] = ()
        self._cpu_tags: list[str] = []
        self._node_tags: list[str] = []
        self._load1: float | None = None
        # /proc/stat without its 'intr' line, as a digit table (see _parse_learnt)
        self._digits = DigitTable()
        self._learnt_key: tuple[bytes, ...] = ()  # the CPUs of the learnt layout
        try:  # learn the CPUs now: sample() reads their cpufreq
            self.parse([(self._stat.read(), None, None)])
        except CollectorError:
            pass  # reported by every collect() while it lasts

    def _freq_file(self, label: bytes) -> ProcFile | None:
        path = proc_path(
            self._root, "sys/devices/system/cpu", label.decode(), "cpufreq/scaling_cur_freq"
        )
        try:
            return ProcFile(path, whole=True, size=4096)
        except (SourceUnavailable, CollectorError):
            return None

    def sample(self) -> tuple[bytes, bytes | None, dict[bytes, Value] | None]:
        """The tick's reads only: /proc/stat every tick; /proc/loadavg (a 5-s kernel
        average) and cpufreq every ``freq_every`` ticks. :meth:`parse` does the rest,
        later and in batches (the agent defers it to the flush, where the parsing code
        runs hot instead of paying a cold start at every 100 ms tick)."""
        stat = self._stat.read()
        self._tick += 1
        if self._tick % self._freq_every != 1 % self._freq_every:
            return stat, None, None
        load = self._loadavg.read() if self._loadavg is not None else None
        freq: dict[bytes, Value] | None = None
        if self._want_freq:
            freq = {}
            for lb, f in self._freq.items():
                if f is None:
                    continue
                try:
                    freq[lb] = int(f.read()) / 1000.0  # kHz -> MHz
                except (ValueError, CollectorError):
                    pass  # cpufreq driver without a current value (EBUSY ...)
        return stat, load if load is not None else b"", freq

    def _parse_full(self, raw: tuple[bytes, bytes | None, dict[bytes, Value] | None]) -> list[Block]:
        stat, load_raw, freq_raw = raw
        labels, cols, ctxt, forks, running, blocked = parse_stat(stat, self._stat.path)
        if self._digits.relearn:
            self._learn(stat, labels, cols, (ctxt, forks, running, blocked))
        self._set_cpus(labels)
        self._side_reads(load_raw, freq_raw, labels)
        fields: dict[str, list[Value]] = dict(zip(_CPU_FIELDS, cols, strict=True))
        fields["freq_mhz"] = list(self._last_freq)
        return [
            Block("cpu", 1, tags={"cpu": self._cpu_tags, "node": self._node_tags}, fields=fields),
            Block(
                "system",
                1,
                fields={
                    "ctxt": [ctxt],
                    "forks": [forks],
                    "procs_running": [running],
                    "procs_blocked": [blocked],
                    "load1": [self._load1],
                },
            ),
        ]

    def _parse_learnt(
        self, raws: list[tuple[bytes, bytes | None, dict[bytes, Value] | None]]
    ) -> list[Block] | None:
        """Samples of the CPUs of the last full parse, /proc/stat laid out as then: all the
        counters in one numpy pass (:class:`DigitTable`); None otherwise."""
        if self._learnt_key != self._tags_key:  # CPUs came or went since the layout was learnt
            self._digits.relearn = True
            return None
        cut = [_without_intr(r[0]) for r in raws]
        got = self._digits.values(cut) if None not in cut else None  # type: ignore[arg-type]
        if got is None:
            return None
        n = len(raws)
        labels = list(self._tags_key)
        freq: list[Value] = []
        load: list[Value] = []
        before = self._last_freq, self._load1
        try:
            for _, load_raw, freq_raw in raws:
                self._side_reads(load_raw, freq_raw, labels)
                freq.extend(self._last_freq)
                load.append(self._load1)
        except CollectorError:
            self._last_freq, self._load1 = before  # changed nothing: the full parse names the sample
            raise
        none: list[Value] = [None] * (n * len(labels))
        fields: dict[str, list[Value]] = {f: got.get(f) or none for f in _CPU_FIELDS}
        fields["freq_mhz"] = freq
        system: dict[str, list[Value]] = {
            "ctxt": got["ctxt"],
            "forks": got["forks"],
            "procs_running": [float(v) for v in got["procs_running"]],  # type: ignore[arg-type]
            "procs_blocked": [float(v) for v in got["procs_blocked"]],  # type: ignore[arg-type]
            "load1": load,
        }
        tags = {"cpu": self._cpu_tags, "node": self._node_tags}
        return [Block("cpu", n, tags=tags, fields=fields), Block("system", n, fields=system)]

    def _learn(self, stat: bytes, labels: list[bytes], cols: list[list[Any]],
               tail: tuple[int | None, int | None, float | None, float | None]) -> None:
        """Learn where each value of a parsed /proc/stat lies among its digit runs, for
        :meth:`_parse_learnt` (checked against the parse, else batches are declined)."""
        self._learnt_key = tuple(labels)
        cut = _without_intr(stat)
        if cut is None or None in tail:
            self._digits.disable(cut or stat)
            return
        lines = cut.split(b"\n")
        starts = line_runs(cut)
        cpu_lines = range(1, len(labels) + 1)  # 'cpuN v1 v2 ...': N is one run, the values follow
        picks = {
            f: [starts[i] + 1 + j for i in cpu_lines]
            for j, f in enumerate(_CPU_FIELDS) if cols[j] and cols[j][0] is not None
        }
        expected: dict[str, list[Value]] = {f: cols[j] for j, f in enumerate(_CPU_FIELDS) if f in picks}
        heads = {line.split(b" ", 1)[0]: i for i, line in enumerate(lines)}
        for f, key, v in zip(("ctxt", "forks", "procs_running", "procs_blocked"),
                             (b"ctxt", b"processes", b"procs_running", b"procs_blocked"), tail, strict=True):
            if key not in heads:
                self._digits.disable(cut)
                return
            picks[f] = [starts[heads[key]]]
            expected[f] = [int(v)]  # type: ignore[arg-type]
        self._digits.learn(cut, picks, labels=[starts[i] for i in cpu_lines], expected=expected)

    def _set_cpus(self, labels: list[bytes]) -> None:
        key_t = tuple(labels)
        if key_t != self._tags_key:
            self._tick = 0  # CPUs came or went: read their frequencies at the next sample
            self._tags_key = key_t
            self._cpu_tags = [lb[3:].decode() for lb in labels]
            self._node_tags = [self._cpu_node.get(int(c), "0") for c in self._cpu_tags]
            if self._want_freq:
                self._freq = {lb: self._freq.get(lb) or self._freq_file(lb) for lb in labels}
            self._last_freq = [None] * len(labels)

    def _side_reads(self, load_raw: bytes | None, freq_raw: dict[bytes, Value] | None,
                    labels: list[bytes]) -> None:
        """loadavg and cpufreq, read every ``freq_every`` ticks: kept for the ticks between."""
        if freq_raw is not None:
            self._last_freq = [freq_raw.get(lb) for lb in labels]
        if load_raw is not None and self._loadavg is not None:
            try:
                self._load1 = float(load_raw.split(None, 1)[0])
            except (ValueError, IndexError):
                raise parse_error(self._loadavg.path, 1, load_raw, "expected a load average") from None

    def close(self) -> None:
        self._stat.close()
        if self._loadavg is not None:
            self._loadavg.close()
        for f in self._freq.values():
            if f is not None:
                f.close()
        self._freq = {}


def _without_intr(stat: bytes) -> bytes | None:
    """/proc/stat without its 'intr' line: one count per interrupt number (thousands on a
    big host), not stored; None when there is none."""
    i = stat.find(b"\nintr ")
    j = stat.find(b"\n", i + 1)
    return None if i < 0 or j < 0 else stat[:i] + stat[j:]


def _value_after(data: bytes, key: bytes) -> bytes | None:
    """The rest of the line that starts with ``key`` (which begins with a newline)."""
    i = data.find(key)
    if i < 0:
        return None
    i += len(key)
    j = data.find(b"\n", i)
    return data[i:] if j < 0 else data[i:j]


def parse_stat(
    data: bytes, path: str
) -> tuple[list[bytes], list[list[Any]], int | None, int | None, float | None, float | None]:
    """/proc/stat -> (cpu labels, the 8 counter columns, ctxt, processes, procs_running,
    procs_blocked). The per-CPU lines are one block split at once and converted column
    by column (200 us instead of 450 us for 192 CPUs); an old kernel with fewer columns
    (no steal) gets nulls for the missing ones."""
    start = data.find(b"\n") + 1  # skip the all-CPU line 'cpu  ...': the sum of the others
    end = data.find(b"\nintr ", start)
    if data[:4] != b"cpu " or end < 0:
        raise parse_error(path, 1, data[:80], "expected 'cpu' lines then 'intr'")
    block = data[start:end]
    toks = block.split()
    nlines = block.count(b"\n") + 1 if block else 0
    width = len(toks) // nlines if nlines else 0
    if nlines and (width * nlines != len(toks) or width < 5):
        raise parse_error(path, 2, block[:80], "cpu lines of unequal length")
    labels = toks[0::width] if nlines else []
    if not all(lb[:3] == b"cpu" and lb[3:].isdigit() for lb in labels):
        raise parse_error(path, 2, block[:80], "expected only cpuN lines before 'intr'")
    try:
        cols: list[list[Any]] = [
            list(map(int, toks[j + 1 :: width])) if j + 1 < width else [None] * nlines
            for j in range(_NCOL)
        ]
        vals = [
            _value_after(data, k)
            for k in (b"\nctxt ", b"\nprocesses ", b"\nprocs_running ", b"\nprocs_blocked ")
        ]
        ctxt, forks = (None if v is None else int(v) for v in vals[:2])
        running, blocked = (None if v is None else float(v) for v in vals[2:])
    except ValueError:
        raise CollectorError(f"{path}: a value that is not a number in {data[:200]!r}...") from None
    return labels, cols, ctxt, forks, running, blocked
