"""``unveil agent``: sample this host into the lake (and InfluxDB) in the foreground."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from ingest import lake as lake_mod
from ingest.agent import Agent, AgentConfig, install_signal_handlers
from ingest.sink import Sink
from jobs import config as config_mod

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="sample this host's telemetry into the lake (and InfluxDB)",
        description="Runs in the foreground until SIGTERM (or --duration). The lake path can "
        "also come from the config file or UNVEIL_LAKE.",
    )
    p.add_argument("--lake", metavar="PATH", help="lake directory, or s3://bucket/prefix (with --state)")
    p.add_argument("--state", metavar="DIR",
                   help="for a lake on object storage: the directory of this agent's journal "
                   "(default: [lake] state)")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="fast-tier period (default 0.1)")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    p.add_argument("--influx-url", action="append", metavar="URL", default=None,
                   help="also write to this InfluxDB (repeatable)")
    p.add_argument("--influx-database", metavar="DB", help="InfluxDB database/bucket (default unveil)")
    p.add_argument("--host", metavar="NAME", help="host tag (default: hostname)")
    p.add_argument("--root", metavar="DIR", help="filesystem root to read /proc and /sys under")
    p.add_argument("--flush-interval", type=float, metavar="SECONDS",
                   help="journal append / InfluxDB send period (default 10)")
    p.add_argument("--commit-interval", type=float, metavar="SECONDS",
                   help="Parquet commit period of the journaled rows (default 60)")
    p.add_argument("--collectors", metavar="A,B", help="comma-separated collectors (default all)")
    p.add_argument("--all-fast", action="store_true", help="sample every source at the fast interval")
    p.add_argument("--durable", action="store_true",
                   help="fsync every lake file (survives power loss; costs CPU at each flush)")
    p.add_argument("--quiet", action="store_true", help="no summary at the end")
    p.set_defaults(func=run)


def _positive_flags(args: argparse.Namespace) -> None:
    """Period flags given must be positive: ``--interval 0`` used to fall back to the default."""
    for flag in ("--interval", "--flush-interval", "--commit-interval", "--duration"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not (0 < value < float("inf")):
            raise ValueError(f"{flag} must be a positive number of seconds, got {value:g}")


def build(args: argparse.Namespace) -> tuple[AgentConfig, list[Sink], str | Path]:
    """The config file's [agent] and [influx], the flags overlaid."""
    _positive_flags(args)
    cfg = config_mod.load(args.config, analysis=False)  # the agent does not carry the analytics
    lake = config_mod.resolve_lake_and_state(args.lake, args.state, cfg)
    a = cfg.agent
    # `is not None`, not `or`: a flag given is used as given (and was checked above)
    flush_s = args.flush_interval if args.flush_interval is not None else a.flush_interval_s
    acfg = replace(
        a,
        lake=lake,
        root=args.root or a.root,
        host=args.host or a.host,
        interval_s=args.interval if args.interval is not None else a.interval_s,
        flush_interval_s=flush_s,
        commit_interval_s=args.commit_interval if args.commit_interval is not None else max(a.commit_interval_s, flush_s),
        duration_s=args.duration,
        collectors=tuple(args.collectors.split(",")) if args.collectors else a.collectors,
        tiers=dict(a.tiers),
        all_fast=args.all_fast,
        durable=args.durable or a.durable,
    )
    from ingest.lake import LakeSink

    sinks: list[Sink] = [LakeSink(lake, durable=acfg.durable)]
    urls = args.influx_url or ([cfg.influx.url] if cfg.influx.url else [])
    if urls:
        from ingest.influx import InfluxSink

        for i, url in enumerate(urls):
            spool = cfg.influx.spool_dir or lake_mod.state_root(lake) / "_spool" / f"influx{i}"
            sinks.append(InfluxSink(replace(cfg.influx, url=url, spool_dir=spool,
                                            database=args.influx_database or cfg.influx.database)))
    return acfg, sinks, lake


def run(args: argparse.Namespace) -> int:
    acfg, sinks, lake = build(args)
    agent = Agent(acfg, sinks)
    install_signal_handlers(agent)
    for name, reason in agent.stats.unavailable.items():
        print(f"unveil agent: {name}: not collected ({reason})", file=sys.stderr)
    print(
        f"unveil agent: sampling {acfg.host} every {acfg.interval_s:g} s into {lake}"
        + "".join(f" and {s.name}" for s in sinks[1:]),
        file=sys.stderr,
        flush=True,
    )
    stats = agent.run()
    if not args.quiet:
        print(
            f"agent on {acfg.host}: {stats.ticks} ticks, {stats.missed_ticks} missed, "
            f"{stats.rows_written} rows in {stats.flushes} flushes, {stats.errors} collector errors"
        )
        print(summarize_lake(lake, acfg.host))
    return 0


def summarize_lake(lake: str | Path, host: str) -> str:
    """Rows per table for one host: what landed."""
    import polars as pl

    lines = [f"lake {lake}:"]
    for table in lake_mod.tables(lake):
        try:
            n = lake_mod.scan(lake, table, hosts=[host]).select(pl.len()).collect().item()
        except lake_mod.LakeError as exc:
            lines.append(f"  {table:<12} unreadable: {exc}")
            continue
        lines.append(f"  {table:<12} {n:>8} rows")
    return "\n".join(lines)
