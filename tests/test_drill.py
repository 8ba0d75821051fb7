"""``unveil drill`` on the real host: every fault applied to the real knobs (THP, cgroups,
processes, a network namespace) and restored at once; a drill killed with -9 restored by
``--restore``; SIGINT restores; forged state files refused; refusals; one short end-to-end
drill with the real agent and scheduler. Root only (CI runs as root); the ``host`` fixture
puts back anything a failed test left, and checks the host is as it found it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ingest import lake as lake_mod
from jobs import drill as d

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the drill changes kernel settings: root only")

REPO = Path(__file__).resolve().parents[1]
THP_KNOBS = (d.THP_DIR / "enabled", d.THP_DIR / "defrag")


def _marked_pids() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
        except OSError:
            continue
        if f"{d.MARK_ENV}=".encode() in env and d.alive(int(p.name)):
            out.append(int(p.name))
    return sorted(out)


def _is_marked(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether ``pid`` carries the drill's marker, waiting for it: a spawned process shows
    its own environment only once it has exec'd, which may be after apply() returned."""
    deadline = time.monotonic() + timeout_s
    while pid not in _marked_pids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _drill_cgroups() -> list[str]:
    return sorted(str(p) for p in d.CGROUP_ROOT.glob(f"**/{d.PREFIX}*") if p.is_dir())


def _netns() -> list[str]:
    run = Path("/run/netns")
    return sorted(p.name for p in run.iterdir() if p.name.startswith(d.PREFIX)) if run.is_dir() else []


def _links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(d.LINK_PREFIX))


def snapshot() -> dict[str, Any]:
    return {"thp": [k.read_text() for k in THP_KNOBS if k.exists()], "cgroups": _drill_cgroups(),
            "netns": _netns(), "links": _links(), "procs": _marked_pids()}


@pytest.fixture
def host() -> Iterator[dict[str, Any]]:
    """The host's state before the test; after it, whatever the drill left is undone (the
    drill's own names only) and the state must equal the one before."""
    before = snapshot()
    values = {k: d._thp_value(k) for k in THP_KNOBS if k.exists()}
    try:
        yield before
    finally:
        for k, v in values.items():
            if d._thp_value(k) != v:
                k.write_text(v)
        for pid in _marked_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        for cg in reversed(_drill_cgroups()):
            for _ in range(50):
                try:
                    os.rmdir(cg)
                    break
                except OSError:
                    time.sleep(0.05)
        for name in _links():
            subprocess.run(["ip", "link", "del", name], check=False)
        for name in _netns():
            subprocess.run(["ip", "netns", "del", name], check=False)
        after = snapshot()
    assert after == before, "the test left the host changed (the fixture put it back)"


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[d.Context]:
    drill_dir = tmp_path / d.STATE_DIR
    drill_dir.mkdir(mode=0o700)
    state = d.State(drill_dir / d.STATE_FILE, "00112233aabbccdd")
    state.save()
    c = d.Context(state, d.Procs(state), drill_dir)
    try:
        yield c
    finally:
        d.restore(state, c.procs)


def _state_on_disk(ctx: d.Context) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(ctx.state.path.read_text())["entries"]
    return entries


def _left(pids: list[int], timeout: float = 5.0) -> list[str]:
    """The processes of ``pids`` still alive after ``timeout``, each described (state, parent,
    command line, whether it carries a drill mark): empty when all are gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(d.alive(p) for p in pids):
            return []
        time.sleep(0.05)
    out = []
    for p in pids:
        if not d.alive(p):
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            marked = d.MARK_ENV.encode() in Path(f"/proc/{p}/environ").read_bytes()
        except OSError as exc:
            out.append(f"pid {p}: {exc}")
            continue
        out.append(f"pid {p} state {fields[0]} ppid {fields[1]} start {fields[19]} marked {marked}: {cmd}")
    return out


# ------------------------------------------------------------------------- faults


def test_thp_fault_sets_never_and_restores_the_exact_values(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.ThpFault()
    f.apply(ctx)
    assert all(d._thp_value(k) == "never" for k in THP_KNOBS)
    # written before the change: the previous values are on disk, mode 0600
    recorded = {e["path"]: e["value"] for e in _state_on_disk(ctx)}
    selected = [text.split("[")[1].split("]")[0] for text in host["thp"]]
    assert recorded == dict(zip(map(str, THP_KNOBS), selected, strict=True))
    assert ctx.state.path.stat().st_mode & 0o777 == 0o600
    assert f.restore(ctx) == []
    assert [k.read_text() for k in THP_KNOBS] == host["thp"]
    assert _state_on_disk(ctx) == []


def test_thp_fault_says_when_a_knob_was_already_off(host: dict[str, Any], ctx: d.Context) -> None:
    THP_KNOBS[0].write_text("never")  # as another tool may have left it; the fixture puts it back
    f = d.ThpFault()
    f.apply(ctx)
    assert "enabled already never" in f.method
    assert f.restore(ctx) == []
    assert d._thp_value(THP_KNOBS[0]) == "never"  # restored to what it was when the fault began


def test_quota_fault_throttles_a_burner_and_removes_its_cgroup(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.QuotaFault(quota_cpus=0.1)
    if f.available():
        pytest.skip(str(f.available()))
    f.apply(ctx)
    layout = f.layout
    assert isinstance(layout, d.CgroupLayout)
    cg = layout.cpu_root / f"{d.PREFIX}-quota"
    pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    assert len(pids) == 1 and _is_marked(pids[0])
    quota = (cg / ("cpu.max" if layout.version == 2 else "cpu.cfs_quota_us")).read_text().split()[0]
    assert quota == "10000"
    time.sleep(0.5)
    stat = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0  # the quota really bites
    assert f.restore(ctx) == []
    assert not cg.exists()
    assert _left(pids) == []


def test_quota_fault_moves_the_workload_in_and_back_out(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.QuotaFault()
    if f.available():
        pytest.skip(str(f.available()))
    assert isinstance(f.layout, d.CgroupLayout)
    wl = ctx.procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], role="workload")
    ctx.workload_pid, ctx.workload_start = wl["pid"], wl["start"]
    home = f.layout.cgroup_of(wl["pid"])
    f.apply(ctx)
    assert f.layout.cgroup_of(wl["pid"]) == f.layout.cpu_root / f"{d.PREFIX}-quota"
    assert "the workload" in f.method
    assert f.restore(ctx) == []
    assert f.layout.cgroup_of(wl["pid"]) == home and d.alive(wl["pid"])  # moved back, still running
    assert not (f.layout.cpu_root / f"{d.PREFIX}-quota").exists()


def test_cpu_fault_processes_are_gone_after_restore(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.CpuFault(n=2)
    f.apply(ctx)
    pids = [e["pid"] for e in _state_on_disk(ctx)]
    assert len(pids) == 2 and all(d.alive(p) for p in pids)
    assert f.restore(ctx) == []
    assert _left(pids) == []
    assert _marked_pids() == host["procs"]


def test_disk_fault_writes_then_removes_its_files(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.DiskFault(writers=1, size_mib=8)
    f.apply(ctx)
    scratch = ctx.drill_dir / f"{d.PREFIX}-disk0.bin"
    deadline = time.monotonic() + 10
    while not (scratch.exists() and scratch.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scratch.stat().st_size > 0
    pids = [e["pid"] for e in _state_on_disk(ctx) if e["kind"] == "proc"]
    assert f.restore(ctx) == []
    assert _left(pids) == []
    assert not scratch.exists()


def test_memory_fault_hog_holds_memory_then_is_gone(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.MemoryFault(floor_mib=256, cap_mib=128)
    f.apply(ctx)
    pid = _state_on_disk(ctx)[0]["pid"]
    deadline = time.monotonic() + 15
    rss = 0
    while time.monotonic() < deadline and rss < 100 << 20:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1]) << 10
        time.sleep(0.1)
    assert rss >= 100 << 20
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    assert f.restore(ctx) == []
    assert _left([pid]) == []


def test_netem_fault_loses_packets_in_its_own_netns_then_removes_it(host: dict[str, Any], ctx: d.Context) -> None:
    f = d.NetemFault()
    if f.available():
        pytest.skip(str(f.available()))
    f.apply(ctx)
    assert _netns() == [f.NS] and f.HOST_LINK in _links()
    if "nftables" in f.method:
        # no sch_netem: the namespace's nftables table drops at random (tests/test_drill_cause.py
        # measures the retransmissions)
        def dropped() -> int:
            out = subprocess.run(["ip", "netns", "exec", f.NS, "nft", "list", "table", "inet", d.LINK_PREFIX],
                                 capture_output=True, text=True).stdout
            return sum(int(x.split()[0]) for x in out.split("counter packets ")[1:])
    else:
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", f.HOST_LINK], capture_output=True, text=True).stdout
        assert ("netem" in qdisc) or ("tbf" in qdisc)

        def dropped() -> int:
            stats = subprocess.run(["tc", "-s", "qdisc", "show", "dev", f.HOST_LINK], capture_output=True,
                                   text=True).stdout
            return int(stats.split("dropped ")[1].split(",")[0])
    # traffic crosses the pair and the fault drops some of it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and dropped() == 0:
        time.sleep(0.2)
    assert dropped() > 0
    pids = [e["pid"] for e in _state_on_disk(ctx) if e["kind"] == "proc"]
    assert f.restore(ctx) == []
    assert _netns() == [] and _links() == []
    assert _left(pids) == []


# ----------------------------------------------------------------- crash, signals


CRASHER = """
import sys, time
from pathlib import Path
from jobs import drill as d
lake = Path(sys.argv[1])
(lake / d.STATE_DIR).mkdir(parents=True, mode=0o700)
st = d.State(d.state_path(lake), "feedfacefeedface"); st.save()
ctx = d.Context(st, d.Procs(st), lake / d.STATE_DIR)
for f in (d.ThpFault(), d.QuotaFault(), d.CpuFault(n=1), d.NetemFault(), d.DiskFault(writers=1, size_mib=8)):
    if f.available() is None:
        f.apply(ctx)
print("applied", flush=True)
time.sleep(600)
"""


def _cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("UNVEIL_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120, **kw)


def test_kill_9_then_restore_puts_the_host_back(host: dict[str, Any], tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    p = subprocess.Popen([sys.executable, "-c", CRASHER, str(lake)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "applied"
        changed = snapshot()
        assert changed != host and all(d._thp_value(k) == "never" for k in THP_KNOBS)
    finally:
        p.kill()
        p.wait()
    # the drill is dead; its faults are not
    assert snapshot()["procs"] and d.state_path(lake).exists()
    r = _cli("drill", "--restore", "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    assert "restored" in r.stdout
    assert _left(snapshot()["procs"]) == []
    assert snapshot() == host
    assert not d.state_path(lake).exists()
    # idempotent: a second restore finds nothing to do
    again = _cli("drill", "--restore", "--lake", str(lake))
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_sigint_restores_then_exits(host: dict[str, Any], tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "jobs.cli", "drill", "--yes", "--lake", str(lake), "--faults",
                          "thp,cpu", "--healthy-seconds", "1", "--fault-seconds", "300", "--workload", "none",
                          "--every", "60s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=REPO)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "thp: applied" in line:
                break
        assert all(d._thp_value(k) == "never" for k in THP_KNOBS)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "restored" in err
    assert not d.state_path(lake).exists()
    assert snapshot() == host  # THP back, agent/scheduler stopped


# ------------------------------------------------------------------ forged state


def _forge(lake: Path, entries: list[dict[str, Any]], mode: int = 0o600) -> Path:
    path = d.state_path(lake)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "run_id": "0badc0de0badc0de", "entries": entries}))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("entry", [
    {"kind": "thp", "path": "/tmp/decoy/enabled", "value": "never"},
    {"kind": "thp", "path": str(d.THP_DIR / "enabled"), "value": "; rm -rf /"},
    {"kind": "thp", "path": str(d.THP_DIR / ".." / "transparent_hugepage" / "enabled"), "value": "never"},
    {"kind": "cgroup", "path": "/sys/fs/cgroup/cpu/user.slice"},
    {"kind": "cgroup", "path": f"/sys/fs/cgroup/cpu/{d.PREFIX}-x/../.."},
    {"kind": "cgroup", "path": f"/tmp/{d.PREFIX}-quota"},
    {"kind": "netns", "name": "default"},
    {"kind": "link", "name": "eth0"},
    {"kind": "file", "path": "/etc/passwd"},
    {"kind": "file", "path": f"/tmp/{d.PREFIX}-disk0.bin"},
    {"kind": "proc", "pid": 1, "start": "x"},
    {"kind": "move", "pid": 4242, "start": 1, "path": "/etc"},
    {"kind": "exec", "cmd": "reboot"},
])
def test_a_forged_state_file_is_refused_before_anything_is_done(tmp_path: Path, entry: dict[str, Any]) -> None:
    lake = tmp_path / "lake"
    # a valid entry first: refusal must come before it is acted on
    decoy = lake / d.STATE_DIR / f"{d.PREFIX}-disk0.bin"
    decoy.parent.mkdir(parents=True)
    decoy.write_text("kept")
    _forge(lake, [{"kind": "file", "path": str(decoy)}, entry])
    with pytest.raises(d.DrillError, match="entry 1"):
        d.restore_from_file(lake)
    assert decoy.read_text() == "kept" and d.state_path(lake).exists()


def test_the_cli_names_the_forged_entry(tmp_path: Path) -> None:
    _forge(tmp_path, [{"kind": "cgroup", "path": "/sys/fs/cgroup/cpu/user.slice"}])
    r = _cli("drill", "--restore", "--lake", str(tmp_path))
    assert r.returncode == 2 and "entry 0" in r.stderr and "user.slice" in r.stderr
    assert "Traceback" not in r.stderr


def test_restore_never_kills_a_process_that_is_not_the_drills(tmp_path: Path) -> None:
    """A well-formed entry naming someone else's process (no drill marker) is left alone."""
    victim = subprocess.Popen(["sleep", "30"])
    try:
        start = d._start_time(victim.pid)
        assert start is not None
        _forge(tmp_path, [{"kind": "proc", "pid": victim.pid, "start": start}])
        assert d.restore_from_file(tmp_path) == (1, [])
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_a_state_file_others_can_write_is_refused(tmp_path: Path) -> None:
    _forge(tmp_path, [], mode=0o666)
    with pytest.raises(d.DrillError, match="0600"):
        d.restore_from_file(tmp_path)


# ----------------------------------------------------------------------- refusals


def test_a_drill_refuses_to_start_over_an_unrestored_one(tmp_path: Path) -> None:
    path = _forge(tmp_path, [{"kind": "netns", "name": f"{d.PREFIX}-net"}])
    before = path.read_text()
    with pytest.raises(d.DrillError, match="--restore"):
        d.run_drill(d.DrillConfig(lake=tmp_path, faults=["thp"], workload="none", out=lambda _: None))
    assert path.read_text() == before and not (tmp_path / d.STATE_DIR / "agent.log").exists()


def test_a_process_the_drill_could_not_record_never_runs(tmp_path: Path) -> None:
    """The spawn gate: when the state file cannot take the new process (a full file system,
    here a real full tmpfs), the child exits instead of running unrecorded."""
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], check=True)
    try:
        state = d.State(full / d.STATE_FILE, "00112233aabbccdd")
        state.save()
        with contextlib.suppress(OSError), open(full / "filler", "wb") as fh:
            while True:
                fh.write(b"x" * 65536)
                fh.flush()
        marker = tmp_path / "ran"
        with pytest.raises(OSError):
            d.Procs(state).spawn([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"])
        time.sleep(1.0)
        assert not marker.exists()
        assert json.loads((full / d.STATE_FILE).read_text())["entries"] == []  # the old file, whole
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_cgroup_v2_layout_and_membership(tmp_path: Path) -> None:
    """The v2 branch on a v1 host: the layout from a v2-shaped tree, membership from the
    real /proc/self/cgroup's unified line."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    layout = d.cgroup_layout(tmp_path)
    assert isinstance(layout, d.CgroupLayout) and layout.version == 2 and layout.cpu_root == tmp_path
    assert layout.quota_files(20000, 100000) == [("cpu.max", "20000 100000")]
    unified = next(line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    rel = unified.split("::", 1)[1].lstrip("/")
    assert layout.cgroup_of(os.getpid()) == (tmp_path / rel if rel else tmp_path)
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    assert "cpu controller is not enabled" in str(d.cgroup_layout(tmp_path))
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu").symlink_to("cpu,cpuacct")
    got = d.cgroup_layout(v1)
    assert isinstance(got, d.CgroupLayout) and got.version == 1 and got.cpu_root == v1 / "cpu,cpuacct"


#: the CLI with the effective uid of nobody (the interpreter lives under /root, which nobody
#: cannot read: so the modules are imported first, then the privileges dropped)
# Every module the command needs is imported while still root: the interpreter may live
# under a directory that nobody cannot read (/root/.pyenv here), and `unveil` imports its
# subcommands lazily.
AS_NOBODY = ("import os, sys\nfrom jobs.cli import main, build_parser\nimport jobs.drill, tomllib\n"
             "build_parser(sys.argv[1:])\n"
             "os.setegid(65534); os.seteuid(65534)\nsys.exit(main(sys.argv[1:]))")


def test_refuses_without_root(tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("UNVEIL_CONFIG", None)
    for args in (["--yes"], ["--restore"]):
        r = subprocess.run([sys.executable, "-c", AS_NOBODY, "drill", *args, "--lake", str(tmp_path / "lake")],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "run it as root" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "lake").exists()


def test_refuses_without_yes_unless_the_host_is_a_canary(tmp_path: Path) -> None:
    conf = tmp_path / "unveil.toml"
    conf.write_text("[drill]\ncanary = false\n")
    r = _cli("--config", str(conf), "drill", "--lake", str(tmp_path / "lake"))
    assert r.returncode == 2 and "canary" in r.stderr and "--yes" in r.stderr
    assert not (tmp_path / "lake").exists()  # refused before anything was created


def test_drill_config_is_typed_and_names_the_key(tmp_path: Path) -> None:
    from jobs import config

    conf = tmp_path / "unveil.toml"
    conf.write_text('[drill]\ncanary = "yes"\n')
    with pytest.raises(config.ConfigError, match=r"\[drill\]\.canary must be bool"):
        config.load(conf)
    conf.write_text("[drill]\ncanry = true\n")
    with pytest.raises(config.ConfigError, match=r"unknown key \[drill\]\.canry"):
        config.load(conf)
    conf.write_text("[drill]\ncanary = true\n")
    assert config.load(conf).drill.canary is True
    assert config.load(REPO / "samples" / "unveil.toml").drill.canary is False


def test_bad_faults_are_named(tmp_path: Path) -> None:
    r = _cli("drill", "--yes", "--lake", str(tmp_path), "--faults", "thp,bogus")
    assert r.returncode == 2 and "bogus" in r.stderr


# ---------------------------------------------------------------------- end to end


def test_short_drill_writes_a_scorecard_consistent_with_the_incidents(host: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lines: list[str] = []
    cfg = d.DrillConfig(lake=lake, faults=["thp"], fault_s=20, recovery_s=8, healthy_s=8, workload="builtin",
                        every_s=10, lag_s=6, commit_s=3, host="drill-e2e", catchup_timeout_s=90,
                        out=lines.append)
    card = d.run_drill(cfg)
    assert snapshot() == host and not d.state_path(lake).exists()
    assert card["fault"].to_list() == ["healthy", "thp"]
    # the scorecard in the lake is the one returned
    stored = lake_mod.read(lake, d.SCORECARD_TABLE)
    assert stored.height == 2 and set(stored["run_id"]) == set(card["run_id"])
    # the scheduler swept the drill's data (the watermark passed the last recovery)
    from jobs import watermarks

    mark = watermarks.load(lake)["drill-e2e"].watermark
    row = card.row(1, named=True)
    assert mark >= row["restored"]
    # consistent with the incidents table: the ids it names overlap the fault window, and
    # every incident overlapping the window is named
    inc = d.read_incidents(lake, "drill-e2e")
    over = inc.filter((pl.col("start") < row["restored"]) & (pl.col("end") > row["onset"]))
    assert sorted(row["incident_ids"]) == sorted(over["incident_id"].to_list())
    assert row["detected"] == (over.height > 0) and row["incidents"] == over.height
    assert (row["latency_s"] is None) == (not row["detected"])
    if row["detected"]:
        assert row["latency_s"] >= 0
    assert row["expected_entry"] == "thp_coverage_loss" and row["skipped"] is None
    assert any("thp" in line and "detected" not in line for line in lines)
    assert "thp" in lines[-1] and "healthy" in lines[-1]  # the printed table


def test_the_scorecard_is_never_read_back_as_telemetry(tmp_path: Path) -> None:
    """Its numbers (latency, incident counts) must not become features of the host."""
    from jobs.telemetry import telemetry_tables

    now = datetime.now(UTC)
    w = d.FaultWindow("cpu", "cpu_noisy_neighbour", "2 busy process(es)", now, now + timedelta(seconds=5),
                      now + timedelta(seconds=9))
    lake_mod.write_table(tmp_path, "cpu", pl.DataFrame({"time": [now], "host": ["h"], "cpu": ["all"]}))
    d.write_scorecard(tmp_path, d.scorecard(tmp_path, "h", "0123abcd", now - timedelta(seconds=9), [w],
                                            healthy_end=now))
    assert d.SCORECARD_TABLE in lake_mod.tables(tmp_path)
    assert d.SCORECARD_TABLE not in telemetry_tables(tmp_path)


def test_thp_restore_leaves_a_mode_someone_else_chose_during_the_drill(host: dict[str, Any],
                                                                        ctx: d.Context) -> None:
    f = d.ThpFault()
    f.apply(ctx)
    knob = THP_KNOBS[0]
    other = "always" if "[always]" not in host["thp"][0] else "madvise"
    knob.write_text(other)  # an operator's choice while the fault held
    assert f.restore(ctx) == []
    assert d._thp_value(knob) == other
    assert THP_KNOBS[1].read_text() == host["thp"][1]  # the untouched knob is restored


def test_latency_counts_from_when_an_incident_first_appeared_not_from_its_compacted_file(tmp_path: Path) -> None:
    """The scheduler compacts incident files minutes later (new files, new mtimes): the
    drill's own polling keeps the first appearance."""
    t = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    for n in range(2):  # two sweeps, two small files in a closed hour
        start = t + timedelta(minutes=n)
        lake_mod.write_table(tmp_path, "incidents", pl.DataFrame({
            "time": [start], "host": ["h"], "incident_id": [f"inc-{n}"], "start": [start],
            "end": [start + timedelta(seconds=5)], "status": ["matched"], "entry_id": ["thp_coverage_loss"]}))
    watch = d.IncidentWatch(tmp_path, "h")
    watch.poll()
    seen = datetime.now(UTC)
    time.sleep(1.1)
    assert lake_mod.compact(tmp_path, "incidents").merges == 1
    by_mtime = d.read_incidents(tmp_path, "h")
    assert min(by_mtime["visible_at"].to_list()) > seen  # what a file's mtime says after compaction
    watch.poll()  # the merged file holds nothing new
    first = d.read_incidents(tmp_path, "h", watch.first_seen)
    assert first.height == 2 and max(first["visible_at"].to_list()) <= seen


def test_the_scorecard_reads_an_incident_as_it_ends_and_when_it_first_showed_that(tmp_path: Path) -> None:
    """An open incident's entry can change (the memory hog's CPU windows come first, memory
    pressure joins them) and an open incident can be superseded: the scorecard names the
    entry of the latest row, timed from the first row carrying it; a superseded one is gone."""
    t0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    rows = [("inc-hog", 55, 70, "cpu_noisy_neighbour", "open", 70), ("inc-io", 62, 70, "storage_contention", "open", 70),
            ("inc-hog", 55, 118, "memory_pressure", "open", 130), ("inc-io", 62, 70, "storage_contention",
                                                                    "superseded", 130),
            ("inc-hog", 55, 125, "memory_pressure", "closed", 190)]
    for r in rows:  # one sweep, one file each
        lake_mod.write_table(tmp_path, "incidents", pl.DataFrame({
            "time": [at(r[1])], "host": ["h"], "incident_id": [r[0]], "start": [at(r[1])], "end": [at(r[2])],
            "status": ["matched"], "entry_id": [r[3]], "state": [r[4]], "updated": [at(r[5])]}))
    seen: dict[d.Seen, datetime] = {"inc-hog": at(80), ("inc-hog", "cpu_noisy_neighbour"): at(80),
                                    "inc-io": at(80), ("inc-io", "storage_contention"): at(80),
                                    ("inc-hog", "memory_pressure"): at(140)}
    inc = d.read_incidents(tmp_path, "h", seen)
    assert inc.select("incident_id", "entry_id", "end", "visible_at").rows() == [
        ("inc-hog", "memory_pressure", at(125), at(140))]
    w = d.FaultWindow("memory", "memory_pressure", "hog", at(60), at(120), at(180))
    card = d.scorecard(tmp_path, "h", "0123abcd", t0, [w], healthy_end=at(60), first_seen=seen)
    mem = card.row(1, named=True)
    assert mem["matched_entry"] == "memory_pressure" and mem["incidents"] == 1 and mem["latency_s"] == 80.0


def test_scorecard_rows_from_incidents_and_the_queue(tmp_path: Path) -> None:
    """Detection, match, latency (of the matched entry's incidents, not of an unrelated one
    already under way at the onset), remediation from the real queue, false incidents."""
    from remediation.queue import Queue, default_path

    t0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    rows = [("inc-healthy", 10, 15, "matched", "cpu_noisy_neighbour"),
            ("inc-unrelated", 58, 70, "matched", "storage_contention"),
            ("inc-thp", 65, 90, "matched", "thp_coverage_loss"),
            ("inc-after", 150, 155, "unmatched", None)]
    lake_mod.write_table(tmp_path, "incidents", pl.DataFrame({
        "time": [at(r[1]) for r in rows], "host": ["h"] * 4, "incident_id": [r[0] for r in rows],
        "start": [at(r[1]) for r in rows], "end": [at(r[2]) for r in rows], "status": [r[3] for r in rows],
        "entry_id": [r[4] for r in rows]}))
    with Queue(default_path(tmp_path)) as q:
        q.propose(host="h", entry_id="thp_coverage_loss", incident_id="inc-thp", script_id="thp",
                  params={"enabled": "madvise", "defrag": "madvise"})
    seen = {"inc-healthy": at(40), "inc-unrelated": at(75), "inc-thp": at(100), "inc-after": at(160)}
    w = d.FaultWindow("thp", "thp_coverage_loss", "enabled, defrag = never", at(60), at(120), at(180))
    card = d.scorecard(tmp_path, "h", "0123abcd", t0, [w], healthy_end=at(60), first_seen=seen)
    healthy, thp = card.row(0, named=True), card.row(1, named=True)
    assert healthy["fault"] == "healthy" and healthy["false_incidents"] == 1
    assert healthy["incident_ids"] == ["inc-healthy"]
    assert thp["detected"] and thp["incidents"] == 2
    assert sorted(thp["incident_ids"]) == ["inc-thp", "inc-unrelated"]
    assert thp["matched_entry"] == "thp_coverage_loss" and thp["match_ok"]
    assert thp["latency_s"] == 40.0 and thp["start_latency_s"] == 5.0
    assert thp["remediation"] == "thp"
    assert thp["false_incidents"] == 1  # inc-after, in the recovery minutes
    text = d.format_scorecard(card)
    assert "thp_coverage_loss" in text and "40 s" in text
