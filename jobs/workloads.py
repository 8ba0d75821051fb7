"""A memory-heavy benchmark workload that reports its own throughput.

Random 8-byte gathers over large anonymous buffers advised with MADV_HUGEPAGE: TLB reach
decides its speed, so it runs measurably slower without transparent huge pages. Like a
model server that recycles its activation/KV buffers, it keeps reallocating: every
``recycle_s`` one buffer is unmapped and a fresh one is mapped and touched, so a THP mode
change reaches its memory within ``n_buffers * recycle_s`` seconds even without a
collapse request.

Run as ``python -m jobs.workloads --seconds 60``; it prints one JSON line per report
period: {"t": unix time, "gathers_per_s": ..., "anon_huge_share": ...}.
"""

from __future__ import annotations

import argparse
import json
import mmap
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass
class GatherConfig:
    total_mib: int = 2048
    n_buffers: int = 8
    batch: int = 1 << 20
    recycle_s: float = 1.0
    report_s: float = 1.0
    seed: int = 0


def _new_buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(buf, dtype=np.int64)
    arr[:: 512] = 1  # touch every 4 KiB page so the memory is really faulted in
    return buf, arr


def anon_huge_share(pid: str = "self") -> float | None:
    """AnonHugePages / Anonymous of a process (from /proc/PID/smaps_rollup)."""
    try:
        text = open(f"/proc/{pid}/smaps_rollup").read()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("Anonymous:", "AnonHugePages:"):
            vals[parts[0]] = int(parts[1])
    anon = vals.get("Anonymous:", 0)
    return vals.get("AnonHugePages:", 0) / anon if anon else None


def run(cfg: GatherConfig, seconds: float) -> Iterator[dict[str, float | None]]:
    per = cfg.total_mib * 2**20 // cfg.n_buffers
    per -= per % (2 * 2**20)
    rng = np.random.default_rng(cfg.seed)
    buffers = [_new_buffer(per) for _ in range(cfg.n_buffers)]
    n_words = per // 8
    t_end = time.monotonic() + seconds
    next_recycle = time.monotonic() + cfg.recycle_s
    next_report = time.monotonic() + cfg.report_s
    gathers = 0
    t_report = time.monotonic()
    victim = 0
    sink = 0
    while time.monotonic() < t_end:
        idx = rng.integers(0, n_words, cfg.batch)
        part = idx[: cfg.batch // cfg.n_buffers]
        for _, arr in buffers:
            sink += int(arr[part].sum())
        del arr  # the last buffer's view must not outlive a recycle of that buffer
        gathers += cfg.batch // cfg.n_buffers * cfg.n_buffers
        now = time.monotonic()
        if now >= next_recycle:
            old = buffers[victim][0]
            buffers[victim] = _new_buffer(per)
            old.close()  # the numpy view went with the list entry
            victim = (victim + 1) % cfg.n_buffers
            next_recycle += cfg.recycle_s
        if now >= next_report:
            yield {
                "t": time.time(),
                "gathers_per_s": gathers / (now - t_report),
                "anon_huge_share": anon_huge_share(),
            }
            gathers, t_report = 0, now
            next_report += cfg.report_s
    maps = [b for b, _ in buffers]
    buffers.clear()
    for buf in maps:
        buf.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--buffers", type=int, default=8)
    ap.add_argument("--recycle", type=float, default=1.0)
    args = ap.parse_args(argv)
    cfg = GatherConfig(total_mib=args.mib, n_buffers=args.buffers, recycle_s=args.recycle)
    for rec in run(cfg, args.seconds):
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
