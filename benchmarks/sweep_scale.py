"""The production sweep at fleet scale: ``unveil schedule --once`` end to end, per fleet size.

For each N in ``--hosts`` a fleet of N simulated 8-GPU hosts (mixed workloads, healthy,
100 ms telemetry) is written into a fresh lake for ``--duration``; then the command a user
runs, ``unveil schedule --once --until END``, sweeps it in a child process with the default
configuration (no config file, no InfluxDB): lake scan, history, features, detectors,
signature matching, incidents, remediation proposals, staged writes and publishing. The
child's CPU (user + system) and peak RSS come from ``wait4``; simulation time is not counted.

It prints, per N: host-hours swept, CPU-s, CPU-s per host-hour, wall time, peak RSS, the
growth of CPU per host-hour and of RSS against the smallest N, and the findings and
incidents the sweep wrote (the fleet is healthy: all of them are false). With ``--profile`` the
same sweep runs again on a copy of the lake under cProfile, and the CPU is split into
stages by the cumulative CPU time (process time) of the functions that implement them (stages nest: the
lines are not additive; "other" is the total minus the top-level stages).

    .venv/bin/python benchmarks/sweep_scale.py --hosts 8 16 --duration 30m [--profile] [--json F]
    .venv/bin/python benchmarks/sweep_scale.py --engine processes:1   # then processes:2: the speed-up
    .venv/bin/python benchmarks/sweep_scale.py --hosts 64 --duration 90m --live 30   # the live steady state
    .venv/bin/python benchmarks/sweep_scale.py --hosts 16 --duration 75m --live 5 --facts-age 24h   # a day-old lake
    .venv/bin/python benchmarks/sweep_scale.py --hosts 64 --s3   # the lake in a bucket (moto on loopback)

``--live M`` times the live scheduler instead: the first ``duration - M`` of the data is
swept as a catch-up, then the last M minutes one cycle per simulated minute (``--every K``:
one every K minutes, each sweeping K) in one process on one engine (what ``unveil schedule``
does each minute, without its timer; its compaction every ``compact_every`` of simulated
time, counted in), so every step reads its full history (``[analytics] history``, 1 h by default), as on a host that
has run for an hour. It prints the CPU-s per host-hour of those cycles (the process and its
pool's workers, psutil) and each cycle's wall time against its one-minute cadence: a
worker keeps up with a fleet while its cycles stay under a minute.

``--facts-age D`` (with ``--live``) first gives each host D of earlier ``host_facts``
snapshots, one a minute, as the agent writes them (~540 facts a host), without the telemetry
of that time: the sweep's cost on a lake that has collected facts for D.

``--engine SPEC`` is passed to the sweep (``unveil schedule --engine``; default: the command's,
a process pool of every core). The fleets are simulated on a process pool of every core
whatever ``--engine`` says (simulation is not timed). The CPU of a process pool's workers is
counted (``wait4`` reports the child with the children it reaped) and peak RSS is that of the
largest one process; the CPU of a Ray cluster's workers is not (they are the cluster's).

The target of issue 18: <= 0.5 CPU-s per host-hour, peak RSS <= 2 GB at 8, 64 and 256 hosts.
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import functools
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # the simulator's default start
ROOT = Path(__file__).resolve().parent.parent

#: stage -> the functions that implement it: a name (any of the project's modules, so moving
#: a function between modules keeps the breakdown working) or "path:name" where the name is
#: common (e.g. "_features", "_read")
STAGES: dict[str, tuple[str, ...]] = {
    # raw telemetry (load_lake, _raw) and the stored features the steps read back (HostFiles._read)
    "lake read (raw, stored features)": ("load_lake", "_raw", "jobs/telemetry.py:_read"),
    "features": ("analytics/features/engine.py:_features",),
    "standardise + detectors + attribution": ("analyze", "_analysed"),
    "signature matching + findings": ("detect",),
    "incidents": ("incidents_of",),
    "remediation proposals + queue export": ("queue_remediations", "export_remediations"),
    "staged writes + seal + publish": ("jobs/watermarks.py:write", "jobs/watermarks.py:seal",
                                       "jobs/watermarks.py:publish", "write_table", "_stage_scores"),
}
#: the stages that do not nest in each other, for "other"
TOP_LEVEL = ("lake read (raw, stored features)", "features", "standardise + detectors + attribution",
             "signature matching + findings", "incidents", "remediation proposals + queue export",
             "staged writes + seal + publish")


@dataclass
class Point:
    hosts: int
    host_hours: float
    rows: int
    cpu_s: float
    wall_s: float
    peak_rss_mb: float
    simulate_s: float
    stages: dict[str, float] = field(default_factory=dict)
    engine: str = "default"
    findings: int = 0  # the fleet is healthy: every finding and incident is a false one
    incidents: int = 0  # distinct incident_id

    @property
    def cpu_per_host_hour(self) -> float:
        return self.cpu_s / self.host_hours


def simulate_fleet(lake: str | Path, hosts: int, duration: timedelta, seed: int) -> tuple[int, float]:
    """N healthy hosts of mixed workloads into ``lake``, one host per worker of a process
    pool of every core; (rows written, seconds)."""
    from ingest.simulator import from_dict, simulate
    from jobs.commands.simulate import open_sinks
    from jobs.engine import make_engine

    t = time.perf_counter()
    doc = {"seed": seed, "duration": f"{int(duration.total_seconds())}s", "hosts": hosts, "workload": "mixed",
           "start": T0.isoformat().replace("+00:00", "Z")}
    with make_engine("processes") as engine:
        res = simulate(from_dict(doc), functools.partial(open_sinks, str(lake)), mapper=engine.map)
    return sum(res.rows.values()), time.perf_counter() - t


def prepend_facts(lake: Path, before: timedelta) -> int:
    """Each host's first ``host_facts`` snapshot repeated once a minute over ``before``
    ahead of its telemetry: the facts an agent that ran that long wrote (every fact at every
    snapshot), without the telemetry of that time (retention, or not simulated). Rows added."""
    import polars as pl

    from ingest import lake as lake_mod

    facts = lake_mod.read(lake, "host_facts")
    first = facts.filter(pl.col("time") == pl.col("time").min().over("host")).drop(
        [c for c in ("date", "hour") if c in facts.columns])
    minutes = int(before.total_seconds() // 60)
    added = 0
    for _, snap in first.partition_by("host", as_dict=True).items():  # (one host's day at a time)
        rows = pl.concat([snap.with_columns(pl.col("time") - pl.duration(minutes=i)) for i in range(1, minutes + 1)])
        lake_mod.write_table(lake, "host_facts", rows)
        added += rows.height
    return added


def split_commits(lake: Path, since: datetime) -> int:
    """The telemetry from ``since`` on as the agent leaves it: a file per table, host and
    minute (it commits every ``commit_interval_s``, 60 s), where the simulator wrote one file
    per table, host and hour. The live cycles' maintenance compacts them every
    ``compact_every``, as on a real lake. Files written."""
    import polars as pl

    from ingest import lake as lake_mod
    from jobs.telemetry import telemetry_tables

    written = 0
    for t in telemetry_tables(lake):
        for path in lake_mod.files(lake, t, start=since):
            df = lake_mod.scan_file(lake, path).collect()
            late = df.filter(pl.col("time") >= since)
            if not late.height:
                continue
            host = next(d.name for d in path.parents if d.name.startswith("host=")).removeprefix("host=")
            early = df.filter(pl.col("time") < since)
            minutes = late.with_columns(pl.col("time").dt.truncate("1m").alias("_m"))
            for part in [early, *minutes.partition_by("_m", include_key=False, maintain_order=True)]:
                if part.height:
                    written += len(lake_mod.write_table(lake, t, part.with_columns(pl.lit(host).alias("host"))))
            path.unlink()
    return written


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNVEIL_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def schedule_cmd(lake: str | Path, until: datetime, engine: str | None = None, state: Path | None = None,
                 config: Path | None = None, script: str = "import sys; from jobs.cli import main; sys.exit(main())"
                 ) -> list[str]:
    """``unveil [--config FILE] schedule --once ...`` as a child process; ``script``: the
    Python that runs the CLI (e.g. under cProfile)."""
    return [sys.executable, "-c", script, *(["--config", str(config)] if config else []), "schedule",
            "--once", "--no-progress", "--lake", str(lake), "--until", until.isoformat(),
            *(["--engine", engine] if engine else []), *(["--state", str(state)] if state else [])]


def run_child(cmd: list[str], cwd: Path) -> tuple[float, float, float]:
    """(CPU-s user+sys, wall-s, peak RSS MiB) of one child process, from wait4."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{err.decode(errors='replace')[-4000:]}")
    return ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024


def verdicts(lake: str | Path) -> dict[str, int]:
    """Findings and distinct incidents the sweep wrote (all false: the fleet is healthy)."""
    from ingest import lake as lake_mod

    have = lake_mod.tables(lake)
    out = {"findings": 0, "incidents": 0}
    if "findings" in have:
        out["findings"] = lake_mod.read(lake, "findings").height
    if "incidents" in have:
        out["incidents"] = lake_mod.read(lake, "incidents")["incident_id"].n_unique()
    return out


def _is_stage(fname: str, func: str, names: tuple[str, ...]) -> bool:
    """Whether function ``func`` of file ``fname`` is one of ``names`` (see :data:`STAGES`)."""
    for n in names:
        path, _, name = n.rpartition(":")
        if func == name and (not path or fname.endswith("/" + path)):
            return True
    return False


def stage_split(prof: Path) -> dict[str, float]:
    """Cumulative seconds per stage from a cProfile dump (project functions only)."""
    st = pstats.Stats(str(prof))
    total = max((ct for (_f, _l, _n), (_cc, _nc, _tt, ct, _callers) in st.stats.items()), default=0.0)  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    root = str(ROOT)
    for stage, names in STAGES.items():
        s = 0.0
        for (fname, _line, func), (_cc, _nc, _tt, ct, callers) in st.stats.items():  # type: ignore[attr-defined]
            if not fname.startswith(root) or "/benchmarks/" in fname or not _is_stage(fname, func, names):
                continue
            # a recursive or re-entrant stage: count only calls from outside the stage
            if any(_is_stage(c[0], c[2], names) for c in callers):
                continue
            s += ct
        out[stage] = s
    out["other (total minus the stages above)"] = max(0.0, total - sum(out[k] for k in TOP_LEVEL))
    out["total (profiled)"] = total
    return out


def measure(hosts: int, duration: timedelta, seed: int, profile: bool, keep: Path | None,
            engine: str | None = None, bucket: str | None = None, config: Path | None = None) -> Point:
    """``bucket``: the lake in it (object storage; the sweep's state in the scratch
    directory) instead of a directory."""
    with tempfile.TemporaryDirectory(prefix="sweep-scale-", dir=keep) as d:
        base = Path(d)
        lake: str | Path = base / "lake" if bucket is None else f"s3://{bucket}/lake-{hosts}-{time.time_ns()}"
        state = None if bucket is None else base / "state"
        rows, sim_s = simulate_fleet(lake, hosts, duration, seed)
        prof_lake = None
        if profile:
            prof_lake = base / "lake-prof"
            shutil.copytree(lake, prof_lake)
        until = T0 + duration
        cpu, wall, rss = run_child(schedule_cmd(lake, until, engine, state, config), base)
        pt = Point(hosts, hosts * duration.total_seconds() / 3600, rows, cpu, wall, rss, sim_s,
                   engine=engine or "default", **verdicts(lake))
        if prof_lake is not None:
            out = base / "sweep.prof"
            run_child(schedule_cmd(prof_lake, until, engine, config=config,
                                   script="import cProfile, time; from jobs.cli import main; "
                                   "pr = cProfile.Profile(time.process_time); pr.runcall(main); "
                                   f"pr.dump_stats({str(out)!r})"), base)
            pt.stages = stage_split(out)
        return pt


#: the live scheduler in one process (what ``unveil schedule`` does each minute, without
#: APScheduler's timer): catch up to ``start``, then one cycle per simulated minute on one
#: engine, and its maintenance (compaction, retention) every ``compact_every`` of simulated
#: time; CPU of this process and its pool's workers (psutil), per phase
LIVE_CHILD = r"""
import json, sys, time
from datetime import datetime, timedelta
import psutil
from dataclasses import replace
from jobs.config import SweepConfig, load
from jobs.cycle import maintain, run_cycle
from jobs.engine import make_engine, parse_spec
lake, start, minutes, every = sys.argv[1], datetime.fromisoformat(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prof_out = sys.argv[5]  # "": not profiled; else the live cycles' cProfile dump (this process only)
# argv[6]: a config file ("": none, the defaults), argv[7]: the engine (absent: the config's)
sc = load(sys.argv[6]).sweep if sys.argv[6] else SweepConfig()
if len(sys.argv) > 7:
    sc = replace(sc, engine=parse_spec(sys.argv[7], "--engine"))
me = psutil.Process()
def cpu():
    t = sum(me.cpu_times()[:4])  # (user, system, and the reaped children's)
    for p in me.children(recursive=True):
        try:
            t += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return t
with make_engine(sc.engine) as engine:
    c0 = cpu()
    run_cycle(lake, sc, until=start, engine=engine)
    c1 = cpu()
    if prof_out:
        import cProfile
        prof = cProfile.Profile(time.process_time)
        prof.enable()
    walls = []
    compact = round(sc.compact_every.total_seconds() / 60) if sc.compact_every else 0
    for k in range(every, minutes + 1, every):
        t = time.perf_counter()
        run_cycle(lake, sc, until=start + timedelta(minutes=k), engine=engine)
        walls.append(time.perf_counter() - t)
        if compact and k % compact < every:  # the scheduler's maintenance job, on simulated time
            maintain(lake, sc)
    c2 = cpu()
    if prof_out:
        prof.disable()
        prof.dump_stats(prof_out)
print(json.dumps({"catchup_cpu_s": c1 - c0, "live_cpu_s": c2 - c1, "walls": walls}))
"""


@dataclass
class LivePoint:
    hosts: int
    minutes: int  # minutes swept by the timed cycles
    history_min: float  # data before the first timed cycle
    catchup_cpu_s: float
    live_cpu_s: float
    cycle_wall_s: list[float]
    peak_rss_mb: float
    findings: int = 0
    incidents: int = 0
    every: int = 1  # minutes between cycles (each sweeps that many)
    stages: dict[str, float] = field(default_factory=dict)  # of the timed cycles (--profile)

    @property
    def cpu_per_host_hour(self) -> float:
        return self.live_cpu_s / (self.hosts * self.minutes / 60)


def _run_live(lake: Path, start: datetime, minutes: int, every: int, engine: str | None, d: Path,
              prof_out: Path | None = None, config: Path | None = None) -> tuple[dict[str, Any], float]:
    """(the live child's figures, its peak RSS in MiB)."""
    cmd = [sys.executable, "-c", LIVE_CHILD, str(lake), start.isoformat(), str(minutes), str(every),
           str(prof_out or ""), str(config or ""), *([engine] if engine else [])]
    with open(d / "stderr", "w+b") as err:
        p = subprocess.Popen(cmd, cwd=d, env=_env(), stdout=subprocess.PIPE, stderr=err)
        assert p.stdout is not None
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)  # (peak RSS of the largest of it and its workers)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"live sweep exited {p.returncode}:\n{err.read().decode(errors='replace')[-4000:]}")
    return json.loads(out.decode().strip().splitlines()[-1]), ru.ru_maxrss / 1024


def measure_live(hosts: int, duration: timedelta, minutes: int, seed: int, keep: Path | None,
                 engine: str | None = None, every: int = 1, facts_before: timedelta | None = None,
                 profile: bool = False, config: Path | None = None, agent_commits: bool = False) -> LivePoint:
    """The steady state of ``unveil schedule``: the last ``minutes`` of the data swept one
    cycle per minute after a catch-up over the rest (so each step reads its full history);
    ``facts_before``: :func:`prepend_facts` first (a lake that old); ``agent_commits``:
    :func:`split_commits` of the timed minutes first. ``profile``: a second
    run on a copy of the lake splits the timed cycles' CPU into stages (cProfile of the
    scheduler's process: with a pool, the workers' share is not in it)."""
    with tempfile.TemporaryDirectory(prefix="sweep-live-", dir=keep) as d:
        lake = Path(d) / "lake"
        simulate_fleet(lake, hosts, duration, seed)
        if facts_before:
            prepend_facts(lake, facts_before)
        start = T0 + duration - timedelta(minutes=minutes)
        if agent_commits:
            split_commits(lake, start)
        prof_lake = None
        if profile:
            prof_lake = Path(d) / "lake-prof"
            shutil.copytree(lake, prof_lake)
        got, rss = _run_live(lake, start, minutes, every, engine, Path(d), config=config)
        lp = LivePoint(hosts, minutes, duration.total_seconds() / 60 - minutes, got["catchup_cpu_s"],
                       got["live_cpu_s"], got["walls"], rss, **verdicts(lake), every=every)
        if prof_lake is not None:
            out = Path(d) / "live.prof"
            _run_live(prof_lake, start, minutes, every, engine, Path(d), out, config)
            lp.stages = stage_split(out)
        return lp


def render(points: list[Point]) -> str:
    lines = ["| hosts | host-hours | CPU-s | CPU-s per host-hour | wall s | peak RSS MiB | CPU/h-h vs first | RSS vs first "
             "| findings | incidents |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    p0 = points[0]
    for p in points:
        lines.append(f"| {p.hosts} | {p.host_hours:.2f} | {p.cpu_s:.1f} | {p.cpu_per_host_hour:.2f} | {p.wall_s:.1f} | "
                     f"{p.peak_rss_mb:.0f} | {p.cpu_per_host_hour / p0.cpu_per_host_hour:.2f}x | "
                     f"{p.peak_rss_mb / p0.peak_rss_mb:.2f}x | {p.findings} | {p.incidents} |")
    for p in points:
        lines += render_stages(p.hosts, p.stages)
    return "\n".join(lines)


def render_stages(hosts: int, stages: dict[str, float], what: str = "") -> list[str]:
    if not stages:
        return []
    tot = stages.get("total (profiled)", 0.0) or 1.0
    lines = [f"\nStages at {hosts} hosts{what} (cProfile, cumulative s; nested, not additive):"]
    for k, v in stages.items():
        lines.append(f"  {k:<45} {v:8.2f}  {100 * v / tot:5.1f} %")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8], help="fleet sizes (default 8)")
    ap.add_argument("--duration", default="30m", help="simulated time per host, e.g. 30m, 1h (default 30m)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="also split the CPU into stages (cProfile, second run; with --live, of the timed cycles; "
                    "the scheduler's process only: use --engine serial to see the workers' share)")
    ap.add_argument("--tmp", type=Path, default=None, help="where the scratch lakes go (default $TMPDIR)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    ap.add_argument("--engine", default=None, metavar="SPEC",
                    help="the sweep's engine (unveil schedule --engine): serial, processes[:N], ray[:N], "
                    "ray://HOST:PORT (default: the command's)")
    ap.add_argument("--live", type=int, default=0, metavar="MINUTES",
                    help="instead: the steady state of the live scheduler, the last MINUTES of the data swept "
                    "one cycle per minute after a catch-up over the rest (CPU-s per host-hour of those "
                    "cycles, each cycle's wall time against its one-minute cadence)")
    ap.add_argument("--every", type=int, default=1, metavar="MINUTES",
                    help="with --live: a cycle every MINUTES simulated minutes (unveil schedule --every), "
                    "each sweeping that many; --live must be a multiple of it (default 1)")
    ap.add_argument("--facts-age", default=None, metavar="DURATION",
                    help="with --live: first give each host this much of earlier host_facts snapshots, one a "
                    "minute, as an agent that ran that long wrote them (e.g. 24h; the telemetry of that time "
                    "is not simulated)")
    ap.add_argument("--agent-commits", action="store_true",
                    help="with --live: the live minutes' telemetry as the agent leaves it, a file per table, host "
                    "and minute (its commit every 60 s; the cycles' maintenance compacts them every compact_every), "
                    "where the simulator writes a file per table, host and hour")
    ap.add_argument("--s3", action="store_true",
                    help="the lake on object storage: a bucket of moto's S3 server started on loopback (an "
                    "in-memory Python server: its times are not a real object store's), the sweep's state "
                    "in a scratch directory (unveil schedule --state); not with --live or --profile")
    ap.add_argument("--config", type=Path, default=None, metavar="FILE",
                    help="sweep with this config file (unveil --config FILE schedule), e.g. another "
                    "[scheduler] analysis_step (with --live, --every sets the cadence); default: none, the defaults")
    a = ap.parse_args(argv)
    from ingest.simulator.scenario import parse_duration_s

    if a.config:  # (a file the children cannot load is a usage error here, before any simulation)
        from benchmarks.id_matrix import sweep_config

        sweep_config(ap, a.config)

    duration = timedelta(seconds=parse_duration_s(a.duration, "--duration"))
    if a.engine:
        from jobs.engine import parse_spec

        a.engine = parse_spec(a.engine, "--engine")
    conf = f"config {a.config}" if a.config else "default config"
    print(f"sweep scale: unveil schedule --once, {conf}, {a.duration} of healthy mixed-workload "
          f"8-GPU hosts per fleet, seed {a.seed}, engine {a.engine or 'default'}; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    if a.agent_commits and not a.live:
        ap.error("--agent-commits takes --live (the layout of the timed minutes)")
    if a.live:
        if a.s3:
            ap.error("--s3 does not take --live")
        if timedelta(minutes=a.live) >= duration:
            ap.error("--live must be shorter than --duration (the rest is the history)")
        if a.every < 1 or a.live % a.every:
            ap.error("--live must be a multiple of --every")
        facts_age = timedelta(seconds=parse_duration_s(a.facts_age, "--facts-age")) if a.facts_age else None
        print(f"live: the last {a.live} min swept one cycle every {a.every} min, after a catch-up over the first "
              f"{duration.total_seconds() / 60 - a.live:.0f} min"
              + (f"; {a.facts_age} of host_facts snapshots before the telemetry" if facts_age else "")
              + ("; its telemetry in a file per table, host and minute (the agent's commits)" if a.agent_commits else ""))
        lives = []
        for n in sorted(a.hosts):
            lp = measure_live(n, duration, a.live, a.seed, a.tmp, a.engine, a.every, facts_age, a.profile, a.config,
                              a.agent_commits)
            w = sorted(lp.cycle_wall_s)
            print(f"  {n} hosts: {lp.live_cpu_s:.1f} CPU-s in {len(w)} cycles ({lp.cpu_per_host_hour:.2f} per "
                  f"host-hour; catch-up {lp.catchup_cpu_s:.1f} CPU-s), cycle wall median {w[len(w) // 2]:.1f} s, "
                  f"max {w[-1]:.1f} s (cadence {60 * a.every} s), peak RSS {lp.peak_rss_mb:.0f} MiB, "
                  f"{lp.findings} findings, {lp.incidents} incidents", flush=True)
            for line in render_stages(n, lp.stages, f", the {len(w)} timed cycles of a second run"):
                print(line, flush=True)
            lives.append(lp)
        if a.json:
            a.json.write_text(json.dumps([asdict(p) | {"cpu_per_host_hour": p.cpu_per_host_hour} for p in lives],
                                         indent=2))
        return 0
    points = []
    moto = None
    if a.s3:
        if a.profile:
            ap.error("--s3 does not take --profile")
        from benchmarks.lake_s3 import moto_bucket

        moto = moto_bucket("sweep-scale")
        print("lake: s3://sweep-scale/... on moto (loopback)")
    try:
        for n in sorted(a.hosts):
            points.append(measure(n, duration, a.seed, a.profile, a.tmp, a.engine, "sweep-scale" if a.s3 else None,
                                  a.config))
            p = points[-1]
            print(f"  {n} hosts: {p.cpu_s:.1f} CPU-s ({p.cpu_per_host_hour:.2f} per host-hour), {p.wall_s:.1f} s "
                  f"wall, peak RSS {p.peak_rss_mb:.0f} MiB (simulated in {p.simulate_s:.0f} s)", flush=True)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait()
    print(render(points))
    if a.json:
        a.json.write_text(json.dumps([asdict(p) | {"cpu_per_host_hour": p.cpu_per_host_hour} for p in points],
                                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
