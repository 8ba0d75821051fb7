"""``unveil drill``: inject real, reversible faults on this host while the real agent and
scheduler watch, then print and store a scorecard per fault (see docs/drill.md)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from jobs import config as config_mod
from jobs.config import duration as _duration
from jobs.drill import (
    FAULTS,
    DrillConfig,
    DrillError,
    DrillInterrupted,
    parse_faults,
    restore_from_file,
    run_drill,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "drill", help="inject real, reversible faults on this host and score detection (root)",
        description=__doc__ + " Refuses without --yes unless the config marks the host as a canary "
        "([drill] canary = true). After a crash, 'unveil drill --restore' undoes what the state file "
        "in <lake>/_drill/ records.")
    p.add_argument("--lake", metavar="PATH", help="lake directory (default: config file or UNVEIL_LAKE)")
    p.add_argument("--yes", action="store_true", help="inject faults on a host not marked as a canary")
    p.add_argument("--restore", action="store_true", help="undo a crashed drill from its state file, then exit")
    p.add_argument("--faults", default=",".join(FAULTS), metavar="A,B",
                   help=f"faults to inject, in order (default {','.join(FAULTS)})")
    p.add_argument("--fault-seconds", default="60s", metavar="DUR", help="how long each fault holds (default 60s)")
    p.add_argument("--recovery-seconds", default="60s", metavar="DUR",
                   help="healthy time after each fault (default 60s)")
    p.add_argument("--healthy-seconds", default="180s", metavar="DUR",
                   help="healthy time before the first fault (default 180s)")
    p.add_argument("--workload", default="builtin", metavar="builtin|none|CMD",
                   help="what runs under the faults: the built-in memory-bound workload, nothing, or a command")
    p.add_argument("--every", default="60s", metavar="DUR", help="scheduler period (default 60s)")
    p.add_argument("--lag", default="15s", metavar="DUR", help="scheduler lag (default 15s; above the agent's commit period)")
    p.add_argument("--commit-seconds", default="5s", metavar="DUR", help="agent commit period (default 5s)")
    p.add_argument("--host", metavar="NAME", help="host tag (default: [agent] host or the hostname)")
    p.set_defaults(func=run)


def _seconds(value: str, flag: str) -> float:
    """A duration ('90s', '2m') or a plain number of seconds, > 0."""
    try:
        number = float(value)
    except ValueError:
        return _duration(value, flag).total_seconds()
    if not (0 < number < float("inf")):
        raise ValueError(f"{flag} must be a positive, finite number of seconds, got {value!r}")
    return number


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, analysis=False)
    lake = config_mod.resolve_lake(args.lake, cfg)
    try:
        if args.restore:
            n, errors = restore_from_file(lake)
            if errors:
                for e in errors:
                    print(f"unveil drill --restore: not restored: {e}", file=sys.stderr)
                return 1
            print(f"restored {n} change(s)" if n else f"nothing to restore in {lake}")
            return 0
        if not cfg.drill.canary and not args.yes:
            raise DrillError("this host is not marked as a drill canary ([drill] canary = true in the config): "
                             "pass --yes to inject real faults on it anyway")
        dcfg = DrillConfig(
            lake=Path(lake), faults=parse_faults(args.faults),
            fault_s=_seconds(args.fault_seconds, "--fault-seconds"),
            recovery_s=_seconds(args.recovery_seconds, "--recovery-seconds"),
            healthy_s=_seconds(args.healthy_seconds, "--healthy-seconds"),
            workload=args.workload, every_s=_seconds(args.every, "--every"), lag_s=_seconds(args.lag, "--lag"),
            commit_s=_seconds(args.commit_seconds, "--commit-seconds"),
            host=args.host or cfg.agent.host or socket.gethostname(), config_file=args.config,
            out=lambda line: print(line, flush=True))
        if dcfg.lag_s <= dcfg.commit_s:
            raise DrillError(f"--lag ({dcfg.lag_s:g} s) must exceed --commit-seconds ({dcfg.commit_s:g} s): "
                             "the scheduler would sweep windows before their rows land")
        run_drill(dcfg)
        return 0
    except DrillInterrupted as exc:
        print(f"unveil drill: {exc}: the host is restored", file=sys.stderr)
        return 128 + exc.signum
    except DrillError as exc:
        print(f"unveil drill: error: {exc}", file=sys.stderr)
        return 2
