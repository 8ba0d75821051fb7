"""Safe remediation proposals: a fix never sets the value its entry names as the fault, "before"
means before the incident's onset, and a fix whose target is already in force is not queued."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from jobs.remediations import queue_remediations
from knowledge_base import INCIDENT_SCHEMA, HostFacts, KBError, fill_params, load_entry, load_kb
from remediation.errors import FaultValueError
from remediation.queue import Queue, default_path

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
ENTRY_SRC = Path(__file__).parent.parent / "knowledge_base" / "entries" / "thp_coverage_loss.toml"


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def thp_facts(changes: list[tuple[float, str, str]], until: float = 60, host: str = "h1") -> pl.DataFrame:
    """The agent's view: every fact re-read once a minute; ``changes``: (minute, enabled, defrag)."""
    rows = []
    for minute in range(int(until) + 1):
        enabled, defrag = next((e, d) for t, e, d in reversed(changes) if t <= minute)
        rows += [(m(minute), host, "thp", "", "enabled", enabled, None),
                 (m(minute), host, "thp", "", "defrag", defrag, None)]
    return pl.DataFrame(rows, orient="row", schema={
        "time": pl.Datetime("us", "UTC"), "host": pl.String, "category": pl.String, "device": pl.String,
        "key": pl.String, "value": pl.String, "value_num": pl.Float64})


def thp_incidents(*spans: tuple[str, datetime, datetime], host: str = "h1") -> pl.DataFrame:
    base: dict[str, Any] = {c: None for c in INCIDENT_SCHEMA}
    return pl.DataFrame([
        {**base, "incident_id": iid, "host": host, "start": s, "end": e, "n_windows": 10, "status": "matched",
         "entry_id": "thp_coverage_loss", "devices": []}
        for iid, s, e in spans
    ], schema=INCIDENT_SCHEMA)


def params_of(lake: Path) -> list[dict[str, Any]]:
    with Queue(default_path(lake)) as q:
        return [a.params for a in q.actions()]


# THP switched off at 08:15, restored at 08:45, switched off again at 08:50 (a flapping config
# manager): the incident of the first episode is queued at 08:55.
FLAP = [(0, "always", "madvise"), (15, "never", "never"), (45, "always", "madvise"), (50, "never", "never")]


def test_before_means_before_the_onset_not_at_the_incident_end(tmp_path: Path) -> None:
    facts = thp_facts(FLAP, until=55)
    # the incident's last window ends 2 s after the restore: at its end, "before the latest
    # change" is `never` (what the issue saw: enabled=never defrag=never)
    inc = thp_incidents(("inc-1", m(15), m(45) + timedelta(seconds=2)))
    queue_remediations(tmp_path, inc, facts, load_kb(), now=m(55))
    assert params_of(tmp_path) == [{"enabled": "always", "defrag": "madvise"}]


def test_a_fragment_starting_inside_the_fault_restores_what_was_there_before_the_fault(tmp_path: Path) -> None:
    # the second fragment of one fault starts at 08:30, when `never` was already in force: the
    # value in force before it is the fault itself, so the one before that is restored
    facts = thp_facts(FLAP[:2], until=40)
    entry = load_kb().by_id["thp_coverage_loss"]
    assert entry.remediation is not None
    hf = HostFacts.from_frame(facts, "h1", m(40), onset=m(30))
    got = fill_params(entry.remediation.params, "", hf, fault_values=entry.remediation.fault_values)
    assert got == {"enabled": "always", "defrag": "madvise"}
    # a host configured with THP off from boot: no value other than the fault: the fallback
    boot_off = thp_facts([(0, "never", "never")], until=40)
    hf = HostFacts.from_frame(boot_off, "h1", m(40), onset=m(30))
    got = fill_params(entry.remediation.params, "", hf, fault_values=entry.remediation.fault_values)
    assert got == {"enabled": "madvise", "defrag": "madvise"}


def test_a_fix_whose_target_is_already_in_force_is_not_queued(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    facts = thp_facts(FLAP[:3], until=60)  # restored at 08:45 by someone else
    inc = thp_incidents(("inc-1", m(15), m(30)))
    with caplog.at_level(logging.INFO, logger="jobs.remediations"):
        out = queue_remediations(tmp_path, inc, facts, load_kb(), now=m(50))
    assert out.is_empty() and params_of(tmp_path) == []
    assert "already in force" in caplog.text and "inc-1" in caplog.text
    # the same incident swept while THP was still off is queued, with the mode from before
    out = queue_remediations(tmp_path, inc, facts, load_kb(), now=m(40))
    assert out.height == 1 and params_of(tmp_path) == [{"enabled": "always", "defrag": "madvise"}]


def test_the_queue_refuses_a_fault_value(tmp_path: Path) -> None:
    with Queue(default_path(tmp_path)) as q:
        with pytest.raises(FaultValueError, match=r"thp_coverage_loss.*'enabled'.*'never'.*the fault"):
            q.propose(host="h1", entry_id="thp_coverage_loss", incident_id="i", script_id="thp",
                      params={"enabled": "never", "defrag": "madvise"}, fault_values={"enabled": ["never"]})
        assert q.actions() == []
        ok = q.propose(host="h1", entry_id="thp_coverage_loss", incident_id="i", script_id="thp",
                       params={"enabled": "always"}, fault_values={"enabled": ["never"]})
        assert ok.params == {"enabled": "always"}


def test_queueing_logs_and_skips_a_proposal_that_would_set_the_fault(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # an entry whose template could fill in the fault (a {fact:...} read of the faulty knob)
    src = ENTRY_SRC.read_text().replace("{fact_before:thp.enabled|madvise}", "{fact:thp.enabled}")
    bad = tmp_path / "kb" / "thp_coverage_loss.toml"
    bad.parent.mkdir()
    bad.write_text(src)
    kb = load_kb(bad.parent)
    facts = thp_facts(FLAP[:2], until=40)
    with caplog.at_level(logging.WARNING, logger="jobs.remediations"):
        out = queue_remediations(tmp_path, thp_incidents(("inc-1", m(15), m(30))), facts, kb, now=m(40))
    assert out.is_empty() and params_of(tmp_path) == []
    assert "not queued" in caplog.text and "'never'" in caplog.text


@pytest.mark.parametrize(("old", "new", "msg"), [
    ('fault_values = { enabled = ["never"], defrag = ["never"] }', 'fault_values = { mode = ["never"] }',
     r"remediation.fault_values: unknown parameter\(s\) mode"),
    ('fault_values = { enabled = ["never"], defrag = ["never"] }', 'fault_values = { enabled = ["sometimes"] }',
     r"remediation.fault_values.enabled\[0\]: .*'sometimes' is not one of"),
    ('fault_values = { enabled = ["never"], defrag = ["never"] }', 'fault_values = { enabled = "never" }',
     r"remediation.fault_values.enabled: expected an array"),
    ("{fact_before:thp.enabled|madvise}", "{fact_before:thp.enabled|never}",
     r"remediation.params.enabled: fallback 'never' is a fault value"),
    ('"{fact_before:thp.enabled|madvise}"', '"never"',
     r"remediation.params.enabled: 'never' is a fault value"),
])
def test_fault_values_are_validated_on_load(tmp_path: Path, old: str, new: str, msg: str) -> None:
    src = ENTRY_SRC.read_text()
    assert old in src
    bad = tmp_path / "thp_coverage_loss.toml"
    bad.write_text(src.replace(old, new))
    with pytest.raises(KBError, match=msg):
        load_entry(bad)


def test_the_thp_entry_names_its_fault() -> None:
    entry = load_kb().by_id["thp_coverage_loss"]
    assert entry.remediation is not None
    assert entry.remediation.fault_values == {"enabled": ("never",), "defrag": ("never",)}


def test_the_issue_reproduction_never_proposes_thp_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's commands (simulate thp_coverage_loss, a cycle, list), swept in two cycles: to
    08:40 while THP is off (the first fragment closes: one proposal restoring always/madvise),
    then to 08:59:59, after the simulator restored THP at 08:45 (before the fix the second
    fragment was proposed with enabled=never defrag=never)."""
    from jobs.cli import main

    lake = tmp_path / "lake"
    assert main(["simulate", "--lake", str(lake), "--scenario", "thp_coverage_loss"]) == 0
    for until in ("2026-01-05T08:40:00Z", "2026-01-05T08:59:59Z"):
        assert main(["schedule", "--lake", str(lake), "--once", "--until", until, "--lag", "0s", "--no-progress"]) == 0
        assert main(["remediate", "--lake", str(lake), "list"]) == 0
        out = capsys.readouterr().out
        assert "enabled=never" not in out and "defrag=never" not in out
        assert params_of(lake) == [{"enabled": "always", "defrag": "madvise"}]


def test_a_cap_lowered_on_every_gpu_is_one_action_for_every_gpu(tmp_path: Path) -> None:
    """A power cap lowered on all 8 GPUs is one incident naming them: its action restores the
    8 GPUs its verification then checks, not the first alone (which the verification would
    fail and roll back)."""
    gpus = [f"gpu{i}" for i in range(8)]
    rows = [(m(t), "h1", "gpu", g, k, None, v) for t in range(11) for g in gpus
            for k, v in (("power_limit_w", 500.0), ("power_limit_default_w", 700.0))]
    facts = pl.DataFrame(rows, orient="row", schema={
        "time": pl.Datetime("us", "UTC"), "host": pl.String, "category": pl.String, "device": pl.String,
        "key": pl.String, "value": pl.String, "value_num": pl.Float64})
    base: dict[str, Any] = {c: None for c in INCIDENT_SCHEMA}
    inc = pl.DataFrame([{**base, "incident_id": "inc-p", "host": "h1", "start": m(2), "end": m(10), "n_windows": 480,
                         "status": "matched", "entry_id": "gpu_power_throttle", "devices": gpus}], schema=INCIDENT_SCHEMA)
    queue_remediations(tmp_path, inc, facts, load_kb(), now=m(10))
    with Queue(default_path(tmp_path)) as q:
        [a] = q.actions()
        assert a.params == {"gpu": "0,1,2,3,4,5,6,7", "limit_w": 700.0}
        assert a.verification is not None
        assert sorted(f["name"] for f in a.verification["features"]) == [f"gpu.power_limit_ratio@{g}" for g in gpus]
