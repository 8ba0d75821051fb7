"""Matching, incidents, drafts and remediation parameters on recorded pipeline output
(tests/data/knowledge_base: 4 simulated hosts, sim-01 power-capped on gpu3 and gpu5;
regenerate with its record.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import polars as pl
import pytest

from jobs.cli import main
from knowledge_base import (
    MATCH_SCHEMA,
    HostFacts,
    as_eval_matcher,
    best_matches,
    build_incidents,
    check_preconditions,
    draft_entry,
    fill_params,
    incident_id,
    load_kb,
    match_findings,
)
from knowledge_base.facts import FactError
from knowledge_base.loader import parse_entry
from remediation import registry
from remediation.errors import ParamError

DATA = Path(__file__).parent / "data" / "knowledge_base"


@pytest.fixture(scope="module")
def rec() -> dict[str, pl.DataFrame]:
    return {t: pl.read_parquet(DATA / f"{t}.parquet") for t in ("features", "findings", "host_facts", "labels")}


@pytest.fixture(scope="module")
def matches(rec: dict[str, pl.DataFrame]) -> pl.DataFrame:
    return match_findings(rec["findings"], rec["features"], rec["host_facts"], load_kb())


def _inside(df: pl.DataFrame, lab: dict, col: str = "window_start") -> pl.DataFrame:
    return df.filter((pl.col("host") == lab["host"]) & (pl.col(col) >= lab["time"]) & (pl.col("window_end") <= lab["end"]))


def test_injected_windows_match_the_right_entry_with_explanation(rec: dict[str, pl.DataFrame],
                                                                 matches: pl.DataFrame) -> None:
    assert matches.schema == pl.Schema(MATCH_SCHEMA)
    lab = rec["labels"].row(0, named=True)
    flagged = _inside(rec["findings"], lab)
    top = _inside(matches, lab).filter(pl.col("rank") == 1)
    assert flagged.height > 30
    ok = top.filter(pl.col("matched") & (pl.col("entry_id") == "gpu_power_throttle"))
    assert ok.height >= 0.9 * flagged.height
    row = ok.row(0, named=True)
    assert row["devices"] == ["gpu3", "gpu5"]
    assert any(s.startswith("gpu.power_limit_ratio ↓") for s in row["matched_signals"])
    assert "GPU power throttling" in row["explanation"] and "z=" in row["explanation"]
    # windows not overlapping the injection are never identified as a power cap
    overlapping = (pl.col("host") == lab["host"]) & (pl.col("window_start") < lab["end"]) & (pl.col("window_end") > lab["time"])
    outside = matches.filter(~overlapping)
    assert outside.filter(pl.col("matched") & (pl.col("entry_id") == "gpu_power_throttle")).is_empty()


def test_matcher_is_deterministic(rec: dict[str, pl.DataFrame], matches: pl.DataFrame) -> None:
    kb = load_kb()
    again = match_findings(rec["findings"].sample(fraction=1.0, shuffle=True, seed=1), rec["features"],
                           rec["host_facts"], kb)
    assert again.equals(matches)
    inc_a = build_incidents(matches, rec["findings"], kb)
    inc_b = build_incidents(again, rec["findings"], kb)
    assert inc_a.equals(inc_b)


def test_incidents_group_windows_and_keep_unmatched_fingerprints(rec: dict[str, pl.DataFrame],
                                                                 matches: pl.DataFrame) -> None:
    inc = build_incidents(matches, rec["findings"], load_kb())
    lab = rec["labels"].row(0, named=True)
    power = inc.filter(pl.col("entry_id") == "gpu_power_throttle")
    assert power.height == 1, power.select("start", "end", "n_windows")
    p = power.row(0, named=True)
    assert p["host"] == "sim-01" and p["status"] == "matched" and p["devices"] == ["gpu3", "gpu5"]
    assert abs((p["start"] - lab["time"]).total_seconds()) <= 5 and abs((p["end"] - lab["end"]).total_seconds()) <= 5
    assert p["confidence"] >= 0.5 and p["peak_score"] > 1.0
    assert p["incident_id"] == incident_id("sim-01", p["start"], "gpu_power_throttle")
    un = inc.filter(pl.col("status") == "unmatched")
    assert un.height >= 1
    u = un.row(0, named=True)
    assert u["entry_id"] is None and u["top_factors"] and "fingerprint:" in u["explanation"]
    assert sum(u[c] for c in inc.columns if c.startswith("share_")) == pytest.approx(1.0, abs=1e-6)
    # no two incidents share an id
    assert inc["incident_id"].n_unique() == inc.height


def test_draft_from_unmatched_incident_is_a_valid_entry(rec: dict[str, pl.DataFrame], matches: pl.DataFrame,
                                                        tmp_path: Path) -> None:
    inc = build_incidents(matches, rec["findings"], load_kb())
    u = inc.filter(pl.col("status") == "unmatched").sort("n_windows", descending=True).row(0, named=True)
    text = draft_entry(u)
    entry = parse_entry(tomllib.loads(text), "<draft>")
    assert entry.id.startswith("draft_inc_")
    assert entry.required[0].family == u["top_factors"][0]["family"]
    assert text.startswith(f"# Drafted from unmatched incident {u['incident_id']} ")
    matched = inc.filter(pl.col("status") == "matched").row(0, named=True)
    assert draft_entry(matched).startswith(f"# Drafted from incident {matched['incident_id']} ")
    # through the CLI, from a lake
    from ingest.lake import write_table

    lake = tmp_path / "lake"
    write_table(lake, "incidents", inc.with_columns(pl.col("start").alias("time")))
    out = tmp_path / "new_entry.toml"
    assert main(["kb", "draft", "--incident", u["incident_id"], "--lake", str(lake), "--out", str(out)]) == 0
    assert parse_entry(tomllib.loads(out.read_text(encoding="utf-8")), "<draft>").id == entry.id
    assert main(["kb", "draft", "--incident", "inc-000000000000", "--lake", str(lake)]) == 2


def test_eval_matcher_and_degraded_mode(rec: dict[str, pl.DataFrame], matches: pl.DataFrame) -> None:
    m = as_eval_matcher(load_kb())
    full = m(rec["findings"], rec["host_facts"], features=rec["features"])
    assert full.columns == ["host", "window_start", "match_type", "confidence"]
    assert full.equals(best_matches(matches))
    # without features the matcher reads only the findings' top factors: fewer signals, still right
    lite = m(rec["findings"], rec["host_facts"])
    lab = rec["labels"].row(0, named=True)
    inside = _inside(lite.with_columns(pl.col("window_start").alias("window_end")), lab)
    assert inside.height > 0 and set(inside["match_type"].to_list()) == {"gpu_power_throttle"}


def test_preconditions_explain_themselves(rec: dict[str, pl.DataFrame]) -> None:
    kb = load_kb()
    gpu_host = HostFacts.from_frame(rec["host_facts"], "sim-00")
    assert all(r.ok for r in check_preconditions(kb.get("gpu_nic_numa_misplacement"), gpu_host))
    cpu_only = HostFacts("cpu-box", {("numa", "node0", "cpulist"): ("0-7", None), ("cpu", "", "governor"): ("performance", None)})
    res = check_preconditions(kb.get("gpu_nic_numa_misplacement"), cpu_only)
    failed = [r.message for r in res if not r.ok]
    assert any("numa.nodes >= 2 does not hold on host cpu-box: numa.nodes = 1" in m for m in failed), failed
    assert any("gpu.count >= 1" in m and "no GPU" not in m or "only GPU hosts" in m for m in failed), failed
    # a match on such a host is refused, with the reason in the explanation
    keys = rec["findings"].filter(pl.col("host") == "sim-01").head(3)
    facts = pl.DataFrame({"host": ["sim-01"], "category": ["numa"], "device": ["node0"], "key": ["cpulist"],
                          "value": ["0-7"], "value_num": [None]}, schema_overrides={"value_num": pl.Float64})
    got = match_findings(keys, rec["features"], facts, kb)
    assert not got.filter(pl.col("entry_id") == "gpu_power_throttle")["matched"].any()
    assert got.filter(pl.col("entry_id") == "gpu_power_throttle")["explanation"].str.contains(
        "preconditions failed: gpu.count >= 1").all()


def test_remediation_params_filled_from_facts(rec: dict[str, pl.DataFrame]) -> None:
    kb = load_kb()
    facts = HostFacts.from_frame(rec["host_facts"], "sim-01")
    power = kb.get("gpu_power_throttle").remediation
    assert power is not None and power.script is not None
    params = fill_params(power.params, "gpu5", facts)
    assert params == {"gpu": "5", "limit_w": 700.0}
    assert registry.validate_params(power.script, params)["gpu"] == "5"
    # a cap lowered on several GPUs is one action for all of them (other kinds of device left out)
    every = fill_params(power.params, "gpu5", facts, devices=["gpu5", "gpu0", "node1", "gpu7"])
    assert every == {"gpu": "0,5,7", "limit_w": 700.0}
    registry.validate_params(power.script, every)
    with pytest.raises(ParamError, match="does not match"):
        registry.validate_params(power.script, {"gpu": "0,1,100"})
    irq = kb.get("irq_locality_miss").remediation
    assert irq is not None and irq.script is not None
    p = fill_params(irq.params, "ens1np0", facts)  # irq.locality features name the netdev
    assert p == {"pci": "0000:1a:00.0"}  # the script pins it to its own node's CPUs
    registry.validate_params(irq.script, p)
    every = fill_params(irq.params, "ens1np0", facts, devices=["ens1np0", "ens2np0", "node0"])
    assert every["pci"].split(",")[0] == "0000:1a:00.0" and len(every["pci"].split(",")) == 2
    registry.validate_params(irq.script, every)
    # rings overflowing on two NICs: one action grows both (the NUMA node left out)
    ring = kb.get("nic_drops").remediation
    assert ring is not None and ring.script is not None
    assert fill_params(ring.params, "ens1np0", facts) == {"iface": "ens1np0", "rx": 8192}
    every = fill_params(ring.params, "ens2np0", facts, devices=["ens2np0", "node0", "ens1np0", "ens2np0"])
    assert every == {"iface": "ens2np0,ens1np0", "rx": 8192}
    registry.validate_params(ring.script, every)
    numa = kb.get("gpu_nic_numa_misplacement").remediation
    assert numa is not None
    with pytest.raises(FactError, match="process id"):
        fill_params(numa.params, "gpu3", facts)
    assert fill_params(numa.params, "gpu5", facts, {"pid": 4242}) == {"pid": 4242, "node": 1, "cpus": "16-31"}


def test_verification_spec_is_accepted_by_remediation() -> None:
    from remediation.verify import parse_spec

    kb = load_kb()
    for e in kb:
        assert e.verification is not None
        parse_spec(e.verification.spec(["gpu3"]))
    spec = kb.get("gpu_power_throttle").verification.spec(["gpu3", "gpu5"])  # type: ignore[union-attr]
    assert [f["name"] for f in spec["features"]] == ["gpu.power_limit_ratio@gpu3", "gpu.power_limit_ratio@gpu5"]


def test_matcher_memo_follows_the_frame(rec: dict[str, pl.DataFrame], matches: pl.DataFrame) -> None:
    """The references kept between calls on one features frame never leak into a call on
    another frame of the same shape: it gives what a fresh call gives."""
    import knowledge_base.matcher as matcher
    from knowledge_base.facts import FactsIndex

    kb = load_kb()
    feats, facts = rec["features"], rec["host_facts"]
    cols = [c for c in feats.columns if c.startswith("gpu.power_limit_ratio")]
    other = feats.with_columns([pl.col(c) * 0.5 for c in cols])  # same shape, other values
    match_findings(rec["findings"], feats, facts, kb)  # fills the memo with feats' references
    got = match_findings(rec["findings"], other, facts, kb)
    matcher._LAST_FRAME.clear()
    FactsIndex._last = None
    fresh = match_findings(rec["findings"], other, facts, kb)
    assert got.equals(fresh)
    assert not fresh.equals(matches)  # the other frame does change the verdicts
    assert match_findings(rec["findings"], feats, facts, kb).equals(matches)


def test_facts_index_keeps_each_hosts_latest_snapshot_between_matchings(rec, matches) -> None:
    """The index of one facts frame is reused by every matching of a sweep (its steps walk
    forward in time); between two matchings it keeps each host's latest snapshot only, so
    a fleet's snapshots do not pile up, and the verdicts stay those of a fresh index."""
    from knowledge_base.facts import FactsIndex

    kb = load_kb()
    FactsIndex._last = None
    facts = rec["host_facts"]
    first = match_findings(rec["findings"], rec["features"], facts, kb)
    assert FactsIndex._last is not None
    built = len(FactsIndex._last[2]._cache)
    index = FactsIndex.of(facts)  # (the same frame: the kept index, trimmed)
    hosts = {h for h, _ in index._cache}
    assert built > len(index._cache) == len(hosts) >= 1  # (a host had two snapshots)
    alive = {id(v) for v in index._cache.values()}
    assert all(k[1] in alive for k in index._pre)
    assert match_findings(rec["findings"], rec["features"], facts, kb).equals(first)
    assert first.equals(matches)


def test_facts_index_reads_hosts_whose_rows_are_interleaved(rec) -> None:
    """The index slices each host's rows out of the frame without a copy per host; a frame
    whose hosts' rows are not contiguous (a concat of snapshots taken fleet-wide) gives the
    same facts of every host at every time as the host-ordered one."""
    from knowledge_base.facts import FactsIndex, HostFacts

    facts = rec["host_facts"]
    assert facts["host"].n_unique() >= 2
    shuffled = facts.sort("time", "host", maintain_order=True)  # hosts interleaved snapshot by snapshot
    assert shuffled.select(pl.col("host").rle_id().max()).item() + 1 > facts["host"].n_unique()
    a, b = FactsIndex(facts), FactsIndex(shuffled)
    times = sorted(set(facts["time"].to_list()))
    for h in facts["host"].unique().to_list():
        assert a._snapshots(h) == b._snapshots(h) == sorted(set(facts.filter(pl.col("host") == h)["time"].to_list()))
        for t in (times[0], times[len(times) // 2], times[-1]):
            want = HostFacts.from_frame(facts, h, t, with_before=False).facts
            assert a.at(h, t).facts == b.at(h, t).facts == want
