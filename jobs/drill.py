"""``unveil drill``: real, reversible faults on the host it runs on, watched by the real agent
and scheduler, scored per fault.

Every fault is a small class with ``apply()``/``restore()`` and the knowledge-base entry it
should be identified as (``None`` where the KB has none: the scorecard says so). Guaranteed
restore rests on one rule: **the state file records what to undo before each change is
made** (``<lake>/_drill/state.json``, 0600, written atomically). A drill that ends, fails or
gets SIGINT/SIGTERM restores in its ``finally``; one killed with -9 leaves the state file,
and ``unveil drill --restore`` undoes it. Restore is idempotent (undoing an undone change is
a no-op) and validates the whole file before touching anything: sysfs paths must lie under
/sys/kernel/mm/transparent_hugepage or /sys/fs/cgroup, names must carry the drill's prefix,
processes must carry the drill's marker in their environment, so a forged state file cannot
make it write, kill or delete anything else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import polars as pl

from ingest.atomic import write_atomic

log = logging.getLogger(__name__)

PREFIX = "unveil-drill"
#: veth names are limited to 15 characters (IFNAMSIZ - 1): a shorter prefix of our own
LINK_PREFIX = "uvdrill"
MARK_ENV = "UNVEIL_DRILL_RUN"
STATE_DIR = "_drill"
STATE_FILE = "state.json"
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SCORECARD_TABLE = "drill_scorecard"
#: values the THP knobs take (enabled, defrag, shmem_enabled); anything else in a state file is forged
THP_VALUES = frozenset({"always", "madvise", "never", "defer", "defer+madvise", "within_size", "advise",
                        "deny", "force"})
_NAME = re.compile(rf"^(?:{PREFIX}|{LINK_PREFIX})[a-z0-9-]{{0,40}}$")


class DrillError(Exception):
    """A drill that cannot start, or a state file that cannot be trusted; the message says why."""


class DrillInterrupted(Exception):
    """SIGINT/SIGTERM during a drill: unwinds to the restore in ``finally``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --------------------------------------------------------------------------- state file


def state_path(lake: str | os.PathLike[str]) -> Path:
    return Path(lake) / STATE_DIR / STATE_FILE


def _write_private_atomic(path: Path, text: str) -> None:
    """0600 temp file, fsync, rename, fsync the directory: the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, text, mode=0o600)


class State:
    """The undo log of one drill: entries in the order the changes were made."""

    def __init__(self, path: Path, run_id: str, entries: list[dict[str, Any]] | None = None) -> None:
        self.path = path
        self.run_id = run_id
        self.entries: list[dict[str, Any]] = entries if entries is not None else []

    def save(self) -> None:
        _write_private_atomic(self.path, json.dumps({"version": 1, "run_id": self.run_id,
                                                     "entries": self.entries}, indent=1))

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Add ``entry`` and persist it: call BEFORE the change it undoes."""
        validate_entry(entry, self.path.parent)
        self.entries.append(entry)
        self.save()
        return entry

    def forget(self, entries: Sequence[dict[str, Any]]) -> None:
        """Drop entries whose change is undone (persisted)."""
        ids = {id(e) for e in entries}
        self.entries = [e for e in self.entries if id(e) not in ids]
        self.save()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @classmethod
    def load(cls, path: Path) -> State:
        """The state file, validated entry by entry (DrillError naming the entry otherwise)."""
        try:
            st = path.lstat()
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise DrillError(f"drill state file {path} is unreadable: {exc}") from None
        if not path.is_file() or path.is_symlink():
            raise DrillError(f"drill state file {path} is not a regular file")
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise DrillError(f"drill state file {path} must be owned by root with mode 0600 "
                             f"(is uid {st.st_uid}, mode {st.st_mode & 0o777:o})")
        if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("entries"), list):
            raise DrillError(f"drill state file {path}: expected version 1 with a list of entries")
        run_id = doc.get("run_id")
        if not isinstance(run_id, str) or not re.fullmatch(r"[0-9a-f]{8,32}", run_id):
            raise DrillError(f"drill state file {path}: bad run_id {run_id!r}")
        for i, e in enumerate(doc["entries"]):
            try:
                validate_entry(e, path.parent)
            except DrillError as exc:
                raise DrillError(f"drill state file {path}: entry {i}: {exc}") from None
        return cls(path, run_id, doc["entries"])


def _under(path: Path, root: Path) -> bool:
    """``path`` (with no symlink or '..' games) lies strictly below ``root``."""
    if ".." in path.parts or not path.is_absolute():
        return False
    resolved = Path(os.path.realpath(path))
    return resolved != root and resolved.is_relative_to(root) and resolved == path


def validate_entry(e: Any, drill_dir: Path) -> None:
    """Refuse an entry that would make restore write, kill or delete anything not the drill's own."""
    if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
        raise DrillError(f"not an entry: {e!r}")
    kind = e["kind"]
    if kind == "thp":
        p, v = e.get("path"), e.get("value")
        if not isinstance(p, str) or not _under(Path(p), THP_DIR) or Path(p).name not in (
                "enabled", "defrag", "shmem_enabled"):
            raise DrillError(f"THP path {p!r} is not a knob under {THP_DIR}")
        for val in (v, e.get("set", v)):
            if val not in THP_VALUES:
                raise DrillError(f"THP value {val!r} is not one of {sorted(THP_VALUES)}")
    elif kind == "cgroup":
        p = e.get("path")
        if not isinstance(p, str) or not _under(Path(p), CGROUP_ROOT) or not _NAME.match(Path(p).name):
            raise DrillError(f"cgroup {p!r} is not a drill cgroup ({PREFIX}*) under {CGROUP_ROOT}")
    elif kind in ("proc", "move"):
        if not isinstance(e.get("pid"), int) or isinstance(e.get("pid"), bool) or e["pid"] <= 1:
            raise DrillError(f"bad pid {e.get('pid')!r}")
        if not isinstance(e.get("start"), int):
            raise DrillError(f"bad process start time {e.get('start')!r}")
        if kind == "move":
            p = e.get("path")
            if not isinstance(p, str) or not (_under(Path(p), CGROUP_ROOT) or Path(p) == CGROUP_ROOT):
                raise DrillError(f"cgroup {p!r} to move back to is not under {CGROUP_ROOT}")
    elif kind in ("netns", "link"):
        n = e.get("name")
        if not isinstance(n, str) or not _NAME.match(n) or len(n) > (40 if kind == "netns" else 15):
            raise DrillError(f"{kind} name {n!r} is not one of the drill's ({PREFIX}*/{LINK_PREFIX}*)")
    elif kind == "file":
        p = e.get("path")
        if (not isinstance(p, str) or ".." in Path(p).parts or Path(p).parent != drill_dir
                or not Path(p).name.startswith(PREFIX)):
            raise DrillError(f"scratch file {p!r} is not a drill file ({PREFIX}*) in {drill_dir}")
    else:
        raise DrillError(f"unknown entry kind {kind!r}")


# ----------------------------------------------------------------------- processes


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): with the pid, a process's identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None  # a zombie has exited
    return int(fields[19])


def _is_ours(pid: int, start: int, run_id: str) -> bool:
    """The same process we started: same start time and our marker in its environment."""
    if _start_time(pid) != start:
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARK_ENV}={run_id}".encode() in env


def alive(pid: int) -> bool:
    return _start_time(pid) is not None


#: runs only once the drill has recorded it (the pipe says "g"); a drill dead before that closes
#: the pipe and the child exits instead of running unrecorded
_GATE = ("import os, sys\n"
         "if os.read(int(sys.argv[1]), 1) != b'g': sys.exit(1)\n"
         "os.execvp(sys.argv[2], sys.argv[2:])")


class Procs:
    """Processes the drill starts: each in its own session, marked, recorded before it runs."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.popen: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, argv: Sequence[str], *, log_path: Path | None = None, role: str = "") -> dict[str, Any]:
        env = dict(os.environ)
        env[MARK_ENV] = self.state.run_id
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            # stopped by a pipe until recorded: a crash between spawn and record leaves no stray
            r, w = os.pipe()
            gate = [sys.executable, "-c", _GATE, str(r), *argv]
            p = subprocess.Popen(gate, env=env, stdout=out, stderr=subprocess.STDOUT if log_path else out,
                                 stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(r,))
        finally:
            if log_path:
                out.close()  # type: ignore[union-attr]
        os.close(r)
        start = None
        for _ in range(200):
            start = _start_time(p.pid)
            if start is not None:
                break
            time.sleep(0.005)
        try:
            entry = self.state.record({"kind": "proc", "pid": p.pid, "start": start or 0, "role": role})
        except BaseException:  # not recorded (a signal, a full disk): the child must not run
            os.close(w)
            p.wait()
            raise
        os.write(w, b"g")
        os.close(w)
        self.popen[p.pid] = p
        return entry

    def reap(self) -> None:
        for pid, p in list(self.popen.items()):
            if p.poll() is not None:
                del self.popen[pid]


def _kill_group(pid: int, start: int, run_id: str, *, grace_s: float = 3.0,
                popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the drill process (and its session), SIGKILL after ``grace_s``; waits until gone."""
    if not _is_ours(pid, start, run_id):
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(1)
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # started with start_new_session: pid == its group id
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if popen is not None and popen.poll() is not None:
                return
            if not alive(pid):
                return
            time.sleep(0.02)


# ------------------------------------------------------------------------ restore


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _netns_exists(name: str) -> bool:
    return (Path("/run/netns") / name).exists()


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _undo(e: dict[str, Any], run_id: str, procs: Procs | None) -> None:
    kind = e["kind"]
    if kind == "thp":
        p = Path(e["path"])
        now = _thp_value(p)
        if now == e["value"]:
            return
        if now != e.get("set", now):
            # someone (an operator, a remediation) chose a mode since: theirs stands
            log.warning("%s is %s, not the drill's %s: left as it is (was %s before the drill)",
                        p, now, e["set"], e["value"])
            return
        p.write_text(e["value"])
    elif kind == "proc":
        # the agent commits its buffered rows and the scheduler ends its cycle on SIGTERM
        grace = 20.0 if e.get("role") in ("agent", "scheduler") else 3.0
        _kill_group(e["pid"], e["start"], run_id, grace_s=grace,
                    popen=procs.popen.get(e["pid"]) if procs else None)
    elif kind == "move":
        procs_file = Path(e["path"]) / "cgroup.procs"
        if _is_ours(e["pid"], e["start"], run_id) and procs_file.exists():
            with contextlib.suppress(ProcessLookupError):
                procs_file.write_text(str(e["pid"]))
    elif kind == "cgroup":
        _remove_cgroup(Path(e["path"]), run_id)
    elif kind == "link":
        if _link_exists(e["name"]):
            _ip("link", "del", e["name"], check=False)
    elif kind == "netns":
        if _netns_exists(e["name"]):
            r = _ip("netns", "del", e["name"], check=False)
            if r.returncode and _netns_exists(e["name"]):
                raise DrillError(f"cannot delete network namespace {e['name']}: {r.stderr.strip()}")
    elif kind == "file":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(e["path"])


def _remove_cgroup(path: Path, run_id: str) -> None:
    """rmdir the drill's cgroup once its processes (ours: killed; others: moved to the parent) left."""
    if not path.is_dir():
        return
    for _ in range(100):
        try:
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        for pid in pids:  # processes not recorded (a forked child): back to the parent group
            with contextlib.suppress(OSError):
                (path.parent / "cgroup.procs").write_text(str(pid))
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    raise DrillError(f"cannot remove cgroup {path}: processes are still in it")


def restore(state: State, procs: Procs | None = None, entries: Sequence[dict[str, Any]] | None = None) -> list[str]:
    """Undo ``entries`` (default: all) newest first; each undone entry leaves the state file
    at once. Failures are collected, the rest still undone; the list names them."""
    todo = list(entries if entries is not None else state.entries)
    errors: list[str] = []
    for e in reversed(todo):
        try:
            _undo(e, state.run_id, procs)
        except (OSError, subprocess.SubprocessError, DrillError) as exc:
            errors.append(f"{e['kind']} {e.get('path') or e.get('name') or e.get('pid')}: {exc}")
            continue
        state.forget([e])
    if procs is not None:
        procs.reap()
    return errors


def restore_from_file(lake: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """``unveil drill --restore``: (entries undone, errors). Validates before touching anything."""
    _require_root("unveil drill --restore")
    path = state_path(lake)
    try:
        state = State.load(path)
    except FileNotFoundError:
        return 0, []
    n = len(state.entries)
    errors = restore(state)
    if not errors:
        state.remove()
    return n - len(state.entries), errors


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise DrillError(f"{what} changes kernel settings, cgroups and network namespaces: run it as root")


# -------------------------------------------------------------------------- faults


def _thp_value(path: Path) -> str:
    """The selected value of a THP knob: the bracketed word of 'always [madvise] never'."""
    text = path.read_text()
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.strip()


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


_BURN = "import sys\nwhile True: pass"

_DISK = r"""
import os, sys, time
path, size = sys.argv[1], int(sys.argv[2]) << 20
block = os.urandom(1 << 20)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
off = 0
while True:
    for _ in range(8):
        os.pwrite(fd, block, off)
        off = (off + len(block)) % size
    os.fsync(fd)  # the writes reach the device: queue depth and await, not just page cache
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.pread(fd, 1 << 20, (off * 7) % size)
"""

_MEMORY = r"""
import mmap, sys, time
import numpy as np
open('/proc/self/oom_score_adj', 'w').write('1000')  # the OOM killer takes the hog first
floor, cap = int(sys.argv[1]) << 20, int(sys.argv[2]) << 20
def available():
    for line in open('/proc/meminfo'):
        if line.startswith('MemAvailable:'):
            return int(line.split()[1]) << 10
    return 0
maps, total, step = [], 0, 64 << 20
while total < cap:
    if available() - step < floor:
        time.sleep(0.2)
        if available() - step < floor:
            break
    m = mmap.mmap(-1, step, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    np.frombuffer(m, dtype=np.uint8)[::4096] = 1
    maps.append(m)
    total += step
print(f"holding {total >> 20} MiB", flush=True)
while True:  # keep the pages hot so reclaim has to scan the page cache, not our memory
    for m in maps:
        np.frombuffer(m, dtype=np.uint8)[::4096] += 1
    # others need memory after all: give some back rather than starve them (pressure stays)
    while maps and available() < floor // 2:
        maps.pop().close()
    time.sleep(0.5)
"""

_NET_SERVER = r"""
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)
def sink(c):
    while c.recv(1 << 16):
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=sink, args=(c,), daemon=True).start()
"""

# paced (~3 MB/s, ~2000 segments/s): a stream across a lossy path, not a CPU load of its own
# on a small host (unpaced, the pair moves ~40000 segments/s and keeps two cores busy)
_NET_CLIENT = r"""
import socket, sys, time
buf = b"x" * (1 << 16)
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        while True:
            c.sendall(buf)
            time.sleep(0.02)
    except OSError:
        time.sleep(0.2)
"""


@dataclass
class Context:
    """What a fault may use: the undo log, the process starter, the lake's scratch dir, the workload."""

    state: State
    procs: Procs
    drill_dir: Path
    workload_pid: int | None = None
    workload_start: int | None = None


class Fault:
    name: ClassVar[str]
    expected_entry: ClassVar[str | None]

    def __init__(self) -> None:
        self.method = ""
        self.entries: list[dict[str, Any]] = []

    def available(self) -> str | None:
        """None when the fault can run here, else why not (the scorecard says so)."""
        return None

    def apply(self, ctx: Context) -> None:
        raise NotImplementedError

    def record(self, ctx: Context, entry: dict[str, Any]) -> dict[str, Any]:
        self.entries.append(ctx.state.record(entry))
        return entry

    def spawn(self, ctx: Context, argv: Sequence[str], role: str) -> dict[str, Any]:
        e = ctx.procs.spawn(argv, role=role)
        self.entries.append(e)
        return e

    def restore(self, ctx: Context) -> list[str]:
        errors = restore(ctx.state, ctx.procs, self.entries)
        self.entries = [e for e in self.entries if e in ctx.state.entries]
        return errors


class ThpFault(Fault):
    """Transparent huge pages off (enabled and defrag = never)."""

    name = "thp"
    expected_entry = "thp_coverage_loss"

    def available(self) -> str | None:
        return None if (THP_DIR / "enabled").exists() else f"no {THP_DIR}"

    def apply(self, ctx: Context) -> None:
        already = []
        for knob in ("enabled", "defrag"):
            p = THP_DIR / knob
            if not p.exists():
                continue
            before = _thp_value(p)
            if before == "never":
                already.append(knob)
            self.record(ctx, {"kind": "thp", "path": str(p), "value": before, "set": "never"})
            p.write_text("never")
        # a knob already off (by someone else) makes the fault weaker or a no-op: say so
        self.method = "enabled, defrag = never" + (f" ({', '.join(already)} already never)" if already else "")


@dataclass
class CgroupLayout:
    version: int
    cpu_root: Path

    def quota_files(self, quota_us: int, period_us: int) -> list[tuple[str, str]]:
        if self.version == 2:
            return [("cpu.max", f"{quota_us} {period_us}")]
        return [("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", str(quota_us))]

    def cgroup_of(self, pid: int) -> Path | None:
        """The cpu cgroup directory a process is in (from /proc/PID/cgroup)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, ctrls, rel = line.split(":", 2)
            if (self.version == 2 and ctrls == "") or (self.version == 1 and "cpu" in ctrls.split(",")):
                return self.cpu_root / rel.lstrip("/") if rel != "/" else self.cpu_root
        return None


def cgroup_layout(root: Path = CGROUP_ROOT) -> CgroupLayout | str:
    """v2 (unified at the root, cpu controller delegated) or v1 (a cpu hierarchy); else why not."""
    if (root / "cgroup.controllers").exists():
        if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
            return f"cgroup v2 at {root}: the cpu controller is not enabled in cgroup.subtree_control"
        return CgroupLayout(2, root)
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").exists():
            # cpu is a symlink to cpu,cpuacct on some hosts: the state file holds real paths
            return CgroupLayout(1, Path(os.path.realpath(root / name)))
    return f"no cgroup cpu controller under {root} (neither v2 nor a v1 cpu hierarchy)"


class QuotaFault(Fault):
    """A CPU quota (``quota`` CPUs) on a cgroup holding the workload (or a CPU burner without one)."""

    name = "quota"
    expected_entry = "cgroup_cpu_throttle"

    def __init__(self, quota_cpus: float = 0.2) -> None:
        super().__init__()
        self.quota_cpus = quota_cpus
        self.layout = cgroup_layout()

    def available(self) -> str | None:
        return self.layout if isinstance(self.layout, str) else None

    def apply(self, ctx: Context) -> None:
        assert isinstance(self.layout, CgroupLayout)
        period = 100_000
        cg = self.layout.cpu_root / f"{PREFIX}-quota"
        self.record(ctx, {"kind": "cgroup", "path": str(cg)})
        cg.mkdir(exist_ok=True)
        for fname, value in self.layout.quota_files(int(self.quota_cpus * period), period):
            (cg / fname).write_text(value)
        targets: list[tuple[int, int]] = []
        who = "a CPU burner"
        if ctx.workload_pid is not None and ctx.workload_start is not None and alive(ctx.workload_pid):
            old = self.layout.cgroup_of(ctx.workload_pid)
            if old is not None:
                self.record(ctx, {"kind": "move", "pid": ctx.workload_pid, "start": ctx.workload_start,
                                  "path": str(old)})
                targets.append((ctx.workload_pid, ctx.workload_start))
                who = "the workload"
        if not targets:
            e = self.spawn(ctx, _python(_BURN, f"{PREFIX}-burn"), "quota burner")
            targets.append((e["pid"], e["start"]))
        for pid, _ in targets:
            (cg / "cgroup.procs").write_text(str(pid))
        self.method = f"cgroup v{self.layout.version} {cg.name}: {self.quota_cpus:g} CPU on {who}"


class CpuFault(Fault):
    """CPU contention: one busy process per CPU (a noisy neighbour)."""

    name = "cpu"
    expected_entry = "cpu_noisy_neighbour"

    def __init__(self, n: int | None = None) -> None:
        super().__init__()
        self.n = n or os.cpu_count() or 1

    def apply(self, ctx: Context) -> None:
        self.method = f"{self.n} busy process(es)"
        for _ in range(self.n):
            self.spawn(ctx, _python(_BURN, f"{PREFIX}-cpu"), "cpu burner")


class DiskFault(Fault):
    """Disk contention: writers doing fsync'd writes and uncached reads on a scratch file in the lake's
    file system."""

    name = "disk"
    expected_entry = "storage_contention"

    def __init__(self, writers: int = 2, size_mib: int = 256) -> None:
        super().__init__()
        self.writers, self.size_mib = writers, size_mib

    def apply(self, ctx: Context) -> None:
        self.method = f"{self.writers} fsync writer(s) on {self.size_mib} MiB files in {ctx.drill_dir}"
        for i in range(self.writers):
            path = ctx.drill_dir / f"{PREFIX}-disk{i}.bin"
            self.record(ctx, {"kind": "file", "path": str(path)})
            self.spawn(ctx, _python(_DISK, str(path), str(self.size_mib)), "disk writer")


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) << 10
    return out


class MemoryFault(Fault):
    """Memory pressure: a hog (oom_score_adj 1000) takes memory until only ``floor`` is available."""

    name = "memory"
    expected_entry = "memory_pressure"

    def __init__(self, floor_mib: int | None = None, cap_mib: int | None = None) -> None:
        super().__init__()
        total = meminfo()["MemTotal"] >> 20
        self.floor_mib = floor_mib if floor_mib is not None else max(512, total // 25)
        self.cap_mib = cap_mib if cap_mib is not None else total

    def apply(self, ctx: Context) -> None:
        self.method = f"hog down to {self.floor_mib} MiB available (at most {self.cap_mib} MiB)"
        self.spawn(ctx, _python(_MEMORY, str(self.floor_mib), str(self.cap_mib)), "memory hog")


class NetemFault(Fault):
    """Packet loss and delay on a veth pair into a network namespace of the drill's own, with TCP
    traffic across it. tc netem when the kernel has sch_netem; else the same random loss by
    nftables (``numgen random``) inside the namespace, both directions, without the delay; else
    a tbf rate limit with a short queue (drops and queueing delay of a bottleneck: TCP's own
    congestion probing, ~1 % of segments resent on this VM, not path loss). The scorecard
    names the method."""

    name = "netem"
    expected_entry = "tcp_retransmissions"
    NS = f"{PREFIX}-net"
    HOST_LINK, NS_LINK = f"{LINK_PREFIX}-h", f"{LINK_PREFIX}-n"
    HOST_IP, NS_IP, PORT = "10.213.77.1", "10.213.77.2", 5301

    def __init__(self, loss_pct: float = 5.0, delay_ms: int = 50) -> None:
        super().__init__()
        self.loss_pct, self.delay_ms = loss_pct, delay_ms

    def available(self) -> str | None:
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return f"no '{tool}' command"
        return None

    def apply(self, ctx: Context) -> None:
        self.record(ctx, {"kind": "netns", "name": self.NS})
        _ip("netns", "add", self.NS)
        self.record(ctx, {"kind": "link", "name": self.HOST_LINK})
        _ip("link", "add", self.HOST_LINK, "type", "veth", "peer", "name", self.NS_LINK)
        _ip("link", "set", self.NS_LINK, "netns", self.NS)
        _ip("addr", "add", f"{self.HOST_IP}/30", "dev", self.HOST_LINK)
        _ip("link", "set", self.HOST_LINK, "up")
        _ip("-n", self.NS, "addr", "add", f"{self.NS_IP}/30", "dev", self.NS_LINK)
        _ip("-n", self.NS, "link", "set", self.NS_LINK, "up")
        _ip("-n", self.NS, "link", "set", "lo", "up")
        # both directions: the data path (host -> ns) and the ACK path
        self.method = self._qdisc(self.HOST_LINK, [])
        if self.method.startswith("tc netem"):
            self._qdisc(self.NS_LINK, ["ip", "netns", "exec", self.NS])
        elif self._nft_loss():
            self.method = (f"no sch_netem in this kernel: nftables random loss {self.loss_pct:g}% each way "
                           "in the drill's namespace (no added delay)")
        else:
            self.method = self._tbf(self.HOST_LINK, [])
            self._tbf(self.NS_LINK, ["ip", "netns", "exec", self.NS])
        self.spawn(ctx, ["ip", "netns", "exec", self.NS, *_python(_NET_SERVER, self.NS_IP, str(self.PORT))],
                   "netem server")
        self.spawn(ctx, _python(_NET_CLIENT, self.NS_IP, str(self.PORT)), "netem client")

    def _qdisc(self, dev: str, prefix: list[str]) -> str:
        netem = ["netem", "loss", f"{self.loss_pct:g}%", "delay", f"{self.delay_ms}ms"]
        r = subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", *netem],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return "tc netem " + " ".join(netem[1:])
        if "unknown" not in r.stderr.lower():
            raise DrillError(f"tc qdisc add dev {dev} netem: {r.stderr.strip()}")
        return "no sch_netem"

    def nft_rules(self) -> str:
        """An nftables table dropping ``loss_pct`` % of the packets entering and leaving the
        namespace at random (netem's ``loss``; in 1/10000 steps)."""
        n = round(self.loss_pct * 100)
        rule = f"numgen random mod 10000 < {n} counter drop"
        return (f"table inet {LINK_PREFIX} {{\n"
                f"  chain input {{ type filter hook input priority 0; policy accept; {rule}; }}\n"
                f"  chain output {{ type filter hook output priority 0; policy accept; {rule}; }}\n}}\n")

    def _nft_loss(self) -> bool:
        """The random loss by nftables in the namespace; False where nft is missing or the kernel
        refuses the table (no nf_tables, no numgen)."""
        if shutil.which("nft") is None:
            return False
        # the namespace's own ruleset: it goes with the namespace, the host's is not touched
        r = subprocess.run(["ip", "netns", "exec", self.NS, "nft", "-f", "-"], input=self.nft_rules(),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            log.warning("drill netem: nft refused the loss table (%s); falling back on tbf", r.stderr.strip())
        return r.returncode == 0

    def _tbf(self, dev: str, prefix: list[str]) -> str:
        tbf = ["tbf", "rate", "2mbit", "burst", "16kb", "latency", f"{max(self.delay_ms, 10)}ms"]
        subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", *tbf], capture_output=True,
                       text=True, timeout=30, check=True)
        return "no sch_netem in this kernel: tc " + " ".join(tbf) + " (tail drops + queueing delay)"


FAULTS: dict[str, Callable[[], Fault]] = {
    "thp": ThpFault, "quota": QuotaFault, "cpu": CpuFault, "disk": DiskFault, "memory": MemoryFault,
    "netem": NetemFault,
}


def parse_faults(text: str) -> list[str]:
    names = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in names if f not in FAULTS]
    if bad or not names:
        raise DrillError(f"--faults: unknown fault(s) {', '.join(bad) or '(none given)'} "
                         f"(known: {', '.join(FAULTS)})")
    if len(set(names)) != len(names):
        raise DrillError(f"--faults: a fault is listed twice in {text!r}")
    return names


# ----------------------------------------------------------------------------- run


@dataclass
class DrillConfig:
    lake: Path
    faults: list[str] = field(default_factory=lambda: list(FAULTS))
    fault_s: float = 60.0
    recovery_s: float = 60.0
    healthy_s: float = 180.0
    workload: str = "builtin"  # builtin | none | a command line
    every_s: float = 60.0
    lag_s: float = 15.0
    commit_s: float = 5.0
    host: str = ""
    config_file: str | None = None
    catchup_timeout_s: float | None = None
    out: Callable[[str], None] = print


@dataclass
class FaultWindow:
    fault: str
    expected_entry: str | None
    method: str
    onset: datetime
    restored: datetime
    recovered: datetime
    skipped: str | None = None


def _signals_raise() -> dict[int, Any]:
    def handler(signum: int, _frame: FrameType | None) -> None:
        raise DrillInterrupted(signum)

    old: dict[int, Any] = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        old[s] = signal.signal(s, handler)
    return old


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """While restoring, a second Ctrl-C must not cut the restore short."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _workload_argv(spec: str, seconds: float) -> list[str] | None:
    if spec == "none":
        return None
    if spec == "builtin":
        return [sys.executable, "-m", "jobs.workloads", "--seconds", f"{seconds:.0f}", "--mib", "1024"]
    argv = shlex.split(spec)
    if not argv:
        raise DrillError("--workload: empty command")
    return argv


def _cli(cfg: DrillConfig, *args: str) -> list[str]:
    return [sys.executable, "-m", "jobs.cli", *(["--config", cfg.config_file] if cfg.config_file else []), *args]


#: a key of the drill's first sightings: an incident id, or (incident id, entry id)
Seen = str | tuple[str, str | None]


class IncidentWatch:
    """When each incident first became visible in the lake, polled while the drill waits: a
    file's mtime would not do, compaction rewrites incident files minutes later."""

    def __init__(self, lake: Path, host: str) -> None:
        self.lake, self.host = lake, host
        self.files: set[Path] = set()
        # incident id, and (incident id, entry): an open incident's entry can change
        self.first_seen: dict[Seen, datetime] = {}

    def poll(self) -> None:
        from ingest import lake as lake_mod

        try:
            files = lake_mod.files(self.lake, "incidents", hosts=[self.host])
        except (lake_mod.LakeError, OSError):
            return
        now = datetime.now(UTC)
        for f in files:
            if f in self.files:
                continue
            try:
                rows = pl.read_parquet(f, columns=["incident_id", "entry_id"], hive_partitioning=False)
            except (OSError, pl.exceptions.PolarsError):
                continue  # merged away between the listing and the read: its rows are in the new file
            self.files.add(f)
            for i, e in rows.iter_rows():
                self.first_seen.setdefault(i, now)
                self.first_seen.setdefault((i, e), now)

    def hold(self, seconds: float, sleep: Callable[[float], None], step: float = 2.0) -> None:
        """Sleep ``seconds``, polling every ``step``."""
        deadline = time.monotonic() + seconds
        while True:
            self.poll()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sleep(min(step, left))


def run_drill(cfg: DrillConfig, *, sleep: Callable[[float], None] = time.sleep) -> pl.DataFrame:
    """The whole drill: agent + scheduler + workload, healthy minutes, then each fault (apply, hold,
    restore, recover); then the scorecard (printed, written to the lake, returned)."""
    _require_root("unveil drill")
    faults = [FAULTS[n]() for n in cfg.faults]
    drill_dir = cfg.lake / STATE_DIR
    cfg.lake.mkdir(parents=True, exist_ok=True)
    drill_dir.mkdir(exist_ok=True, mode=0o700)
    path = state_path(cfg.lake)
    if path.exists():
        raise DrillError(f"a previous drill left {path}: run 'unveil drill --restore --lake {cfg.lake}' first")
    state = State(path, secrets.token_hex(8))
    state.save()
    procs = Procs(state)
    old_handlers = _signals_raise()
    windows: list[FaultWindow] = []
    watch = IncidentWatch(cfg.lake, cfg.host)
    total_s = cfg.healthy_s + len(faults) * (cfg.fault_s + cfg.recovery_s) + 600
    started = datetime.now(UTC)
    run_id = state.run_id
    try:
        procs.spawn(_cli(cfg, "agent", "--lake", str(cfg.lake), "--host", cfg.host, "--flush-interval",
                         f"{min(2.0, cfg.commit_s)}", "--commit-interval", f"{cfg.commit_s}", "--quiet"),
                    log_path=drill_dir / "agent.log", role="agent")
        procs.spawn(_cli(cfg, "schedule", "--lake", str(cfg.lake), "--every", f"{cfg.every_s}s", "--lag",
                         f"{cfg.lag_s}s", "--no-progress", "--hosts", cfg.host),
                    log_path=drill_dir / "scheduler.log", role="scheduler")
        ctx = Context(state, procs, drill_dir)
        wl = _workload_argv(cfg.workload, total_s)
        if wl is not None:
            e = procs.spawn(wl, log_path=drill_dir / "workload.log", role="workload")
            ctx.workload_pid, ctx.workload_start = e["pid"], e["start"]
        cfg.out(f"drill {run_id} on {cfg.host}: agent, scheduler (every {cfg.every_s:g} s) and workload "
                f"{cfg.workload!r} started; {cfg.healthy_s:g} s healthy")
        watch.hold(cfg.healthy_s, sleep)
        for f in faults:
            why = f.available()
            now = datetime.now(UTC)
            if why is not None:
                cfg.out(f"  {f.name}: skipped ({why})")
                windows.append(FaultWindow(f.name, f.expected_entry, "", now, now, now, skipped=why))
                continue
            onset = datetime.now(UTC)
            try:
                f.apply(ctx)
            except (OSError, subprocess.SubprocessError, DrillError) as exc:
                errs = f.restore(ctx)
                now = datetime.now(UTC)
                cfg.out(f"  {f.name}: could not be applied ({exc}); restored")
                windows.append(FaultWindow(f.name, f.expected_entry, f.method, onset, now, now,
                                           skipped=f"apply failed: {exc}"))
                if errs:
                    raise DrillError(f"{f.name}: restore failed: {'; '.join(errs)}") from exc
                continue
            cfg.out(f"  {f.name}: applied at {onset:%H:%M:%S} ({f.method}); holding {cfg.fault_s:g} s")
            watch.hold(cfg.fault_s, sleep)
            with _signals_ignored():
                errs = f.restore(ctx)
            restored = datetime.now(UTC)
            if errs:
                raise DrillError(f"{f.name}: restore failed: {'; '.join(errs)}")
            cfg.out(f"  {f.name}: restored at {restored:%H:%M:%S}; recovering {cfg.recovery_s:g} s")
            watch.hold(cfg.recovery_s, sleep)
            windows.append(FaultWindow(f.name, f.expected_entry, f.method, onset, restored, datetime.now(UTC)))
        end = datetime.now(UTC)
        cfg.out(f"waiting for the scheduler to sweep past {end:%H:%M:%S}")
        _wait_swept(cfg, end, lambda secs: watch.hold(secs, sleep))
    finally:
        with _signals_ignored():
            errors = restore(state, procs)
            if errors:
                log.error("drill restore incomplete (state file kept: %s): %s", path, "; ".join(errors))
            else:
                state.remove()
        for s, h in old_handlers.items():
            signal.signal(s, h)
    if errors:
        raise DrillError(f"restore incomplete, run 'unveil drill --restore --lake {cfg.lake}': {'; '.join(errors)}")
    card = scorecard(cfg.lake, cfg.host, run_id, started, windows, healthy_end=windows[0].onset if windows else end,
                     first_seen=watch.first_seen)
    write_scorecard(cfg.lake, card)
    cfg.out(format_scorecard(card))
    return card


def _wait_swept(cfg: DrillConfig, end: datetime, sleep: Callable[[float], None]) -> None:
    from jobs import watermarks

    timeout = cfg.catchup_timeout_s if cfg.catchup_timeout_s is not None else (
        cfg.lag_s + cfg.commit_s + 3 * cfg.every_s + 120)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            mark = watermarks.load(cfg.lake).get(cfg.host)
        except watermarks.StateError:
            mark = None
        if mark is not None and mark.watermark >= end:
            return
        sleep(1.0)
    cfg.out(f"warning: the scheduler had not swept past {end:%H:%M:%S} after {timeout:g} s; "
            "the scorecard covers what it swept")


# ------------------------------------------------------------------------- scoring


SCORECARD_SCHEMA: dict[str, pl.DataType] = {
    "time": pl.Datetime("us", "UTC"),
    "host": pl.String(),
    "run_id": pl.String(),
    "fault": pl.String(),
    "method": pl.String(),
    "expected_entry": pl.String(),
    "onset": pl.Datetime("us", "UTC"),
    "restored": pl.Datetime("us", "UTC"),
    "detected": pl.Boolean(),
    "incidents": pl.Int64(),
    "matched_entry": pl.String(),
    "match_ok": pl.Boolean(),
    "latency_s": pl.Float64(),
    "start_latency_s": pl.Float64(),
    "remediation": pl.String(),
    "false_incidents": pl.Int64(),
    "incident_ids": pl.List(pl.String()),
    "skipped": pl.String(),
}


def read_incidents(lake: Path, host: str, first_seen: Mapping[Seen, datetime] | None = None) -> pl.DataFrame:
    """The host's incidents as they stand (each one's latest row; superseded ones left out)
    with ``visible_at``: when the incident was first seen carrying the entry it ends with
    (from ``first_seen``, the drill's polling: ``(id, entry)``, else the id), else the mtime
    of the first file holding such a row. An open incident's entry can change (the memory
    hog's CPU windows come first, memory pressure joins them)."""
    from ingest import lake as lake_mod
    from knowledge_base import latest_incidents

    cols = ["incident_id", "start", "end", "status", "entry_id"]
    ts = pl.Datetime("us", "UTC")
    frames = []
    if "incidents" in lake_mod.tables(lake):
        for f in lake_mod.files(lake, "incidents", hosts=[host]):
            have = set(pl.read_parquet_schema(f))
            df = pl.read_parquet(f, columns=[c for c in (*cols, "state", "updated") if c in have],
                                 hive_partitioning=False)
            mtime = datetime.fromtimestamp(f.stat().st_mtime, UTC)
            frames.append(df.with_columns(pl.lit(mtime).cast(ts).alias("visible_at")))
    if not frames:
        return pl.DataFrame(schema={"incident_id": pl.String(), "start": ts, "end": ts, "status": pl.String(),
                                    "entry_id": pl.String(), "visible_at": ts})
    df = pl.concat(frames, how="diagonal_relaxed")
    if first_seen:
        seen = [first_seen.get((i, e), first_seen.get(i)) for i, e in df.select("incident_id", "entry_id").iter_rows()]
        df = df.with_columns(pl.coalesce(pl.Series("_seen", seen, dtype=ts), "visible_at").alias("visible_at"))
    # a re-swept or compacted incident keeps its first appearance under each entry
    first = df.group_by("incident_id", "entry_id").agg(pl.col("visible_at").min())
    last = latest_incidents(df.drop("visible_at")).select(cols)
    return last.join(first, on=["incident_id", "entry_id"], how="left", nulls_equal=True).sort("start")


def _proposals(lake: Path, incident_ids: Sequence[str]) -> dict[str, list[str]]:
    from remediation.queue import Queue, default_path

    qp = default_path(lake)
    if not incident_ids or not qp.exists():
        return {}
    out: dict[str, list[str]] = {}
    with Queue(qp) as q:
        for a in q.actions():
            if a.incident_id in incident_ids:
                out.setdefault(a.incident_id, []).append(a.script_id)
    return out


def scorecard(lake: Path, host: str, run_id: str, started: datetime, windows: Sequence[FaultWindow], *,
              healthy_end: datetime, first_seen: Mapping[Seen, datetime] | None = None) -> pl.DataFrame:
    """One row per fault (plus ``healthy``): incidents overlapping the fault window, the entry they
    matched, latency from onset, remediation proposed, false incidents in the recovery minutes."""
    inc = read_incidents(lake, host, first_seen)
    props = _proposals(lake, inc["incident_id"].to_list())
    live = [w for w in windows if w.skipped is None]

    def overlapping(lo: datetime, hi: datetime) -> pl.DataFrame:
        return inc.filter((pl.col("start") < hi) & (pl.col("end") > lo))

    def in_no_fault(df: pl.DataFrame) -> pl.DataFrame:
        for w in live:
            df = df.filter(~((pl.col("start") < w.restored) & (pl.col("end") > w.onset)))
        return df

    rows: list[dict[str, Any]] = []
    healthy = in_no_fault(overlapping(started, healthy_end))
    rows.append({"time": started, "host": host, "run_id": run_id, "fault": "healthy", "method": "",
                 "expected_entry": None, "onset": started, "restored": healthy_end, "detected": None,
                 "incidents": healthy.height, "matched_entry": None, "match_ok": None, "latency_s": None,
                 "start_latency_s": None, "remediation": None, "false_incidents": healthy.height,
                 "incident_ids": healthy["incident_id"].to_list(), "skipped": None})
    for w in windows:
        row: dict[str, Any] = {"time": w.onset, "host": host, "run_id": run_id, "fault": w.fault,
                               "method": w.method, "expected_entry": w.expected_entry, "onset": w.onset,
                               "restored": w.restored, "skipped": w.skipped}
        if w.skipped is not None:
            rows.append(row | {"incident_ids": []})
            continue
        ov = overlapping(w.onset, w.restored)
        matched = ov.filter(pl.col("status") == "matched")["entry_id"].drop_nulls().to_list()
        best = w.expected_entry if w.expected_entry in matched else (matched[0] if matched else None)
        # latency of the detection reported: the matched entry's incidents when there is one (an
        # unrelated incident already under way at the onset is no detection of this fault)
        basis = ov.filter(pl.col("entry_id") == best) if best is not None else ov
        first_visible: datetime | None = basis["visible_at"].min() if basis.height else None  # type: ignore[assignment]
        first_start: datetime | None = basis["start"].min() if basis.height else None  # type: ignore[assignment]
        scripts = sorted({s for i in basis["incident_id"].to_list() for s in props.get(i, [])})
        false = in_no_fault(overlapping(w.restored, w.recovered))
        row |= {
            "detected": ov.height > 0, "incidents": ov.height, "matched_entry": best,
            "match_ok": (best == w.expected_entry) if w.expected_entry is not None else None,
            "latency_s": (first_visible - w.onset).total_seconds() if first_visible is not None else None,
            "start_latency_s": (first_start - w.onset).total_seconds() if first_start is not None else None,
            "remediation": ",".join(scripts) or None, "false_incidents": false.height,
            "incident_ids": ov["incident_id"].to_list(),
        }
        rows.append(row)
    return pl.DataFrame(rows, schema=SCORECARD_SCHEMA)


def write_scorecard(lake: Path, card: pl.DataFrame) -> None:
    """The ``drill_scorecard`` table, through the lake's atomic writer (one file per partition)."""
    from ingest import lake as lake_mod

    lake_mod.write_table(lake, SCORECARD_TABLE, card, partition_by_hour=False)


def format_scorecard(card: pl.DataFrame) -> str:
    head = (f"{'fault':<8} {'expected entry':<22} {'detected':<8} {'matched entry':<22} {'latency':>8} "
            f"{'remediation':<24} {'false':>5}")
    lines = [head, "-" * len(head)]
    for r in card.iter_rows(named=True):
        if r["fault"] == "healthy":
            lines.append(f"{'healthy':<8} {'-':<22} {'-':<8} {'-':<22} {'-':>8} {'-':<24} {r['false_incidents']:>5}")
            continue
        if r["skipped"] is not None:
            lines.append(f"{r['fault']:<8} {r['expected_entry'] or 'no entry':<22} skipped: {r['skipped']}")
            continue
        lat = f"{r['latency_s']:.0f} s" if r["latency_s"] is not None else "-"
        lines.append(f"{r['fault']:<8} {r['expected_entry'] or 'no entry':<22} {'yes' if r['detected'] else 'no':<8} "
                     f"{r['matched_entry'] or '-':<22} {lat:>8} {r['remediation'] or '-':<24} "
                     f"{r['false_incidents']:>5}")
    notes = [f"  {r['fault']}: {r['method']}" for r in card.iter_rows(named=True) if r["method"]]
    return "\n".join(lines + (["methods:", *notes] if notes else []))
