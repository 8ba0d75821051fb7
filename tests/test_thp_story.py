"""The research's story for real on this VM: THP off -> detected -> remediated -> verified.

Changes /sys/kernel/mm/transparent_hugepage/enabled (root) and always restores it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.thp_story import THP, _read_mode, run_story


@pytest.mark.root
@pytest.mark.slow
def test_thp_off_is_detected_matched_fixed_and_verified(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "this test flips a host knob: CI runs it as root"
    before = {k: _read_mode(k) for k in ("enabled", "defrag")}
    res = run_story(tmp_path / "lake", healthy_s=35, degraded_s=45, recovery_s=35, mib=1024)
    print(res.text())
    assert {k: _read_mode(k) for k in ("enabled", "defrag")} == before, f"{THP} not restored"
    assert res.restored
    assert res.incident is not None and res.incident["entry_id"] == "thp_coverage_loss", res.steps
    assert res.action is not None and res.action["params"]["enabled"] == before["enabled"], (
        "the remediation restores the mode the host had before the incident"
    )
    assert res.effect is not None and res.effect["verdict"] == "improved", res.effect
    # the workload's own memory lost its huge pages and got them back
    assert res.coverage["degraded"] < 0.2 < res.coverage["recovered"]
    assert res.ok
