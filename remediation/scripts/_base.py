"""Shared frame of every remediation script (not a script itself: ids never start with "_").

A script module supplies three functions over a JSON-able *state* dict:

- ``read(ctx, params) -> state``: the current value of everything ``apply`` may change;
- ``plan(ctx, params, current) -> state``: the desired values (same keys, or a subset);
- ``write(ctx, state)``: make the host match ``state`` (any subset of the keys ``read`` returns).

and calls :func:`main`. The frame gives every script the same verbs and guarantees:

- ``check``: read and plan only, print ``{"current", "planned", "changes"}``; changes nothing;
- ``apply``: write the current state to ``--state`` (atomically, refusing to overwrite one) BEFORE
  any change, write the plan, read it back; on any error restore the recorded state and exit 1;
- ``rollback``: write the recorded state back and read it back.

Output: one JSON object on stdout. Exit codes: 0 done, 1 failed and restored, 2 bad usage or
parameters, 3 not applicable on this host (nothing changed), 4 failed and restore failed too.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.atomic import write_atomic
from remediation import registry
from remediation.errors import ParamError, UnknownScriptError

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNSUPPORTED, EXIT_RESTORE_FAILED = 0, 1, 2, 3, 4

State = dict[str, Any]


class Unsupported(Exception):
    """The knob does not exist or cannot be changed on this host; nothing was changed."""


class ScriptFailed(Exception):
    """The change could not be made (the frame restores the recorded state)."""


@dataclass
class Context:
    """Where the script acts. ``root`` prefixes every /proc and /sys path (tests use a copy)."""

    root: Path
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    @property
    def live(self) -> bool:
        return self.root.resolve() == Path("/")


def inside(ctx: Context, tree: str, rel: str) -> Path:
    """``<root>/<tree>/<rel>`` as a real path, refused (ParamError) unless it stays inside the
    real path of the tree: no "..", no symlink leading out. Callers use the returned real path,
    so a link swapped in after the check is not followed either (writes also use O_NOFOLLOW)."""
    base = os.path.realpath(ctx.path(tree))
    real = os.path.realpath(os.path.join(base, rel))
    if os.path.isabs(rel) or os.path.commonpath([base, real]) != base:
        raise ParamError(f"{rel!r} resolves to {real}, outside {base}")
    return Path(real)


StateCheck = Callable[[str, State], State]


def check_param_state(script_id: str, state: State) -> State:
    """Default state check: every key is a parameter of the script and its value passes that
    parameter's validator (thp, cgroup_cpu_quota, nic_ring record exactly their parameters)."""
    spec = registry.get(script_id)
    if not isinstance(state, Mapping):
        raise ParamError(f"{script_id}: state must be a mapping, got {type(state).__name__}")
    out: State = {}
    for key, value in state.items():
        p = spec.param_index.get(key)
        if p is None:
            raise ParamError(f"{script_id}: unknown state key {key!r}")
        out[key] = None if value is None else p.validate(script_id, value)  # None: knob absent
    return out


def check_keyed_state(script_id: str, state: State, key_re: str, value: Callable[[str, Any], Any]) -> State:
    """A state keyed by names the script builds paths from (cpufreq policies, IRQ numbers):
    each key must match ``key_re`` in full, each value passes ``value(key, v)``."""
    if not isinstance(state, Mapping):
        raise ParamError(f"{script_id}: state must be a mapping, got {type(state).__name__}")
    out: State = {}
    for key, v in state.items():
        if not isinstance(key, str) or not re.fullmatch(key_re, key):
            raise ParamError(f"{script_id}: state key {key!r} does not match {key_re}")
        out[key] = value(key, v)
    return out


def validate_inputs(
    script_id: str,
    params: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    state: State | None = None,
    check_state: StateCheck | None = None,
) -> tuple[dict[str, Any], dict[str, Any], State | None]:
    """The one validation of what a script acts on, for a run (parameters from the command line)
    and a rollback (parameters, recorded extras and previous state from the state file) alike.

    Parameters go through the registry's validators; recorded extras named like a parameter go
    through that parameter's validator and must equal the recorded parameter; other extras are
    dropped (they are working data of ``read``, never needed to write back); ``state`` goes
    through ``check_state``. Raises ParamError naming what is wrong."""
    if not isinstance(params, Mapping):
        raise ParamError(f"{script_id}: parameters must be a mapping, got {type(params).__name__}")
    clean = registry.validate_params(script_id, {k: v for k, v in params.items() if v is not None})
    spec = registry.get(script_id)
    kept: dict[str, Any] = {}
    if extra is not None and not isinstance(extra, Mapping):
        raise ParamError(f"{script_id}: recorded extra must be a mapping, got {type(extra).__name__}")
    for key, value in (extra or {}).items():
        p = spec.param_index.get(key)
        if p is None:
            continue
        v = p.validate(script_id, value)
        if key in clean and clean[key] != v:
            raise ParamError(f"{script_id}: recorded {key!r} = {value!r} disagrees with the recorded "
                             f"parameter {clean[key]!r}")
        kept[key] = v
    checked = None if state is None else (check_state or check_param_state)(script_id, state)
    return clean, kept, checked


def read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise Unsupported(f"{path} does not exist on this host") from None
    except OSError as exc:
        raise ScriptFailed(f"cannot read {path}: {exc.strerror or exc}") from exc


def write_text(path: Path, value: str) -> None:
    """Write a sysfs/procfs value as one write() (the kernel parses each write separately)."""
    try:
        # O_NOFOLLOW: a knob file that is a symlink is never written through (real /proc and
        # /sys knob files are never links)
        flags = os.O_WRONLY | os.O_NOFOLLOW | (0 if _is_kernel_file(path) else os.O_TRUNC)
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Unsupported(f"{path} does not exist on this host") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScriptFailed(f"refusing to write {path}: it is a symbolic link") from None
        raise ScriptFailed(f"cannot open {path} for writing: {exc.strerror or exc}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise ScriptFailed(f"the kernel refused {value!r} for {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _is_kernel_file(path: Path) -> bool:
    # O_TRUNC on a real /proc or /sys file is harmless but meaningless; on a test copy it is
    # needed so a shorter value does not leave the tail of the old one.
    s = str(path.resolve())
    return s.startswith(("/proc/", "/sys/"))


def bracketed(text: str) -> str:
    """The selected value of a sysfs choice file: ``"always [madvise] never"`` -> ``"madvise"``."""
    start, end = text.find("["), text.find("]")
    if start >= 0 and end > start:
        return text[start + 1 : end]
    return text.strip()


def _atomic_write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # overwrite=False: FileExistsError if the target exists, never the state of an earlier apply
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True), mode=0o600, overwrite=False)


def _diff(wanted: State, now: State) -> State:
    """The keys of ``wanted`` whose value differs from ``now`` (write() accepts any subset)."""
    return {k: v for k, v in wanted.items() if now.get(k) != v}


def changes(current: State, planned: State) -> dict[str, list[Any]]:
    return {k: [current.get(k), v] for k, v in planned.items() if current.get(k) != v}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def main(
    script_id: str,
    read: Callable[[Context, dict[str, Any]], State],
    plan: Callable[[Context, dict[str, Any], State], State],
    write: Callable[[Context, State], None],
    argv: Sequence[str] | None = None,
    after_apply: Callable[[Context, dict[str, Any]], dict[str, Any]] | None = None,
    check_state: StateCheck | None = None,
) -> int:
    """Run one verb of a script; returns the exit code (callers ``sys.exit`` it).
    ``check_state`` validates a state the script writes (the plan on apply, the recorded state
    on rollback); default :func:`check_param_state`."""
    try:
        spec = registry.get(script_id)
    except UnknownScriptError as exc:
        _emit({"script": script_id, "ok": False, "error": str(exc)})
        return EXIT_USAGE
    parser = argparse.ArgumentParser(prog=f"python -m {spec.module}", description=spec.summary)
    parser.add_argument("verb", choices=("check", "apply", "rollback"))
    parser.add_argument("--root", default="/", help="prefix of /proc and /sys paths (default /)")
    parser.add_argument("--state", help="state file: written by apply, read by rollback")
    for p in spec.params:
        parser.add_argument(f"--{p.name}", dest=f"p_{p.name}", metavar=p.type.upper(), help=p.description)
    args = parser.parse_args(argv)
    raw = {p.name: getattr(args, f"p_{p.name}") for p in spec.params}
    ctx = Context(root=Path(args.root))
    out: dict[str, Any] = {"script": script_id, "verb": args.verb, "root": str(ctx.root)}
    try:
        if args.verb == "rollback":
            return _rollback(ctx, script_id, args.state, read, write, out, check_state)
        params, _, _ = validate_inputs(script_id, raw)
        out["params"] = params
        if args.verb == "check":
            current = read(ctx, params)
            planned = plan(ctx, params, current)
            out.update(ok=True, current=current, planned=planned, changes=changes(current, planned))
            out["notes"] = ctx.notes
            _emit(out)
            return EXIT_OK
        return _apply(ctx, script_id, args.state, params, read, plan, write, after_apply, out, check_state)
    except ParamError as exc:
        out.update(ok=False, error=str(exc))
        _emit(out)
        return EXIT_USAGE
    except Unsupported as exc:
        out.update(ok=False, unsupported=True, error=str(exc), notes=ctx.notes)
        _emit(out)
        return EXIT_UNSUPPORTED
    except ScriptFailed as exc:
        out.update(ok=False, error=str(exc), notes=ctx.notes)
        _emit(out)
        return EXIT_FAILED


def _apply(
    ctx: Context,
    script_id: str,
    state_path: str | None,
    params: dict[str, Any],
    read: Callable[[Context, dict[str, Any]], State],
    plan: Callable[[Context, dict[str, Any], State], State],
    write: Callable[[Context, State], None],
    after_apply: Callable[[Context, dict[str, Any]], dict[str, Any]] | None,
    out: dict[str, Any],
    check_state: StateCheck | None = None,
) -> int:
    if not state_path:
        raise ParamError(f"{script_id}: apply needs --state FILE to record the previous state")
    current = read(ctx, params)
    planned = plan(ctx, params, current)
    # the plan, and the state recorded for rollback, pass the check a rollback applies: what
    # is recorded can always be written back
    validate_inputs(script_id, params, ctx.extra, planned, check_state)
    validate_inputs(script_id, params, ctx.extra, current, check_state)
    record = {
        "script": script_id,
        "params": params,
        "root": str(ctx.root),
        "time": time.time(),
        "previous": current,
        "planned": planned,
        "extra": ctx.extra,
    }
    try:
        _atomic_write_json(Path(state_path), record)
    except FileExistsError:
        raise ScriptFailed(f"state file {state_path} exists: this action was applied before") from None
    except OSError as exc:
        raise ScriptFailed(f"cannot record the previous state in {state_path}: {exc}") from exc
    out.update(previous=current, planned=planned, changes=changes(current, planned))
    try:
        write(ctx, planned)
        got = read(ctx, params)
        wrong = {k: [v, got.get(k)] for k, v in planned.items() if got.get(k) != v}
        if wrong:
            raise ScriptFailed(f"read-back differs from the plan (wanted, got): {wrong}")
        if after_apply is not None:
            out["after_apply"] = after_apply(ctx, params)
    except (ScriptFailed, Unsupported, OSError) as exc:
        out.update(ok=False, error=str(exc))
        try:
            # Write back only what differs: a knob that refused the change is left alone.
            undo = _diff(current, read(ctx, params))
            if undo:
                write(ctx, undo)
            out["restored"] = read(ctx, params) == current
        except Exception as exc2:  # noqa: BLE001 - report any restore failure, never hide it
            out.update(restored=False, restore_error=str(exc2))
        out["notes"] = ctx.notes
        _emit(out)
        return EXIT_FAILED if out["restored"] else EXIT_RESTORE_FAILED
    out.update(ok=True, applied=got, notes=ctx.notes)
    _emit(out)
    return EXIT_OK


def _rollback(
    ctx: Context,
    script_id: str,
    state_path: str | None,
    read: Callable[[Context, dict[str, Any]], State],
    write: Callable[[Context, State], None],
    out: dict[str, Any],
    check_state: StateCheck | None = None,
) -> int:
    if not state_path:
        raise ParamError(f"{script_id}: rollback needs --state FILE")
    try:
        record = json.loads(Path(state_path).read_text())
    except FileNotFoundError:
        raise ScriptFailed(f"no state file {state_path}: nothing was applied, nothing to roll back") from None
    except (OSError, ValueError) as exc:
        raise ScriptFailed(f"unreadable state file {state_path}: {exc}") from exc
    if not isinstance(record, dict) or "previous" not in record:
        raise ScriptFailed(f"state file {state_path} has no recorded previous state")
    if record.get("script") != script_id:
        raise ScriptFailed(f"state file {state_path} belongs to {record.get('script')!r}, not {script_id!r}")
    if Path(record.get("root", "/")).resolve() != ctx.root.resolve():
        raise ScriptFailed(f"state file {state_path} was recorded under root {record.get('root')!r}, not {ctx.root}")
    # the state file is input like a command line: validated exactly as a run is
    try:
        params, extra, previous = validate_inputs(script_id, record.get("params") or {}, record.get("extra"),
                                                  record["previous"], check_state)
    except ParamError as exc:
        raise ParamError(f"state file {state_path}: {exc}") from None
    assert previous is not None
    ctx.extra.update(extra)
    undo = _diff(previous, read(ctx, params))
    if undo:
        write(ctx, undo)
    got = read(ctx, params)
    wrong = {k: [v, got.get(k)] for k, v in previous.items() if got.get(k) != v}
    if wrong:
        raise ScriptFailed(f"after rollback the state differs from the recorded one (wanted, got): {wrong}")
    out.update(ok=True, restored=previous, notes=ctx.notes)
    _emit(out)
    return EXIT_OK
