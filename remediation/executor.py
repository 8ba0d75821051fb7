"""Runs queued actions with the curated scripts, and nothing else.

Every command is ``[sys.executable, "-m", "remediation.scripts.<id>", verb, "--root", R,
"--state", <state dir>/<action id>.json, "--name=value", ...]`` built from the allowlist and
validated parameters, run with ``shell=False`` in its own process group, with a timeout (the whole
group is killed). Dry-run (``check``: reads the current state, records the exact command and the
planned change, changes nothing) is the default; ``execute=True`` really applies.

A failed or timed-out apply leaves the action ``failed`` with its output, and the host as it was:
the script restores on its own errors, and after a timeout (the script was killed mid-way) the
executor runs the script's rollback from the state file the script wrote before changing anything.

An action whose parameters set a value its knowledge-base entry names as the fault
(``fault_values``, e.g. THP ``enabled = never``) is refused, whenever it was queued: the queue
refuses such proposals now, but a queue written before that check may still hold some.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remediation import registry
from remediation.errors import FaultValueError, RemediationError, TransitionError
from remediation.queue import Action, Queue

#: entry id -> its fault values (parameter -> the values that are the fault)
FaultValues = Callable[[str], Mapping[str, Sequence[Any]]]

log = logging.getLogger(__name__)

_OUTPUT_LIMIT = 64_000  # characters of stdout/stderr kept in the audit trail
_REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ExecutorConfig:
    """``[remediation]`` settings. ``auto_remediate`` enables unattended runs of safe scripts."""

    root: str = "/"
    auto_remediate: bool = False
    timeout_s: float | None = None  # None: the script's own timeout from the registry
    python: str = sys.executable
    queue: str | None = None  # the queue file; None: <lake>/_remediation/queue.db

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "[remediation]") -> ExecutorConfig:
        known = {"root", "auto_remediate", "timeout_s", "queue"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        auto = d.get("auto_remediate", False)
        if not isinstance(auto, bool):
            raise ValueError(f"{where} auto_remediate: expected true or false, got {auto!r}")
        timeout = d.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ValueError(f"{where} timeout_s: expected a positive number, got {timeout!r}")
        root = d.get("root", "/")
        if not isinstance(root, str) or not root:
            raise ValueError(f"{where} root: expected a path, got {root!r}")
        queue = d.get("queue")
        if queue is not None and (not isinstance(queue, str) or not queue.strip()):
            raise ValueError(f"{where} queue: expected a file path, got {queue!r}")
        return cls(root=root, auto_remediate=auto, timeout_s=float(timeout) if timeout else None, queue=queue)


@dataclass
class RunResult:
    """One script run: the exact argv, exit code, parsed JSON output, raw streams."""

    argv: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    stdout: str
    stderr: str
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def as_dict(self) -> dict[str, Any]:
        return {
            "argv": self.argv, "returncode": self.returncode, "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 3), "result": self.result,
            "stdout": self.stdout[-_OUTPUT_LIMIT:], "stderr": self.stderr[-_OUTPUT_LIMIT:],
        }


def kb_fault_values() -> FaultValues:
    """The shipped knowledge base's fault values per entry (loaded once, on first use); an
    entry it does not know, or one without a remediation, has none."""
    @functools.cache
    def table() -> dict[str, Mapping[str, Sequence[Any]]]:
        # Imported here: the knowledge base names this package's scripts (it imports
        # remediation.registry), so a module-level import would be circular.
        from knowledge_base.loader import load_kb

        return {e.id: e.remediation.fault_values if e.remediation else {} for e in load_kb()}

    def lookup(entry_id: str) -> Mapping[str, Sequence[Any]]:
        return table().get(entry_id, {})

    return lookup


class Executor:
    """Runs actions of one queue. ``worker`` names this executor in the audit trail;
    ``fault_values``: entry id -> its fault values (default: the shipped knowledge base)."""

    def __init__(self, queue: Queue, config: ExecutorConfig | None = None, *, worker: str | None = None,
                 fault_values: FaultValues | None = None) -> None:
        self.queue = queue
        self.config = config or ExecutorConfig()
        self.worker = worker or f"executor@{os.uname().nodename}:{os.getpid()}"
        self.fault_values = fault_values or kb_fault_values()

    def check_fault_values(self, action: Action) -> None:
        """Raise FaultValueError when ``action`` sets a parameter to a fault value of its
        entry; RemediationError when the fault values cannot be read (fails closed)."""
        try:
            faults = self.fault_values(action.entry_id)
        except Exception as exc:  # any failure to read them means: do not run
            raise RemediationError(f"action {action.id} ({action.entry_id} on {action.host}): cannot read the "
                                   f"entry's fault values ({type(exc).__name__}: {exc}); refused") from exc
        params = registry.validate_params(action.script_id, action.params)
        for name, bad in faults.items():
            if name in params and bad and params[name] in registry.validate_values(action.script_id, name, bad):
                raise FaultValueError(
                    f"action {action.id} ({action.entry_id} on {action.host}): {action.script_id} parameter "
                    f"{name!r} = {params[name]!r} is the fault this entry is for (fault_values.{name} = "
                    f"{list(bad)!r}); it was queued before proposals were checked against them; refused "
                    "(reject it: unveil remediate reject ID)")

    # ---- commands ------------------------------------------------------------------------------

    def state_path(self, action_id: int) -> Path:
        return self.queue.state_dir / f"{int(action_id)}.json"

    def command(self, action: Action, verb: str) -> list[str]:
        """The exact argv for ``verb``; refuses any script outside the allowlist."""
        if verb not in ("check", "apply", "rollback"):
            raise RemediationError(f"unknown verb {verb!r}")
        spec = registry.get(action.script_id)  # UnknownScriptError for anything not allowlisted
        argv = [self.config.python, "-m", spec.module, verb, "--root", str(self.config.root)]
        if verb != "check":
            argv += ["--state", str(self.state_path(action.id))]
        if verb != "rollback":
            argv += registry.to_argv(spec.id, action.params)
        return argv

    def _timeout(self, action: Action) -> float:
        return self.config.timeout_s or registry.get(action.script_id).timeout_s

    def _run(self, argv: list[str], timeout_s: float) -> RunResult:
        env = dict(os.environ)
        # The scripts are modules of this package: make sure the child imports this copy.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, shell=False, start_new_session=True, env=env,
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: helpers like ethtool too
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        result: dict[str, Any] = {}
        for line in reversed((out or "").strip().splitlines()):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
        return RunResult(argv, None if timed_out else proc.returncode, timed_out,
                         time.monotonic() - start, out or "", err or "", result)

    # ---- actions -------------------------------------------------------------------------------

    def dry_run(self, action_id: int, *, actor: str) -> RunResult:
        """Run ``check``: record the exact apply command and the planned change; change nothing."""
        action = self.queue.get(action_id)
        if action.state not in ("proposed", "approved"):
            raise TransitionError(f"action {action_id} is {action.state}: a dry run is for proposed or approved actions")
        self.check_fault_values(action)
        res = self._run(self.command(action, "check"), self._timeout(action))
        self.queue.record(action_id, actor=actor, event="dry_run", details={
            "would_run": self.command(action, "apply"), **res.as_dict(),
        })
        return res

    def execute(self, action_id: int, *, actor: str) -> Action:
        """Really apply one approved action (claimed atomically; refused if its host is busy)."""
        action = self.queue.get(action_id)
        registry.validate_params(action.script_id, action.params)
        if action.state != "approved":
            raise TransitionError(f"action {action_id} is {action.state}; only approved actions run")
        self.check_fault_values(action)
        claimed = self.queue.claim(worker=self.worker, action_id=action_id)
        if claimed is None:
            busy = [a.id for a in self.queue.actions(host=action.host) if a.state in ("running", "verifying")]
            raise TransitionError(
                f"action {action_id} not started: host {action.host} is busy with action(s) {busy}"
                if busy else f"action {action_id} was claimed by another executor"
            )
        return self._apply(claimed, actor=actor)

    def run_next(self, *, actor: str | None = None) -> Action | None:
        """Claim and apply the oldest approved action whose host is free; None when none."""
        claimed = self.queue.claim(worker=self.worker)
        return self._apply(claimed, actor=actor or self.worker) if claimed else None

    def _apply(self, action: Action, *, actor: str) -> Action:
        try:
            self.check_fault_values(action)
            argv = self.command(action, "apply")
        except RemediationError as exc:
            return self.queue.transition(action.id, "failed", actor=actor, event="refused",
                                         details={"error": str(exc)}, executed=False)
        res = self._run(argv, self._timeout(action))
        details = res.as_dict()
        if res.ok:
            to = "verifying" if action.verification else "succeeded"
            return self.queue.transition(action.id, to, actor=actor, event="applied", details=details,
                                         output=details, executed=True)
        if res.timed_out and self.state_path(action.id).exists():
            # Killed mid-change: put the host back from the state the script recorded first.
            rb = self._run(self.command(action, "rollback"), self._timeout(action))
            details["restore"] = rb.as_dict()
        return self.queue.transition(action.id, "failed", actor=actor,
                                     event="timeout" if res.timed_out else "apply_failed",
                                     details=details, output=details, executed=True)

    def rollback(
        self, action_id: int, *, actor: str, to: str = "rolled_back", effect: Mapping[str, Any] | None = None
    ) -> RunResult:
        """Run the script's rollback from the recorded state; the action goes to ``to`` on success
        (``rolled_back``; verification passes ``failed``). A failed rollback is recorded and
        raised, leaving the state as it was so an operator can retry."""
        action = self.queue.get(action_id)
        if not self.state_path(action_id).exists():
            raise TransitionError(f"action {action_id} has no recorded state ({self.state_path(action_id)}): "
                                  "it was never applied, nothing to roll back")
        if action.state not in ("verifying", "succeeded", "failed", "unverifiable"):
            raise TransitionError(f"action {action_id} is {action.state}; cannot roll back")
        res = self._run(self.command(action, "rollback"), self._timeout(action))
        if not res.ok:
            self.queue.record(action_id, actor=actor, event="rollback_failed", details=res.as_dict())
            raise RemediationError(
                f"rollback of action {action_id} failed (exit {res.returncode}, timed out: {res.timed_out}): "
                f"{res.result.get('error') or res.stderr.strip()[-500:]}"
            )
        if action.state == to:
            self.queue.record(action_id, actor=actor, event="rolled_back", details=res.as_dict())
        else:
            self.queue.transition(action_id, to, actor=actor, event="rolled_back", details=res.as_dict(),
                                  effect=effect)
        return res

    def auto_approve(self) -> list[Action]:
        """Approve proposed ``auto`` actions whose script is safe_for_auto, if enabled in config."""
        if not self.config.auto_remediate:
            return []
        done = []
        for a in self.queue.actions(state="proposed"):
            spec = registry.SCRIPTS.get(a.script_id)
            if a.mode == "auto" and spec is not None and spec.safe_for_auto:
                done.append(self.queue.transition(a.id, "approved", actor="auto",
                                                  details={"reason": "safe_for_auto and auto_remediate"}))
        return done

    def auto_run(self) -> list[Action]:
        """One unattended pass: auto-approve, then apply approved auto actions host by host."""
        if not self.config.auto_remediate:
            return []
        self.auto_approve()
        ran = []
        for a in self.queue.actions(state="approved"):
            spec = registry.SCRIPTS.get(a.script_id)
            if a.mode != "auto" or spec is None or not spec.safe_for_auto:
                continue
            claimed = self.queue.claim(worker=self.worker, action_id=a.id)
            if claimed is not None:
                ran.append(self._apply(claimed, actor="auto"))
        return ran
