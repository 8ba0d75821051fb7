"""Benign diversity and fleet options of the simulator (scenario keys in docs/simulator.md):
each option does what it says and nothing else; defaults keep the uniform host."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from ingest.simulator import (
    INEFFICIENCIES,
    HostPlan,
    Injection,
    Scenario,
    ScenarioError,
    from_dict,
    resolve_scenario,
    simulate_frames,
)
from ingest.simulator.physics import THROTTLE_CV, cfs_smooth
from ingest.simulator.scenario import PROFILES
from tests.test_simulator import DUR, check_footprint


def _sc(injections: tuple[Injection, ...] = (), duration: float = 120.0, seed: int = 3,
        **host: object) -> Scenario:
    plan = HostPlan("h0", str(host.pop("workload", "training")), **host)  # type: ignore[arg-type]
    return Scenario(name="d", seed=seed, duration_s=duration, hosts=(plan,), injections=injections)


def _facts(frames: dict[str, pl.DataFrame], t: object, cat: str, key: str) -> dict[str, str]:
    f = frames["host_facts"].filter((pl.col("time") == t) & (pl.col("category") == cat) & (pl.col("key") == key))
    return dict(zip(f.get_column("device"), f.get_column("value"), strict=True))


def test_nic_queues_an_irq_fault_moves_some_of_the_lines() -> None:
    inj = Injection("irq_locality_miss", "h0", 20, 30, 0.25, ("mlx5_0",))
    sc = _sc((inj,), duration=60, nic_queues=16)
    frames, runs = simulate_frames(sc, tables=["interrupts", "host_facts"])
    lines = {str(q.number) for q in runs[0].spec.irqs if q.device == "mlx5_0"}
    assert len(lines) == 16
    nodes = _facts(frames, sc.start + timedelta(seconds=20), "irq", "affinity_nodes")
    moved = {d for d in lines if nodes[d] == "1"}
    assert len(moved) == 4  # 4 of 16 lines at severity 0.25, the other 12 stay home
    assert {d for d in lines if _facts(frames, sc.start, "irq", "affinity_nodes")[d] == "1"} == set()
    irq = frames["interrupts"].filter(pl.col("count").is_not_null() & pl.col("irq").is_in(list(lines)))
    a, b = sc.start + timedelta(seconds=21), sc.start + timedelta(seconds=50)
    far = irq.filter((pl.col("node") == "1") & pl.col("time").is_between(a, b, closed="left"))
    assert set(far.get_column("irq")) == moved
    home = irq.filter((pl.col("node") == "0") & pl.col("time").is_between(a, b, closed="left"))
    assert set(home.get_column("irq")) == lines - moved


def test_cpus_per_node_at_the_top_level_sizes_every_host() -> None:
    sc = from_dict({"duration": "20s", "hosts": 2, "cpus_per_node": 56, "workload": "training"})
    frames, _ = simulate_frames(sc, tables=["cpu", "host_facts"])
    assert frames["cpu"].filter(pl.col("host") == "sim-01").get_column("cpu").n_unique() == 112
    assert _facts(frames.copy() | {"host_facts": frames["host_facts"].filter(pl.col("host") == "sim-01")},
                  sc.start, "numa", "cpulist") == {"0": "0-55", "1": "56-111"}


def _gpu_means(frames: dict[str, pl.DataFrame], field: str, host: str = "h0", after_s: float = 60) -> np.ndarray:
    t = frames["gpu"].get_column("time").to_numpy()
    g = frames["gpu"].filter((pl.col("host") == host) & pl.Series(t >= t.min() + np.timedelta64(int(after_s), "s")))
    return g.group_by("gpu").agg(pl.col(field).cast(pl.Float64).mean()).sort("gpu").get_column(field).to_numpy()


def test_gpu_temp_spread_healthy_temperatures_differ_by_slot_and_host_without_throttling() -> None:
    uniform, _ = simulate_frames(_sc(duration=180), tables=["gpu"])
    t_uni = _gpu_means(uniform, "temperature_c")
    assert np.ptp(t_uni) < 1.5  # the uniform host: every slot alike
    sc = Scenario(name="d", seed=3, duration_s=180.0,
                  hosts=tuple(HostPlan(f"h{i}", "training", gpu_temp_spread=True) for i in range(3)))
    frames, _ = simulate_frames(sc, tables=["gpu", "workload"])
    per_host = [_gpu_means(frames, "temperature_c", f"h{i}") for i in range(3)]
    for t in per_host:
        rear, front = t[[2, 3, 6, 7]].mean(), t[[0, 1, 4, 5]].mean()
        assert 2.5 < rear - front < 7.5  # ~5 C of preheated air, +-1.5 C per GPU
    assert np.ptp([t.mean() for t in per_host]) > 1.0  # rack inlets differ between hosts
    reasons = frames["gpu"].get_column("clock_event_reasons").to_numpy()
    assert not np.any(reasons & (0x20 | 0x40))  # benign: no GPU reaches a thermal slowdown
    # cooling is not throughput: the work done is the uniform host's
    w = frames["workload"].filter(pl.col("host") == "h0").get_column("throughput")
    base, _ = simulate_frames(_sc(duration=180), tables=["workload"])
    assert w.equals(base["workload"].get_column("throughput"))


def test_baseline_drops_are_bursty_on_rdma_nics_and_cost_nothing() -> None:
    frames, _ = simulate_frames(_sc(duration=300, baseline_drops=1e-6), tables=["net", "workload"])
    base, _ = simulate_frames(_sc(duration=300), tables=["net", "workload"])
    rdma = pl.col("interface").str.starts_with("ens")
    assert base["net"].filter(rdma).get_column("rx_dropped").fill_null(0).sum() == 0
    d = frames["net"].filter(rdma).get_column("rx_dropped").fill_null(0).to_numpy()
    assert d.sum() > 0
    assert np.mean(d > 0) < 0.5  # in bursts: most seconds none
    assert frames["net"].filter(rdma).get_column("rx_fifo").fill_null(0).sum() == 0  # no ring overflow
    assert frames["workload"]["throughput"].equals(base["workload"]["throughput"])


def test_smooth_throttle_grows_smoothly_with_demand() -> None:
    x = np.linspace(0.5, 1.5, 1001)
    share, over = cfs_smooth(x * 16.0, np.full_like(x, 16.0))
    assert np.all(np.diff(share) >= -1e-12) and np.all(np.diff(over) >= -1e-12)
    assert np.max(np.diff(share)) < 0.01  # no step anywhere (the step model jumps 0 -> 0.5)
    assert share[np.searchsorted(x, 1.0)] == pytest.approx(0.5, abs=0.01)
    assert share[np.searchsorted(x, 0.7)] < 1e-3 and share[-1] > 0.99
    # the expected overage meets max(0, x - 1) away from the quota
    assert over[-1] == pytest.approx(0.5, abs=1e-3) and over[0] < 1e-6
    assert 0 < THROTTLE_CV < 0.5


def test_smooth_throttle_a_mild_quota_cut_throttles_some_periods_not_all() -> None:
    def share(smooth: bool, sev: float) -> float:
        inj = Injection("cgroup_cpu_throttle", "h0", 30, 90, sev)
        frames, _ = simulate_frames(_sc((inj,), workload="llm_serving", smooth_throttle=smooth), tables=["cgroup"])
        c = frames["cgroup"].filter((pl.col("cgroup") == "workload.slice")
                                    & (pl.col("time") >= _sc().start + timedelta(seconds=40)))
        return float(np.nansum(c["nr_throttled"].to_numpy()) / np.nansum(c["nr_periods"].to_numpy()))

    got = [share(True, s) for s in (0.05, 0.2, 0.4, 0.8)]
    assert np.all(np.diff(got) > 0) and got[-1] > 0.9
    assert 0.0 <= got[0] < 0.5  # a cut that barely reaches the demand throttles now and then


def test_gpu_models_a_mixed_fleet_has_legitimately_different_limits() -> None:
    sc = from_dict({"duration": "90s", "hosts": 2, "workload": "training", "gpu_model": ["h100_sxm", "a100_sxm"],
                    "injections": [{"type": "gpu_power_throttle", "host": "sim-01", "start": "60s",
                                    "duration": "30s", "severity": 0.5}]})
    frames, _ = simulate_frames(sc, tables=["gpu", "host_facts"])
    facts = frames["host_facts"].filter((pl.col("time") == sc.start) & (pl.col("category") == "gpu")
                                        & (pl.col("device") == "0"))
    got = {(h, k): v for h, k, v in facts.select("host", "key", "value").iter_rows()}
    assert got[("sim-00", "name")] == "NVIDIA H100 80GB HBM3" and got[("sim-00", "power_limit_default_w")] == "700"
    assert got[("sim-01", "name")] == "NVIDIA A100-SXM4-80GB" and got[("sim-01", "power_limit_default_w")] == "400"
    assert got[("sim-01", "power_limit_w")] == "400" and got[("sim-01", "pcie_link_gen_max")] == "4"
    g = frames["gpu"].filter(pl.col("time") < sc.start + timedelta(seconds=60))
    for host, top in (("sim-00", 700.0), ("sim-01", 400.0)):
        mine = g.filter(pl.col("host") == host)
        assert mine["power_w"].to_numpy().max() <= top  # a healthy A100 never draws an H100's power
        share_capped = np.mean((mine["clock_event_reasons"].to_numpy() & 0x4) > 0)
        assert share_capped < 0.05  # and is not power-capped at its own default limit
    during = frames["gpu"].filter((pl.col("host") == "sim-01") & (pl.col("time") >= sc.start + timedelta(seconds=65)))
    assert during["power_limit_w"].to_numpy().max() == pytest.approx(400 - 400 / 700 * 400 * 0.5)


def test_fleet_wide_misconfiguration_from_boot_on_every_host() -> None:
    sc = resolve_scenario("fleet_misconfig").with_overrides(hosts=3, duration_s=120)
    frames, _ = simulate_frames(sc, tables=["host_facts", "labels", "gpu"])
    lab = frames["labels"]
    assert sorted(lab["host"]) == ["sim-00", "sim-01", "sim-02"]
    assert set(lab["time"]) == {sc.start} and set(lab["end"]) == {sc.start + timedelta(seconds=120)}
    assert lab["cost"].is_not_null().all() and (lab["cost"] > 0).all()  # against the same-seed healthy run
    first = frames["host_facts"].filter((pl.col("time") == sc.start) & (pl.col("key") == "power_limit_w"))
    assert set(first["value"]) == {"500"}  # from the very first snapshot, on every host
    # no host differs from the others: the cohort has nothing to compare against
    per_host = frames["gpu"].group_by("host").agg(pl.col("power_limit_w").max())
    assert set(per_host["power_limit_w"]) == {500.0}


def test_run_long_duration_follows_the_run_length() -> None:
    doc = {"duration": "1m", "hosts": 1, "injections": [{"type": "thp_coverage_loss", "start": 0, "duration": "run"}]}
    sc = from_dict(doc).with_overrides(duration_s=90)
    frames, _ = simulate_frames(sc, tables=["labels"])
    assert frames["labels"]["end"][0] == sc.start + timedelta(seconds=90)


@pytest.mark.parametrize("doc,key", [
    ({"nic_queues": 0}, "nic_queues"),
    ({"gpu_model": "b200"}, "gpu_model"),
    ({"gpu_model": ["h100_sxm", "x"]}, "gpu_model[1]"),
    ({"baseline_drops": 0.5}, "baseline_drops"),
    ({"smooth_throttle": 1}, "smooth_throttle"),
    ({"profile": "loud"}, "profile"),
    ({"hosts": [{"name": "a", "gpu_temp_spread": "yes"}]}, "hosts[0].gpu_temp_spread"),
])
def test_option_errors_name_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ScenarioError, match=rf"x\.toml: {key.replace('[', '.').replace(']', '.')}"):
        from_dict(doc, source="x.toml")


def test_profile_realistic_sets_the_options_and_keys_override_it() -> None:
    sc = from_dict({"hosts": 2, "profile": "realistic", "nic_queues": 8})
    h = sc.hosts[1]
    assert (h.cpus_per_node, h.nic_queues, h.gpu_temp_spread, h.smooth_throttle) == (56, 8, True, True)
    assert h.baseline_drops > 0
    assert from_dict({"hosts": 1}).hosts[0] == HostPlan("sim-00")


def test_the_jobs_quota_is_the_jobs_not_the_hosts() -> None:
    # a quota cut costs the same on a 112-CPU host as on the 32-CPU one: the job's demand
    # and its quota do not grow with the host
    def cost(cpn: int) -> float:
        inj = Injection("cgroup_cpu_throttle", "h0", 30, 60, 0.5)
        frames, _ = simulate_frames(_sc((inj,), workload="llm_serving", cpus_per_node=cpn), tables=["labels", "cgroup"])
        q = frames["cgroup"].filter(pl.col("cgroup") == "workload.slice")["cpu_quota_cores"].to_numpy()
        quotas.append(float(q.max()))
        return float(frames["labels"]["cost"][0])

    quotas: list[float] = []
    small, large = cost(16), cost(56)
    assert small > 0.01 and large == pytest.approx(small, rel=0.2)
    assert quotas[0] == quotas[1] >= 16.0


def test_a_healthy_jobs_quota_covers_its_peak_load() -> None:
    """Healthy means provisioned for its load: a serving job's mean CPU demand stays within
    80 % of its quota over the whole run (a request-rate drift took a fixed 16-core quota to
    110 %: throttled in 37 % of periods, the quota fault itself); training keeps 16 cores."""
    from ingest.simulator.workloads import (
        JOB_QUOTA_CORES,
        QUOTA_PEAK_SHARE,
        SERVING_SPIN_CORES,
        Schedule,
    )

    raised = 0
    for seed in range(12):
        for rate in (10.0, 30.0, 60.0):
            s = Schedule("llm_serving", 90 * 60 * 10, 0.0, np.random.SeedSequence(seed), {"request_rate": rate})
            peak = SERVING_SPIN_CORES + 0.6 + 0.09 * s.rate_s.max()
            assert peak <= QUOTA_PEAK_SHARE * s.quota + 1e-9
            assert s.quota >= JOB_QUOTA_CORES and s.quota == int(s.quota)
            raised += s.quota > JOB_QUOTA_CORES
    assert 0 < raised < 36  # light jobs keep the default quota, busy ones get more
    assert Schedule("training", 600, 0.0, np.random.SeedSequence(1)).quota == JOB_QUOTA_CORES


@pytest.fixture(scope="module")
def realistic_healthy() -> dict[str, dict[str, pl.DataFrame]]:
    return {wl: simulate_frames(_realistic(wl))[0] for wl in ("llm_serving", "training")}


def _realistic(workload: str, injections: tuple[Injection, ...] = ()) -> Scenario:
    opts = PROFILES["realistic"]
    return Scenario(name="t", seed=3, duration_s=DUR, hosts=(HostPlan("h0", workload, **opts),),  # type: ignore[arg-type]
                    injections=injections)


@pytest.mark.parametrize("typ", INEFFICIENCIES)
def test_realistic_profile_keeps_every_footprint(typ: str, realistic_healthy: dict[str, dict[str, pl.DataFrame]]
                                                 ) -> None:
    # baseline drops follow the traffic (more packets, more drops) and come in bursts: their
    # maximum is noise, not a footprint
    check_footprint(typ, realistic_healthy, _realistic, benign=(("net", "rx_dropped"),))
