"""Remediation scripts: check/apply/rollback against a temporary copy of recorded /proc and /sys
files (``--root``), the live host where that is harmless, and one root test that really flips THP.

The kernel shows choice files as "always [madvise] never" and accepts a bare "never"; a copy
keeps what was written. So state is compared the way the script reads it (the same parse the
kernel's view goes through), not byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from remediation.errors import ParamError
from remediation.scripts import _base, cpu_governor, gpu_power_limit, irq_affinity, nic_ring, thp
from remediation.scripts._base import Context

DATA = Path(__file__).parent / "data" / "remediation"
THP_DIR = "sys/kernel/mm/transparent_hugepage"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dst = tmp_path / "root"
    shutil.copytree(DATA / "sysroot", dst)
    return dst


def run(script: str, verb: str, root: Path | str, *args: str, state: Path | None = None) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", f"remediation.scripts.{script}", verb, "--root", str(root)]
    if state is not None:
        argv += ["--state", str(state)]
    proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def immutable(path: Path) -> None:
    """Make one file refuse writes, even from root (chattr +i), or via mode bits as non-root."""
    if os.geteuid() == 0:
        assert shutil.which("chattr"), "chattr (e2fsprogs) is not installed"
        r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, f"filesystem does not support chattr +i: {r.stderr}"
    else:
        path.chmod(0o444)


def mutable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    path.chmod(0o644)


def thp_state(root: Path) -> dict[str, Any]:
    return thp.read(Context(root), {"khugepaged_pages_to_scan": 1, "khugepaged_scan_sleep_ms": 1})


# ---- thp ----------------------------------------------------------------------------------------

def test_thp_check_changes_nothing_and_reports_plan(root: Path) -> None:
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    rc, out = run("thp", "check", root, "--enabled=never")
    assert rc == 0
    assert out["current"] == {"enabled": "madvise", "defrag": "madvise"}
    assert out["changes"] == {"enabled": ["madvise", "never"]}
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_thp_apply_then_rollback_restores_recorded_state(root: Path, tmp_path: Path) -> None:
    original = thp_state(root)
    state = tmp_path / "state" / "1.json"
    rc, out = run("thp", "apply", root, "--enabled=never", "--defrag=defer+madvise",
                  "--khugepaged_pages_to_scan=65536", state=state)
    assert rc == 0, out
    assert thp_state(root) == {"enabled": "never", "defrag": "defer+madvise",
                               "khugepaged_pages_to_scan": 65536, "khugepaged_scan_sleep_ms": 10000}
    recorded = json.loads(state.read_text())
    assert recorded["previous"] == {"enabled": "madvise", "defrag": "madvise", "khugepaged_pages_to_scan": 4096}
    # A second apply of the same action must not overwrite the recorded state.
    rc2, out2 = run("thp", "apply", root, "--enabled=always", state=state)
    assert rc2 == 1 and "applied before" in out2["error"]
    assert thp_state(root)["enabled"] == "never"
    rc, out = run("thp", "rollback", root, state=state)
    assert rc == 0, out
    assert thp_state(root) == original


def test_thp_failure_midway_restores_and_exits_1(root: Path, tmp_path: Path) -> None:
    original = thp_state(root)
    defrag = root / THP_DIR / "defrag"
    immutable(defrag)
    try:
        rc, out = run("thp", "apply", root, "--enabled=never", "--defrag=never", state=tmp_path / "s.json")
    finally:
        mutable(defrag)
    assert rc == 1
    assert out["ok"] is False and out["restored"] is True
    assert "defrag" in out["error"]
    # enabled had been changed before defrag failed: it is back.
    assert thp_state(root) == original


def test_thp_rejects_bad_params_before_touching_anything(root: Path, tmp_path: Path) -> None:
    for bad in ("--enabled=never;reboot", "--enabled=sometimes", "--khugepaged_pages_to_scan=-5"):
        rc, out = run("thp", "apply", root, bad, state=tmp_path / "s.json")
        assert rc == 2, (bad, out)
        assert "thp: parameter" in out["error"]
    assert not (tmp_path / "s.json").exists()
    rc, out = run("thp", "apply", root, state=tmp_path / "s.json")
    assert rc == 2 and "at least one of" in out["error"]


def test_thp_missing_knob_is_unsupported(tmp_path: Path) -> None:
    rc, out = run("thp", "check", tmp_path, "--enabled=never")
    assert rc == 3 and out["unsupported"] is True
    assert "does not exist" in out["error"]


@pytest.mark.host
def test_collapse_on_live_kernel_reports_coverage(tmp_path: Path) -> None:
    """process_madvise(MADV_COLLAPSE) on a child that maps 64 MiB with THP enabled for it."""
    assert os.geteuid() == 0, "MADV_COLLAPSE on another process needs CAP_SYS_ADMIN: CI runs as root"
    assert Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(), "no THP on this kernel"
    child = subprocess.Popen([sys.executable, "-c", (
        "import mmap,sys,time\n"
        "m=mmap.mmap(-1,64<<20,flags=mmap.MAP_PRIVATE|mmap.MAP_ANONYMOUS)\n"
        "m.madvise(mmap.MADV_NOHUGEPAGE)\n"  # fault 4 KiB pages first
        "for i in range(0,64<<20,4096): m[i]=1\n"
        "m.madvise(mmap.MADV_HUGEPAGE)\n"
        "print('ready',flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        res = thp.collapse(child.pid)
    finally:
        child.kill()
        child.wait()
    assert res["ranges"] >= 1
    assert res["anon_huge_kib_after"] >= res["anon_huge_kib_before"] + 32 * 1024, res


# ---- cpu_governor -------------------------------------------------------------------------------

def test_governor_apply_rollback_and_unavailable(root: Path, tmp_path: Path) -> None:
    gov = lambda: cpu_governor.read(Context(root), {})  # noqa: E731
    assert set(gov().values()) == {"powersave"}
    rc, out = run("cpu_governor", "apply", root, "--governor=performance", "--cpus=1-2", state=tmp_path / "g.json")
    assert rc == 0, out
    assert gov() == {"policy0": "powersave", "policy1": "performance", "policy2": "performance", "policy3": "powersave"}
    assert run("cpu_governor", "rollback", root, state=tmp_path / "g.json")[0] == 0
    assert set(gov().values()) == {"powersave"}
    rc, out = run("cpu_governor", "apply", root, "--governor=schedutil", state=tmp_path / "g2.json")
    assert rc == 3 and "does not offer governor 'schedutil'" in out["error"]
    assert not (tmp_path / "g2.json").exists()


def test_governor_without_cpufreq_says_so(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    rc, out = run("cpu_governor", "check", tmp_path, "--governor=performance")
    assert rc == 3 and "no CPU frequency scaling" in out["error"]


# ---- irq_affinity -------------------------------------------------------------------------------

def test_irq_affinity_pins_to_local_node_and_rolls_back(root: Path, tmp_path: Path) -> None:
    params = {"pci": "0000:3b:00.0"}
    before = irq_affinity.read(Context(root), params)
    assert before == {"120": "0,1,2,3,4,5,6,7", "121": "0,1,2,3,4,5,6,7", "122": "2", "123": "0,1,2,3,6"}
    rc, out = run("irq_affinity", "apply", root, "--pci=0000:3b:00.0", state=tmp_path / "i.json")
    assert rc == 0, out
    assert set(irq_affinity.read(Context(root), params).values()) == {"4,5,6,7"}  # node 1
    assert run("irq_affinity", "rollback", root, state=tmp_path / "i.json")[0] == 0
    assert irq_affinity.read(Context(root), params) == before


def test_irq_affinity_pins_several_devices_each_to_its_own_node(root: Path, tmp_path: Path) -> None:
    # a second NIC, on node 0, its IRQs on node 1's CPUs: one action for both devices
    dev = root / "sys/bus/pci/devices/0000:5e:00.0"
    (dev / "msi_irqs").mkdir(parents=True)
    (dev / "numa_node").write_text("0\n")
    for irq in (124, 125):
        (dev / "msi_irqs" / str(irq)).write_text("msix\n")
        (root / f"proc/irq/{irq}").mkdir()
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text("4-7\n")
    params = {"pci": "0000:3b:00.0,0000:5e:00.0"}
    before = irq_affinity.read(Context(root), params)
    assert set(before) == {"120", "121", "122", "123", "124", "125"}
    rc, out = run("irq_affinity", "apply", root, "--pci=0000:3b:00.0,0000:5e:00.0", state=tmp_path / "i.json")
    assert rc == 0, out
    after = irq_affinity.read(Context(root), params)
    assert {k: after[k] for k in ("120", "124", "125")} == {"120": "4,5,6,7", "124": "0,1,2,3", "125": "0,1,2,3"}
    assert run("irq_affinity", "rollback", root, state=tmp_path / "i.json")[0] == 0
    assert irq_affinity.read(Context(root), params) == before
    rc, out = run("irq_affinity", "check", root, "--pci=0000:3b:00.0,0000:5e:00.0", "--irqs=120")
    assert rc == 2 and "one device" in out["error"]


def test_irq_affinity_refused_write_restores_every_irq(root: Path, tmp_path: Path) -> None:
    """A managed IRQ refuses the write: the IRQs already changed go back."""
    before = irq_affinity.read(Context(root), {"pci": "0000:3b:00.0"})
    target = root / "proc/irq/122/smp_affinity_list"
    immutable(target)
    try:
        rc, out = run("irq_affinity", "apply", root, "--pci=0000:3b:00.0", state=tmp_path / "i.json")
    finally:
        mutable(target)
    assert rc == 1 and out["restored"] is True
    assert irq_affinity.read(Context(root), {"pci": "0000:3b:00.0"}) == before


def test_irq_affinity_offline_cpu_refused(root: Path, tmp_path: Path) -> None:
    rc, out = run("irq_affinity", "check", root, "--pci=0000:3b:00.0", "--cpus=8-9")
    assert rc == 1 and "not online" in out["error"]


# ---- cgroup_cpu_quota ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("cgroup", "files", "expect"),
    [
        ("kubepods.slice/pod1", ["kubepods.slice/pod1/cpu.max"], ["max 100000"]),
        ("docker/abc", ["cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "cpu,cpuacct/docker/abc/cpu.cfs_period_us"],
         ["-1", "100000"]),
    ],
)
def test_cgroup_quota_v2_and_v1(root: Path, tmp_path: Path, cgroup: str, files: list[str], expect: list[str]) -> None:
    paths = [root / "sys/fs/cgroup" / f for f in files]
    original = [p.read_text() for p in paths]
    rc, out = run("cgroup_cpu_quota", "apply", root, f"--cgroup={cgroup}", "--quota_us=-1", state=tmp_path / "c.json")
    assert rc == 0, out
    assert [p.read_text().strip() for p in paths] == expect
    assert run("cgroup_cpu_quota", "rollback", root, state=tmp_path / "c.json")[0] == 0
    assert [p.read_text().strip() for p in paths] == [o.strip() for o in original]


def test_cgroup_path_traversal_refused(root: Path) -> None:
    for bad in ("../../etc", "a/../../b", "/abs", "a//b"):
        rc, out = run("cgroup_cpu_quota", "check", root, f"--cgroup={bad}", "--quota_us=-1")
        assert rc == 2, (bad, out)


# ---- nic_ring -----------------------------------------------------------------------------------

def test_parse_ethtool_ring_outputs() -> None:
    virtio = nic_ring.parse_ring((DATA / "ethtool_g_virtio.txt").read_text())
    assert virtio == {"max": {"rx": 256, "tx": 256}, "current": {"rx": 256, "tx": 256}}
    mlx = nic_ring.parse_ring((DATA / "ethtool_g_mlx5.txt").read_text())
    assert mlx["max"] == {"rx": 8192, "tx": 8192} and mlx["current"] == {"rx": 1024, "tx": 1024}


@pytest.mark.host
def test_nic_ring_live_unsupported_or_over_max_is_clear() -> None:
    if shutil.which("ethtool") is None and not Path("/usr/sbin/ethtool").exists():
        rc, out = run("nic_ring", "check", "/", "--iface=lo", "--rx=64")
        assert rc == 3 and "not installed" in out["error"]
        return
    rc, out = run("nic_ring", "check", "/", "--iface=lo", "--rx=64")
    assert rc == 3 and "does not support ring sizes" in out["error"]
    rc, out = run("nic_ring", "check", "/", "--iface=nonexistent0", "--rx=64")
    assert rc == 3 and "no interface" in out["error"]


_ETHTOOL = """#!{python}
# ethtool -g/-G over the NICs of rings.json, printing the recorded mlx5 output's layout
import json, pathlib, sys
path = pathlib.Path(__file__).with_name("rings.json")
nics = json.loads(path.read_text())
verb, iface, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
nic = nics.get(iface)
if nic is None:
    sys.exit(print(f"netlink error: no device matches name ({iface}): No such device", file=sys.stderr) or 1)
if verb == "-g":
    m, c = nic["max"], nic["current"]
    print(f"Ring parameters for {iface}:\\nPre-set maximums:\\nRX:\\t\\t{m['rx']}\\nRX Mini:\\tn/a\\n"
          f"TX:\\t\\t{m['tx']}\\nCurrent hardware settings:\\nRX:\\t\\t{c['rx']}\\nRX Mini:\\tn/a\\nTX:\\t\\t{c['tx']}")
    sys.exit(0)
if nic.get("busy"):
    sys.exit(print("netlink error: Device or resource busy", file=sys.stderr) or 1)
changes = dict(zip(rest[::2], map(int, rest[1::2])))
if all(nic["current"][k] == v for k, v in changes.items()):
    sys.exit(print("rx unmodified, ignoring", file=sys.stderr) or 80)
nic["current"].update(changes)
path.write_text(json.dumps(nics))
"""


def _fake_ethtool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nics: dict[str, Any]) -> Path:
    """An ``ethtool`` first on PATH that keeps ring sizes in a file (no NIC here can resize its
    rings: virtio's eth0 is at its maximum, veth and lo have no ring control)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "ethtool"
    exe.write_text(_ETHTOOL.replace("{python}", sys.executable))
    exe.chmod(0o755)
    rings = bin_dir / "rings.json"
    rings.write_text(json.dumps(nics))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return rings


def _nic(rx: int, rx_max: int = 8192, **kw: Any) -> dict[str, Any]:
    return {"max": {"rx": rx_max, "tx": 8192}, "current": {"rx": rx, "tx": 1024}, **kw}


def test_nic_ring_resizes_every_nic_named_and_rolls_them_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rings = _fake_ethtool(tmp_path, monkeypatch, {"ens1f0": _nic(1024), "ens2f0": _nic(512), "ens3f0": _nic(8192)})
    state = tmp_path / "state.json"
    rc, out = run("nic_ring", "apply", "/", "--iface=ens1f0,ens2f0,ens3f0", "--rx=8192", state=state)
    assert rc == 0, out
    assert out["changes"] == {"rx@ens1f0": [1024, 8192], "rx@ens2f0": [512, 8192]}
    now = json.loads(rings.read_text())
    assert [now[n]["current"]["rx"] for n in ("ens1f0", "ens2f0", "ens3f0")] == [8192, 8192, 8192]
    assert all(now[n]["current"]["tx"] == 1024 for n in now)
    rc, out = run("nic_ring", "rollback", "/", state=state)
    assert rc == 0, out
    now = json.loads(rings.read_text())
    assert [now[n]["current"]["rx"] for n in ("ens1f0", "ens2f0", "ens3f0")] == [1024, 512, 8192]
    # one interface keeps the single-key state of earlier records
    rc, out = run("nic_ring", "check", "/", "--iface=ens1f0", "--rx=2048")
    assert rc == 0 and out["planned"] == {"rx": 2048}, out


def test_nic_ring_over_one_nics_maximum_or_refused_changes_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rings = _fake_ethtool(tmp_path, monkeypatch, {"ens1f0": _nic(1024), "ens2f0": _nic(512, rx_max=2048),
                                                  "ens3f0": _nic(512, busy=True)})
    before = json.loads(rings.read_text())
    rc, out = run("nic_ring", "apply", "/", "--iface=ens1f0,ens2f0", "--rx=4096", state=tmp_path / "a.json")
    assert rc == 1 and "ens2f0: rx 4096 exceeds the NIC maximum 2048" in out["error"], out
    assert json.loads(rings.read_text()) == before
    # ens1f0 is resized, then ens3f0 refuses: ens1f0 goes back
    rc, out = run("nic_ring", "apply", "/", "--iface=ens1f0,ens3f0", "--rx=4096", state=tmp_path / "b.json")
    assert rc == 1 and "busy" in out["error"] and out["restored"] is True, out
    assert json.loads(rings.read_text()) == before
    rc, out = run("nic_ring", "check", "/", "--iface=ens1f0,nonexistent0", "--rx=64")
    assert rc == 3 and "no interface 'nonexistent0'" in out["error"], out


def test_nic_ring_refuses_fake_root(root: Path) -> None:
    rc, out = run("nic_ring", "check", root, "--iface=eth0", "--rx=64")
    assert rc == 3 and "--root must be /" in out["error"]


# ---- gpu_power_limit ----------------------------------------------------------------------------

def _nvml(tmp_path: Path, refuse: int | None = None) -> gpu_power_limit.ReplayBackend:
    path = tmp_path / "nvml.json"
    shutil.copy(DATA / "nvml_h100_lowered.json", path)
    backend = gpu_power_limit.ReplayBackend.load(path)
    backend.refuse_mw = refuse
    return backend


def _gpu_main(argv: list[str], backend: gpu_power_limit.ReplayBackend, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc = gpu_power_limit.main(argv, backend=backend)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_gpu_power_limit_restores_default_and_rolls_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nv = _nvml(tmp_path)
    state = str(tmp_path / "p.json")
    rc, out = _gpu_main(["apply", "--gpu=0", "--state", state], nv, capsys)
    assert rc == 0, out
    assert out["changes"] == {"power_limit_mw": [400000, 700000]}
    assert json.loads((tmp_path / "nvml.json").read_text())["gpus"][0]["power_limit_mw"] == 700000
    rc, out = _gpu_main(["rollback", "--gpu=0", "--state", state], nv, capsys)
    assert rc == 0 and nv.power_limit_mw(0) == 400000


def test_gpu_power_limit_on_several_gpus_changes_and_restores_each(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # GPU 0 lowered to 400 W, GPU 1 at its default: one action for both writes only GPU 0
    nv = _nvml(tmp_path)
    nv.data["gpus"][1]["power_limit_mw"] = 500000
    state = str(tmp_path / "p.json")
    rc, out = _gpu_main(["apply", "--gpu=0,1", "--state", state], nv, capsys)
    assert rc == 0, out
    assert out["changes"] == {"power_limit_mw@0": [400000, 700000], "power_limit_mw@1": [500000, 700000]}
    assert (nv.power_limit_mw(0), nv.power_limit_mw(1)) == (700000, 700000)
    rc, out = _gpu_main(["rollback", "--gpu=0,1", "--state", state], nv, capsys)
    assert rc == 0 and (nv.power_limit_mw(0), nv.power_limit_mw(1)) == (400000, 500000)
    # NVML refusing one GPU's write: the frame restores the one that had changed
    nv.refuse_mw = 650000
    nv.data["gpus"][1]["default_limit_mw"] = 650000
    rc, out = _gpu_main(["apply", "--gpu=0,1", "--state", str(tmp_path / "q.json")], nv, capsys)
    assert rc == 1 and out["restored"] is True and "GPU 1" in out["error"]
    assert (nv.power_limit_mw(0), nv.power_limit_mw(1)) == (400000, 500000)
    # a state file of one GPU (actions queued before lists) still rolls back
    assert gpu_power_limit.check_state("gpu_power_limit", {"power_limit_mw": 400000}) == {"power_limit_mw": 400000}
    with pytest.raises(ParamError, match="state must be"):
        gpu_power_limit.check_state("gpu_power_limit", {"power_limit_mw@x": 400000})


def test_gpu_power_limit_refused_and_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nv = _nvml(tmp_path, refuse=700000)
    rc, out = _gpu_main(["apply", "--gpu=0", "--state", str(tmp_path / "p.json")], nv, capsys)
    assert rc == 1 and out["restored"] is True and "NVML refused" in out["error"]
    assert nv.power_limit_mw(0) == 400000
    rc, out = _gpu_main(["check", "--gpu=0", "--limit_w=900"], nv, capsys)
    assert rc == 1 and "outside the allowed 200000..700000" in out["error"]
    rc, out = _gpu_main(["check", "--gpu=5"], nv, capsys)
    assert rc == 3 and "no GPU 5" in out["error"]


@pytest.mark.host
def test_gpu_power_limit_without_gpu_says_no_gpu() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has a GPU")
    except Exception:  # noqa: BLE001 - any NVML failure means no GPU here, which is what we test
        pass
    rc, out = run("gpu_power_limit", "check", "/", "--gpu=0")
    assert rc == 3 and out["error"].startswith("no GPU")


# ---- numa_rebind (a real child process: affinity syscalls on our own child need no root) ---------

@pytest.mark.host
def test_numa_rebind_moves_and_restores_affinity(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.1)
        before = os.sched_getaffinity(child.pid)
        node = int(Path("/sys/devices/system/node/online").read_text().split("-")[0].split(",")[0])
        rc, out = run("numa_rebind", "apply", "/", f"--pid={child.pid}", f"--node={node}",
                      f"--cpus={cpus[0]}", "--migrate_memory=false", state=tmp_path / "n.json")
        assert rc == 0, out
        assert os.sched_getaffinity(child.pid) == {cpus[0]}
        rc, out = run("numa_rebind", "rollback", "/", state=tmp_path / "n.json")
        assert rc == 0, out
        assert os.sched_getaffinity(child.pid) == before
    finally:
        child.kill()
        child.wait()


# ---- the real knob -------------------------------------------------------------------------------

@pytest.mark.root
def test_thp_really_flips_on_this_host_and_rolls_back(tmp_path: Path) -> None:
    live = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    assert os.geteuid() == 0 and live.exists(), "needs root and THP: CI runs as root on a THP kernel"
    original = _base.bracketed(live.read_text())
    target = "never" if original != "never" else "madvise"
    state = tmp_path / "live.json"
    try:
        rc, out = run("thp", "apply", "/", f"--enabled={target}", state=state)
        assert rc == 0, out
        assert _base.bracketed(live.read_text()) == target
        rc, out = run("thp", "rollback", "/", state=state)
        assert rc == 0, out
        assert _base.bracketed(live.read_text()) == original
    finally:
        if _base.bracketed(live.read_text()) != original:
            live.write_text(original)
