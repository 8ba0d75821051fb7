"""One atomic file write: readers see the old file or the new one, never half of one.

Temp file in the same directory (dot-prefixed, created exclusively with the file's mode) →
write → flush + fsync → ``os.replace`` → fsync the directory. On any failure (a full disk,
an exception in the writer, a signal) the temp file is removed and the target keeps its old
content. Standard library only: the agent, the jobs and the remediation scripts (run as
their own small processes) all use it, so it lives at the bottom of the import graph.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

#: the lake's modes: files rw-r-----, directories rwxr-x--- (never the umask's wider ones)
FILE_MODE = 0o640
DIR_MODE = 0o750
#: temp files start with this (readers and clean-ups skip or remove dot-prefixed names)
TMP_PREFIX = ".tmp-"

Writer = Callable[[Path], None]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by name (a directory: the names in it survive a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str | Writer, *, mode: int = FILE_MODE,
                 durable: bool = True, tmp_name: str | None = None, overwrite: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``.

    ``data``: bytes, text (UTF-8), or a writer called with the temp file's path (created
    empty with ``mode``; the writer truncates it, keeping the mode: Parquet writers take a
    path). ``mode`` is masked by the umask, as for any new file. ``durable=False`` skips
    both fsyncs (the file still appears atomically, but a power loss may lose it).
    ``tmp_name``: a fixed temp name (a caller that recovers its temp files by name; a stale
    one is removed first), else a unique one. ``overwrite=False``: FileExistsError when
    ``path`` exists, never replacing it (a hard link instead of a rename)."""
    path = Path(path)
    tmp = path.with_name(tmp_name or f"{TMP_PREFIX}{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
    try:
        if tmp_name:
            tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        if callable(data):
            os.close(fd)
            data(tmp)
            if durable:
                fsync_path(tmp)
        else:
            with open(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if the target exists: never replaces it
            tmp.unlink()
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_path(path.parent)
    return path
