"""The schema module is the single source of truth; the docs are generated from it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ingest import schema

ROOT = Path(__file__).resolve().parents[1]


def test_docs_schema_is_generated_from_the_module() -> None:
    assert (ROOT / "docs" / "schema.md").read_text().strip() == schema.markdown().strip(), (
        "docs/schema.md is stale: run `make docs`"
    )


def test_every_field_is_typed_and_classified() -> None:
    for m in schema.MEASUREMENTS.values():
        names = [f.name for f in m.fields]
        assert len(names) == len(set(names)), m.name
        assert not set(names) & {*m.tags, schema.TIME, schema.HOST}, m.name
        for f in m.fields:
            assert f.kind in ("counter", "gauge", "state")
            assert f.subsystem in (*schema.SUBSYSTEMS, "host")
            if f.kind == "counter":
                assert f.dtype == pl.Int64(), f"{m.name}.{f.name}: counters are Int64 deltas"
        if m.sparse:
            assert m.counters, f"{m.name}: sparse tables drop all-zero counter rows, so need counters"


def test_conform_orders_casts_and_fills_missing_fields() -> None:
    df = pl.DataFrame({"load1": [1], "host": ["h"], "time": [0]}).with_columns(
        pl.col("time").cast(pl.Datetime("us", "UTC"))
    )
    out = schema.conform("system", df)
    assert out.columns == list(schema.SYSTEM.polars_schema())
    assert out.schema["load1"] == pl.Float32()
    assert out["ctxt"].to_list() == [None]


def test_conform_rejects_unknown_columns_and_names_them() -> None:
    df = pl.DataFrame({"time": [0], "host": ["h"], "ctxtt": [1]})
    with pytest.raises(ValueError, match="ctxtt"):
        schema.conform("system", df)
    with pytest.raises(KeyError, match="unknown measurement 'nope'"):
        schema.get("nope")
