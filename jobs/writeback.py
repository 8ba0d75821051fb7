"""Write-back: a sweep's findings, incidents and remediations mirrored to InfluxDB
(``unveil_findings``, ``unveil_incidents``, ``unveil_remediations``) when a URL is
configured. The lake stays the record: a failed write-back is logged, never raised."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from ingest import schema
from ingest.influx import InfluxConfig, InfluxSink
from jobs import watermarks as wm

log = logging.getLogger(__name__)

HOST = schema.HOST
INFLUX_MEASUREMENTS = {"findings": "unveil_findings", "incidents": "unveil_incidents",
                       "remediations": "unveil_remediations"}
# an incident's entry is a field: an open incident's best-ranked entry can change (a better
# reading joins it), and its rows must share one series to replace each other (host, status
# and start are its key: one window has one rank-1 entry, so no two incidents share them)
INFLUX_TAGS = {"findings": ("host", "reference", "entry_id"), "incidents": ("host", "status"),
               "remediations": ("host", "entry_id", "script_id", "mode")}


def _host_of(path: Path) -> str | None:
    return next((p[5:] for p in path.parts if p.startswith("host=")), None)


def _table_of(root: Path, path: Path) -> str:
    return path.relative_to(root).parts[0]


def influx_frame(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """A downstream table as InfluxDB can take it: lists joined with ',', structs reduced
    to the first factor's feature name (the entries also matched: their ids), everything
    else as is."""
    exprs = []
    for c, dt in df.schema.items():
        if c == "top_factors":
            exprs.append(pl.col(c).list.first().struct.field("feature").alias("top_factor"))
        elif c == "also_matched":  # the entries, best first
            exprs.append(pl.col(c).list.eval(pl.element().struct.field("entry_id")).list.join(",").alias(c))
        elif isinstance(dt, pl.List):
            exprs.append(pl.col(c).cast(pl.List(pl.String)).list.join(",").alias(c))
        elif isinstance(dt, pl.Struct | pl.Array):
            continue
        else:
            exprs.append(pl.col(c))
    return df.select(exprs)


class WriteBack:
    """Publishes a sweep's findings, incidents and remediations to InfluxDB (idempotent:
    the same point written twice is stored once)."""

    def __init__(self, influx: InfluxConfig | None) -> None:
        self.sink = InfluxSink(influx) if influx is not None else None
        self.points = 0

    def __call__(self, pub: wm.Published) -> None:
        if self.sink is None:
            return
        try:
            self._write(pub)
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            # an exporter never stops the pipeline: the lake has the rows; say what is missing
            log.error("write-back of sweep %s to InfluxDB failed (the lake has its rows): %s", pub.sweep_id, exc)

    def _write(self, pub: wm.Published) -> None:
        assert self.sink is not None
        for path in pub.files:
            table = _table_of(pub.root, path)
            if table not in INFLUX_MEASUREMENTS:
                continue
            df = pl.read_parquet(path)
            host = _host_of(path)
            if host is not None and HOST not in df.columns:
                df = df.with_columns(pl.lit(host).alias(HOST))
            self._send(table, df)
        self.sink.flush()

    def _send(self, table: str, df: pl.DataFrame) -> None:
        assert self.sink is not None
        out = influx_frame(table, df)
        tags = [t for t in INFLUX_TAGS[table] if t in out.columns]
        self.sink.write(INFLUX_MEASUREMENTS[table], out, tags=tags)
        self.points += out.height

    def write_rows(self, table: str, df: pl.DataFrame) -> None:
        """Mirror rows that reach the lake outside a sweep's publication (the remediations'
        state changes the cycle exports at its end); a failure is logged like a sweep's."""
        if self.sink is None or df.is_empty():
            return
        try:
            self._send(table, df)
            self.sink.flush()
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            log.error("write-back of %d %s row(s) to InfluxDB failed (the lake has them): %s", df.height, table, exc)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
