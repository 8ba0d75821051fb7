"""benchmarks/kb_eval.py's per-type figures: contamination and onset delay on hand-made
windows, labels and matches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from benchmarks.kb_eval import type_figures

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _windows(hosts: list[str], n: int) -> pl.DataFrame:
    rows = [(h, T0 + timedelta(seconds=i), T0 + timedelta(seconds=i + 3)) for h in hosts for i in range(n)]
    df = pl.DataFrame(rows, schema={"host": pl.String(), "window_start": pl.Datetime("us", "UTC"),
                                    "window_end": pl.Datetime("us", "UTC")}, orient="row")
    return df.with_columns(pl.lit(True).alias("flagged"))


def test_onset_delay_and_contamination_per_type() -> None:
    windows = _windows(["a", "b"], 100)
    labels = pl.DataFrame({"time": [T0 + timedelta(seconds=40)], "end": [T0 + timedelta(seconds=80)],
                           "host": ["a"], "type": ["thp_coverage_loss"]})
    ts = [T0 + timedelta(seconds=s) for s in (30, 45, 46, 50, 10, 11)]
    matches = pl.DataFrame({
        "host": ["a", "a", "a", "a", "b", "b"], "window_start": ts,
        # a wrong match inside the label, then the right one from 46 s; two windows of the
        # healthy host matched to the type
        "match_type": ["x", "x", "thp_coverage_loss", "thp_coverage_loss", "thp_coverage_loss", "y"],
    }).with_columns(pl.col("window_start").cast(pl.Datetime("us", "UTC")))
    got = type_figures(windows, labels, matches)
    f = got["thp_coverage_loss"]
    assert f["onset_median_s"] == pytest.approx(6.0) and f["onset_max_s"] == pytest.approx(6.0)
    healthy = windows.height - 42  # windows overlapping [40, 80) on host a: starts 38..79
    assert f["contamination"] == pytest.approx(1 / healthy)


def test_a_label_never_matched_has_no_max_onset() -> None:
    windows = _windows(["a"], 50)
    labels = pl.DataFrame({"time": [T0 + timedelta(seconds=10), T0 + timedelta(seconds=30)],
                           "end": [T0 + timedelta(seconds=20), T0 + timedelta(seconds=40)],
                           "host": ["a", "a"], "type": ["t", "t"]})
    matches = pl.DataFrame({"host": ["a"], "window_start": [T0 + timedelta(seconds=12)], "match_type": ["t"]}
                           ).with_columns(pl.col("window_start").cast(pl.Datetime("us", "UTC")))
    f = type_figures(windows, labels, matches)["t"]
    assert f["onset_median_s"] == pytest.approx(2.0)
    assert f["onset_max_s"] is None
