"""Severity as cost: every label carries the throughput its injection cost, against the
same-seed healthy run of the same host (checked here against the two runs' workload tables)."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from ingest.simulator import HostPlan, Injection, Scenario, simulate_frames


def _sc(workload: str, injections: tuple[Injection, ...], duration: float = 180.0, seed: int = 5) -> Scenario:
    return Scenario(name="c", seed=seed, duration_s=duration, hosts=(HostPlan("h0", workload),),
                    injections=injections)


def _thr(frames: dict[str, pl.DataFrame], sc: Scenario, a_s: float, b_s: float) -> float:
    a, b = sc.start + timedelta(seconds=a_s), sc.start + timedelta(seconds=b_s)
    w = frames["workload"].filter(pl.col("time").is_between(a, b, closed="left"))
    return float(w.get_column("throughput").cast(pl.Float64).sum())


def _measured_cost(workload: str, inj: Injection, duration: float = 180.0) -> tuple[float, float]:
    """(the label's cost, the cost measured from the workload tables of both runs)."""
    sc = _sc(workload, (inj,), duration)
    frames, _ = simulate_frames(sc, tables=["workload", "labels"])
    healthy, _ = simulate_frames(_sc(workload, (), duration), tables=["workload"])
    end = min(inj.end_s, duration)
    want = 1.0 - _thr(frames, sc, inj.start_s, end) / _thr(healthy, sc, inj.start_s, end)
    return float(frames["labels"].get_column("cost")[0]), want


@pytest.mark.parametrize("typ,workload", [("gpu_power_throttle", "llm_serving"), ("nic_drops", "training"),
                                          ("cgroup_cpu_throttle", "llm_serving")])
def test_label_cost_is_the_throughput_lost_against_the_healthy_run(typ: str, workload: str) -> None:
    got, want = _measured_cost(workload, Injection(typ, "h0", 60, 90, 0.6))
    assert want > 0.01  # these injections cost throughput at all
    assert got == pytest.approx(want, abs=2e-3)


def test_cost_grows_with_severity_and_is_clipped_to_the_run() -> None:
    lo, _ = _measured_cost("llm_serving", Injection("gpu_power_throttle", "h0", 60, 90, 0.2))
    hi, _ = _measured_cost("llm_serving", Injection("gpu_power_throttle", "h0", 60, 90, 0.9))
    assert 0 < lo < hi
    # an injection running past the end is costed over the part inside the run
    got, want = _measured_cost("training", Injection("nic_drops", "h0", 120, 600, 0.6))
    assert got == pytest.approx(want, abs=2e-3)


def test_overlapping_injections_each_carry_their_own_cost() -> None:
    a = Injection("gpu_power_throttle", "h0", 40, 100, 0.7)
    b = Injection("storage_contention", "h0", 70, 80, 0.7)
    frames, _ = simulate_frames(_sc("training", (a, b)), tables=["labels"])
    costs = dict(zip(frames["labels"].get_column("type"), frames["labels"].get_column("cost"), strict=True))
    for inj in (a, b):
        alone, _ = _measured_cost("training", inj)
        assert costs[inj.type] == pytest.approx(alone, abs=1e-9)


def test_cost_is_null_where_the_host_does_no_work() -> None:
    frames, _ = simulate_frames(_sc("idle", (Injection("gpu_power_throttle", "h0", 60, 60, 0.6),)),
                                tables=["labels"])
    assert frames["labels"].schema["cost"] == pl.Float64
    assert frames["labels"].get_column("cost").to_list() == [None]
