"""The remediation queue (state machine, idempotency, restart survival, host claim, export) and
the verification verdicts."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from remediation import registry
from remediation.errors import (
    ActionNotFound,
    ParamError,
    TransitionError,
    UnknownScriptError,
    VerificationError,
)
from remediation.queue import STATES, TRANSITIONS, Queue
from remediation.verify import evaluate, parse_spec

SPEC = {
    "within_s": 120, "min_windows": 3,
    "features": [{"name": "mem.hugepage_coverage", "direction": "up", "at_least": 0.8, "min_change": 0.5}],
    "guards": [{"name": "cpu.busy_share", "direction": "down"}],
}


@pytest.fixture
def q(tmp_path: Path) -> Iterator[Queue]:
    queue = Queue(tmp_path / "_remediation" / "queue.db")
    yield queue
    queue.close()


def propose(q: Queue, host: str = "h1", incident: str = "inc-1", **kw: Any) -> int:
    args: dict[str, Any] = {"host": host, "entry_id": "thp_disabled", "incident_id": incident,
                  "script_id": "thp", "params": {"enabled": "madvise"}}
    args.update(kw)
    return q.propose(**args).id


def test_wal_mode_and_default_layout(q: Queue) -> None:
    db = sqlite3.connect(q.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert q.state_dir == q.path.parent / "state"


def test_full_path_and_audit_trail(q: Queue) -> None:
    aid = propose(q, verification=SPEC)
    assert q.get(aid).state == "proposed"
    q.approve(aid, by="alice")
    a = q.claim(worker="w1")
    assert a is not None and a.id == aid and a.state == "running" and a.claimed_by == "w1"
    q.transition(aid, "verifying", actor="w1", output={"rc": 0})
    q.transition(aid, "succeeded", actor="scheduler", effect={"verdict": "improved", "before": {"x": 0.1}, "after": {"x": 0.9}})
    q.transition(aid, "rolled_back", actor="bob")
    trail = q.audit(aid)
    assert [(e.actor, e.event) for e in trail] == [
        ("scheduler", "proposed"), ("alice", "approved"), ("w1", "running"),
        ("w1", "verifying"), ("scheduler", "succeeded"), ("bob", "rolled_back"),
    ]
    assert trail[1].details == {"from": "proposed", "to": "approved"}
    assert q.get(aid).approved_by == "alice"
    assert all(a.time_us <= b.time_us for a, b in itertools.pairwise(trail))


@pytest.mark.parametrize(("frm", "to"), [
    (f, t) for f in STATES for t in STATES if t not in TRANSITIONS[f]
])
def test_illegal_transitions_raise_and_change_nothing(tmp_path: Path, frm: str, to: str) -> None:
    with Queue(tmp_path / "q.db") as q:
        aid = propose(q)
        # Walk a legal path to ``frm``.
        path = {
            "proposed": [], "approved": ["approved"], "running": ["approved", "running"],
            "verifying": ["approved", "running", "verifying"], "succeeded": ["approved", "running", "succeeded"],
            "failed": ["approved", "running", "failed"], "rejected": ["rejected"],
            "unverifiable": ["approved", "running", "verifying", "unverifiable"],
            "rolled_back": ["approved", "running", "succeeded", "rolled_back"],
        }[frm]
        for step in path:
            q.transition(aid, step, actor="t")
        n = len(q.audit(aid))
        with pytest.raises(TransitionError, match=f"cannot go from '{frm}' to '{to}'"):
            q.transition(aid, to, actor="t")
        assert q.get(aid).state == frm and len(q.audit(aid)) == n


def test_unknown_state_and_action(q: Queue) -> None:
    aid = propose(q)
    with pytest.raises(TransitionError, match="unknown state"):
        q.transition(aid, "done", actor="t")
    with pytest.raises(ActionNotFound, match="no remediation action 999"):
        q.get(999)


def test_idempotency_key_never_queues_twice(q: Queue) -> None:
    a = propose(q)
    q.approve(a, by="alice")
    # The same sweep again, even with other params: the existing action comes back untouched.
    again = q.propose(host="h1", entry_id="thp_disabled", incident_id="inc-1", script_id="thp",
                      params={"enabled": "always"})
    assert again.id == a and again.state == "approved" and again.params == {"enabled": "madvise"}
    assert len(q.actions()) == 1
    assert propose(q, incident="inc-2") != a
    assert propose(q, host="h2") != a
    assert len(q.actions()) == 3


def test_restart_survival(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    q1 = Queue(path)
    aid = propose(q1, verification=SPEC)
    q1.approve(aid, by="alice")
    q1.close()
    q2 = Queue(path)
    a = q2.get(aid)
    assert a.state == "approved" and a.approved_by == "alice"
    assert a.verification is not None and a.verification["features"][0]["name"] == "mem.hugepage_coverage"
    assert [e.event for e in q2.audit(aid)] == ["proposed", "approved"]
    assert propose(q2) == aid  # idempotency survives too
    q2.close()


def test_claim_one_action_per_host(q: Queue) -> None:
    a1, a2 = propose(q, incident="i1"), propose(q, incident="i2")
    b1 = propose(q, host="h2", incident="i1")
    for a in (a1, a2, b1):
        q.approve(a, by="t")
    first = q.claim(worker="w1")
    assert first is not None and first.id == a1
    second = q.claim(worker="w2")
    assert second is not None and second.id == b1  # h1 is busy: h2's action comes next
    assert q.claim(worker="w3") is None
    q.transition(a1, "verifying", actor="w1")
    assert q.claim(worker="w3") is None  # verifying still holds the host
    q.transition(a1, "succeeded", actor="w1")
    third = q.claim(worker="w3")
    assert third is not None and third.id == a2


def test_propose_validates_against_allowlist(q: Queue) -> None:
    with pytest.raises(UnknownScriptError, match="not in the remediation allowlist"):
        propose(q, script_id="rm_rf")
    with pytest.raises(UnknownScriptError, match="not a valid id"):
        propose(q, script_id="../thp")
    with pytest.raises(UnknownScriptError, match="manual"):
        propose(q, script_id="pcie_link_retrain")  # manual-only: never runnable
    with pytest.raises(ParamError, match="forbidden character"):
        propose(q, params={"enabled": "never; reboot"})
    with pytest.raises(ParamError, match="unknown parameter"):
        propose(q, params={"enabled": "never", "shell": "true"})
    with pytest.raises(VerificationError, match=r"features\[0\].direction"):
        propose(q, verification={"features": [{"name": "x", "direction": "sideways"}]})
    assert q.actions() == []


def test_to_frame_is_the_remediations_table(q: Queue) -> None:
    assert q.to_frame().height == 0
    aid = propose(q, verification=SPEC)
    propose(q, incident="other")
    q.approve(aid, by="alice")
    q.claim(worker="w")
    q.transition(aid, "verifying", actor="w")
    q.transition(aid, "succeeded", actor="scheduler",
                 effect={"verdict": "improved", "before": {"mem.hugepage_coverage": 0.1},
                         "after": {"mem.hugepage_coverage": 0.9}})
    df = q.to_frame()
    assert df.height == 2
    assert df.schema["created"] == pl.Datetime("us", "UTC")
    row = df.filter(pl.col("action_id") == aid).row(0, named=True)
    assert row["state"] == "succeeded" and row["approved_by"] == "alice" and row["verdict"] == "improved"
    assert row["params"] == '{"enabled": "madvise"}'
    assert row["effect_after"] == '{"mem.hugepage_coverage": 0.9}'
    assert row["started"] is not None and row["finished"] is not None
    other = df.filter(pl.col("action_id") != aid).row(0, named=True)
    assert other["state"] == "proposed" and other["finished"] is None and other["verdict"] is None


# ---- registry -----------------------------------------------------------------------------------

def test_registry_contract() -> None:
    assert {"thp", "irq_affinity", "numa_rebind", "gpu_power_limit", "cpu_governor",
            "cgroup_cpu_quota", "nic_ring"} <= set(registry.SCRIPTS)
    assert {k for k, s in registry.SCRIPTS.items() if s.safe_for_auto} == {"thp", "irq_affinity", "cpu_governor"}
    for spec in registry.SCRIPTS.values():
        assert spec.module == f"remediation.scripts.{spec.id}"
        assert (Path(registry.__file__).parent / "scripts" / f"{spec.id}.py").is_file()
    assert registry.validate_params("numa_rebind", {"pid": "42", "node": 1}) == {
        "pid": 42, "node": 1, "migrate_memory": True}
    assert registry.to_argv("cgroup_cpu_quota", {"cgroup": "a/b", "quota_us": -1}) == [
        "--cgroup=a/b", "--quota_us=-1"]
    for bad in ({"pid": 0, "node": 0}, {"pid": 1.5, "node": 0}, {"pid": True, "node": 0}, {"node": 0}):
        with pytest.raises(ParamError):
            registry.validate_params("numa_rebind", bad)
    with pytest.raises(ParamError, match="runs backwards"):
        registry.validate_params("irq_affinity", {"pci": "0000:3b:00.0", "cpus": "7-3"})


# ---- verification -------------------------------------------------------------------------------

def frame(cov: list[float], busy: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"mem.hugepage_coverage": cov, "cpu.busy_share": busy})


def test_verdicts() -> None:
    spec = parse_spec(SPEC)
    before = frame([0.10, 0.12, 0.11, 0.9], [0.5, 0.5, 0.5, 0.5])  # one stray window: median ignores it
    e = evaluate(spec, before, frame([0.85, 0.9, 0.88], [0.5, 0.49, 0.5]))
    assert e["verdict"] == "improved"
    assert e["before"]["mem.hugepage_coverage"] == pytest.approx(0.115)
    assert e["after"]["mem.hugepage_coverage"] == pytest.approx(0.88)
    assert e["features"][0]["improved"] and not e["guards"][0]["regressed"]
    assert evaluate(spec, before, frame([0.12, 0.11, 0.13], [0.5] * 3))["verdict"] == "not_improved"
    # Coverage is back but the guard got 20 % worse: a new regression.
    assert evaluate(spec, before, frame([0.9] * 3, [0.6] * 3))["verdict"] == "regressed"
    assert evaluate(spec, before, frame([0.05] * 3, [0.5] * 3))["verdict"] == "regressed"


def test_relative_change_alone_and_long_frames() -> None:
    spec = parse_spec({"min_windows": 1, "features": [{"name": "lat", "direction": "down", "min_change": 0.3}]})
    long_b = pl.DataFrame({"feature": ["lat"] * 3, "value": [10.0, 11.0, 12.0]})
    assert evaluate(spec, long_b, pl.DataFrame({"feature": ["lat"], "value": [7.0]}))["verdict"] == "improved"
    assert evaluate(spec, long_b, pl.DataFrame({"feature": ["lat"], "value": [9.0]}))["verdict"] == "not_improved"


def test_verification_input_errors() -> None:
    spec = parse_spec(SPEC)
    before = frame([0.1] * 3, [0.5] * 3)
    with pytest.raises(VerificationError, match="only 2 window"):
        evaluate(spec, before, frame([0.9] * 2, [0.5] * 2))
    with pytest.raises(VerificationError, match="lack feature column.*cpu.busy_share"):
        evaluate(spec, before, pl.DataFrame({"mem.hugepage_coverage": [0.9] * 3}))
    cases: list[tuple[dict[str, Any], str]] = [({}, "features"), ({"features": [{"name": "x", "direction": "up"}], "min_windows": 0}, "min_windows"),
                       ({"features": [{"name": "x", "direction": "up", "at_least": "high"}]}, "at_least"),
                       ({"features": [], "extra": 1}, "unknown key")]
    for bad, where in cases:
        with pytest.raises(VerificationError, match=where):
            parse_spec(bad)


def test_remediate_on_a_lake_without_a_queue_creates_nothing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # `unveil remediate --lake TYPO show 1` used to create TYPO/_remediation/queue.db
    from jobs.cli import main

    typo = tmp_path / "typo"
    for verb in (["show", "1"], ["list"]):  # a lake that does not exist: an error, as everywhere
        assert main(["remediate", "--lake", str(typo), *verb]) == 2
        assert f"lake root {typo} does not exist" in capsys.readouterr().err
    assert not typo.exists()
    lake = tmp_path / "lake"  # a lake where nothing was proposed yet
    lake.mkdir()
    assert main(["remediate", "--lake", str(lake), "show", "1"]) == 2
    assert "no remediation queue at" in capsys.readouterr().err
    assert main(["remediate", "--lake", str(lake), "list"]) == 0
    assert "nothing has been proposed" in capsys.readouterr().out
    assert sorted(lake.iterdir()) == []
