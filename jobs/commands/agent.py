"""``unveil agent``: sample this host into the lake (and InfluxDB) in the foreground."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ingest import lake as lake_mod
from ingest.agent import Agent, AgentConfig, AgentStats, close_each, install_signal_handlers
from ingest.durations import seconds_of
from ingest.sink import Sink
from jobs import config as config_mod


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
    p.add_argument("--interval", type=_seconds, metavar="SECONDS", help="fast-tier period (default 0.1)")
    p.add_argument("--duration", type=_seconds, metavar="SECONDS",
                   help="stop after this long (seconds, or a duration such as 2m30s)")
    p.add_argument("--influx-url", action="append", metavar="URL", default=None,
                   help="also write to this InfluxDB (repeatable)")
    p.add_argument("--influx-database", metavar="DB", help="InfluxDB database/bucket (default unveil)")
    p.add_argument("--host", metavar="NAME", help="host tag (default: hostname)")
    p.add_argument("--root", metavar="DIR", help="filesystem root to read /proc and /sys under")
    p.add_argument("--flush-interval", type=_seconds, metavar="SECONDS",
                   help="journal append / InfluxDB send period (default 10)")
    p.add_argument("--commit-interval", type=_seconds, metavar="SECONDS",
                   help="Parquet commit period of the journaled rows (default 60)")
    p.add_argument("--collectors", metavar="A,B", help="comma-separated collectors (default all)")
    p.add_argument("--all-fast", action="store_true", help="sample every source at the fast interval")
    p.add_argument("--durable", action="store_true",
                   help="fsync every lake file (survives power loss; costs CPU at each flush)")
    p.add_argument("--quiet", action="store_true", help="no summary at the end")
    p.set_defaults(func=run)


def _seconds(text: str) -> float:
    """A period flag: seconds (``0.1``) or a duration (``2m30s``), as every command reads them."""
    try:
        return seconds_of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_flags(args: argparse.Namespace) -> None:
    """Period flags given must be positive: ``--interval 0`` used to fall back to the default."""
    for flag in ("--interval", "--flush-interval", "--commit-interval", "--duration"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not (0 < value < float("inf")):
            raise ValueError(f"{flag} must be a positive number of seconds, got {value:g}")


def _host_flag(host: str | None) -> None:
    """``--host`` names the journal directory and the partitions: checked before either is
    made (``--host ../x`` made a journal lock outside the lake); empty is an error, not the
    hostname."""
    if host is None:
        return
    if not host:
        raise ValueError("--host is empty: give a host name, or leave --host out for this machine's hostname")
    try:
        lake_mod.check_host_name(host)
    except lake_mod.LakeError as exc:
        raise ValueError(f"--host: {exc}") from None


def _collectors_flag(value: str | None) -> tuple[str, ...] | None:
    """``--collectors A,B`` as names; an empty list (or name) is an error, not "all"."""
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(","))
    if not all(names):
        raise ValueError(f"--collectors {value!r}: an empty collector name; give a comma-separated list of "
                         "collectors, or leave --collectors out for all of them")
    return names


def _check_root(root: str, flag: str) -> None:
    """The root must hold ``proc``: a wrong --root made every collector unavailable and the
    agent sampled nothing, exiting 0."""
    if not root:
        raise ValueError(f"{flag} is empty: give the directory to read /proc and /sys under (default /)")
    path = Path(root)
    if not path.is_dir():
        raise ValueError(f"{flag} {root}: no such directory")
    if not (path / "proc").is_dir():
        raise ValueError(f"{flag} {root}: has no proc directory: not a filesystem root to read /proc and /sys under")


def build(args: argparse.Namespace) -> tuple[AgentConfig, list[Sink], str | Path]:
    """The config file's [agent] and [influx], the flags overlaid. Every value is checked
    before anything is created on disk."""
    _positive_flags(args)
    _host_flag(args.host)
    collectors = _collectors_flag(args.collectors)
    cfg = config_mod.load(args.config, analysis=False)  # the agent does not carry the analytics
    lake = config_mod.resolve_lake_and_state(args.lake, args.state, cfg)
    a = cfg.agent
    # `is not None`, not `or`: a flag given is used as given (and was checked above)
    flush_s = args.flush_interval if args.flush_interval is not None else a.flush_interval_s
    acfg = replace(
        a,
        lake=lake,
        root=args.root if args.root is not None else a.root,
        host=args.host if args.host is not None else a.host,
        interval_s=args.interval if args.interval is not None else a.interval_s,
        flush_interval_s=flush_s,
        commit_interval_s=args.commit_interval if args.commit_interval is not None else max(a.commit_interval_s, flush_s),
        duration_s=args.duration,
        collectors=collectors if collectors is not None else a.collectors,
        tiers=dict(a.tiers),
        all_fast=args.all_fast,
        durable=args.durable or a.durable,
    )
    acfg.validate()  # before the lake sink makes the lake directory
    _check_root(acfg.root, "--root" if args.root is not None else "[agent].root")
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
    try:
        agent = Agent(acfg, sinks)
    except BaseException:  # no collector available, the journal locked by another agent ...
        close_each(sinks, "sink")
        raise
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
        print(summarize(lake, stats, sinks[1:]))
    return 0


def summarize(lake: str | Path, stats: AgentStats, streams: Sequence[Sink] = ()) -> str:
    """What this run wrote: its rows per table in the lake (not the rows earlier runs left
    there), and what each InfluxDB sink sent or spooled."""
    lines = [f"lake {lake}: this run's rows"]
    for table, n in sorted(stats.table_rows.items()):
        lines.append(f"  {table:<12} {n:>8} rows")
    if not stats.table_rows:
        lines.append("  (none)")
    if stats.rows_replayed:
        lines.append(f"  and {stats.rows_replayed} rows of an earlier run replayed from its journal")
    if stats.rows_lost:
        lines.append(f"  {stats.rows_lost} rows lost (neither the lake nor the journal took them)")
    from ingest.influx import InfluxSink

    for sink in streams:
        if not isinstance(sink, InfluxSink):
            continue
        st = sink.stats
        line = f"{sink.name} {sink.config.url}: {st.points_sent} points sent, {st.points_spooled} spooled"
        extra = [f"{n} {word}" for n, word in (
            (st.points_replayed, "replayed from the spool"), (st.points_rejected, "rejected"),
            (st.points_evicted, "evicted from the full spool"), (st.points_lost, "lost")) if n]
        if extra:
            line += " (" + ", ".join(extra) + ")"
        lines.append(line)
    return "\n".join(lines)
