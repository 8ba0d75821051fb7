"""Move a process to one NUMA node: CPU affinity of every thread (sched_setaffinity over
/proc/PID/task) and its memory (``migratepages`` from the numactl package).

Recorded state: the affinity of every thread and the node holding most of the process's pages.
Rollback restores each thread's affinity exactly and migrates pages back to that node; the
exact previous page placement across several nodes is not restored (documented limitation).
Acts on live processes only: ``--root`` must be /.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from typing import Any

from remediation import registry
from remediation.errors import ParamError
from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported

TIMEOUT_S = 240


def _cpus(text: str) -> str:
    return ",".join(map(str, registry.expand_cpulist(text)))


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise ScriptFailed(f"process {pid} does not exist") from None


def pages_per_node(pid: int) -> dict[int, int]:
    """Pages of ``pid`` on each node, summed over /proc/PID/numa_maps ``N<node>=<pages>``."""
    counts: Counter[int] = Counter()
    try:
        with open(f"/proc/{pid}/numa_maps") as fh:
            for line in fh:
                for node, pages in re.findall(r"\bN(\d+)=(\d+)", line):
                    counts[int(node)] += int(pages)
    except FileNotFoundError:
        raise ScriptFailed(f"process {pid} does not exist") from None
    return dict(counts)


def _nodes(ctx: Context) -> list[int]:
    text = _base.read_text(ctx.path("/sys/devices/system/node/online"))
    return registry.expand_cpulist(text)


def read(ctx: Context, params: dict[str, Any]) -> State:
    if not ctx.live:
        raise Unsupported("numa_rebind acts on live processes; --root must be /")
    pid = int(params.get("pid") or ctx.extra["pid"])
    ctx.extra["pid"] = pid
    ctx.extra.setdefault("migrate_memory", bool(params.get("migrate_memory", True)))
    affinity = {}
    for tid in _threads(pid):
        try:
            affinity[str(tid)] = ",".join(map(str, sorted(os.sched_getaffinity(tid))))
        except ProcessLookupError:
            continue  # a thread that just exited
    pages = pages_per_node(pid)
    ctx.extra["pages_per_node"] = pages
    state: State = {"affinity": affinity}
    if ctx.extra["migrate_memory"]:
        state["memory_node"] = max(pages, key=lambda n: pages[n]) if pages else None
    return state


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    node = int(params["node"])
    if node not in _nodes(ctx):
        raise ScriptFailed(f"NUMA node {node} is not online (online: {_nodes(ctx)})")
    cpus = _cpus(params["cpus"]) if "cpus" in params else _cpus(
        _base.read_text(ctx.path(f"/sys/devices/system/node/node{node}/cpulist"))
    )
    if not cpus:
        raise ScriptFailed(f"NUMA node {node} has no CPUs")
    out: State = {"affinity": {tid: cpus for tid in current["affinity"]}}
    if params.get("migrate_memory", True):
        if shutil.which("migratepages") is None:
            raise Unsupported("migratepages is not installed (Debian/Ubuntu package: numactl)")
        out["memory_node"] = node
    return out


def write(ctx: Context, state: State) -> None:
    pid = int(ctx.extra["pid"])
    for tid, cpus in state.get("affinity", {}).items():
        try:
            os.sched_setaffinity(int(tid), registry.expand_cpulist(cpus))
        except ProcessLookupError:
            continue
        except OSError as exc:
            raise ScriptFailed(f"sched_setaffinity({tid}, {cpus}): {exc.strerror}") from exc
    target = state.get("memory_node")
    if target is None or not ctx.extra.get("migrate_memory"):
        return
    others = [n for n in _nodes(ctx) if n != target]
    if not others:
        return  # one node: nothing to migrate
    exe = shutil.which("migratepages")
    if exe is None:
        raise Unsupported("migratepages is not installed (Debian/Ubuntu package: numactl)")
    frm = ",".join(map(str, others))
    proc = subprocess.run([exe, str(pid), frm, str(target)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise ScriptFailed(f"migratepages {pid} {frm} {target} failed: {(proc.stderr or proc.stdout).strip()}")


def check_state(script_id: str, state: State) -> State:
    """``{"affinity": {thread id: CPU list}, "memory_node": node | None}``."""
    if not isinstance(state, dict) or set(state) - {"affinity", "memory_node"}:
        raise ParamError(f"{script_id}: unexpected state {state!r}")
    out: State = {}
    if "affinity" in state:

        def cpus(key: str, v: Any) -> str:
            if not isinstance(v, str) or not registry.CPULIST_RE.fullmatch(v):
                raise ParamError(f"{script_id}: thread {key}: {v!r} is not a CPU list")
            return v

        out["affinity"] = _base.check_keyed_state(script_id, state["affinity"], r"\d{1,7}", cpus)
    if "memory_node" in state:
        node = state["memory_node"]
        if node is not None and (isinstance(node, bool) or not isinstance(node, int) or not 0 <= node <= 1023):
            raise ParamError(f"{script_id}: memory_node {node!r} is not a NUMA node")
        out["memory_node"] = node
    return out


def main(argv: list[str] | None = None) -> int:
    return _base.main("numa_rebind", read, plan, write, argv, check_state=check_state)


if __name__ == "__main__":
    sys.exit(main())
