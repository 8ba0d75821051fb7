"""The sink contract: where the agent and the simulator send telemetry.

A frame handed to a sink has the columns of :meth:`ingest.schema.Measurement.polars_schema`
(``time``, ``host``, tags, fields) or, for downstream tables (features, scores ...), any
columns including ``time`` and ``host``. Sinks never stop the pipeline on a transient
failure: they log, spool and retry (see ingest.influx); a permanent misconfiguration
raises :class:`SinkError` at construction.
"""

from __future__ import annotations

from typing import Protocol

import polars as pl


class SinkError(Exception):
    """A sink cannot work at all (bad path, bad URL, bad credentials); names the sink."""


class Sink(Protocol):
    name: str

    def write(self, table: str, df: pl.DataFrame) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
