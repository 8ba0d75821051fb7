"""Concluding remediation verifications from the lake (each scheduler cycle, or by hand).

An applied action with a verification spec waits in ``verifying`` (holding its host). Once its
``within_s`` has passed since the apply, or the lake's features of that host already reach that
far (the after-window is complete), the windows before the apply (``within_s`` long) and after
it (up to ``within_s``; from the action's incident start when that is later) are read from the ``features`` table the sweeps wrote and judged by
:func:`remediation.verify.verify_action`: improved -> ``succeeded``; otherwise the action is
rolled back and ends ``failed``. A verification that cannot be judged (no windows after the
apply, a feature without values) is retried until ``grace_s`` after it was due and then ends
``unverifiable``: the change stays, the host is free again, nothing waits forever.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from ingest import lake as lake_mod
from remediation.errors import RemediationError, VerificationError
from remediation.executor import Executor, ExecutorConfig
from remediation.queue import Action, Queue, default_path
from remediation.verify import parse_spec, verify_action

log = logging.getLogger(__name__)

#: how long after ``within_s`` a verification without enough data keeps waiting for late data
#: (agents commit every minute; the scheduler lags 90 s by default)
GRACE_S = 300.0


@dataclass(frozen=True)
class Outcome:
    """What one verification came to: ``state`` is the action's state afterwards
    (``verifying`` when it is not due yet or still waits for data)."""

    action_id: int
    host: str
    state: str
    verdict: str | None
    reason: str


def applied_at(queue: Queue, action: Action) -> datetime | None:
    """When the action's change was made (its ``applied`` audit event)."""
    us = next((e.time_us for e in reversed(queue.audit(action.id)) if e.event == "applied"), None)
    return None if us is None else datetime.fromtimestamp(us / 1e6, UTC)


def _features(lake: str | os.PathLike[str], host: str, start: datetime, end: datetime) -> pl.DataFrame:
    """The host's feature windows lying wholly inside [start, end]."""
    if "features" not in lake_mod.tables(lake):
        return pl.DataFrame()
    df = lake_mod.read(lake, "features", start=start, end=end, hosts=[host], on_corrupt="skip")
    if df.is_empty():
        return df
    return df.filter((pl.col("window_start") >= start) & (pl.col("window_end") <= end))


def _latest_window_end(lake: str | os.PathLike[str], host: str, since: datetime) -> datetime | None:
    if "features" not in lake_mod.tables(lake):
        return None
    df = lake_mod.read(lake, "features", start=since, hosts=[host], columns=["window_end"], on_corrupt="skip")
    return None if df.is_empty() else df["window_end"].max()  # type: ignore[return-value]


def _degraded_since(lake: str | os.PathLike[str], action: Action, lo: datetime, t_apply: datetime) -> datetime:
    """Where the before-windows start: ``lo`` (``within_s`` before the apply), or the start
    of the action's incident when that is later. A fix applied soon after the onset would
    otherwise be judged against healthy windows from before the fault (seen on a real
    host: the THP fix 30 s after the onset 'did not improve' coverage)."""
    if not action.incident_id or "incidents" not in lake_mod.tables(lake):
        return lo
    inc = lake_mod.read(lake, "incidents", start=lo, end=t_apply + timedelta(microseconds=1), hosts=[action.host],
                        columns=["incident_id", "start"], on_corrupt="skip")
    starts = inc.filter(pl.col("incident_id") == action.incident_id)["start"]
    onset = starts.min() if starts.len() else None
    return max(lo, onset) if isinstance(onset, datetime) and onset < t_apply else lo


def conclude(lake: str | os.PathLike[str], executor: Executor, action: Action, *, now: datetime, grace_s: float = GRACE_S,
             actor: str = "scheduler", force: bool = False) -> Outcome:
    """Judge one ``verifying`` action when it is due (``force``: now, whatever its due time)."""
    q = executor.queue

    def out(state: str, reason: str, verdict: str | None = None) -> Outcome:
        return Outcome(action.id, action.host, state, verdict, reason)

    if action.state != "verifying":
        return out(action.state, f"not verifying (it is {action.state})")
    t_apply = applied_at(q, action)
    if t_apply is None or not action.verification:
        why = "no apply time in its audit trail" if t_apply is None else "no verification spec"
        q.transition(action.id, "unverifiable", actor=actor, event="unverifiable", details={"reason": why})
        return out("unverifiable", why)
    spec = parse_spec(action.verification)
    within = timedelta(seconds=spec.within_s)
    due = t_apply + within
    latest = _latest_window_end(lake, action.host, t_apply)
    complete = latest is not None and latest >= due
    if not (force or complete or now >= due):
        return out("verifying", f"due at {due.isoformat()} (or once the lake's features reach it)")
    before = _features(lake, action.host, _degraded_since(lake, action, t_apply - within, t_apply), t_apply)
    after = _features(lake, action.host, t_apply, due)
    try:
        effect = verify_action(executor, action.id, before, after, actor=actor)
    except VerificationError as exc:
        if complete or now >= due + timedelta(seconds=grace_s):
            reason = (f"cannot be evaluated: {exc} (windows before the apply: {before.height}, "
                      f"after: {after.height})")
            q.transition(action.id, "unverifiable", actor=actor, event="unverifiable",
                         details={"reason": reason, "applied": t_apply.isoformat(), "due": due.isoformat()})
            log.warning("remediation %d on %s: verification %s", action.id, action.host, reason)
            return out("unverifiable", reason)
        return out("verifying", f"waiting for data: {exc}")
    except RemediationError as exc:  # the rollback of a failed verification failed: an operator must look
        log.error("remediation %d on %s: %s", action.id, action.host, exc)
        return out(q.get(action.id).state, str(exc))
    state = q.get(action.id).state
    log.info("remediation %d on %s: verification %s -> %s", action.id, action.host, effect["verdict"], state)
    return out(state, f"verdict {effect['verdict']}", effect["verdict"])


def conclude_verifications(lake: str | os.PathLike[str], queue_path: Path | None = None, *,
                           now: datetime | None = None, root: str = "/", grace_s: float = GRACE_S,
                           actor: str = "scheduler", action_id: int | None = None,
                           force: bool = False) -> list[Outcome]:
    """Every ``verifying`` action of the queue (or ``action_id`` only) judged if due; no queue
    file: nothing to do (a lake that never queued a remediation gets none)."""
    lake_p = lake_mod.as_root(lake)
    qpath = queue_path or default_path(lake_p)
    if not qpath.is_file():
        return []
    now = now or datetime.now(UTC)
    with Queue(qpath) as q:
        ex = Executor(q, ExecutorConfig(root=root), worker=actor)
        todo = [q.get(action_id)] if action_id is not None else q.actions(state="verifying")
        return [conclude(lake_p, ex, a, now=now, grace_s=grace_s, actor=actor, force=force) for a in todo]
