"""``unveil demo`` (jobs.demo): the whole pipeline on a simulated fleet."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ingest.lake import read, tables
from jobs.cli import main
from jobs.demo import DEMO_SCENARIO, MARKER, DemoError, prepare_dir
from tests import demo_lake

INJECTED = sorted({i["type"] for i in DEMO_SCENARIO["injections"]})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> demo_lake.DemoLake:
    return demo_lake.get(tmp_path_factory)


def test_demo_scenario_injects_several_inefficiency_types() -> None:
    from ingest.simulator import INEFFICIENCIES

    assert 4 <= len(INJECTED) <= 6 and set(INJECTED) <= set(INEFFICIENCIES)


def test_demo_writes_every_stage_to_the_lake(demo: demo_lake.DemoLake) -> None:
    have = set(tables(demo.lake))
    assert {"gpu", "cpu", "host_facts", "labels", "features", "scores", "findings", "incidents"} <= have
    assert [s.name for s in demo.result.stages] == ["simulate", "scheduled sweeps", "report"]
    assert demo.report.is_file() and demo.report.stat().st_size > 10_000
    assert sorted(read(demo.lake, "labels")["type"].unique()) == INJECTED
    cycle = demo.result.cycle
    assert cycle is not None and cycle.caught_up and len(cycle.chunks) == 3  # 15 min in 5-min sweeps
    assert cycle.windows == read(demo.lake, "scores").filter(pl.col("detector") == "combined").select(
        "host", "window_start").unique().height
    assert cycle.findings == read(demo.lake, "findings").height
    # each incident the sweeps opened or updated counts once, however many chunks updated it
    raised = read(demo.lake, "incidents").filter(pl.col("state") != "superseded")
    assert cycle.incidents == raised["incident_id"].n_unique() > 0
    assert sum(c.incidents for c in cycle.chunks) > cycle.incidents  # (the demo's incidents span chunks)


def test_demo_finishes_within_two_minutes(demo: demo_lake.DemoLake) -> None:
    # The budget on the 2-core VM (shared with other tests here, so this is generous).
    assert demo.wall_s < 120, f"demo took {demo.wall_s:.1f} s: " + ", ".join(
        f"{s.name} {s.seconds:.1f} s" for s in demo.result.stages)


def test_demo_remediations_are_only_proposed(demo: demo_lake.DemoLake) -> None:
    from remediation.queue import Queue, default_path

    qpath = default_path(demo.lake)
    if not qpath.exists():
        assert demo.result.remediations == 0
        return
    with Queue(qpath) as q:
        acts = q.actions()
    assert len(acts) == demo.result.remediations
    assert all(a.state == "proposed" and not a.executed for a in acts)
    if acts:
        snap = read(demo.lake, "remediations")
        assert sorted(snap["action_id"]) == sorted(a.id for a in acts)


@pytest.mark.parametrize("kind", INJECTED)
def test_demo_findings_include_each_injected_inefficiency(demo: demo_lake.DemoLake, kind: str) -> None:
    """Each injected inefficiency is detected during its interval and matched to the
    knowledge-base entry of the same type."""
    labels = read(demo.lake, "labels").filter(pl.col("type") == kind)
    assert "incidents" in tables(demo.lake), "the demo found no incidents at all (no findings: "  \
        f"{'findings' in tables(demo.lake)})"
    inc = read(demo.lake, "incidents")
    for lb in labels.iter_rows(named=True):
        over = inc.filter((pl.col("host") == lb["host"]) & (pl.col("end") > lb["time"]) & (pl.col("start") < lb["end"]))
        assert over.height > 0, f"{kind} on {lb['host']}: no incident during the injection"
        got = over.filter(pl.col("status") == "matched")["label_type"].unique().to_list()
        assert kind in got, f"{kind} on {lb['host']}: incidents matched {got or 'nothing'} instead"


def test_prepare_dir_never_touches_foreign_data(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "precious.parquet").write_bytes(b"x")
    with pytest.raises(DemoError, match="not empty and was not made by `unveil demo`"):
        prepare_dir(d)
    assert (d / "precious.parquet").exists()
    # A previous demo's directory is replaced.
    demo_dir = tmp_path / "old-demo"
    prepare_dir(demo_dir)
    (demo_dir / "gpu").mkdir()
    prepare_dir(demo_dir)
    assert sorted(p.name for p in demo_dir.iterdir()) == [MARKER]


def test_demo_cli_refuses_a_foreign_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data.txt").write_text("keep me")
    assert main(["demo", "--lake", str(tmp_path)]) == 2
    assert "was not made by `unveil demo`" in capsys.readouterr().err
    assert (tmp_path / "data.txt").read_text() == "keep me"


@pytest.mark.slow
def test_demo_cli_small_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = tmp_path / "lake"
    assert main(["demo", "--lake", str(lake), "--hosts", "3", "--duration", "6m"]) == 0
    out = capsys.readouterr().out
    for stage in ("simulate:", "scheduled sweeps:", "report:"):
        assert stage in out
    assert "demo finished in" in out and "open the report:" in out
    assert (tmp_path / "lake-report.html").is_file()
