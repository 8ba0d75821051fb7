"""PerfCollector: recorded ``perf stat -I --per-socket -x,`` outputs through the live parser,
and the live child process on this host."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.collectors.base import CollectorError, Reading, SourceUnavailable
from ingest.collectors.perf import (
    CORE_EVENTS,
    UNCORE_BW_EVENTS,
    PerfCollector,
    PerfTotals,
    parse_perf_line,
    uncore_bandwidth_events,
)
from ingest.counters import CounterTracker
from ingest.schema import PERF

DATA = Path(__file__).parent / "data" / "perf"
MiB = 1 << 20


def replay(path: Path) -> list[Reading]:
    """A recorded output through the live collector's parser and totals: one reading per
    interval (the last one committed at the end, as when perf exits)."""
    totals, out = PerfTotals({**CORE_EVENTS, **UNCORE_BW_EVENTS}), []
    for line in path.read_text().splitlines():
        totals.feed(line)
        out += [r] if (r := totals.reading()) is not None else []
    totals.flush()
    return out + ([r] if (r := totals.reading()) is not None else [])


def as_rows(r: Reading) -> list[dict[str, Any]]:
    return [
        {"socket": s, **{f: r.fields[f][i] for f in r.fields}}
        for i, s in enumerate(r.tags["socket"])
    ]


def test_parse_line_layouts() -> None:
    rec = parse_perf_line(
        "     0.100187544,S1,56,2101234567,,instructions,5600000000,100.00,0.54,insn per cycle"
    )
    assert rec is not None
    assert (rec.time, rec.socket, rec.event, rec.count, rec.unit, rec.status) == (
        0.100187544,
        "1",
        "instructions",
        2101234567.0,
        "",
        "ok",
    )
    rec = parse_perf_line("     0.1,S0,1,<not supported>,,cycles,0,100.00,,")
    assert rec is not None and rec.count is None and rec.status == "<not supported>"
    # the probe's layout: no time, no socket columns
    rec = parse_perf_line("<not counted>,,LLC-loads,0,0.00,,", interval=False, per_socket=False)
    assert rec is not None and rec.event == "LLC-loads" and rec.status == "<not counted>"
    assert parse_perf_line("") is None and parse_perf_line("# comment") is None
    with pytest.raises(ValueError, match="malformed perf stat line"):
        parse_perf_line("0.1,S0,56,12x,,cycles,1,100.00,,")
    with pytest.raises(ValueError, match="fields"):
        parse_perf_line("0.1,S0")


def test_two_socket_xeon_recording_whole_rows() -> None:
    readings = replay(DATA / "two-socket-xeon.csv")
    assert len(readings) == 5
    first, third, last = (as_rows(readings[i]) for i in (0, 2, 4))
    assert first == [
        {
            "socket": "0",
            "instructions": 4812345678,
            "cycles": 6023456789,
            "llc_loads": 41234567,
            "llc_misses": 9876543,
            "mem_bandwidth": round((1523.41 + 612.77) * MiB),
        },
        {
            "socket": "1",
            "instructions": 2101234567,
            "cycles": 3876543210,
            "llc_loads": 18765432,
            "llc_misses": 3456789,
            "mem_bandwidth": round((402.19 + 151.06) * MiB),
        },
    ]
    # interval 3: S1 LLC-loads <not counted> -> null; the other fields keep accumulating
    assert third[1]["llc_loads"] is None
    assert third[1]["llc_misses"] == 3456789 + 3512345 + 3498765
    # running totals (cumulative counters for the CounterTracker)
    assert last[0]["instructions"] == 4812345678 + 4798765432 + 4823456789 + 3712345678 + 3698765432
    assert last[1]["llc_loads"] == 18765432 + 18901234 + 18823456 + 18845678  # interval 3 skipped


def test_totals_through_counter_tracker_give_interval_deltas() -> None:
    tracker = CounterTracker(PERF.counters)
    deltas = []
    for r in replay(DATA / "two-socket-xeon.csv"):
        keys = [(s,) for s in r.tags["socket"]]
        deltas.append(tracker.deltas(keys, {c: r.fields[c] for c in PERF.counters}))
    assert deltas[0]["instructions"] == [None, None]  # first sample of a series
    assert deltas[1]["instructions"] == [4798765432, 2123456789]  # = perf's interval counts
    bw = deltas[3]["mem_bandwidth"][0]
    assert bw is not None and abs(bw - (2890.54 + 1104.21) * MiB) <= 1  # MiB -> bytes
    # no delta spans the unknown interval: null at interval 3 and the one after
    assert [d["llc_loads"][1] for d in deltas] == [None, 18901234, None, None, 18845678]
    assert tracker.stats.resets == 0 and tracker.stats.wraps == 0


def test_vm_without_pmu_recording_gives_null_rows() -> None:
    readings = replay(DATA / "vm-no-pmu.csv")
    assert len(readings) == 4
    assert as_rows(readings[-1]) == [
        {
            "socket": "0",
            "instructions": None,
            "cycles": None,
            "llc_loads": None,
            "llc_misses": None,
            "mem_bandwidth": None,
        }
    ]


def test_partial_interval_is_not_committed_early() -> None:
    lines = (DATA / "two-socket-xeon.csv").read_text().splitlines()
    data = [x for x in lines if not x.startswith("#")]
    t = PerfTotals({**CORE_EVENTS, "uncore_imc/cas_count_read/": "mem_bandwidth"})
    for line in data[:12]:  # the whole first interval, but its end is unknown yet
        t.feed(line)
    assert t.reading() is None
    t.feed(data[12])  # next interval starts: first one committed, group size learnt
    first = t.reading()
    assert first is not None and first.fields["instructions"] == [4812345678, 2101234567]
    for line in data[13:23]:  # 11 of 12 lines of interval 2
        t.feed(line)
    assert t.reading() is None
    t.feed(data[23])  # the 12th line completes it without waiting for interval 3
    second = t.reading()
    assert second is not None and second.fields["instructions"] == [
        4812345678 + 4798765432,
        2101234567 + 2123456789,
    ]


def test_unknown_field_mapping_rejected() -> None:
    with pytest.raises(ValueError, match="unknown perf fields"):
        PerfTotals({"instructions": "ipc"})


def test_uncore_detection_under_root(tmp_path: Path) -> None:
    assert uncore_bandwidth_events(tmp_path) == {}
    ev = tmp_path / "sys/bus/event_source/devices/uncore_imc_0/events"
    ev.mkdir(parents=True)
    (ev / "cas_count_read").write_text("event=0x04,umask=0x03\n")
    assert set(uncore_bandwidth_events(tmp_path)) == {
        "uncore_imc/cas_count_read/",
        "uncore_imc/cas_count_write/",
    }


def test_missing_perf_executable() -> None:
    with pytest.raises(SourceUnavailable, match="'no-such-perf' not found"):
        PerfCollector(perf="no-such-perf")


def test_interval_validated() -> None:
    with pytest.raises(ValueError, match="interval_ms"):
        PerfCollector(interval_ms=5)


def _require_perf() -> None:
    # scripts/bootstrap.sh installs Debian's linux-perf; a missing binary is a set-up error
    assert shutil.which("perf"), "perf is not installed: run scripts/bootstrap.sh (installs linux-perf)"


def _has_hw_pmu() -> bool:
    devs = Path("/sys/bus/event_source/devices")
    return any((devs / n).exists() for n in ("cpu", "cpu_core", "armv8_pmuv3", "armv8_pmuv3_0"))


@pytest.mark.host
def test_live_host_pmu_or_clear_reason() -> None:
    """Real: where the host has no hardware PMU (this VM) the collector says why, once."""
    _require_perf()
    if _has_hw_pmu():
        c = PerfCollector(interval_ms=100)
        c.close()
    else:
        with pytest.raises(
            SourceUnavailable,
            match=r"no hardware counters on this host.*instructions.*<not supported>",
        ):
            PerfCollector()


@pytest.mark.host
def test_live_child_process_with_software_events() -> None:
    """The live pipeline (child start, non-blocking drain, interval grouping, totals, close)
    against a real `perf stat -I`, with software events standing in for hardware ones so it
    runs on hosts without a PMU. Their values land in the named fields only for this test."""
    _require_perf()
    c = PerfCollector(
        interval_ms=50, events={"context-switches": "instructions", "page-faults": "cycles"}
    )
    proc = c._proc
    assert proc is not None and proc.poll() is None
    try:
        got: list[Reading] = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.06)
            got += c.collect()
        assert len(got) >= 2
        a, b = (as_rows(r) for r in got[-2:])
        assert [r["socket"] for r in b] == [r["socket"] for r in a]
        for ra, rb in zip(a, b, strict=True):
            assert rb["instructions"] >= ra["instructions"] > 0  # running totals
            assert rb["llc_loads"] is None and rb["mem_bandwidth"] is None  # not requested
    finally:
        c.close()
    assert proc.poll() is not None  # child ended
    with pytest.raises(CollectorError, match="closed"):
        c.collect()
