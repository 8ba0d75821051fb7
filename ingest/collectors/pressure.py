"""/proc/pressure/{cpu,memory,io} -> ``pressure`` (pressure stall information).

Fast tier: three small files kept open. A kernel without PSI (before 4.20, or booted
with psi=0) has no /proc/pressure: the constructor raises SourceUnavailable. The cpu
file has no ``full`` line before 5.13: those fields are null."""

from __future__ import annotations

from pathlib import Path

from ingest.collectors.base import CollectorError, Reading, SourceUnavailable, Value, proc_path
from ingest.collectors.procfs import ProcFile, parse_error
from ingest.schema import Tier

RESOURCES: tuple[str, ...] = ("cpu", "memory", "io")


def parse_psi(data: bytes, path: str) -> tuple[float | None, int | None, float | None, int | None]:
    """'some avg10=0.12 avg60=.. avg300=.. total=7184376\\nfull ...' ->
    (some_avg10, some_total, full_avg10, full_total); a missing line gives nulls."""
    out: list[float | int | None] = [None, None, None, None]
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line:
            continue
        parts = line.split()
        if parts[0] == b"some":
            base = 0
        elif parts[0] == b"full":
            base = 2
        else:
            raise parse_error(path, lineno, line, "expected 'some' or 'full'")
        try:
            for p in parts[1:]:
                if p[:6] == b"avg10=":
                    out[base] = float(p[6:])
                elif p[:6] == b"total=":
                    out[base + 1] = int(p[6:])
        except ValueError:
            raise parse_error(path, lineno, line, "not a number") from None
    return out[0], out[1], out[2], out[3]  # type: ignore[return-value]


class PressureCollector:
    name = "pressure"
    measurements: tuple[str, ...] = ("pressure",)
    tier: Tier = "fast"

    def __init__(self, root: str | Path = "/", **options: object) -> None:
        self._files: list[tuple[str, ProcFile]] = []
        for r in RESOURCES:
            try:
                self._files.append(
                    (r, ProcFile(proc_path(root, "proc/pressure", r), whole=True, size=4096))
                )
            except SourceUnavailable:
                continue
            except CollectorError as e:
                # psi=0 on the kernel command line: the files exist but reads fail (EOPNOTSUPP)
                raise SourceUnavailable(str(e)) from e
        if not self._files:
            raise SourceUnavailable(
                f"{proc_path(root, 'proc/pressure')} does not exist (kernel without PSI)"
            )
        self._resources = [r for r, _ in self._files]

    def collect(self) -> list[Reading]:
        return self.parse(self.sample())

    def sample(self) -> list[bytes]:
        """The tick's reads; :meth:`parse` can run later (the agent batches it)."""
        return [f.read() for _, f in self._files]

    def parse(self, data: list[bytes]) -> list[Reading]:
        sa: list[Value] = []
        st: list[Value] = []
        fa: list[Value] = []
        ft: list[Value] = []
        for (_, f), raw in zip(self._files, data, strict=True):
            a, b, c, d = parse_psi(raw, f.path)
            sa.append(a)
            st.append(b)
            fa.append(c)
            ft.append(d)
        return [
            Reading(
                "pressure",
                tags={"resource": list(self._resources)},
                fields={"some_avg10": sa, "full_avg10": fa, "some_total": st, "full_total": ft},
            )
        ]

    def close(self) -> None:
        for _, f in self._files:
            f.close()
