"""Per-host watermarks and the staged commit that makes every window processed exactly once.

State lives in the lake, under ``<lake>/_state/`` (invisible to readers: it starts with ``_``)::

    _state/watermarks.json              {"version": 1, "hosts": {host: {"watermark": ISO, "open_since": ISO|null}}}
    _state/scheduler.lock               flock: one scheduler cycle per lake at a time
    _state/staging/<sweep id>/lake/...  a sweep's outputs, laid out as in the lake
    _state/staging/<sweep id>/COMMIT.json   the commit record (its presence is the commit point)

A host's **watermark** W means: every window of that host with ``window_end <= W`` has
been processed (its features, scores, findings written). ``open_since`` is the start of
the host's findings not yet closed into an incident (an incident still growing at W).

The protocol of one sweep ``[W, E)`` (docs/operations.md has the crash table):

1. outputs are written under ``staging/<id>/lake`` (same relative paths as in the lake);
2. ``COMMIT.json`` (the files, the new watermarks) is written atomically: **commit point**;
3. each staged file is renamed into the lake (one atomic rename each, same file system);
4. the watermarks file is replaced atomically with the new watermarks;
5. the staging directory is removed.

Recovery (at the start of every cycle, under the lock): a staging directory without
``COMMIT.json`` is deleted (nothing of it was visible); one with it is rolled forward
(steps 3-5; a file already moved is simply absent from staging). A crash anywhere
therefore leaves each window either processed once or not at all, never twice.

A lake on object storage (``s3://``) keeps this state in the directory configured for it
(:func:`ingest.lake.state_root`: ``[lake] state``), and step 3 is a PUT of each staged file
to its key instead of a rename: an object appears whole when its PUT succeeds, and a
roll-forward puts the same bytes at the same key again. The staged files stay until step 5
(the write-back reads them there).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ingest import lake as lake_mod
from ingest import objstore
from ingest.atomic import FILE_MODE, fsync_path

log = logging.getLogger(__name__)

STATE_DIR = "_state"
WATERMARKS = "watermarks.json"
LOCK = "scheduler.lock"
STAGING = "staging"
COMMIT = "COMMIT.json"
OWNER = "owner.json"  # (object storage: which state directory sweeps the lake, see claim)
VERSION = 1

#: test-only hooks: make the process SIGKILL itself (or sleep) at a named point
CRASH_ENV = "UNVEIL_TEST_CRASH_AT"
PAUSE_ENV = "UNVEIL_TEST_PAUSE_AT"  # "point:seconds"


class StateError(ValueError):
    """The scheduler state under <lake>/_state cannot be used; the message names the file."""


def checkpoint(point: str) -> None:
    """A named point of the protocol. Tests set UNVEIL_TEST_CRASH_AT=<point> to kill -9 the
    process exactly here, or UNVEIL_TEST_PAUSE_AT=<point>:<seconds> to stall it."""
    if os.environ.get(CRASH_ENV) == point:
        log.warning("test hook: SIGKILL at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get(PAUSE_ENV, "")
    name, _, secs = pause.partition(":")
    if name == point and secs:
        log.warning("test hook: pausing %s s at %s", secs, point)
        time.sleep(float(secs))


def state_dir(lake: str | os.PathLike[str]) -> Path:
    """``_state`` of the lake's local state directory (the lake itself when it is one)."""
    return lake_mod.state_root(lake) / STATE_DIR


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat()


def _parse(ts: str | None, where: str) -> datetime | None:
    if ts is None:
        return None
    try:
        out = datetime.fromisoformat(ts)
    except (TypeError, ValueError):
        raise StateError(f"{where}: bad time {ts!r}") from None
    return out if out.tzinfo else out.replace(tzinfo=UTC)


_fsync_dir = fsync_path


def write_json_atomic(path: Path, obj: Any) -> None:
    """Temp file, fsync, rename, fsync the directory: readers see the old or the new file."""
    lake_mod.makedirs(path.parent, durable=False)
    lake_mod.write_json_atomic(path, obj, pretty=True)


# ------------------------------------------------------------------- watermarks


@dataclass(frozen=True)
class HostMark:
    watermark: datetime
    open_since: datetime | None = None
    #: the host's first telemetry time (jobs.telemetry.first_times), kept with the mark so a
    #: command started afresh (``unveil schedule --once`` from cron) does not read every
    #: host's first files again; None: not recorded (a file from before 2026-12-06)
    first: datetime | None = None

    def to_json(self) -> dict[str, str | None]:
        out = {"watermark": _iso(self.watermark),
               "open_since": _iso(self.open_since) if self.open_since is not None else None}
        if self.first is not None:
            out["first"] = _iso(self.first)
        return out

    @classmethod
    def from_json(cls, rec: Mapping[str, Any], where: str) -> HostMark:
        wm = _parse(rec.get("watermark"), where)
        if wm is None:
            raise StateError(f"{where}: no watermark")
        return cls(wm, _parse(rec.get("open_since"), where), _parse(rec.get("first"), where))


def load(lake: str | os.PathLike[str]) -> dict[str, HostMark]:
    """The committed watermarks (empty when the lake was never swept by the scheduler)."""
    path = state_dir(lake) / WATERMARKS
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateError(f"watermark file {path} is unreadable: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("hosts"), dict):
        raise StateError(f"watermark file {path}: expected version {VERSION} with a 'hosts' table")
    out: dict[str, HostMark] = {}
    for host, rec in doc["hosts"].items():
        where = f"{path} host {host!r}"
        if not isinstance(rec, dict):
            raise StateError(f"{where}: expected a table")
        out[host] = HostMark.from_json(rec, where)
    return out


def save(lake: str | os.PathLike[str], updates: Mapping[str, HostMark]) -> None:
    """Merge ``updates`` into the committed watermarks, atomically."""
    marks = load(lake)
    marks.update(updates)
    write_json_atomic(state_dir(lake) / WATERMARKS, {
        "version": VERSION, "updated": _iso(datetime.now(UTC)),
        "hosts": {h: m.to_json() for h, m in sorted(marks.items())},
    })


# ------------------------------------------------------------------------- lock


@contextlib.contextmanager
def scheduler_lock(lake: str | os.PathLike[str]) -> Iterator[bool]:
    """Non-blocking flock on ``_state/scheduler.lock``; yields False when another process
    holds it. The kernel drops the lock when its holder dies, so kill -9 never wedges it."""
    d = state_dir(lake)
    lake_mod.makedirs(d, durable=False)
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield True
    finally:
        os.close(fd)


def claim(lake: str | os.PathLike[str], *, take: bool = True) -> None:
    """For a lake on object storage, under the lock: make sure this state directory is the
    one that sweeps it. Each state directory sweeps every window once, so two (a standby on
    another machine with its own disk, a state directory lost and made anew) would store
    every window twice. The first sweep puts ``_state/owner.json`` (this directory's id,
    host and path; invisible to readers) in the bucket; a sweep from a directory with
    another id stops and names the owner. (Two first sweeps at the same moment can both
    claim: pyarrow.fs has no conditional put; the later one stops at its next cycle.)
    ``take=False`` (a one-shot ``unveil sweep``): check only, never claim an unclaimed
    lake. A lake directory holds its own state: nothing to claim."""
    if not objstore.is_url(lake):
        return
    key = Path(STATE_DIR) / OWNER
    got = lake_mod.get_object(str(lake), key)
    try:
        theirs = json.loads(got) if got is not None else None
    except ValueError as exc:
        raise StateError(f"{lake}/{key.as_posix()} is unreadable: {exc}") from exc
    here = state_dir(lake) / OWNER
    try:
        mine = json.loads(here.read_text(encoding="utf-8"))
    except FileNotFoundError:
        mine = None
    except (OSError, ValueError) as exc:
        raise StateError(f"state owner file {here} is unreadable: {exc}") from exc
    if theirs is None:
        if take:
            if mine is None:
                mine = {"id": secrets.token_hex(8), "host": socket.gethostname(),
                        "state": str(here.parent.parent.resolve())}
                write_json_atomic(here, mine)
            lake_mod.put_object(str(lake), key, json.dumps(mine, indent=2).encode())
        return
    if mine is None or theirs.get("id") != mine.get("id"):
        raise StateError(f"lake {lake} is swept from another state directory ({theirs.get('state')} on host "
                         f"{theirs.get('host')}, id {theirs.get('id')}): sweeping it from "
                         f"{here.parent.parent.resolve()} too would store every window twice. Use that directory; "
                         f"to move the sweep here for good, stop the other scheduler and delete "
                         f"{lake}/{key.as_posix()} (the windows its watermarks passed are swept again from here)")


# ---------------------------------------------------------------------- staging


class StagedSweep:
    """The outputs of one sweep, staged under ``_state/staging/<sweep_id>``."""

    def __init__(self, lake: str | os.PathLike[str], sweep_id: str) -> None:
        self.sweep_id = sweep_id
        self.dir = state_dir(lake) / STAGING / sweep_id
        self.root = self.dir / "lake"
        if self.dir.exists():  # leftover of a crash before the commit point: recompute
            shutil.rmtree(self.dir)
        lake_mod.makedirs(self.root, durable=False)
        self.files: list[str] = []

    def write(self, table: str, df: pl.DataFrame) -> None:
        if df.height == 0:
            return
        for p in lake_mod.write_table(self.root, table, df):
            self.files.append(str(p.relative_to(self.root)))

    def seal(self, marks: Mapping[str, HostMark], meta: Mapping[str, Any] | None = None) -> None:
        """Write the commit record: from here on the sweep will be published, even after a crash."""
        write_json_atomic(self.dir / COMMIT, {
            "version": VERSION, "sweep_id": self.sweep_id, "files": sorted(self.files),
            "hosts": {h: m.to_json() for h, m in sorted(marks.items())}, "meta": dict(meta or {}),
        })


@dataclass
class Published:
    sweep_id: str
    files: list[Path]  # the files, readable here: in the lake directory, or (object storage) staged
    marks: dict[str, HostMark]
    meta: dict[str, Any]
    root: Path  # what ``files`` are relative to (their table is the first part)


PublishHook = Callable[[Published], None]


def _read_commit(sdir: Path) -> dict[str, Any]:
    path = sdir / COMMIT
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("version") != VERSION or not isinstance(doc.get("files"), list):
            raise ValueError("unexpected layout")
        return dict(doc)
    except (OSError, ValueError) as exc:
        raise StateError(f"commit record {path} is unreadable: {exc}") from exc


def publish(lake: str | os.PathLike[str], sweep_id: str, hook: PublishHook | None = None) -> Published:
    """Steps 3-5 of the protocol for a sealed sweep; idempotent (safe to repeat after a crash).
    ``hook`` runs after the files are in the lake and before the watermarks move (it must be
    idempotent too: write-back to InfluxDB overwrites identical points)."""
    sdir = state_dir(lake) / STAGING / sweep_id
    doc = _read_commit(sdir)
    root = sdir / "lake"
    targets: list[Path] = []
    touched: set[Path] = set()
    remote = objstore.is_url(lake)
    for rel in doc["files"]:
        src = root / rel
        if remote:  # (a PUT of the same bytes again after a crash: the same object)
            lake_mod.put_object(str(lake), Path(rel), src.read_bytes())
            checkpoint("mid_publish")
            targets.append(src)
            continue
        dst = Path(lake) / rel
        if src.exists():  # absent: moved before a crash
            lake_mod.makedirs(dst.parent)  # a new partition: DIR_MODE, its entry fsynced
            os.replace(src, dst)
            touched.add(dst.parent)
            checkpoint("mid_publish")
        targets.append(dst)
    for d in touched:
        _fsync_dir(d)
    marks = {h: HostMark(_parse(m["watermark"], str(sdir)) or datetime.now(UTC),
                         _parse(m.get("open_since"), str(sdir)), _parse(m.get("first"), str(sdir)))
             for h, m in doc.get("hosts", {}).items()}
    pub = Published(sweep_id, targets, marks, dict(doc.get("meta", {})), root if remote else Path(lake))
    checkpoint("after_publish")
    if hook is not None:
        hook(pub)
    save(lake, marks)
    checkpoint("after_commit")
    shutil.rmtree(sdir, ignore_errors=True)
    return pub


def recover(lake: str | os.PathLike[str], hook: PublishHook | None = None) -> list[str]:
    """Roll forward sealed sweeps, drop unsealed ones. Call under :func:`scheduler_lock`.
    Returns the ids of the sweeps published."""
    base = state_dir(lake) / STAGING
    done: list[str] = []
    if not base.is_dir():
        return done
    for sdir in sorted(p for p in base.iterdir() if p.is_dir()):
        if (sdir / COMMIT).exists():
            log.warning("recovery: publishing sweep %s interrupted after its commit point", sdir.name)
            publish(lake, sdir.name, hook)
            done.append(sdir.name)
        else:
            log.warning("recovery: dropping sweep %s interrupted before its commit point", sdir.name)
            shutil.rmtree(sdir, ignore_errors=True)
    return done


def pending(lake: str | os.PathLike[str]) -> Sequence[str]:
    """Ids of staged sweeps (sealed or not) still under _state/staging."""
    base = state_dir(lake) / STAGING
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
