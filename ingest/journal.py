"""The agent's write-ahead journal: rows flushed but not yet committed to Parquet.

Writing a Parquet file per table costs about a millisecond of CPU each (Polars' and
Parquet's fixed costs), so an agent that wrote every table every few seconds would spend
most of its budget there. Instead the agent appends each flush's new rows to this journal
(one ``marshal`` record of plain column lists, tens of microseconds) and commits
Parquet files only every ``commit_interval_s``; a ``kill -9`` then still loses at most
the rows of the last flush interval, because a restarted agent replays the journal.

Layout: ``<lake>/_journal/<host>/<token>.wal`` (readers ignore ``_`` names), one file
per commit interval, ``token`` = UTC stamp + 8 hex digits. A file is a magic line then
records of ``<u32 length><u32 crc32><marshal payload>``; the payload maps table ->
column -> list of values. A torn last record (the process died mid-write) is detected by
its length or CRC and ignored with a warning; the records before it are kept.

Exactly once: the Parquet files of a commit carry the journal's token in their name
(``part-<stamp>-<token hex>.parquet``) and :meth:`ingest.lake.LakeSink.commit` skips a
partition that already has a file with that token, so replaying a journal whose commit
was interrupted half-way writes only what is missing. One agent per host and lake: the
host's journal directory is locked (``flock``) for the agent's lifetime.
"""

from __future__ import annotations

import fcntl
import logging
import marshal
import os
import secrets
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.sink import SinkError

log = logging.getLogger(__name__)

JOURNAL_DIR = "_journal"
MAGIC = b"UNVEIL-JOURNAL 1\n"
SUFFIX = ".wal"
_HEADER = struct.Struct("<II")  # payload length, crc32 of the payload
_MAX_RECORD = 1 << 30

Columns = dict[str, list[Any]]


class JournalError(Exception):
    """A journal file that cannot be read at all (not a journal, unreadable)."""


def host_dir(lake_root: str | os.PathLike[str], host: str) -> Path:
    return Path(lake_root) / JOURNAL_DIR / host


def token_hex(token: str) -> str:
    """The part of a token that names the Parquet files of its commit."""
    return token.rsplit("-", 1)[-1]


class Journal:
    """The open journal of one agent (one host of one lake)."""

    def __init__(self, directory: str | os.PathLike[str], *, durable: bool = False) -> None:
        self.dir = Path(directory)
        self.durable = durable
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
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
        self.token = ""
        self._open_new()

    @property
    def path(self) -> Path:
        return self.dir / f"{self.token}{SUFFIX}"

    def _open_new(self) -> None:
        self.token = f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(4)}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._records = 0
        os.write(self._fd, MAGIC)

    def append(self, tables: dict[str, Columns]) -> None:
        """Append one flush's rows (table -> column -> values). One write() per record."""
        payload = marshal.dumps(tables)
        os.write(self._fd, _HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
        self._records += 1
        if self.durable:
            os.fsync(self._fd)

    def rotate(self) -> str:
        """Seal the current file and start a new one; returns the sealed file's token."""
        sealed = self.token
        os.close(self._fd)
        self._open_new()
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
        """Remove a sealed file whose rows are all committed."""
        self.file(token).unlink(missing_ok=True)

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


def read(path: str | os.PathLike[str]) -> dict[str, Columns]:
    """All complete records of a journal file merged per table (columns concatenated;
    a column missing from a record is filled with None). A torn or corrupt tail is
    logged, naming the file and offset, and ignored."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise JournalError(f"journal {p}: cannot read: {exc}") from exc
    if not data.startswith(MAGIC):
        raise JournalError(f"journal {p}: not an unveil journal (bad magic {data[:len(MAGIC)]!r})")
    out: dict[str, Columns] = {}
    rows: dict[str, int] = {}
    off = len(MAGIC)
    while off < len(data):
        if off + _HEADER.size > len(data):
            log.warning("journal %s: torn record header at byte %d ignored", p, off)
            break
        length, crc = _HEADER.unpack_from(data, off)
        payload = data[off + _HEADER.size : off + _HEADER.size + length]
        if length > _MAX_RECORD or len(payload) < length or zlib.crc32(payload) != crc:
            log.warning("journal %s: torn or corrupt record at byte %d ignored (%d bytes)",
                        p, off, len(data) - off)
            break
        try:
            record = marshal.loads(payload)
        except (ValueError, EOFError, TypeError) as exc:
            log.warning("journal %s: undecodable record at byte %d ignored: %s", p, off, exc)
            break
        for table, cols in record.items():
            have = out.setdefault(table, {})
            n_before = rows.get(table, 0)
            n_new = len(next(iter(cols.values()))) if cols else 0
            for name in have.keys() | cols.keys():
                col = have.setdefault(name, [None] * n_before)
                col.extend(cols.get(name) or [None] * n_new)
            rows[table] = n_before + n_new
        off += _HEADER.size + length
    return out
