"""The identification matrix's scoring (benchmarks/id_matrix.py) on hand-built incidents and
labels: every figure the benchmark prints is a pure function of these frames."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from benchmarks.id_matrix import (
    TAIL_CYCLES,
    Cell,
    check_targets,
    cost_band,
    cycle_times,
    false_incidents,
    final_incidents,
    group,
    healthy_hours,
    long_cells,
    quick_cells,
    run_cell,
    score_labels,
)
from ingest.simulator import from_dict
from jobs.config import SweepConfig

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
TS = pl.Datetime("us", "UTC")


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def labels(*rows: tuple[str, float, float, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"host": [r[0] for r in rows], "time": [m(r[1]) for r in rows], "end": [m(r[2]) for r in rows],
         "type": [r[3] for r in rows], "severity": [0.5] * len(rows), "cost": [None] * len(rows),
         "label_id": [f"l{i}" for i in range(len(rows))]},
        schema={"host": pl.String, "time": TS, "end": TS, "type": pl.String, "severity": pl.Float64,
                "cost": pl.Float64, "label_id": pl.String})


def incidents(*rows: tuple[str, str, float, float, str, str | None, str, float]) -> pl.DataFrame:
    """(id, host, start min, end min, status, label_type, state, updated min)"""
    return pl.DataFrame(
        {"incident_id": [r[0] for r in rows], "host": [r[1] for r in rows], "start": [m(r[2]) for r in rows],
         "end": [m(r[3]) for r in rows], "status": [r[4] for r in rows], "label_type": [r[5] for r in rows],
         "entry_id": [r[5] for r in rows], "state": [r[6] for r in rows], "updated": [m(r[7]) for r in rows]},
        schema={"incident_id": pl.String, "host": pl.String, "start": TS, "end": TS, "status": pl.String,
                "label_type": pl.String, "entry_id": pl.String, "state": pl.String, "updated": TS})


HORIZONS = [m(k) for k in range(1, 11)]  # cycle k+1 sees data up to minute k+1
LAG = timedelta(seconds=90)


def test_cost_band_edges_and_severity_proxy() -> None:
    assert cost_band(0.0099, 0.9) == ("<1 %", False)
    assert cost_band(0.01, 0.1) == ("1-3 %", False)
    assert cost_band(0.0299, None) == ("1-3 %", False)
    assert cost_band(0.03, None) == ("3-10 %", False)
    assert cost_band(0.10, None) == (">10 %", False)
    assert cost_band(-0.002, None) == ("<1 %", False)  # a run faster than healthy costs nothing
    # no cost column (or a null cost): the severity proxy, said so
    assert cost_band(None, 0.1) == ("<1 %", True)
    assert cost_band(math.nan, 0.3) == ("1-3 %", True)
    assert cost_band(None, 0.5) == ("3-10 %", True)
    assert cost_band(None, 0.8) == (">10 %", True)
    with pytest.raises(ValueError, match="neither a cost nor a severity"):
        cost_band(None, None)


def test_detected_top1_and_latency() -> None:
    lab = labels(("a", 3.5, 7, "gpu_power_throttle"))
    rows = incidents(
        # a wrong entry becomes visible first (cycle of horizon 5 min), open
        ("i1", "a", 3.6, 5, "matched", "thermal_throttle", "open", 5),
        ("i1", "a", 3.6, 5.2, "matched", "thermal_throttle", "closed", 6),
        # the right one from horizon 6 min, longer overlap: it is the top-1
        ("i2", "a", 5.3, 7, "matched", "gpu_power_throttle", "open", 6),
        ("i2", "a", 5.3, 7.1, "matched", "gpu_power_throttle", "closed", 8),
        # another host's incident never counts for this label
        ("i3", "b", 3.0, 9, "matched", "gpu_power_throttle", "closed", 9),
    )
    (r,) = score_labels(lab, rows, HORIZONS, LAG)
    assert r["detected"] and r["top1"] and r["got"] == "gpu_power_throttle"
    # first cycle whose horizon passes 3.5 min: horizon 4 min (cycle 1); visible at horizon 5 min
    assert r["latency_cycles"] == 2
    assert r["latency_s"] == pytest.approx((m(5) + LAG - m(3.5)).total_seconds())
    assert r["right_cycles"] == 3
    # the right type covers minutes 5.3 to 7 of the label's 3.5 to 7
    assert r["covered"] == pytest.approx(1.7 / 3.5)


def test_coverage_of_a_lasting_fault_joins_parts_and_counts_only_its_type() -> None:
    # a fault from minute 2 to 10: parts 2-4 and 3.5-6 overlap (counted once), a wrong entry
    # over 6-8 and another host's incident do not count; minutes 8-10 are not reported
    lab = labels(("a", 2, 10, "nic_drops"))
    rows = incidents(("i1", "a", 2, 4, "matched", "nic_drops", "closed", 4),
                     ("i2", "a", 3.5, 6, "matched", "nic_drops", "closed", 6),
                     ("i3", "a", 6, 8, "matched", "tcp_retransmissions", "closed", 8),
                     ("i4", "b", 2, 10, "matched", "nic_drops", "closed", 10))
    (r,) = score_labels(lab, rows, HORIZONS, LAG)
    assert r["covered"] == pytest.approx(4 / 8)
    (r,) = score_labels(lab, rows.head(0), HORIZONS, LAG)
    assert r["covered"] == 0.0


def test_wrong_unmatched_and_missed_labels() -> None:
    lab = labels(("a", 2, 6, "cgroup_cpu_throttle"), ("b", 2, 6, "nic_drops"), ("c", 2, 6, "storage_contention"))
    rows = incidents(
        ("i1", "a", 2.5, 5, "matched", "cpu_noisy_neighbour", "closed", 5),
        ("i2", "a", 5.5, 5.8, "matched", "cgroup_cpu_throttle", "closed", 6),  # shorter overlap: not top-1
        ("i3", "b", 3, 4, "unmatched", None, "closed", 4),
    )
    a, b, c = score_labels(lab, rows, HORIZONS, LAG)
    assert a["detected"] and not a["top1"] and a["got"] == "cpu_noisy_neighbour"
    assert b["detected"] and not b["top1"] and b["got"] == "unmatched"
    assert not c["detected"] and c["got"] == "none" and c["latency_cycles"] is None


def test_two_faults_on_one_host_each_need_their_own_incident() -> None:
    """Each matched incident answers one label of its host (its type's among those it
    overlaps, else the longest overlap): a pair gets both right only with an incident each,
    even when the first fault's incident is the longer over the second label; one incident
    over both answers one of them."""
    lab = labels(("a", 2, 8, "thermal_throttle"), ("a", 3, 8, "pcie_link_degraded"))
    # thermal's incident is short (its signature fades when the link degrades); pcie's is long
    rows = incidents(("i1", "a", 2.1, 4.5, "matched", "thermal_throttle", "closed", 5),
                     ("i2", "a", 3.1, 8, "matched", "pcie_link_degraded", "closed", 9))
    th, pc = score_labels(lab, rows, HORIZONS, LAG)
    assert th["top1"] and th["got"] == "thermal_throttle" and pc["top1"]
    assert not th["top1_longest"] and pc["top1_longest"]  # the old rule gave thermal the pcie incident
    # one incident over both faults: it answers the label it names, the other is wrong
    one = incidents(("i1", "a", 2.1, 8, "matched", "thermal_throttle", "closed", 9))
    th, pc = score_labels(lab, one, HORIZONS, LAG)
    assert th["top1"] and not pc["top1"] and pc["got"] == "thermal_throttle" and pc["detected"]
    # a single fault: a longer wrong incident still outranks a shorter right one
    (r,) = score_labels(labels(("a", 2, 8, "cgroup_cpu_throttle")), incidents(
        ("i1", "a", 2.1, 8, "matched", "cpu_noisy_neighbour", "closed", 9),
        ("i2", "a", 2.5, 4, "matched", "cgroup_cpu_throttle", "closed", 5)), HORIZONS, LAG)
    assert not r["top1"] and r["got"] == "cpu_noisy_neighbour"


def test_superseded_open_incident_counts_once() -> None:
    rows = incidents(
        ("i1", "a", 2, 3, "matched", "thp_coverage_loss", "open", 3),  # superseded: never updated again
        ("i2", "a", 2, 6, "matched", "cpu_governor_powersave", "closed", 6),
        ("i3", "a", 7, 10, "matched", "cpu_governor_powersave", "open", 10),  # open at the last horizon
    )
    final, stale = final_incidents(rows, m(10))
    assert sorted(final["incident_id"].to_list()) == ["i2", "i3"] and stale == 1
    assert false_incidents(final, labels(("a", 1, 6.5, "cpu_governor_powersave"))) == [
        "a:matched:cpu_governor_powersave:@08:07:00:180s"]


def test_healthy_hours_merges_overlapping_labels() -> None:
    lab = labels(("a", 2, 6, "x"), ("a", 4, 8, "y"), ("b", 0, 20, "z"))
    # host a: 10 min minus [2, 8); host b: all covered; host c: no label
    assert healthy_hours(lab, ["a", "b", "c"], m(0), m(10)) == pytest.approx((4 + 0 + 10) / 60)


def _row(**kw: object) -> dict[str, object]:
    base = {"run": "r", "band": "3-10 %", "proxy": False, "overlap": "alone", "detected": True, "top1": True,
            "latency_cycles": 1, "latency_s": 90.0, "type": "t", "covered": 1.0}
    return {**base, **kw}


def test_targets_pass_fail_and_na() -> None:
    rows = [_row() for _ in range(19)] + [_row(top1=False, latency_cycles=3)]
    rows += [_row(band="1-3 %", detected=i < 4, top1=False, latency_cycles=None if i >= 4 else 2) for i in range(5)]
    fw = [_row(run="f1", overlap="fleetwide"), _row(run="f1", overlap="fleetwide", top1=False),
          _row(run="f2", overlap="fleetwide")]
    t = {x.name: x for x in check_targets(rows + fw, healthy_false=1, healthy_host_hours=12.0, fleetwide=fw)}
    assert t["cost >= 3 %: detected"].verdict == "PASS" and t["cost >= 3 %: detected"].value == 1.0
    assert t["cost >= 3 %: top-1 right"].verdict == "PASS" and t["cost >= 3 %: top-1 right"].value == 0.95
    assert t["cost 1-3 %: detected"].verdict == "PASS" and t["cost 1-3 %: detected"].value == 0.8
    assert t["healthy fleets: false incidents / 24 host-h"].value == 2.0
    assert t["healthy fleets: false incidents / 24 host-h"].verdict == "FAIL"
    assert t["fleet-wide misconfiguration named on every host"].value == 0.5
    assert t["fleet-wide misconfiguration named on every host"].verdict == "FAIL"
    assert t["median onset -> visible incident (cycles)"].value == 1  # fleet-wide rows left out
    # nothing to judge: n/a, never a PASS
    t = {x.name: x for x in check_targets([], 0, 0.0, [])}
    assert {x.verdict for x in t.values()} == {"n/a"}
    # a proxy band is said so on the cost targets
    t = {x.name: x for x in check_targets([_row(proxy=True)], 0, 1.0, [])}
    assert "severity proxy" in t["cost >= 3 %: detected"].note


def test_group_rates_and_medians() -> None:
    rows = [_row(type="a", latency_cycles=1), _row(type="a", detected=False, top1=False, latency_cycles=None, covered=0.0),
            _row(type="b", latency_cycles=4, latency_s=250.0)]
    g = {x["type"]: x for x in group(rows, ["type"])}
    assert g["a"]["labels"] == 2 and g["a"]["detected_rate"] == 0.5 and g["a"]["median_cycles"] == 1
    assert g["b"]["median_s"] == 250.0
    assert g["a"]["covered"] == pytest.approx(0.5)  # (one label covered whole, the missed one not at all)


def test_cells_are_valid_scenarios() -> None:
    pair = Cell(2, False, "llm_serving", "mid", "pair", 0.5, ("storage_contention", "nic_drops"), 8, 1)
    sc = from_dict(pair.doc())
    assert [i.type for i in sc.injections] == ["storage_contention", "nic_drops"]
    assert {i.host for i in sc.injections} == {"sim-00"}
    fw = Cell(2, True, "mixed", "boot", "fleetwide", 0.5, ("thp_coverage_loss",), 8, 1)
    sc = from_dict(fw.doc())
    assert [h.workload for h in sc.hosts] == ["llm_serving", "training"] and [h.nics for h in sc.hosts] == [8, 4]
    assert sorted(i.host for i in sc.injections) == ["sim-00", "sim-01"]  # every host, from boot, all run
    assert {(i.start_s, i.duration_s) for i in sc.injections} == {(0, 8 * 60)}
    # every quick cell parses, seeds are the ones asked for, names are unique
    cells = quick_cells([3, 4])
    for c in cells:
        from_dict(c.doc())
    assert {c.seed for c in cells} == {3, 4} and len({c.name for c in cells}) == len(cells)
    # the long cells: every type alone on a 2-host fleet (no cohort), a fault of most of an hour
    long = long_cells([5], ["nic_drops", "gpu_power_throttle"])
    for c in long:
        sc = from_dict(c.doc())
        (inj,) = sc.injections
        assert len(sc.hosts) == 2 and inj.duration_s >= 45 * 60 and inj.severity == 0.5
    (strong,) = long_cells([5], ["nic_drops"], severity=0.7)
    assert from_dict(strong.doc()).injections[0].severity == 0.7 and strong.name != long[0].name


def test_run_cell_sweeps_cycle_by_cycle(tmp_path: Path) -> None:
    """One small cell through the real simulator, lake and scheduler cycle: a row per label
    with every dimension, one cycle per minute, and no incident visible before a cycle
    whose data and lag could show it."""
    cfg = SweepConfig(queue_remediations=False, compact_every=None)
    cell = Cell(2, False, "llm_serving", "mid", "alone", 0.5, ("gpu_power_throttle",), 5, 1)
    res = run_cell(cell, cfg, None, tmp_path)
    assert res.cycles == 5 + TAIL_CYCLES
    (r,) = res.labels
    assert (r["host"], r["type"], r["workload"], r["onset"], r["overlap"], r["fleet"], r["seed"]) == (
        "sim-00", "gpu_power_throttle", "llm_serving", "mid", "alone", "2h-homog", 1)
    # the measured cost once the simulator writes it, else the severity proxy
    assert (r["band"], r["proxy"]) == cost_band(r["cost"], 0.5)
    start, dur = cell.fault_window()
    assert res.healthy_host_hours == pytest.approx((2 * 5 * 60 - dur) / 3600)
    if r["latency_s"] is not None:
        # the first horizon past the onset is the next whole minute, seen `lag` later
        assert r["latency_s"] >= 60 * math.ceil(start / 60) - start + cfg.lag.total_seconds()
        assert r["latency_cycles"] >= 1
    assert not (tmp_path / cell.name).exists()  # the swept copy is removed


def test_config_file_is_read_and_a_bad_one_is_a_usage_error(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.id_matrix import main

    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('[analytics]\nthreshold_rule = "quantile:0.02"\n')
    bad.write_text('[analytics]\nthreshold_rule = "median"\n')
    assert main(["--quick", "--list", "--config", str(good)]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--list", "--config", str(bad)])
    assert exc.value.code == 2 and "threshold_rule" in capsys.readouterr().err


def test_severity_sets_the_long_cells_only(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.id_matrix import main

    assert main(["--long", "--severity", "0.7", "--types", "nic_drops", "--set", "tuning", "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert any("-s0.7-" in n for n in names) and not any("-s0.5-" in n for n in names)
    for argv in (["--quick", "--severity", "0.7", "--list"], ["--long", "--severity", "0", "--list"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and "--severity" in capsys.readouterr().err


def test_cycles_follow_the_configured_cadence() -> None:
    # the scheduler's `every`: a cycle a minute by default, one every 5 min when configured,
    # each seen `lag` after its horizon, and TAIL_CYCLES more after the data ends
    lag = SweepConfig().lag
    one = cycle_times(12, lag)
    assert len(one) == 12 + TAIL_CYCLES and one[0] == T0 + timedelta(minutes=1) + lag
    assert {b - a for a, b in zip(one, one[1:], strict=False)} == {timedelta(minutes=1)}
    five = cycle_times(12, timedelta(seconds=30), timedelta(minutes=5))
    assert len(five) == 3 + TAIL_CYCLES and five[0] == T0 + timedelta(minutes=5, seconds=30)
    assert {b - a for a, b in zip(five, five[1:], strict=False)} == {timedelta(minutes=5)}
