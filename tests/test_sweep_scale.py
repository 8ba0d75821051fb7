"""benchmarks/sweep_scale.py: its per-stage split names functions the sweep really runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from benchmarks.sweep_scale import TOP_LEVEL, measure


def test_profile_splits_a_real_sweep_into_its_stages(tmp_path: Path) -> None:
    # one healthy host for 6 minutes, swept by `unveil schedule --once` under cProfile: every
    # stage the sweep runs takes time (a stage at 0 names a function that left the path)
    pt = measure(1, timedelta(minutes=6), 3, True, tmp_path, "serial")
    st = pt.stages
    assert pt.host_hours == 0.1 and pt.cpu_s > 0
    ran = [s for s in TOP_LEVEL if s != "remediation proposals + queue export"]  # a healthy fleet queues none
    assert [s for s in ran if st[s] <= 0] == []
    assert sum(st[s] for s in TOP_LEVEL) <= st["total (profiled)"]
