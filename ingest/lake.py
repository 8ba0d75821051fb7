"""The Parquet lake: hive-partitioned telemetry and downstream tables on a local directory
(or on S3-compatible object storage: ingest/objstore.py, docs/lake.md "Object storage").

Layout (readable by Polars, DuckDB, Spark, Trino without this project)::

    <root>/<table>/host=<host>/date=<YYYY-MM-DD>/hour=<HH>/part-<UTC stamp>-<8 hex>.parquet
    <root>/<table>/host=<host>/date=<YYYY-MM-DD>/part-....parquet      (partition_by_hour=False)
    <root>/<table>/_compaction/<id>.json                                (compaction journals)

``host``, ``date`` and ``hour`` are partition columns taken from the path and are not
stored in the files; ``time`` (Datetime us UTC) is. Files appear atomically: written to a
dot-prefixed temp file in the same directory, fsynced, renamed, directory fsynced. Readers
ignore names starting with ``.`` or ``_``. The compaction protocol (crash-safe at any
point, readers never see a merged file together with its inputs) is described in
docs/lake.md and implemented by :func:`compact` and :func:`_recover_table`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import math
import os
import re
import secrets
import shutil
import threading
import time as _time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import polars as pl

# pyarrow is imported by the read path only (footer checks of scans): the agent, which
# writes and compacts through Polars alone, stays without it (pyarrow.parquet: ~75 MiB resident).
if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

from ingest import objstore, schema
from ingest.atomic import DIR_MODE, FILE_MODE, TMP_PREFIX, fsync_path, write_atomic
from ingest.sink import SinkError

log = logging.getLogger(__name__)

PARTITION_COLUMNS: tuple[str, ...] = (schema.HOST, "date", "hour")
JOURNAL_DIR = "_compaction"
TRASH_DIR = ".trash"  # under the root, outside every table: invisible to any reader
LOCK_FILE = "lock"
# A sink temp file older than this is a leftover of a killed writer (writes take seconds).
STALE_TMP_S = 3600.0
RETRY_S = 5.0  # a sink whose write failed tries again after this long
# Modes of what the lake creates, whatever the umask (a stricter umask narrows them further):
# telemetry is readable by the group, never writable or readable by others (ingest.atomic's
# FILE_MODE and DIR_MODE); temp files start with TMP_PREFIX.

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
_CAST = pl.ScanCastOptions(
    integer_cast=["upcast", "allow-float"],
    float_cast=["upcast", "downcast"],
    datetime_cast=["upcast", "downcast", "convert-timezone"],
    categorical_to_string="allow",
)


class LakeError(Exception):
    """A lake operation failed; the message names the path."""


class CorruptFileError(LakeError):
    """A Parquet file (or journal) of the lake cannot be read."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"corrupt lake file {self.path}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptFileError], tuple[Path, str]]:
        # (a sweep's per-host worker returns the files it skipped: they cross processes)
        return type(self), (self.path, self.reason)


# --------------------------------------------------------------------------- helpers


def _utc(ts: datetime) -> datetime:
    """Naive datetimes are taken as UTC (the lake's only time zone)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(ts: datetime | None = None) -> str:
    return (ts or _now()).strftime("%Y%m%dT%H%M%S")


def _check_name(kind: str, name: str) -> str:
    # Names become path components: no separators, no hidden prefixes, no '=' confusion.
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise LakeError(f"invalid {kind} name {name!r}: use letters, digits, '_', '.', '-' (not first)")
    return name


def check_host_name(host: str) -> str:
    """``host`` when it can name a host in the lake (it becomes a path component of the
    partitions and of the agent's journal directory); else LakeError."""
    return _check_name("host", host)


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


_fsync_path = fsync_path


# ------------------------------------------------------------- filesystem seam


class LakeFS(Protocol):
    """What the read path and the object-storage writes need of where the lake lives: the
    local side below (today's os calls, unchanged) or ingest.objstore.ObjectStore."""

    storage_options: dict[str, str] | None

    def uri(self, path: Path) -> str: ...
    def scandir(self, path: Path) -> Sequence[Any]: ...
    def exists(self, path: Path) -> bool: ...
    def is_dir(self, path: Path) -> bool: ...
    def read_text(self, path: Path) -> str: ...
    def read_metadata(self, path: Path) -> pq.FileMetaData: ...


class _LocalFS:
    storage_options: dict[str, str] | None = None

    @staticmethod
    def uri(path: Path) -> str:
        return str(path)

    @staticmethod
    def scandir(path: Path) -> list[os.DirEntry[str]]:
        return _scandir(path)

    @staticmethod
    def exists(path: Path) -> bool:
        return path.exists()

    @staticmethod
    def is_dir(path: Path) -> bool:
        return path.is_dir()

    @staticmethod
    def read_text(path: Path) -> str:
        return path.read_text(encoding="utf-8")

    @staticmethod
    def read_metadata(path: Path) -> pq.FileMetaData:
        import pyarrow.parquet as pq

        return pq.read_metadata(path)


_LOCAL: LakeFS = _LocalFS()


def _fs_of(root: str | os.PathLike[str]) -> LakeFS:
    """The lake's filesystem: an ``s3://`` URL is object storage, anything else a directory."""
    st = _remote(root)
    return _LOCAL if st is None else st


def _remote(root: str | os.PathLike[str]) -> objstore.ObjectStore | None:
    if not objstore.is_url(root):
        return None
    try:
        return objstore.store(str(root))
    except objstore.ObjectStoreError as exc:
        raise LakeError(str(exc)) from exc


def as_root(root: str | os.PathLike[str]) -> str | Path:
    """A lake root as every function here takes it: an object-storage URL stays a string
    (``Path("s3://b/p")`` would collapse the ``//`` into a relative directory), anything
    else becomes a Path."""
    return str(root) if objstore.is_url(root) else Path(root)


#: lake URL -> the directory of its local state (:func:`set_state_root`)
_STATE_ROOTS: dict[str, Path] = {}


def set_state_root(root: str, directory: str | os.PathLike[str]) -> None:
    """Keep the local state of the object-storage lake ``root`` in ``directory`` (this
    process): an agent's journal; a sweep's watermarks, scheduler lock, staged outputs and
    features cache; the remediation queue; the InfluxDB spools. They need a file system
    (append, rename, flock, SQLite), which object storage is not. An agent's is a directory
    of its host; a sweep's is one per lake, shared by every process that sweeps it
    (``[lake] state``, ``--state``)."""
    if not objstore.is_url(root):
        raise LakeError(f"lake {root} is a directory: its state lives in it (a state directory is for s3:// lakes)")
    _STATE_ROOTS[str(root).rstrip("/")] = Path(directory)


def state_root(root: str | os.PathLike[str]) -> Path:
    """The directory that holds a lake's local state: the lake directory itself, or for a
    lake on object storage the one given to :func:`set_state_root` (an error naming the
    setting when none was)."""
    if not objstore.is_url(root):
        return Path(root)
    got = _STATE_ROOTS.get(str(root).rstrip("/"))
    if got is None:
        raise LakeError(f"lake {root} is on object storage: its local state (a sweep's watermarks, lock, staged "
                        "outputs and remediation queue; an agent's journal) needs a directory: set [lake] state "
                        "in the config or pass --state DIR")
    return got


def put_object(root: str, rel: Path, data: bytes) -> Path:
    """PUT ``data`` at ``rel`` (a path relative to the root: a staged sweep output's, or a
    small record) of the object-storage lake ``root``: one object, visible whole or not at
    all; putting the same bytes again leaves the same object (idempotent)."""
    st = _remote(root)
    if st is None:
        raise LakeError(f"put_object: lake {root} is not on object storage")
    dst = st.root / rel
    try:
        st.put(dst, data)
    except OSError as exc:
        raise OSError(f"cannot put {st.uri(dst)}: {exc}") from exc
    return dst


def get_object(root: str, rel: Path) -> bytes | None:
    """The object at ``rel`` of the object-storage lake ``root`` (None when there is none)."""
    st = _remote(root)
    if st is None:
        raise LakeError(f"get_object: lake {root} is not on object storage")
    try:  # (one GET: a missing object is FileNotFoundError, no HEAD first)
        return st.read_bytes(st.root / rel)
    except FileNotFoundError:
        return None


def makedirs(path: Path, *, durable: bool = True) -> None:
    """mkdir -p with mode DIR_MODE for every directory created (never the umask's), fsyncing
    the parent of each so it survives a crash (``durable=False``: no fsync, like the files of
    a non-durable sink)."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        if durable:
            _fsync_path(d.parent)


def _write_parquet_atomic(df: pl.DataFrame, path: Path, *, compression: str, compression_level: int | None,
                          tmp_name: str | None = None, durable: bool = True) -> None:
    def write(tmp: Path) -> None:
        try:
            df.write_parquet(tmp, compression=compression,  # type: ignore[arg-type]
                             compression_level=compression_level, statistics=True)
        except pl.exceptions.ComputeError as exc:
            # Polars reports I/O failures (disk full ...) as ComputeError: make them OSErrors.
            raise OSError(f"cannot write {tmp}: {exc}") from exc

    write_atomic(path, write, durable=durable, tmp_name=tmp_name)


def write_json_atomic(path: Path, obj: Any, *, pretty: bool = False) -> None:
    """Readers see the old or the new file (ingest.atomic.write_atomic)."""
    write_atomic(path, json.dumps(obj, indent=1 if pretty else None, sort_keys=pretty))


def _write_json_atomic(obj: dict[str, Any], path: Path) -> None:
    write_json_atomic(path, obj)


def exists(root: str | os.PathLike[str]) -> bool:
    """True when the lake root is there: its directory, or an object-storage lake's bucket
    (the prefix may hold nothing yet; a server that does not answer is a LakeError)."""
    st = _remote(root)
    return _bucket_there(st) if st is not None else Path(root).is_dir()


def _bucket_there(st: objstore.ObjectStore) -> bool:
    try:
        return st.is_dir(st.root)
    except OSError as exc:
        raise LakeError(f"lake {st.url}: cannot reach {st.settings.endpoint or 'AWS'}: {exc}") from exc


def require(root: str | os.PathLike[str]) -> None:
    """LakeError naming ``root`` unless the lake is there (:func:`exists`): a command checks
    it before it reads or writes anything inside."""
    _root(root)


def _root(root: str | os.PathLike[str]) -> Path:
    st = _remote(root)
    if st is not None:
        if not _bucket_there(st):
            raise LakeError(f"lake root {root}: bucket {st.root.parts[0]!r} does not exist or is not "
                            f"reachable at {st.settings.endpoint or 'AWS'}")
        return st.root
    p = Path(root)
    if not p.is_dir():
        raise LakeError(f"lake root {p} does not exist or is not a directory")
    return p


def _table_dir(root: str | os.PathLike[str], table: str) -> Path:
    r = _root(root)
    _check_name("table", table)
    d = r / table
    if not _fs_of(root).is_dir(d):
        known = tables(root)
        raise LakeError(f"no table {table!r} in lake {r} (looked for {d}); tables: {', '.join(known) or 'none'}")
    return d


def _sort_keys(table: str, columns: Sequence[str]) -> list[str]:
    keys = [schema.TIME]
    m = schema.MEASUREMENTS.get(table)
    if m is not None:
        keys += [t for t in m.tags if t in columns]
    return keys


def default_partition_by_hour(table: str) -> bool:
    """Static-tier measurements (host_facts, labels) are small: one directory per day."""
    m = schema.MEASUREMENTS.get(table)
    return not (m is not None and m.tier == "static")


# -------------------------------------------------------------------- partitions


@dataclass(frozen=True)
class _Partition:
    host: str
    day: date
    hour: int | None
    path: Path
    files: tuple[str, ...]  # visible .parquet names

    @property
    def start(self) -> datetime:
        return datetime(self.day.year, self.day.month, self.day.day, self.hour or 0, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.start + (timedelta(hours=1) if self.hour is not None else timedelta(days=1))


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if _visible(e.name)]
    except FileNotFoundError:  # removed concurrently (retention)
        return []


def _overlaps(lo: datetime, hi: datetime, start: datetime | None, end: datetime | None) -> bool:
    return (end is None or lo < end) and (start is None or hi > start)


def _iter_partitions(table_dir: Path, *, hosts: Sequence[str] | None = None, start: datetime | None = None,
                     end: datetime | None = None, fs: LakeFS = _LOCAL) -> Iterator[_Partition]:
    """Partition directories whose host and time range match, with their visible files.
    Directories are pruned by name before anything below them is listed."""
    if hosts is not None:
        # Straight to the asked hosts' directories: a fleet-wide lake costs nothing more.
        host_dirs = [(h, table_dir / f"host={h}") for h in sorted(set(hosts)) if _NAME_RE.match(h)]
    else:
        host_dirs = [(e.name[5:], Path(e.path)) for e in sorted(fs.scandir(table_dir), key=lambda e: e.name)
                     if e.name.startswith("host=") and e.is_dir()]
    for host, host_dir in host_dirs:
        for de in sorted(fs.scandir(host_dir), key=lambda e: e.name):
            if not de.name.startswith("date=") or not de.is_dir():
                continue
            try:
                day = date.fromisoformat(de.name[5:])
            except ValueError:
                log.warning("lake: ignoring directory with a bad date: %s", de.path)
                continue
            d0 = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if not _overlaps(d0, d0 + timedelta(days=1), start, end):
                continue
            files: list[str] = []
            for e in sorted(fs.scandir(Path(de.path)), key=lambda e: e.name):
                if e.name.startswith("hour=") and e.is_dir():
                    try:
                        hour = int(e.name[5:])
                        if not 0 <= hour <= 23:
                            raise ValueError(hour)
                    except ValueError:
                        log.warning("lake: ignoring directory with a bad hour: %s", e.path)
                        continue
                    h0 = d0 + timedelta(hours=hour)
                    if not _overlaps(h0, h0 + timedelta(hours=1), start, end):
                        continue
                    hfiles = tuple(sorted(x.name for x in fs.scandir(Path(e.path))
                                          if x.name.endswith(".parquet") and x.is_file()))
                    yield _Partition(host, day, hour, Path(e.path), hfiles)
                elif e.name.endswith(".parquet") and e.is_file():
                    files.append(e.name)
            if files:
                yield _Partition(host, day, None, Path(de.path), tuple(files))


# ----------------------------------------------------------------------- journals


@dataclass(frozen=True)
class _Journal:
    path: Path
    partition: Path  # absolute partition directory
    inputs: tuple[str, ...]
    output: str
    temp: str

    @property
    def committed(self) -> bool:
        # The output is renamed into place only after it is complete and fsynced: its
        # presence is the commit point.
        return (self.partition / self.output).exists()


def _journals(table_dir: Path, fs: LakeFS = _LOCAL) -> tuple[list[_Journal], list[CorruptFileError]]:
    jdir = table_dir / JOURNAL_DIR
    out: list[_Journal] = []
    bad: list[CorruptFileError] = []
    for e in sorted(fs.scandir(jdir), key=lambda e: e.name):
        if not e.name.endswith(".json"):
            continue
        p = Path(e.path)
        try:
            j = json.loads(fs.read_text(p))
            part = (table_dir / j["partition"]).resolve()
            if table_dir.resolve() not in part.parents:
                raise ValueError(f"partition {j['partition']!r} outside the table")
            names = [*j["inputs"], j["output"], j["temp"]]
            if any("/" in n or n in ("", ".", "..") for n in names):
                raise ValueError("file names must be plain names")
            out.append(_Journal(p, table_dir / j["partition"], tuple(j["inputs"]), j["output"], j["temp"]))
        except FileNotFoundError:
            continue  # finished concurrently
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad.append(CorruptFileError(p, f"unreadable compaction journal: {exc}"))
    return out, bad


def _visible_files(table_dir: Path, parts: Sequence[_Partition],
                   journals: Sequence[_Journal]) -> list[Path]:
    """The files of ``parts`` a reader should read: inputs of a compaction whose output is
    in the same listing are left out (their rows are in the output).

    The journals must be read *after* the partitions were listed: a journal exists from
    before its output appears until after its inputs are gone, so a listing that holds
    both the output and inputs is always matched by a journal read later."""
    listed = {p.path: set(p.files) for p in parts}
    skip: set[Path] = set()
    for j in journals:
        names = listed.get(j.partition)
        if names is not None and j.output in names:
            skip.update(j.partition / n for n in j.inputs)
    return [p.path / n for p in parts for n in p.files if p.path / n not in skip]


@contextlib.contextmanager
def _table_lock(table_dir: Path, *, blocking: bool) -> Iterator[bool]:
    """An flock on <table>/_compaction/lock: one compactor per table; released by the
    kernel when the holder dies, so a kill -9 never leaves it stuck."""
    jdir = table_dir / JOURNAL_DIR
    makedirs(jdir)
    fd = os.open(jdir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        yield True
    finally:
        os.close(fd)


def _recover_table(table_dir: Path) -> int:
    """Finish (output in place) or undo (output absent) interrupted compactions.
    Call with the table lock held. Returns the number of journals resolved."""
    journals, bad = _journals(table_dir)
    for err in bad:
        log.error("lake: %s; leaving it for an operator", err)
    jdir = table_dir / JOURNAL_DIR
    # Journal temp files (dot-prefixed) are leftovers of a killed compactor.
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(jdir):
            if name.startswith(TMP_PREFIX):
                (jdir / name).unlink(missing_ok=True)
    for j in journals:
        if j.committed:
            for n in j.inputs:
                (j.partition / n).unlink(missing_ok=True)
            log.info("lake: finished interrupted compaction %s", j.path)
        else:
            log.info("lake: undid interrupted compaction %s", j.path)
        (j.partition / j.temp).unlink(missing_ok=True)
        if j.partition.exists():
            _fsync_path(j.partition)
        j.path.unlink(missing_ok=True)
    if journals:
        _fsync_path(jdir)
    return len(journals)


def recover(root: str | os.PathLike[str], table: str | None = None) -> int:
    """Resolve interrupted compactions of one or all tables whose lock is free."""
    r = _root(root)
    n = 0
    for t in [table] if table else tables(r):
        tdir = _table_dir(r, t)
        if not (tdir / JOURNAL_DIR).is_dir():
            continue
        with _table_lock(tdir, blocking=False) as got:
            if got:
                n += _recover_table(tdir)
    return n


# ------------------------------------------------------------------------- write


@functools.cache
def _contract(table: str) -> tuple[list[str], list[pl.DataType]]:
    cols = schema.get(table).polars_schema()
    return list(cols), list(cols.values())


def _normalize(table: str, df: pl.DataFrame, known_hosts: set[str] | None = None) -> pl.DataFrame:
    """Conform measurements to the schema; check time/host of any table.

    The agent calls this for every tiny per-tick frame, so a frame that already has the
    contract's columns and dtypes costs a few microseconds: no casts, no copies."""
    columns = df.columns
    for c in (schema.TIME, schema.HOST):
        if c not in columns:
            raise LakeError(f"table {table!r}: frame has no {c!r} column (columns: {columns})")
    dtypes = df.dtypes
    if table in schema.MEASUREMENTS:
        want_cols, want_dtypes = _contract(table)
        if columns != want_cols or dtypes != want_dtypes:
            try:
                df = schema.conform(table, df)
            except (ValueError, pl.exceptions.PolarsError) as exc:
                raise LakeError(f"table {table!r}: frame does not fit the schema: {exc}") from exc
            columns, dtypes = df.columns, df.dtypes
    else:
        bad = [c for c in PARTITION_COLUMNS[1:] if c in columns]
        if bad:
            raise LakeError(f"table {table!r}: columns {bad} clash with the lake's partition columns")
    tdt = dtypes[columns.index(schema.TIME)]
    if not isinstance(tdt, pl.Datetime):
        raise LakeError(f"table {table!r}: 'time' must be a Datetime, got {tdt}")
    if tdt != schema.TIME_DTYPE or dtypes[columns.index(schema.HOST)] != pl.String():
        t = pl.col(schema.TIME)
        if tdt.time_zone is None:
            t = t.dt.replace_time_zone("UTC")
        elif tdt.time_zone != "UTC":
            t = t.dt.convert_time_zone("UTC")
        df = df.with_columns(t.dt.cast_time_unit("us"), pl.col(schema.HOST).cast(pl.String))
    time_col, host_col = df.get_column(schema.TIME), df.get_column(schema.HOST)
    if time_col.has_nulls() or host_col.has_nulls():
        raise LakeError(f"table {table!r}: {time_col.null_count()} rows with null time, "
                        f"{host_col.null_count()} with null host")
    if df.height:
        lo, hi = host_col.min(), host_col.max()
        if not (lo == hi and known_hosts is not None and lo in known_hosts):
            for h in host_col.unique().to_list():
                _check_name("host", h)
            if known_hosts is not None and lo == hi:
                known_hosts.add(str(lo))
    return df


def _partition_dir(table_dir: Path, host: str, ts: datetime, by_hour: bool) -> Path:
    d = table_dir / f"host={host}" / f"date={ts.date().isoformat()}"
    return d / f"hour={ts.hour:02d}" if by_hour else d


def _partition_groups(table_dir: Path, df: pl.DataFrame,
                      by_hour: bool) -> list[tuple[str, Path, pl.DataFrame]]:
    """Split a normalized frame into (host, partition directory, frame without partition columns)."""
    if df.height == 0:
        return []
    # fast path (every agent flush): one host, one hour — no partitioning pass needed
    host_col, time_col = df.get_column(schema.HOST), df.get_column(schema.TIME)
    lo, hi = time_col.min(), time_col.max()
    if (host_col.min() == host_col.max() and isinstance(lo, datetime) and isinstance(hi, datetime)
            and lo.date() == hi.date() and (not by_hour or lo.hour == hi.hour)):
        return [(str(host_col[0]), _partition_dir(table_dir, str(host_col[0]), lo, by_hour), df.drop(schema.HOST))]
    keys = [schema.HOST, "__date"] + (["__hour"] if by_hour else [])
    df = df.with_columns(pl.col(schema.TIME).dt.date().alias("__date"), pl.col(schema.TIME).dt.hour().alias("__hour"))
    out = []
    for key, part in df.partition_by(keys, as_dict=True, maintain_order=True).items():
        host, day = str(key[0]), key[1]
        assert isinstance(day, date)
        d = table_dir / f"host={host}" / f"date={day.isoformat()}"
        if by_hour:
            d = d / f"hour={int(key[2]):02d}"
        out.append((host, d, part.drop(schema.HOST, "__date", "__hour")))
    return out


def _new_part_name() -> str:
    return f"part-{_stamp()}-{secrets.token_hex(4)}.parquet"


def _write_group(table: str, part_dir: Path, df: pl.DataFrame, *, compression: str,
                 compression_level: int | None, durable: bool = True, name: str | None = None) -> Path:
    makedirs(part_dir, durable=durable)
    # Writers (agent, simulator) hand over time-ordered rows with tags in a fixed order: a
    # full multi-key sort of a million-row frame would cost more than writing it.
    if not df.get_column(schema.TIME).is_sorted():
        df = df.sort(_sort_keys(table, df.columns), maintain_order=True)
    path = part_dir / (name or _new_part_name())
    _write_parquet_atomic(df, path, compression=compression, compression_level=compression_level,
                          durable=durable)
    return path


def _put_group(st: objstore.ObjectStore, table: str, part_dir: Path, df: pl.DataFrame, *, compression: str,
               compression_level: int | None, name: str | None = None) -> Path:
    """:func:`_write_group` on object storage: one PUT of a new, uniquely named object (it
    appears whole or not at all; objects are never modified after)."""
    if not df.get_column(schema.TIME).is_sorted():
        df = df.sort(_sort_keys(table, df.columns), maintain_order=True)
    path = part_dir / (name or _new_part_name())
    try:
        st.put(path, objstore.parquet_bytes(df, compression=compression, compression_level=compression_level))
    except pl.exceptions.ComputeError as exc:
        raise OSError(f"cannot write {st.uri(path)}: {exc}") from exc
    return path


def _write_part(root: str | os.PathLike[str], table: str, part_dir: Path, df: pl.DataFrame, *,
                compression: str, compression_level: int | None, durable: bool = True,
                name: str | None = None) -> Path:
    """One new file of a partition, wherever the lake lives (the seam of every writer)."""
    st = _remote(root)
    if st is None:
        return _write_group(table, part_dir, df, compression=compression, compression_level=compression_level,
                            durable=durable, name=name)
    return _put_group(st, table, part_dir, df, compression=compression, compression_level=compression_level,
                      name=name)


def _lake_base(root: str | os.PathLike[str]) -> Path:
    """Where tables live: the directory, or the bucket/prefix key of an object-storage lake."""
    st = _remote(root)
    return st.root if st is not None else Path(root)


def write_table(root: str | os.PathLike[str], table: str, df: pl.DataFrame, *,
                partition_by_hour: bool = True, compression: str = "zstd",
                compression_level: int | None = 3) -> list[Path]:
    """Write ``df`` (with ``time`` and ``host``) as new files, one per partition; each file
    appears atomically. Measurements are conformed to ingest.schema first. Returns the paths."""
    _check_name("table", table)
    df = _normalize(table, df)
    base = _lake_base(root)
    try:
        return [
            _write_part(root, table, d, part, compression=compression, compression_level=compression_level)
            for _, d, part in _partition_groups(base / table, df, partition_by_hour)
        ]
    except OSError as exc:
        raise LakeError(f"cannot write table {table!r} under {root}: {exc}") from exc


# -------------------------------------------------------------------------- sink


class LakeSink:
    """The lake as an ingest sink: buffers frames per table, writes on flush.

    A flush happens when a table's buffer reaches ``max_buffer_rows`` or its oldest frame
    is ``max_buffer_age_s`` old (checked on write), and on flush()/close(). A failed write
    is logged and retried on the next flush (the pipeline never stops); rows beyond
    ``10 * max_buffer_rows`` per table are then dropped, oldest first, with an error log.

    ``durable=False`` skips the fsync of each new file and its directory. Files still
    appear atomically (written under a temp name, then renamed), so a killed process never
    leaves a partial file visible; only an OS crash or power loss can then lose the last
    flush (a torn file is reported and skipped by readers). The agent uses it by default:
    two fsyncs per table per flush are a third of its flush cost.
    """

    name = "lake"

    def __init__(self, root: str | os.PathLike[str], *, compression: str = "zstd",
                 compression_level: int = 3, max_buffer_rows: int = 100_000,
                 max_buffer_age_s: float = 10.0, durable: bool = True) -> None:
        self._where: str | os.PathLike[str] = root
        #: the ``s3://`` URL of a lake on object storage, else None (``root`` is then the directory)
        self.url: str | None = str(root) if objstore.is_url(root) else None
        self.root = _lake_base(root)
        self.durable = durable
        self.compression = compression
        self.compression_level = compression_level
        self.max_buffer_rows = max_buffer_rows
        self.max_buffer_age_s = max_buffer_age_s
        self._buf: dict[str, list[pl.DataFrame]] = {}
        self._rows: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._hosts: set[str] = set()  # host names already validated
        self._retry_at: dict[str, float] = {}
        self._closed = False
        st = _remote(root)
        if st is not None:
            self._open_remote(st)
            return
        try:
            makedirs(self.root)
            probe = self.root / f"{TMP_PREFIX}probe-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SinkError(f"lake sink: root {self.root} is not a writable directory: {exc}") from exc
        try:
            recover(self.root)
        except (OSError, LakeError) as exc:
            log.error("lake sink: recovery of interrupted compactions under %s failed: %s", self.root, exc)

    def _open_remote(self, st: objstore.ObjectStore) -> None:
        probe = self.root / f"{TMP_PREFIX}probe-{secrets.token_hex(4)}"
        try:
            _root(self._where)
            st.put(probe, b"")
            st.delete(probe)
        except (OSError, LakeError) as exc:
            raise SinkError(f"lake sink: {self._where} is not writable: {exc}") from exc
        # No recovery here: on object storage compaction is per host (compact(hosts=...)),
        # and so is its recovery.

    def write(self, table: str, df: pl.DataFrame) -> None:
        if self._closed:
            raise LakeError(f"lake sink {self.root} is closed")
        _check_name("table", table)
        df = _normalize(table, df, self._hosts)
        if df.height == 0:
            return
        with self._lock:
            self._buf.setdefault(table, []).append(df)
            self._rows[table] = self._rows.get(table, 0) + df.height
            self._since.setdefault(table, _time.monotonic())
            now = _time.monotonic()
            due = (self._rows[table] >= self.max_buffer_rows
                   or now - self._since[table] >= self.max_buffer_age_s)
            # after a failed write, retry from write() only every RETRY_S (flush() always tries)
            due = due and now >= self._retry_at.get(table, 0.0)
        if due:
            self._flush_table(table)

    def commit(self, table: str, df: pl.DataFrame, token: str, *,
               partition: tuple[str, datetime] | None = None) -> int:
        """Write ``df`` now, bypassing the buffer: one file per partition, named with
        ``token`` (8 hex digits). A partition that already holds a file with this token is
        skipped, so replaying an interrupted commit (the agent's journal) never duplicates
        rows. Returns the rows written; raises LakeError when a partition cannot be written
        (the partitions before it stay committed).

        ``partition=(host, time)``: the caller vouches that ``df`` is one host's rows of
        the hour (the day, for static tables) of ``time``, without the host column and
        already in the schema's exact types (the agent's own frames): no conformance
        pass, no split."""
        if self._closed:
            raise LakeError(f"lake sink {self.root} is closed")
        _check_name("table", table)
        if not re.fullmatch(r"[0-9a-f]{8}", token):
            raise ValueError(f"commit token must be 8 hex digits, got {token!r}")
        by_hour = default_partition_by_hour(table)
        if partition is not None:
            host, ts = partition
            if host not in self._hosts:
                self._hosts.add(_check_name("host", host))
            groups = [(host, _partition_dir(self.root / table, host, ts, by_hour), df)]
        else:
            groups = _partition_groups(self.root / table, _normalize(table, df, self._hosts), by_hour)
        written = 0
        for _, d, part in groups:
            if any(e.name.endswith(f"-{token}.parquet") for e in _fs_of(self._where).scandir(d)):
                continue
            try:
                _write_part(self._where, table, d, part, durable=self.durable, compression=self.compression,
                            compression_level=self.compression_level, name=f"part-{_stamp()}-{token}.parquet")
            except OSError as exc:
                raise LakeError(f"cannot write {part.height} rows of {table!r} to {d}: {exc}") from exc
            written += part.height
        return written

    def flush(self) -> None:
        with self._lock:
            names = list(self._buf)
        for t in names:
            self._flush_table(t)

    def _flush_table(self, table: str) -> bool:
        with self._lock:
            frames = self._buf.pop(table, [])
            self._rows.pop(table, None)
            since = self._since.pop(table, None)
        if not frames:
            return True
        df = pl.concat(frames, how="vertical" if table in schema.MEASUREMENTS else "diagonal_relaxed")
        failed: list[pl.DataFrame] = []
        for host, d, part in _partition_groups(self.root / table, df, default_partition_by_hour(table)):
            try:
                _write_part(self._where, table, d, part, durable=self.durable, compression=self.compression,
                            compression_level=self.compression_level)
            except OSError as exc:
                # Only the partitions that failed are kept: the others are committed.
                log.error("lake sink: cannot write %s (%d rows kept for retry): %s", d, part.height, exc)
                failed.append(part.with_columns(pl.lit(host).alias(schema.HOST)))
        if not failed:
            self._retry_at.pop(table, None)
            return True
        self._retry_at[table] = _time.monotonic() + RETRY_S
        keep = pl.concat(failed, how="diagonal_relaxed").select(df.columns).sort(schema.TIME)
        limit = 10 * self.max_buffer_rows
        if keep.height > limit:
            log.error("lake sink: dropping %d oldest rows of %r: writes keep failing", keep.height - limit, table)
            keep = keep.tail(limit)
        with self._lock:
            self._buf.setdefault(table, []).insert(0, keep)
            self._rows[table] = self._rows.get(table, 0) + keep.height
            self._since[table] = since if since is not None else _time.monotonic()
        return False

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        with self._lock:
            lost = sum(self._rows.values())
        if lost:
            raise LakeError(f"lake sink {self.root}: {lost} buffered rows could not be written")


# -------------------------------------------------------------------------- read


def tables(root: str | os.PathLike[str]) -> list[str]:
    """Names of the tables in the lake, sorted."""
    r = _root(root)
    return sorted(e.name for e in _fs_of(root).scandir(r) if e.is_dir() and _NAME_RE.match(e.name))


def hosts(root: str | os.PathLike[str], table: str) -> list[str]:
    """Hosts that have a partition in ``table``, sorted."""
    d = _table_dir(root, table)
    return sorted(e.name[5:] for e in _fs_of(root).scandir(d) if e.name.startswith("host=") and e.is_dir())


@functools.lru_cache(maxsize=64)
def _polars_schema(pa_schema: pa.Schema) -> pl.Schema:
    """(Cached: a features file has ~360 columns, and converting them costs ~3 ms a file,
    hashing the Arrow schema ~0.5 ms. Read-only: callers must not change the result.)"""
    return pl.DataFrame(pa_schema.empty_table()).schema


def _merge_schemas(schemas: Sequence[tuple[Path, pl.Schema]]) -> dict[str, pl.DataType]:
    """Union of file schemas; a column whose dtype differs gets the common supertype."""
    out: dict[str, pl.DataType] = {}
    where: dict[str, Path] = {}
    merged: set[int] = set()  # (files of one schema share one cached object: merged once)
    for path, s in schemas:
        if id(s) in merged:
            continue
        merged.add(id(s))
        for c, dt in s.items():
            if c in PARTITION_COLUMNS:
                continue
            if c not in out:
                out[c], where[c] = dt, path
            elif out[c] != dt:
                try:
                    out[c] = pl.concat([pl.DataFrame(schema={c: out[c]}), pl.DataFrame(schema={c: dt})],
                                       how="vertical_relaxed").schema[c]
                except pl.exceptions.PolarsError as exc:
                    raise LakeError(f"column {c!r} is {out[c]} in {where[c]} but {dt} in {path}") from exc
    return out


def _first_file(table_dir: Path, fs: LakeFS = _LOCAL) -> Path | None:
    for p in _iter_partitions(table_dir, fs=fs):
        if p.files:
            return p.path / p.files[0]
    return None


def _empty(table: str, table_dir: Path, fs: LakeFS = _LOCAL) -> pl.LazyFrame:
    if table in schema.MEASUREMENTS:
        return schema.empty_frame(table).lazy()
    cols: dict[str, pl.DataType] = {schema.TIME: schema.TIME_DTYPE, schema.HOST: pl.String()}
    first = _first_file(table_dir, fs)
    if first is not None:
        import pyarrow as pa

        with contextlib.suppress(OSError, pa.ArrowException):
            cols |= _merge_schemas([(first, _polars_schema(fs.read_metadata(first).schema.to_arrow_schema()))])
    return pl.DataFrame(schema=cols).lazy()


def _listing(table_dir: Path, start: datetime | None, end: datetime | None,
             hosts_: Sequence[str] | None, on_corrupt: str,
             report: list[CorruptFileError] | None, fs: LakeFS = _LOCAL) -> list[Path]:
    parts = list(_iter_partitions(table_dir, hosts=hosts_, start=start, end=end, fs=fs))
    journals, bad = _journals(table_dir, fs)  # after the listing: see _visible_files
    for err in bad:
        if on_corrupt == "raise":
            raise err
        if report is not None:  # reported once, by the public reader (scan/read)
            report.append(err)
    return _visible_files(table_dir, parts, journals)


def files(root: str | os.PathLike[str], table: str, *, start: datetime | None = None,
          end: datetime | None = None, hosts: Sequence[str] | None = None) -> list[Path]:
    """The Parquet files a scan of this range would read (pruned by host/date/hour, without
    compaction inputs already merged), e.g. to hand to DuckDB. Files are not opened."""
    table_dir = _table_dir(root, table)
    if isinstance(hosts, str):
        hosts = [hosts]
    return _listing(table_dir, _utc(start) if start else None, _utc(end) if end else None,
                    hosts, "raise", None, _fs_of(root))


def _select_files(table_dir: Path, start: datetime | None, end: datetime | None,
                  hosts_: Sequence[str] | None, on_corrupt: str,
                  report: list[CorruptFileError] | None, fs: LakeFS = _LOCAL) -> list[tuple[Path, pq.FileMetaData]]:
    import pyarrow as pa

    out: list[tuple[Path, pq.FileMetaData]] = []
    lo_us = -math.inf if start is None else _epoch_us(start)
    hi_us = math.inf if end is None else _epoch_us(end)
    for path in _listing(table_dir, start, end, hosts_, on_corrupt, report, fs):
        try:
            md = fs.read_metadata(path)  # footer check: cheap, and only on pruned files
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            err = CorruptFileError(path, str(exc))
            if on_corrupt == "raise":
                raise err from exc
            if report is not None:  # reported once, by the public reader (scan/read)
                report.append(err)
            continue
        span = None if start is None and end is None else _time_span(md)
        if span is not None and (span[1] < lo_us or span[0] >= hi_us):
            continue  # none of its rows is in range: Polars would open it again for nothing
        out.append((path, md))
    return out


_US_PER = {"seconds": 1_000_000, "milliseconds": 1_000, "microseconds": 1, "nanoseconds": 0.001}


def _epoch_us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _time_span(md: pq.FileMetaData) -> tuple[float, float] | None:
    """The first and last ``time`` of a file (µs since the epoch) from its row groups'
    statistics; None when it has no such column or a row group with rows lacks them. A live
    cycle reads the last minute of each table, and the agent commits a file a minute: the
    current hour's other files (up to ``compact_every``'s worth) are skipped on this."""
    sch = md.schema
    i = 0 if sch.column(0).path == schema.TIME else next(  # (the lake writes it first)
        (k for k in range(len(sch)) if sch.column(k).path == schema.TIME), None)
    if i is None:
        return None
    unit = json.loads(sch.column(i).logical_type.to_json())
    per = _US_PER.get(unit.get("timeUnit", "")) if unit.get("Type") == "Timestamp" else None
    if per is None:
        return None
    lo, hi = math.inf, -math.inf
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        if not rg.num_rows:
            continue
        st = rg.column(i).statistics
        if st is None or not st.has_min_max:
            return None
        lo, hi = min(lo, st.min_raw * per), max(hi, st.max_raw * per)
    return (lo, hi) if lo <= hi else None


def scan(root: str | os.PathLike[str], table: str, *, start: datetime | None = None,
         end: datetime | None = None, hosts: Sequence[str] | None = None,
         on_corrupt: Literal["raise", "skip"] = "raise",
         report: list[CorruptFileError] | None = None, exclude: Collection[Path] = ()) -> pl.LazyFrame:
    """A LazyFrame over ``table`` for ``start <= time < end`` (naive = UTC) and ``hosts``.

    Directories are pruned by host/date/hour before any file is opened; the time filter is
    pushed down to row groups. Columns: ``time``, ``host``, then the stored columns (for a
    measurement exactly its schema, columns missing in older files as nulls). Every file's
    footer is checked here; damage inside a file with a good footer only shows at collect
    (:func:`read` names such a file; :func:`probe` finds it for a caller that then scans
    again with it in ``exclude``).

    Corrupt files skipped (``on_corrupt="skip"``) are appended to ``report``, each once;
    without ``report`` each is logged once as a warning. Nothing else reports them, so a
    caller that passes ``report`` owns the one warning per file."""
    found: list[CorruptFileError] = []
    lf = _scan(root, table, start, end, hosts, on_corrupt, found, frozenset(Path(p) for p in exclude))[0]
    _report(found, report)
    return lf


def _report(found: Sequence[CorruptFileError], report: list[CorruptFileError] | None) -> None:
    if report is not None:
        report.extend(found)
    else:
        for err in found:
            log.warning("lake: skipped %s", err)


def _scan(root: str | os.PathLike[str], table: str, start: datetime | None, end: datetime | None,
          hosts: Sequence[str] | None, on_corrupt: str, report: list[CorruptFileError] | None,
          exclude: frozenset[Path]) -> tuple[pl.LazyFrame, list[Path]]:
    if on_corrupt not in ("raise", "skip"):
        raise ValueError(f"on_corrupt must be 'raise' or 'skip', not {on_corrupt!r}")
    table_dir = _table_dir(root, table)
    fs = _fs_of(root)
    start_u = _utc(start) if start is not None else None
    end_u = _utc(end) if end is not None else None
    if isinstance(hosts, str):
        hosts = [hosts]
    if start_u is not None and end_u is not None and start_u >= end_u:
        return _empty(table, table_dir, fs), []
    for attempt in range(3):
        found: list[CorruptFileError] = []
        try:
            files = [(p, md) for p, md in _select_files(table_dir, start_u, end_u, hosts, on_corrupt, found, fs)
                     if p not in exclude]
            break
        except FileNotFoundError:
            # A compaction finished between listing and opening: list again.
            if attempt == 2:
                raise
    if report is not None:
        report.extend(found)
    if not files:
        return _empty(table, table_dir, fs), []

    m = schema.MEASUREMENTS.get(table)
    if m is not None:
        stored: dict[str, pl.DataType] = m.polars_schema(with_host=False)
    else:
        stored = _merge_schemas([(p, _polars_schema(md.schema.to_arrow_schema())) for p, md in files])
    # Hive parsing needs one directory depth per scan: hourly and daily files separately.
    by_depth: dict[bool, list[str]] = {}
    for p, _ in files:
        by_depth.setdefault(p.parent.name.startswith("hour="), []).append(fs.uri(p))
    frames = []
    for hourly, paths in by_depth.items():
        hive = {schema.HOST: pl.String(), "date": pl.String()} | ({"hour": pl.String()} if hourly else {})
        lf = pl.scan_parquet(paths, hive_partitioning=True, hive_schema=hive, schema=stored,
                             missing_columns="insert", extra_columns="ignore", cast_options=_CAST,
                             storage_options=fs.storage_options)
        frames.append(lf.select(schema.TIME, schema.HOST, *[c for c in stored if c != schema.TIME]))
    out = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")
    t = pl.col(schema.TIME)
    if start_u is not None:
        out = out.filter(t >= pl.lit(start_u, dtype=schema.TIME_DTYPE))
    if end_u is not None:
        out = out.filter(t < pl.lit(end_u, dtype=schema.TIME_DTYPE))
    return out, [p for p, _ in files]


def probe(paths: Sequence[Path], *, root: str | os.PathLike[str] | None = None) -> list[CorruptFileError]:
    """Files that fail a full read (damaged pages behind a good footer); a file gone
    meanwhile (compaction) is not one of them. ``root``: the lake they are from (needed
    for a lake on object storage)."""
    fs = _LOCAL if root is None else _fs_of(root)
    bad = []
    for p in paths:
        try:
            pl.read_parquet(fs.uri(p), storage_options=fs.storage_options)
        except FileNotFoundError:
            continue
        except (OSError, pl.exceptions.PolarsError) as exc:
            bad.append(CorruptFileError(p, str(exc)))
    return bad


def scan_file(root: str | os.PathLike[str], path: Path) -> pl.LazyFrame:
    """One file of :func:`files` as stored (no partition columns), wherever the lake lives."""
    fs = _fs_of(root)
    return pl.scan_parquet(fs.uri(path), storage_options=fs.storage_options)


def read(root: str | os.PathLike[str], table: str, *, start: datetime | None = None,
         end: datetime | None = None, hosts: Sequence[str] | None = None,
         columns: Sequence[str] | None = None, on_corrupt: Literal["raise", "skip"] = "raise",
         report: list[CorruptFileError] | None = None, attempts: int = 5) -> pl.DataFrame:
    """:func:`scan` + collect, with two things a lazy scan cannot do: list again when a
    concurrent compaction removed a file between listing and reading, and name (or, with
    ``on_corrupt="skip"``, leave out) a file whose data pages are damaged."""
    exclude: set[Path] = set()
    damaged: list[CorruptFileError] = []
    vanished = 0
    while True:
        found: list[CorruptFileError] = []
        lf, paths = _scan(root, table, start, end, hosts, on_corrupt, found, frozenset(exclude))
        if columns is not None:
            lf = lf.select(columns)
        try:
            df = lf.collect()
        except FileNotFoundError:
            vanished += 1
            if vanished >= attempts:
                raise
            log.info("lake: a file of %s went away during the read (compaction); reading again", table)
            _time.sleep(0.01 * vanished)
            continue
        except pl.exceptions.ComputeError as exc:
            if not all(_fs_of(root).exists(p) for p in paths):
                # Polars reports a file removed between two of its opens as a ComputeError.
                vanished += 1
                if vanished >= attempts:
                    raise LakeError(f"reading table {table!r} under {root}: files keep vanishing: {exc}") from exc
                _time.sleep(0.01 * vanished)
                continue
            bad = [e for e in probe(paths, root=root) if e.path not in exclude]
            if not bad:
                raise LakeError(f"reading table {table!r} under {root} failed: {exc}") from exc
            if on_corrupt == "raise":
                raise bad[0] from exc
            damaged += bad
            exclude.update(e.path for e in bad)
            continue
        _report(found + damaged, report)  # the last listing's, once each
        return df


# ------------------------------------------------------------------- maintenance


@dataclass
class CompactionStats:
    tables: int = 0
    merges: int = 0  # groups of files merged into one
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    recovered: int = 0
    stale_temps_removed: int = 0
    tables_locked: list[str] = field(default_factory=list)
    corrupt: list[Path] = field(default_factory=list)  # unreadable files, left in place
    failed_partitions: list[Path] = field(default_factory=list)  # left uncompacted


def _groups(files: Sequence[tuple[str, int]], target_rows: int) -> list[list[str]]:
    """Consecutive runs of small files of at most target_rows rows; runs of one are left alone."""
    groups: list[list[str]] = []
    cur: list[str] = []
    n = 0
    for name, rows in files:
        if rows >= target_rows:
            continue
        if cur and n + rows > target_rows:
            groups.append(cur)
            cur, n = [], 0
        cur.append(name)
        n += rows
    groups.append(cur)
    return [g for g in groups if len(g) > 1]


def _compact_group(table: str, table_dir: Path, part_dir: Path, inputs: list[str],
                   expected_rows: int, stats: CompactionStats) -> None:
    """The protocol of docs/lake.md: journal, temp, rename (commit), delete inputs, journal."""
    token = secrets.token_hex(4)
    cid = f"{_stamp()}-{token}"
    output = f"part-{_stamp()}-{token}.parquet"
    temp = f"{TMP_PREFIX}compact-{token}.parquet"
    jpath = table_dir / JOURNAL_DIR / f"{cid}.json"
    paths = [part_dir / n for n in inputs]
    frames = []
    for p in paths:  # read (and so check) every input before anything is written
        try:
            frames.append(pl.read_parquet(p))
        except pl.exceptions.PolarsError as exc:
            raise CorruptFileError(p, str(exc)) from exc
    df = pl.concat(frames, how="diagonal_relaxed")
    if df.height != expected_rows:
        raise LakeError(f"compaction of {part_dir}: read {df.height} rows, footers say {expected_rows}")
    df = df.sort(_sort_keys(table, df.columns), maintain_order=True)
    _write_json_atomic({"version": 1, "table": table, "partition": str(part_dir.relative_to(table_dir)),
                        "inputs": inputs, "output": output, "temp": temp}, jpath)
    try:
        _write_parquet_atomic(df, part_dir / output, compression="zstd", compression_level=3, tmp_name=temp)
    except BaseException:
        if not (part_dir / output).exists():
            # Not committed: the inputs are intact; undo.
            (part_dir / temp).unlink(missing_ok=True)
            jpath.unlink(missing_ok=True)
        # else committed (only the directory fsync failed): the journal stays for recovery
        raise
    # Committed: from here on readers skip the inputs (journal + output present).
    bytes_before = 0
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            bytes_before += p.stat().st_size
            p.unlink()
    _fsync_path(part_dir)
    jpath.unlink()
    _fsync_path(jpath.parent)
    stats.merges += 1
    stats.files_before += len(inputs)
    stats.files_after += 1
    stats.rows += df.height
    stats.bytes_before += bytes_before
    stats.bytes_after += (part_dir / output).stat().st_size


def _row_count(path: Path) -> int:
    """The rows of a Parquet file, from its footer (Polars: the agent compacts too, and
    has no pyarrow)."""
    return int(pl.scan_parquet(path).select(pl.len()).collect().item())


def _remove_stale_temps(part: _Partition, now_s: float) -> int:
    n = 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(part.path):
            if name.startswith(TMP_PREFIX):
                p = part.path / name
                with contextlib.suppress(FileNotFoundError):
                    if now_s - p.stat().st_mtime > STALE_TMP_S:
                        p.unlink()
                        n += 1
    return n


def compact(root: str | os.PathLike[str], table: str | None = None, *,
            older_than: timedelta = timedelta(minutes=5), target_rows: int = 1_000_000,
            now: datetime | None = None, hosts: Sequence[str] | None = None,
            grace: timedelta = timedelta(minutes=5)) -> CompactionStats:
    """Merge the small files of every partition that ended more than ``older_than`` ago
    into files of up to ``target_rows`` rows, crash-safely (see docs/lake.md). Tables whose
    compaction lock is held by another process are skipped (listed in the stats).
    ``hosts``: only their partitions (required on object storage, which has no lock: each
    host's partitions are compacted by their one writer). ``grace`` (object storage only):
    merged inputs stay, hidden by their journal, this long before a later compaction
    deletes them, so lazy scans listed before the merge still find them."""
    st = _remote(root)
    if st is not None:
        return _compact_remote(root, st, table, older_than=older_than, target_rows=target_rows,
                               now=now, hosts=hosts, grace=grace)
    r = _root(root)
    now_u = _utc(now) if now is not None else _now()
    cutoff = now_u - older_than
    stats = CompactionStats()
    for t in [table] if table else tables(r):
        tdir = _table_dir(r, t)
        with _table_lock(tdir, blocking=False) as got:
            if not got:
                log.info("lake: %s is being compacted by another process; skipped", tdir)
                stats.tables_locked.append(t)
                continue
            stats.tables += 1
            stats.recovered += _recover_table(tdir)
            for part in _iter_partitions(tdir, hosts=hosts, end=cutoff):
                stats.stale_temps_removed += _remove_stale_temps(part, _time.time())
                if part.end > cutoff or len(part.files) < 2:
                    continue
                sized: list[tuple[str, int]] = []
                for name in part.files:
                    try:
                        sized.append((name, _row_count(part.path / name)))
                    except (OSError, pl.exceptions.PolarsError) as exc:
                        log.warning("lake: not compacting corrupt file %s: %s", part.path / name, exc)
                        stats.corrupt.append(part.path / name)
                rows = dict(sized)
                groups = _groups(sized, target_rows)
                while groups:
                    group = groups.pop(0)
                    try:
                        _compact_group(t, tdir, part.path, group, sum(rows[n] for n in group), stats)
                    except CorruptFileError as exc:
                        # damaged pages behind a good footer: leave that file, merge the others
                        log.warning("lake: not compacting %s", exc)
                        stats.corrupt.append(exc.path)
                        rest = [n for n in group if part.path / n != exc.path]
                        if len(rest) > 1:
                            groups.insert(0, rest)
                    except OSError as exc:  # disk full, permissions: stop, the rest would fail too
                        raise LakeError(f"compaction of {part.path} failed (inputs kept): {exc}") from exc
                    except (pl.exceptions.PolarsError, LakeError) as exc:
                        log.error("lake: compaction of %s failed (inputs kept): %s", part.path, exc)
                        stats.failed_partitions.append(part.path)
    return stats


# ----------------------------------------------- compaction on object storage
#
# The local protocol without its two local tools, rename and flock: the output is written
# with one PUT (it appears whole or not at all: the commit point, as the rename is locally),
# and one writer per host partition replaces the lock. Readers are the same code
# (_visible_files): a journal whose output is listed hides its inputs.


def _journal_age(j: _Journal, now: datetime) -> timedelta:
    try:
        return now - datetime.strptime(j.path.name[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return timedelta.max  # not one of ours: old enough


def _host_journals(st: objstore.ObjectStore, tdir: Path,
                   hosts: Collection[str]) -> list[_Journal]:
    journals, bad = _journals(tdir, st)
    for err in bad:
        log.error("lake: %s; leaving it for an operator", err)
    return [j for j in journals if j.partition.relative_to(tdir).parts[0][5:] in hosts]


def _recover_remote(st: objstore.ObjectStore, tdir: Path, hosts: Collection[str], now: datetime,
                    grace: timedelta) -> int:
    """Finish the journals of ``hosts``: output present and older than ``grace`` → delete the
    inputs, then the journal; output absent → the compactor died before its commit: delete
    the journal (the inputs are intact). Returns the journals resolved."""
    n = 0
    for j in _host_journals(st, tdir, hosts):
        if st.exists(j.partition / j.output):
            if _journal_age(j, now) < grace:
                continue
            for name in j.inputs:
                st.delete(j.partition / name)
            log.info("lake: deleted the merged inputs of %s", st.uri(j.path))
        else:
            log.info("lake: undid interrupted compaction %s", st.uri(j.path))
        st.delete(j.path)
        n += 1
    return n


def _compact_group_remote(st: objstore.ObjectStore, table: str, tdir: Path, part_dir: Path,
                          inputs: list[str], expected_rows: int, stats: CompactionStats, now: datetime,
                          grace: timedelta) -> None:
    token = secrets.token_hex(4)
    output = f"part-{_stamp()}-{token}.parquet"
    jpath = tdir / JOURNAL_DIR / f"{_stamp(now)}-{token}.json"
    frames = []
    for name in inputs:  # read (and so check) every input before anything is written
        try:
            frames.append(pl.read_parquet(st.uri(part_dir / name), storage_options=st.storage_options))
        except pl.exceptions.PolarsError as exc:
            raise CorruptFileError(part_dir / name, str(exc)) from exc
    df = pl.concat(frames, how="diagonal_relaxed")
    if df.height != expected_rows:
        raise LakeError(f"compaction of {st.uri(part_dir)}: read {df.height} rows, footers say {expected_rows}")
    df = df.sort(_sort_keys(table, df.columns), maintain_order=True)
    st.put(jpath, json.dumps({"version": 1, "table": table, "partition": part_dir.relative_to(tdir).as_posix(),
                              "inputs": inputs, "output": output,
                              "temp": f"{TMP_PREFIX}compact-{token}.parquet"}).encode())
    data = objstore.parquet_bytes(df, compression="zstd", compression_level=3)
    try:
        st.put(part_dir / output, data)  # commit point
    except BaseException:
        if not st.exists(part_dir / output):
            st.delete(jpath)  # not committed: the inputs are intact
        raise
    if grace <= timedelta(0):
        for name in inputs:
            st.delete(part_dir / name)
        st.delete(jpath)
    stats.merges += 1
    stats.files_before += len(inputs)
    stats.files_after += 1
    stats.rows += df.height
    stats.bytes_after += len(data)


def _compact_remote(root: str | os.PathLike[str], st: objstore.ObjectStore, table: str | None, *,
                    older_than: timedelta, target_rows: int, now: datetime | None,
                    hosts: Sequence[str] | None, grace: timedelta) -> CompactionStats:
    if hosts is None or isinstance(hosts, str):
        raise LakeError(f"compaction of {root}: object storage has no lock, so each host's partitions are "
                        "compacted by their one writer: pass hosts=[...] (the hosts this process writes)")
    now_u = _utc(now) if now is not None else _now()
    cutoff = now_u - older_than
    stats = CompactionStats()
    for t in [table] if table else tables(root):
        tdir = _table_dir(root, t)
        stats.tables += 1
        stats.recovered += _recover_remote(st, tdir, hosts, now_u, grace)
        # a partition with a journal still waiting for its grace is left alone until then:
        # merging its output again would leave that journal's inputs unhidden
        pending = {j.partition for j in _host_journals(st, tdir, hosts)}
        for part in _iter_partitions(tdir, hosts=hosts, end=cutoff, fs=st):
            if part.end > cutoff or len(part.files) < 2 or part.path in pending:
                continue
            sized: list[tuple[str, int]] = []
            for name in part.files:
                try:
                    sized.append((name, st.read_metadata(part.path / name).num_rows))
                except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
                    log.warning("lake: not compacting corrupt file %s: %s", st.uri(part.path / name), exc)
                    stats.corrupt.append(part.path / name)
            rows = dict(sized)
            for group in _groups(sized, target_rows):
                try:
                    _compact_group_remote(st, t, tdir, part.path, group, sum(rows[n] for n in group), stats,
                                          now_u, grace)
                except CorruptFileError as exc:
                    log.warning("lake: not compacting %s", exc)
                    stats.corrupt.append(exc.path)
                except OSError as exc:
                    raise LakeError(f"compaction of {st.uri(part.path)} failed (inputs kept): {exc}") from exc
                except (pl.exceptions.PolarsError, LakeError) as exc:
                    log.error("lake: compaction of %s failed (inputs kept): %s", st.uri(part.path), exc)
                    stats.failed_partitions.append(part.path)
    return stats


def compaction_candidates(root: str | os.PathLike[str], *, older_than: timedelta = timedelta(minutes=5),
                          now: datetime | None = None, hosts: Sequence[str] | None = None
                          ) -> dict[Path, frozenset[str]]:
    """The partitions :func:`compact` would look into (closed ``older_than`` ago, two files
    or more; ``hosts``: only theirs), with their files: a listing, no file opened. Lets a
    caller skip a compaction that would find nothing new, without loading the Parquet
    reader."""
    cutoff = (_utc(now) if now is not None else _now()) - older_than
    out: dict[Path, frozenset[str]] = {}
    for t in tables(root):
        for part in _iter_partitions(_table_dir(root, t), hosts=hosts, end=cutoff, fs=_fs_of(root)):
            if part.end <= cutoff and len(part.files) >= 2:
                out[part.path] = frozenset(part.files)
    return out


def retention(root: str | os.PathLike[str], table: str, *, keep: timedelta,
              now: datetime | None = None) -> int:
    """Delete the partitions of ``table`` that ended more than ``keep`` ago; returns how many.
    An hour partition is first moved out of the table (to ``<root>/.trash``, one atomic
    rename: readers see all of it or none of it), then removed."""
    if objstore.is_url(root):
        raise LakeError(f"retention of {root}: not supported on object storage yet (no atomic partition "
                        "delete); use a bucket lifecycle rule on the table prefixes, or a local lake")
    tdir = _table_dir(root, table)
    trash = Path(root) / TRASH_DIR
    cutoff = (_utc(now) if now is not None else _now()) - keep
    n = 0
    with _table_lock(tdir, blocking=True):
        _recover_table(tdir)
        for old in trash.glob(f"{table}-*"):  # leftovers of a killed retention of this table
            shutil.rmtree(old, ignore_errors=True)
        for part in list(_iter_partitions(tdir, end=cutoff)):
            if part.end > cutoff:
                continue
            if part.hour is None:
                # Daily partition: its files may sit next to hour dirs; delete the files.
                for name in part.files:
                    (part.path / name).unlink(missing_ok=True)
                _fsync_path(part.path)
            else:
                makedirs(trash)
                doomed = trash / f"{table}-{secrets.token_hex(8)}"
                os.replace(part.path, doomed)
                _fsync_path(part.path.parent)
                shutil.rmtree(doomed, ignore_errors=True)
            n += 1
        # Directories left empty (rmdir fails unless empty, so fresh data is never touched).
        for hd in _scandir_all(tdir, "host="):
            for dd in _scandir_all(hd, "date="):
                with contextlib.suppress(OSError, ValueError):
                    day = date.fromisoformat(dd.name[5:])
                    if datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1) <= cutoff:
                        dd.rmdir()
            with contextlib.suppress(OSError):
                hd.rmdir()
    return n


def _scandir_all(path: Path, prefix: str) -> list[Path]:
    return [Path(e.path) for e in _scandir(path) if e.name.startswith(prefix) and e.is_dir()]
