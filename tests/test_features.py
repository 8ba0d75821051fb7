"""Windowed features: hand-computed values on known signals, robustness to bad input,
and the catalog contract (every produced feature is documented)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analytics import catalog
from analytics.features import WindowSpec, compute_features, feature_columns
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


# ------------------------------------------------- the regular-grid fast path (speed)
def _bucket_inputs(frames: dict[str, pl.DataFrame], facts: pl.DataFrame) -> dict[str, tuple[pl.DataFrame, object]]:
    """Each table's bucket rows (the input of the bucket reduction) and its plan."""
    from analytics import features as F

    tables = F._tables({k: v.lazy() for k, v in frames.items()}, facts)
    return {n: (F.bucket_rows(lf, plan, WindowSpec()).collect(), plan) for n, (lf, plan) in tables.items()}


def _assert_same_buckets(fast: pl.DataFrame, ref: pl.DataFrame, plan: object) -> None:
    from polars.testing import assert_frame_equal

    from analytics import features as F

    keys = ["host", F._DEV, F._B]
    ref = F._with_device(ref, plan)  # type: ignore[arg-type]
    assert dict(fast.schema) == dict(ref.schema)
    assert_frame_equal(fast.sort(keys), ref.sort(keys), check_exact=False, rel_tol=1e-12, abs_tol=0.0,
                       check_column_order=False)


@pytest.mark.parametrize("layout", ["series_major", "time_major", "two_hosts"])
def test_bucket_fast_path_equals_group_by_on_every_table(layout: str) -> None:
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=30)
    facts = frames.pop("host_facts")
    # a counter's first delta is null, a gauge reads NaN once: both as in real telemetry
    frames["cpu"] = frames["cpu"].with_columns(
        pl.when(pl.int_range(pl.len()) < 3).then(None).otherwise(pl.col("user")).alias("user"),
        pl.when(pl.int_range(pl.len()) == 7).then(float("nan")).otherwise(pl.col("freq_mhz")).alias("freq_mhz"))
    if layout in ("time_major", "two_hosts"):  # the lake's and the agent's order
        frames = {k: v.sort("time", maintain_order=True) for k, v in frames.items()}
    if layout == "two_hosts":
        other = synth.synth_frames(host="host-b", seconds=30, seed=3)
        facts = pl.concat([facts, other.pop("host_facts")])
        frames = {k: pl.concat([v, other[k].sort("time", maintain_order=True)]) for k, v in frames.items()}
    for name, (rows, plan) in _bucket_inputs(frames, facts).items():
        ref = F._group_by_buckets(rows.lazy(), plan).collect()  # type: ignore[arg-type]
        fast = F._regular_buckets(rows, plan)  # type: ignore[arg-type]
        assert fast is not None, f"{name}: regular telemetry must take the fast path"
        _assert_same_buckets(fast, ref, plan)


def test_bucket_fast_path_declines_irregular_rows_and_the_result_stays_right() -> None:
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=30)
    facts = frames.pop("host_facts")
    cpu = frames["cpu"].sort("time", maintain_order=True)
    variants = {
        "sparse (a row omitted)": cpu.filter(pl.int_range(pl.len()) != 1000),
        "shuffled": cpu.sample(fraction=1.0, shuffle=True, seed=1),
        "series order differs between samples": pl.concat([cpu.slice(0, 32).reverse(), cpu.slice(32)]),
        "host in two runs": pl.concat([cpu.slice(0, 3200), cpu.slice(3200).with_columns(host=pl.lit("x")),
                                       cpu.slice(0, 32).with_columns(time=pl.col("time") + timedelta(hours=1))]),
    }
    for what, df in variants.items():
        rows, plan = _bucket_inputs({"cpu": df}, facts)["cpu"]
        ref = F._group_by_buckets(rows.lazy(), plan).collect()  # type: ignore[arg-type]
        assert F._regular_buckets(rows, plan) is None, what  # type: ignore[arg-type]
        _assert_same_buckets(F._reduce_buckets(rows, plan), ref, plan)  # type: ignore[arg-type]


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


def _two_host_buckets() -> tuple[dict, WindowSpec, dict[str, pl.DataFrame]]:
    """Tables of two synthetic hosts (40 s and 25 s, offset by 3 s) and their buckets."""
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=40)
    facts = frames.pop("host_facts")
    other = synth.synth_frames(host="host-b", seconds=25, seed=5, start=T0 + timedelta(seconds=3))
    frames = {k: pl.concat([v, other[k]]) for k, v in frames.items() if k != "host_facts"}
    tables = F._tables({k: v.lazy() for k, v in frames.items()}, facts)
    spec = WindowSpec(length_s=3, stride_s=1)
    buckets = {name: F._reduce_buckets(F.bucket_rows(lf, plan, spec).collect(), plan)
               for name, (lf, plan) in tables.items()}
    return tables, spec, buckets


def test_window_scatter_equals_the_join_on_the_grid() -> None:
    from analytics import features as F

    tables, spec, buckets = _two_host_buckets()
    bks = {}
    for name, bk in buckets.items():
        # gaps: every 7th bucket row, and one device of host-b altogether
        first_dev = bk["_dev"].min()
        bks[name] = bk.filter((pl.int_range(pl.len()) % 7 != 3)
                              & ~((pl.col("host") == "host-b") & (pl.col("_dev") == first_dev)))
    grid = F._grid(list(bks.values()), spec)
    for name, bk in bks.items():
        plan = tables[name][1]
        # the scatter under Polars' rolling, as the join: bit for bit (the numpy windows
        # are compared with the join in test_numpy_windows_equal_polars_rolling_on_the_join)
        dev_s, dense = F._dense(bk, plan, grid)
        devs, got = F._windows_of(dense, dev_s, plan, grid)
        devs_ref, ref = F._table_windows_polars(bk, plan, grid)
        assert devs == devs_ref
        assert got.equals(ref, null_equal=True), name


def test_window_queries_of_tables_with_equal_device_counts_merged_equal_one_per_table() -> None:
    from analytics import features as F

    tables, spec, buckets = _two_host_buckets()
    bks = {}
    for name, bk in buckets.items():
        # gaps (the gather path) in one table of each device count, regular in the others
        bks[name] = bk.filter(pl.int_range(pl.len()) % 5 != 2) if name in ("system", "cpu", "gpu") else bk
    grid = F._grid(list(bks.values()), spec)
    plans = {name: tables[name][1] for name in bks}
    # a second `tcp`: its bucket and feature names collide with tcp's, so it must get a
    # query of its own (same values as tcp's)
    bks["tcp_copy"], plans["tcp_copy"] = bks["tcp"], plans["tcp"]
    n_dev = [len(F._table_windows(bk, plans[name], grid)[0]) for name, bk in bks.items()]
    assert max(n_dev.count(n) for n in n_dev) >= 4  # several tables share a query
    got = F._all_windows(bks, plans, grid)
    assert set(got) == set(bks)
    for name, bk in bks.items():
        devs, ref = F._table_windows(bk, plans[name], grid)
        assert got[name][0] == devs, name
        assert got[name][1].columns == ref.columns, name
        assert got[name][1].equals(ref, null_equal=True), name
    assert got["tcp_copy"][1].equals(got["tcp"][1], null_equal=True)


def test_bucket_fast_path_merges_tag_values_that_name_one_device() -> None:
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=30)
    facts = frames.pop("host_facts")
    # cpus 0-7 report node "node0", cpus 8-15 node "0": one device, node0, two series groups
    cpu = frames["cpu"].sort("time", maintain_order=True).with_columns(
        node=pl.when(pl.col("cpu").cast(pl.Int64) < 8).then(pl.lit("node0")).otherwise(pl.col("node")))
    rows, plan = _bucket_inputs({"cpu": cpu}, facts)["cpu"]
    ref = F._group_by_buckets(rows.lazy(), plan).collect()  # type: ignore[arg-type]
    fast = F._regular_buckets(rows, plan)  # type: ignore[arg-type]
    assert fast is not None
    assert sorted(fast[F._DEV].unique().to_list()) == ["node0", "node1"]
    _assert_same_buckets(fast, ref, plan)


@pytest.mark.parametrize("layout", ["series_major", "time_major"])
def test_irq_devices_mapped_per_series_equal_the_per_row_join(layout: str) -> None:
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=160)  # (160 s: the 3-s buckets below end with a partial one)
    facts = frames.pop("host_facts")
    irq = frames["interrupts"]
    # one IRQ line's node unknown (null): its rows are kept, never local; the first
    # sample's counts are null (a counter's first delta)
    irq = irq.with_columns(node=pl.when(pl.col("irq") == pl.col("irq").min()).then(None).otherwise(pl.col("node")),
                           count=pl.when(pl.col("time") == pl.col("time").min()).then(None).otherwise(pl.col("count")))
    # series in an order that is not the devices' (the reduction sums them per device)
    irq = irq.sort(pl.col("irq").cast(pl.Int64) % 8, "irq", maintain_order=True)  # queue 0 of every NIC first
    if layout == "time_major":
        irq = irq.sort("time", maintain_order=True)
    nic = facts.filter(pl.col("category") == "nic")["device"].sort()[0]
    spec = WindowSpec()
    plan = F._plan_interrupts(set(irq.columns))
    cases = {"all facts": facts, f"no facts for {nic}": facts.filter(pl.col("device").fill_null("") != nic)}
    # buckets of 1 and 4 samples (equal runs), and of 3 with a last one of 1 sample (160 s)
    for (what, f), spec in [*((c, WindowSpec()) for c in cases.items()),
                            (("4-s buckets", facts), WindowSpec(length_s=8, stride_s=4)),
                            (("3-s buckets, last partial", facts), WindowSpec(length_s=6, stride_s=3))]:
        attached = F._attach_irq_devices(irq.lazy(), f)
        assert attached is not None
        ref = F.bucket_rows(attached, plan, spec).collect()
        got = F._irq_rows(irq.lazy(), F._facts_nodes(f), plan, spec)
        assert got is not None, f"{what}: a regular one-host grid must be mapped per series"
        assert got.equals(ref), what
        assert ref["local"].sum() > 0 and ref["local"].sum() < ref["count"].sum(), what
        # ... and reduced straight from the grid, the buckets of the reduction of those rows
        bk = F._irq_buckets(irq.lazy(), F._facts_nodes(f), plan, spec)
        bk_ref = F._reduce_buckets(ref, plan)
        assert bk is not None, what
        keys = ["host", "_dev", "_b"]
        assert bk.select(bk_ref.columns).sort(keys).equals(bk_ref.sort(keys)), what
        if f is not facts:
            assert got.height < irq.height and nic not in got["_dev"].unique().to_list(), what
    spec = WindowSpec()
    # not a grid (shuffled rows) or several hosts: None, and the features still come by the join
    shuffled = irq.sample(fraction=1.0, shuffle=True, seed=4)
    assert F._irq_rows(shuffled.lazy(), F._facts_nodes(facts), plan, spec) is None
    two = pl.concat([irq, irq.with_columns(host=pl.lit("host-b"))])
    assert F._irq_rows(two.lazy(), F._facts_nodes(facts), plan, spec) is None
    a = compute_features({"interrupts": irq.lazy()}, host_facts=facts)
    b = compute_features({"interrupts": shuffled.lazy()}, host_facts=facts)
    assert a.width > 10 and a.equals(b)


def _grid_frame(n_t: int, devs: list[str], time_major: bool, nulls: dict[str, np.ndarray]) -> pl.DataFrame:
    """A hand-built regular table at 100 ms: ``n_t`` samples of one series per device;
    a counter ``c`` (Int64), a gauge ``g`` (Float64); ``nulls``: column -> bool mask
    (series x samples) of the null readings."""
    rng = np.random.default_rng(len(devs) * n_t)
    k = len(devs)
    t = int(T0.timestamp() * 1e6) + np.arange(n_t, dtype=np.int64) * 100_000  # µs
    c = rng.integers(0, 1000, (k, n_t))
    g = rng.normal(50.0, 5.0, (k, n_t))
    cols: dict[str, object] = {"time": np.tile(t, k), "host": ["h"] * (k * n_t), "dev": np.repeat(devs, n_t),
                               "c": c.ravel(), "g": g.ravel()}
    df = pl.DataFrame(cols).with_columns(pl.col("time").cast(pl.Datetime("us", "UTC")))
    if time_major:
        df = df.sort("time", maintain_order=True)
    for name, mask in nulls.items():  # scatter keeps the values under the nulls, as real buffers may
        at = np.flatnonzero(mask.T.ravel() if time_major else mask.ravel())
        df = df.with_columns(df[name].scatter(at, None))
    return df


@pytest.mark.parametrize("time_major", [False, True])
def test_bucket_kernel_with_sparse_and_dense_nulls_equals_the_group_by(time_major: bool) -> None:
    """The fast path's null handling: few nulls are subtracted/masked null by null (a
    counter's first delta, a gap, a channel appearing mid-interval), many take the dense
    masks; every aggregation (sum, count, mean, max, min) equals Polars' group_by."""
    from analytics import features as F

    plan = F._Plan(pl.col("dev"), {"c": (pl.col("c"), "sum"), "c_n": (pl.col("c"), "count"),
                                   "c_max": (pl.col("c"), "max"), "g": (pl.col("g"), "mean"),
                                   "g_max": (pl.col("g"), "max"), "g_min": (pl.col("g"), "min"),
                                   "g_n": (pl.col("g"), "count")}, {})
    k, n_t = 4, 400  # 40 s of 4 series
    first = np.zeros((k, n_t), dtype=bool)
    first[:, 0] = True  # each counter's first delta
    first[1, 123] = True  # a counter gap
    late = np.zeros((k, n_t), dtype=bool)
    late[2, :55] = True  # a gauge channel appearing mid-interval (5.5 s in: a partial bucket)
    late[0, 17] = True
    many = np.zeros((k, n_t), dtype=bool)
    many[:, ::2] = True  # half the rows: the dense path
    cases = {"sparse": {"c": first, "g": late}, "dense": {"c": many, "g": many}, "none": {}}
    spec = WindowSpec()
    for what, nulls in cases.items():
        df = _grid_frame(n_t, [f"d{i}" for i in range(k)], time_major, nulls)
        rows = F.bucket_rows(df.lazy(), plan, spec).collect()
        ref = F._group_by_buckets(rows.lazy(), plan).collect()
        fast = F._regular_buckets(rows, plan)
        assert fast is not None, what
        _assert_same_buckets(fast, ref, plan)
        if what == "sparse":  # exact for the integer counter, null where a bucket had no gauge reading
            keys = ["_dev", "_b"]
            f, r = fast.sort(keys), F._with_device(ref, plan).sort(keys)
            assert f["c"].equals(r["c"]) and f["c_max"].equals(r["c_max"])
            assert f.filter(pl.col("_dev") == "d2")["g"].null_count() == 5


def test_bucket_kernel_single_sample_and_values_buffer_of_a_slice() -> None:
    from analytics import features as F

    plan = F._Plan(pl.col("dev"), {"c": (pl.col("c"), "sum"), "g": (pl.col("g"), "mean")}, {})
    df = _grid_frame(1, ["d0", "d1"], True, {"c": np.array([[True], [False]])})
    rows = F.bucket_rows(df.lazy(), plan, WindowSpec()).collect()
    ref = F._group_by_buckets(rows.lazy(), plan).collect()
    fast = F._regular_buckets(rows, plan)
    assert fast is not None and fast.height == 2
    _assert_same_buckets(fast, ref, plan)
    assert fast.sort("_dev")["c"].to_list() == [0, df["c"][1]]  # polars: the sum of no values is 0
    # the zero-copy buffer keeps a slice's offset; the rows under nulls hold whatever was there
    s = pl.Series("x", np.arange(10, dtype=np.int64)).scatter([2, 7], None).slice(3, 6)
    buf = F._values_buffer(s)
    assert buf.tolist()[:4] == [3, 4, 5, 6] and buf[-1] == 8 and len(buf) == 6


def test_plans_are_cached_per_schema() -> None:
    from analytics import features as F

    a = F._plan_of("disk", (("time", pl.Datetime("us", "UTC")), ("host", pl.String()), ("device", pl.String()),
                            ("reads", pl.Int64()), ("writes", pl.Int64())))
    b = F._plan_of("disk", (("time", pl.Datetime("us", "UTC")), ("host", pl.String()), ("device", pl.String()),
                            ("reads", pl.Int64()), ("writes", pl.Int64())))
    c = F._plan_of("disk", (("time", pl.Datetime("us", "UTC")), ("host", pl.String()), ("device", pl.String()),
                            ("reads", pl.Int64())))
    assert a is b and a is not c
    assert "disk.write_iops" in a.features and "disk.write_iops" not in c.features


# ------------------------------------------- numpy windows vs Polars' rolling (speed)
_AGGS = {"i_sum": ("sum", pl.Int64), "u_cnt": ("count", pl.UInt32), "f_sum": ("sum", pl.Float64),
         "f_mean": ("mean", pl.Float64), "i_mean": ("mean", pl.Int64), "i_max": ("max", pl.Int64),
         "f_min": ("min", pl.Float64), "f_max": ("max", pl.Float64), "nan_sum": ("sum", pl.Float64),
         "nan_max": ("max", pl.Float64), "nan_mean": ("mean", pl.Float64)}


def _window_plan() -> object:
    """A plan whose features read every bucket column as it is (one per aggregation)."""
    from analytics import features as F

    return F._Plan(pl.col(F._DEV), {n: (pl.col(n), a) for n, (a, _) in _AGGS.items()},  # type: ignore[misc]
                   {f"t.{n}": pl.col(n) for n in _AGGS})


def _sparse_buckets(seed: int) -> pl.DataFrame:
    """Bucket rows of three hosts of different extents (a: 24 buckets, b: 9 starting 5 s
    later, c: 2 - less than a window), devices x/y (z on host a only), ~15 % of the rows
    omitted, nulls in every column, one all-null stretch of 5 buckets (x on a), NaN in
    the nan_* columns, rows shuffled as a ``group_by`` leaves them."""
    from analytics import features as F

    rng = np.random.default_rng(seed)
    t0 = int(T0.timestamp() * 1e6)
    rows = []
    for host, start, n, devs in (("a", 0, 24, "xyz"), ("b", 5, 9, "xy"), ("c", 3, 2, "xy")):
        for d in devs:
            for k in range(n):
                if rng.random() < 0.15 and not (host == "c"):
                    continue
                rows.append((host, d, t0 + (start + k) * 1_000_000, k))
    n = len(rows)
    cols: dict[str, object] = {"host": [r[0] for r in rows], F._DEV: [r[1] for r in rows], F._B: [r[2] for r in rows]}
    for name, (_, dt) in _AGGS.items():
        if dt == pl.Float64:
            v = rng.normal(0, 1e3, n) * rng.choice([1e-6, 1.0, 1e6], n)
        else:
            v = rng.integers(0, 2**40, n) if dt == pl.Int64 else rng.integers(0, 1000, n)
        s = pl.Series(name, v).cast(dt)
        null = rng.random(n) < 0.2
        null |= np.array([r[0] == "a" and r[1] == "x" and 6 <= r[3] <= 10 for r in rows])  # an all-null window
        if name.startswith("nan"):
            s = pl.select(pl.when(pl.Series(rng.random(n) < 0.1)).then(float("nan")).otherwise(s)).to_series()
        cols[name] = pl.select(pl.when(pl.Series(null)).then(None).otherwise(s).alias(name)).to_series()
    return pl.DataFrame(cols).sample(fraction=1.0, shuffle=True, seed=seed)


def _plain_window(values: list, agg: str) -> object:
    """One window's aggregation in plain Python: the non-null values left to right (a
    one-bucket window is its bucket, as Polars' plan leaves it: no rolling)."""
    if len(values) == 1:
        return values[0]
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if agg in ("max", "min"):
        if any(v != v for v in vals):  # NaN propagates
            return float("nan")
        return max(vals) if agg == "max" else min(vals)
    total = 0.0 if agg == "mean" or isinstance(vals[0], float) else 0
    for v in vals:
        total += v
    return total / len(vals) if agg == "mean" else total


def _assert_rolled_like_polars(bk: pl.DataFrame, plan: object, spec: WindowSpec) -> pl.DataFrame:
    """The numpy window aggregations of ``bk`` against Polars' rolling over its dense
    (device x grid) columns at the kept rows: dtypes, nulls and NaN exactly; integer
    sums, counts, max and min bit for bit; float sums and means to rounding. Polars'
    rolling sum is a running Kahan sum with subtractions whose error carries over from
    earlier (larger) values of the column, so the numpy sums are also held, bit for
    bit, to a plain left-to-right sum of each window's values."""
    from polars.testing import assert_series_equal

    from analytics import features as F

    grid = F._grid([bk], spec)
    devs, src = F._dense_index(bk, grid)
    got = F._rolled_frame([(bk, plan, src)], devs.len(), grid)  # type: ignore[list-item]
    assert got is not None
    keep = np.tile(grid.keep, devs.len())
    dense = F._dense(bk, plan, grid)[1].collect()  # type: ignore[arg-type]
    ref = dense.select(F._rolled(plan, grid.m)).filter(pl.Series(keep))  # type: ignore[arg-type]
    assert got.columns == [*ref.columns, F._DUR]
    rows = np.flatnonzero(keep)
    for name in ref.columns:
        agg = plan.buckets[name][1]  # type: ignore[attr-defined]
        g, r = got[name], ref[name]
        assert g.dtype == r.dtype, name
        assert g.is_null().equals(r.is_null()), name
        if g.dtype == pl.Float64:
            assert g.is_nan().equals(r.is_nan()), name
        col = dense[name].to_list()
        plain = pl.Series(name, [_plain_window(col[i - grid.m + 1:i + 1], agg) for i in rows], dtype=g.dtype)
        assert_series_equal(g, plain, check_exact=True)
        if agg in ("max", "min", "count") or not g.dtype.is_float():
            assert_series_equal(g, r, check_exact=True)  # bit for bit (NaN too)
        else:
            big = float(dense[name].abs().fill_nan(0.0).max())  # type: ignore[arg-type]
            assert ((g - r).abs().fill_nan(None) <= 1e-12 * big).fill_null(True).all(), name  # (both null or NaN)
    return ref


@pytest.mark.parametrize("length, stride", [(3, 1), (4, 2), (1, 1), (5, 5)])
def test_numpy_window_aggregations_equal_polars_rolling(length: int, stride: int) -> None:
    from analytics import features as F

    plan = _window_plan()
    spec = WindowSpec(length_s=length, stride_s=stride, bucket_s=1)
    for seed in (1, 2):
        bk = _sparse_buckets(seed)
        ref = _assert_rolled_like_polars(bk, plan, spec)
        # every device has every host's windows (z has no rows on b and c: null there)
        assert ref.height == int(F._grid([bk], spec).keep.sum()) * 3
        assert ref["f_mean"].null_count() > 0 and ref["f_mean"].drop_nulls().len() > 10  # windows of all nulls, and not
        assert ref["nan_max"].is_nan().any() and ref["nan_sum"].is_nan().any()
    # the same buckets with nothing missing, as device blocks over the whole grid (the
    # fast reduction's layout): a block order to gather, then the rows as they are
    one = _sparse_buckets(3).filter(pl.col("host") == "a")
    grid = F._grid([one], spec)
    full = grid.frame.join(pl.DataFrame({F._DEV: ["z", "x", "y"]}), how="cross").join(
        one.drop("host"), on=[F._DEV, F._B], how="left").select(one.columns)
    full = full.sort(pl.col(F._DEV).replace({"z": "0"}), F._B)  # blocks, not sorted by name
    assert F._dense_index(full, grid)[1] is not None
    _assert_rolled_like_polars(full, plan, spec)
    in_order = full.sort(F._DEV, F._B)
    assert F._dense_index(in_order, grid)[1] is None  # the rows as they are
    _assert_rolled_like_polars(in_order, plan, spec)


def test_numpy_windows_equal_polars_rolling_on_the_join() -> None:
    from polars.testing import assert_frame_equal

    from analytics import features as F

    tables, spec, buckets = _two_host_buckets()
    for name, bk in buckets.items():
        plan = tables[name][1]
        bk = bk.filter(pl.int_range(pl.len()) % 7 != 3)  # gaps
        grid = F._grid([b.filter(pl.int_range(pl.len()) % 7 != 3) for b in buckets.values()], spec)
        for rows in (bk, bk.sample(fraction=1.0, shuffle=True, seed=4), bk.reverse()):
            devs, got = F._table_windows(rows, plan, grid)
            devs_ref, ref = F._table_windows_polars(rows, plan, grid)
            assert devs == devs_ref, name
            assert got.select(pl.all().is_null()).equals(ref.select(pl.all().is_null())), name
            assert_frame_equal(got, ref, check_exact=False, rel_tol=1e-12, abs_tol=1e-15)


def test_device_positions_of_every_layout_equal_the_sorted_one() -> None:
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=40)  # (enough rows for more than _FEW_RUNS runs when shuffled)
    facts = frames.pop("host_facts")
    tables = F._tables({k: v.lazy() for k, v in frames.items()}, facts)
    spec = WindowSpec()
    bks = {n: F._reduce_buckets(F.bucket_rows(lf, plan, spec).collect(), plan) for n, (lf, plan) in tables.items()}
    # long device names (over 12 bytes: string views of a buffer and an offset), built
    # row by row: equal names under different views, more of them than _FEW_VIEWS
    cg = bks["cgroup"]
    long = [f"{d}-with-a-long-suffix" for d in cg[F._DEV].to_list()]
    bks["cgroup_long"] = cg.with_columns(pl.Series(F._DEV, long, dtype=pl.String))
    grid = F._grid(list(bks.values()), spec)
    for name, bk in bks.items():
        plan = tables[name.removesuffix("_long")][1]
        ref_devs, ref = F._dense(bk.sort(F._DEV, F._B), plan, grid)
        layouts = {"as reduced": bk, "shuffled": bk.sample(fraction=1.0, shuffle=True, seed=5),
                   "blocks, last device first": bk.sort(F._DEV, F._B, descending=[True, False])}
        for what, rows in layouts.items():
            devs, dense = F._dense(rows, plan, grid)
            assert devs.equals(ref_devs), (name, what)
            assert dense.collect().equals(ref.collect(), null_equal=True), (name, what)
    views = F._string_views(bks["cgroup_long"][F._DEV].sample(fraction=1.0, shuffle=True, seed=5))
    assert views is not None and np.unique(views, axis=0).shape[0] > F._FEW_VIEWS  # (the per-run search)
    assert F._device_codes(bks["cgroup_long"][F._DEV].sample(fraction=1.0, shuffle=True, seed=5)) is None


def test_numpy_windows_decline_other_dtypes_and_long_windows() -> None:
    from analytics import features as F

    bk = _sparse_buckets(7).select("host", F._DEV, F._B, pl.col("f_sum").cast(pl.Float32), "i_sum")
    plan = F._Plan(pl.col(F._DEV), {"f_sum": (pl.col("f_sum"), "sum"), "i_sum": (pl.col("i_sum"), "sum")},
                   {"t.f": pl.col("f_sum"), "t.i": pl.col("i_sum") / pl.col(F._DUR)})
    for spec in (WindowSpec(length_s=3, stride_s=1), WindowSpec(length_s=F._NP_MAX_M + 1, stride_s=1)):
        grid = F._grid([bk], spec)
        devs, src = F._dense_index(bk, grid)
        if spec.length_s == 3:  # a Float32 sum: Polars' rolling (whose sums it does in Float32)
            assert F._rolled_frame([(bk, plan, src)], devs.len(), grid) is None
        got = F._table_windows(bk, plan, grid)
        dev_s, dense = F._dense(bk, plan, grid)
        assert got[1].equals(F._windows_of(dense, dev_s, plan, grid)[1], null_equal=True)
    only_ints = bk.drop("f_sum")
    plan_i = F._Plan(pl.col(F._DEV), {"i_sum": (pl.col("i_sum"), "sum")}, {"t.i": pl.col("i_sum") / pl.col(F._DUR)})
    grid = F._grid([only_ints], WindowSpec(length_s=F._NP_MAX_M + 1, stride_s=1))
    devs, src = F._dense_index(only_ints, grid)
    assert F._rolled_frame([(only_ints, plan_i, src)], devs.len(), grid) is None


def test_numpy_window_sum_of_negative_zeros_is_positive_zero_as_in_polars() -> None:
    from analytics import features as F

    t0 = int(T0.timestamp() * 1e6)
    bk = pl.DataFrame({"host": ["a"] * 4, F._DEV: ["x"] * 4, F._B: [t0 + k * 1_000_000 for k in range(4)],
                       "s": [-0.0] * 4, "m": [-0.0, None, -0.0, -0.0]})
    plan = F._Plan(pl.col(F._DEV), {"s": (pl.col("s"), "sum"), "m": (pl.col("m"), "mean")},
                   {"t.s": pl.col("s"), "t.m": pl.col("m")})
    grid = F._grid([bk], WindowSpec(length_s=3, stride_s=1))
    got = F._rolled_frame([(bk, plan, None)], 1, grid)
    ref = bk.select(F._rolled(plan, 3)).filter(pl.Series(grid.keep))
    assert got is not None and got.height == ref.height == 2
    for name in ("s", "m"):
        assert np.signbit(got[name].to_numpy()).tolist() == np.signbit(ref[name].to_numpy()).tolist() == [False] * 2


# ------------------------- the bucket reduction's fixed costs (small tables, string checks)
def _reference_buckets(rows: pl.DataFrame, plan: object) -> pl.DataFrame:
    """The reference of a reduction, independent of the code under test: the group_by,
    each row named by the device expression, then every (host, device, bucket) merged
    (a merge of single rows changes nothing)."""
    from analytics import features as F

    bk = F._group_by_buckets(rows.lazy(), plan).collect()  # type: ignore[arg-type]
    tags = [t for t in F._tags(plan) if t != F._DEV]  # type: ignore[arg-type]
    named = bk.with_columns(F._device_expr(plan).alias(F._DEV)).drop(tags)  # type: ignore[arg-type]
    agg = {"sum": pl.Expr.sum, "count": pl.Expr.sum, "mean": pl.Expr.mean, "max": pl.Expr.max, "min": pl.Expr.min}
    return named.group_by("host", F._DEV, F._B).agg(
        [agg[a](pl.col(n)) for n, (_, a) in plan.buckets.items()])  # type: ignore[attr-defined]


def _assert_bits_equal(got: pl.DataFrame, ref: pl.DataFrame, what: str) -> None:
    """Equal frames (row order aside), floats bit for bit (NaN, signs of zeros)."""
    from analytics import features as F

    keys = ["host", F._DEV, F._B]
    got, ref = got.select(ref.columns).sort(keys), ref.sort(keys)
    assert got.schema == ref.schema, what
    assert got.equals(ref, null_equal=True), what
    for c in ref.columns:
        if ref[c].dtype == pl.Float64:
            a, b = got[c].fill_null(0.0).to_numpy(), ref[c].fill_null(0.0).to_numpy()
            assert np.array_equal(a.view(np.uint64), b.view(np.uint64)), f"{what}: {c}"


def _views_of_kind(kind: str, values: Sequence[object]) -> pl.Series:
    """A string column of ``values`` whose Arrow views are of one kind: inline (short
    strings), long strings each stored once per row, or long strings sharing one copy
    per distinct value (as Parquet's dictionary pages decode)."""
    if kind == "shared":
        distinct = list(dict.fromkeys(values))
        at = {v: i for i, v in enumerate(distinct)}
        return pl.Series("s", distinct, dtype=pl.String).gather([at[v] for v in values])
    return pl.Series("s", values, dtype=pl.String)


def _rows_equal_reference(values: Sequence[object], shift: int, period: int) -> bool:
    return all(values[i] == values[i + shift] for i in range(len(values) - shift)
               if not (period and (i + 1) % period == 0))


@pytest.mark.parametrize("kind", ["short", "per_row", "shared", "nulls", "categorical"])
def test_rows_equal_by_string_views_equals_the_string_comparison(kind: str) -> None:
    """The grid's host and tag checks (:func:`_rows_equal`) on every kind of column:
    equal views, views differing in length or first bytes, undecided ones (long strings,
    a same-length same-prefix change) compared by Polars, few or many; both layouts;
    the probe of long columns (> 4096 rows) and short ones."""
    from analytics import features as F

    rng = np.random.default_rng(7)
    for n_t, k in [(4, 3), (700, 7)]:  # 12 and 4 900 rows
        long_tag = kind in ("per_row", "shared")
        names = [(f"mlx5_{i}-comp{i % 4}@pci:0000:{i:02x}:00.0" if long_tag else f"d{i % 10}x") for i in range(k)]
        for time_major in (False, True):
            shift, period = (k, 0) if time_major else (1, n_t)
            series = np.tile(np.arange(k), n_t) if time_major else np.repeat(np.arange(k), n_t)
            base: list[object] = [names[j] for j in series]
            variants: dict[str, list[object]] = {"regular": base}
            i = int(rng.integers(shift + 1, len(base) - shift))
            v = list(base)
            v[i] = str(v[i])[:-1] + "#"  # same length and first bytes, another value
            variants["one row changed at the end"] = v
            v = list(base)
            v[i] = "z" + str(v[i])[1:]
            variants["one row changed at the start"] = v
            if kind == "nulls":
                variants["null series"] = [None if j == 1 else x for j, x in zip(series, base, strict=True)]
                v = list(variants["null series"])
                v[i] = None if v[i] is not None else "x"
                variants["a null in a series"] = v
            for what, values in variants.items():
                if kind == "categorical":
                    s = pl.Series("s", values, dtype=pl.Categorical)
                else:
                    s = _views_of_kind(kind, values) if None not in values else pl.Series("s", values, dtype=pl.String)
                expect = _rows_equal_reference(values, shift, period)
                assert F._rows_equal(s, shift, period) == expect, (kind, n_t, time_major, what)
    # long strings: shared views but for a few rows stored apart (undecided pairs, few)
    vals = [f"mlx5_{i % 3}-comp0@pci:0000:17:00.0" for i in range(6000)]
    s = pl.concat([_views_of_kind("shared", vals[:3000]), _views_of_kind("shared", vals[3000:])], rechunk=True)
    assert F._rows_equal(s, 3)
    assert not F._rows_equal(s.scatter(4000, vals[4000][:-1] + "#"), 3)
    # ... and stored once per row (different views everywhere: Polars after the probe)
    s = pl.Series("s", vals)
    assert F._rows_equal(s, 3) and not F._rows_equal(s.scatter(5000, vals[5000][:-1] + "#"), 3)
    # the host check: every row equal
    assert F._rows_equal(pl.Series("h", ["host-with-a-long-name"] * 5000), 1)
    assert not F._rows_equal(pl.Series("h", ["host-a"] * 4999 + ["host-b"]), 1)


def test_small_tables_take_the_fast_path_only_where_it_equals_the_group_by_bit_for_bit() -> None:
    """Below ``_REGULAR_MIN_ROWS`` the fast path must give the group_by's values bit for
    bit: it declines float sums of more than two values per cell (the fast tier's
    gauges at 100 ms in 1-s buckets); the medium tier's tables (one sample per bucket,
    their columns passed through) and integer sums take it, in both layouts."""
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=50)  # cpu: 16 000 rows, below the minimum
    facts = frames.pop("host_facts")
    # a counter's first delta null; a gauge NaN once; a table with a null gauge row
    frames["vmstat"] = frames["vmstat"].with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None)
                                                     .otherwise(pl.col("pgfault")).alias("pgfault"))
    frames["memory"] = frames["memory"].with_columns(pl.when(pl.int_range(pl.len()) == 5).then(None)
                                                     .otherwise(pl.col("dirty")).alias("dirty"))
    declined = {"cpu", "gpu", "system"}  # float means over 10 samples (and 16 series: cpu)
    for layout in ("series_major", "time_major"):
        fr = frames if layout == "series_major" else {k: v.sort("time", maintain_order=True) for k, v in frames.items()}
        for name, (rows, plan) in _bucket_inputs(fr, facts).items():
            assert rows.height < F._REGULAR_MIN_ROWS, name
            fast = F._regular_buckets(rows, plan, exact=True)  # type: ignore[arg-type]
            assert (fast is None) == (name in declined), (layout, name)
            assert F._regular_buckets(rows, plan) is not None, (layout, name)  # type: ignore[arg-type]
            _assert_bits_equal(F._reduce_buckets(rows, plan), _reference_buckets(rows, plan),  # type: ignore[arg-type]
                               f"{layout} {name}")


@pytest.mark.parametrize("time_major", [False, True])
def test_one_sample_buckets_pass_their_columns_through_and_decline_nan_under_max(time_major: bool) -> None:
    """Buckets of one sample each (the medium tier): every aggregation - the columns
    passed through, the counts, an integer mean, nulls few and many - equals the
    group_by bit for bit; a NaN under a max declines the fast path."""
    from analytics import features as F

    plan = F._Plan(pl.col("dev"), {"c": (pl.col("c"), "sum"), "c_n": (pl.col("c"), "count"),
                                   "c_mean": (pl.col("c"), "mean"), "c_max": (pl.col("c"), "max"),
                                   "g": (pl.col("g"), "mean"), "g_max": (pl.col("g"), "max"),
                                   "g_min": (pl.col("g"), "min"), "g_sum": (pl.col("g"), "sum")}, {})
    k, n_t = 3, 200
    spec = WindowSpec(length_s=0.3, stride_s=0.1)  # 100-ms buckets: one sample each
    few = np.zeros((k, n_t), dtype=bool)
    few[:, 0] = True
    many = np.zeros((k, n_t), dtype=bool)
    many[:, ::2] = True
    for what, nulls in {"none": {}, "few": {"c": few, "g": few}, "many": {"c": many, "g": many}}.items():
        df = _grid_frame(n_t, [f"d{i}" for i in range(k)], time_major, nulls)
        rows = F.bucket_rows(df.lazy(), plan, spec).collect()
        fast = F._regular_buckets(rows, plan, exact=True)
        assert fast is not None, what
        _assert_bits_equal(fast, _reference_buckets(rows, plan), what)
    nan = _grid_frame(n_t, [f"d{i}" for i in range(k)], time_major, {})
    nan = nan.with_columns(g=pl.when(pl.int_range(pl.len()) == 17).then(float("nan")).otherwise(pl.col("g")))
    rows = F.bucket_rows(nan.lazy(), plan, spec).collect()
    assert F._regular_buckets(rows, plan) is None
    _assert_bits_equal(F._reduce_buckets(rows, plan), _reference_buckets(rows, plan), "NaN")


def test_group_rows_add_each_groups_series_in_order() -> None:
    """The group step of the fast path (series -> groups, whole rows of buckets) equals
    numpy's reduceat for integers, max and min, with groups of unequal sizes."""
    from analytics import features as F

    rng = np.random.default_rng(3)
    sizes = [3, 1, 5, 2, 5]
    g_at = np.r_[0, np.cumsum(sizes)[:-1]]
    rs = rng.integers(-1000, 1000, (sum(sizes), 50))
    steps = F._group_steps(g_at, rs.shape[0])
    for op in (np.add, np.maximum, np.minimum):
        assert np.array_equal(F._group_rows(rs, g_at, steps, op), op.reduceat(rs, g_at, axis=0)), op
    # floats, at most two series per group: bit for bit as well
    g2 = np.array([0, 2, 3])
    rf = rng.normal(size=(5, 40)) * 1e6
    got = F._group_rows(rf, g2, F._group_steps(g2, 5), np.add)
    assert np.array_equal(got, np.stack([rf[0] + rf[1], rf[2], rf[3] + rf[4]]))


def test_device_names_of_the_group_by_path_and_their_merges_equal_the_reference() -> None:
    """:func:`_with_device` on group_by buckets: one host and one tag by the distinct
    tag values (merged where two name one device), else by the query on every row."""
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=20)
    facts = frames.pop("host_facts")
    cpu = frames["cpu"].sample(fraction=1.0, shuffle=True, seed=5)
    numa = frames["numa"]
    cases = {
        "one host": cpu,
        "'node0' and '0' name one device": cpu.with_columns(
            node=pl.when(pl.col("cpu").cast(pl.Int64) < 8).then(pl.lit("node0")).otherwise(pl.col("node"))),
        "two hosts": pl.concat([cpu, cpu.with_columns(host=pl.lit("host-b"))]),
        "a null tag": cpu.with_columns(node=pl.when(pl.col("cpu") == "3").then(None).otherwise(pl.col("node"))),
        "many tag values": numa.with_columns(node=(pl.int_range(pl.len()) % 40).cast(pl.String)),
    }
    for what, df in cases.items():
        name = "numa" if what == "many tag values" else "cpu"
        rows, plan = _bucket_inputs({name: df}, facts)[name]
        bk = F._group_by_buckets(rows.lazy(), plan).collect()  # type: ignore[arg-type]
        _assert_bits_equal(F._with_device(bk, plan), _reference_buckets(rows, plan), what)  # type: ignore[arg-type]
        if what == "'node0' and '0' name one device":
            assert sorted(F._with_device(bk, plan)[F._DEV].unique().to_list()) == ["node0", "node1"]  # type: ignore[arg-type]


def test_device_names_are_kept_per_plan() -> None:
    from analytics import features as F

    ts = ("time", pl.Datetime("us", "UTC"))
    numa = F._plan_of("numa", (ts, ("host", pl.String()), ("node", pl.String()), ("numa_hit", pl.Int64())))
    perf = F._plan_of("perf", (ts, ("host", pl.String()), ("socket", pl.String()), ("cycles", pl.Int64())))
    sch = pl.Schema({"node": pl.String(), "socket": pl.String()})
    assert F._group_devices(numa, ["node"], [("0",), ("node1",)], sch) == ["node0", "node1"]
    assert F._group_devices(perf, ["socket"], [("0",)], sch) == ["socket0"]  # same value, another plan
    assert F._group_devices(numa, ["node"], [("1",), ("0",), ("2",)], sch) == ["node1", "node0", "node2"]
    # equal values of other dtypes (1 == 1.0 in Python) are named by their own query
    gen = F._Plan(pl.col("node").cast(pl.String) + "!", {}, {})
    assert F._group_devices(gen, ["node"], [(1,)], pl.Schema({"node": pl.Int64()})) == ["1!"]
    assert F._group_devices(gen, ["node"], [(1.0,)], pl.Schema({"node": pl.Float64()})) == ["1.0!"]


def test_irq_grid_of_few_rows_and_an_action_renamed_mid_series() -> None:
    """Interrupts take the per-series path at any size; an IRQ action whose name
    changes within its series (a long string: per-row copies, compared by Polars)
    is no grid, and the features still come by the join."""
    from analytics import features as F

    synth = load_synth()
    frames = synth.synth_frames(seconds=6)
    facts = frames.pop("host_facts")
    irq = frames["interrupts"]
    plan = F._plan_interrupts(set(irq.columns))
    spec = WindowSpec()
    bk = F._irq_buckets(irq.lazy(), F._facts_nodes(facts), plan, spec)
    attached = F._attach_irq_devices(irq.lazy(), facts)
    assert bk is not None and attached is not None
    ref = F._reduce_buckets(F.bucket_rows(attached, plan, spec).collect(), plan)
    keys = ["host", "_dev", "_b"]
    assert bk.select(ref.columns).sort(keys).equals(ref.sort(keys))
    renamed = irq.with_columns(device=pl.when(pl.int_range(pl.len()) == 9).then(
        pl.col("device").str.slice(0, pl.col("device").str.len_chars() - 1) + "9").otherwise(pl.col("device")))
    assert F._irq_series(renamed.lazy(), F._facts_nodes(facts), spec) is None
    got = compute_features({"interrupts": renamed.lazy()}, host_facts=facts)
    assert got.width > 10 and got.height > 0


def test_buffers_of_a_slice_with_nulls() -> None:
    from analytics import features as F

    s = pl.Series("x", np.arange(40, dtype=np.float64)).scatter([3, 11, 30], None).slice(5, 30)
    v, valid = F._buffers(s)
    assert valid.tolist() == s.is_not_null().to_list()
    assert v[valid].tolist() == s.drop_nulls().to_list()
