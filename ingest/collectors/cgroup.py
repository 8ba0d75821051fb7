"""/sys/fs/cgroup -> ``cgroup``: CPU use, CFS throttling and memory per top-level group.

Top-level groups are the direct children of the cgroup root (system.slice,
user.slice, machine.slice, kubepods.slice, docker ...): the containers and VM slices
whose quota throttling and memory limits hurt a workload silently. ``paths`` adds
deeper groups to watch (relative to the root, e.g. 'kubepods.slice/kubepods-burstable.slice').

cgroup v2 (unified; /sys/fs/cgroup/cgroup.controllers exists): cpu.stat, cpu.max,
memory.current, memory.max, cpu.pressure, memory.pressure.
cgroup v1 (and the v1 side of a hybrid host): the cpu, cpuacct and memory hierarchies
(separate mounts or the combined 'cpu,cpuacct'); times in ns become us; no PSI.
A group missing from a hierarchy gets nulls for that hierarchy's fields.

Unveil's own groups (:func:`is_own`): its long-running units run in ``unveil.slice``
(packaging/systemd: ``Slice=unveil.slice``), so their CPU is one top-level group that the
analytics can set apart (``cpu.own_cores``): Unveil's own work is never evidence of an
inefficiency on the host it runs on. A unit cgroup of ours deeper in the tree (a unit file
without the ``Slice=`` line: ``system.slice/unveil-agent.service``) is found from the
agent's own ``/proc/self/cgroup`` and watched too. A process in a shared group (a login
shell's scope, the root cgroup) cannot be set apart and is not: nothing is subtracted.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from ingest.collectors.base import (
    Block,
    CollectorError,
    Reading,
    SourceUnavailable,
    Value,
    proc_path,
    readings,
)
from ingest.collectors.procfs import ProcFile, parse_runs
from ingest.schema import CGROUP, Tier

#: seconds between two listings of the groups (a new container shows within this)
REFRESH_S = 1.0

#: v1 "unlimited" memory limit is PAGE_COUNTER_MAX pages in bytes (~2**63); treat >= 2**60 as none
_V1_UNLIMITED = 1 << 60


#: the slice Unveil's long-running units run in (packaging/systemd)
OWN_SLICE = "unveil.slice"
#: a unit cgroup of Unveil's own outside the slice (system.slice/unveil-agent.service); the
#: drill's fault groups (unveil-drill-*) are no unit and stay evidence
_OWN_UNIT = re.compile(r"unveil-(agent|scheduler|sweep)\.service")


def is_own(group: str) -> bool:
    """Whether a group (path relative to the cgroup root) holds Unveil's own units."""
    parts = group.strip("/").split("/")
    return parts[0] == OWN_SLICE or _OWN_UNIT.fullmatch(parts[-1]) is not None


def own_cgroup(root: str | Path = "/", version: int = 2) -> str | None:
    """The agent's own cgroup (relative path, from /proc/self/cgroup: the unified line on
    v2, the cpu controller's on v1) when it is one of Unveil's own (:func:`is_own`), else None."""
    try:
        lines = proc_path(root, "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, rel = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if (version == 2 and ctrls == "") or (version == 1 and "cpu" in ctrls.split(",")):
            rel = rel.strip("/")
            return rel if rel and is_own(rel) else None
    return None


#: the files read per group, in order
_V2_FILES: tuple[str, ...] = (
    "cpu.stat", "cpu.max", "memory.current", "memory.max", "cpu.pressure", "memory.pressure",
)
_V1_FILES: tuple[tuple[str, str], ...] = (
    ("acct", "cpuacct.usage"), ("cpu", "cpu.stat"), ("cpu", "cpu.cfs_quota_us"),
    ("cpu", "cpu.cfs_period_us"), ("mem", "memory.usage_in_bytes"), ("mem", "memory.limit_in_bytes"),
)


def _kv(text: str | None) -> dict[str, str]:
    """'usage_usec 83155339\\nuser_usec ...' -> {'usage_usec': '83155339', ...}."""
    out: dict[str, str] = {}
    if text:
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            out[k] = v.strip()
    return out


def _int(text: str | None, path: Path | str) -> int | None:
    if text is None or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        raise CollectorError(f"{path}: expected an integer, got {text[:60]!r}") from None


def _psi_some_total(text: str | None, path: Path | str) -> int | None:
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for p in line.split():
                if p.startswith("total="):
                    return _int(p[6:], path)
    return None


def _children(base: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


class CgroupCollector:
    name = "cgroup"
    measurements: tuple[str, ...] = ("cgroup",)
    tier: Tier = "medium"

    def __init__(
        self, root: str | Path = "/", *, paths: Sequence[str] = (), **options: object
    ) -> None:
        base = proc_path(root, "sys/fs/cgroup")
        self._extra = [p.strip("/") for p in paths if p.strip("/")]
        # files stay open between collects (one pread each instead of open/read/close);
        # None = absent (no PSI, no quota file), asked again when the groups change
        self._files: dict[Path, ProcFile | None] = {}
        self._groups: list[str] = []
        # the group list and each group's directories are looked up at most once a second:
        # three directory scans and a stat per group and hierarchy were most of a collect
        self._listed_at = -1.0
        # per group: its files' paths and the files kept open (None: absent or gone)
        self._plan: list[tuple[str, tuple[Path | None, ...], list[ProcFile | None]]] = []
        self.version: int
        if (base / "cgroup.controllers").exists():
            self.version = 2
            self._v2 = base
            self._watch_own(root)
            return
        self.version = 1
        self._cpu = next(
            (
                base / d
                for d in ("cpu,cpuacct", "cpu", "cpuacct,cpu")
                if (base / d / "cpu.stat").exists()
            ),
            None,
        )
        self._acct = next(
            (
                base / d
                for d in ("cpu,cpuacct", "cpuacct", "cpuacct,cpu")
                if (base / d / "cpuacct.usage").exists()
            ),
            None,
        )
        self._mem = (
            base / "memory" if (base / "memory" / "memory.usage_in_bytes").exists() else None
        )
        if self._cpu is None and self._acct is None and self._mem is None:
            raise SourceUnavailable(
                f"{base}: neither cgroup v2 nor the v1 cpu/cpuacct/memory hierarchies"
            )
        self._watch_own(root)

    def _watch_own(self, root: str | Path) -> None:
        """Watch the agent's own unit cgroup when it lies outside unveil.slice (a top-level
        group, listed anyway): its CPU is set apart by the analytics."""
        own = own_cgroup(root, self.version)
        if own is not None and own.split("/")[0] != OWN_SLICE and own not in self._extra:
            self._extra.append(own)

    def groups(self) -> list[str]:
        """The groups of this collect: top-level children, then the configured paths."""
        if self.version == 2:
            found = _children(self._v2)
        else:
            seen: set[str] = set()
            for h in (self._cpu, self._acct, self._mem):
                if h is not None:
                    seen.update(_children(h))
            found = sorted(seen)
        return found + [p for p in self._extra if p not in found]

    def _open(self, path: Path | None) -> ProcFile | None:
        """A group file kept open; None when absent."""
        if path is None:
            return None
        try:
            return self._files[path]
        except KeyError:
            try:
                f: ProcFile | None = ProcFile(path, whole=True, size=4096)
            except (SourceUnavailable, CollectorError):
                f = None
            self._files[path] = f
            return f

    def _forget_files(self) -> None:
        for f in self._files.values():
            if f is not None:
                f.close()
        self._files = {}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._listed_at < REFRESH_S:
            return
        self._listed_at = now
        names = self.groups()
        if names != self._groups:  # groups came or went: reopen everything lazily
            self._forget_files()
            self._groups = names
        # each group's files in the order of _V2_FILES / _V1_FILES (None: not there);
        # a group in no hierarchy has nothing to say and is left out
        self._plan = []
        for g in names:
            paths: tuple[Path | None, ...]
            if self.version == 2:
                d = self._v2 / g
                if not d.is_dir():
                    continue
                paths = tuple(d / f for f in _V2_FILES)
            else:
                dirs = {
                    key: (h / g if h is not None and (h / g).is_dir() else None)
                    for key, h in (("cpu", self._cpu), ("acct", self._acct), ("mem", self._mem))
                }
                if not any(dirs.values()):
                    continue
                paths = tuple(None if dirs[k] is None else dirs[k] / f for k, f in _V1_FILES)  # type: ignore[operator]
            self._plan.append((g, paths, [self._open(p) for p in paths]))

    def collect(self) -> list[Reading]:
        return readings(self.parse([self.sample()]))

    def sample(self) -> list[tuple[str, tuple[Path | None, ...], list[bytes | None]]]:
        """The tick's reads (each group's files); :meth:`parse` can run later."""
        self._refresh()
        out = []
        for g, paths, files in self._plan:
            data: list[bytes | None] = []
            for k, f in enumerate(files):
                if f is None:
                    data.append(None)
                    continue
                try:
                    data.append(f.read())
                except CollectorError:  # ENODEV: the group was removed since it was opened
                    f.close()
                    files[k] = self._files[paths[k]] = None  # type: ignore[index]
                    data.append(None)
            out.append((g, paths, data))
        return out

    def parse(
        self, raws: list[list[tuple[str, tuple[Path | None, ...], list[bytes | None]]]],
        errors: list[CollectorError] | None = None,
    ) -> list[Block]:
        """Each sample on its own (groups come and go, files are small)."""
        return parse_runs(raws, None, self._parse_one, errors)

    def _parse_one(self, raw: list[tuple[str, tuple[Path | None, ...], list[bytes | None]]]) -> list[Block]:
        fields: dict[str, list[Value]] = {f: [] for f in CGROUP.field_index}
        row = self._row_v2 if self.version == 2 else self._row_v1
        kept: list[str] = []
        for g, paths, data in raw:
            texts = [None if d is None else d.decode("utf-8", "replace").strip() for d in data]
            kept.append(g)
            for k, v in row(paths, texts).items():
                fields[k].append(v)
        return [Block("cgroup", 1, tags={"cgroup": kept}, fields=fields)]

    @staticmethod
    def _row_v2(paths: tuple[Path | None, ...], texts: list[str | None]) -> dict[str, Value]:
        p_stat, p_max, p_cur, p_mmax, p_cpsi, p_mpsi = (p or "" for p in paths)
        t_stat, t_max, t_cur, t_mmax, t_cpsi, t_mpsi = texts
        stat = _kv(t_stat)
        quota: float | None = None
        if t_max:
            q, _, period = t_max.partition(" ")
            if q != "max":
                p = _int(period, p_max)
                quota = (_int(q, p_max) or 0) / p if p else None
        return {
            "cpu_usage": _int(stat.get("usage_usec"), p_stat),
            "nr_periods": _int(stat.get("nr_periods"), p_stat),
            "nr_throttled": _int(stat.get("nr_throttled"), p_stat),
            "throttled_time": _int(stat.get("throttled_usec"), p_stat),
            "cpu_quota_cores": quota,
            "memory_current": _int(t_cur, p_cur),
            "memory_max": _int(t_mmax, p_mmax),
            "cpu_pressure_some": _psi_some_total(t_cpsi, p_cpsi),
            "memory_pressure_some": _psi_some_total(t_mpsi, p_mpsi),
        }

    @staticmethod
    def _row_v1(paths: tuple[Path | None, ...], texts: list[str | None]) -> dict[str, Value]:
        p_usage, p_stat, p_quota, p_period, p_cur, p_lim = (p or "" for p in paths)
        t_usage, t_stat, t_quota, t_period, t_cur, t_lim = texts
        out: dict[str, Value] = dict.fromkeys(CGROUP.field_index)
        usage = _int(t_usage, p_usage)
        out["cpu_usage"] = None if usage is None else usage // 1000  # ns -> us
        stat = _kv(t_stat)
        out["nr_periods"] = _int(stat.get("nr_periods"), p_stat)
        out["nr_throttled"] = _int(stat.get("nr_throttled"), p_stat)
        ns = _int(stat.get("throttled_time"), p_stat)
        out["throttled_time"] = None if ns is None else ns // 1000  # ns -> us
        q = _int(t_quota, p_quota)
        p = _int(t_period, p_period)
        out["cpu_quota_cores"] = q / p if q is not None and q > 0 and p else None
        out["memory_current"] = _int(t_cur, p_cur)
        lim = _int(t_lim, p_lim)
        out["memory_max"] = None if lim is None or lim >= _V1_UNLIMITED else lim
        return out

    def close(self) -> None:
        self._forget_files()
