"""Agent overhead benchmark: run `unveil agent` on this host and print its cost.

Runs the agent twice for --seconds (default 60): at default settings (fast tier at
100 ms, slower sources on their tiers) and with every source at 100 ms. For each run it
prints CPU as % of one core over the steady state (utime+stime of the agent and its
children, measured from --warmup seconds after the agent reports that it is sampling to
the end of the run, so start-up imports are excluded however long they take), its resident
memory over the same window (peak, and steady: the median of the samples taken every
0.5 s; MiB of VmRSS, file-backed pages of the libraries included), lake bytes per second
(after the agent's last flush and after compaction), InfluxDB line-protocol bytes per
second for the same rows, and missed ticks.

    python benchmarks/agent_overhead.py [--seconds 60] [--warmup 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import psutil

ROOT = Path(__file__).resolve().parents[1]


def lake_bytes(lake: Path) -> int:
    return sum(p.stat().st_size for p in lake.rglob("*.parquet") if not p.name.startswith((".", "_")))


def run_once(seconds: float, warmup: float, extra: list[str]) -> dict[str, float]:
    from ingest import lake as lake_mod
    from ingest.influx import to_line_protocol

    tmp = Path(tempfile.mkdtemp(prefix="unveil-bench-"))
    lake = tmp / "lake"
    host = "bench-host"
    cmd = [
        sys.executable, "-m", "jobs.cli", "agent", "--lake", str(lake), "--host", host,
        "--duration", str(seconds + warmup + 5), "--quiet", *extra,
    ]
    # the agent limits its own threads (jobs/cli.py); its stderr tells when sampling starts
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    assert proc.stderr is not None
    for line in proc.stderr:  # start-up (imports, collectors) is not steady state
        sys.stderr.write(line)
        if "sampling" in line:
            break
    threading.Thread(target=lambda: sys.stderr.writelines(proc.stderr or ()), daemon=True).start()

    def cpu() -> float:
        t = ps.cpu_times()
        kids = sum(c.cpu_times().user + c.cpu_times().system for c in ps.children(recursive=True))
        return t.user + t.system + t.children_user + t.children_system + kids

    time.sleep(warmup)
    c0, w0 = cpu(), time.monotonic()
    rss: list[int] = []
    # the window ends while the agent still samples: its exit (last flush and commit,
    # interpreter teardown) is no more steady state than its start-up
    end = w0 + seconds
    while (now := time.monotonic()) < end:
        rss.append(ps.memory_info().rss)
        time.sleep(min(0.5, end - now))
    c1, w1 = cpu(), time.monotonic()
    rc = proc.wait()
    if rc != 0:
        raise SystemExit(f"agent exited with {rc}")
    lake_total = lake_bytes(lake)
    lp_bytes = 0
    missed = 0
    for table in lake_mod.tables(lake):
        df = lake_mod.scan(lake, table).collect()
        lp_bytes += len("\n".join(to_line_protocol(table, df)).encode())
        if table == "agent" and df.height:
            missed = int(df["missed_ticks"].fill_null(0).sum())
    # every partition counts as closed: merge everything the run wrote
    lake_mod.compact(lake, older_than=timedelta(0), now=datetime.now(UTC) + timedelta(hours=2))
    compacted = lake_bytes(lake)
    duration = seconds + warmup + 5  # the rows the agent sampled (its whole --duration)
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "cpu_pct": 100 * (c1 - c0) / (w1 - w0),
        "peak_rss_mib": max(rss) / 2**20,
        "steady_rss_mib": statistics.median(rss) / 2**20,
        "lake_kbps": lake_total / duration / 1000,
        "lake_compacted_kbps": compacted / duration / 1000,
        "influx_kbps": lp_bytes / duration / 1000,
        "missed_ticks": missed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting (all are printed, then the median)")
    ap.add_argument("--only", choices=("default", "all-fast"), help="run one setting only")
    args = ap.parse_args()
    pl.Config.set_tbl_rows(10)
    print(f"host: {os.uname().nodename}, {os.cpu_count()} CPUs; steady state {args.seconds:g} s after {args.warmup:g} s warm-up")
    print(f"{'settings':<28}{'CPU % of a core':>16}{'peak RSS MiB':>14}{'steady':>8}{'lake KB/s':>11}"
          f"{'compacted':>11}{'Influx KB/s':>13}{'missed':>8}")
    settings = (("default", "default (fast 100 ms)", []), ("all-fast", "every source at 100 ms", ["--all-fast"]))
    for key, label, extra in settings:
        if args.only and key != args.only:
            continue
        cpu, peak = [], []
        for i in range(args.repeat):
            load = os.getloadavg()[0]
            r = run_once(args.seconds, args.warmup, extra)
            cpu.append(r["cpu_pct"])
            peak.append(r["peak_rss_mib"])
            print(
                f"{label:<28}{r['cpu_pct']:>16.2f}{r['peak_rss_mib']:>14.1f}{r['steady_rss_mib']:>8.1f}{r['lake_kbps']:>11.2f}"
                f"{r['lake_compacted_kbps']:>11.2f}{r['influx_kbps']:>13.2f}{r['missed_ticks']:>8.0f}"
                f"   (run {i + 1}, load average {load:.2f} at start)", flush=True
            )
        if args.repeat > 1:
            print(f"{label:<28}{statistics.median(cpu):>16.2f}{statistics.median(peak):>14.1f}"
                  f"   median CPU % and peak RSS over {args.repeat} runs")


if __name__ == "__main__":
    main()
