"""The agent's write-ahead journal: rows flushed but not yet committed to Parquet.

Writing a Parquet file per table costs about a millisecond of CPU each (Polars' and
Parquet's fixed costs), so an agent that wrote every table every few seconds would spend
most of its budget there. Instead the agent appends each flush's new rows to this journal
(one ``marshal`` record of plain column lists, tens of microseconds) and commits
Parquet files only every ``commit_interval_s``; a ``kill -9`` then still loses at most
the rows of the last flush interval, because a restarted agent replays the journal.

Layout: ``<lake>/_journal/<host>/<token>.wal`` (readers ignore ``_`` names), one file
per commit interval, ``token`` = UTC stamp + 8 hex digits. A file is a magic line then
records of ``<4-byte mark><u32 length><u32 crc32 of payload><u32 crc32 of the 12 bytes
before>`` and a ``marshal`` payload ``(starts, tables)``: table -> column -> list of values,
and for each table the index of its first row among the rows of this file.

Failures: a write that fails or comes up short is cut back to the last whole record
(``ftruncate``) and raises OSError naming the file; the caller keeps the rows and appends
them again later. A record that is torn anyway (the process died mid-write, or the cut
failed) is skipped by the reader, which finds the next record by its mark and checks it
by both CRCs, so intact records after a torn one are kept. Rows written twice (a write
that reported failure but reached the file) are read once: the reader keeps each row index
of a table once, thanks to the starts.

Exactly once: the Parquet files of a commit carry the journal's token in their name
(``part-<stamp>-<token hex>.parquet``) and :meth:`ingest.lake.LakeSink.commit` skips a
partition that already has a file with that token, so replaying a journal whose commit
was interrupted half-way writes only what is missing. One agent per host and lake: the
host's journal directory is locked (``flock``) for the agent's lifetime.

Modes: directories 0750, files 0640 (a stricter umask narrows them further). A journal
file that is not a regular file or not owned by the agent's effective uid is refused,
never replayed: anyone able to plant one could otherwise inject rows into the lake.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import marshal
import os
import secrets
import stat
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.lake import FILE_MODE, makedirs
from ingest.sink import SinkError

log = logging.getLogger(__name__)

JOURNAL_DIR = "_journal"
MAGIC = b"UNVEIL-JOURNAL 2\n"
MAGIC_V1 = b"UNVEIL-JOURNAL 1\n"  # records without mark or starts (agents before 2026-12)
SUFFIX = ".wal"
CORRUPT_SUFFIX = ".corrupt"  # a .wal that is not a journal, set aside once
MARK = b"\xa5UVR"
_HEAD = struct.Struct("<4sIII")  # mark, payload length, crc32(payload), crc32(first 12 bytes)
HEADER_SIZE = _HEAD.size
_HEADER_V1 = struct.Struct("<II")
_MAX_RECORD = 1 << 30

Columns = dict[str, list[Any]]
Record = tuple[dict[str, int], dict[str, Columns]]  # (first row index per table, tables)


class JournalError(Exception):
    """A journal file that cannot be read at all (not a journal, unreadable)."""


class NotAJournal(JournalError):
    """A ``.wal`` file without the journal's magic: garbage, not data."""


class ForeignJournal(JournalError):
    """A journal file refused: not a regular file, or not owned by this process's user."""


def host_dir(lake_root: str | os.PathLike[str], host: str) -> Path:
    return Path(lake_root) / JOURNAL_DIR / host


def token_hex(token: str) -> str:
    """The part of a token that names the Parquet files of its commit."""
    return token.rsplit("-", 1)[-1]


def new_token() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(4)}"


def _check_file(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ForeignJournal(f"journal {path}: not a regular file: refused, not replayed")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise ForeignJournal(
            f"journal {path}: owned by uid {st.st_uid}, not by this agent's uid {euid}: "
            "refused, not replayed (chown it to replay it, or remove it)"
        )


def _write_all(fd: int, path: Path, data: bytes, start: int) -> None:
    """Write ``data`` at the end of the file, all of it or none: on an error or a short
    write the file is cut back to ``start`` (its size before) and OSError is raised."""
    view = memoryview(data)
    done = 0
    try:
        while done < len(data):
            n = os.write(fd, view[done:])
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            done += n
    except OSError as exc:
        if done:
            try:
                os.ftruncate(fd, start)
            except OSError as cut:
                # the torn record stays; readers skip it and keep the records after it
                log.warning("journal %s: cannot cut a partial record back to byte %d: %s", path, start, cut)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


class Journal:
    """The open journal of one agent (one host of one lake).

    The current file is created at its first record, not at :meth:`rotate`, so a full disk
    at a commit never fails the commit and never leaves an empty file behind."""

    def __init__(self, directory: str | os.PathLike[str], *, durable: bool = False) -> None:
        self.dir = Path(directory)
        self.durable = durable
        try:
            makedirs(self.dir, durable=False)
            self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    FILE_MODE)
        except OSError as exc:
            raise SinkError(f"journal: cannot create {self.dir}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SinkError(
                f"journal {self.dir} is locked: another agent is writing this host into this lake"
            ) from None
        self._fd = -1
        self._records = 0
        self.token = new_token()

    @property
    def path(self) -> Path:
        return self.file(self.token)

    def _open(self, token: str) -> int:
        """Open (creating it, magic first, when new) the file of ``token`` for appending."""
        path = self.file(token)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            st = os.fstat(fd)
            try:
                _check_file(path, st)
            except ForeignJournal as exc:
                raise OSError(errno.EPERM, str(exc), str(path)) from None
            if st.st_size < len(MAGIC):  # new, or its magic was cut short: nothing after it
                if st.st_size:
                    os.ftruncate(fd, 0)
                _write_all(fd, path, MAGIC, 0)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()  # no empty .wal left behind
            raise
        return fd

    def append(self, tables: dict[str, Columns], *, start: dict[str, int] | None = None,
               token: str | None = None) -> None:
        """Append one record (table -> column -> values; ``start``: the index of each
        table's first row among this file's rows) to the current file, or to the sealed
        file of ``token``. All of it or nothing: OSError (naming the file) otherwise."""
        payload = marshal.dumps((start or {}, tables))
        head = _HEAD.pack(MARK, len(payload), zlib.crc32(payload), 0)
        head = head[:12] + struct.pack("<I", zlib.crc32(head[:12]))
        if token is None or token == self.token:
            if self._fd < 0:
                self._fd = self._open(self.token)
            fd = self._fd
        else:
            fd = self._open(token)
        path = self.file(token or self.token)
        try:
            size = os.fstat(fd).st_size
            _write_all(fd, path, head + payload, size)
            if self.durable:
                try:
                    os.fsync(fd)
                except OSError as exc:  # not known to be on disk: taken back, written again later
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                    raise OSError(exc.errno, exc.strerror, str(path)) from exc
        finally:
            if fd != self._fd:
                os.close(fd)
        if fd == self._fd:
            self._records += 1

    def rotate(self) -> str:
        """Seal the current file and start a new one (created at its first record); returns
        the sealed file's token. Never fails: nothing is written here."""
        sealed = self.token
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
            if self._records == 0:  # only the magic: no rows to keep
                self.path.unlink(missing_ok=True)
        self._records = 0
        self.token = new_token()
        return sealed

    def sealed(self) -> list[str]:
        """Tokens of the sealed journal files in this directory, oldest first."""
        return sorted(
            p.name[: -len(SUFFIX)]
            for p in self.dir.iterdir()
            if p.name.endswith(SUFFIX) and p.name[: -len(SUFFIX)] != self.token
        )

    def file(self, token: str) -> Path:
        return self.dir / f"{token}{SUFFIX}"

    def discard(self, token: str) -> None:
        """Remove a sealed file whose rows are all committed. A failure (read-only file
        system) is logged: the file stays, and replaying it later writes nothing twice."""
        try:
            self.file(token).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("journal %s: committed but cannot be removed: %s", self.file(token), exc)

    def set_aside(self, token: str) -> Path:
        """Rename a file that is not a journal out of replay's way (kept for inspection)."""
        src = self.file(token)
        dst = src.with_name(src.name + CORRUPT_SUFFIX)
        os.replace(src, dst)
        return dst

    def close(self) -> None:
        """Close the current file (removed when it holds no record) and release the lock."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            if self._records == 0:
                self.path.unlink(missing_ok=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _read_bytes(p: Path) -> bytes:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ForeignJournal(f"journal {p}: not a regular file (a symlink): refused, not replayed") from None
        raise JournalError(f"journal {p}: cannot read: {exc}") from exc
    try:
        _check_file(p, os.fstat(fd))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as exc:
        raise JournalError(f"journal {p}: cannot read: {exc}") from exc
    finally:
        os.close(fd)


def _records_v1(p: Path, data: bytes) -> list[Record]:
    out: list[Record] = []
    off = len(MAGIC_V1)
    while off < len(data):
        if off + _HEADER_V1.size > len(data):
            log.warning("journal %s: torn record header at byte %d ignored", p, off)
            break
        length, crc = _HEADER_V1.unpack_from(data, off)
        payload = data[off + _HEADER_V1.size : off + _HEADER_V1.size + length]
        if length > _MAX_RECORD or len(payload) < length or zlib.crc32(payload) != crc:
            log.warning("journal %s: torn or corrupt record at byte %d ignored (%d bytes)", p, off, len(data) - off)
            break
        try:
            out.append(({}, marshal.loads(payload)))
        except (ValueError, EOFError, TypeError) as exc:
            log.warning("journal %s: undecodable record at byte %d ignored: %s", p, off, exc)
            break
        off += _HEADER_V1.size + length
    return out


def _record_at(data: bytes, off: int) -> tuple[Record, int] | None:
    """The record starting at ``off`` and the offset after it; None if it is not whole."""
    if off + HEADER_SIZE > len(data):
        return None
    mark, length, crc, head_crc = _HEAD.unpack_from(data, off)
    if mark != MARK or zlib.crc32(data[off : off + 12]) != head_crc or length > _MAX_RECORD:
        return None
    end = off + HEADER_SIZE + length
    payload = data[off + HEADER_SIZE : end]
    if len(payload) < length or zlib.crc32(payload) != crc:
        return None
    try:
        starts, tables = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(starts, dict) or not isinstance(tables, dict):
        return None
    return (starts, tables), end


def _records_v2(p: Path, data: bytes) -> list[Record]:
    out: list[Record] = []
    off = len(MAGIC)
    while off < len(data):
        got = _record_at(data, off)
        if got is not None:
            out.append(got[0])
            off = got[1]
            continue
        # torn or corrupt: resume at the next mark that starts a whole record
        nxt = data.find(MARK, off + 1)
        while nxt >= 0 and _record_at(data, nxt) is None:
            nxt = data.find(MARK, nxt + 1)
        end = nxt if nxt >= 0 else len(data)
        log.warning("journal %s: torn or corrupt record at byte %d: %d bytes skipped%s", p, off, end - off,
                    f", records from byte {end} kept" if nxt >= 0 else "")
        off = end
    return out


def read(path: str | os.PathLike[str]) -> dict[str, Columns]:
    """All whole records of a journal file merged per table (columns concatenated; a column
    missing from a record is filled with None; a row index given twice is kept once). Torn
    or corrupt records are logged, naming the file and offset, and skipped. An empty file,
    or one holding part of the magic only (its creation was cut short), holds no rows.

    Raises ForeignJournal for a file not owned by this user or not a regular file,
    NotAJournal for one without the magic, JournalError when it cannot be read."""
    p = Path(path)
    data = _read_bytes(p)
    if len(data) < len(MAGIC) and MAGIC.startswith(data):
        return {}
    if data.startswith(MAGIC):
        records = _records_v2(p, data)
    elif data.startswith(MAGIC_V1):
        records = _records_v1(p, data)
    else:
        raise NotAJournal(f"journal {p}: not an unveil journal (bad magic {data[:len(MAGIC)]!r})")
    out: dict[str, Columns] = {}
    rows: dict[str, int] = {}
    ends: dict[str, int] = {}  # per table: the row indexes up to here have been read
    for starts, record in records:
        for table, cols in record.items():
            n_new = len(next(iter(cols.values()))) if cols else 0
            skip = 0
            first = starts.get(table)
            if first is not None:
                skip = max(0, ends.get(table, 0) - first)
                ends[table] = max(ends.get(table, 0), first + n_new)
            if skip >= n_new:
                continue
            have = out.setdefault(table, {})
            n_before = rows.get(table, 0)
            for name in have.keys() | cols.keys():
                col = have.setdefault(name, [None] * n_before)
                src = cols.get(name)
                col.extend(src[skip:] if src else [None] * (n_new - skip))
            rows[table] = n_before + n_new - skip
    return out
