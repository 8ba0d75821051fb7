"""``unveil schedule``: periodic sweeps from each host's watermark, then matching, remediation
queueing and write-back; periodic compaction and retention. ``--once`` runs one cycle (cron)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ingest import lake as lake_mod
from jobs import config as config_mod
from jobs.commands import unknown_hosts, warn_corrupt
from jobs.config import SweepConfig, duration
from jobs.cycle import CycleSummary, maintain, run_cycle
from jobs.engine import make_engine, parse_spec
from jobs.timeparse import parse_time


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared with ``unveil postmortem``."""
    p.add_argument("--lake", metavar="PATH", help="lake root (default: config file or UNVEIL_LAKE)")
    p.add_argument("--chunk", metavar="DUR", help="data time per commit / analysis step (default 1h)")
    p.add_argument("--influx-url", metavar="URL", help="InfluxDB URL (default: [influx] url of the config)")
    p.add_argument("--influx-database", metavar="DB", help="InfluxDB database (default: unveil)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="draw a progress line on stderr (default: only on a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="never draw progress")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="sweep periodically from each host's watermark (exactly once per window)",
                       description=__doc__)
    add_common(p)
    p.add_argument("--every", default=None, metavar="DUR", help="period between cycles (default 60s)")
    p.add_argument("--once", action="store_true", help="run one cycle and exit (for cron and tests)")
    p.add_argument("--maintain", action="store_true", help="with --once: also compact and apply retention")
    p.add_argument("--lag", metavar="DUR", help="stay this far behind now for late data (default 90s: agents commit every minute)")
    p.add_argument("--until", metavar="T", help="process no data after T (ISO or relative; replays, tests)")
    p.add_argument("--start-at", metavar="T", help="first watermark of hosts never swept (default: their first data)")
    p.add_argument("--max-chunks", type=int, metavar="N", help="at most N chunks per cycle (bounded catch-up)")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="only these hosts (default: every host in the lake)")
    p.add_argument("--no-remediation", action="store_true", help="do not queue remediations")
    p.add_argument("--state", metavar="DIR",
                   help="for a lake on object storage (s3://...): the directory of its sweep state (watermarks, "
                   "lock, staged outputs, remediation queue; default: [lake] state)")
    add_engine(p)
    p.set_defaults(func=run)


def add_engine(p: argparse.ArgumentParser) -> None:
    """``--engine SPEC`` (``unveil schedule`` and ``unveil sweep``)."""
    p.add_argument("--engine", metavar="SPEC",
                   help="where the sweep's per-host work runs: serial, processes[:N], ray[:N] (a local Ray) or "
                   "ray://HOST:PORT (a Ray cluster) (default: [scheduler] engine, else processes: every local core)")


def sweep_config(args: argparse.Namespace, cfg: config_mod.Config, lake: str | Path) -> SweepConfig:
    """The config tree's sweep ([scheduler], [analytics], [remediation]) with [influx] and the
    flags overlaid."""
    over: dict[str, object] = {}
    url = getattr(args, "influx_url", None) or cfg.influx.url
    if url:
        # a spool in the lake's state survives a crash of the scheduler (a temp dir would not)
        spool = cfg.influx.spool_dir or lake_mod.state_root(lake) / "_spool" / "writeback"
        over["influx"] = replace(cfg.influx, url=url, spool_dir=spool,
                                 database=getattr(args, "influx_database", None) or cfg.influx.database)
    for flag in ("chunk", "lag"):
        v = getattr(args, flag, None)
        if v:
            over[flag] = duration(v, f"--{flag}", zero=flag == "lag")
    if getattr(args, "start_at", None):
        over["start_at"] = parse_time(args.start_at)
    if getattr(args, "max_chunks", None) is not None:
        over["max_chunks"] = args.max_chunks
    if getattr(args, "no_remediation", False):
        over["queue_remediations"] = False
    if getattr(args, "engine", None):
        over["engine"] = parse_spec(args.engine, "--engine")
    return replace(cfg.sweep, **over) if over else cfg.sweep  # type: ignore[arg-type]


def print_summary(s: CycleSummary | None, seen: set[Path] | None = None) -> None:
    """The cycle's summary on stdout; each corrupt file skipped warned once on stderr
    (once per process with ``seen``)."""
    if s is None:
        print("skipped: another scheduler holds this lake's lock", file=sys.stderr)
        return
    horizon = s.horizon.isoformat() if s.horizon else "-"
    state = "caught up" if s.caught_up else "backlog left"
    print(f"cycle to {horizon}: {len(s.chunks)} chunk(s), {s.windows} windows, {s.findings} findings, "
          f"{s.incidents} incidents opened or updated ({state})")
    if s.recovered:
        print(f"recovered interrupted sweep(s): {', '.join(s.recovered)}")
    if s.verifications:
        print("remediation verifications concluded: "
              + ", ".join(f"{n} {state}" for state, n in sorted(s.verifications.items())))
    if s.influx_points:
        print(f"written to InfluxDB: {s.influx_points} points")
    sys.stdout.flush()
    warn_corrupt("schedule", s.corrupt, seen)


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config)
    lake = config_mod.resolve_lake_and_state(args.lake, args.state, cfg)
    if isinstance(lake, Path) and lake.exists() and not lake.is_dir():
        raise config_mod.ConfigError(f"lake {lake} exists but is not a directory")
    if args.once and not lake_mod.exists(lake):
        # one cycle must not hang a cron job: the next run finds the lake
        raise config_mod.ConfigError(f"lake {lake} does not exist (yet): --once does not wait for it "
                                     "(without --once the scheduler waits for the agent's first commit)")
    sc = sweep_config(args, cfg, lake)
    until = parse_time(args.until) if args.until else None
    if (msg := unknown_hosts(lake, args.hosts)) is not None:
        # not an error: a scheduler may start before a host's agent has committed anything
        print(f"unveil schedule: warning: {msg}; nothing is swept for it until it has", file=sys.stderr)
    if args.once:
        with make_engine(sc.engine) as engine:
            try:
                summary = run_cycle(lake, sc, until=until, hosts=args.hosts, progress=args.progress, engine=engine)
            except OSError as exc:  # (a disk, or an object store that stopped answering)
                raise lake_mod.LakeError(f"the cycle on {lake} stopped: {exc}. Nothing it had not committed is "
                                         "visible; the next cycle resumes from the watermarks (a sealed sweep is "
                                         "published first)") from exc
        print_summary(summary)
        if args.maintain and summary is not None:
            out = maintain(lake, sc)
            c = out["compaction"]
            print(f"compaction: {c['merges']} merge(s), {c['files_before']} -> {c['files_after']} files; "
                  f"retention: {out['retention'] or 'none configured'}")
        return 0
    # a number or a duration, > 0 either way (0 or -5 would spin or never run)
    every = duration(args.every, "--every") if args.every else cfg.every
    from jobs.scheduler import Scheduler

    warned: set[Path] = set()  # a file skipped again in later cycles is not warned again
    return Scheduler(lake, sc, every=every, until=until, hosts=args.hosts, progress=args.progress,
                     on_cycle=lambda s: print_summary(s, warned)).run()
