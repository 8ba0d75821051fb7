"""A collector's one parse (``parse(raws)``) gives exactly what its full parser gives
sample by sample.

The agent hands a collector all its raw samples of a flush at once; the collector reads
the runs of samples laid out like the one it learnt with numpy, and parses in full (and
learns again) the sample where the layout changed (ingest.collectors.procfs.parse_runs).
These tests feed the same samples through the agent twice: once through ``parse``, once
through the collector's full parser alone, one sample at a time (the reference), and
compare the buffered rows (after counter deltas), across value changes that move padded
numbers to more digits and across lines that vanish and come back in the middle of a
batch."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.agent import Agent, AgentConfig
from ingest.collectors import REGISTRY
from ingest.collectors.base import Block, CollectorError, Reading
from ingest.collectors.procfs import DigitTable, LineLayout

DATA = Path(__file__).parent / "data" / "proc"
NORMAL, MISSING, LARGE = (DATA / n for n in ("normal", "missing_fields", "large"))

#: the files each batched collector reads (numa: every node's)
SOURCES: dict[str, tuple[str, ...]] = {
    "pressure": ("proc/pressure/*",),
    "net": ("proc/net/dev",),
    "tcp": ("proc/net/snmp",),
    "disk": ("proc/diskstats",),
    "cpu": ("proc/stat",),
    "interrupts": ("proc/interrupts",),
    "softirqs": ("proc/softirqs",),
    "memory": ("proc/meminfo",),
    "vmstat": ("proc/vmstat",),
    "numa": ("sys/devices/system/node/node*/numastat", "sys/devices/system/node/node*/meminfo"),
}
CASES = [(n, NORMAL) for n in SOURCES] + [(n, LARGE) for n in SOURCES] + [
    (n, MISSING) for n in SOURCES if n not in ("numa", "pressure")  # an old kernel: no NUMA, no PSI
]


class FullOnly:
    """The reference: a collector whose samples all go through its full parser, one at a
    time (no learnt layout)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.measurements = inner.measurements
        self.tier = inner.tier

    def collect(self) -> list[Reading]:
        return list(self.inner.collect())

    def sample(self) -> Any:
        return self.inner.sample()

    def parse(self, raws: list[Any], errors: list[CollectorError] | None = None) -> list[Block]:
        out: list[Block] = []
        for i, raw in enumerate(raws):
            try:
                blocks = self.inner._parse_full(raw)
            except CollectorError as e:
                assert errors is not None
                errors.append(e)
                continue
            for b in blocks:
                b.at = i
            out += blocks
        return out

    def close(self) -> None:
        self.inner.close()


def _count_full_parses(c: Any) -> list[int]:
    """Counts the calls of ``c``'s full parser (in a one-item list)."""
    calls = [0]
    full = c._parse_full

    def counted(raw: Any) -> list[Block]:
        calls[0] += 1
        return full(raw)  # type: ignore[no-any-return]

    c._parse_full = counted
    return calls


def _grow(text: str, k: int, keep: int = 0) -> str:
    """Every value (a number after spaces or '=', before a space or the line's end; not
    an IRQ label 'N:' nor 'Node N', nor in a line's first ``keep`` columns) grown by an
    eighth plus k, right-aligned in its old width when it fits, as the kernel's padded
    formats do: values move to more digits along the way."""

    def grown(m: re.Match[str]) -> str:
        lead, pad, digits = m.group(1), m.group(2), m.group(3)
        v = str(min(int(digits) + int(digits) // 8 + k, 2**32 - 1))  # a kernel's %10u fits
        width = len(pad) + len(digits)
        return lead + (v.rjust(width) if len(v) < width else v)

    def line(text: str) -> str:
        head = re.match(r"\s*(?:\S+\s+){" + str(keep) + "}", text) if keep else None
        cut = head.end() if head else 0
        body = re.sub(r"(?<!Node)([ =])( *)(\d+)(?=[ \n]|$)", grown, text[cut:])
        return text[:cut] + body

    return "".join(line(x) for x in text.splitlines(True))


def _drop_one_line(text: str) -> str:
    lines = text.splitlines(True)
    del lines[len(lines) // 2]  # a line in the middle: every later line moves up
    return "".join(lines)


def _write(path: Path, text: str) -> None:
    with open(path, "r+b") as f:  # same inode: the collector's open fd reads the new content
        f.truncate(0)
        f.write(text.encode())


@pytest.fixture(autouse=True)
def _no_priming(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The agent primes collectors that learn a layout with one sample of their own;
    comparing with the reference needs both to start from the same state
    (test_agent_priming... checks the priming itself)."""
    if "priming" not in request.node.name:
        monkeypatch.setattr(Agent, "_prime", lambda self: None)


def _agent(collector: Any) -> Agent:
    return Agent(AgentConfig(lake=None, host="t", compact_every_s=0), [], collectors=[collector])


def _rows(agent: Agent) -> dict[str, dict[str, list[Any]]]:
    return {name: {c: list(v) for c, v in buf.columns.items()} for name, buf in agent._buffers.items()}


def _feed(agent: Agent, collector: Any, raws: list[Any], chunks: list[int]) -> None:
    at = 0
    for size in chunks:
        agent._deferred = [(collector, 1_000_000 * (i + 1), raws[i]) for i in range(at, at + size)]
        agent._parse_deferred()
        at += size


@pytest.mark.parametrize(("name", "tree"), CASES, ids=[f"{n}-{t.name}" for n, t in CASES])
def test_batches_equal_one_by_one(tmp_path: Path, name: str, tree: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(tree, root, symlinks=True)
    files = [p for pattern in SOURCES[name] for p in sorted(root.glob(pattern))]
    assert files, f"{tree.name} has no {SOURCES[name]}"
    batched, single = REGISTRY[name](root), FullOnly(REGISTRY[name](root))
    a, b = _agent(batched), _agent(single)
    full_parses = _count_full_parses(batched)
    texts = {p: p.read_text() for p in files}
    raws = []
    for step in range(12):
        for p in files:
            texts[p] = _grow(texts[p], step, keep=3 if name == "disk" else 0)
            # steps 5-7: a line gone (a layout change inside a batch), then back
            _write(p, _drop_one_line(texts[p]) if 5 <= step <= 7 else texts[p])
        raws.append(batched.sample())
    for agent, c in ((a, batched), (b, single)):
        _feed(agent, c, raws, [1, 3, 4, 4])
    # a dropped line can break a file (snmp's 'Tcp:' names): both paths report the same samples
    assert a.stats.errors == b.stats.errors
    rows_a, rows_b = _rows(a), _rows(b)
    assert rows_a == rows_b
    assert sum(len(cols["time"]) for cols in rows_a.values()) > 0
    # the learnt layout read samples: not all went through the full parser (but for
    # /proc/interrupts: its ERR: and MIS: counts, outside the per-CPU grid, grow here at
    # every sample, and the grid keeps every byte outside its cells)
    assert full_parses[0] < len(raws) or name == "interrupts"
    # a batch of samples laid out alike is read through the learnt layout
    batched.parse([raws[-1]])
    assert batched._parse_learnt([raws[-1]] * 2) is not None


@pytest.mark.host
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_batches_equal_one_by_one_on_this_host(name: str) -> None:
    batched = REGISTRY[name]("/")
    single = FullOnly(REGISTRY[name]("/"))
    a, b = _agent(batched), _agent(single)
    raws = []
    for _ in range(40):
        raws.append(batched.sample())
        sum(range(20_000))  # some work between reads: counters move
        time.sleep(0.005)
    for agent, c in ((a, batched), (b, single)):
        _feed(agent, c, raws, [1, 19, 20])
    assert _rows(a) == _rows(b)
    assert a.stats.errors == 0
    batched.parse([raws[-1]])
    assert batched._parse_learnt([raws[-1]] * 2) is not None


def test_digit_table_declines_other_layouts() -> None:
    t = DigitTable()
    assert t.values([b"cpu0 1 2\nctxt 3\n"]) is None  # nothing learnt
    # runs: 0 (the name cpu0), 10, 200, 7
    assert t.learn(b"cpu0 10 200\nctxt 7\n", {"user": [1], "ctxt": [3]}, labels=[0],
                   expected={"user": [10], "ctxt": [7]})
    got = t.values([b"cpu0 11 201\nctxt 9\n", b"cpu0 12 99999\nctxt 10\n"])
    assert got == {"user": [11, 12], "ctxt": [9, 10]}
    assert t.values([b"cpu0  11   201\nctxt  9\n"]) is not None  # other padding
    assert not t.relearn
    assert t.values([b"cpu0 11 201\nctxx 9\n"]) is None  # another key
    assert t.relearn  # the collector learns again from its next full parse
    assert t.values([b"cpu0 11 201 5\nctxt 9\n"]) is None  # one more value
    assert t.values([b"cpu0 11 2 01\nctxt 9\n"]) is None  # a value split in two
    assert t.values([b"cpu0 11 -201\nctxt 9\n"]) is None  # a sign the digits do not carry
    assert t.values([b"cpu1 11 201\nctxt 9\n"]) is None  # another name, same letters
    # picks that do not give the parser's values: every batch of that layout is declined
    assert not t.learn(b"x -5\ny 7\n", {"x": [0]}, expected={"x": [-5]})
    assert t.values([b"x -5\ny 7\n"]) is None
    assert t.values([b"x -6\ny 8\n"]) is None and not t.relearn  # same layout: no use learning again
    assert t.values([b"x 6\ny 8\n"]) is None and t.relearn  # another one: learn again


def test_line_layout_reads_batches_of_the_learnt_layout() -> None:
    wanted = {b"MemFree": "free", b"Cached": "cached"}
    lay = LineLayout()
    first = b"MemTotal:  1000 kB\nMemFree:    500 kB\nCached:      9 kB\n"
    assert lay.values([first]) is None and lay.relearn  # nothing learnt yet
    lay.learn(first, b":", wanted, {"free": 512000, "cached": 9216})
    assert lay.values([first]) == {"free": [512000], "cached": [9216]}
    wider = first.replace(b"      9 kB", b"  10000 kB")  # a padded value with more digits
    assert lay.values([first, wider]) == {"free": [512000] * 2, "cached": [9216, 10240000]}
    other = first.replace(b"1000 kB", b"1000 MB")  # an unwanted line changed otherwise
    assert lay.values([first, other]) is None and lay.relearn
    lay.learn(other, b":", wanted, {"free": 512000, "cached": 9216})
    assert lay.values([other, other]) == {"free": [512000] * 2, "cached": [9216] * 2}
    negative = b"nr_x -5\nnr_y 7\n"  # a value whose sign the digit runs would lose
    lay.learn(negative, b" ", {b"nr_x": "x", b"nr_y": "y"}, {"x": -5, "y": 7})
    assert lay.values([negative]) is None
    # a value the full parser did not read is not picked: it checks every pick
    lay.learn(first, b":", wanted, {"free": 512000})
    assert lay.values([first]) == {"free": [512000]}


def test_parse_splits_a_batch_where_the_layout_changes(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(NORMAL, root, symlinks=True)
    c = REGISTRY["vmstat"](root)
    text = (root / "proc/vmstat").read_text()
    raws = []
    for step in range(8):  # a line gone from the 4th sample on: one full parse there
        text = _grow(text, step)
        _write(root / "proc/vmstat", _drop_one_line(text) if step >= 3 else text)
        raws.append(c.sample())
    c.parse(raws[:1])  # learnt
    full_parses = _count_full_parses(c)
    blocks = c.parse(raws)
    assert full_parses[0] == 1
    assert [(b.at, b.ticks) for b in blocks] == [(0, 8)]  # merged: one block for the agent
    ref = FullOnly(REGISTRY["vmstat"](root)).parse(raws)
    assert blocks[0].fields == {f: [v for b in ref for v in b.fields[f]] for f in blocks[0].fields}
    # a sample that cannot be parsed is left out and reported; the others keep their place
    bad = raws[5].replace(b"pgfault ", b"pgfault x")
    errors: list[CollectorError] = []
    blocks = c.parse(raws[:5] + [bad] + raws[6:], errors)
    assert len(errors) == 1 and "pgfault" in str(errors[0])
    assert [(b.at, b.ticks) for b in blocks] == [(0, 5), (6, 2)]
    with pytest.raises(CollectorError, match="pgfault"):
        c.parse([bad])


def test_a_failing_learnt_layout_falls_back_to_full_parses(caplog: pytest.LogCaptureFixture) -> None:
    broken, single = REGISTRY["vmstat"](NORMAL), FullOnly(REGISTRY["vmstat"](NORMAL))
    broken.parse([broken.sample()])  # learnt

    def fault(raws: list[Any]) -> None:
        raise IndexError("a bug in the learnt layout")

    broken._parse_learnt = fault
    a, b = _agent(broken), _agent(single)
    raws = [broken.sample() for _ in range(5)]
    _feed(a, broken, raws, [5])
    _feed(b, single, raws, [5])
    assert _rows(a) == _rows(b) and len(_rows(a)["vmstat"]["time"]) == 5
    assert caplog.text.count("learnt layout failed") == 1


def test_agent_priming_lets_the_first_flush_read_batches() -> None:
    collectors = [REGISTRY[n](NORMAL) for n in sorted(SOURCES)]
    Agent(AgentConfig(lake=None, host="t", compact_every_s=0), [], collectors=collectors)
    for c in collectors:  # learnt at start: a first batch is read in one pass
        assert c._parse_learnt([c.sample(), c.sample()]) is not None, c.name


def test_merge_blocks_joins_contiguous_samples_without_touching_its_input() -> None:
    from ingest.collectors.base import merge_blocks

    shared: list[Any] = [None]
    tags = {"interface": ["a"]}
    blocks = [Block("net", 1, tags, {"rx_bytes": shared}, at=i) for i in range(3)]
    blocks += [Block("net", 1, {"interface": ["b"]}, {"rx_bytes": [5]}, at=3)]  # other series
    blocks += [Block("net", 1, {"interface": ["b"]}, {"rx_bytes": [6]}, at=5)]  # a sample left out before
    got = merge_blocks(blocks)
    assert [(b.at, b.ticks, b.fields["rx_bytes"]) for b in got] == [
        (0, 3, [None] * 3), (3, 1, [5]), (5, 1, [6])]
    assert shared == [None] and all(b.ticks == 1 for b in blocks)
