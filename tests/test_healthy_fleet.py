"""benchmarks/healthy_fleet.py: the healthy fleet's scenario and the breakdown of its false
incidents (pure functions of the incident and finding frames)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from benchmarks.healthy_fleet import breakdown, fleet_doc
from ingest.simulator import from_dict

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
TS = pl.Datetime("us", "UTC")


def test_fleet_doc_is_a_valid_mixed_realistic_scenario() -> None:
    sc = from_dict(fleet_doc(11, 4, 5, "realistic"), name="t")
    assert [h.name for h in sc.hosts] == ["sim-00", "sim-01", "sim-02", "sim-03"]
    assert not sc.injections and sc.seed == 11 and sc.duration_s == 300


def test_breakdown_counts_the_detectors_of_each_incidents_windows() -> None:
    inc = pl.DataFrame({"host": ["a", "b"], "start": [T0 + timedelta(seconds=58), T0],
                        "end": [T0 + timedelta(seconds=120), T0 + timedelta(seconds=12)],
                        "status": ["unmatched", "matched"], "entry_id": [None, "nic_drops"], "n_windows": [3, 1]},
                       schema_overrides={"start": TS, "end": TS})
    ws = [T0 + timedelta(seconds=s) for s in (58, 59, 60, 2, 200)]
    f = pl.DataFrame({"host": ["a", "a", "a", "b", "b"], "window_start": ws,
                      "window_end": [w + timedelta(seconds=3) for w in ws],
                      "detectors": [["iforest", "mahalanobis"], ["mahalanobis", "iforest"], ["zscore"], ["kb:nic_drops"],
                                    ["zscore"]],
                      "reference": ["cohort", "cohort", "self", "signature", "self"]},
                     schema_overrides={"window_start": TS, "window_end": TS})
    a, b = breakdown(inc, f)
    assert (a["entry"], a["start_second"], a["length_s"]) == ("unmatched", 58, 62.0)
    assert a["detectors"] == {"iforest+mahalanobis": 2, "zscore": 1} and a["references"] == {"cohort": 2, "self": 1}
    assert (b["entry"], b["detectors"]) == ("nic_drops", {"kb:nic_drops": 1})  # the window at 200 s is outside


def test_a_bad_config_file_stops_before_any_simulation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.healthy_fleet import main

    with pytest.raises(SystemExit) as exc:
        main(["--config", str(tmp_path / "missing.toml")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
