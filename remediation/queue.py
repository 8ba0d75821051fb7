"""The durable remediation queue: one SQLite file (WAL mode, stdlib sqlite3).

Actions move through the states of :data:`TRANSITIONS`; any other change raises
TransitionError. ``(host, entry_id, incident_id)`` is UNIQUE, so repeated sweeps never queue the
same remediation twice (``propose`` returns the existing action). Every change writes one row of
the audit trail (time, actor, event, details JSON) in the same transaction as the change.

One action per host at a time: :meth:`Queue.claim` moves an approved action to ``running`` with a
single UPDATE that also checks, inside BEGIN IMMEDIATE (SQLite's write lock), that no action of
the same host is ``running`` or ``verifying``. Two executor processes therefore never run two
actions on one host, and never both claim the same action.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast

import polars as pl

from ingest.lake import FILE_MODE, makedirs, state_root
from remediation import registry
from remediation.errors import ActionNotFound, FaultValueError, ParamError, TransitionError
from remediation.verify import parse_spec, spec_to_dict

State = Literal[
    "proposed", "approved", "running", "verifying", "succeeded", "failed", "unverifiable", "rolled_back",
    "rejected",
]
STATES: tuple[str, ...] = (
    "proposed", "approved", "running", "verifying", "succeeded", "failed", "unverifiable", "rolled_back",
    "rejected",
)
# from-state -> allowed to-states. failed -> rolled_back: an operator retries a rollback that did
# not complete (the state file is still there); verifying -> rolled_back: rollback mid-watch;
# verifying -> unverifiable: no data to judge by (the change stays, the host is free again).
TRANSITIONS: dict[str, frozenset[str]] = {
    "proposed": frozenset({"approved", "rejected"}),
    "approved": frozenset({"running", "rejected"}),
    "running": frozenset({"verifying", "succeeded", "failed"}),
    "verifying": frozenset({"succeeded", "failed", "unverifiable", "rolled_back"}),
    "succeeded": frozenset({"rolled_back"}),
    "failed": frozenset({"rolled_back"}),
    "unverifiable": frozenset({"rolled_back"}),
    "rolled_back": frozenset(),
    "rejected": frozenset(),
}
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# States that hold the host: nothing else may run there meanwhile.
BUSY = ("running", "verifying")
Mode = Literal["auto", "manual"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    host          TEXT NOT NULL,
    entry_id      TEXT NOT NULL,
    incident_id   TEXT NOT NULL,
    script_id     TEXT NOT NULL,
    params        TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('auto', 'manual')),
    verification  TEXT,
    state         TEXT NOT NULL,
    created_us    INTEGER NOT NULL,
    updated_us    INTEGER NOT NULL,
    approved_by   TEXT,
    claimed_by    TEXT,
    executed      INTEGER NOT NULL DEFAULT 0,
    output        TEXT,
    effect        TEXT,
    UNIQUE (host, entry_id, incident_id)
);
CREATE INDEX IF NOT EXISTS actions_host_state ON actions (host, state);
CREATE TABLE IF NOT EXISTS audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    action_id  INTEGER NOT NULL REFERENCES actions (id),
    time_us    INTEGER NOT NULL,
    actor      TEXT NOT NULL,
    event      TEXT NOT NULL,
    details    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_action ON audit (action_id);
CREATE TABLE IF NOT EXISTS attachments (
    host         TEXT NOT NULL,
    entry_id     TEXT NOT NULL,
    incident_id  TEXT NOT NULL,
    action_id    INTEGER NOT NULL REFERENCES actions (id),
    onset_us     INTEGER,
    time_us      INTEGER NOT NULL,
    UNIQUE (host, entry_id, incident_id)
);
CREATE INDEX IF NOT EXISTS attachments_action ON attachments (action_id);
"""
# States in which an action still answers its cause: a new incident of the same entry on the
# same host attaches to it (per-cause proposals) instead of queueing another.
OPEN = ("proposed", "approved", "running", "verifying")


def _now_us() -> int:
    return time.time_ns() // 1000


def _us(t: datetime | None) -> int | None:
    if t is None:
        return None
    if t.tzinfo is None:
        raise ParamError(f"onset {t!r} must be timezone-aware (UTC)")
    return int(t.timestamp() * 1_000_000)


@dataclass(frozen=True)
class Action:
    id: int
    host: str
    entry_id: str
    incident_id: str
    script_id: str
    params: dict[str, Any]
    mode: str
    verification: dict[str, Any] | None
    state: str
    created_us: int
    updated_us: int
    approved_by: str | None
    claimed_by: str | None
    executed: bool
    output: dict[str, Any] | None
    effect: dict[str, Any] | None

    @classmethod
    def _from_row(cls, row: sqlite3.Row) -> Action:
        def js(v: str | None) -> Any:
            return json.loads(v) if v else None

        return cls(
            id=row["id"], host=row["host"], entry_id=row["entry_id"], incident_id=row["incident_id"],
            script_id=row["script_id"], params=json.loads(row["params"]), mode=row["mode"],
            verification=js(row["verification"]), state=row["state"], created_us=row["created_us"],
            updated_us=row["updated_us"], approved_by=row["approved_by"], claimed_by=row["claimed_by"],
            executed=bool(row["executed"]), output=js(row["output"]), effect=js(row["effect"]),
        )


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    action_id: int
    time_us: int
    actor: str
    event: str
    details: dict[str, Any]


def default_path(lake: str | os.PathLike[str]) -> Path:
    """The lake's queue: in its local state directory (the lake directory itself, or the
    state directory of a lake on object storage: :func:`ingest.lake.state_root`)."""
    return state_root(lake) / "_remediation" / "queue.db"


def _create(path: Path) -> None:
    """The queue's directory and an empty database file with the lake's modes (0750/0640)
    when missing: SQLite would create the file with its own default mode (0644 less the
    umask), and gives its -wal and -shm files the mode of the database file."""
    makedirs(path.parent, durable=False)
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))


class Queue:
    """The queue over one SQLite file; open one per process (connections are not shared)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        _create(self.path)
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves so each change takes the write
        # lock up front (no lock-upgrade deadlocks between processes).
        self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._tx():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)

    @property
    def state_dir(self) -> Path:
        """Where scripts record the previous state: ``<queue dir>/state/<action id>.json``."""
        return self.path.parent / "state"

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _audit(self, action_id: int, actor: str, event: str, details: Mapping[str, Any] | None) -> None:
        self._db.execute(
            "INSERT INTO audit (action_id, time_us, actor, event, details) VALUES (?, ?, ?, ?, ?)",
            (action_id, _now_us(), actor, event, json.dumps(dict(details or {}), sort_keys=True, default=str)),
        )

    # ---- reading -------------------------------------------------------------------------------

    def get(self, action_id: int) -> Action:
        row = self._db.execute("SELECT * FROM actions WHERE id = ?", (action_id,)).fetchone()
        if row is None:
            raise ActionNotFound(f"no remediation action {action_id} in {self.path}")
        return Action._from_row(row)

    def actions(self, *, state: str | None = None, host: str | None = None) -> list[Action]:
        sql, args = "SELECT * FROM actions WHERE 1=1", cast(list[Any], [])
        if state is not None:
            sql += " AND state = ?"
            args.append(state)
        if host is not None:
            sql += " AND host = ?"
            args.append(host)
        return [Action._from_row(r) for r in self._db.execute(sql + " ORDER BY id", args)]

    def attachments(self, action_id: int) -> list[tuple[str, int | None]]:
        """(incident id, onset in us) of the incidents attached to an action, oldest first."""
        rows = self._db.execute("SELECT incident_id, onset_us FROM attachments WHERE action_id = ? ORDER BY time_us,"
                                " rowid", (action_id,))
        return [(r["incident_id"], r["onset_us"]) for r in rows]

    def audit(self, action_id: int | None = None) -> list[AuditEvent]:
        sql = "SELECT * FROM audit" + (" WHERE action_id = ?" if action_id is not None else "")
        rows = self._db.execute(sql + " ORDER BY seq", () if action_id is None else (action_id,))
        return [
            AuditEvent(r["seq"], r["action_id"], r["time_us"], r["actor"], r["event"], json.loads(r["details"]))
            for r in rows
        ]

    # ---- changing ------------------------------------------------------------------------------

    def propose(
        self,
        *,
        host: str,
        entry_id: str,
        incident_id: str,
        script_id: str,
        params: Mapping[str, Any],
        mode: Mode = "manual",
        verification: Mapping[str, Any] | None = None,
        actor: str = "scheduler",
        fault_values: Mapping[str, Sequence[Any]] | None = None,
        attach: bool = False,
        onset: datetime | None = None,
    ) -> Action:
        """Queue a remediation, or return the one already queued for (host, entry, incident).

        The script id and parameters are validated against the allowlist first, so nothing the
        executor would refuse ever enters the queue. ``fault_values`` (the entry's): a parameter
        equal to one of its fault values is refused with FaultValueError, before anything is
        written: a fix must never set the fault it is for.

        ``attach`` (per-cause proposals, what the sweep uses): while an action for (host, entry)
        is proposed, approved, running or verifying, the incident attaches to it (audit event
        ``attached``) and that action is returned; a new action after a ``succeeded`` one of the
        same (host, entry) links it (``recurrence_of``, ``came_back_after_s`` from its apply to
        ``onset``, the incident's start) in both audit trails.
        """
        for name, value in (("host", host), ("entry_id", entry_id), ("incident_id", incident_id)):
            if not isinstance(value, str) or not value:
                raise ParamError(f"propose: {name} must be a non-empty string, got {value!r}")
        if mode not in ("auto", "manual"):
            raise ParamError(f"propose: mode must be 'auto' or 'manual', got {mode!r}")
        clean = registry.validate_params(script_id, params)
        for name, bad in (fault_values or {}).items():
            if name in clean and bad and clean[name] in registry.validate_values(script_id, name, bad):
                raise FaultValueError(
                    f"propose {entry_id} on {host}: {script_id} parameter {name!r} = {clean[name]!r} is the fault "
                    f"this entry is for (fault_values.{name} = {list(bad)!r}); refused"
                )
        if verification is not None:
            verification = spec_to_dict(parse_spec(verification))
        with self._tx() as db:
            row = db.execute(
                "SELECT * FROM actions WHERE host = ? AND entry_id = ? AND incident_id = ?",
                (host, entry_id, incident_id),
            ).fetchone()
            if row is not None:
                return Action._from_row(row)
            link: dict[str, Any] = {}
            if attach:
                got = self._attach(host, entry_id, incident_id, onset, actor)
                if got is not None:
                    return self.get(got)
                link = self._recurrence(host, entry_id, onset)
            now = _now_us()
            cur = db.execute(
                "INSERT INTO actions (host, entry_id, incident_id, script_id, params, mode, verification,"
                " state, created_us, updated_us) VALUES (?, ?, ?, ?, ?, ?, ?, 'proposed', ?, ?)",
                (host, entry_id, incident_id, script_id, json.dumps(clean, sort_keys=True), mode,
                 json.dumps(dict(verification)) if verification is not None else None, now, now),
            )
            action_id = int(cur.lastrowid or 0)
            self._audit(action_id, actor, "proposed",
                        {"script_id": script_id, "params": clean, "mode": mode, "entry_id": entry_id,
                         "incident_id": incident_id, **link})
            if link:
                self._audit(link["recurrence_of"], actor, "came_back",
                            {"new_action": action_id, "incident_id": incident_id,
                             "came_back_after_s": link.get("came_back_after_s")})
        return self.get(action_id)

    def attach_to_open(self, *, host: str, entry_id: str, incident_id: str, onset: datetime | None = None,
                       actor: str = "scheduler") -> Action | None:
        """The action this incident already belongs to (queued for it, or attached), else attach it
        to the open action of (host, entry); None when there is none (a proposal is due)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT id FROM actions WHERE host = ? AND entry_id = ? AND incident_id = ?",
                (host, entry_id, incident_id),
            ).fetchone()
            got = int(row["id"]) if row is not None else self._attach(host, entry_id, incident_id, onset, actor)
        return None if got is None else self.get(got)

    def _attach(self, host: str, entry_id: str, incident_id: str, onset: datetime | None, actor: str) -> int | None:
        """Inside a transaction: the action id the incident is (now) attached to, or None."""
        db = self._db
        row = db.execute("SELECT action_id FROM attachments WHERE host = ? AND entry_id = ? AND incident_id = ?",
                         (host, entry_id, incident_id)).fetchone()
        if row is not None:
            return int(row["action_id"])
        marks = ", ".join("?" * len(OPEN))
        row = db.execute(f"SELECT id FROM actions WHERE host = ? AND entry_id = ? AND state IN ({marks})"
                         " ORDER BY id DESC LIMIT 1", (host, entry_id, *OPEN)).fetchone()
        if row is None:
            return None
        aid = int(row["id"])
        onset_us = _us(onset)
        db.execute("INSERT INTO attachments (host, entry_id, incident_id, action_id, onset_us, time_us)"
                   " VALUES (?, ?, ?, ?, ?, ?)", (host, entry_id, incident_id, aid, onset_us, _now_us()))
        self._audit(aid, actor, "attached", {"incident_id": incident_id, "onset_us": onset_us})
        return aid

    def _recurrence(self, host: str, entry_id: str, onset: datetime | None) -> dict[str, Any]:
        """Inside a transaction: the link to the latest succeeded fix of (host, entry), if any."""
        row = self._db.execute("SELECT id FROM actions WHERE host = ? AND entry_id = ? AND state = 'succeeded'"
                               " ORDER BY id DESC LIMIT 1", (host, entry_id)).fetchone()
        if row is None:
            return {}
        prev = int(row["id"])
        applied = self._db.execute("SELECT time_us FROM audit WHERE action_id = ? AND event = 'applied'"
                                   " ORDER BY seq DESC LIMIT 1", (prev,)).fetchone()
        onset_us = _us(onset)
        after = (onset_us - applied["time_us"]) / 1e6 if applied is not None and onset_us is not None else None
        return {"recurrence_of": prev, "came_back_after_s": after}

    def transition(
        self,
        action_id: int,
        to: str,
        *,
        actor: str,
        event: str | None = None,
        details: Mapping[str, Any] | None = None,
        output: Mapping[str, Any] | None = None,
        effect: Mapping[str, Any] | None = None,
        executed: bool | None = None,
    ) -> Action:
        """Move an action to ``to`` if the transition table allows it (else TransitionError)."""
        if to not in TRANSITIONS:
            raise TransitionError(f"unknown state {to!r}; states: {', '.join(STATES)}")
        with self._tx() as db:
            row = db.execute("SELECT state FROM actions WHERE id = ?", (action_id,)).fetchone()
            if row is None:
                raise ActionNotFound(f"no remediation action {action_id} in {self.path}")
            frm = row["state"]
            if to not in TRANSITIONS[frm]:
                raise TransitionError(
                    f"action {action_id}: cannot go from {frm!r} to {to!r} "
                    f"(allowed: {', '.join(sorted(TRANSITIONS[frm])) or 'none, it is final'})"
                )
            sets, args = ["state = ?", "updated_us = ?"], [to, _now_us()]
            if to == "approved":
                sets.append("approved_by = ?")
                args.append(actor)
            for col, val in (("output", output), ("effect", effect)):
                if val is not None:
                    sets.append(f"{col} = ?")
                    args.append(json.dumps(dict(val), sort_keys=True, default=str))
            if executed is not None:
                sets.append("executed = ?")
                args.append(int(executed))
            db.execute(f"UPDATE actions SET {', '.join(sets)} WHERE id = ?", (*args, action_id))
            self._audit(action_id, actor, event or to, {"from": frm, "to": to, **dict(details or {})})
        return self.get(action_id)

    def approve(self, action_id: int, *, by: str) -> Action:
        return self.transition(action_id, "approved", actor=by)

    def reject(self, action_id: int, *, by: str, reason: str = "") -> Action:
        return self.transition(action_id, "rejected", actor=by, details={"reason": reason})

    def record(self, action_id: int, *, actor: str, event: str, details: Mapping[str, Any]) -> None:
        """Add an audit row without changing state (dry runs, notes)."""
        with self._tx():
            self.get(action_id)
            self._audit(action_id, actor, event, details)

    def claim(self, *, worker: str, action_id: int | None = None, host: str | None = None) -> Action | None:
        """Atomically move one approved action (the oldest, or ``action_id``) to ``running``,
        unless its host already has a running or verifying action. Returns None if none."""
        where, args = "", cast(list[Any], [])
        if action_id is not None:
            where += " AND a.id = ?"
            args.append(action_id)
        if host is not None:
            where += " AND a.host = ?"
            args.append(host)
        with self._tx() as db:
            row = db.execute(
                "UPDATE actions SET state = 'running', claimed_by = ?, updated_us = ? WHERE id = ("
                " SELECT a.id FROM actions a WHERE a.state = 'approved'" + where +
                " AND NOT EXISTS (SELECT 1 FROM actions b WHERE b.host = a.host"
                "  AND b.state IN ('running', 'verifying'))"
                " ORDER BY a.id LIMIT 1) RETURNING id",
                (worker, _now_us(), *args),
            ).fetchone()
            if row is None:
                return None
            self._audit(row["id"], worker, "running", {"from": "approved", "to": "running", "worker": worker})
        return self.get(int(row["id"]))

    # ---- export --------------------------------------------------------------------------------

    def to_frame(self) -> pl.DataFrame:
        """The ``remediations`` lake table: one row per action, ``updated`` = its latest change
        (a state change or any audit event: an incident attached too)."""
        rows = []
        for a in self.actions():
            events = self.audit(a.id)

            def first(name: str, events: list[AuditEvent] = events) -> int | None:
                return next((e.time_us for e in events if e.event == name), None)

            eff = a.effect or {}
            proposed = next((e.details for e in events if e.event == "proposed"), {})
            attached = [i for i, _ in self.attachments(a.id)]
            rows.append({
                "action_id": a.id, "host": a.host, "entry_id": a.entry_id, "incident_id": a.incident_id,
                "script_id": a.script_id, "params": json.dumps(a.params, sort_keys=True), "mode": a.mode,
                "state": a.state, "executed": a.executed, "approved_by": a.approved_by,
                # the row changes with every audit event (an incident attached too), not only
                # with the state: readers of the latest row must see the latest attachments
                "created": a.created_us, "updated": max([a.updated_us, *(e.time_us for e in events)]),
                "approved": first("approved"),
                "started": first("running"),
                "finished": a.updated_us if a.state in TERMINAL | {"succeeded", "failed", "unverifiable"} else None,
                "verdict": eff.get("verdict"),
                "effect_before": json.dumps(eff.get("before")) if "before" in eff else None,
                "effect_after": json.dumps(eff.get("after")) if "after" in eff else None,
                "attached_incidents": json.dumps(attached) if attached else None,
                "recurrence_of": proposed.get("recurrence_of"),
                "came_back_after_s": proposed.get("came_back_after_s"),
            })
        ts = pl.Datetime("us", "UTC")
        schema: dict[str, Any] = {
            "action_id": pl.Int64, "host": pl.String, "entry_id": pl.String, "incident_id": pl.String,
            "script_id": pl.String, "params": pl.String, "mode": pl.String, "state": pl.String,
            "executed": pl.Boolean, "approved_by": pl.String, "created": pl.Int64, "updated": pl.Int64,
            "approved": pl.Int64, "started": pl.Int64, "finished": pl.Int64, "verdict": pl.String,
            "effect_before": pl.String, "effect_after": pl.String, "attached_incidents": pl.String,
            "recurrence_of": pl.Int64, "came_back_after_s": pl.Float64,
        }
        df = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
        return df.with_columns(
            pl.col(c).cast(ts) for c in ("created", "updated", "approved", "started", "finished")
        )
