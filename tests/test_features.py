"""Windowed features: hand-computed values on known signals, robustness to bad input,
and the catalog contract (every produced feature is documented)."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analytics import catalog
from analytics.features import THROTTLE_BITS, WindowSpec, compute_features, feature_columns
from ingest import schema

T0 = datetime(2025, 1, 6, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[1]


def load_synth():  # the benchmark's full-channel host generator (one source of truth)
    spec = importlib.util.spec_from_file_location("analytics_speed", ROOT / "benchmarks" / "analytics_speed.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def times(n: int, period_ms: int = 100, start: datetime = T0) -> list[datetime]:
    return [start + timedelta(milliseconds=period_ms * i) for i in range(n)]


def frame(name: str, **cols: object) -> pl.LazyFrame:
    """A schema-conformant frame of one measurement (missing fields null)."""
    return schema.conform(name, pl.DataFrame(cols)).lazy()


def test_sm_clock_ratio_reads_busy_samples_only() -> None:
    """An idle GPU lowers its clocks by design (P-states): samples under 10 % utilisation
    do not count, a window with no busy sample has no clock ratio, and unknown utilisation
    counts as busy."""
    n = 30  # 3 s at 100 ms: one window
    util = [0.0] * 10 + [95.0] * 10 + [None] * 10
    clock = [300.0] * 10 + [1980.0] * 10 + [990.0] * 10
    gpu = frame("gpu", time=times(n), host=["h"] * n, gpu=["0"] * n, uuid=["u"] * n, util_gpu=util,
                sm_clock_mhz=clock, sm_clock_max_mhz=[1980.0] * n)
    f = compute_features({"gpu": gpu})
    assert f.row(0, named=True)["gpu.sm_clock_ratio@gpu0"] == pytest.approx((1.0 + 0.5) / 2)
    idle = frame("gpu", time=times(n), host=["h"] * n, gpu=["0"] * n, uuid=["u"] * n, util_gpu=[2.0] * n,
                 sm_clock_mhz=[300.0] * n, sm_clock_max_mhz=[1980.0] * n)
    assert compute_features({"gpu": idle}).row(0, named=True)["gpu.sm_clock_ratio@gpu0"] is None


def test_gpu_ratios_and_throttle_shares_match_hand_computation() -> None:
    n = 50  # 5 s at 100 ms
    t = times(n)
    power = [300.0] * 25 + [600.0] * 25  # first 2.5 s at 300 W, then 600 W
    reasons = [0x4 if i % 5 == 0 else (0x40 if i % 5 == 1 else 0) for i in range(n)]
    gpu = frame("gpu", time=t, host=["h"] * n, gpu=["3"] * n, uuid=["u"] * n, power_w=power,
                power_limit_w=[600.0] * n, power_limit_default_w=[700.0] * n, sm_clock_mhz=[990.0] * n,
                sm_clock_max_mhz=[1980.0] * n, clock_event_reasons=reasons,
                power_violation=[50_000_000] * n,  # 50 ms of every 100 ms held by the cap
                pcie_link_width=[8.0] * n, pcie_link_width_max=[16.0] * n)
    f = compute_features({"gpu": gpu})
    assert f["window_start"].to_list() == [T0 + timedelta(seconds=s) for s in (0, 1, 2)]
    assert (f["window_end"] - f["window_start"]).to_list() == [timedelta(seconds=3)] * 3
    first = f.row(0, named=True)
    # window [0, 3): buckets 0,1 at 300 W, bucket 2 half 300 / half 600 -> mean of bucket means
    assert first["gpu.power_ratio@gpu3"] == pytest.approx((300 + 300 + 450) / 3 / 600)
    assert first["gpu.power_limit_ratio@gpu3"] == pytest.approx(600 / 700)
    assert first["gpu.sm_clock_ratio@gpu3"] == pytest.approx(0.5)
    assert first["gpu.throttle_power_share@gpu3"] == pytest.approx(0.2)
    assert first["gpu.throttle_thermal_share@gpu3"] == pytest.approx(0.2)
    assert first["gpu.throttle_hw_slowdown_share@gpu3"] == 0.0
    assert first["gpu.power_violation_share@gpu3"] == pytest.approx(0.5)
    assert first["pcie.link_width_ratio@gpu3"] == pytest.approx(0.5)
    assert f["gpu.power_ratio@gpu3"][2] == pytest.approx((450 + 600 + 600) / 3 / 600)
    assert f.schema["window_start"] == schema.TIME_DTYPE
    assert all(f.schema[c] == pl.Float64 for c in feature_columns(f))


def test_cpu_shares_per_node_and_counter_rates() -> None:
    n = 40  # 4 s
    t = times(n) * 2
    f = compute_features({
        "cpu": frame("cpu", time=t, host=["h"] * 2 * n, cpu=["0"] * n + ["1"] * n, node=["0"] * n + ["1"] * n,
                     user=[None] + [6] * (n - 1) + [2] * n, idle=[None] + [2] * (n - 1) + [7] * n,
                     softirq=[None] + [2] * (n - 1) + [1] * n, steal=[None] + [0] * (n - 1) + [0] * n),
        "system": frame("system", time=times(n), host=["h"] * n, ctxt=[100] * n, load1=[4.0] * n),
    })
    row = f.row(1, named=True)  # window [1 s, 4 s): no null first delta inside
    assert row["cpu.user_share@node0"] == pytest.approx(0.6)
    assert row["cpu.softirq_share@node0"] == pytest.approx(0.2)
    assert row["cpu.busy_share@node1"] == pytest.approx(0.3)
    assert row["cpu.steal_share@node1"] == 0.0
    assert row["cpu.ctxt_rate"] == pytest.approx(1000.0)  # 100 per 100 ms
    assert row["cpu.load1"] == pytest.approx(4.0)


def test_irq_locality_uses_the_devices_node_from_host_facts() -> None:
    n = 5  # medium tier, 1 s
    t = times(n, 1000) * 4
    dev = ["mlx5_comp0@pci:0000:17:00.0"] * (2 * n) + ["nvme0q1"] * (2 * n)
    node = (["0"] * n + ["1"] * n) * 2
    counts = [90] * n + [10] * n + [30] * n + [70] * n
    irq = frame("interrupts", time=t, host=["h"] * 4 * n, irq=["100"] * (2 * n) + ["101"] * (2 * n), device=dev,
                node=node, count=counts)
    facts = schema.conform("host_facts", pl.DataFrame({
        "time": [T0] * 4, "host": ["h"] * 4, "category": ["nic", "nic", "nvme", "gpu"],
        "device": ["mlx5_0", "mlx5_0", "nvme0", "0"], "key": ["numa_node", "pci", "numa_node", "numa_node"],
        "value": ["0", "0000:17:00.0", "1", "1"], "value_num": [0.0, None, 1.0, 1.0],
    }))
    f = compute_features({"interrupts": irq}, host_facts=facts)
    assert f["irq.locality@mlx5_0"].to_list() == pytest.approx([0.9] * 3)
    assert f["irq.locality@nvme0"].to_list() == pytest.approx([0.7] * 3)
    assert f["irq.rate@mlx5_0"].to_list() == pytest.approx([100.0] * 3)
    # without facts the locality cannot be known: no irq features, no crash
    assert not [c for c in compute_features({"interrupts": irq}).columns if c.startswith("irq.")]
    # a host of the fleet without facts (its lines name no known device): no irq buckets,
    # so no windows from this table alone; the other host's features are as alone
    other = irq.with_columns(pl.lit("g").alias("host"))
    assert compute_features({"interrupts": pl.concat([other, irq])}, host_facts=facts).equals(f)


def test_memory_numa_disk_net_cgroup_ratios() -> None:
    n = 3
    t = times(n, 1000)
    h = ["h"] * n
    f = compute_features({
        "memory": frame("memory", time=t, host=h, anon_pages=[1000] * n, anon_huge_pages=[250] * n,
                        mem_total=[4000] * n, mem_available=[1000] * n),
        "vmstat": frame("vmstat", time=t, host=h, numa_hit=[90] * n, numa_miss=[10] * n,
                        thp_fault_alloc=[3] * n, thp_fault_fallback=[1] * n),
        "disk": frame("disk", time=t, host=h, device=["nvme0n1"] * n, reads=[10] * n, writes=[10] * n,
                      read_time=[30] * n, write_time=[10] * n, io_time=[500] * n),
        "net": frame("net", time=t, host=h, interface=["ib0"] * n, rx_dropped=[2] * n, tx_dropped=[1] * n,
                     rx_fifo=[0] * n),
        "tcp": frame("tcp", time=t, host=h, out_segs=[1000] * n, retrans_segs=[5] * n),
        "cgroup": frame("cgroup", time=t, host=h, cgroup=["kubepods"] * n, nr_periods=[10] * n,
                        nr_throttled=[4] * n, throttled_time=[250_000] * n),
    })
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["mem.hugepage_coverage"] == pytest.approx(0.25)
    assert r["mem.available_share"] == pytest.approx(0.25)
    assert r["numa.remote_share"] == pytest.approx(0.1)
    assert r["mem.thp_fallback_share"] == pytest.approx(0.25)
    assert r["mem.thp_fallback_rate"] == pytest.approx(1.0)
    assert r["disk.latency_ms@nvme0n1"] == pytest.approx(2.0)
    assert r["disk.util@nvme0n1"] == pytest.approx(0.5)
    assert r["net.drop_rate@ib0"] == pytest.approx(3.0)
    assert r["net.retrans_share"] == pytest.approx(0.005)
    assert r["cgroup.throttled_share@kubepods"] == pytest.approx(0.4)
    assert r["cgroup.throttled_time_share@kubepods"] == pytest.approx(0.25)


def test_drop_share_of_offered_packets() -> None:
    # rx_packets counts delivered packets only: the share lost is drops / (delivered + drops);
    # tx drops are no loss of received traffic; an idle port (no packets at all) has no share
    n = 3
    t = times(n, 1000)
    net = frame("net", time=t * 2, host=["h"] * 2 * n, interface=["ib0"] * n + ["eno1"] * n,
                rx_packets=[97] * n + [0] * n, rx_dropped=[1] * n + [0] * n, rx_fifo=[2] * n + [0] * n,
                tx_dropped=[5] * n + [0] * n)
    r = compute_features({"net": net}).row(0, named=True)
    assert r["net.drop_share@ib0"] == pytest.approx(0.03)
    assert r["net.drop_rate@ib0"] == pytest.approx(8.0)
    assert r["net.drop_share@eno1"] is None


def test_bad_input_gives_defined_results() -> None:
    n = 60
    t = times(n)
    # NaN samples, a constant channel, a channel appearing mid-interval, zero denominators
    power = [float("nan") if i % 10 == 0 else 400.0 for i in range(n)]
    sm = [None] * 30 + [1500.0] * 30
    gpu = frame("gpu", time=t, host=["h"] * n, gpu=["0"] * n, uuid=["u"] * n, power_w=power,
                power_limit_w=[0.0] * 30 + [500.0] * 30, sm_clock_mhz=sm, sm_clock_max_mhz=[2000.0] * n,
                temperature_c=[50.0] * n)
    f = compute_features({"gpu": gpu})
    assert f.height == 4
    assert f["gpu.power_ratio@gpu0"][0] is None  # x/0 is missing, not inf
    assert f["gpu.power_ratio@gpu0"][3] == pytest.approx(0.8)  # NaN samples ignored
    assert f["gpu.sm_clock_ratio@gpu0"][0] is None and f["gpu.sm_clock_ratio@gpu0"][3] == pytest.approx(0.75)
    assert f["gpu.temperature_max@gpu0"].to_list() == [50.0] * 4
    vals = f.select(feature_columns(f)).to_numpy()
    assert not np.isinf(vals[np.isfinite(vals) | np.isinf(vals)]).any()


def test_single_sample_and_empty_and_missing_tables() -> None:
    one = frame("gpu", time=[T0], host=["h"], gpu=["0"], uuid=["u"], power_w=[100.0], power_limit_w=[400.0])
    f = compute_features({"gpu": one})
    assert f.height == 1 and f["gpu.power_ratio@gpu0"][0] == pytest.approx(0.25)
    empty = compute_features({"gpu": schema.empty_frame("gpu").lazy()})
    assert empty.height == 0 and empty.columns == ["host", "window_start", "window_end"]
    assert compute_features({}).height == 0
    # a host without GPUs next to one with: GPU columns null for the former
    cpu = frame("cpu", time=times(30) * 2, host=["a"] * 30 + ["b"] * 30, cpu=["0"] * 60, node=["0"] * 60,
                user=[1] * 60, idle=[1] * 60)
    g = frame("gpu", time=times(30), host=["b"] * 30, gpu=["0"] * 30, uuid=["u"] * 30, util_gpu=[50.0] * 30)
    both = compute_features({"cpu": cpu, "gpu": g})
    assert set(both["host"]) == {"a", "b"}
    assert both.filter(pl.col("host") == "a")["gpu.util@gpu0"].null_count() == both.filter(pl.col("host") == "a").height


def test_bad_frames_and_window_specs_are_rejected_with_names() -> None:
    with pytest.raises(ValueError, match="stride_s"):
        WindowSpec(3, 0)
    with pytest.raises(ValueError, match="length_s=2.5 is not a multiple"):
        WindowSpec(2.5, 1)
    with pytest.raises(ValueError, match="'gpu'.*lacks"):
        compute_features({"gpu": pl.LazyFrame({"x": [1]})})


def test_custom_window_and_imported_measurement() -> None:
    n = 600  # 10 minutes at 1 s
    df = pl.DataFrame({"time": times(n, 1000), "host": ["m1"] * n, "cpu_load": np.arange(n, dtype=float),
                       "mem.free": np.ones(n)})
    f = compute_features({"smd": df.lazy()}, WindowSpec(length_s=60, stride_s=60))
    assert f.height == 10
    assert f["smd.cpu_load"].to_list() == pytest.approx([29.5 + 60 * i for i in range(10)])
    info = catalog.lookup("smd.mem.free")
    assert info.subsystem == "other" and info.family == "smd.mem.free"


def test_full_host_features_are_all_in_the_catalog() -> None:
    synth = load_synth()
    frames = synth.synth_frames(seconds=20)
    facts = frames.pop("host_facts")
    f = compute_features({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
    cols = feature_columns(f)
    assert len(cols) > 250
    unknown = sorted({catalog.split_feature(c)[0] for c in cols if catalog.split_feature(c)[0] not in catalog.FAMILIES})
    assert unknown == []
    subsystems = {catalog.lookup(c).subsystem for c in cols}
    assert subsystems == {"cpu", "gpu", "memory", "interconnect", "network", "storage"}
    assert {"gpu.power_ratio@gpu3", "irq.locality@mlx5_0", "mem.hugepage_coverage", "numa.remote_share",
            "cpu.softirq_share@node1", "net.drop_rate@ib0", "cgroup.throttled_share@kubepods"} <= set(cols)
    assert f.select(pl.col("irq.locality@mlx5_0").min() > 0.9).item()  # the synthetic NICs are serviced locally


def test_stride_longer_than_bucket_gaps_and_hosts_share_one_grid() -> None:
    # host a: 12 s of 100-ms samples with a 2-s gap (no rows in [5 s, 7 s)); host b: 6 s
    ta = [t for t in times(120) if not (T0 + timedelta(seconds=5) <= t < T0 + timedelta(seconds=7))]
    tb = times(60, start=T0 + timedelta(seconds=1))
    n_a, n_b = len(ta), len(tb)
    sys_ = frame("system", time=ta + tb, host=["a"] * n_a + ["b"] * n_b, ctxt=[10] * (n_a + n_b))
    f = compute_features({"system": sys_}, WindowSpec(length_s=4, stride_s=2, bucket_s=1))
    a = f.filter(pl.col("host") == "a")
    # windows start at multiples of the stride, are 4 s long and lie inside the host's data
    assert a["window_start"].to_list() == [T0 + timedelta(seconds=s) for s in (0, 2, 4, 6, 8)]
    rates = a["cpu.ctxt_rate"].to_list()
    assert rates[0] == pytest.approx(100.0) and rates[4] == pytest.approx(100.0)
    assert rates[2] == pytest.approx(50.0)  # [4 s, 8 s) lost 2 s of samples to the gap
    b = f.filter(pl.col("host") == "b")
    # b has data in [1 s, 7 s): the one full window aligned to the stride is [2 s, 6 s)
    assert b["window_start"].to_list() == [T0 + timedelta(seconds=2)]
    assert b["cpu.ctxt_rate"][0] == pytest.approx(100.0)


def test_features_do_not_depend_on_the_row_order() -> None:
    synth = load_synth()
    frames = synth.synth_frames(seconds=120)
    facts = frames.pop("host_facts")
    orders = {
        "series_major": frames,
        "time_major": {k: v.sort("time", maintain_order=True) for k, v in frames.items()},
        "shuffled": {k: v.sample(fraction=1.0, shuffle=True, seed=2) for k, v in frames.items()},  # group_by path
    }
    out = {k: compute_features({n: v.lazy() for n, v in fr.items()}, host_facts=facts) for k, fr in orders.items()}
    from polars.testing import assert_frame_equal

    assert out["series_major"].width > 250
    for k in ("time_major", "shuffled"):
        assert_frame_equal(out[k], out["series_major"], check_exact=False, rel_tol=1e-12, abs_tol=1e-15)
    # two hosts in one frame, and the same hosts' rows interleaved, give each host's own features
    other = synth.synth_frames(host="host-b", seconds=120, seed=1)
    facts2 = pl.concat([facts, other.pop("host_facts")])
    two = {k: pl.concat([frames[k], other[k]]) for k in frames}
    mixed = {k: v.sort("time", maintain_order=True) for k, v in two.items()}
    a = compute_features({n: v.lazy() for n, v in two.items()}, host_facts=facts2)
    b = compute_features({n: v.lazy() for n, v in mixed.items()}, host_facts=facts2)
    assert_frame_equal(b, a, check_exact=False, rel_tol=1e-12, abs_tol=1e-15)
    assert_frame_equal(a.filter(pl.col("host") == "host-a").select(out["series_major"].columns), out["series_major"],
                       check_exact=False, rel_tol=1e-12, abs_tol=1e-15)


def test_irq_lines_of_one_device_add_up_and_locality_is_the_share_on_its_node() -> None:
    # mlx5_0 (node 0) has two IRQ lines, each on both nodes; an IRQ of an unknown device is dropped
    n = 6
    lines = [("mlx5_comp0@pci:0000:17:00.0", "0", 40), ("mlx5_comp0@pci:0000:17:00.0", "1", 10),
             ("mlx5_comp1@pci:0000:17:00.0", "0", 20), ("mlx5_comp1@pci:0000:17:00.0", "node1", 30),
             ("unknown_dev", "0", 1000)]
    rows = [(t, name, node, c) for t in times(n, 1000) for name, node, c in lines]  # time-major, as the agent writes
    irq = frame("interrupts", time=[r[0] for r in rows], host=["h"] * len(rows), irq=["1"] * len(rows),
                device=[r[1] for r in rows], node=[r[2] for r in rows], count=[r[3] for r in rows])
    facts = schema.conform("host_facts", pl.DataFrame({
        "time": [T0] * 2, "host": ["h"] * 2, "category": ["nic", "nic"], "device": ["mlx5_0", "mlx5_0"],
        "key": ["numa_node", "pci"], "value": ["0", "0000:17:00.0"], "value_num": [0.0, None]}))
    f = compute_features({"interrupts": irq}, host_facts=facts)
    assert [c for c in f.columns if c.startswith("irq.")] == ["irq.locality@mlx5_0", "irq.rate@mlx5_0"]
    assert f["irq.rate@mlx5_0"].to_list() == pytest.approx([100.0] * 4)  # 40+10+20+30 a second
    assert f["irq.locality@mlx5_0"].to_list() == pytest.approx([0.6] * 4)  # (40+20)/100 on node 0
    # the same rows in another order give the same features
    shuffled = irq.collect().sample(fraction=1.0, shuffle=True, seed=1).lazy()
    assert compute_features({"interrupts": shuffled}, host_facts=facts).equals(f)


def test_tag_values_that_name_one_device_are_one_device() -> None:
    # numa rows tagged "1" and "node1" are both node1: their counters add up
    n = 4
    t = times(n, 1000)
    numa = frame("numa", time=t * 3, host=["h"] * 3 * n, node=["0"] * n + ["1"] * n + ["node1"] * n,
                 numa_hit=[90] * n + [60] * n + [20] * n, numa_miss=[10] * n + [0] * n + [20] * n)
    f = compute_features({"numa": numa})
    assert sorted(c for c in f.columns if c.startswith("numa.remote")) == ["numa.remote_share@node0",
                                                                             "numa.remote_share@node1"]
    assert f["numa.remote_share@node0"].to_list() == pytest.approx([0.1] * 2)
    assert f["numa.remote_share@node1"].to_list() == pytest.approx([0.2] * 2)  # 20 / (60+20+20)


def test_sparse_rates_nulls_nan_and_narrow_dtypes() -> None:
    n = 40  # 4 s at 100 ms
    t = times(n)
    # softirq NET_RX only in the first 2 s: its rate is 0 (no events), not missing, afterwards
    soft = frame("softirqs", time=t[:20] + t, host=["h"] * (20 + n), softirq=["NET_RX"] * 20 + ["TIMER"] * n,
                 count=[5] * 20 + [1] * n)
    # a counter's first delta is null (no previous reading): the rate is over the deltas there are
    sys_ = frame("system", time=t, host=["h"] * n, ctxt=[None] + [100] * (n - 1), forks=[1] * n)
    # NaN temperatures are skipped by the max; a gauge's NaN is missing, not a value
    gpu = frame("gpu", time=t, host=["h"] * n, gpu=["0"] * n, uuid=["u"] * n,
                temperature_c=[float("nan") if i % 2 else 60.0 + i for i in range(n)],
                util_gpu=[float("nan") if i % 4 == 0 else 50.0 for i in range(n)])
    f = compute_features({"softirqs": soft, "system": sys_, "gpu": gpu}, WindowSpec(length_s=2, stride_s=2))
    assert f["softirq.rate@NET_RX"].to_list() == pytest.approx([50.0, 0.0])
    assert f["softirq.rate@TIMER"].to_list() == pytest.approx([10.0, 10.0])
    assert f["cpu.ctxt_rate"].to_list() == pytest.approx([1900 / 2, 1000.0])
    assert f["gpu.temperature_max@gpu0"].to_list() == pytest.approx([78.0, 98.0])
    assert f["gpu.util@gpu0"].to_list() == pytest.approx([0.5, 0.5])
    # the same values in narrower dtypes give the same features
    narrow = frame("gpu", time=t, host=["h"] * n, gpu=["0"] * n, uuid=["u"] * n,
                   temperature_c=pl.Series([float("nan") if i % 2 else 60.0 + i for i in range(n)], dtype=pl.Float32),
                   util_gpu=[float("nan") if i % 4 == 0 else 50.0 for i in range(n)])
    g = compute_features({"gpu": narrow}, WindowSpec(length_s=2, stride_s=2))
    assert g["gpu.temperature_max@gpu0"].to_list() == pytest.approx([78.0, 98.0])
    imported = pl.DataFrame({"time": t, "host": ["h"] * n, "q": pl.Series(range(n), dtype=pl.Int16),
                             "ok": [i % 2 == 0 for i in range(n)]})
    h = compute_features({"app": imported.lazy()}, WindowSpec(length_s=2, stride_s=2))
    assert h["app.q"].to_list() == pytest.approx([9.5, 29.5]) and h["app.ok"].to_list() == pytest.approx([0.5, 0.5])


def test_long_windows_and_buckets_shorter_than_the_stride() -> None:
    # 2 minutes of a ramp at 1 s: 30-s windows every 10 s of 0.5-s buckets (60 buckets a window)
    n = 120
    sys_ = frame("system", time=times(n, 1000), host=["h"] * n, ctxt=list(range(n)),
                 load1=[float(i) for i in range(n)])
    f = compute_features({"system": sys_}, WindowSpec(length_s=30, stride_s=10, bucket_s=0.5))
    starts = [(s - T0).total_seconds() for s in f["window_start"].to_list()]
    # (the last sample, at 119 s, fills the bucket [119 s, 119.5 s): [90 s, 120 s) is not covered)
    assert starts == [0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert f["cpu.ctxt_rate"].to_list() == pytest.approx([sum(range(s, s + 30)) / 30 for s in range(0, 81, 10)])
    assert f["cpu.load1"].to_list() == pytest.approx([s + 14.5 for s in range(0, 81, 10)])


# ------------------------------ features against a plain Polars reference, on every row layout
_GPU_FAMILIES = ("gpu.ecc_corrected_rate", "gpu.util", "gpu.temperature_max",
                 "gpu.throttle_thermal_share", "pcie.link_gen_ratio")


def _gpu_rows(layout: str, seed: int) -> pl.DataFrame:
    """Two hosts' gpu samples (host a: GPUs 0-2, host b: GPU 0; every 250 ms for 60 s)
    with nulls and NaN, in one row layout; some layouts lose or repeat samples."""
    rng = np.random.default_rng(seed)
    series = [("a", "0"), ("a", "1"), ("a", "2"), ("b", "0")]
    n_t = 240
    us = np.repeat(np.arange(n_t) * 250_000, len(series))
    n = us.size

    def holes(x: np.ndarray) -> pl.Series:
        return pl.Series(x).scatter(rng.choice(n, 12, replace=False), None)

    util = rng.random(n) * 100
    util[rng.random(n) < 0.05] = np.nan  # a gauge's NaN is missing
    df = schema.conform("gpu", pl.DataFrame({
        "time": [T0 + timedelta(microseconds=int(x)) for x in us],
        "host": np.tile([h for h, _ in series], n_t), "gpu": np.tile([g for _, g in series], n_t),
        "util_gpu": holes(util), "temperature_c": holes(rng.integers(30, 90, n).astype(float)),
        "clock_event_reasons": holes(rng.choice([0, 0x4, 0x20, 0x40, 0x60], n)),
        "ecc_corrected": holes(rng.integers(0, 5, n)),
        "pcie_link_gen": holes(rng.choice([3.0, 4.0], n)), "pcie_link_gen_max": holes(np.full(n, 4.0)),
    }))
    if layout == "time_major_per_host":
        return df.sort("host", maintain_order=True)
    if layout == "series_major":
        return df.sort("host", "gpu", "time")
    if layout == "sparse":  # rows missing: series sampled at different times
        return df.filter(pl.Series(rng.random(n) > 0.2)).sort("host", maintain_order=True)
    if layout == "duplicated":  # a series with two rows at one time: both are samples
        return pl.concat([df, df.sample(n=15, seed=seed)]).sort("host", "time", maintain_order=True)
    return df.sample(fraction=1.0, shuffle=True, seed=seed)  # hosts interleaved, any order


def _gpu_reference(rows: pl.DataFrame, spec: WindowSpec) -> pl.DataFrame:
    """The five families of ``_GPU_FAMILIES`` the plain Polars way, as the plans state them:
    samples -> buckets (one group_by: counters summed, gauges averaged with NaN missing,
    throttle samples counted, temperature max, link min while >= 10 % busy and max), every
    bucket exploded into the windows it is in -> windows (a group_by: sums, mean of the
    bucket means, max/min),
    full windows at multiples of the stride inside each host's data; x/0 is null."""
    b, s = round(spec.bucket * 1e6), round(spec.stride_s * 1e6)
    m = round(spec.length_s / spec.bucket)
    cer, f64 = pl.col("clock_event_reasons"), pl.Float64
    buckets = rows.group_by("host", "gpu", (pl.col("time").dt.epoch("us") // b * b).alias("b")).agg(
        ecc=pl.col("ecc_corrected").sum(), util=pl.col("util_gpu").cast(f64).fill_nan(None).mean(),
        temp=pl.col("temperature_c").cast(f64).max(), n=cer.count(),
        thermal=((cer & THROTTLE_BITS["thermal"]) != 0).cast(pl.Int64).sum(),
        gen=pl.col("pcie_link_gen").cast(f64).filter(~(pl.col("util_gpu") < 10).fill_null(False)).min(),
        gen_max=pl.col("pcie_link_gen_max").cast(f64).max())
    span = buckets.group_by("host").agg(lo=pl.col("b").min(), hi=pl.col("b").max())
    windows = (buckets.with_columns(ws=pl.int_ranges(pl.col("b") - (m - 1) * b, pl.col("b") + 1, b))
               .explode("ws").join(span, on="host")
               .filter((pl.col("ws") >= pl.col("lo")) & (pl.col("ws") + (m - 1) * b <= pl.col("hi"))
                       & (pl.col("ws") % s == 0))
               .group_by("host", "gpu", "ws")
               .agg(pl.col("ecc", "thermal", "n").sum(), pl.col("util").mean(), pl.col("temp", "gen_max").max(),
                    pl.col("gen").min()))
    values = {"gpu.ecc_corrected_rate": pl.col("ecc") / spec.length_s, "gpu.util": pl.col("util") / 100.0,
              "gpu.temperature_max": pl.col("temp"), "gpu.throttle_thermal_share": pl.col("thermal") / pl.col("n"),
              "pcie.link_gen_ratio": pl.col("gen") / pl.col("gen_max")}
    long = pl.concat([windows.select(
        "host", pl.from_epoch("ws", "us").dt.replace_time_zone("UTC").alias("window_start"),
        (pl.lit(f"{fam}@gpu") + pl.col("gpu")).alias("column"),
        pl.when(e.is_finite()).then(e).cast(f64).alias("value")) for fam, e in values.items()])
    return long.pivot(on="column", index=["host", "window_start"], values="value")


@pytest.mark.parametrize("layout", ["time_major_per_host", "series_major", "sparse", "duplicated", "shuffled"])
def test_features_equal_a_plain_polars_reference_on_every_layout(layout: str) -> None:
    """Buckets and windows (sum, mean, count, max, min; nulls, NaN, missing and repeated
    samples, interleaved hosts; windows of 1 to 60 buckets, strides longer than a bucket)
    through the public API, against an independent computation in Polars."""
    from polars.testing import assert_series_equal

    rows = _gpu_rows(layout, seed=len(layout))
    for spec in (WindowSpec(), WindowSpec(1, 1), WindowSpec(4, 2, 1), WindowSpec(30, 10, 0.5)):
        got = compute_features({"gpu": rows.lazy()}, spec)
        ref = _gpu_reference(rows, spec)
        cols = sorted(c for c in ref.columns if c not in ("host", "window_start"))
        assert {c.split("@")[0] for c in cols} == set(_GPU_FAMILIES)
        assert ref.join(got, on=["host", "window_start"], how="anti").is_empty()  # no window lost
        both = got.select("host", "window_start", *cols).join(ref, on=["host", "window_start"], how="left",
                                                               suffix="_ref")
        assert both.height == got.height > 0
        for c in cols:
            assert_series_equal(both[c], both[f"{c}_ref"], check_names=False, check_exact=False,
                                rel_tol=1e-12, abs_tol=1e-12)
