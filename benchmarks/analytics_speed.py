"""Speed and memory of the analytics core: features + 3 detectors + attribution.

One host-hour of telemetry of an 8-GPU host with the full channel set (fast tier at
100 ms: cpu per logical CPU, gpu, system, perf; medium tier at 1 s: interrupts per IRQ
line and node, softirqs, memory, vmstat, numa, pressure, net, tcp, disk, cgroup) is
built with the simulator when it is available (``--source sim``), else synthesised
here with numpy (``--source synth``, the default: no dependency on other modules).

It reports, on ONE core (POLARS_MAX_THREADS=1, BLAS threads 1, set before the imports):

* CPU seconds (time.process_time) of ``analyze()`` on in-memory frames, and
  host-hours per CPU-second (target >= 4, i.e. <= 0.25 s per host-hour);
* the same from a Parquet lake (scan + analyze), over 1 h in a 1-h lake and over the
  same 1 h in a 6-h lake, each in a fresh subprocess, with its peak RSS (VmHWM, see
  :func:`peak_rss_mb`): memory must depend on the interval, not on the lake's size.

Usage: ``python benchmarks/analytics_speed.py [--repeat 3] [--lake-check] [--breakdown] [--source synth|sim]``;
``--fp-check [SCENARIO ...]`` instead measures false alarms and recall on simulated fleets.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one core: must be set before polars/numpy start their pools
    for _v in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

T0 = datetime(2025, 1, 6, 0, 0, tzinfo=UTC)
N_CPU = 32  # the simulator's logical CPU count (see ingest/simulator/topology.py)
N_GPU = 8
NICS = [f"mlx5_{i}" for i in range(N_GPU)]
DISKS = ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]
CGROUPS = ["kubepods", "system.slice", "user.slice"]
SOFTIRQ_TYPES = ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"]


def _times(start: datetime, seconds: float, period: float) -> pl.Series:
    n = int(round(seconds / period))
    us = np.arange(n, dtype=np.int64) * int(period * 1e6)
    return pl.Series("time", us + int(start.timestamp() * 1e6)).cast(pl.Datetime("us", "UTC"))


def _tile(t: pl.Series, k: int) -> pl.Series:
    return pl.Series("time", np.tile(t.to_numpy(), k)).cast(pl.Datetime("us", "UTC"))


def synth_frames(host: str = "host-a", seconds: float = 3600.0, start: datetime = T0,
                 seed: int = 0) -> dict[str, pl.DataFrame]:
    """Full-channel telemetry of one 8-GPU host (schema-conformant frames)."""
    from ingest import schema

    rng = np.random.default_rng(seed)
    fast = _times(start, seconds, 0.1)
    med = _times(start, seconds, 1.0)
    nf, nm = fast.len(), med.len()
    out: dict[str, pl.DataFrame] = {}

    def frame(name: str, t: pl.Series, tags: dict[str, np.ndarray], fields: dict[str, np.ndarray]) -> None:
        n = t.len()
        df = pl.DataFrame({"time": t, "host": np.full(n, host), **tags, **fields})
        out[name] = schema.conform(name, df)

    # cpu: per logical CPU, ticks per 100 ms (USER_HZ 100 -> 1 tick per CPU per sample on average)
    k = N_CPU
    busy = rng.random((k, nf)) < 0.6
    frame("cpu", _tile(fast, k),
          {"cpu": np.repeat([str(i) for i in range(k)], nf), "node": np.repeat([str(i * 2 // k) for i in range(k)], nf)},
          {"user": busy.ravel().astype(np.int64), "nice": np.zeros(k * nf, np.int64),
           "system": (rng.random(k * nf) < 0.05).astype(np.int64), "idle": (~busy).ravel().astype(np.int64),
           "iowait": np.zeros(k * nf, np.int64), "irq": np.zeros(k * nf, np.int64),
           "softirq": (rng.random(k * nf) < 0.02).astype(np.int64), "steal": np.zeros(k * nf, np.int64),
           "freq_mhz": rng.normal(2900, 30, k * nf)})
    frame("system", fast, {}, {"ctxt": rng.poisson(5000, nf), "forks": rng.poisson(2, nf),
                               "procs_running": rng.poisson(20, nf).astype(float),
                               "procs_blocked": rng.poisson(0.2, nf).astype(float), "load1": np.full(nf, 20.0)})
    k = N_GPU
    n = k * nf
    power = rng.normal(550, 30, n)
    frame("gpu", _tile(fast, k),
          {"gpu": np.repeat([f"gpu{i}" for i in range(k)], nf), "uuid": np.repeat([f"GPU-{i:04d}" for i in range(k)], nf)},
          {"util_gpu": rng.uniform(85, 100, n), "util_mem": rng.uniform(40, 60, n),
           "mem_used": np.full(n, 70 * 2**30), "mem_total": np.full(n, 80 * 2**30), "power_w": power,
           "power_limit_w": np.full(n, 700.0), "power_limit_default_w": np.full(n, 700.0),
           "energy": (power * 100).astype(np.int64), "sm_clock_mhz": rng.normal(1950, 15, n),
           "sm_clock_max_mhz": np.full(n, 1980.0), "mem_clock_mhz": np.full(n, 2619.0),
           "mem_clock_max_mhz": np.full(n, 2619.0), "temperature_c": rng.normal(65, 2, n),
           "clock_event_reasons": np.where(rng.random(n) < 0.05, 0x4, 0).astype(np.int64),
           "power_violation": np.zeros(n, np.int64), "thermal_violation": np.zeros(n, np.int64),
           "pcie_tx": rng.normal(2e6, 1e5, n), "pcie_rx": rng.normal(2e6, 1e5, n),
           "pcie_link_gen": np.full(n, 5.0), "pcie_link_gen_max": np.full(n, 5.0),
           "pcie_link_width": np.full(n, 16.0), "pcie_link_width_max": np.full(n, 16.0),
           "nvlink_tx": rng.poisson(1e6, n), "nvlink_rx": rng.poisson(1e6, n),
           "ecc_corrected": np.zeros(n, np.int64), "ecc_uncorrected": np.zeros(n, np.int64),
           "xid_events": np.zeros(n, np.int64), "last_xid": np.zeros(n, np.int64)})
    k = 2
    n = k * nf
    frame("perf", _tile(fast, k), {"socket": np.repeat(["0", "1"], nf)},
          {"instructions": rng.poisson(4e8, n), "cycles": rng.poisson(3e8, n), "llc_loads": rng.poisson(1e6, n),
           "llc_misses": rng.poisson(2e5, n), "mem_bandwidth": rng.poisson(2e9, n)})
    # interrupts: 8 queues per NIC x 2 nodes (sparse: rows only where count > 0)
    lines = [(f"{100 + 8 * d + q}", nic) for d, nic in enumerate(NICS) for q in range(8)]
    k = len(lines) * 2
    counts = rng.poisson(500, (k, nm))
    counts[1::2] = rng.poisson(2, (k // 2, nm))  # a few on the remote node
    frame("interrupts", _tile(med, k),
          {"irq": np.repeat([irq for irq, _ in lines for _ in (0, 1)], nm),
           "device": np.repeat([f"{nic}-comp{i % 8}@pci:0000:{17 + d:02x}:00.0" for i, (_, nic) in enumerate(lines)
                                for d in [int(nic[-1])] for _ in (0, 1)], nm),
           "node": np.repeat([str(int(nic[-1]) * 2 // N_GPU if j == 0 else 1 - int(nic[-1]) * 2 // N_GPU)
                              for _, nic in lines for j in (0, 1)], nm)},
          {"count": counts.ravel()})
    k = len(SOFTIRQ_TYPES) * 2
    frame("softirqs", _tile(med, k), {"softirq": np.repeat([s for s in SOFTIRQ_TYPES for _ in (0, 1)], nm),
                                      "node": np.repeat(["0", "1"] * len(SOFTIRQ_TYPES), nm)},
          {"count": rng.poisson(1000, k * nm)})
    gb = 2**30
    frame("memory", med, {}, {"mem_total": np.full(nm, 2048 * gb), "mem_free": np.full(nm, 1024 * gb),
                              "mem_available": rng.normal(1200 * gb, gb, nm).astype(np.int64),
                              "cached": np.full(nm, 100 * gb), "dirty": rng.poisson(2**20, nm),
                              "writeback": np.zeros(nm, np.int64), "anon_pages": np.full(nm, 500 * gb),
                              "anon_huge_pages": rng.normal(450 * gb, gb, nm).astype(np.int64),
                              "shmem": np.full(nm, gb), "page_tables": np.full(nm, gb // 2),
                              "swap_total": np.zeros(nm, np.int64), "swap_free": np.zeros(nm, np.int64),
                              "hugepages_total": np.zeros(nm, np.int64), "hugepages_free": np.zeros(nm, np.int64),
                              "hugepages_rsvd": np.zeros(nm, np.int64), "hugepagesize": np.full(nm, 2**21)})
    vm = {c: rng.poisson(50, nm) for c in schema.VMSTAT.counters}
    vm["numa_hit"] = rng.poisson(1e5, nm)
    vm["numa_local"] = vm["numa_hit"]
    vm["pgfault"] = rng.poisson(1e4, nm)
    frame("vmstat", med, {}, vm)
    k = 2
    n = k * nm
    frame("numa", _tile(med, k), {"node": np.repeat(["0", "1"], nm)},
          {"numa_hit": rng.poisson(5e4, n), "numa_miss": rng.poisson(50, n), "numa_foreign": rng.poisson(50, n),
           "interleave_hit": np.zeros(n, np.int64), "local_node": rng.poisson(5e4, n), "other_node": rng.poisson(50, n),
           "mem_free": np.full(n, 512 * gb), "anon_huge_pages": np.full(n, 225 * gb)})
    k = 3
    n = k * nm
    frame("pressure", _tile(med, k), {"resource": np.repeat(["cpu", "memory", "io"], nm)},
          {"some_avg10": rng.uniform(0, 2, n), "full_avg10": rng.uniform(0, 1, n),
           "some_total": rng.poisson(5000, n), "full_total": rng.poisson(1000, n)})
    ifaces = [f"ib{i}" for i in range(N_GPU)] + ["eth0", "lo"]
    k = len(ifaces)
    n = k * nm
    frame("net", _tile(med, k), {"interface": np.repeat(ifaces, nm)},
          {"rx_bytes": rng.poisson(1e9, n), "rx_packets": rng.poisson(1e5, n), "rx_errors": np.zeros(n, np.int64),
           "rx_dropped": rng.poisson(0.01, n), "rx_fifo": np.zeros(n, np.int64), "tx_bytes": rng.poisson(1e9, n),
           "tx_packets": rng.poisson(1e5, n), "tx_errors": np.zeros(n, np.int64), "tx_dropped": np.zeros(n, np.int64)})
    frame("tcp", med, {}, {"in_segs": rng.poisson(1e4, nm), "out_segs": rng.poisson(1e4, nm),
                           "retrans_segs": rng.poisson(2, nm), "in_errs": np.zeros(nm, np.int64),
                           "active_opens": rng.poisson(3, nm)})
    k = len(DISKS)
    n = k * nm
    frame("disk", _tile(med, k), {"device": np.repeat(DISKS, nm)},
          {"reads": rng.poisson(500, n), "read_sectors": rng.poisson(5e4, n), "read_time": rng.poisson(100, n),
           "writes": rng.poisson(200, n), "write_sectors": rng.poisson(2e4, n), "write_time": rng.poisson(60, n),
           "io_time": rng.poisson(300, n), "weighted_io_time": rng.poisson(400, n), "in_flight": rng.poisson(2, n).astype(float)})
    k = len(CGROUPS)
    n = k * nm
    frame("cgroup", _tile(med, k), {"cgroup": np.repeat(CGROUPS, nm)},
          {"cpu_usage": rng.poisson(8e6, n), "nr_periods": np.full(n, 10), "nr_throttled": rng.poisson(0.1, n),
           "throttled_time": rng.poisson(100, n), "cpu_quota_cores": np.full(n, 16.0),
           "memory_current": np.full(n, 400 * gb), "memory_max": np.full(n, 1000 * gb),
           "cpu_pressure_some": rng.poisson(1000, n), "memory_pressure_some": rng.poisson(100, n)})
    facts = []
    for i, nic in enumerate(NICS):
        node = str(i * 2 // N_GPU)
        facts += [("nic", nic, "numa_node", node, float(node)), ("nic", nic, "pci", f"0000:{17 + i:02x}:00.0", None)]
    for i in range(N_GPU):
        node = str(i * 2 // N_GPU)
        facts += [("gpu", str(i), "numa_node", node, float(node)), ("gpu", str(i), "name", "NVIDIA H100 80GB HBM3", None)]
    fdf = pl.DataFrame(facts, schema=["category", "device", "key", "value", "value_num"], orient="row")
    out["host_facts"] = schema.conform("host_facts", fdf.with_columns(time=pl.lit(start), host=pl.lit(host)))
    return out


def _sim_frames(seconds: float) -> dict[str, pl.DataFrame]:
    """Frames of one host of the simulator's shipped healthy scenario, seed 1 (the
    simulator's own tables: ground truth and workload are left out)."""
    from ingest.simulator import resolve_scenario
    from ingest.simulator.run import simulate_frames

    frames, _ = simulate_frames(resolve_scenario("healthy").with_overrides(hosts=1, duration_s=seconds, seed=1))
    for name in ("labels", "workload"):
        frames.pop(name, None)
    return frames


def bench_memory(repeat: int, source: str) -> dict[str, float]:
    from analytics.pipeline import AnalyticsConfig, analyze

    frames = _sim_frames(3600) if source == "sim" else synth_frames()
    facts = frames.pop("host_facts", None)
    lazy = {k: v.lazy() for k, v in frames.items()}
    cfg = AnalyticsConfig()
    analyze(lazy, cfg, host_facts=facts)  # warm-up (imports, first-call costs)
    times = []
    res = None
    for _ in range(repeat):
        t = time.process_time()
        res = analyze(lazy, cfg, host_facts=facts)
        times.append(time.process_time() - t)
    assert res is not None
    best = min(times)
    # the split: features alone, then everything else on precomputed features
    from analytics.features import compute_features

    t_feat, t_rest = [], []
    for _ in range(repeat):
        t = time.process_time()
        feats = compute_features(lazy, cfg.window, host_facts=facts)
        t_feat.append(time.process_time() - t)
        t = time.process_time()
        analyze({}, cfg, host_facts=facts, features=feats)
        t_rest.append(time.process_time() - t)
    rows = sum(v.height for v in frames.values())
    return {"rows": rows, "windows": res.features.height, "features": res.features.width - 3,
            "findings": res.findings.height, "cpu_s_best": best, "cpu_s_median": float(np.median(times)),
            "host_hours_per_cpu_s": 1.0 / best, "features_cpu_s": min(t_feat), "detect_cpu_s": min(t_rest)}


def breakdown(source: str, top: int = 25) -> list[tuple[str, float, int]]:
    """Where one ``analyze()`` of the host-hour spends its time: (function, cumulative
    CPU-s, calls) of the analytics' own functions by cProfile (its overhead inflates
    many-call functions; read the proportions)."""
    import cProfile
    import pstats

    from analytics.pipeline import AnalyticsConfig, analyze

    frames = _sim_frames(3600) if source == "sim" else synth_frames()
    facts = frames.pop("host_facts", None)
    lazy = {k: v.lazy() for k, v in frames.items()}
    analyze(lazy, AnalyticsConfig(), host_facts=facts)  # warm-up
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    analyze(lazy, AnalyticsConfig(), host_facts=facts)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [(f"{os.path.basename(file)}:{fn}", ct, nc) for (file, _, fn), (_, nc, _, ct, _) in stats.items()
            if f"{os.sep}analytics{os.sep}" in file]
    return sorted(rows, key=lambda r: -r[1])[:top]


def _write_lake(root: str, hours: int) -> None:
    from ingest import lake

    for h in range(hours):
        frames = synth_frames(seconds=3600, start=T0 + timedelta(hours=h), seed=h)
        for name, df in frames.items():
            if name == "host_facts" and h:
                continue
            lake.write_table(root, name, df)


def peak_rss_mb() -> float:
    """Peak resident memory of this process. On Linux from /proc/self/status VmHWM (the
    high-water mark of this process's own address space): ``getrusage().ru_maxrss`` is
    NOT usable in a child started by subprocess, because Linux carries the peak RSS of
    the forked parent image across execve into it - the child then "peaks" at whatever
    the parent held when it forked (here: the frames of the lake it had just written)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _lake_child(root: str) -> None:
    """Run in a fresh process: analyze hour 0 of the lake; print JSON with CPU time and peak RSS."""
    from analytics.pipeline import AnalyticsConfig, analyze_lake

    cfg = AnalyticsConfig(history=timedelta(0))
    t = time.process_time()
    res = analyze_lake(root, T0, T0 + timedelta(hours=1), config=cfg)
    cpu = time.process_time() - t
    print(json.dumps({"windows": res.features.height, "cpu_s": cpu, "peak_rss_mb": peak_rss_mb(),  # noqa: T201
                      "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def bench_lake() -> list[dict[str, float]]:
    out = []
    for hours in (1, 6):
        with tempfile.TemporaryDirectory(prefix="unveil-bench-") as root:
            _write_lake(root, hours)
            r = subprocess.run([sys.executable, __file__, "--lake-child", root], capture_output=True, text=True,
                               check=True, env=os.environ.copy())
            d = json.loads(r.stdout.strip().splitlines()[-1])
            d["lake_hours"] = hours
            out.append(d)
    return out


FP_TYPES = ("cgroup_cpu_throttle", "cpu_governor_powersave", "gpu_nic_numa_misplacement", "gpu_power_throttle",
            "irq_locality_miss", "memory_bandwidth_contention", "memory_pressure", "nic_drops", "pcie_link_degraded",
            "storage_contention", "thermal_throttle", "thp_coverage_loss")


def fp_scenario(name: str) -> object:
    """``healthy``: the shipped healthy scenario, 4 hosts (2 serving + 2 training), 20 min;
    ``<type>``: 4 hosts with the shipped scenario's workload, the injection on sim-00 from
    8 to 18 min; ``<type>_boot``: from boot to the end; ``shipped_<type>``: the shipped
    scenario as is (2 hosts), 20 min. Seed 1."""
    import tomllib
    from pathlib import Path

    from ingest.simulator import resolve_scenario
    from ingest.simulator.scenario import from_dict

    if name == "healthy":
        return resolve_scenario("healthy").with_overrides(hosts=4, duration_s=1200, seed=1)
    if name.startswith("shipped_"):
        return resolve_scenario(name[8:]).with_overrides(duration_s=1200, seed=1)
    boot = name.endswith("_boot")
    typ = name.removesuffix("_boot")
    path = Path(__file__).resolve().parents[1] / "ingest" / "simulator" / "scenarios" / f"{typ}.toml"
    doc = tomllib.loads(path.read_text())
    wl = doc["hosts"][0].get("workload", "llm_serving")
    doc.update(duration="20m", seed=1, hosts=[{"name": f"sim-{i:02d}", "workload": wl} for i in range(4)])
    for inj in doc["injections"]:
        inj.update(host="sim-00", start="1s" if boot else "8m", duration="20m" if boot else "10m")
    return from_dict(doc, name=name)


def fp_check(names: list[str]) -> None:
    """Window-level false alarms and recall of the default configuration on simulated
    fleets (docs/analytics.md, Verdicts): FP = flagged windows outside the injected
    host's label interval (all hosts), recall = flagged windows inside it; per detector
    its own flags under the judging reference after the 5-min warm-up, combined = the
    findings over all windows."""
    from analytics.features import compute_features
    from analytics.pipeline import AnalyticsConfig, analyze
    from ingest.simulator.run import simulate_frames

    for name in names or ["healthy", *FP_TYPES]:
        frames, _ = simulate_frames(fp_scenario(name))  # type: ignore[arg-type]
        facts, labels = frames.pop("host_facts"), frames.pop("labels", None)
        frames.pop("workload", None)
        feats = compute_features({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
        res = analyze({}, AnalyticsConfig(), host_facts=facts, features=feats)
        keys = feats.select("host", "window_start")
        pos = np.zeros(feats.height, dtype=bool)
        for r in (labels.iter_rows(named=True) if labels is not None else []):
            pos |= ((feats["host"] == r["host"]) & (feats["window_start"] < r["end"])
                    & (feats["window_end"] > r["time"])).to_numpy()
        post = feats.select(pl.col("window_start") >= pl.col("window_start").min() + timedelta(minutes=5)
                            ).to_series().to_numpy()
        s = res.scores
        cohort_hosts = set(s.filter(pl.col("reference") == "cohort")["host"].to_list())
        s = s.filter(pl.when(pl.col("host").is_in(list(cohort_hosts))).then(pl.col("reference") == "cohort")
                     .otherwise(pl.col("reference") == "self"))
        out = [f"{name:36s} cohort hosts {len(cohort_hosts)}"]
        for d in ("combined", "zscore", "iforest", "mahalanobis"):
            if d == "combined":
                flags = keys.join(res.findings.select("host", "window_start", pl.lit(True).alias("f")),
                                  on=["host", "window_start"], how="left")["f"].fill_null(False).to_numpy()
                m = np.ones_like(post)
            else:
                flags = keys.join(s.filter(pl.col("detector") == d).select("host", "window_start", pl.col("flagged").alias("f")),
                                  on=["host", "window_start"], how="left")["f"].fill_null(False).to_numpy()
                m = post
            rec = f"{100 * flags[pos & m].mean():5.1f}" if (pos & m).any() else "    -"
            out.append(f"{d} FP {100 * flags[~pos & m].mean():5.2f} % rec {rec} %")
        print("  ".join(out))  # noqa: T201


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", choices=("synth", "sim"), default="synth")
    ap.add_argument("--lake-check", action="store_true", help="also run the 1-h vs 6-h lake memory check")
    ap.add_argument("--lake-child", metavar="ROOT", help=argparse.SUPPRESS)
    ap.add_argument("--breakdown", action="store_true", help="also print where one analyze() spends its time")
    ap.add_argument("--fp-check", nargs="*", metavar="SCENARIO",
                    help="instead: false alarms / recall on simulated fleets (healthy, <type>, <type>_boot, "
                         "shipped_<type>; default healthy + every type)")
    args = ap.parse_args()
    if args.lake_child:
        _lake_child(args.lake_child)
        return 0
    if args.fp_check is not None:
        fp_check(args.fp_check)
        return 0
    r = bench_memory(args.repeat, args.source)
    print(f"in-memory: {r['rows']:,} telemetry rows -> {r['windows']} windows x {r['features']} features, "  # noqa: T201
          f"{r['findings']} findings")
    print(f"  features + zscore + iforest + mahalanobis + attribution: {r['cpu_s_best']:.3f} CPU-s best, "  # noqa: T201
          f"{r['cpu_s_median']:.3f} median of {args.repeat}  ->  {r['host_hours_per_cpu_s']:.2f} host-hours per CPU-second")
    print(f"  of which features {r['features_cpu_s']:.3f} CPU-s, standardise + detectors + verdicts + "  # noqa: T201
          f"attribution {r['detect_cpu_s']:.3f} CPU-s (best of {args.repeat} each)")
    print(f"  peak RSS of this process: {peak_rss_mb():.0f} MB")  # noqa: T201
    if args.breakdown:
        print("breakdown of one analyze() (cProfile, cumulative CPU-s incl. callees; inflated by the profiler):")  # noqa: T201
        for name, cum, calls in breakdown(args.source):
            print(f"  {cum:7.3f}  {calls:5d}x  {name}")  # noqa: T201
    if args.lake_check:
        for d in bench_lake():
            print(f"lake of {d['lake_hours']} h, analyse 1 h (scan + analyze, fresh process): "  # noqa: T201
                  f"{d['cpu_s']:.3f} CPU-s, peak RSS {d['peak_rss_mb']:.0f} MB, {d['windows']} windows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
