"""Helpers shared by the simulator tests: resolve a footprint signal against frames."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from ingest import schema
from ingest.simulator.injections import TYPES, Injection, Signal
from ingest.simulator.topology import HostSpec


def placeholders(inj: Injection, host: HostSpec) -> dict[str, str]:
    kind = TYPES[inj.type].kind
    home = 0
    dev = inj.devices[0] if inj.devices else ""
    if kind == "gpu" and dev:
        g = host.gpus[int(dev)]
        home = next(x.node for x in host.nics if x.name == g.nic)
    elif kind in ("nic", "irq") and dev:
        home = next((x.node for x in host.nics if x.netdev == dev), None) or next(
            (d.node for d in host.disks if d.name == dev), 0)
    elif kind == "disk" and dev:
        home = next(d.node for d in host.disks if d.name == dev)
    elif kind == "node" and dev:
        home = int(dev)
    return {"{dev}": dev, "{home}": str(home), "{far}": str(1 - home)}


def series(frames: dict[str, pl.DataFrame], sig: Signal, subs: dict[str, str], host: str,
           start: datetime | None = None, end: datetime | None = None) -> pl.Series:
    """Per-time aggregate of a signal (sum over matching series for counters, mean for
    gauges; bit fields: share of rows with the bit set)."""
    df = frames[sig.table].filter(pl.col("host") == host)
    if start is not None:
        df = df.filter(pl.col("time") >= start)
    if end is not None:
        df = df.filter(pl.col("time") < end)
    for tag, val in sig.where:
        df = df.filter(pl.col(tag) == subs.get(val, val))
    name, _, bit = sig.field.partition("&")
    if bit:
        expr = ((pl.col(name) & int(bit)) > 0).cast(pl.Float64).mean()
    elif name in schema.get(sig.table).counters:
        expr = pl.col(name).cast(pl.Float64).sum()
    else:
        expr = pl.col(name).cast(pl.Float64).mean()
    return df.group_by("time").agg(expr.alias("v")).sort("time").get_column("v")


def mean(s: pl.Series) -> float:
    v = s.cast(pl.Float64).mean()
    assert isinstance(v, float), s
    return v


def span(s: pl.Series) -> tuple[float, float]:
    f = s.cast(pl.Float64)
    lo, hi = f.min(), f.max()
    assert isinstance(lo, float) and isinstance(hi, float), s
    return lo, hi
