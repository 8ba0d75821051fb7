"""/proc/pressure/{cpu,memory,io} -> ``pressure`` (pressure stall information).

Fast tier: three small files kept open. A kernel without PSI (before 4.20, or booted
with psi=0) has no /proc/pressure: the constructor raises SourceUnavailable. The cpu
file has no ``full`` line before 5.13: those fields are null."""

from __future__ import annotations

from pathlib import Path

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
    line_runs,
    parse_error,
)
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


class PressureCollector(LayoutCollector[list[bytes]]):
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
        self._digits = DigitTable()  # batches of the files joined, learnt from a full parse

    def sample(self) -> list[bytes]:
        """The tick's reads; :meth:`parse` can run later (the agent batches it)."""
        return [f.read() for _, f in self._files]

    def _parse_full(self, data: list[bytes]) -> list[Block]:
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
        fields: dict[str, list[Value]] = {"some_avg10": sa, "full_avg10": fa, "some_total": st, "full_total": ft}
        if self._digits.relearn:
            self._learn(data, fields)
        return [Block("pressure", 1, tags={"resource": self._resources}, fields=fields)]

    def _learn(self, data: list[bytes], fields: dict[str, list[Value]]) -> None:
        """Where the values lie among the digit runs of the files joined by newlines:
        'some avg10=I.FF avg60=.. avg300=.. total=T' holds 10 runs, avg10's I and FF
        the 2nd and 3rd ('10' of its name the 1st), T the 10th."""
        joined = b"\n".join(data)
        starts = line_runs(joined)
        picks: dict[str, list[int]] = {}
        labels: list[int] = []
        for i, line in enumerate(joined.split(b"\n")):
            kind = line[:5].decode("ascii", "replace")
            if kind not in ("some ", "full "):
                continue
            labels += [starts[i], starts[i] + 3, starts[i] + 6]  # avg10, avg60, avg300
            for key, at in (("_i", 1), ("_f", 2), ("_total", 9)):
                picks.setdefault(kind[:4] + key, []).append(starts[i] + at)
        if any(len(v) != len(self._resources) for v in picks.values()):
            self._digits.disable(joined)  # a 'full' line in some files only (cpu before 5.13)
            return
        totals: dict[str, list[Value]] = {f: fields[f] for f in ("some_total", "full_total") if f in picks}
        self._digits.learn(joined, picks, labels=labels, expected=totals)
        got = self._digits.values([joined])
        averages = {f: fields[f] for f in ("some_avg10", "full_avg10") if f"{f[:4]}_i" in picks}
        if got is None or self._avg10(got) != averages:
            self._digits.disable()

    @staticmethod
    def _avg10(got: dict[str, list[Value]]) -> dict[str, list[Value]]:
        # (I * 100 + FF) / 100 is the double nearest I.FF, as float(b"I.FF") gives
        return {
            f"{k}_avg10": [(i * 100 + f) / 100 for i, f in zip(got[k + "_i"], got[k + "_f"], strict=True)]  # type: ignore[operator]
            for k in ("some", "full") if k + "_i" in got
        }

    def _parse_learnt(self, raws: list[list[bytes]]) -> list[Block] | None:
        got = self._digits.values([b"\n".join(r) for r in raws])
        if got is None:
            return None
        none: list[Value] = [None] * (len(raws) * len(self._resources))
        fields = {"some_avg10": none, "full_avg10": none, "some_total": got["some_total"],
                  "full_total": got.get("full_total") or none}
        fields.update(self._avg10(got))
        return [Block("pressure", len(raws), tags={"resource": self._resources}, fields=fields)]

    def close(self) -> None:
        for _, f in self._files:
            f.close()
