"""``unveil agent`` (filled in by the agent work)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="sample this host's telemetry into the lake (and InfluxDB)")
    p.set_defaults(func=lambda a: 0)
