"""/proc/net/dev -> ``net`` (per interface, loopback skipped); /proc/net/snmp -> ``tcp``.

Both read the network namespace of the agent (run it in the host namespace)."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import Block, Value, proc_path
from ingest.collectors.procfs import (
    DigitTable,
    LayoutCollector,
    ProcFile,
    digit_runs,
    learn_rows,
    line_runs,
    parse_error,
)
from ingest.schema import Tier

#: lake field -> column of /proc/net/dev after the interface name
#: (rx: bytes packets errs drop fifo frame compressed multicast | tx: bytes packets errs drop ...)
_NETDEV_COLS: dict[str, int] = {
    "rx_bytes": 0,
    "rx_packets": 1,
    "rx_errors": 2,
    "rx_dropped": 3,
    "rx_fifo": 4,
    "tx_bytes": 8,
    "tx_packets": 9,
    "tx_errors": 10,
    "tx_dropped": 11,
}

#: lake field -> column name of the 'Tcp:' lines of /proc/net/snmp
_TCP_KEYS: dict[str, bytes] = {
    "in_segs": b"InSegs",
    "out_segs": b"OutSegs",
    "retrans_segs": b"RetransSegs",
    "in_errs": b"InErrs",
    "active_opens": b"ActiveOpens",
}


class NetCollector(LayoutCollector[bytes]):
    name = "net"
    measurements: tuple[str, ...] = ("net",)
    tier: Tier = "medium"

    def __init__(
        self, root: str | Path = "/", *, skip: tuple[str, ...] = ("lo",), **options: object
    ) -> None:
        """``skip``: interface names not reported (loopback by default)."""
        self._file = ProcFile(proc_path(root, "proc/net/dev"))
        self._skip = {s.encode() for s in skip}
        self._digits = DigitTable()  # batches, learnt from a full parse
        self._names: list[str] = []  # the interfaces of the learnt layout

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_full(self, data: bytes) -> list[Block]:
        path = self._file.path
        names: list[str] = []
        fields: dict[str, list[Value]] = {f: [] for f in _NETDEV_COLS}
        cols = list(_NETDEV_COLS.items())
        for lineno, line in enumerate(data.split(b"\n"), start=1):
            if lineno <= 2 or not line:
                continue  # two header lines
            name, sep, rest = line.partition(b":")  # 'eth0:123' has no space on old kernels
            if not sep:
                raise parse_error(path, lineno, line, "expected 'iface: counters'")
            name = name.strip()
            if name in self._skip:
                continue
            parts = rest.split()
            if len(parts) < 16:
                raise parse_error(path, lineno, line, f"expected 16 counters, got {len(parts)}")
            try:
                for f, j in cols:
                    fields[f].append(int(parts[j]))
            except ValueError:
                raise parse_error(path, lineno, line, "not a number") from None
            names.append(name.decode())
        if self._digits.relearn:
            self._learn(data, names, fields)
        return [Block("net", 1, tags={"interface": names}, fields=fields)]

    def _learn(self, data: bytes, names: list[str], fields: dict[str, list[Value]]) -> None:
        def row_of(line: bytes) -> tuple[int, bool] | None:
            name, sep, rest = line.partition(b":")
            if not sep or b"|" in rest:  # the two header lines hold '|'
                return None
            return digit_runs(name + sep), name.strip() not in self._skip  # 'eth0', 'enp65s0f1np1'

        self._names = names
        learn_rows(self._digits, data, row_of, _NETDEV_COLS, fields)

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        """Samples laid out like the learnt one (same interfaces), in one numpy pass."""
        got = self._digits.values(raws)
        if got is None:
            return None
        return [Block("net", len(raws), tags={"interface": self._names}, fields=got)]

    def close(self) -> None:
        self._file.close()


class TcpCollector(LayoutCollector[bytes]):
    name = "tcp"
    measurements: tuple[str, ...] = ("tcp",)
    tier: Tier = "medium"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._file = ProcFile(proc_path(root, "proc/net/snmp"), whole=True)
        self._digits = DigitTable()  # batches, learnt from a full parse

    def sample(self) -> bytes:
        """The tick's read; :meth:`parse` can run later (the agent batches it)."""
        return self._file.read()

    def _parse_full(self, data: bytes) -> list[Block]:
        path = self._file.path
        header: list[bytes] | None = None
        for lineno, line in enumerate(data.split(b"\n"), start=1):
            if not line.startswith(b"Tcp:"):
                continue
            parts = line.split()[1:]
            if header is None:
                header = parts
                continue
            if len(parts) != len(header):
                raise parse_error(
                    path, lineno, line, f"{len(header)} names but {len(parts)} values"
                )
            row = dict(zip(header, parts, strict=True))
            try:
                fields: dict[str, list[Value]] = {
                    f: [int(row[k]) if k in row else None] for f, k in _TCP_KEYS.items()
                }
            except ValueError:
                raise parse_error(path, lineno, line, "not a number") from None
            if self._digits.relearn:
                first = line_runs(data)[lineno - 1]  # 'Tcp:' has no digits; one run per value
                picks = {f: [first + header.index(k)] for f, k in _TCP_KEYS.items() if k in header}
                self._digits.learn(data, picks, expected=fields)
            return [Block("tcp", 1, fields=fields)]
        raise parse_error(path, 0, b"", "no 'Tcp:' lines")

    def _parse_learnt(self, raws: list[bytes]) -> list[Block] | None:
        got = self._digits.values(raws)
        if got is None:
            return None
        none: list[Value] = [None] * len(raws)
        return [Block("tcp", len(raws), fields={f: got.get(f) or none for f in _TCP_KEYS})]

    def close(self) -> None:
        self._file.close()
