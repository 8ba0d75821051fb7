"""The sweep's remediation side: matched incidents proposed to the remediation queue
(dry-run, one action per cause), due verifications concluded, auto-remediation, and the
``remediations`` table following the queue."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import polars as pl

from ingest import lake as lake_mod
from ingest import schema
from jobs.grid import utc
from jobs.telemetry import Corrupt
from knowledge_base.facts import FactError, HostFacts, fill_params, in_force
from knowledge_base.loader import KnowledgeBase

log = logging.getLogger(__name__)

HOST = schema.HOST


def queue_remediations(lake: str | os.PathLike[str], incidents: pl.DataFrame, facts: pl.DataFrame | None,
                       kb: KnowledgeBase, queue_path: Path | None = None, *,
                       now: datetime | None = None) -> pl.DataFrame:
    """Propose (dry-run, idempotent) the KB remediation of every matched incident; returns the
    ``remediations`` rows of those actions (time = when proposed).

    Per cause, not per incident fragment: while an action of the same entry on the same host is
    open (proposed, approved, running, verifying) the incident attaches to it; a new proposal
    after a succeeded fix links it (came back after N s). ``{fact_before:...}`` parameters are
    the values in force before the incident's onset (past the entry's fault values); a
    proposal that would set a fault value is refused, and one whose targets the host already
    has at ``now`` (the sweep's horizon; None: the latest facts) is not queued. Both are
    logged."""
    from remediation.errors import ParamError
    from remediation.queue import Queue, default_path

    matched = incidents.filter((pl.col("status") == "matched") & pl.col("entry_id").is_not_null())
    if matched.is_empty():
        return pl.DataFrame()
    ids: list[int] = []
    with Queue(queue_path or default_path(lake)) as q:
        for inc in matched.iter_rows(named=True):
            entry = kb.by_id.get(inc["entry_id"])
            if entry is None or entry.remediation is None or entry.remediation.script is None:
                continue
            rem = entry.remediation
            script = entry.remediation.script
            # one action per cause: a fragment of a fault already answered joins that action
            known = q.attach_to_open(host=inc[HOST], entry_id=entry.id, incident_id=inc["incident_id"],
                                     onset=inc["start"])
            if known is not None:
                if known.incident_id != inc["incident_id"]:
                    log.info("incident %s (%s on %s): attached to remediation %d (%s)", inc["incident_id"],
                             entry.id, inc[HOST], known.id, known.state)
                ids.append(known.id)
                continue
            devices = list(inc["devices"] or [])
            device = devices[0] if devices else ""
            hf = HostFacts.from_frame(facts, inc[HOST], inc["start"], onset=inc["start"])
            try:
                params = fill_params(rem.params, device, hf, fault_values=rem.fault_values, devices=devices)
                current = HostFacts.from_frame(facts, inc[HOST], now, with_before=False)
                if in_force(rem.params, params, device, current):
                    log.info("incident %s (%s on %s): remediation %s %s not queued: already in force on the host",
                             inc["incident_id"], entry.id, inc[HOST], rem.script, params)
                    continue
                verification = entry.verification.spec(devices) if entry.verification is not None else None
                a = q.propose(host=inc[HOST], entry_id=entry.id, incident_id=inc["incident_id"],
                              script_id=script, params=params, mode=rem.mode, verification=verification,
                              actor="scheduler", fault_values=rem.fault_values, attach=True, onset=inc["start"])
                ids.append(a.id)
            except (FactError, ParamError, ValueError) as exc:
                log.warning("incident %s (%s on %s): remediation %s not queued: %s", inc["incident_id"],
                            entry.id, inc[HOST], rem.script, exc)
        frame = q.to_frame()
    rows = frame.filter(pl.col("action_id").is_in(ids))
    return rows.with_columns(pl.col("created").alias(schema.TIME)).select(schema.TIME, pl.exclude(schema.TIME))


def new_remediation_rows(lake: str | os.PathLike[str], rows: pl.DataFrame, corrupt: list[Corrupt]) -> pl.DataFrame:
    """``rows`` (queue_remediations') without the actions whose row the lake already has
    unchanged: an open incident asks for its proposal every sweep, the table gets it once."""
    if rows.is_empty() or "remediations" not in lake_mod.tables(lake):
        return rows
    have = lake_mod.read(lake, "remediations", columns=["action_id", "updated", "attached_incidents"],
                         on_corrupt="skip", report=corrupt)
    if have.is_empty():
        return rows
    return rows.join(have.select("action_id", pl.col("updated").cast(rows.schema["updated"]),
                                 "attached_incidents").unique(),
                     on=["action_id", "updated", "attached_incidents"], how="anti", nulls_equal=True)


def auto_remediate(lake: str | os.PathLike[str], queue_path: Path | None, root: str = "/") -> None:
    """Run the queued actions the executor may run unattended (``auto_remediate``)."""
    from remediation.executor import Executor, ExecutorConfig
    from remediation.queue import Queue, default_path

    with Queue(queue_path or default_path(lake)) as q:
        ran = Executor(q, ExecutorConfig(root=root, auto_remediate=True)).auto_run()
    if ran:
        log.info("auto-remediation ran %d action(s)", len(ran))


def export_remediations(lake: str | os.PathLike[str], queue_path: Path | None = None, *,
                        mirror: Callable[[pl.DataFrame], None] | None = None) -> int:
    """The ``remediations`` table follows the queue: one row (time = its ``updated``) for every
    action changed since the newest row the lake has of it (a state change, a verdict, an
    attached incident). Readers take each action's latest row. Returns the rows appended.

    ``mirror`` (the InfluxDB write-back) gets the rows before the lake does: a crash between
    the two sends them again next cycle, the same points, which InfluxDB stores once."""
    from remediation.queue import Queue, default_path

    lake_p = lake_mod.as_root(lake)
    qpath = queue_path or default_path(lake_p)
    if not qpath.is_file():
        return 0
    with Queue(qpath) as q:
        frame = q.to_frame()
    if frame.is_empty():
        return 0
    if "remediations" in lake_mod.tables(lake_p):
        have = lake_mod.read(lake_p, "remediations", columns=["action_id", "updated"], on_corrupt="skip")
        seen = have.group_by("action_id").agg(pl.col("updated").max().alias("seen"))
        frame = frame.join(seen, on="action_id", how="left").filter(
            pl.col("seen").is_null() | (pl.col("updated") > pl.col("seen"))).drop("seen")
    if frame.is_empty():
        return 0
    rows = frame.with_columns(pl.col("updated").alias(schema.TIME)).select(schema.TIME, pl.exclude(schema.TIME))
    if mirror is not None:
        mirror(rows)
    lake_mod.write_table(lake_p, "remediations", rows)
    return frame.height


def conclude_due_verifications(lake: str | os.PathLike[str], queue_path: Path | None, now: datetime,
                               root: str) -> dict[str, int]:
    """Each cycle: judge the verifying actions that are due (jobs.verification); returns
    outcome state -> count. A failure here is logged and does not undo the cycle's sweeps."""
    from jobs.verification import conclude_verifications
    from remediation.errors import RemediationError

    try:
        outcomes = conclude_verifications(lake, queue_path, now=utc(now), root=root)
    except (RemediationError, lake_mod.LakeError, OSError) as exc:
        log.error("concluding remediation verifications failed (retried next cycle): %s", exc)
        return {}
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.state != "verifying":
            counts[o.state] = counts.get(o.state, 0) + 1
    return counts
