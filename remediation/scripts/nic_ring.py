"""NIC RX/TX ring sizes, read with ``ethtool -g IFACE`` and set with ``ethtool -G IFACE rx N tx M``.

``iface`` is one interface or several (comma-separated: every NIC of an incident), each set to
the same sizes. One interface keeps the state ``{"rx": N, "tx": M}`` (its name in the recorded
extra); several are keyed ``rx@IFACE``, ``tx@IFACE``. Drivers without ring control (some virtio
or veth) answer "Operation not supported": the script says so, naming the interface, and
changes nothing. ``--root`` does not apply (ethtool talks to the live kernel); with a root other
than / the script refuses to apply.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

from remediation import registry
from remediation.errors import ParamError
from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported

TIMEOUT_S = 30


def parse_ring(text: str) -> dict[str, dict[str, int | None]]:
    """``ethtool -g`` output -> {"max": {"rx": .., "tx": ..}, "current": {...}} (None for n/a)."""
    out: dict[str, dict[str, int | None]] = {"max": {}, "current": {}}
    section: str | None = None
    for line in text.splitlines():
        if line.startswith("Pre-set maximums"):
            section = "max"
        elif line.startswith("Current hardware settings"):
            section = "current"
        elif section:
            m = re.match(r"^(RX|TX):\s+(\S+)\s*$", line)
            if m:
                out[section][m.group(1).lower()] = int(m.group(2)) if m.group(2).isdigit() else None
    if not out["current"]:
        raise ScriptFailed("unrecognised ethtool -g output")
    return out


def _ethtool(args: list[str]) -> str:
    exe = shutil.which("ethtool") or next(
        (p for p in ("/usr/sbin/ethtool", "/sbin/ethtool") if os.path.exists(p)), None
    )
    if exe is None:
        raise Unsupported("ethtool is not installed (Debian/Ubuntu package: ethtool)")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        if "not supported" in msg.lower():
            raise Unsupported(f"{' '.join(args[:2])}: the driver does not support ring sizes ({msg})")
        if "no such device" in msg.lower():
            raise Unsupported(f"no interface {args[1]!r} on this host")
        raise ScriptFailed(f"ethtool {' '.join(args)} failed: {msg}")
    return proc.stdout


def _need_live(ctx: Context) -> None:
    if not ctx.live:
        raise Unsupported("nic_ring acts on live interfaces through ethtool; --root must be /")


def _ifaces(ctx: Context, params: dict[str, Any]) -> dict[str, str]:
    """State key suffix -> interface acted on: one interface named keeps the single keys
    (``rx``, ``tx``) and its name in ``extra``; several are keyed ``rx@IFACE``."""
    names = str(params.get("iface", ctx.extra.get("iface", ""))).split(",")
    if len(names) == 1:
        ctx.extra["iface"] = names[0]
        return {"": names[0]}
    return {f"@{n}": n for n in dict.fromkeys(names)}


def read(ctx: Context, params: dict[str, Any]) -> State:
    _need_live(ctx)
    state: State = {}
    ctx.extra["max"] = {}
    for suffix, iface in _ifaces(ctx, params).items():
        ring = parse_ring(_ethtool(["-g", iface]))
        ctx.extra["max"][iface] = ring["max"]
        state.update({k + suffix: v for k, v in ring["current"].items() if k in ("rx", "tx")})
    return state


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    out: State = {}
    for suffix, iface in _ifaces(ctx, params).items():
        for knob in ("rx", "tx"):
            if knob in params:
                limit = ctx.extra["max"][iface].get(knob)
                if limit is not None and params[knob] > limit:
                    raise ScriptFailed(f"{iface}: {knob} {params[knob]} exceeds the NIC maximum {limit}")
                out[knob + suffix] = params[knob]
    return out


def write(ctx: Context, state: State) -> None:
    _need_live(ctx)
    wanted: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        knob, _, iface = key.partition("@")
        wanted.setdefault(iface or ctx.extra["iface"], {})[knob] = value
    for iface, knobs in wanted.items():
        now = parse_ring(_ethtool(["-g", iface]))["current"]
        args = ["-G", iface]
        for knob in ("rx", "tx"):
            # ethtool exits non-zero when asked to set a value that is already current.
            if knobs.get(knob) is not None and knobs[knob] != now.get(knob):
                args += [knob, str(int(knobs[knob]))]
        if len(args) > 2:
            _ethtool(args)


_STATE_KEY = re.compile(rf"(rx|tx)(@{registry.IFACE_RE})?")


def check_state(script_id: str, state: State) -> State:
    """``{"rx": N, "tx": M}`` (one interface) or ``{"rx@IFACE": N, ...}`` (several), each size
    within what the registry allows for ``rx`` and ``tx`` (None: no such ring)."""
    spec = registry.get(script_id)
    if not isinstance(state, dict) or not all(isinstance(k, str) and _STATE_KEY.fullmatch(k) for k in state):
        raise ParamError(f"{script_id}: state must be {{'rx': N, 'tx': M}} or {{'rx@IFACE': N, ...}}, got {state!r}")
    return {k: None if v is None else spec.param_index[k.partition("@")[0]].validate(script_id, v)
            for k, v in state.items()}


def main(argv: list[str] | None = None) -> int:
    return _base.main("nic_ring", read, plan, write, argv, check_state=check_state)


if __name__ == "__main__":
    sys.exit(main())
