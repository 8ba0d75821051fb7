"""Write throughput and bytes per row of a ``cpu`` table in the Parquet lake.

Simulates the agent: one 100 ms tick writes one row per CPU through :class:`LakeSink`,
which flushes every ``--flush-s`` seconds of data; then compacts and measures again.

    .venv/bin/python benchmarks/lake_bytes.py --cpus 2 --hours 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

from ingest import lake, schema

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def cpu_frame(cpus: int, ticks: int, period_s: float, seed: int = 0) -> pl.DataFrame:
    """Plausible /proc/stat deltas at ``period_s``: ~USER_HZ*period ticks per CPU split
    among the states, a busy phase pattern, and a jittering scaling_cur_freq."""
    rng = np.random.default_rng(seed)
    n = cpus * ticks
    per_tick = 100 * period_s  # USER_HZ = 100
    busy = (np.sin(np.arange(ticks) / 3000) > 0).repeat(cpus)
    user = rng.binomial(int(round(per_tick)), np.where(busy, 0.8, 0.05))
    system = rng.binomial(1, 0.1, n)
    idle = np.clip(round(per_tick) - user - system, 0, None)
    times = [T0 + timedelta(seconds=period_s * i) for i in range(ticks)]
    return schema.conform("cpu", pl.DataFrame({
        "time": pl.Series(np.repeat(np.array([t.replace(tzinfo=None) for t in times], dtype="datetime64[us]"), cpus)).dt.replace_time_zone("UTC"),
        "host": "bench-host",
        "cpu": np.tile(np.arange(cpus), ticks).astype(str),
        "node": "0",
        "user": user, "nice": 0, "system": system, "idle": idle,
        "iowait": rng.binomial(1, 0.01, n), "irq": 0, "softirq": rng.binomial(1, 0.02, n), "steal": 0,
        "freq_mhz": np.where(busy, 3400.0, 1200.0) + rng.normal(0, 40, n).round(3),
    }))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")  # a report on stdout is this script's job


def lake_bytes(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*.parquet") if not p.name.startswith(".")]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--period", type=float, default=0.1, help="sampling period, s")
    ap.add_argument("--flush-s", type=float, default=10.0, help="seconds of data per sink flush")
    ap.add_argument("--root", type=Path, help="lake directory (default: a temp dir)")
    args = ap.parse_args()
    if args.root is None:
        with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
            run(args, Path(tmp))
    else:
        run(args, args.root)


def run(args: argparse.Namespace, root: Path) -> None:
    ticks = int(args.hours * 3600 / args.period)
    df = cpu_frame(args.cpus, ticks, args.period)
    rows = df.height
    per_flush = int(args.flush_s / args.period) * args.cpus

    # 1. the agent's path: a tiny frame per tick through the sink
    sink = lake.LakeSink(root / "sink", max_buffer_rows=per_flush, max_buffer_age_s=1e9)
    ticks_frames = df.partition_by("time", maintain_order=True)
    t = time.perf_counter()
    for f in ticks_frames:
        sink.write("cpu", f)
    sink.close()
    sink_s = time.perf_counter() - t
    files, size = lake_bytes(root / "sink")

    # 2. bulk: the whole hour in one write_table (simulator / import path)
    t = time.perf_counter()
    lake.write_table(root / "bulk", "cpu", df)
    bulk_s = time.perf_counter() - t
    bfiles, bsize = lake_bytes(root / "bulk")

    # 3. compaction of the sink's small files
    t = time.perf_counter()
    stats = lake.compact(root / "sink", "cpu", older_than=timedelta(0))
    compact_s = time.perf_counter() - t
    cfiles, csize = lake_bytes(root / "sink")
    assert lake.scan(root / "sink", "cpu").select(pl.len()).collect().item() == rows

    t = time.perf_counter()
    one_hour = lake.read(root / "sink", "cpu", start=T0 + timedelta(minutes=20), end=T0 + timedelta(minutes=30))
    read_s = time.perf_counter() - t

    say(f"cpu table: {args.cpus} CPUs x {ticks} ticks of {args.period * 1000:g} ms = {rows} rows "
          f"(in memory {df.estimated_size() / rows:.1f} B/row)")
    say(f"sink, {per_flush} rows per flush: {rows / sink_s:,.0f} rows/s ({sink_s:.2f} s), "
          f"{files} files, {size / rows:.2f} B/row, {size / 1024:.0f} KiB")
    say(f"bulk write_table:            {rows / bulk_s:,.0f} rows/s ({bulk_s:.2f} s), "
          f"{bfiles} files, {bsize / rows:.2f} B/row")
    say(f"after compaction ({compact_s:.2f} s, {stats.files_before} -> {stats.files_after} files): "
          f"{cfiles} files, {csize / rows:.2f} B/row, {csize / 1024:.0f} KiB")
    say(f"read 10 minutes after compaction: {one_hour.height} rows in {read_s * 1000:.0f} ms")
    say(f"per host and second at this rate: {size / (args.hours * 3600):,.0f} B/s before, "
          f"{csize / (args.hours * 3600):,.0f} B/s after compaction")


if __name__ == "__main__":
    main()
