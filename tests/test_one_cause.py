"""One cause, one incident: entries matching the same windows of a host give ONE incident
carrying the best-ranked entry (a host fact that held outranks symptoms only; then
confidence x coverage), the others listed as alternatives with their evidence; incidents of
one host overlap only for separate causes (knowledge_base.incidents)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from jobs.writeback import influx_frame
from knowledge_base import INCIDENT_SCHEMA, build_incidents, incident_id, latest_incidents, load_kb
from knowledge_base.incidents import CONSEQUENCE_LAG_S, explains, separate_causes
from knowledge_base.loader import Entry, KBError, KnowledgeBase, parse_entry
from knowledge_base.matcher import MATCH_SCHEMA
from tests.servers import InfluxdServer

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
KB = load_kb()
THP = KB.by_id["thp_coverage_loss"]
# what the matcher writes for a fact signal that held (knowledge_base.matcher._fmt_sig)
THP_FACT_HELD = next(f"{s.key} (holds)" for s in THP.signals if s.fact == "thp.enabled")


def _frames(host_windows: Mapping[str, Sequence[tuple[int, str | None, float, str]]]
            ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(matches, findings) of 1-s windows (3 s long): per host, (second, entry or None,
    confidence, explanation) of each flagged window."""
    m, f = [], []
    for host, wins in host_windows.items():
        for sec, entry, conf, expl in wins:
            ws = T0 + timedelta(seconds=sec)
            we = ws + timedelta(seconds=3)
            f.append({"host": host, "window_start": ws, "window_end": we, "score": 5.0})
            if entry is not None:
                m.append({"host": host, "window_start": ws, "window_end": we, "rank": 1, "entry_id": entry,
                          "label_type": KB.by_id[entry].label_type, "confidence": conf, "matched": True,
                          "devices": [], "matched_signals": [], "missing_signals": [], "contradicted_signals": [],
                          "explanation": expl})
    return pl.DataFrame(m, schema=MATCH_SCHEMA), pl.DataFrame(f)


def _overlapping_pairs(inc: pl.DataFrame) -> list[tuple[str, str]]:
    rows = inc.filter(pl.col("status") == "matched").sort("host", "start").rows(named=True)
    return [(a["entry_id"], b["entry_id"]) for i, a in enumerate(rows) for b in rows[i + 1:]
            if a["host"] == b["host"] and b["start"] < a["end"] and a["start"] < b["end"]]


def thp_off_story() -> dict[str, list[tuple[int, str | None, float, str]]]:
    """The real host's THP-off minutes: memory-bandwidth windows first (the fact is re-read
    once a minute), then THP with its fact, CPU-neighbour windows in between."""
    wins: list[tuple[int, str | None, float, str]] = []
    for s in range(0, 120):
        if s < 20:
            wins.append((s, "memory_bandwidth_contention", 0.8, "Memory-bandwidth contention: matched cpu.user_share ↑"))
        elif s % 10 == 3:
            wins.append((s, "cpu_noisy_neighbour", 0.7, "CPU contention: matched psi.cpu_some_share ↑"))
        elif s % 10 == 7:
            wins.append((s, "memory_bandwidth_contention", 0.9, "Memory-bandwidth contention: matched perf.ipc ↓"))
        else:
            wins.append((s, "thp_coverage_loss", 0.6, f"Reduced huge-page coverage: matched {THP_FACT_HELD}"))
    return {"h1": wins}


def test_one_cause_gives_one_incident_with_the_fact_backed_entry_and_alternatives() -> None:
    matches, findings = _frames(thp_off_story())
    inc = build_incidents(matches, findings, KB)
    matched = inc.filter(pl.col("status") == "matched")
    assert matched.height == 1, matched.select("entry_id", "start", "end")
    r = matched.row(0, named=True)
    # the fact outranks the higher-confidence symptom-only entries
    assert r["entry_id"] == "thp_coverage_loss" and r["label_type"] == THP.label_type
    assert r["n_windows"] == 120 and r["match_share"] == pytest.approx(80 / 120)
    assert r["confidence"] == pytest.approx(0.6)
    assert r["start"] == T0 and r["end"] == T0 + timedelta(seconds=122)
    alts = r["alternatives"]
    assert [a.split(":")[0] for a in alts] == ["memory_bandwidth_contention", "cpu_noisy_neighbour"]
    assert "symptoms only" in alts[0] and "30/120 windows" in alts[0]
    assert "thp.enabled" in r["explanation"] and "held in 80" in r["explanation"]
    # the id is the founder's (the first run: memory bandwidth at second 0)
    assert r["incident_id"] == incident_id("h1", T0, "memory_bandwidth_contention")
    assert inc.filter(pl.col("status") == "unmatched").is_empty()


def test_open_incident_keeps_its_id_when_a_better_entry_joins() -> None:
    """Swept as it grows (what an open incident sees each cycle): the first 20 s are
    memory bandwidth only; when THP with its fact joins, the same incident switches entry."""
    matches, findings = _frames(thp_off_story())
    ids, entries = set(), []
    for upto in (20, 60, 120):
        keep = pl.col("window_start") < T0 + timedelta(seconds=upto)
        inc = build_incidents(matches.filter(keep), findings.filter(keep), KB, max_gap_s=1e9)
        [r] = inc.filter(pl.col("status") == "matched").iter_rows(named=True)
        ids.add(r["incident_id"])
        entries.append(r["entry_id"])
    assert len(ids) == 1
    assert entries == ["memory_bandwidth_contention", "thp_coverage_loss", "thp_coverage_loss"]


def test_without_the_fact_confidence_times_coverage_decides() -> None:
    wins = [(s, "memory_bandwidth_contention" if s % 3 else "cpu_noisy_neighbour", 0.5 if s % 3 else 0.9, "x")
            for s in range(60)]
    inc = build_incidents(*_frames({"h1": wins}), KB)
    [r] = inc.filter(pl.col("status") == "matched").iter_rows(named=True)
    # 40 windows x 0.5 = 20 > 20 windows x 0.9 = 18
    assert r["entry_id"] == "memory_bandwidth_contention"
    assert r["alternatives"][0].startswith("cpu_noisy_neighbour: 20/60 windows, confidence 0.90")


def test_separate_causes_overlap_as_two_incidents() -> None:
    # storage and GPU: symptom-only entries with disjoint subsystems
    wins = [(s, "storage_contention" if s % 2 else "gpu_power_throttle", 0.8, "x") for s in range(60)]
    inc = build_incidents(*_frames({"h1": wins, "h2": [(s, "gpu_power_throttle", 0.8, "x") for s in range(60)]}), KB)
    got = sorted(inc.filter(pl.col("host") == "h1")["entry_id"].to_list())
    assert got == ["gpu_power_throttle", "storage_contention"]
    assert [sorted(p) for p in _overlapping_pairs(inc)] == [["gpu_power_throttle", "storage_contention"]]
    assert inc.filter(pl.col("host") == "h2").height == 1  # other hosts are their own incidents
    assert all(a == [] for a in inc["alternatives"].to_list())


def _fact_entry(eid: str, fact: str, subsystems: list[str]) -> Entry:
    return parse_entry({"id": eid, "title": eid, "explanation": "x", "impact": "x", "subsystems": subsystems,
                        "signals": [{"fact": fact, "op": "==", "value": "x", "role": "required"}]}, f"<{eid}>")


def test_separate_causes_rule() -> None:
    gov = _fact_entry("governor_fact", "cpu.governor", ["cpu"])
    thp2 = _fact_entry("thp_again", "thp.enabled", ["memory"])
    e = KB.by_id
    assert separate_causes(THP, gov)  # two configuration faults, two fixes
    assert not separate_causes(THP, thp2)  # the same fact: one cause
    # a symptom after a fact (or up to the fact poll period before it): its consequence
    assert not separate_causes(THP, e["cpu_noisy_neighbour"], 300.0)
    assert not separate_causes(e["cpu_noisy_neighbour"], THP, CONSEQUENCE_LAG_S)
    # a symptom on other subsystems well before the fact changed: not its consequence
    assert separate_causes(e["cpu_noisy_neighbour"], THP, CONSEQUENCE_LAG_S + 1)
    assert not separate_causes(e["memory_bandwidth_contention"], THP, 600.0)  # shares memory
    assert not separate_causes(e["cpu_noisy_neighbour"], e["memory_bandwidth_contention"])  # share cpu
    assert separate_causes(e["storage_contention"], e["gpu_power_throttle"])
    assert not separate_causes(THP, THP)
    # two fact-backed causes overlapping on one host stay two incidents
    kb = KnowledgeBase((*KB.entries, gov))
    wins = [(s, "thp_coverage_loss", 0.7, THP_FACT_HELD) if s % 2 else (s, None, 0.0, "") for s in range(40)]
    m, f = _frames({"h1": wins})
    gm = m.head(20).with_columns(pl.col("window_start") + timedelta(seconds=5), pl.col("window_end")
                                 + timedelta(seconds=5), pl.lit("governor_fact").alias("entry_id"))
    inc = build_incidents(pl.concat([m, gm]).sort("host", "window_start"), f, kb)
    assert sorted(inc.filter(pl.col("status") == "matched")["entry_id"].to_list()) == [
        "governor_fact", "thp_coverage_loss"]


def test_a_cause_read_from_telemetry_is_no_consequence_of_a_fact() -> None:
    """Signals marked ``cause`` (the GPU power limit below its default, a group throttled
    by its CFS quota) read the cause itself: beside a configuration fault they are a second
    cause, not its consequence; beside symptoms they keep the subsystem rule."""
    e = KB.by_id
    gov = e["cpu_governor_powersave"]
    assert separate_causes(THP, e["gpu_power_throttle"], 58.0)  # full matrix: power cap 1 min after THP off
    assert separate_causes(gov, e["cgroup_cpu_throttle"], 59.0)  # a governor, then a quota: both on cpu
    assert separate_causes(e["pcie_link_degraded"], gov, 61.0)
    assert not separate_causes(e["cgroup_cpu_throttle"], e["cgroup_cpu_throttle"])
    # no fact involved: a cause and a symptom on one subsystem are competing readings,
    # on disjoint ones separate, whichever came first
    assert not separate_causes(e["cgroup_cpu_throttle"], e["cpu_noisy_neighbour"], 5.0)
    assert not separate_causes(e["gpu_power_throttle"], e["thermal_throttle"], 5.0)
    assert separate_causes(e["gpu_power_throttle"], e["storage_contention"], 1.0)
    # a cause read from telemetry is nobody's declared consequence (memory pressure names cpu)
    assert not explains(e["memory_pressure"], e["cgroup_cpu_throttle"])
    assert explains(e["memory_pressure"], e["cpu_noisy_neighbour"])
    # through incidents: THP off, a power cap 20 s later on the same windows, one entry best
    # in each: two incidents
    wins = [(s, "thp_coverage_loss", 0.6, THP_FACT_HELD) if s < 20 else (s, "gpu_power_throttle", 0.9, "cap")
            for s in range(60)]
    inc = build_incidents(*_frames({"h1": wins}), KB, max_gap_s=1e9)
    assert sorted(inc.filter(pl.col("status") == "matched")["entry_id"].to_list()) == [
        "gpu_power_throttle", "thp_coverage_loss"]


def _with_lower(m: pl.DataFrame, entry: str, secs: range, conf: float) -> pl.DataFrame:
    """``m`` plus rank-2 matched rows of ``entry`` on host h1 at ``secs``."""
    low = m.filter((pl.col("host") == "h1") & pl.col("window_start").is_in(
        [T0 + timedelta(seconds=x) for x in secs])).with_columns(
        pl.lit(2, pl.Int32).alias("rank"), pl.lit(entry).alias("entry_id"), pl.lit(conf).alias("confidence"),
        pl.lit(KB.by_id[entry].label_type).alias("label_type"), pl.lit(None, pl.String).alias("explanation"))
    return pl.concat([m, low]).sort("host", "window_start", "rank")


def test_a_cause_outranked_by_a_second_one_keeps_its_windows() -> None:
    """NIC drops from second 0; storage contention from second 30 outranks them in every
    window after, while the drops still match (rank 2): the drops' incident lasts to the
    end beside the storage one (before: it stopped at second 30). An entry matched only
    below others, never a window's best, raises nothing of its own."""
    wins = [(s, "nic_drops" if s < 30 else "storage_contention", 0.8, "x") for s in range(90)]
    m, f = _frames({"h1": wins})
    m = _with_lower(_with_lower(m, "nic_drops", range(30, 90), 0.6), "tcp_retransmissions", range(0, 90), 0.5)
    inc = build_incidents(m, f, KB, max_gap_s=1e9).filter(pl.col("status") == "matched")
    by = {r["entry_id"]: r for r in inc.iter_rows(named=True)}
    assert sorted(by) == ["nic_drops", "storage_contention"]
    assert by["nic_drops"]["end"] == T0 + timedelta(seconds=89 + 3)
    assert by["nic_drops"]["start"] == T0 and by["storage_contention"]["start"] == T0 + timedelta(seconds=30)
    assert by["nic_drops"]["explanation"].endswith("x")  # its own rank-1 window explains it
    # without the rank-2 rows the drops stop where storage began
    m0, f0 = _frames({"h1": wins})
    [nic] = build_incidents(m0, f0, KB, max_gap_s=1e9).filter(pl.col("entry_id") == "nic_drops").iter_rows(named=True)
    assert nic["end"] == T0 + timedelta(seconds=29 + 3)


def test_findings_carry_the_entries_also_matched_and_give_them_back() -> None:
    """attach_matches stores the lower-ranked matched entries of each window in
    ``also_matched``; matches_of turns them back into rank 2, 3, ... rows, and findings
    written before the column existed give rank-1 rows only."""
    from jobs.step import matches_of
    from knowledge_base.detector import FINDINGS_OUT_SCHEMA, attach_matches

    m, f = _frames({"h1": [(0, "storage_contention", 0.9, "s"), (1, "nic_drops", 0.8, "n")]})
    m = _with_lower(m, "nic_drops", range(0, 1), 0.7)
    sig = _with_lower(m.filter(pl.col("rank") == 1), "tcp_retransmissions", range(0, 2), 0.6)
    got = attach_matches(f, m, sig).sort("window_start")
    assert got["entry_id"].to_list() == ["storage_contention", "nic_drops"]
    assert got["also_matched"].to_list() == [
        [{"entry_id": "nic_drops", "confidence": 0.7}, {"entry_id": "tcp_retransmissions", "confidence": 0.6}],
        [{"entry_id": "tcp_retransmissions", "confidence": 0.6}]]
    assert got["also_matched"].dtype == FINDINGS_OUT_SCHEMA["also_matched"]
    back = matches_of(got)
    assert back.select("window_start", "rank", "entry_id").rows() == [
        (T0, 1, "storage_contention"), (T0, 2, "nic_drops"), (T0, 3, "tcp_retransmissions"),
        (T0 + timedelta(seconds=1), 1, "nic_drops"), (T0 + timedelta(seconds=1), 2, "tcp_retransmissions")]
    assert back.schema == pl.Schema(MATCH_SCHEMA)
    old = matches_of(got.drop("also_matched"))
    assert old["rank"].to_list() == [1, 1]
    # InfluxDB gets the entries' ids, best first
    assert influx_frame("findings", got)["also_matched"].to_list() == ["nic_drops,tcp_retransmissions",
                                                                      "tcp_retransmissions"]


def test_an_entry_reading_two_facts_is_ranked_on_whichever_held() -> None:
    two = parse_entry({"id": "two_facts", "title": "t", "explanation": "x", "impact": "x", "subsystems": ["cpu"],
                       "signals": [{"fact": f, "op": "==", "value": "x", "role": "required", "group": "g"}
                                   for f in ("cpu.governor", "cpu.boost")]}, "<two_facts>")
    kb = KnowledgeBase((*KB.entries, two))
    held = next(f"{s.key} (holds)" for s in two.signals if s.fact == "cpu.boost")
    wins = [(s, "two_facts", 0.3, f"t: matched {held}") if s % 4 == 0 else (s, "cpu_noisy_neighbour", 0.9, "x")
            for s in range(40)]
    m, f = _frames({"h1": [w for w in wins if w[1] != "two_facts"]})
    tm = pl.DataFrame([{"host": "h1", "window_start": T0 + timedelta(seconds=s), "window_end": T0 + timedelta(
        seconds=s + 3), "rank": 1, "entry_id": e, "label_type": e, "confidence": c, "matched": True, "devices": [],
        "matched_signals": [], "missing_signals": [], "contradicted_signals": [], "explanation": x}
        for s, e, c, x in wins if e == "two_facts"], schema=MATCH_SCHEMA)
    f = pl.concat([f, tm.select("host", "window_start", "window_end", pl.lit(5.0).alias("score"))])
    [r] = build_incidents(pl.concat([m, tm]), f, kb).iter_rows(named=True)
    assert r["entry_id"] == "two_facts"
    assert "fact cpu.boost == 'x' held in 10 of them" in r["explanation"]


def test_a_neighbour_running_before_thp_went_off_stays_its_own_incident() -> None:
    wins = [(s, "cpu_noisy_neighbour", 0.8, "x") for s in range(0, 300, 2)]
    wins += [(s, "thp_coverage_loss", 0.7, THP_FACT_HELD) for s in range(121, 300, 2)]
    inc = build_incidents(*_frames({"h1": wins}), KB)
    assert inc.sort("start")["entry_id"].to_list() == ["cpu_noisy_neighbour", "thp_coverage_loss"]


def memory_hog_story() -> dict[str, list[tuple[int, str | None, float, str]]]:
    """The real drill's memory fault (docs/drill.md): the hog zeroing the pages it takes shows
    as CPU time 30 s before MemAvailable is low; inside the fault a squeezed page cache shows
    as storage; freeing 20 GiB at the end takes CPU for ~20 s after memory recovered."""
    wins: list[tuple[int, str | None, float, str]] = [(s, "cpu_noisy_neighbour", 0.8, "x") for s in range(0, 30)]
    for s in range(30, 90):
        wins.append((s, "storage_contention" if s % 5 == 0 else "memory_pressure", 0.7, "x"))
    wins += [(s, "cpu_noisy_neighbour", 0.8, "x") for s in range(90, 110)]
    return {"h1": wins}


def test_a_cause_and_the_symptoms_it_declares_as_consequences_are_one_incident() -> None:
    inc = build_incidents(*_frames(memory_hog_story()), KB)
    [r] = inc.iter_rows(named=True)
    # memory pressure explains the CPU and storage windows: it is chosen although the
    # CPU neighbour matched windows at a higher confidence
    assert r["entry_id"] == "memory_pressure" and r["n_windows"] == 110
    assert [a.split(":")[0] for a in r["alternatives"]] == ["cpu_noisy_neighbour", "storage_contention"]
    # the incident is named by its founder: the CPU windows of the hog's start
    assert r["incident_id"] == incident_id("h1", T0, "cpu_noisy_neighbour")
    # as the scheduler builds them (one segment, runs not cut by gaps): the same incident
    [seg] = build_incidents(*_frames(memory_hog_story()), KB, max_gap_s=1e9).iter_rows(named=True)
    assert (seg["entry_id"], seg["n_windows"], seg["incident_id"]) == ("memory_pressure", 110, r["incident_id"])
    # without the declaration the same windows are three incidents (the drill's before)
    mem = KB.by_id["memory_pressure"]
    plain = KnowledgeBase(tuple(replace(e, consequences=()) if e.id == mem.id else e for e in KB.entries))
    got = build_incidents(*_frames(memory_hog_story()), plain, max_gap_s=1e9)
    assert sorted(got["entry_id"].to_list()) == ["cpu_noisy_neighbour", "memory_pressure", "storage_contention"]


def test_the_hogs_incident_keeps_its_id_when_the_cause_joins() -> None:
    """Swept as it grows: CPU windows only at first, then memory pressure joins the same
    incident (same id, the founder's) and takes it over."""
    matches, findings = _frames(memory_hog_story())
    ids, entries = set(), []
    for upto in (30, 60, 110):
        keep = pl.col("window_start") < T0 + timedelta(seconds=upto)
        [r] = build_incidents(matches.filter(keep), findings.filter(keep), KB, max_gap_s=1e9).iter_rows(named=True)
        ids.add(r["incident_id"])
        entries.append(r["entry_id"])
    assert ids == {incident_id("h1", T0, "cpu_noisy_neighbour")}
    assert entries == ["cpu_noisy_neighbour", "memory_pressure", "memory_pressure"]


def test_explains_rule() -> None:
    e = KB.by_id
    mem, cpu, sto = e["memory_pressure"], e["cpu_noisy_neighbour"], e["storage_contention"]
    assert set(mem.consequences) == {"cpu", "storage"}
    assert explains(mem, cpu, 300.0) and explains(mem, sto, 0.0)
    # a CPU symptom up to the lag before the memory reading is the consumer's start ...
    assert explains(mem, cpu, -CONSEQUENCE_LAG_S) and not separate_causes(cpu, mem, CONSEQUENCE_LAG_S)
    # ... one that began earlier was there before: a separate cause
    assert not explains(mem, cpu, -CONSEQUENCE_LAG_S - 1) and separate_causes(cpu, mem, CONSEQUENCE_LAG_S + 1)
    assert not explains(cpu, mem) and not explains(mem, e["gpu_power_throttle"])
    assert not explains(mem, THP)  # a fact-reading entry is its own cause
    assert separate_causes(mem, e["gpu_power_throttle"], 10.0)


def test_consequences_name_subsystems() -> None:
    doc = {"id": "x_cause", "title": "t", "explanation": "x", "impact": "x", "subsystems": ["memory"],
           "consequences": ["cpu", "disk"], "signals": [{"feature": "mem.available_share", "direction": "down",
                                                         "role": "required"}]}
    with pytest.raises(KBError, match=r"consequences\[1\]"):
        parse_entry(doc, "<x_cause>")


def test_runs_far_apart_stay_separate_incidents() -> None:
    wins = [(s, "memory_bandwidth_contention", 0.8, "x") for s in range(20)]
    wins += [(s, "cpu_noisy_neighbour", 0.8, "x") for s in range(200, 220)]
    inc = build_incidents(*_frames({"h1": wins}), KB, max_gap_s=30)
    assert inc["entry_id"].to_list() == ["memory_bandwidth_contention", "cpu_noisy_neighbour"]
    assert all(a == [] for a in inc["alternatives"].to_list())


def test_influx_carries_the_chosen_entry_only() -> None:
    inc = build_incidents(*_frames(thp_off_story()), KB)
    assert inc.schema == pl.Schema(INCIDENT_SCHEMA)
    out = influx_frame("incidents", inc)
    assert out["entry_id"].to_list() == ["thp_coverage_loss"]  # one point, tagged with the chosen entry


def test_report_and_query_show_the_alternatives(tmp_path: Path) -> None:
    from ingest.lake import write_table
    from jobs import query
    from jobs.report import write_report

    inc = build_incidents(*_frames(thp_off_story()), KB)
    write_table(tmp_path / "lake", "incidents", inc.select(pl.col("start").alias("time"), pl.all()),
                partition_by_hour=False)
    got = query.run_query(tmp_path / "lake", "top-incidents").row(0, named=True)
    assert got["entry_id"] == "thp_coverage_loss"
    assert got["alternatives"].startswith("memory_bandwidth_contention: 30/120 windows")
    assert "; cpu_noisy_neighbour: 10/120 windows" in got["alternatives"]
    write_report(tmp_path / "lake", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<th>alternatives</th>" in page
    assert "memory_bandwidth_contention: 30/120 windows, confidence 0.83, symptoms only (no host fact)<br>" \
           "cpu_noisy_neighbour: 10/120 windows" in page


@pytest.mark.server
def test_influx_keeps_one_point_per_incident_when_its_entry_changes(tmp_path: Path,
                                                                   influxd_server: InfluxdServer) -> None:
    """An open incident first carried memory bandwidth, then THP (its fact arrived): the
    write-back's rows of one incident replace each other in InfluxDB (same series and
    time), so InfluxDB holds the chosen entry only, never the stale alternative."""
    from ingest.influx import InfluxConfig, InfluxSource
    from jobs.writeback import WriteBack

    matches, findings = _frames(thp_off_story())
    wb = WriteBack(InfluxConfig(url=influxd_server.url, database="one_cause"))
    rows = []
    for upto, state in ((20, "open"), (60, "open"), (120, "closed")):
        keep = pl.col("window_start") < T0 + timedelta(seconds=upto)
        inc = build_incidents(matches.filter(keep), findings.filter(keep), KB, max_gap_s=1e9)
        inc = inc.with_columns(pl.lit(state).alias("state"), pl.lit(T0 + timedelta(seconds=upto)).cast(
            INCIDENT_SCHEMA["updated"]).alias("updated"))
        rows.append(inc)
        wb.write_rows("incidents", inc.select(pl.col("start").alias("time"), pl.all()))
    wb.close()
    assert rows[0]["entry_id"].to_list() == ["memory_bandwidth_contention"]  # the stale reading
    src = InfluxSource(InfluxConfig(url=influxd_server.url, database="one_cause"))
    try:
        back = src.read("unveil_incidents", start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1))
    finally:
        src.close()
    assert back.height == 1, back.select("entry_id", "state")
    assert back.row(0, named=True)["entry_id"] == "thp_coverage_loss"
    assert back.row(0, named=True)["state"] == "closed"


def test_two_readings_of_one_host_are_one_incident_through_the_scheduler(tmp_path: Path) -> None:
    """A simulated lake swept cycle by cycle as `unveil schedule` does: THP off on sim-01
    with memory-bandwidth contention over the same minutes (memory is the subsystem of
    both): one incident carrying THP (its fact held), memory bandwidth its alternative;
    the id stays the same from the first open row to the closed one."""
    from ingest import lake
    from ingest.simulator import from_dict, simulate
    from jobs.config import SweepConfig
    from jobs.cycle import run_cycle

    root = tmp_path / "lake"
    sink = lake.LakeSink(root)
    simulate(from_dict({"seed": 1, "duration": "10m", "hosts": 3, "workload": "mixed", "injections": [
        {"type": "thp_coverage_loss", "host": "sim-01", "start": "200s", "duration": "5m", "severity": 0.5},
        {"type": "memory_bandwidth_contention", "host": "sim-01", "start": "260s", "duration": "3m",
         "severity": 0.5}]}), [sink])
    sink.close()
    cfg = SweepConfig(lag=timedelta(0), compact_every=None, queue_remediations=False)
    for k in range(1, 11):
        run_cycle(root, cfg, now=T0 + timedelta(minutes=k))
    rows = lake.read(root, "incidents").filter((pl.col("host") == "sim-01") & (pl.col("status") == "matched"))
    [inc] = latest_incidents(rows).iter_rows(named=True)
    assert inc["entry_id"] == "thp_coverage_loss" and inc["state"] == "closed"
    assert [a.split(":")[0] for a in inc["alternatives"]] == ["memory_bandwidth_contention"]
    assert "fact thp.enabled == 'never' held in" in inc["explanation"]
    assert rows["incident_id"].n_unique() == 1 and rows.height >= 3  # open rows, then closed, one id


def test_a_lake_written_before_also_matched_keeps_working(tmp_path: Path) -> None:
    """Upgrading over a lake whose findings lack ``also_matched``: the scheduler's next
    cycles read those findings back for an open incident (no lower ranks from them), write
    new ones with the column, and compaction merges both."""
    import pyarrow.parquet as pq

    from ingest import lake
    from ingest.simulator import from_dict, simulate
    from jobs.config import SweepConfig
    from jobs.cycle import run_cycle

    root = tmp_path / "lake"
    sink = lake.LakeSink(root)
    simulate(from_dict({"seed": 2, "duration": "6m", "hosts": 2, "workload": "training", "injections": [
        {"type": "storage_contention", "host": "sim-00", "start": "120s", "duration": "4m", "severity": 0.7}]}),
        [sink])
    sink.close()
    cfg = SweepConfig(lag=timedelta(0), compact_every=None, queue_remediations=False)
    for k in (1, 2, 3, 4):
        run_cycle(root, cfg, now=T0 + timedelta(minutes=k))
    files = sorted((root / "findings").rglob("*.parquet"))
    assert files and all("also_matched" in pq.read_schema(f).names for f in files)
    for f in files:  # as the release before wrote them
        t = pq.read_table(f)
        pq.write_table(t.drop_columns(["also_matched"]), f)
    for k in (5, 6, 7):
        run_cycle(root, cfg, now=T0 + timedelta(minutes=k))
    lake.compact(root, "findings")
    found = lake.read(root, "findings")
    assert found["also_matched"].dtype == pl.List(pl.Struct({"entry_id": pl.String, "confidence": pl.Float64}))
    assert found.filter(pl.col("window_start") >= T0 + timedelta(minutes=4))["also_matched"].null_count() == 0
    inc = latest_incidents(lake.read(root, "incidents")).filter(pl.col("host") == "sim-00")
    assert "storage_contention" in inc["entry_id"].to_list()
    assert set(inc["state"].to_list()) <= {"open", "closed"}
