"""Transparent huge pages: mode, defrag, khugepaged speed, and an optional immediate collapse.

A THP mode change only affects new page faults. Memory already faulted as 4 KiB pages comes back
as huge pages only when khugepaged rescans it (default 4096 pages every 10 s: ~20 min for 2 GiB)
or when the process's ranges are collapsed on request: ``process_madvise(pidfd, ranges,
MADV_COLLAPSE)`` (Linux >= 6.1, CAP_SYS_ADMIN), which this script does for ``collapse_pid``.
Compaction (/proc/sys/vm/compact_memory) only makes free huge pages; it collapses nothing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import sys
from typing import Any

from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported

THP = "/sys/kernel/mm/transparent_hugepage"
KHUGEPAGED = {
    "khugepaged_pages_to_scan": "khugepaged/pages_to_scan",
    "khugepaged_scan_sleep_ms": "khugepaged/scan_sleep_millisecs",
}
MADV_COLLAPSE = 25
# process_madvise is 440 in the generic syscall table (x86_64 and arm64 alike).
SYS_PROCESS_MADVISE = 440


def read(ctx: Context, params: dict[str, Any]) -> State:
    state: State = {
        "enabled": _base.bracketed(_base.read_text(ctx.path(f"{THP}/enabled"))),
        "defrag": _base.bracketed(_base.read_text(ctx.path(f"{THP}/defrag"))),
    }
    for name, rel in KHUGEPAGED.items():
        if name in params:
            state[name] = int(_base.read_text(ctx.path(f"{THP}/{rel}")))
    return state


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    if "collapse_pid" in params:
        ctx.notes.append(f"then collapse process {params['collapse_pid']}'s anonymous memory (MADV_COLLAPSE)")
    return {k: params[k] for k in ("enabled", "defrag", *KHUGEPAGED) if k in params}


def write(ctx: Context, state: State) -> None:
    for key in ("enabled", "defrag", *KHUGEPAGED):
        if key in state:
            rel = KHUGEPAGED.get(key, key)
            _base.write_text(ctx.path(f"{THP}/{rel}"), str(state[key]))


def anon_huge_kib(pid: int, root: Context | None = None) -> int:
    """AnonHugePages of a process in KiB (from /proc/PID/smaps_rollup)."""
    path = (root.path(f"/proc/{pid}/smaps_rollup") if root else f"/proc/{pid}/smaps_rollup")
    text = open(path).read()
    m = re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def _anon_ranges(pid: int) -> list[tuple[int, int]]:
    """THP-eligible anonymous mappings of ``pid`` (start, length), from /proc/PID/smaps."""
    ranges: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    anon = False
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ (\d+)\s*(.*)$", line)
            if head:
                lo, hi = int(head.group(1), 16), int(head.group(2), 16)
                path = head.group(4).strip()
                anon = head.group(3) == "0" and path in ("", "[heap]")
                cur = (lo, hi - lo)
            elif line.startswith("THPeligible:") and cur and anon and line.split()[1] == "1":
                if cur[1] >= 2 << 20:
                    ranges.append(cur)
    return ranges


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def collapse(pid: int) -> dict[str, Any]:
    """Ask the kernel to collapse ``pid``'s eligible anonymous memory into huge pages now."""
    release = os.uname().release
    major_minor = tuple(int(x) for x in re.findall(r"\d+", release)[:2])
    if major_minor < (6, 1):
        raise Unsupported(f"MADV_COLLAPSE needs Linux >= 6.1, this kernel is {release}")
    try:
        before = anon_huge_kib(pid)
        ranges = _anon_ranges(pid)
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise ScriptFailed(f"process {pid} does not exist") from None
    except FileNotFoundError:
        raise ScriptFailed(f"process {pid} does not exist") from None
    libc = ctypes.CDLL(None, use_errno=True)
    advised = 0
    errors: dict[str, int] = {}
    try:
        # One range per call: a failing range (e.g. EAGAIN, memory busy) must not stop the others.
        for start, length in ranges:
            iov = (_Iovec * 1)(_Iovec(start, length))
            n = libc.syscall(SYS_PROCESS_MADVISE, pidfd, iov, 1, MADV_COLLAPSE, 0)
            if n < 0:
                err = ctypes.get_errno()
                if err in (errno.ENOSYS, errno.EINVAL) and not advised and not errors:
                    raise Unsupported(f"process_madvise(MADV_COLLAPSE) unsupported here: {os.strerror(err)}")
                if err == errno.EPERM:
                    raise ScriptFailed("process_madvise(MADV_COLLAPSE) needs CAP_SYS_ADMIN")
                errors[errno.errorcode.get(err, str(err))] = errors.get(errno.errorcode.get(err, str(err)), 0) + 1
            else:
                advised += n
    finally:
        os.close(pidfd)
    return {
        "pid": pid,
        "ranges": len(ranges),
        "advised_bytes": advised,
        "errors": errors,
        "anon_huge_kib_before": before,
        "anon_huge_kib_after": anon_huge_kib(pid),
    }


def after_apply(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    if "collapse_pid" not in params:
        return {}
    if not ctx.live:
        ctx.notes.append("collapse_pid skipped: --root is not / (collapse acts on live processes)")
        return {"skipped": "root is not /"}
    try:
        return collapse(int(params["collapse_pid"]))
    except (ScriptFailed, Unsupported) as exc:
        # The mode change stands on its own; a failed collapse is reported, not rolled back.
        ctx.notes.append(f"collapse failed: {exc}")
        return {"error": str(exc)}


def main(argv: list[str] | None = None) -> int:
    return _base.main("thp", read, plan, write, argv, after_apply=after_apply)


if __name__ == "__main__":
    sys.exit(main())
