"""The shipped systemd units: `systemd-analyze verify` accepts them (with ExecStart pointed at
this environment's `unveil`), their hardening is what docs/operations.md promises, and their
command lines and environment are ones Unveil understands."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

UNITS = Path(__file__).resolve().parents[1] / "packaging" / "systemd"
AGENT = UNITS / "unveil-agent.service"
SCHEDULER = UNITS / "unveil-scheduler.service"
INSTALLED = "/opt/unveil/venv/bin/unveil"  # the documented install path the units name


def directives(path: Path) -> dict[str, list[str]]:
    """``Key`` -> its values in order (Environment= and friends repeat), comments skipped."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _unveil() -> str:
    """This environment's `unveil` (the venv's console script), else `python -m jobs.cli`."""
    script = Path(sys.executable).with_name("unveil")
    return str(script) if script.is_file() else f"{sys.executable} -m jobs.cli"


def _verify(*units: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; scripts/bootstrap.sh installs it)")
    return subprocess.run([exe, "verify", "--man=no", *map(str, units)], capture_output=True, text=True, timeout=60)


def _copy(tmp_path: Path, unit: Path, text: str | None = None) -> Path:
    out = tmp_path / unit.name
    out.write_text((text if text is not None else unit.read_text()).replace(INSTALLED, _unveil()))
    return out


def test_systemd_analyze_verify_accepts_both_units(tmp_path: Path) -> None:
    units = [_copy(tmp_path, u) for u in (AGENT, SCHEDULER)]
    res = _verify(*units)
    # verify exits 0 on unknown keys and only warns: any output at all is a failure
    assert (res.returncode, res.stdout + res.stderr) == (0, "")


def test_verify_would_catch_a_misspelt_key_or_a_missing_binary(tmp_path: Path) -> None:
    typo = _copy(tmp_path, AGENT, AGENT.read_text().replace("ProtectSystem=", "ProtectSytem="))
    res = _verify(typo)
    assert "ProtectSytem" in res.stderr
    (tmp_path / "b").mkdir()
    gone = tmp_path / "b" / SCHEDULER.name
    gone.write_text(SCHEDULER.read_text().replace(INSTALLED, str(tmp_path / "no" / "unveil")))
    res = _verify(gone)
    assert res.returncode != 0 and "not executable" in res.stderr


COMMON = {
    "ProtectSystem": "strict",
    "ReadWritePaths": "/var/lib/unveil",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "NoNewPrivileges": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "SystemCallArchitectures": "native",
    "Restart": "on-failure",
    "EnvironmentFile": "-/etc/unveil/unveil.env",
    "ProtectKernelTunables": "yes",
    "ProtectControlGroups": "yes",
    "ProtectKernelModules": "yes",
    "RestrictSUIDSGID": "yes",
    "AmbientCapabilities": "",
}


@pytest.mark.parametrize(
    ("unit", "caps"),
    [(AGENT, "CAP_PERFMON"), (SCHEDULER, "")],  # perf stat -a only; the scheduler needs none
)
def test_hardening_is_in_place(unit: Path, caps: str) -> None:
    d = directives(unit)
    for key, value in {**COMMON, "CapabilityBoundingSet": caps}.items():
        assert d.get(key) == [value], f"{unit.name}: {key}={d.get(key)}"
    assert "User" not in d and "DynamicUser" not in d  # root, to own the lake the agent writes


def test_agent_keeps_gpu_devices_and_scheduler_has_none() -> None:
    agent, sched = directives(AGENT), directives(SCHEDULER)
    # NVML opens /dev/nvidia*: no device policy, and no ProtectClock (its implied DeviceAllow=
    # hides all other devices on systemd < 253)
    for key in ("PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock"):
        assert key not in agent, key
    assert sched["PrivateDevices"] == ["yes"] and sched["ProtectClock"] == ["yes"]
    # perf_event_open is in @debug: denied to the scheduler only
    assert "@debug" not in agent["SystemCallFilter"][0] and "@debug" in sched["SystemCallFilter"][0]


@pytest.mark.parametrize(("unit", "command"), [(AGENT, "agent"), (SCHEDULER, "schedule")])
def test_command_line_and_environment_are_unveils(unit: Path, command: str) -> None:
    from jobs.cli import build_parser

    d = directives(unit)
    argv = shlex.split(d["ExecStart"][0])
    assert argv[0] == INSTALLED and argv[1] == command
    assert build_parser().parse_args(argv[1:]).command == command  # flags as the CLI knows them
    env = dict(e.split("=", 1) for e in d["Environment"])
    assert set(env) == {"UNVEIL_CONFIG", "UNVEIL_LAKE"}
    # the lake must lie inside the only writable path, or every write fails with EROFS
    assert PurePosixPath(env["UNVEIL_LAKE"]).is_relative_to(d["ReadWritePaths"][0])


# ------------------------------------------- the sandbox, emulated without a running systemd
#
# No systemd runs here (PID 1 is not systemd), so the units cannot be started. What their
# hardening takes away is emulated with the kernel's own tools, from the unit file's values:
# a private mount namespace where / , /sys, /proc/sys and the cgroup tree are read-only and
# only the state directory is writable (ProtectSystem=strict, ProtectKernelTunables=,
# ProtectControlGroups=, ReadWritePaths=), a private writable temp dir (PrivateTmp=), and
# the unit's CapabilityBoundingSet= with no_new_privs. The agent must still sample every
# collector it samples unconfined, and the scheduler must sweep and compact.


def _sandboxed(unit: Path, state: Path, cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` run as the unit would confine it, ``state`` standing for /var/lib/unveil."""

    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    if os.geteuid() != 0:
        pytest.skip("emulating the unit's sandbox needs root (mount namespaces)")
    caps = directives(unit)["CapabilityBoundingSet"][0].split()
    bounding = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in caps)])
    (state / "tmp").mkdir(exist_ok=True)
    script = (
        f"mount --bind {state} {state} && mount -o remount,bind,ro / && mount -o remount,bind,ro /sys"
        " && mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys"
        " && { ! mountpoint -q /sys/fs/cgroup || mount -o remount,bind,ro /sys/fs/cgroup; }"
        f" && exec setpriv --bounding-set={bounding} --inh-caps=-all --no-new-privs -- "
        + " ".join(map(shlex.quote, cmd))
    )
    env = {**os.environ, "TMPDIR": str(state / "tmp"), "PYTHONPATH": str(UNITS.parents[1])}
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=120, env=env)
    if res.returncode != 0 and "unshare failed" in res.stderr:
        pytest.skip(f"no mount namespaces here: {res.stderr.strip()}")
    return res


def _unveil_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobs.cli", *args]


def _tables(lake: Path) -> dict[str, int]:
    import polars as pl

    from ingest import lake as lake_mod

    return {t: lake_mod.scan(lake, t).select(pl.len()).collect().item() for t in lake_mod.tables(lake)}


def test_agent_and_scheduler_work_inside_the_units_sandbox(tmp_path: Path) -> None:
    free, boxed = tmp_path / "free", tmp_path / "boxed"
    free.mkdir()
    boxed.mkdir()
    ref = subprocess.run(_unveil_argv("agent", "--quiet", "--duration", "5", "--lake", str(free / "lake")),
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(UNITS.parents[1])})
    assert ref.returncode == 0, ref.stderr
    # the sandbox is one: only the state directory is writable, and CAP_PERFMON (bit 38)
    # is the one capability left
    probe = _sandboxed(AGENT, boxed, [sys.executable, "-c", (
        "import pathlib; print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapBnd')][0]); "
        "pathlib.Path('/var/tmp/unveil-probe').write_text('x')")])
    assert probe.stdout.strip() == f"{1 << 38:016x}" and "Read-only file system" in probe.stderr
    res = _sandboxed(AGENT, boxed, _unveil_argv("agent", "--quiet", "--duration", "5", "--lake", str(boxed / "lake")))
    assert res.returncode == 0, res.stderr
    unavailable = [line for line in res.stderr.splitlines() if "not collected" in line]
    assert unavailable == [line for line in ref.stderr.splitlines() if "not collected" in line]
    assert set(_tables(boxed / "lake")) == set(_tables(free / "lake"))
    # one cycle over the agent's five seconds (a 3-s window needs more than one), judged in
    # one analysis: the default judges whole clock-aligned minutes once one is due, and these
    # seconds may straddle a minute
    (boxed / "once.toml").write_text('[scheduler]\nanalysis_step = "off"\n')
    res = _sandboxed(SCHEDULER, boxed,
                     _unveil_argv("--config", str(boxed / "once.toml"), "schedule", "--lake", str(boxed / "lake"),
                                  "--once", "--lag", "0s", "--maintain"))
    assert res.returncode == 0, res.stderr
    assert "cycle to" in res.stdout and "features" in _tables(boxed / "lake")
