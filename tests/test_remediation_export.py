"""The end-of-cycle export of the remediation queue: to the lake's ``remediations`` table and,
with a sink configured, to InfluxDB (``unveil_remediations``), against a real influxd."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from ingest.influx import InfluxConfig, InfluxSource
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from remediation.queue import Queue, default_path
from tests.servers import InfluxdServer

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _read_back(src: InfluxSource, rem: pl.DataFrame) -> pl.DataFrame:
    t0, t1 = rem["time"].min(), rem["time"].max()
    assert isinstance(t0, datetime) and isinstance(t1, datetime)
    # InfluxDB keeps ms: widen the range by a second on each side
    return src.read("unveil_remediations", start=t0 - timedelta(seconds=1), end=t1 + timedelta(seconds=1))


@pytest.mark.server
def test_the_cycle_mirrors_the_remediations_state_changes_to_influxdb(tmp_path: Path,
                                                                      influxd_server: InfluxdServer) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    with Queue(default_path(root)) as q:
        a = q.propose(host="h1", entry_id="thp_coverage_loss", incident_id="inc-1", script_id="thp",
                      params={"enabled": "always"})
        b = q.propose(host="h2", entry_id="thp_coverage_loss", incident_id="inc-2", script_id="thp",
                      params={"enabled": "always"})
        q.approve(a.id, by="alice")
    db = "rem_export"
    cfg = SweepConfig(influx=InfluxConfig(url=influxd_server.url, database=db, flush_interval_s=0.2))
    first = run_cycle(root, cfg, now=NOW)
    assert first is not None and first.remediation_rows == 2
    src = InfluxSource(InfluxConfig(url=influxd_server.url, database=db))
    try:
        rem = lake.read(root, "remediations")
        back = _read_back(src, rem)
        assert sorted(zip(back["host"], back["state"], strict=True)) == [("h1", "approved"), ("h2", "proposed")]
        assert first.influx_points == 2
        # a later state change: one more row in the lake, one more point in InfluxDB
        with Queue(default_path(root)) as q:
            q.reject(b.id, by="bob", reason="deliberate")
        second = run_cycle(root, cfg, now=NOW + timedelta(minutes=1))
        assert second is not None and second.remediation_rows == 1 and second.influx_points == 1
        rem = lake.read(root, "remediations")
        back = _read_back(src, rem)
        assert back.height == rem.height == 3
        assert sorted(back["state"].to_list()) == sorted(rem["state"].to_list()) == ["approved", "proposed",
                                                                                      "rejected"]
        assert {"entry_id", "script_id", "mode"} <= set(back.columns)  # tags, as for the sweep's rows
        # nothing changed: nothing exported, nothing written
        third = run_cycle(root, cfg, now=NOW + timedelta(minutes=2))
        assert third is not None and third.remediation_rows == 0 and third.influx_points == 0
    finally:
        src.close()


def test_without_a_sink_the_export_goes_to_the_lake_only(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    with Queue(default_path(root)) as q:
        q.propose(host="h1", entry_id="thp_coverage_loss", incident_id="inc-1", script_id="thp",
                  params={"enabled": "always"})
    s = run_cycle(root, SweepConfig(), now=NOW)
    assert s is not None and s.remediation_rows == 1 and s.influx_points == 0
    assert lake.read(root, "remediations")["state"].to_list() == ["proposed"]
