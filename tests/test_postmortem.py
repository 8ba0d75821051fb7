"""`unveil postmortem`: a past interval re-analysed from the lake (or InfluxDB) into its own
lake under <lake>/_postmortem/<id>/, without touching the scheduled tables."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from ingest.influx import InfluxConfig, InfluxSink
from tests.servers import InfluxdServer
from tests.test_watermarks import T0, make_lake, unveil


@pytest.fixture(scope="module")
def lake_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lake(tmp_path_factory.mktemp("pm-sim") / "lake")


@pytest.fixture
def sim_lake(lake_template: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "lake"
    shutil.copytree(lake_template, dst)
    return dst


@pytest.mark.slow
def test_postmortem_of_a_labelled_interval(sim_lake: Path, tmp_path: Path) -> None:
    label = lake.read(sim_lake, "labels").row(0, named=True)
    assert label["host"] == "sim-01" and label["type"] == "gpu_power_throttle"
    out = tmp_path / "pm.html"
    r = unveil("postmortem", "--lake", str(sim_lake), "--label", label["label_id"], "--margin", "30s",
               "--no-progress", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(from lake)" in r.stdout
    pm_dirs = [p for p in (sim_lake / "_postmortem").iterdir()]
    assert len(pm_dirs) == 1 and not pm_dirs[0].name.startswith(".")
    pm = pm_dirs[0]
    meta = json.loads((pm / "_postmortem.json").read_text())
    assert meta["hosts"] == ["sim-01"] and meta["source"] == "lake"
    # the interval is the label's, widened by the margin; windows end inside it
    feats = lake.read(pm, "features")
    assert set(feats["host"]) == {"sim-01"}
    start, end = label["time"] - timedelta(seconds=30), label["end"] + timedelta(seconds=30)
    assert feats["window_start"].min() == start
    assert feats["window_end"].max() <= end
    assert feats.group_by("window_start").len()["len"].max() == 1
    incidents = lake.read(pm, "incidents")
    inside = incidents.filter((pl.col("start") < label["end"]) & (pl.col("end") > label["time"]))
    assert inside.height >= 1
    assert "gpu_power_throttle" in inside["entry_id"].to_list()
    assert "gpu_power_throttle" in r.stdout
    # facts and ground truth travel along; the scheduled tables are untouched
    assert {"host_facts", "labels"} <= set(lake.tables(pm))
    assert not {"features", "scores", "findings", "incidents"} & set(lake.tables(sim_lake))
    assert out.exists() and out.stat().st_size > 0
    assert f"report: {out}" in r.stdout


@pytest.mark.slow
def test_postmortem_rerun_replaces_the_same_id(sim_lake: Path) -> None:
    args = ("postmortem", "--lake", str(sim_lake), "--host", "sim-00", "--from", (T0 + timedelta(seconds=20)).isoformat(),
            "--to", (T0 + timedelta(seconds=50)).isoformat(), "--id", "pm-one", "--no-progress")
    for _ in range(2):
        r = unveil(*args)
        assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (sim_lake / "_postmortem").iterdir()) == ["pm-one"]
    feats = lake.read(sim_lake / "_postmortem" / "pm-one", "features")
    assert feats.height == 28  # windows starting 20 s .. 47 s: 30 s minus one 3 s window, + 1
    assert feats["window_start"].is_unique().all()


def test_postmortem_errors_name_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    empty = tmp_path / "lake"
    empty.mkdir()
    assert main(["postmortem", "--lake", str(empty), "--host", "h1", "--from", "2026-01-05T08:00Z",
                 "--to", "2026-01-05T09:00Z"]) == 2
    err = capsys.readouterr().err
    assert f"the lake {empty} holds no telemetry of h1" in err and "--influx-url" in err
    assert main(["postmortem", "--lake", str(empty), "--label", "nope"]) == 2
    assert "no labels table" in capsys.readouterr().err
    assert main(["postmortem", "--lake", str(empty), "--host", "h1"]) == 2
    assert "--label ID" in capsys.readouterr().err


@pytest.mark.server
@pytest.mark.slow
def test_postmortem_reads_influxdb_when_the_lake_lacks_the_interval(tmp_path: Path,
                                                                    influxd_server: InfluxdServer) -> None:
    from ingest.simulator import from_dict, simulate

    sc = from_dict({"seed": 5, "duration": "90s", "hosts": 1})
    cfg = InfluxConfig(url=influxd_server.url, database="pm_src", spool_dir=tmp_path / "spool", batch_size=20000)
    sink = InfluxSink(cfg)
    simulate(sc, [sink], tables=["cpu", "gpu", "memory", "net", "host_facts"])
    sink.close()
    assert sink.spooled_batches == 0
    empty = tmp_path / "lake"
    empty.mkdir()
    r = unveil("postmortem", "--lake", str(empty), "--host", "sim-00", "--from", T0.isoformat(),
               "--to", (T0 + timedelta(seconds=60)).isoformat(), "--influx-url", influxd_server.url,
               "--influx-database", "pm_src", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(from influxdb)" in r.stdout
    pm = next((empty / "_postmortem").iterdir())
    feats = lake.read(pm, "features")
    assert feats.height == 58 and set(feats["host"]) == {"sim-00"}
    assert any(c.startswith("gpu.") for c in feats.columns)


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (symlinks not followed) with its bytes (None for directories)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() or p.is_symlink() else p.read_bytes()
    return out


def _pm_args(lake_dir: Path, pm_id: str) -> list[str]:
    from tests.test_watermarks import CONFIG

    return ["--config", str(CONFIG), "postmortem", "--lake", str(lake_dir), "--host", "sim-00",
            "--from", (T0 + timedelta(seconds=20)).isoformat(), "--to", (T0 + timedelta(seconds=30)).isoformat(),
            f"--id={pm_id}", "--no-progress"]


@pytest.mark.parametrize("pm_id", ["../../victim", "../victim", "..", ".", "", "/tmp/abs", "a/b", ".tmp-x",
                                   "-rf", "x\ny", "é"])
def test_postmortem_id_cannot_leave_the_lake(sim_lake: Path, tmp_path: Path, pm_id: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A sibling directory of the lake survives a hostile --id, and nothing is written
    anywhere (the id was used as a path: the old run moved the sibling into the lake and
    deleted it)."""
    from jobs.cli import main

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    before = _tree(tmp_path)
    assert main(_pm_args(sim_lake, pm_id)) == 2
    err = capsys.readouterr().err
    assert "post-mortem id" in err and repr(pm_id) in err
    assert (victim / "keep.txt").read_text() == "precious"
    assert _tree(tmp_path) == before  # nothing written, inside the lake or out


def test_postmortem_dir_symlinked_out_of_the_lake_is_refused(sim_lake: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (sim_lake / "_postmortem").symlink_to(outside, target_is_directory=True)
    assert main(_pm_args(sim_lake, "pm-ok")) == 2
    err = capsys.readouterr().err
    assert "outside the lake" in err and str(outside) in err
    assert list(outside.iterdir()) == []


def test_postmortem_skips_corrupt_files_and_warns_once(sim_lake: Path, capsys: pytest.CaptureFixture[str],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from tests.test_scheduler import assert_warned_once, damage_two_files, run_cli

    paths = damage_two_files(sim_lake)
    with caplog.at_level("INFO"):
        rc, text = run_cli(capsys, "postmortem", "--lake", str(sim_lake), "--host", "sim-00", "sim-01",
                           "--from", T0.isoformat(), "--to", (T0 + timedelta(seconds=40)).isoformat(),
                           "--id", "pm-corrupt", "--no-progress", "--out", str(sim_lake.parent / "pm.html"))
    assert rc == 0, text
    assert_warned_once(paths, "postmortem", text, caplog)
    pm = sim_lake / "_postmortem" / "pm-corrupt"
    feats = lake.read(pm, "features")
    assert dict(feats.group_by("host").len().iter_rows()) == {"sim-00": 38, "sim-01": 38}
    meta = json.loads((pm / "_postmortem.json").read_text())
    assert sorted(c["path"] for c in meta["corrupt"]) == sorted(map(str, paths))
    assert all(c["reason"] for c in meta["corrupt"])
