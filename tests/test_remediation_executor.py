"""The executor: dry run, execute, failure and timeout handling, rollback, the allowlist, auto mode,
verification, two real executor processes, and the CLI. Scripts act on a temporary copy of
recorded /sys files (``root``), compared through the scripts' own read (see test_remediation_scripts)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from jobs import cli
from remediation.errors import ParamError, RemediationError, TransitionError, UnknownScriptError
from remediation.executor import Executor, ExecutorConfig
from remediation.queue import Queue
from remediation.scripts import thp
from remediation.scripts._base import Context
from remediation.verify import verify_action

DATA = Path(__file__).parent / "data" / "remediation"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
SPEC = {"min_windows": 2, "features": [{"name": "mem.hugepage_coverage", "direction": "up", "min_change": 0.5}]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dst = tmp_path / "root"
    shutil.copytree(DATA / "sysroot", dst)
    return dst


@pytest.fixture
def q(tmp_path: Path) -> Iterator[Queue]:
    queue = Queue(tmp_path / "lake" / "_remediation" / "queue.db")
    yield queue
    queue.close()


def state(root: Path) -> dict:
    return thp.read(Context(root), {})


def approved(q: Queue, params: dict | None = None, incident: str = "inc-1", host: str = "h1",
             entry: str = "thp_off", **kw: Any) -> int:
    a = q.propose(host=host, entry_id=entry, incident_id=incident, script_id="thp",
                  params=params or {"enabled": "never"}, **kw)
    q.approve(a.id, by="alice")
    return a.id


def test_dry_run_records_command_and_plan_and_changes_nothing(q: Queue, root: Path) -> None:
    ex = Executor(q, ExecutorConfig(root=str(root)))
    aid = q.propose(host="h1", entry_id="thp_off", incident_id="i", script_id="thp", params={"enabled": "never"}).id
    files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    res = ex.dry_run(aid, actor="alice")  # allowed before approval: it changes nothing
    assert res.ok and res.result["changes"] == {"enabled": ["madvise", "never"]}
    assert res.argv == [sys.executable, "-m", "remediation.scripts.thp", "check", "--root", str(root), "--enabled=never"]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == files
    assert not ex.state_path(aid).exists()
    ev = q.audit(aid)[-1]
    assert ev.event == "dry_run" and ev.actor == "alice"
    assert ev.details["would_run"][3] == "apply" and "--enabled=never" in ev.details["would_run"]
    assert q.get(aid).state == "proposed"


def test_execute_then_rollback(q: Queue, root: Path) -> None:
    ex = Executor(q, ExecutorConfig(root=str(root)))
    original = state(root)
    aid = approved(q)
    a = ex.execute(aid, actor="alice")
    assert a.state == "succeeded" and a.executed
    assert state(root)["enabled"] == "never"
    assert json.loads(ex.state_path(aid).read_text())["previous"] == original
    applied = [e for e in q.audit(aid) if e.event == "applied"][0]
    assert applied.details["returncode"] == 0 and '"ok": true' in applied.details["stdout"]
    ex.rollback(aid, actor="bob")
    assert q.get(aid).state == "rolled_back" and state(root) == original
    with pytest.raises(TransitionError):
        ex.execute(aid, actor="alice")


def test_execute_needs_approval(q: Queue, root: Path) -> None:
    ex = Executor(q, ExecutorConfig(root=str(root)))
    aid = q.propose(host="h1", entry_id="e", incident_id="i", script_id="thp", params={"enabled": "never"}).id
    with pytest.raises(TransitionError, match="only approved actions run"):
        ex.execute(aid, actor="alice")
    assert state(root)["enabled"] == "madvise"


def test_script_failure_leaves_action_failed_and_host_unchanged(q: Queue, root: Path) -> None:
    assert os.geteuid() == 0 and shutil.which("chattr"), "needs root and chattr to make a file refuse root's writes"
    ex = Executor(q, ExecutorConfig(root=str(root)))
    original = state(root)
    aid = approved(q, {"enabled": "never", "defrag": "never"})
    defrag = root / THP_DIR / "defrag"
    subprocess.run(["chattr", "+i", str(defrag)], check=True)
    try:
        a = ex.execute(aid, actor="alice")
    finally:
        subprocess.run(["chattr", "-i", str(defrag)], check=True)
    assert a.state == "failed"
    assert a.output is not None and a.output["returncode"] == 1
    assert a.output["result"]["restored"] is True and "defrag" in a.output["result"]["error"]
    assert q.audit(aid)[-1].event == "apply_failed"
    assert state(root) == original


def test_timeout_before_any_change(q: Queue, root: Path) -> None:
    """The script blocks reading a knob (a FIFO nobody writes): killed, failed, host untouched."""
    defrag = root / THP_DIR / "defrag"
    defrag.unlink()
    os.mkfifo(defrag)
    ex = Executor(q, ExecutorConfig(root=str(root), timeout_s=1.0))
    aid = approved(q)
    t0 = time.monotonic()
    a = ex.execute(aid, actor="alice")
    assert time.monotonic() - t0 < 10
    assert a.state == "failed" and a.output is not None and a.output["timed_out"] is True
    assert q.audit(aid)[-1].event == "timeout"
    assert not ex.state_path(aid).exists()
    assert (root / THP_DIR / "enabled").read_text().strip() == "always [madvise] never"


def test_timeout_midway_is_restored_from_the_recorded_state(q: Queue, root: Path) -> None:
    """enabled is changed, then the write to defrag hangs (FIFO without a reader); the executor
    kills the script's process group and runs its rollback from the state file."""
    defrag = root / THP_DIR / "defrag"
    original_text = defrag.read_text()
    defrag.unlink()
    os.mkfifo(defrag)
    original = {"enabled": "madvise", "defrag": "madvise"}
    ex = Executor(q, ExecutorConfig(root=str(root), timeout_s=3.0))
    aid = approved(q, {"enabled": "never", "defrag": "never"})

    def kernel() -> None:
        with open(defrag, "w") as fh:  # serve the script's one read of defrag
            fh.write(original_text)
        deadline = time.monotonic() + 10
        while not ex.state_path(aid).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.0)  # the script is now blocked opening the FIFO for writing
        tmp = defrag.with_name(".defrag")
        tmp.write_text(original_text)
        os.replace(tmp, defrag)  # later opens (the rollback) get a plain file

    feeder = threading.Thread(target=kernel)
    feeder.start()
    a = ex.execute(aid, actor="alice")
    feeder.join()
    assert a.state == "failed" and a.output is not None and a.output["timed_out"] is True
    assert a.output["restore"]["returncode"] == 0, a.output["restore"]
    assert state(root) == original


def test_allowlist_whatever_the_knowledge_base_says(q: Queue, root: Path, tmp_path: Path) -> None:
    ex = Executor(q, ExecutorConfig(root=str(root)))
    canary = tmp_path / "pwned"
    kb_says = [
        ("rm_rf", {}), ("../../tmp/evil", {}), ("thp.__main__", {}), ("_base", {}), ("os", {}),
        ("thp", {"enabled": f"never; touch {canary}"}), ("thp", {"enabled": f"$(touch {canary})"}),
        ("thp", {"enabled": "never", "extra": "--root=/"}), ("irq_affinity", {"pci": "../../../etc"}),
    ]
    for script_id, params in kb_says:
        with pytest.raises((UnknownScriptError, ParamError)):
            q.propose(host="h1", entry_id="kb", incident_id=script_id + str(params), script_id=script_id, params=params)
    assert q.actions() == []
    # Rows forged straight into the database (bypassing propose) are refused by the executor.
    db = sqlite3.connect(q.path)
    for i, (script_id, params) in enumerate(kb_says[:2] + kb_says[5:6]):
        db.execute("INSERT INTO actions (host, entry_id, incident_id, script_id, params, mode, state, created_us,"
                   " updated_us) VALUES (?, 'kb', ?, ?, ?, 'manual', 'approved', 0, 0)",
                   (f"forged{i}", str(i), script_id, json.dumps(params)))
    db.commit()
    db.close()
    for a in q.actions():
        with pytest.raises((UnknownScriptError, ParamError)):
            ex.execute(a.id, actor="alice")
    ran = [ex.run_next() for _ in range(3)]
    assert all(a is not None and a.state == "failed" and not a.executed for a in ran)
    assert all(q.audit(a.id)[-1].event == "refused" for a in ran if a)
    assert not canary.exists() and state(root)["enabled"] == "madvise"


def test_auto_mode_only_when_enabled_and_safe(q: Queue, root: Path) -> None:
    auto = q.propose(host="h1", entry_id="e1", incident_id="i", script_id="thp", params={"enabled": "never"}, mode="auto").id
    manual = q.propose(host="h2", entry_id="e1", incident_id="i", script_id="thp", params={"enabled": "never"}).id
    unsafe = q.propose(host="h3", entry_id="e2", incident_id="i", script_id="cgroup_cpu_quota",
                       params={"cgroup": "kubepods.slice/pod1", "quota_us": -1}, mode="auto").id
    assert Executor(q, ExecutorConfig(root=str(root))).auto_run() == []  # auto_remediate = false
    assert {q.get(i).state for i in (auto, manual, unsafe)} == {"proposed"}
    ran = Executor(q, ExecutorConfig(root=str(root), auto_remediate=True)).auto_run()
    assert [a.id for a in ran] == [auto] and ran[0].state == "succeeded"
    assert q.get(auto).approved_by == "auto"
    assert q.get(manual).state == "proposed" and q.get(unsafe).state == "proposed"
    assert (root / "sys/fs/cgroup/kubepods.slice/pod1/cpu.max").read_text().strip() == "50000 100000"


def test_verification_success_and_failure_with_rollback(q: Queue, root: Path) -> None:
    ex = Executor(q, ExecutorConfig(root=str(root)))
    before = pl.DataFrame({"mem.hugepage_coverage": [0.1, 0.12, 0.11]})
    good = approved(q, {"enabled": "always"}, incident="good", verification=SPEC)
    assert ex.execute(good, actor="alice").state == "verifying"
    # The host is held while its action is being verified.
    bad = approved(q, {"enabled": "never"}, incident="bad", verification=SPEC)
    with pytest.raises(TransitionError, match="busy"):
        ex.execute(bad, actor="alice")
    effect = verify_action(ex, good, before, pl.DataFrame({"mem.hugepage_coverage": [0.9, 0.95]}))
    assert effect["verdict"] == "improved" and q.get(good).state == "succeeded"
    assert (q.get(good).effect or {})["after"] == {"mem.hugepage_coverage": pytest.approx(0.925)}
    assert state(root)["enabled"] == "always"
    assert ex.execute(bad, actor="alice").state == "verifying"
    assert state(root)["enabled"] == "never"
    effect = verify_action(ex, bad, before, pl.DataFrame({"mem.hugepage_coverage": [0.02, 0.03]}))
    assert effect["verdict"] == "regressed"
    a = q.get(bad)
    assert a.state == "failed" and a.effect is not None and a.effect["verdict"] == "regressed"
    assert state(root)["enabled"] == "always"  # rolled back to what it was before "bad"
    assert [e.event for e in q.audit(bad)][-2:] == ["verification_failed", "rolled_back"]
    df = q.to_frame()
    assert df.filter(pl.col("action_id") == bad)["verdict"].item() == "regressed"


def test_two_executor_processes_never_share_a_host(q: Queue, root: Path, tmp_path: Path) -> None:
    # Both "hosts" share one test root, so each must touch its own files (THP on h1, cpufreq
    # on h2): two hosts writing one file would race each other's read-back check.
    ids = []
    for i in range(6):
        ids.append(approved(q, {"enabled": "always" if i % 2 else "never"}, incident=f"i{i}", host="h1"))
        a = q.propose(host="h2", entry_id="governor", incident_id=f"i{i}", script_id="cpu_governor",
                      params={"governor": "performance" if i % 2 else "powersave"})
        q.approve(a.id, by="alice")
        ids.append(a.id)
    go = tmp_path / "go"
    worker = DATA / "worker.py"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = [subprocess.Popen([sys.executable, str(worker), str(q.path), str(root), str(go), f"w{i}"], env=env)
             for i in range(2)]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    actions = [q.get(i) for i in ids]
    assert all(a.state == "succeeded" for a in actions), [(a.state, [(e.event, e.details) for e in q.audit(a.id)][-1]) for a in actions if a.state != "succeeded"]
    assert {a.claimed_by for a in actions} == {"w0", "w1"}  # both processes really worked
    spans: dict[str, list[tuple[int, int]]] = {"h1": [], "h2": []}
    for a in actions:
        trail = q.audit(a.id)
        starts = [e.time_us for e in trail if e.event == "running"]
        assert len(starts) == 1  # claimed exactly once
        end = next(e.time_us for e in trail if e.event == "applied")
        spans[a.host].append((starts[0], end))
    for host, iv in spans.items():
        iv.sort()
        for (_, e1), (s2, _) in zip(iv, iv[1:], strict=False):
            assert e1 <= s2, f"two actions ran at once on {host}"


def test_cli_flow(q: Queue, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "unveil.toml"
    cfg.write_text(f'[remediation]\nroot = "{root}"\nqueue = "{q.path}"\n')
    aid = q.propose(host="h1", entry_id="thp_off", incident_id="i", script_id="thp", params={"enabled": "never"}).id

    def unveil(*args: str) -> tuple[int, str]:
        rc = cli.main(["--config", str(cfg), "remediate", *args])
        return rc, capsys.readouterr().out

    rc, out = unveil("list")
    assert rc == 0 and "thp enabled=never" in out and "proposed" in out
    rc, out = unveil("run", str(aid))
    assert rc == 0 and "DRY RUN" in out and "--enabled=never" in out
    assert state(root)["enabled"] == "madvise"
    assert cli.main(["--config", str(cfg), "remediate", "run", str(aid), "--execute"]) == 2  # not approved
    capsys.readouterr()
    assert unveil("approve", str(aid), "--by", "carol")[0] == 0
    rc, out = unveil("run", str(aid), "--execute")
    assert rc == 0 and "succeeded" in out and state(root)["enabled"] == "never"
    rc, out = unveil("rollback", str(aid))
    assert rc == 0 and state(root)["enabled"] == "madvise"
    rc, out = unveil("show", str(aid))
    assert "carol" in out and "rolled_back" in out and "dry_run" in out
    assert cli.main(["--config", str(cfg), "remediate", "show", "999"]) == 2


def test_config_errors_name_the_key(q: Queue) -> None:
    with pytest.raises(ValueError, match="auto_remediate"):
        ExecutorConfig.from_mapping({"auto_remediate": "yes"})
    with pytest.raises(ValueError, match="unknown key"):
        ExecutorConfig.from_mapping({"auto": True})
    aid = q.propose(host="h", entry_id="e", incident_id="i", script_id="thp", params={"enabled": "never"}).id
    with pytest.raises(RemediationError, match="unknown verb"):
        Executor(q).command(q.get(aid), "destroy")


def test_an_old_proposal_that_sets_the_fault_is_refused(q: Queue, root: Path) -> None:
    # Queued before proposals were checked against the entry's fault values: THP "never" is
    # the fault thp_coverage_loss is for (fault_values.enabled in its entry).
    from remediation.errors import FaultValueError

    ex = Executor(q, ExecutorConfig(root=str(root)))
    aid = approved(q, {"enabled": "never"}, incident="inc-old", entry="thp_coverage_loss")  # no fault_values given
    with pytest.raises(FaultValueError, match=r"action \d+ \(thp_coverage_loss on h1\): thp parameter 'enabled' = "
                                              r"'never' is the fault .*fault_values\.enabled.*refused"):
        ex.execute(aid, actor="alice")
    assert q.get(aid).state == "approved" and state(root)["enabled"] == "madvise"
    with pytest.raises(FaultValueError):
        ex.dry_run(aid, actor="alice")
    # the unattended path takes it out of the queue: failed, refused, never executed
    a = ex.run_next()
    assert a is not None and a.id == aid and a.state == "failed" and not a.executed
    ev = q.audit(aid)[-1]
    assert ev.event == "refused" and "is the fault" in ev.details["error"]
    assert state(root)["enabled"] == "madvise" and not ex.state_path(aid).exists()
    # a fix of the same entry that does not set the fault still runs
    ok = approved(q, {"enabled": "always"}, incident="inc-new", entry="thp_coverage_loss")
    assert ex.execute(ok, actor="alice").state == "succeeded" and state(root)["enabled"] == "always"


def test_fault_values_come_from_the_given_lookup(q: Queue, root: Path) -> None:
    from remediation.errors import FaultValueError

    ex = Executor(q, ExecutorConfig(root=str(root)), fault_values=lambda entry: {"enabled": ["always"]})
    aid = approved(q, {"enabled": "always"})
    with pytest.raises(FaultValueError, match="'always' is the fault"):
        ex.execute(aid, actor="alice")

    def broken(entry: str) -> dict[str, list[str]]:
        raise ValueError("knowledge base unreadable")

    ex = Executor(q, ExecutorConfig(root=str(root)), fault_values=broken)
    a = ex.run_next()  # cannot check: refused (fails closed), the host untouched
    assert a is not None and a.state == "failed" and "knowledge base unreadable" in q.audit(a.id)[-1].details["error"]
    assert state(root)["enabled"] == "madvise"
