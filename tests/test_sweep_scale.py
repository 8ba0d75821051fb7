"""benchmarks/sweep_scale.py: its per-stage split names functions the sweep really runs."""

from __future__ import annotations

import pstats
from datetime import timedelta
from pathlib import Path

import pytest

from benchmarks.sweep_scale import (
    T0,
    TOP_LEVEL,
    _run_live,
    main,
    measure,
    schedule_cmd,
    simulate_fleet,
    split_commits,
    stage_split,
)


def test_profile_splits_a_real_sweep_into_its_stages(tmp_path: Path) -> None:
    # one healthy host for 6 minutes, swept by `unveil schedule --once` under cProfile: every
    # stage the sweep runs takes time (a stage at 0 names a function that left the path)
    pt = measure(1, timedelta(minutes=6), 3, True, tmp_path, "serial")
    st = pt.stages
    assert pt.host_hours == 0.1 and pt.cpu_s > 0
    ran = [s for s in TOP_LEVEL if s != "remediation proposals + queue export"]  # a healthy fleet queues none
    assert [s for s in ran if st[s] <= 0] == []
    assert sum(st[s] for s in TOP_LEVEL) <= st["total (profiled)"]



def test_live_profile_splits_the_timed_cycles(tmp_path: Path) -> None:
    # the live scheduler's steady state: a catch-up over the first 6 minutes of one host, then
    # 2 one-minute cycles under cProfile; the split is of those 2 cycles, not the catch-up
    lake = tmp_path / "lake"
    simulate_fleet(lake, 1, timedelta(minutes=8), 3)
    out = tmp_path / "live.prof"
    got, rss = _run_live(lake, T0 + timedelta(minutes=6), 2, 1, "serial", tmp_path, out)
    assert len(got["walls"]) == 2 and got["live_cpu_s"] > 0 and rss > 0
    calls = {fn: nc for (_f, _l, fn), (_cc, nc, *_rest) in pstats.Stats(str(out)).stats.items()}  # type: ignore[attr-defined]
    assert calls["run_cycle"] == 2
    st = stage_split(out)
    ran = [s for s in TOP_LEVEL if s != "remediation proposals + queue export"]
    assert [s for s in ran if st[s] <= 0] == []



def test_config_reaches_the_catch_up_and_the_live_cycles(tmp_path: Path) -> None:
    # --config FILE is what both children sweep with: one they cannot load fails them (it is
    # not silently replaced by the defaults), and the command refuses it before simulating
    bad = tmp_path / "bad.toml"
    bad.write_text('[scheduler]\nanalysis_step = "2.5s"\n')  # not a multiple of the 1-s stride
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(bad), "--hosts", "1", "--duration", "2m"])
    assert exc.value.code == 2
    assert schedule_cmd(tmp_path, T0, config=bad)[3:6] == ["--config", str(bad), "schedule"]  # (a global option)
    with pytest.raises(RuntimeError, match="analysis_step"):
        measure(1, timedelta(minutes=2), 3, False, tmp_path, "serial", config=bad)
    lake = tmp_path / "lake"
    simulate_fleet(lake, 1, timedelta(minutes=3), 3)
    with pytest.raises(RuntimeError, match="analysis_step"):
        _run_live(lake, T0 + timedelta(minutes=2), 1, 1, "serial", tmp_path, config=bad)


def test_agent_commits_leave_a_file_per_minute_and_the_same_rows(tmp_path: Path) -> None:
    # --agent-commits: the timed minutes' telemetry as the agent commits it (a file per table,
    # host and minute); every row is kept, and the minutes before stay in their file
    import polars as pl

    from ingest import lake as lake_mod
    from jobs.telemetry import telemetry_tables

    lake = tmp_path / "lake"
    simulate_fleet(lake, 1, timedelta(minutes=5), 3)
    since = T0 + timedelta(minutes=2)
    before = {t: lake_mod.read(lake, t).sort(pl.all()) for t in telemetry_tables(lake)}
    assert split_commits(lake, since) > 0
    for t, rows in before.items():
        assert lake_mod.read(lake, t).sort(pl.all()).equals(rows), t
        late = lake_mod.files(lake, t, start=since)
        spans = [lake_mod.scan_file(lake, p).select(pl.col("time").min().alias("a"), pl.col("time").max().alias("b"))
                 .collect().row(0) for p in lake_mod.files(lake, t)]
        in_minutes = [(a, b) for a, b in spans if a >= since]
        assert in_minutes and all(b - a < timedelta(minutes=1) for a, b in in_minutes), t
        assert len(late) >= 3, t  # (the minutes 2, 3 and 4 at least)
    with pytest.raises(SystemExit) as exc:
        main(["--agent-commits", "--hosts", "1", "--duration", "2m"])
    assert exc.value.code == 2
