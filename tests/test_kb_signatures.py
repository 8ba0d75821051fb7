"""Each knowledge-base entry matches its own simulated injection and nothing on healthy hosts.

One short simulated fleet (real simulator, real feature code): one host per injectable
inefficiency plus healthy hosts, matched with the knowledge base used as a signature
detector on every window (:func:`knowledge_base.match_windows`), so the test does not
depend on the statistical detectors' flags.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from analytics.features import compute_features
from ingest.simulator import INEFFICIENCIES, from_dict, simulate_frames
from knowledge_base import load_kb, match_windows

# severities with a footprint in the simulator (cgroup quota cuts below 0.8 stay above demand)
SEVERITY = {"cgroup_cpu_throttle": 1.0}
HEALTHY = ("healthy-a", "healthy-b", "healthy-c")
ONSET_S = 150  # slow injections (THP coverage tau 150 s) need a while to show


@pytest.fixture(scope="module")
def fleet() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    hosts = [{"name": t.replace("_", "-"), "workload": "llm_serving"} for t in INEFFICIENCIES]
    hosts += [{"name": h, "workload": "llm_serving"} for h in HEALTHY]
    doc = {"seed": 5, "duration": "6m", "hosts": hosts,
           "injections": [{"type": t, "host": t.replace("_", "-"), "start": "1m", "duration": "5m",
                           "severity": SEVERITY.get(t, 0.6)} for t in INEFFICIENCIES]}
    frames, _ = simulate_frames(from_dict(doc, name="kb-signatures"))
    facts = frames.pop("host_facts")
    labels = frames.pop("labels")
    frames.pop("workload", None)
    feats = compute_features({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
    matches = match_windows(feats, facts, load_kb()).filter(pl.col("rank") == 1)
    return feats, labels, matches


@pytest.mark.parametrize("typ", INEFFICIENCIES)
def test_entry_matches_its_own_injection(fleet: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame], typ: str) -> None:
    feats, labels, matches = fleet
    lab = labels.filter(pl.col("type") == typ).row(0, named=True)
    host = lab["host"]
    settled = feats.filter((pl.col("host") == host) & (pl.col("window_start") >= lab["time"] + timedelta(seconds=ONSET_S))
                           & (pl.col("window_end") <= lab["end"]))
    got = matches.filter(pl.col("host") == host).join(settled.select("host", "window_start"), on=["host", "window_start"])
    right = got.filter(pl.col("label_type") == typ).height
    assert right >= 0.9 * settled.height, (
        f"{typ}: {right}/{settled.height} settled windows matched; got {got.group_by('entry_id').len().rows()}")
    # before the injection nothing is matched on that host
    before = matches.filter((pl.col("host") == host) & (pl.col("window_end") <= lab["time"]))
    assert before.is_empty(), before.select("window_start", "entry_id", "explanation").rows()[:3]


def test_no_match_on_healthy_hosts(fleet: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]) -> None:
    feats, _, matches = fleet
    healthy = feats.filter(pl.col("host").is_in(HEALTHY)).height
    bad = matches.filter(pl.col("host").is_in(HEALTHY))
    assert healthy > 1000
    assert bad.is_empty(), bad.select("host", "window_start", "entry_id", "explanation").rows()[:5]


def test_every_simulated_type_has_an_entry() -> None:
    kb = load_kb()
    assert set(INEFFICIENCIES) <= {e.label_type for e in kb}
    assert len(kb) >= 12


# ------------------------------------------------------------------ onset
#: the slow-footprint types and the most seconds their entry may lag the injection's start
#: on a busy host: THP's page-fault rate jumps when the mode changes (its coverage decays
#: over minutes); a GPU losing cooling passes 75 C about 10 s before its clocks drop
ONSET_LAG_S = {"thp_coverage_loss": 5.0, "thermal_throttle": 15.0}


@pytest.fixture(scope="module")
def onset_fleet() -> tuple[pl.DataFrame, pl.DataFrame]:
    hosts = [{"name": t.replace("_", "-"), "workload": "training"} for t in ONSET_LAG_S]
    hosts += [{"name": h, "workload": "training"} for h in HEALTHY]
    doc = {"seed": 7, "duration": "4m", "hosts": hosts,
           "injections": [{"type": t, "host": t.replace("_", "-"), "start": "2m", "duration": "2m", "severity": 0.5}
                          for t in ONSET_LAG_S]}
    frames, _ = simulate_frames(from_dict(doc, name="kb-onset"))
    facts = frames.pop("host_facts")
    labels = frames.pop("labels")
    frames.pop("workload", None)
    feats = compute_features({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
    return labels, match_windows(feats, facts, load_kb()).filter(pl.col("rank") == 1)


@pytest.mark.parametrize("typ", sorted(ONSET_LAG_S))
def test_entry_matches_from_the_onset(onset_fleet: tuple[pl.DataFrame, pl.DataFrame], typ: str) -> None:
    labels, matches = onset_fleet
    lab = labels.filter(pl.col("type") == typ).row(0, named=True)
    mine = matches.filter(pl.col("host") == lab["host"])
    assert mine.filter(pl.col("window_end") <= lab["time"]).is_empty()
    right = mine.filter((pl.col("label_type") == typ) & (pl.col("window_start") >= lab["time"])
                        & (pl.col("window_start") < lab["end"]))
    assert right.height, f"{typ}: never matched"
    lag = (right["window_start"].min() - lab["time"]).total_seconds()
    assert lag <= ONSET_LAG_S[typ], f"{typ}: first right match {lag:.0f} s after the onset"
    # once matched, it stays matched to the end of the injection
    span = (lab["end"] - lab["time"]).total_seconds() - lag - 3
    assert right.height >= 0.95 * span, f"{typ}: {right.height} windows matched of ~{span:.0f}"
    assert matches.filter(pl.col("host").is_in(HEALTHY)).is_empty()
