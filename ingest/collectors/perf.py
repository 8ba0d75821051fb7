"""Hardware performance counters per socket (measurement ``perf``) from one long-lived
``perf stat -a --per-socket -I <ms> -x,`` child process.

``perf stat -I`` prints, every interval, the count of each event *during that interval*.
The agent's :class:`ingest.counters.CounterTracker` expects raw cumulative counters, so this
collector keeps running totals per (socket, field) and returns the totals; the tracker turns
them back into per-sample deltas (which is what the lake stores). An interval whose count is
``<not counted>`` / ``<not supported>`` is not added to the total and makes that field null in
the reading that carries it (so no delta ever spans an unknown interval).

The child is started once in ``__init__`` and killed in :meth:`PerfCollector.close`;
:meth:`PerfCollector.collect` only drains what perf has written to its stderr pipe, without
blocking. One reading is returned per call when at least one new interval completed since the
previous call, none otherwise (a missing row means "no new data", never a made-up zero).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ingest.collectors.base import CollectorError, Reading, SourceUnavailable, proc_path
from ingest.schema import PERF, Tier

log = logging.getLogger(__name__)

#: perf event -> schema field. Events mapped to the same field are summed.
CORE_EVENTS: dict[str, str] = {
    "instructions": "instructions",
    "cycles": "cycles",
    "LLC-loads": "llc_loads",
    "LLC-load-misses": "llc_misses",
}
#: Intel integrated memory controller CAS counts (perf scales them to MiB), where present.
UNCORE_BW_EVENTS: dict[str, str] = {
    "uncore_imc/cas_count_read/": "mem_bandwidth",
    "uncore_imc/cas_count_write/": "mem_bandwidth",
}
#: perf's count units -> multiplier to the schema unit (bytes for mem_bandwidth, else events).
_UNIT_SCALE = {
    "": 1.0,
    "MiB": float(1 << 20),
    "KiB": 1024.0,
    "GiB": float(1 << 30),
    "B": 1.0,
    "Bytes": 1.0,
}

NOT_SUPPORTED = "<not supported>"
NOT_COUNTED = "<not counted>"


@dataclass(frozen=True, slots=True)
class PerfLine:
    """One CSV line of ``perf stat -x,`` output."""

    time: float | None  # seconds since perf started (-I only)
    socket: str | None  # "0" for "S0" (--per-socket only)
    event: str
    count: float | None  # None when not supported / not counted
    unit: str
    status: str  # "ok", NOT_SUPPORTED or NOT_COUNTED


def parse_perf_line(
    line: str, *, interval: bool = True, per_socket: bool = True
) -> PerfLine | None:
    """Parse one line of ``perf stat [-I ms] [--per-socket] -x,`` output.

    Layout: ``[time,][S<n>,<cpus>,]count,unit,event,run_time,pct[,metric,metric_unit]``.
    Returns None for blank and comment lines; raises ValueError for a malformed data line.
    """
    s = line.strip()
    if not s or s.startswith("#"):
        return None
    f = s.split(",")
    i = 0
    t: float | None = None
    sock: str | None = None
    need = 3 + int(interval) + 2 * int(per_socket)
    if len(f) < need:
        raise ValueError(f"perf stat line has {len(f)} fields, expected >= {need}: {s!r}")
    try:
        if interval:
            t = float(f[0])
            i = 1
        if per_socket:
            if not f[i].startswith("S"):
                raise ValueError(f"socket column {f[i]!r} is not S<n>")
            sock = f[i][1:]
            i += 2  # socket, number of CPUs aggregated
        raw, unit, event = f[i], f[i + 1], f[i + 2]
        if raw in (NOT_SUPPORTED, NOT_COUNTED):
            return PerfLine(t, sock, event, None, unit, raw)
        return PerfLine(t, sock, event, float(raw), unit, "ok")
    except ValueError as e:
        raise ValueError(f"malformed perf stat line {s!r}: {e}") from None


class PerfTotals:
    """Running per-(socket, field) totals built from ``perf stat -I --per-socket`` lines.

    Lines are grouped by interval timestamp; a group is added to the totals when the next
    interval starts, when it holds as many lines as a complete interval had, or on :meth:`flush`.
    """

    def __init__(self, events: Mapping[str, str]) -> None:
        unknown = set(events.values()) - set(PERF.field_index)
        if unknown:
            raise ValueError(f"perf events map to unknown perf fields {sorted(unknown)}")
        self.events = dict(events)
        self.totals: dict[str, dict[str, float]] = {}
        self._valid: dict[str, dict[str, bool]] = {}
        self._group: list[PerfLine] = []
        self._expected: int | None = None
        self._new = False
        self.intervals = 0
        self._warned: set[str] = set()

    def feed(self, line: str) -> None:
        rec = parse_perf_line(line)
        if rec is None:
            return
        if self._group and rec.time != self._group[0].time:
            if self._expected is None:
                self._expected = len(self._group)
            self._commit()
        self._group.append(rec)
        if self._expected is not None and len(self._group) >= self._expected:
            self._commit()

    def flush(self) -> None:
        """Commit a trailing interval (end of a recorded file, or perf exiting)."""
        if self._group:
            self._commit()

    def _commit(self) -> None:
        group, self._group = self._group, []
        sums: dict[tuple[str, str], float | None] = {}
        for rec in group:
            field = self.events.get(rec.event)
            if field is None:
                if rec.event not in self._warned:
                    self._warned.add(rec.event)
                    log.warning("perf: unexpected event %r in perf output; ignored", rec.event)
                continue
            key = (rec.socket or "0", field)
            if rec.count is None:
                if rec.status == NOT_SUPPORTED and rec.event not in self._warned:
                    self._warned.add(rec.event)
                    log.info(
                        "perf: event %s not supported on this host: field %s stays null",
                        rec.event,
                        field,
                    )
                sums[key] = None
                continue
            scale = _UNIT_SCALE.get(rec.unit)
            if scale is None:
                raise CollectorError(f"perf: event {rec.event} has unknown unit {rec.unit!r}")
            prev = sums.get(key, 0.0)
            sums[key] = None if prev is None else prev + rec.count * scale
        for (sock, field), v in sums.items():
            tot = self.totals.setdefault(sock, {})
            valid = self._valid.setdefault(sock, {})
            valid[field] = v is not None
            if v is not None:
                tot[field] = tot.get(field, 0.0) + v
        self.intervals += 1
        self._new = True

    def reading(self) -> Reading | None:
        """Totals of every socket after the latest complete interval; None if nothing new."""
        if not self._new:
            return None
        self._new = False
        socks = sorted(self.totals, key=lambda s: (len(s), s))
        fields: dict[str, list[int | float | str | None]] = {f.name: [] for f in PERF.fields}
        for sock in socks:
            tot, valid = self.totals[sock], self._valid[sock]
            for name, col in fields.items():
                col.append(round(tot[name]) if valid.get(name) and name in tot else None)
        return Reading("perf", {"socket": socks}, fields)


def uncore_bandwidth_events(root: str | Path = "/") -> dict[str, str]:
    """The memory-bandwidth uncore events this host's PMUs offer (Intel IMC), else {}."""
    devices = proc_path(root, "sys/bus/event_source/devices")
    try:
        imcs = [
            d for d in devices.glob("uncore_imc*") if (d / "events" / "cas_count_read").exists()
        ]
    except OSError:
        return {}
    return dict(UNCORE_BW_EVENTS) if imcs else {}


class PerfCollector:
    """Per-socket hardware counters from one ``perf stat -I`` child (measurement ``perf``).

    ``events`` maps perf event names to perf fields (default: instructions, cycles, LLC loads
    and misses, plus Intel IMC CAS counts as ``mem_bandwidth`` when ``root`` shows them).
    Raises :class:`SourceUnavailable` when perf is missing, may not count system-wide, or
    the host has no hardware counters (a VM without a virtual PMU).
    """

    name = "perf"
    measurements: tuple[str, ...] = ("perf",)
    tier: Tier = "fast"

    def __init__(
        self,
        root: str | Path = "/",
        *,
        interval_ms: int = 100,
        perf: str = "perf",
        events: Mapping[str, str] | None = None,
        probe_timeout_s: float = 10.0,
    ) -> None:
        if interval_ms < 10:
            raise ValueError(f"perf interval_ms must be >= 10 (perf's minimum), got {interval_ms}")
        self.root = Path(root)
        self._proc: subprocess.Popen[bytes] | None = None
        exe = shutil.which(perf)
        if exe is None:
            raise SourceUnavailable(
                f"perf: executable {perf!r} not found on PATH (install linux-perf)"
            )
        self.events = (
            dict(events) if events is not None else {**CORE_EVENTS, **uncore_bandwidth_events(root)}
        )
        self._totals = PerfTotals(self.events)
        self._probe(exe, probe_timeout_s)
        self._messages: deque[str] = deque(maxlen=20)
        self._buf = b""
        cmd = [
            exe,
            "stat",
            "-a",
            "--per-socket",
            "-I",
            str(interval_ms),
            "-x,",
            "-e",
            ",".join(self.events),
        ]
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as e:
            raise SourceUnavailable(f"perf: cannot start {' '.join(cmd)}: {e}") from e
        assert self._proc.stderr is not None
        self._fd = self._proc.stderr.fileno()
        os.set_blocking(self._fd, False)
        log.info("perf: started pid %d: %s", self._proc.pid, " ".join(cmd))

    def _probe(self, exe: str, timeout_s: float) -> None:
        """One short system-wide count of every event: fails fast, with the reason, where
        counting cannot work (permissions, no PMU)."""
        cmd = [exe, "stat", "-a", "-x,", "-e", ",".join(self.events), "--", "true"]
        try:
            res = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SourceUnavailable(f"perf: probe {' '.join(cmd)} failed: {e}") from e
        lines = res.stderr.splitlines()
        if res.returncode != 0:
            tail = "; ".join(x.strip() for x in lines[-3:] if x.strip())
            raise SourceUnavailable(
                f"perf: cannot count system-wide (exit {res.returncode}): {tail}"
            )
        parsed = []
        for x in lines:
            try:
                rec = parse_perf_line(x, interval=False, per_socket=False)
            except ValueError:
                continue  # perf's own notes and warnings
            if rec is not None and rec.event in self.events:
                parsed.append(rec)
        unsupported = sorted(r.event for r in parsed if r.status == NOT_SUPPORTED)
        if parsed and len(unsupported) == len(parsed):
            raise SourceUnavailable(
                "perf: no hardware counters on this host (a VM without a virtual PMU?): "
                + ", ".join(unsupported)
                + f" {NOT_SUPPORTED}"
            )
        if not parsed:
            raise SourceUnavailable(f"perf: probe printed no counts: {res.stderr.strip()[:200]!r}")
        for ev in unsupported:
            log.info("perf: %s %s on this host; its field stays null", ev, NOT_SUPPORTED)

    def _drain(self) -> bool:
        """Feed everything perf has written so far; False once perf closed its output."""
        chunks = []
        eof = False
        while True:
            try:
                b = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            if not b:
                eof = True
                break
            chunks.append(b)
        data = self._buf + b"".join(chunks)
        *lines, self._buf = data.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            try:
                self._totals.feed(text)
            except ValueError:
                self._messages.append(text.strip())  # perf's own warnings/errors
        return not eof

    def collect(self) -> list[Reading]:
        if self._proc is None:
            raise CollectorError("perf: collector is closed")
        alive = self._drain()
        if not alive or self._proc.poll() is not None:
            self._totals.flush()
            r = self._totals.reading()
            rc = self._proc.wait()
            msgs = "; ".join(self._messages) or "no message"
            self.close()
            if r is not None:
                log.warning("perf stat exited (%s): %s", rc, msgs)
                return [r]
            raise CollectorError(f"perf stat exited with status {rc}: {msgs}")
        r = self._totals.reading()
        return [] if r is None else [r]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # perf prints its summary and exits cleanly
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

