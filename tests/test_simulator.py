"""The simulated fleet: determinism, counter semantics, footprints, facts, lake round trip,
scenario files and the CLI. Runs are a few simulated minutes on one host."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ingest import schema
from ingest.counters import CounterStats, counter_delta, deltas_array
from ingest.lake import LakeSink, scan
from ingest.simulator import (
    INEFFICIENCIES,
    HostPlan,
    Injection,
    Scenario,
    ScenarioError,
    from_dict,
    named,
    resolve_scenario,
    simulate,
    simulate_frames,
)
from ingest.simulator.injections import ALSO_MOVES, FOOTPRINTS, UNRELATED_POOL, Signal
from ingest.simulator.workloads import PHASES
from tests.sim_footprints import mean, placeholders, series, span

DUR = 240.0  # simulated seconds per footprint run
INJ_START, INJ_END = 60.0, 200.0
# training hosts show communication/storage paths best; serving hosts the rest
TRAINING_TYPES = {
    "gpu_nic_numa_misplacement", "irq_locality_miss", "thermal_throttle", "pcie_link_degraded",
    "memory_bandwidth_contention", "nic_drops", "storage_contention",
}


def _sc(workload: str = "llm_serving", injections: tuple[Injection, ...] = (), seed: int = 3,
        duration: float = DUR, **kw: object) -> Scenario:
    return Scenario(name="t", seed=seed, duration_s=duration, hosts=(HostPlan("h0", workload),),
                    injections=injections, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def healthy() -> dict[str, dict[str, pl.DataFrame]]:
    return {wl: simulate_frames(_sc(wl))[0] for wl in ("llm_serving", "training")}


# ---------------------------------------------------------------- counter rule


def test_deltas_array_agrees_with_counter_delta() -> None:
    rng = np.random.default_rng(0)
    m32, m64 = 1 << 32, 1 << 64
    cases = [
        [5, 9, 9, 20],  # plain
        [m32 - 10, 5, 30],  # 32-bit wrap
        [m64 - 100, 50, 80],  # 64-bit wrap
        [(1 << 40), 7, 12],  # reset (64-bit value to small)
        [3_000_000_000, 100],  # both < 2**32, modular delta >= 2**31: reset
        [2**31 + 5, 3],  # both < 2**32, modular delta < 2**31: read as a wrap
        list(np.cumsum(rng.integers(0, 1000, 50)).astype(int)),
    ]
    for case in cases:
        raw = np.array([case], dtype=np.uint64)
        st_a, st_b = CounterStats(), CounterStats()
        d, valid = deltas_array(raw, None, st_a)
        want = [None] + [counter_delta(int(p), int(n), st_b) for p, n in zip(case, case[1:], strict=False)]
        got = [None if not v else int(np.uint64(x)) for x, v in zip(d[0].view(np.uint64), valid[0], strict=True)]
        assert got == want, case
        assert (st_a.wraps, st_a.resets) == (st_b.wraps, st_b.resets), case
    # with a previous sample, along axis 0 (time-major)
    raw = np.array([[m32 - 1, 10], [3, 20]], dtype=np.uint64)
    d, valid = deltas_array(raw, np.array([m32 - 5, 1], dtype=np.uint64), axis=0)
    assert valid.all()
    assert d.tolist() == [[4, 9], [4, 10]]


# ----------------------------------------------------------------- determinism


def test_same_seed_same_frames_other_seed_differs() -> None:
    inj = (Injection("gpu_power_throttle", "h0", 20, 20, 0.5),)
    a, _ = simulate_frames(_sc(injections=inj, duration=60))
    b, _ = simulate_frames(_sc(injections=inj, duration=60))
    c, _ = simulate_frames(_sc(injections=inj, duration=60, seed=4))
    assert a.keys() == b.keys()
    for t in a:
        assert a[t].equals(b[t]), t
    assert not a["gpu"].equals(c["gpu"])


def test_frames_have_schema_columns_and_dtypes(healthy: dict[str, dict[str, pl.DataFrame]]) -> None:
    frames = healthy["training"]
    expected = {m.name for m in schema.MEASUREMENTS.values()} - {"perf", "labels"}
    assert set(frames) == expected
    for t, df in frames.items():
        assert dict(df.schema) == schema.get(t).polars_schema(), t
        assert df.height > 0
    # fast tier at 100 ms, medium at 1 s
    cpu_t = frames["cpu"].get_column("time").unique().sort()
    assert (cpu_t.diff().drop_nulls() == timedelta(milliseconds=100)).all()
    mem_t = frames["memory"].get_column("time")
    assert (mem_t.diff().drop_nulls() == timedelta(seconds=1)).all()
    assert frames["cpu"].get_column("cpu").n_unique() == 32
    assert frames["gpu"].get_column("gpu").n_unique() == 8


# ------------------------------------------------------------------- counters


def test_counters_monotone_except_injected_wraps() -> None:
    events = (
        Injection("counter_wrap", "h0", 30, 1, 1.0, (), {"table": "net", "field": "rx_bytes",
                                                         "series": "eno1", "bits": 32}),
        Injection("counter_wrap", "h0", 45, 1, 1.0, (), {"table": "gpu", "field": "energy", "series": "2"}),
        Injection("counter_reset", "h0", 50, 1, 1.0, (), {"table": "vmstat", "field": "pgfault", "series": ""}),
    )
    frames, runs = simulate_frames(_sc("training", events, duration=90), keep_raw=True)
    plain, _ = simulate_frames(_sc("training", (), duration=90))
    bank = runs[0].bank
    expected = {("net", "rx_bytes"): 30, ("gpu", "energy"): 450, ("vmstat", "pgfault"): 50}
    for (table, fld), chunks_raw in bank.raw.items():
        raw = np.concatenate(chunks_raw, axis=1).astype(np.uint64)
        dec = np.argwhere(raw[:, 1:] < raw[:, :-1])
        if (table, fld) in expected:
            assert [int(k) + 1 for _, k in dec] == [expected[(table, fld)]], (table, fld)
        else:
            assert dec.size == 0, (table, fld)
    # every delta is >= 0; only the first sample of each series is null
    for t, df in frames.items():
        m = schema.get(t)
        for c in m.counters:
            col = df.get_column(c)
            assert (col.drop_nulls() >= 0).all(), (t, c)
            first = df.get_column("time").min()
            assert df.filter(pl.col("time") > first).get_column(c).null_count() == 0, (t, c)
    # the rule recovers the true increments across the 32- and 64-bit wraps, and a reset
    # reads as "counted from zero since the previous sample": deltas are those of the plain run
    for t in ("net", "gpu", "vmstat"):
        assert frames[t].equals(plain[t]), t
    agent = frames["agent"]
    assert agent.get_column("counter_wraps").sum() == 2
    assert agent.get_column("counter_resets").sum() == 1


# ----------------------------------------------------------------- footprints


@pytest.mark.parametrize("typ", INEFFICIENCIES)
def test_injection_moves_its_footprint_and_nothing_unrelated(
    typ: str, healthy: dict[str, dict[str, pl.DataFrame]]
) -> None:
    check_footprint(typ, healthy, _sc)


def check_footprint(typ: str, healthy: dict[str, dict[str, pl.DataFrame]], make: Callable[..., Scenario],
                    benign: tuple[tuple[str, str], ...] = ()) -> None:
    """``typ`` at severity 0.8 moves every signal of its footprint against the same-seed
    healthy run and keeps the unrelated pool (less ``benign`` (table, field) pairs) within
    its healthy range. ``make(workload, injections)`` builds the one-host scenario."""
    wl = "training" if typ in TRAINING_TYPES else "llm_serving"
    sc = make(wl, (Injection(typ, "h0", INJ_START, INJ_END - INJ_START, 0.8),))
    frames, runs = simulate_frames(sc)
    base = healthy[wl]
    inj = runs[0].injections[0]
    subs = placeholders(inj, runs[0].spec)
    # from 30 s in (slow onsets have built up) to the end of the injection
    a = sc.start + timedelta(seconds=INJ_START + 30)
    b = sc.start + timedelta(seconds=INJ_END)
    for sig in FOOTPRINTS[typ]:
        x = mean(series(frames, sig, subs, "h0", a, b))
        y = mean(series(base, sig, subs, "h0", a, b))
        assert (x - y) * sig.direction > 1e-6 * max(abs(y), 1.0), (sig, x, y)
    # before the injection the run is the healthy run, exactly
    pre = sc.start + timedelta(seconds=INJ_START)
    for t in ("gpu", "net", "memory", "workload"):
        assert frames[t].filter(pl.col("time") < pre).equals(base[t].filter(pl.col("time") < pre)), t
    related = {(s.table, s.field.split("&")[0]) for s in FOOTPRINTS[typ] + ALSO_MOVES.get(typ, ())} | set(benign)
    for sig in UNRELATED_POOL:
        if (sig.table, sig.field.split("&")[0]) in related:
            continue
        xlo, xhi = span(series(frames, sig, subs, "h0", a, b))
        lo, hi = span(series(base, sig, subs, "h0"))
        tol = 0.05 * (hi - lo) + 1e-9
        assert lo - tol <= xlo and xhi <= hi + tol, (sig, xlo, xhi, lo, hi)


def test_power_throttle_hurts_prefill_before_decode(healthy: dict[str, dict[str, pl.DataFrame]]) -> None:
    sc = _sc("llm_serving", (Injection("gpu_power_throttle", "h0", INJ_START, INJ_END - INJ_START, 0.6),))
    frames, _ = simulate_frames(sc)
    a = sc.start + timedelta(seconds=INJ_START)
    b = sc.start + timedelta(seconds=INJ_END)
    w = frames["workload"].filter(pl.col("time").is_between(a, b, closed="left"))
    h = healthy["llm_serving"]["workload"].filter(pl.col("time").is_between(a, b, closed="left"))
    ratio = {}
    for ph in ("prefill", "decode"):
        sel = w.get_column("phase") == ph
        got = float(w.filter(sel).get_column("throughput").cast(pl.Float64).sum())
        ratio[ph] = got / float(h.filter(sel).get_column("throughput").cast(pl.Float64).sum())
    assert ratio["prefill"] < 0.93  # compute-bound: throughput follows the clock
    assert ratio["decode"] > 0.95  # memory-bound: little loss at the same limit
    assert ratio["prefill"] < ratio["decode"]


def test_thp_fragmentation_variant_keeps_facts_and_raises_fallbacks(
    healthy: dict[str, dict[str, pl.DataFrame]]
) -> None:
    inj = Injection("thp_coverage_loss", "h0", INJ_START, INJ_END - INJ_START, 0.8, (), {"cause": "fragmentation"})
    sc = _sc("llm_serving", (inj,))
    frames, _ = simulate_frames(sc)
    a, b = sc.start + timedelta(seconds=INJ_START + 30), sc.start + timedelta(seconds=INJ_END)
    for fld in ("thp_fault_fallback", "compact_stall", "thp_collapse_alloc_failed"):
        sig = [s for s in UNRELATED_POOL if s.field == "thp_fault_fallback"][0]
        sig = type(sig)("vmstat", fld)
        assert mean(series(frames, sig, {}, "h0", a, b)) > mean(series(healthy["llm_serving"], sig, {}, "h0", a, b))
    facts = frames["host_facts"].filter((pl.col("category") == "thp") & (pl.col("key") == "enabled"))
    assert set(facts.get_column("value")) == {"always"}


def test_thp_never_switches_the_fault_flow_at_once_and_the_coverage_slowly(
    healthy: dict[str, dict[str, pl.DataFrame]]
) -> None:
    """THP "never": from the first seconds every new fault is a 4 KiB one (thp_fault_alloc
    stops, pgfault jumps), while AnonHugePages (a stock) has barely moved yet."""
    inj = Injection("thp_coverage_loss", "h0", INJ_START, INJ_END - INJ_START, 0.5)
    sc = _sc("training", (inj,))
    frames, _ = simulate_frames(sc)
    a, b = sc.start + timedelta(seconds=INJ_START + 1), sc.start + timedelta(seconds=INJ_START + 10)
    base = healthy["training"]

    def ratio(sig: Signal) -> float:
        return mean(series(frames, sig, {}, "h0", a, b)) / mean(series(base, sig, {}, "h0", a, b))

    assert ratio(Signal("vmstat", "thp_fault_alloc")) < 0.1
    assert ratio(Signal("vmstat", "pgfault")) > 1.1
    assert ratio(Signal("memory", "anon_huge_pages")) > 0.95


def test_healthy_runs_are_not_flat() -> None:
    sc = Scenario(seed=5, duration_s=300.0, hosts=(
        HostPlan("srv", "llm_serving"), HostPlan("trn", "training", {"checkpoint_every_s": 60.0, "eval_every_s": 120.0})))
    frames, _ = simulate_frames(sc)
    wl = frames["workload"]
    assert set(wl.filter(pl.col("host") == "srv").get_column("phase")) >= {"model_load", "prefill", "decode"}
    assert set(wl.filter(pl.col("host") == "trn").get_column("phase")) >= {
        "model_load", "compute", "allreduce", "checkpoint", "eval"}
    assert set(wl.get_column("phase")) <= set(PHASES)
    power = frames["gpu"].filter(pl.col("host") == "srv").get_column("power_w")
    assert power.std() > 50  # type: ignore[operator]
    # checkpoints: benign write bursts and some io pressure on a healthy host
    disk = frames["disk"].filter(pl.col("host") == "trn").group_by("time").agg(pl.col("write_sectors").sum())
    w = disk.get_column("write_sectors").drop_nulls()
    assert w.max() > 20 * w.median()  # type: ignore[operator]
    # no labels on a healthy run
    assert "labels" not in frames


def test_chunks_join_seamlessly_across_hour_boundaries(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    sc = Scenario(seed=1, start=datetime(2026, 1, 5, 8, 59, 0, tzinfo=UTC), duration_s=120.0,
                  hosts=(HostPlan("h0", "training"),))
    frames, _ = simulate_frames(sc)
    edge = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
    for t, df in frames.items():
        for c in schema.get(t).counters:  # no null delta at the chunk boundary
            assert df.filter(pl.col("time") >= edge).get_column(c).null_count() == 0, (t, c)
    temp = frames["gpu"].filter(pl.col("gpu") == "0").sort("time")
    jump = temp.filter(pl.col("time").is_between(edge - timedelta(seconds=1), edge + timedelta(seconds=1)))
    assert jump.get_column("temperature_c").diff().abs().max() <= 2  # type: ignore[operator]
    sink = LakeSink(tmp_path)
    simulate(sc, [sink])
    sink.close()
    hours = sorted(p.name for p in (tmp_path / "cpu" / "host=h0" / "date=2026-01-05").iterdir())
    assert hours == ["hour=08", "hour=09"]


# -------------------------------------------------------------------- facts


def _fact(frames: dict[str, pl.DataFrame], cat: str, dev: str, key: str, at: float, sc: Scenario) -> str:
    f = frames["host_facts"].filter((pl.col("category") == cat) & (pl.col("device") == dev) & (pl.col("key") == key)
                                    & (pl.col("time") <= sc.start + timedelta(seconds=at)))
    return str(f.sort("time").get_column("value")[-1])


def test_injections_change_host_facts_while_active() -> None:
    injs = (
        Injection("gpu_power_throttle", "h0", 30, 60, 0.5, ("gpu3",)),
        Injection("thp_coverage_loss", "h0", 30, 60, 0.5),
        Injection("irq_locality_miss", "h0", 30, 60, 0.5, ("mlx5_0",)),
        Injection("pcie_link_degraded", "h0", 30, 60, 0.7, ("2",)),
        Injection("cpu_governor_powersave", "h0", 30, 60, 0.5),
    )
    sc = _sc("training", injs, duration=120)
    frames, runs = simulate_frames(sc, tables=["host_facts", "labels"])
    host = runs[0].spec
    irq = str(next(q.number for q in host.irqs if q.device == "mlx5_0"))
    gpu2_pci = host.gpus[2].pci
    checks = [
        (("gpu", "3", "power_limit_w"), "700", "500"),
        (("thp", "", "enabled"), "always", "never"),
        (("irq", irq, "affinity_nodes"), "0", "1"),
        (("pcie", gpu2_pci, "current_link_speed"), "32.0 GT/s PCIe", "8.0 GT/s PCIe"),
        (("power", "policy5", "scaling_governor"), "performance", "powersave"),
    ]
    for (cat, dev, key), before, during in checks:
        assert _fact(frames, cat, dev, key, 10, sc) == before, key
        assert _fact(frames, cat, dev, key, 40, sc) == during, key
        assert _fact(frames, cat, dev, key, 100, sc) == before, key
    assert _fact(frames, "gpu", "3", "numa_node", 0, sc) == "0"
    assert _fact(frames, "nic", "ens5np0", "numa_node", 0, sc) == "1"
    labels = frames["labels"]
    assert labels.height == 5
    row = labels.filter(pl.col("type") == "gpu_power_throttle").row(0, named=True)
    assert row["devices"] == "3" and row["severity"] == pytest.approx(0.5)
    assert row["end"] - row["time"] == timedelta(seconds=60)
    assert labels.get_column("label_id").n_unique() == 5


def test_irq_facts_and_interrupt_counts_agree_line_by_line() -> None:
    sc = _sc("training", (Injection("irq_locality_miss", "h0", 20, 30, 0.5, ("mlx5_0",)),), duration=60)
    frames, runs = simulate_frames(sc, tables=["interrupts", "host_facts"])
    host = runs[0].spec
    lines = {str(q.number): q.action for q in host.irqs if q.device == "mlx5_0"}
    facts = frames["host_facts"].filter((pl.col("category") == "irq") & (pl.col("key") == "affinity_nodes"))
    during = facts.filter(pl.col("time") == sc.start + timedelta(seconds=20))
    moved = set(during.filter(pl.col("device").is_in(list(lines)) & (pl.col("value") == "1"))
                .get_column("device"))
    assert len(moved) == 2  # half of the NIC's 4 lines at severity 0.5
    irq = frames["interrupts"]
    a, b = sc.start + timedelta(seconds=21), sc.start + timedelta(seconds=50)
    # (the first sample's rows carry null deltas for every series, even in a sparse table)
    far_rows = irq.filter((pl.col("node") == "1") & pl.col("irq").is_in(list(lines)) & pl.col("count").is_not_null())
    assert set(far_rows.filter(pl.col("time").is_between(a, b, closed="left")).get_column("irq")) == moved
    assert far_rows.filter(pl.col("time") < sc.start + timedelta(seconds=20)).height == 0
    assert far_rows.filter(pl.col("time") > sc.start + timedelta(seconds=51)).height == 0
    # the moved lines' interrupts are no longer counted on the NIC's own node
    home = irq.filter((pl.col("node") == "0") & pl.col("irq").is_in(list(moved))
                      & pl.col("time").is_between(a, b, closed="left"))
    assert home.height == 0


@pytest.mark.server
def test_simulator_writes_influxdb_like_the_lake(influxd_server: object, tmp_path: Path) -> None:
    from ingest.influx import InfluxConfig, InfluxSink, InfluxSource

    url = influxd_server.url  # type: ignore[attr-defined]
    sc = _sc("training", (Injection("nic_drops", "h0", 2, 5, 0.5),), duration=10)
    cfg = InfluxConfig(url=url, spool_dir=tmp_path / "spool")
    lake = LakeSink(tmp_path / "lake")
    with InfluxSink(cfg) as influx:
        simulate(sc, [lake, influx], tables=["gpu", "net", "labels"])
    lake.close()
    src = InfluxSource(cfg)
    end = sc.start + timedelta(seconds=sc.duration_s)
    for table in ("gpu", "net"):
        got = src.read(table, start=sc.start, end=end)
        want = scan(tmp_path / "lake", table).collect()
        # a line-protocol point needs a field: rows whose fields are all null (the first
        # sample of a counters-only series) exist in the lake only
        fields = [f.name for f in schema.get(table).fields]
        want = want.filter(pl.any_horizontal(pl.col(fields).is_not_null()))
        assert got.height == want.height, table
    assert src.read("labels", start=sc.start, end=end).height == 1


def test_perf_table_only_when_enabled_and_misplacement_loads_memory() -> None:
    inj = (Injection("gpu_nic_numa_misplacement", "h0", 30, 60, 0.8),)
    base, _ = simulate_frames(_sc("training", duration=90, perf=True), tables=["perf"])
    frames, _ = simulate_frames(_sc("training", inj, duration=90, perf=True), tables=["perf"])
    off, _ = simulate_frames(_sc("training", inj, duration=30), tables=["perf", "gpu"])
    assert "perf" not in off
    sel = pl.col("time") >= Scenario().start + timedelta(seconds=40)
    assert frames["perf"].filter(sel).get_column("mem_bandwidth").sum() > base["perf"].filter(sel).get_column(
        "mem_bandwidth").sum()


# ---------------------------------------------------------------- lake round trip


def test_lake_reader_reads_what_the_simulator_wrote(tmp_path: Path) -> None:
    sc = Scenario(name="rt", seed=2, duration_s=60.0, hosts=(HostPlan("a-0"), HostPlan("b-1", "training")),
                  injections=(Injection("nic_drops", "b-1", 10, 20, 0.5),))
    sink = LakeSink(tmp_path)
    res = simulate(sc, [sink])
    sink.close()
    frames, _ = simulate_frames(sc)
    for table, df in frames.items():
        got = scan(tmp_path, table).collect()
        assert dict(got.schema) == schema.get(table).polars_schema(), table
        assert got.height == df.height == res.rows[table], table
        keys = ["host", "time", *schema.get(table).tags]
        assert got.sort(keys).equals(df.sort(keys)), table
    assert set(scan(tmp_path, "labels").collect().get_column("type")) == {"nic_drops"}


# ------------------------------------------------------------------ scenarios


@pytest.mark.parametrize(("doc", "key"), [
    ({"seed": -1}, "seed"),
    ({"duration": "ten minutes"}, "duration"),
    ({"duration": "1.5s"}, "duration"),
    ({"start": "yesterday"}, "start"),
    ({"hosts": 0}, "hosts"),
    ({"hosts": [{"name": "a", "workload": "mining"}]}, "hosts[0].workload"),
    ({"hosts": [{"name": "a"}, {"name": "a"}]}, "hosts"),
    ({"hosts": [{"name": "a", "params": {"stepz": 1}}]}, "hosts[0].params"),
    ({"colour": "red"}, "colour"),
    ({"injections": [{"type": "gpu_melting", "start": "1m", "duration": "1m"}]}, "injections[0].type"),
    ({"injections": [{"type": "nic_drops", "duration": "1m"}]}, "injections[0].start"),
    ({"duration": "1h", "injections": [{"type": "nic_drops", "start": "2h", "duration": "1m"}]},
     "injections[0].start"),
    ({"injections": [{"type": "nic_drops", "start": "1m", "duration": "1m", "severity": 2}]},
     "injections[0].severity"),
    ({"injections": [{"type": "nic_drops", "start": "1m", "duration": "1m", "host": "nope"}]},
     "injections[0].host"),
    ({"injections": [{"type": "nic_drops", "start": "1m", "duration": "1m", "colour": 1}]}, "injections[0]"),
    ({"injections": [{"type": "counter_wrap", "start": "1m", "duration": "1s",
                      "params": {"table": "net", "field": "rx_nope"}}]}, "injections[0].params.field"),
])
def test_scenario_errors_name_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        from_dict(doc, source="bad.toml")
    assert f"bad.toml: {key}" in str(exc.value)


def test_injection_with_unknown_device_names_it() -> None:
    sc = _sc(injections=(Injection("thermal_throttle", "h0", 1, 1, 0.5, ("gpu9",)),), duration=5)
    with pytest.raises(ValueError, match="gpu9"):
        simulate_frames(sc)


def test_shipped_scenarios_load_and_cover_every_type(tmp_path: Path) -> None:
    names = named()
    assert {"healthy", "mixed_day"} <= set(names)
    assert set(INEFFICIENCIES) <= set(names)
    for n in names:
        sc = resolve_scenario(n)
        assert sc.name == n
        if n in INEFFICIENCIES:
            assert {i.type for i in sc.injections} == {n}
    mixed = resolve_scenario("mixed_day")
    assert set(INEFFICIENCIES) <= {i.type for i in mixed.injections}
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = [\n")
    with pytest.raises(ScenarioError, match="bad.toml"):
        resolve_scenario(str(bad))


# ------------------------------------------------------------------------ CLI


def test_cli_simulate_writes_the_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    lake = tmp_path / "lake"
    rc = main(["simulate", "--lake", str(lake), "--hosts", "2", "--duration", "20s", "--seed", "7",
               "--start", "2026-02-01T10:00:00Z"])
    assert rc == 0
    assert "simulated 2 host(s)" in capsys.readouterr().out
    cpu = scan(lake, "cpu").collect()
    assert set(cpu.get_column("host")) == {"sim-00", "sim-01"}
    assert str(cpu.get_column("time").min()).startswith("2026-02-01 10:00:00")
    rc = main(["simulate", "--lake", str(lake), "--scenario", "thermal_throttle", "--duration", "20m",
               "--hosts", "3"])
    assert rc == 2
    assert "--hosts" in capsys.readouterr().err


def test_cli_simulate_says_which_injections_a_short_duration_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.cli import main

    lake = tmp_path / "lake"
    assert main(["simulate", "--lake", str(lake), "--scenario", "gpu_power_throttle", "--duration", "2m"]) == 0
    out, err = capsys.readouterr()
    assert "0 label(s)" in out
    assert "1 injection(s) of scenario 'gpu_power_throttle' left out" in err and "gpu_power_throttle on sim-00" in err
    assert main(["simulate", "--lake", str(tmp_path / "full"), "--scenario", "gpu_power_throttle",
                 "--duration", "20m"]) == 0
    assert "left out" not in capsys.readouterr().err
