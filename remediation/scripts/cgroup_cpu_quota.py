"""A cgroup's CPU quota: v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") or v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1 = unlimited).

The version is found per cgroup: v2 when <mount>/<cgroup>/cpu.max exists, else v1 under the
``cpu`` controller mount (/sys/fs/cgroup/cpu or /sys/fs/cgroup/cpu,cpuacct)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported

CG = "/sys/fs/cgroup"


def _locate(ctx: Context, cgroup: str) -> tuple[str, Path]:
    # real paths checked to stay inside the cgroup mount: a cgroup name that is a symlink
    # out of it (or a forged "..") is refused, for a run and a rollback alike
    v2 = _base.inside(ctx, CG, cgroup)
    if (v2 / "cpu.max").exists():
        return "v2", v2
    for mount in ("cpu", "cpu,cpuacct"):
        v1 = _base.inside(ctx, f"{CG}/{mount}", cgroup)
        if (v1 / "cpu.cfs_quota_us").exists():
            return "v1", v1
    raise Unsupported(f"cgroup {cgroup!r} has no cpu.max (v2) nor cpu.cfs_quota_us (v1) under {ctx.path(CG)}")


def read(ctx: Context, params: dict[str, Any]) -> State:
    version, path = _locate(ctx, params["cgroup"])
    if version == "v2":
        quota, _, period = _base.read_text(path / "cpu.max").partition(" ")
        return {"quota_us": -1 if quota == "max" else int(quota), "period_us": int(period)}
    return {
        "quota_us": int(_base.read_text(path / "cpu.cfs_quota_us")),
        "period_us": int(_base.read_text(path / "cpu.cfs_period_us")),
    }


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    quota = int(params["quota_us"])
    if 0 <= quota < 1000:
        raise ScriptFailed(f"quota_us {quota} is below the kernel minimum of 1000 us")
    period: int = params["period_us"] if "period_us" in params else current["period_us"]
    return {"quota_us": quota, "period_us": int(period)}


def write(ctx: Context, state: State) -> None:
    # The cgroup path lives in the params, which the frame keeps in ctx.extra for rollback.
    version, path = _locate(ctx, ctx.extra["cgroup"])
    if not state:
        return
    now = read(ctx, {"cgroup": ctx.extra["cgroup"]})
    merged = {**now, **state}
    quota, period = int(merged["quota_us"]), int(merged["period_us"])
    if version == "v2":
        _base.write_text(path / "cpu.max", f"{'max' if quota < 0 else quota} {period}")
        return
    # v1 rejects a quota below the period's minimum ratio: lift the quota first, then the period.
    _base.write_text(path / "cpu.cfs_quota_us", "-1")
    _base.write_text(path / "cpu.cfs_period_us", str(period))
    _base.write_text(path / "cpu.cfs_quota_us", str(quota))


def _read(ctx: Context, params: dict[str, Any]) -> State:
    ctx.extra.setdefault("cgroup", params.get("cgroup"))
    if not ctx.extra.get("cgroup"):
        raise ScriptFailed("no cgroup recorded")
    return read(ctx, {"cgroup": ctx.extra["cgroup"]})


def main(argv: list[str] | None = None) -> int:
    return _base.main("cgroup_cpu_quota", _read, plan, write, argv)


if __name__ == "__main__":
    sys.exit(main())
