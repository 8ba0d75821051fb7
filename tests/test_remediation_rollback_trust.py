"""Rollback trusts nothing in its state file: every parameter, recorded extra and recorded state
goes through the same validation as a run, and paths built from them must stay inside their
tree (no "..", no symlink out). Real files, a real forged state file, real symlinks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from remediation.queue import Queue
from tests.test_remediation_scripts import DATA, run

CG = "sys/fs/cgroup"
POD = "kubepods.slice/pod1"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dst = tmp_path / "root"
    shutil.copytree(DATA / "sysroot", dst)
    return dst


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A cgroup-looking directory outside the root's cgroup tree (what an attacker aims at)."""
    t = tmp_path / "target"
    t.mkdir()
    (t / "cpu.max").write_text("50000 100000\n")
    return t


def applied(root: Path, tmp_path: Path) -> Path:
    state = tmp_path / "c.json"
    rc, out = run("cgroup_cpu_quota", "apply", root, f"--cgroup={POD}", "--quota_us=-1", state=state)
    assert rc == 0, out
    return state


def forge(state: Path, **changes: Any) -> dict[str, Any]:
    record = json.loads(state.read_text())
    for dotted, value in changes.items():
        node = record
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    state.chmod(0o644)
    state.write_text(json.dumps(record))
    return record


def test_forged_extra_cgroup_with_dotdot_is_refused(root: Path, tmp_path: Path, target: Path) -> None:
    state = applied(root, tmp_path)
    # root/sys/fs/cgroup/../../../../target is tmp_path/target
    forge(state, extra__cgroup="../../../../target")
    assert (root / CG / "../../../../target/cpu.max").resolve() == target / "cpu.max"
    rc, out = run("cgroup_cpu_quota", "rollback", root, state=state)
    assert rc == 2, out
    assert "cgroup" in out["error"] and "../../../../target" in out["error"]
    assert (target / "cpu.max").read_text() == "50000 100000\n"
    # the real cgroup was not rolled back either: nothing half done
    assert (root / CG / POD / "cpu.max").read_text().strip() == "max 100000"


def test_forged_params_are_validated_like_a_run(root: Path, tmp_path: Path, target: Path) -> None:
    state = applied(root, tmp_path)
    forge(state, params__cgroup="../../../../target", extra__cgroup="../../../../target")
    rc, out = run("cgroup_cpu_quota", "rollback", root, state=state)
    assert rc == 2 and "parameter 'cgroup'" in out["error"], out
    assert (target / "cpu.max").read_text() == "50000 100000\n"
    # extra disagreeing with the recorded parameters is refused too
    (tmp_path / "b").mkdir()
    state2 = applied(root, tmp_path / "b")
    (root / CG / "other").mkdir()
    (root / CG / "other" / "cpu.max").write_text("1000 100000\n")
    forge(state2, extra__cgroup="other")
    rc, out = run("cgroup_cpu_quota", "rollback", root, state=state2)
    assert rc == 2 and "disagrees" in out["error"], out
    assert (root / CG / "other" / "cpu.max").read_text() == "1000 100000\n"


def test_a_symlink_out_of_the_cgroup_tree_is_refused_on_run_and_rollback(
        root: Path, tmp_path: Path, target: Path) -> None:
    (root / CG / "evil").symlink_to(target, target_is_directory=True)
    # a run through the symlink: refused before anything is recorded or written
    rc, out = run("cgroup_cpu_quota", "apply", root, "--cgroup=evil", "--quota_us=-1", state=tmp_path / "e.json")
    assert rc == 2 and "outside" in out["error"], out
    assert not (tmp_path / "e.json").exists()
    assert (target / "cpu.max").read_text() == "50000 100000\n"
    # a state file pointing a rollback at the symlink (params and extra agree): refused
    state = applied(root, tmp_path)
    forge(state, params__cgroup="evil", extra__cgroup="evil")
    rc, out = run("cgroup_cpu_quota", "rollback", root, state=state)
    assert rc == 2 and "outside" in out["error"], out
    assert (target / "cpu.max").read_text() == "50000 100000\n"


def test_a_symlinked_knob_file_is_not_written_through(root: Path, tmp_path: Path, target: Path) -> None:
    # the cgroup directory is real but its cpu.max is a link to a file outside
    cg = root / CG / "linked"
    cg.mkdir()
    (cg / "cpu.max").symlink_to(target / "cpu.max")
    rc, out = run("cgroup_cpu_quota", "apply", root, "--cgroup=linked", "--quota_us=-1", state=tmp_path / "l.json")
    assert rc != 0, out
    assert (target / "cpu.max").read_text() == "50000 100000\n"


def test_forged_recorded_state_keys_are_refused(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "g.json"
    rc, out = run("cpu_governor", "apply", root, "--governor=performance", "--cpus=1", state=state)
    assert rc == 0, out
    outside = tmp_path / "escape"
    outside.mkdir()
    (outside / "scaling_governor").write_text("powersave\n")
    record = json.loads(state.read_text())
    record["previous"] = {"../../../../../../escape": "performance"}
    state.write_text(json.dumps(record))
    rc, out = run("cpu_governor", "rollback", root, state=state)
    assert rc == 2 and "escape" in out["error"], out
    assert (outside / "scaling_governor").read_text() == "powersave\n"
    # and a recorded value that is not a governor name
    record["previous"] = {"policy1": "performance\nx"}
    state.write_text(json.dumps(record))
    rc, out = run("cpu_governor", "rollback", root, state=state)
    assert rc == 2, out


def test_executor_rollback_of_a_forged_state_fails_and_keeps_the_action(root: Path, tmp_path: Path,
                                                                       target: Path) -> None:
    from remediation.errors import RemediationError
    from remediation.executor import Executor, ExecutorConfig

    with Queue(tmp_path / "q" / "queue.db") as q:
        aid = q.propose(host="h", entry_id="cgroup_cpu_throttle", incident_id="i", script_id="cgroup_cpu_quota",
                        params={"cgroup": POD, "quota_us": -1}).id
        q.approve(aid, by="alice")
        ex = Executor(q, ExecutorConfig(root=str(root)))
        assert ex.execute(aid, actor="alice").state == "succeeded"
        forge(ex.state_path(aid), extra__cgroup="../../../../target")
        with pytest.raises(RemediationError, match="rollback of action"):
            ex.rollback(aid, actor="alice")
        assert q.get(aid).state == "succeeded"
        assert (target / "cpu.max").read_text() == "50000 100000\n"
