"""Incidents visible while they are open: a simulated lake swept cycle by cycle as the
scheduler does (one run_cycle per minute), the incident appears open once it persisted, is
updated, then closed; one remediation proposal; readers see each incident's latest row."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from jobs import query
from jobs.pipeline import SweepConfig, run_cycle
from knowledge_base import latest_incidents
from remediation.queue import Queue, default_path

START = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
ONSET = START + timedelta(minutes=3)
FAULT_END = START + timedelta(minutes=8)

# sim-00: THP off from minute 3 to minute 8; sim-01 healthy (the cohort)
SCENARIO = """
name = "open-incident"
seed = 7
start = "2026-01-05T08:00:00Z"
duration = "11m"

[[hosts]]
name = "sim-00"
workload = "llm_serving"

[[hosts]]
name = "sim-01"
workload = "llm_serving"

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "3m"
duration = "5m"
severity = 0.8
"""


@pytest.fixture(scope="module")
def thp_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jobs.cli import main

    d = tmp_path_factory.mktemp("open-inc")
    (d / "s.toml").write_text(SCENARIO)
    assert main(["simulate", "--lake", str(d / "lake"), "--scenario", str(d / "s.toml")]) == 0
    return d / "lake"


@pytest.fixture
def thp_lake(thp_template: Path, tmp_path: Path) -> Path:
    shutil.copytree(thp_template, tmp_path / "lake")
    return tmp_path / "lake"


def _thp_rows(root: Path) -> pl.DataFrame:
    if "incidents" not in lake.tables(root):
        return pl.DataFrame()
    rows = lake.read(root, "incidents").filter(pl.col("entry_id") == "thp_coverage_loss")
    return rows.sort("updated") if "updated" in rows.columns else rows


def test_incident_is_open_after_persistence_updated_then_closed_with_one_proposal(thp_lake: Path) -> None:
    cfg = SweepConfig(lag=timedelta(0), compact_every=None)
    seen_open_at: int | None = None
    states: list[list[str]] = []
    # cycle k sweeps up to START + k minutes, as the scheduler does every minute
    for k in range(1, 12):
        assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=k)) is not None
        rows = _thp_rows(thp_lake)
        states.append(rows["state"].to_list() if "state" in rows.columns else ["closed"] * rows.height)
        if seen_open_at is None and rows.height:
            seen_open_at = k
            assert states[-1] == ["open"], states
            # the proposal comes from the open incident, at once
            with Queue(default_path(thp_lake)) as q:
                [action] = q.actions()
            assert (action.host, action.entry_id, action.incident_id) == ("sim-00", "thp_coverage_loss",
                                                                          rows["incident_id"][0])
    # onset at minute 3: the cycle to minute 4 is the first whose data covers a minute of it
    assert seen_open_at is not None and seen_open_at <= 5, states
    rows = _thp_rows(thp_lake)
    assert rows["incident_id"].n_unique() == 1  # one incident, updated in place (same id)
    opens = rows.filter(pl.col("state") == "open")
    assert opens.height >= 3  # updated while it lasted
    assert opens["n_windows"].is_sorted() and opens["n_windows"][-1] > opens["n_windows"][0]
    assert opens["updated"].is_unique().all()
    [closed] = rows.filter(pl.col("state") == "closed").iter_rows(named=True)
    assert closed["updated"] > opens["updated"].max()
    assert abs((closed["start"] - ONSET).total_seconds()) < 30
    assert abs((closed["end"] - FAULT_END).total_seconds()) < 30
    latest = latest_incidents(lake.read(thp_lake, "incidents"))
    assert latest["incident_id"].is_unique().all()
    assert latest.filter(pl.col("entry_id") == "thp_coverage_loss")["state"].to_list() == ["closed"]
    with Queue(default_path(thp_lake)) as q:
        assert len(q.actions()) == 1  # one proposal across every update
    rem = lake.read(thp_lake, "remediations")
    assert rem.unique(["action_id", "updated", "attached_incidents"]).height == rem.height  # no repeated rows
    # SQL readers see the latest row of each incident
    got = query.run_query(thp_lake, "SELECT incident_id, state, n_windows FROM incidents "
                                    "WHERE entry_id = 'thp_coverage_loss'")
    assert got.rows() == [(closed["incident_id"], "closed", closed["n_windows"])]


def test_persistence_threshold_holds_back_short_incidents(thp_lake: Path) -> None:
    """min_incident_s: an incident is raised once it spans that long; until then nothing is
    written, and the open row's span is at least the threshold."""
    cfg = SweepConfig(lag=timedelta(0), compact_every=None, min_incident_s=90.0)
    assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=4)) is not None
    assert _thp_rows(thp_lake).is_empty()  # ~60 s of fault: not persisted yet
    with Queue(default_path(thp_lake)) as q:
        assert q.actions() == []
    assert run_cycle(thp_lake, cfg, now=START + timedelta(minutes=5)) is not None
    rows = _thp_rows(thp_lake)
    assert rows["state"].to_list() == ["open"]
    assert (rows["end"][0] - rows["start"][0]).total_seconds() >= 90


def test_latest_incidents_takes_each_incidents_last_row() -> None:
    t = START
    df = pl.DataFrame({
        "incident_id": ["a", "a", "a", "b"],
        "end": [t, t + timedelta(seconds=5), t + timedelta(seconds=5), t],
        "n_windows": [1, 5, 5, 2],
        "state": ["open", "open", "closed", None],  # b: a row written before states existed
        "updated": [t, t + timedelta(seconds=60), t + timedelta(seconds=60), None],
    })
    got = latest_incidents(df).sort("incident_id")
    assert got.select("incident_id", "state", "n_windows").rows() == [("a", "closed", 5), ("b", "closed", 2)]


def test_sweep_config_min_incident_s() -> None:
    assert SweepConfig.from_mapping({"min_incident_s": "2m"}).min_incident_s == 120.0
    assert SweepConfig.from_mapping({"min_incident_s": 30}).min_incident_s == 30.0
    with pytest.raises(ValueError, match="min_incident_s"):
        SweepConfig.from_mapping({"min_incident_s": "1h"})  # not below max_incident (15 min)
    with pytest.raises(ValueError, match="min_incident_s"):
        SweepConfig.from_mapping({"min_incident_s": "soon"})
