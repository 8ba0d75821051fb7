"""ingest.atomic.write_atomic on a real, full 8 MiB tmpfs and on the callers that use it:
the target keeps its old content and no temp file is left, whatever fails."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import polars as pl
import pytest

from ingest import lake as lake_mod
from ingest.atomic import FILE_MODE, TMP_PREFIX, write_atomic
from tests.fs import fill as _fill
from tests.fs import needs_root


def _frame(n: int) -> pl.DataFrame:
    # random-looking floats do not compress: n rows take about 8n bytes of Parquet
    return pl.DataFrame({"x": [((i * 2654435761) % 2**32) / 7.0 for i in range(n)]})


@needs_root
@pytest.mark.parametrize("kind", ["bytes", "text", "parquet writer", "lake json", "lake parquet", "drill state",
                                  "query output"])
def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp(tmpfs: Path, kind: str) -> None:
    target = tmpfs / "state.json"
    target.write_text('{"old": true}')
    filler = _fill(tmpfs)
    big = b"x" * (1 << 20)
    # a Parquet writer of its own reports the full disk as Polars does (the lake's makes it an OSError)
    with pytest.raises(pl.exceptions.ComputeError if kind == "parquet writer" else OSError) as exc:
        if kind == "bytes":
            write_atomic(target, big)
        elif kind == "text":
            write_atomic(target, big.decode())
        elif kind == "parquet writer":
            write_atomic(target, lambda tmp: _frame(200_000).write_parquet(tmp, compression="uncompressed"))
        elif kind == "lake json":
            lake_mod.write_json_atomic(target, {"k": "v" * (1 << 20)})
        elif kind == "drill state":
            from jobs.drill import _write_private_atomic

            _write_private_atomic(target, big.decode())
        elif kind == "query output":
            from jobs.query import write_output

            write_output(pl.DataFrame({"s": ["v" * 1000] * 2000}), "csv", target)
        else:
            lake_mod._write_parquet_atomic(_frame(200_000), target, compression="uncompressed",
                                           compression_level=None)
    assert getattr(exc.value, "errno", None) == errno.ENOSPC or "No space" in str(exc.value)
    assert target.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler", "state.json"]  # no temp file left
    filler.unlink()  # room again: the same write now lands whole
    write_atomic(target, big)
    assert target.read_bytes() == big and sorted(p.name for p in tmpfs.iterdir()) == ["state.json"]


def test_a_failing_writer_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old")

    def boom(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        write_atomic(target, boom)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_modes_and_no_overwrite(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        p = write_atomic(tmp_path / "lake-file", b"1")
        assert stat.S_IMODE(p.stat().st_mode) == FILE_MODE
        q = write_atomic(tmp_path / "private", "2", mode=0o600)
        assert stat.S_IMODE(q.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    with pytest.raises(FileExistsError):
        write_atomic(p, b"other", overwrite=False)
    assert p.read_bytes() == b"1"
    write_atomic(tmp_path / "new", json.dumps({"a": 1}), overwrite=False)
    assert json.loads((tmp_path / "new").read_text()) == {"a": 1}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]
