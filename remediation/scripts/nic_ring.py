"""NIC RX/TX ring sizes, read with ``ethtool -g IFACE`` and set with ``ethtool -G IFACE rx N tx M``.

Drivers without ring control (some virtio or veth) answer "Operation not supported": the script
says so and changes nothing. ``--root`` does not apply (ethtool talks to the live kernel); with a
root other than / the script refuses to apply.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

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


def read(ctx: Context, params: dict[str, Any]) -> State:
    _need_live(ctx)
    ring = parse_ring(_ethtool(["-g", params["iface"]]))
    ctx.extra["iface"] = params["iface"]
    ctx.extra["max"] = ring["max"]
    return {k: v for k, v in ring["current"].items() if k in ("rx", "tx")}


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    out: State = {}
    for key in ("rx", "tx"):
        if key in params:
            limit = ctx.extra["max"].get(key)
            if limit is not None and params[key] > limit:
                raise ScriptFailed(f"{key} {params[key]} exceeds the NIC maximum {limit}")
            out[key] = params[key]
    return out


def write(ctx: Context, state: State) -> None:
    _need_live(ctx)
    iface = ctx.extra["iface"]
    now = parse_ring(_ethtool(["-g", iface]))["current"]
    args = ["-G", iface]
    for key in ("rx", "tx"):
        # ethtool exits non-zero when asked to set a value that is already current.
        if state.get(key) is not None and state[key] != now.get(key):
            args += [key, str(int(state[key]))]
    if len(args) > 2:
        _ethtool(args)


def main(argv: list[str] | None = None) -> int:
    return _base.main("nic_ring", read, plan, write, argv)


if __name__ == "__main__":
    sys.exit(main())
