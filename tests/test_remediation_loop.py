"""The remediation loop on simulated lake data: the scheduler concludes verifications
(succeeded / failed and rolled back / unverifiable), by hand too."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from ingest import lake
from jobs import query
from jobs.config import SweepConfig
from jobs.cycle import run_cycle
from jobs.report import write_report
from knowledge_base import load_kb
from remediation.executor import Executor, ExecutorConfig
from remediation.queue import Queue, default_path
from remediation.scripts import thp
from remediation.scripts._base import Context
from tests.test_remediation_scripts import DATA

# sim-00: THP off from minute 5 to minute 20 (the fix at minute 20 "works": coverage recovers);
# sim-01: THP off from minute 5 to the end (a fix at minute 20 changes nothing the data shows)
SCENARIO = """
name = "verify"
seed = 3
start = "{start}"
duration = "32m"

[[hosts]]
name = "sim-00"
workload = "llm_serving"

[[hosts]]
name = "sim-01"
workload = "llm_serving"

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "5m"
duration = "15m"
severity = 0.8

[[injections]]
type = "thp_coverage_loss"
host = "sim-01"
start = "5m"
duration = "27m"
severity = 0.8
"""


@dataclass
class World:
    lake: Path
    root: Path  # the fake /sys the thp script acts on
    start: datetime
    queue: Path


def _start(minutes_ago: int) -> datetime:
    """The start of a simulated lake whose minute ``minutes_ago`` is now (within 30 s), at
    second 30 of a minute: a sweep's horizon is a whole minute, so a fault the simulator ends at
    a whole minute of its run never ends exactly at the horizon (when it did, about one run in
    sixty, the host's facts at the horizon already showed the fix and nothing was proposed)."""
    return (datetime.now(UTC) - timedelta(minutes=minutes_ago)).replace(second=30, microsecond=0)


@pytest.fixture(scope="module")
def sim_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, datetime]:
    """One simulated lake whose minute 20 is now (the applies below happen now): 2 hosts x 32 min."""
    from jobs.cli import main

    start = _start(minutes_ago=20)
    d = tmp_path_factory.mktemp("sim")
    scenario = d / "verify.toml"
    scenario.write_text(SCENARIO.format(start=start.strftime("%Y-%m-%dT%H:%M:%SZ")))
    lake = d / "lake"
    assert main(["simulate", "--lake", str(lake), "--scenario", str(scenario)]) == 0
    return lake, start


@pytest.fixture
def world(sim_template: tuple[Path, datetime], tmp_path: Path) -> Iterator[World]:
    lake = tmp_path / "lake"
    shutil.copytree(sim_template[0], lake)
    root = tmp_path / "root"
    shutil.copytree(DATA / "sysroot", root)
    yield World(lake, root, sim_template[1], default_path(lake))


def thp_spec() -> dict:
    entry = load_kb().by_id["thp_coverage_loss"]
    assert entry.verification is not None
    return entry.verification.spec([])


def applied(w: World, host: str, params: dict, incident: str = "inc-1") -> int:
    with Queue(w.queue) as q:
        a = q.propose(host=host, entry_id="thp_coverage_loss", incident_id=incident, script_id="thp",
                      params=params, mode="auto", verification=thp_spec())
        q.approve(a.id, by="alice")
        done = Executor(q, ExecutorConfig(root=str(w.root))).execute(a.id, actor="alice")
        assert done.state == "verifying", done.output
        return a.id


def cfg(w: World) -> SweepConfig:
    return SweepConfig(lag=timedelta(0), queue_remediations=False, remediation_root=str(w.root))


def test_the_scheduler_concludes_verifications(world: World) -> None:
    w = world
    assert thp.read(Context(w.root), {})["enabled"] == "madvise"
    ok = applied(w, "sim-00", {"enabled": "always"})
    bad = applied(w, "sim-01", {"enabled": "madvise"})  # recorded before: always (set by `ok`)
    ghost = applied(w, "ghost", {"enabled": "madvise"})  # a host with no telemetry at all
    assert thp.read(Context(w.root), {})["enabled"] == "madvise"
    end = w.start + timedelta(minutes=32)
    # a cycle before anything is due: the sweeps run, nothing is judged yet
    early = run_cycle(w.lake, cfg(w), now=datetime.now(UTC), until=end)
    assert early is not None and early.verifications == {}
    with Queue(w.queue) as q:
        assert [q.get(i).state for i in (ok, bad, ghost)] == ["verifying"] * 3
    # 10 min after the applies (within_s = 600) plus the grace for late data
    later = datetime.now(UTC) + timedelta(seconds=600 + 301)
    s = run_cycle(w.lake, cfg(w), now=later, until=end)
    assert s is not None and s.verifications == {"succeeded": 1, "failed": 1, "unverifiable": 1}
    with Queue(w.queue) as q:
        a, b, g = (q.get(i) for i in (ok, bad, ghost))
        assert (a.state, a.effect and a.effect["verdict"]) == ("succeeded", "improved")
        assert a.effect["after"]["mem.hugepage_coverage"] > a.effect["before"]["mem.hugepage_coverage"] + 0.05
        assert b.state == "failed" and b.effect and b.effect["verdict"] != "improved"
        assert [e.event for e in q.audit(bad)][-2:] == ["verification_failed", "rolled_back"]
        assert g.state == "unverifiable"
        assert "cannot be evaluated" in q.audit(ghost)[-1].details["reason"]
        # the host is free again: nothing holds it
        assert not q.actions(state="verifying")
    # the failed fix was rolled back on the host: the `ok` fix's mode is back
    assert thp.read(Context(w.root), {})["enabled"] == "always"
    # the remediations table followed the queue, and shows each fix's measured effect
    assert s.remediation_rows == 3
    effects = query.run_query(w.lake, "remediation-effects").sort("action_id")
    assert effects["action_id"].to_list() == [ok, bad, ghost]
    assert effects["state"].to_list() == ["succeeded", "failed", "unverifiable"]
    assert effects["verdict"].to_list()[0] == "improved"
    before, after = (json.loads(effects[c][0]) for c in ("effect_before", "effect_after"))
    assert after["mem.hugepage_coverage"] > before["mem.hugepage_coverage"]
    # a cycle with nothing new appends nothing; the lake keeps the history of every change
    s = run_cycle(w.lake, cfg(w), now=later, until=end)
    assert s is not None and s.remediation_rows == 0
    history = lake.read(w.lake, "remediations").filter(pl.col("action_id") == ok).sort("updated")
    assert history["state"].to_list()[-2:] == ["verifying", "succeeded"]
    # and the report shows the effect
    html = w.lake.parent / "report.html"
    shutil.rmtree(default_path(w.lake).parent)  # the report then reads the lake's table
    summary = write_report(w.lake, html)
    assert summary.remediations == {"succeeded": 1, "failed": 1, "unverifiable": 1}
    text = html.read_text()
    assert "mem.hugepage_coverage: " in text and "improved" in text


def test_remediate_verify_by_hand(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    w = world
    ok = applied(w, "sim-00", {"enabled": "always"})
    # swept to 30 s before the verification is due: the cycle leaves it alone
    s = run_cycle(w.lake, cfg(w), now=datetime.now(UTC) + timedelta(seconds=570),
                  until=w.start + timedelta(minutes=32))
    assert s is not None and s.verifications == {}
    # by hand, before the cycle would: judged now from what the lake has
    config = w.lake.parent / "unveil.toml"
    config.write_text(f'[remediation]\nroot = "{w.root}"\n')
    assert main(["--config", str(config), "remediate", "--lake", str(w.lake), "verify", str(ok)]) == 0
    out = capsys.readouterr().out
    assert f"action {ok}: succeeded (verdict improved)" in out
    with Queue(w.queue) as q:
        assert q.get(ok).state == "succeeded"


# sim-00: THP off from minute 5 to 17 (the fix "lands" at 17, when the simulator restores it),
# and again from minute 35 to the end; sim-01 healthy (the cohort). Incidents are cut every
# 5 minutes, so each episode arrives in fragments.
RECURRING = """
name = "recurring"
seed = 5
start = "{start}"
duration = "52m"

[[hosts]]
name = "sim-00"
workload = "llm_serving"

[[hosts]]
name = "sim-01"
workload = "llm_serving"

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "5m"
duration = "12m"
severity = 0.8

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "35m"
duration = "17m"
severity = 0.8
"""


def _thp_off_world(tmp_path: Path, scenario_text: str, minutes_ago: int) -> tuple[datetime, Path, Path]:
    """A lake simulated from ``scenario_text`` whose minute ``minutes_ago`` is now, and a fake
    /sys with THP ``never`` (what the faults left on the host): (start, lake, sysroot)."""
    from jobs.cli import main

    start = _start(minutes_ago)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(scenario_text.format(start=start.strftime("%Y-%m-%dT%H:%M:%SZ")))
    lk = tmp_path / "lake"
    assert main(["simulate", "--lake", str(lk), "--scenario", str(scenario)]) == 0
    root = tmp_path / "root"
    shutil.copytree(DATA / "sysroot", root)
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("always madvise [never]\n")
    return start, lk, root


def test_one_proposal_per_cause_and_a_returning_fault_is_linked(tmp_path: Path) -> None:
    start, lake, root = _thp_off_world(tmp_path, RECURRING, 17)
    c = SweepConfig(lag=timedelta(0), max_incident=timedelta(minutes=5), remediation_root=str(root))
    at = lambda minutes: start + timedelta(minutes=minutes)  # noqa: E731
    qpath = default_path(lake)

    # cycle 1 (to minute 12, THP still off): the first fragment is proposed
    assert run_cycle(lake, c, now=at(12)) is not None
    with Queue(qpath) as q:
        [first] = q.actions()
        assert (first.host, first.state, first.params) == ("sim-00", "proposed", {"enabled": "always", "defrag": "madvise"})
        # the fix, now (= minute 17 of the data)
        q.approve(first.id, by="alice")
        assert Executor(q, ExecutorConfig(root=str(root))).execute(first.id, actor="alice").state == "verifying"
    # cycle 2 (to minute 30): the rest of the episode attaches (no duplicate); the verification
    # is due (applied at minute 17, within 600 s) and succeeds
    s2 = run_cycle(lake, c, now=at(30))
    assert s2 is not None and s2.verifications == {"succeeded": 1}
    with Queue(qpath) as q:
        assert [a.id for a in q.actions()] == [first.id]
        attached = q.attachments(first.id)
        assert len(attached) >= 1
        assert q.get(first.id).state == "succeeded"
    # cycle 3 (to minute 52): the fault came back at minute 35: exactly one new proposal, with
    # the mode in force before it (the fix's), linked to the fix; its later fragments attach
    s3 = run_cycle(lake, c, now=at(52))
    assert s3 is not None
    with Queue(qpath) as q:
        actions = q.actions()
        assert [a.id for a in actions[:1]] == [first.id] and len(actions) == 2
        again = actions[1]
        assert (again.host, again.entry_id, again.state) == ("sim-00", "thp_coverage_loss", "proposed")
        assert again.params == {"enabled": "always", "defrag": "madvise"}
        proposed = next(e for e in q.audit(again.id) if e.event == "proposed").details
        assert proposed["recurrence_of"] == first.id
        # came back 18 minutes after the fix (minute 35 - minute 17; detection lags seconds)
        assert 17 * 60 <= proposed["came_back_after_s"] <= 19 * 60, proposed
        assert [e.event for e in q.audit(first.id)][-1] == "came_back"
        assert len(q.attachments(again.id)) >= 1
        row = q.to_frame().filter(pl.col("action_id") == again.id).row(0, named=True)
        assert row["recurrence_of"] == first.id and row["came_back_after_s"] == proposed["came_back_after_s"]


def test_a_split_incident_produces_no_duplicate_proposal(tmp_path: Path) -> None:
    from jobs.remediations import queue_remediations
    from tests.test_remediation_safety import m, thp_facts, thp_incidents

    facts = thp_facts([(0, "always", "madvise"), (15, "never", "never")], until=40)  # still off
    frags = thp_incidents(("inc-a", m(15), m(20)), ("inc-b", m(20), m(25)), ("inc-c", m(25), m(30)))
    first = queue_remediations(tmp_path, frags, facts, load_kb(), now=m(40))
    again = queue_remediations(tmp_path, frags, facts, load_kb(), now=m(40))  # a retried sweep
    assert first["action_id"].unique().to_list() == again["action_id"].unique().to_list()
    with Queue(default_path(tmp_path)) as q:
        [a] = q.actions()
        assert a.incident_id == "inc-a" and a.params == {"enabled": "always", "defrag": "madvise"}
        assert [i for i, _ in q.attachments(a.id)] == ["inc-b", "inc-c"]
        assert [e.event for e in q.audit(a.id)] == ["proposed", "attached", "attached"]
        # another host's fault is its own cause
        other = thp_incidents(("inc-x", m(15), m(20)), host="h2")
        queue_remediations(tmp_path, other, facts.with_columns(pl.lit("h2").alias("host")), load_kb(), now=m(40))
        assert len(q.actions()) == 2
        # a rejected proposal no longer answers the cause: the next fragment is proposed anew
        q.reject(a.id, by="bob")
        queue_remediations(tmp_path, thp_incidents(("inc-d", m(30), m(35))), facts, load_kb(), now=m(40))
        assert [x.incident_id for x in q.actions(host="h1")] == ["inc-a", "inc-d"]


def test_a_fragment_attached_in_a_later_chunk_is_a_later_row_of_its_action(tmp_path: Path) -> None:
    """Each chunk writes the rows of the actions its incidents touched: a fragment attached in
    a later chunk changes the action, so its row is later, and readers of the latest row
    (remediation-effects, the cycle's export) see one row with every attachment."""
    from jobs.remediations import export_remediations, new_remediation_rows, queue_remediations
    from tests.test_remediation_safety import m, thp_facts, thp_incidents

    facts = thp_facts([(0, "always", "madvise"), (15, "never", "never")], until=40)
    chunk1 = queue_remediations(tmp_path, thp_incidents(("inc-a", m(15), m(20)), ("inc-b", m(20), m(25))), facts,
                                load_kb(), now=m(25))
    lake.write_table(tmp_path, "remediations", new_remediation_rows(tmp_path, chunk1, []))
    chunk2 = queue_remediations(tmp_path, thp_incidents(("inc-c", m(25), m(30))), facts, load_kb(), now=m(30))
    new = new_remediation_rows(tmp_path, chunk2, [])
    assert new.height == 1 and new["updated"][0] > chunk1["updated"][0]
    lake.write_table(tmp_path, "remediations", new)
    assert export_remediations(tmp_path) == 0  # the lake has the queue's latest row already
    [row] = query.run_query(tmp_path, "remediation-effects").iter_rows(named=True)
    assert row["incident_id"] == "inc-a" and json.loads(row["attached_incidents"]) == ["inc-b", "inc-c"]


# sim-00: THP off from minute 17 to 20, where the fix lands (the simulator restores it then);
# healthy for the 7 minutes before that within the entry's 600 s before-window
LATE_ONSET = """
name = "late-onset"
seed = 7
start = "{start}"
duration = "32m"

[[hosts]]
name = "sim-00"
workload = "llm_serving"

[[hosts]]
name = "sim-01"
workload = "llm_serving"

[[injections]]
type = "thp_coverage_loss"
host = "sim-00"
start = "17m"
duration = "3m"
severity = 0.8
"""


def test_a_fix_soon_after_the_onset_is_judged_against_the_incident_not_the_healthy_minutes(tmp_path: Path) -> None:
    """The before-windows start at the action's incident, not ``within_s`` before the apply:
    a fix applied 3 minutes after the onset is judged against those 3 minutes (seen on a
    real host: the THP fix 30 s after the onset failed against healthy windows)."""
    start, lk, root = _thp_off_world(tmp_path, LATE_ONSET, 20)
    c = SweepConfig(lag=timedelta(0), max_incident=timedelta(minutes=2), remediation_root=str(root))
    assert run_cycle(lk, c, now=start + timedelta(minutes=20)) is not None
    with Queue(default_path(lk)) as q:
        [action] = q.actions()
        assert (action.host, action.entry_id, action.state) == ("sim-00", "thp_coverage_loss", "proposed")
        q.approve(action.id, by="alice")
        assert Executor(q, ExecutorConfig(root=str(root))).execute(action.id, actor="alice").state == "verifying"
    onset = lake.read(lk, "incidents").filter(pl.col("incident_id") == action.incident_id)["start"].min()
    assert isinstance(onset, datetime) and onset >= start + timedelta(minutes=16)  # (the case under test)
    s = run_cycle(lk, c, now=start + timedelta(minutes=32))
    assert s is not None and s.verifications == {"succeeded": 1}
    with Queue(default_path(lk)) as q:
        done = q.get(action.id)
    assert done.effect is not None and done.effect["verdict"] == "improved"
    assert done.effect["after"]["mem.hugepage_coverage"] > done.effect["before"]["mem.hugepage_coverage"] + 0.2
    # the before-windows are those of the incident: about 3 minutes of 1 s strides, not 10
    assert 0 < done.effect["windows_before"] <= 4 * 60
