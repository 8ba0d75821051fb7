"""cpufreq scaling governor of every policy (or of the policies covering ``cpus``)."""

from __future__ import annotations

import re
import sys
from typing import Any

from remediation import registry
from remediation.errors import ParamError
from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported

CPUFREQ = "/sys/devices/system/cpu/cpufreq"


def _policies(ctx: Context, params: dict[str, Any]) -> list[str]:
    base = ctx.path(CPUFREQ)
    names = sorted(
        (p.name for p in base.glob("policy*") if p.name[6:].isdigit()), key=lambda n: int(n[6:])
    ) if base.is_dir() else []
    if not names:
        raise Unsupported(f"no cpufreq policies under {base}: this host has no CPU frequency scaling")
    if "cpus" not in params:
        return names
    wanted = set(registry.expand_cpulist(params["cpus"]))
    out = []
    for name in names:
        affected = set(registry.expand_cpulist(_base.read_text(base / name / "affected_cpus").replace(" ", ",")))
        if affected & wanted:
            out.append(name)
    if not out:
        raise ScriptFailed(f"no cpufreq policy covers CPUs {params['cpus']}")
    return out


def read(ctx: Context, params: dict[str, Any]) -> State:
    base = ctx.path(CPUFREQ)
    return {p: _base.read_text(base / p / "scaling_governor") for p in _policies(ctx, params)}


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    gov = params["governor"]
    base = ctx.path(CPUFREQ)
    for policy in current:
        available = _base.read_text(base / policy / "scaling_available_governors").split()
        if gov not in available:
            raise Unsupported(f"{policy} does not offer governor {gov!r} (available: {' '.join(available)})")
    return {policy: gov for policy in current}


def write(ctx: Context, state: State) -> None:
    for policy, gov in check_state("cpu_governor", state).items():
        _base.write_text(_base.inside(ctx, CPUFREQ, f"{policy}/scaling_governor"), str(gov))


def check_state(script_id: str, state: State) -> State:
    """policyN -> a governor name (any the kernel may list, not only the allowlisted targets)."""

    def governor(key: str, v: Any) -> str:
        if not isinstance(v, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", v):
            raise ParamError(f"{script_id}: {key}: {v!r} is not a governor name")
        return v

    return _base.check_keyed_state(script_id, state, r"policy\d{1,4}", governor)


def main(argv: list[str] | None = None) -> int:
    return _base.main("cpu_governor", read, plan, write, argv, check_state=check_state)


if __name__ == "__main__":
    sys.exit(main())
