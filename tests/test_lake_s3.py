"""The lake on S3-compatible object storage, against a real S3 server on loopback (moto's
server mode, a separate process: tests/s3server.py). Each test has its own bucket."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ingest import lake
from tests.s3server import S3Server, s3_server  # noqa: F401  (the session fixture)
from tests.test_lake import T0, cpu_rows, sample


@pytest.fixture
def s3_lake(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # noqa: F811
    """``s3://<new bucket>/lake``, with the standard AWS variables pointing at the server."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    yield f"s3://{s3_server.create_bucket()}/lake"


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns)


def test_write_then_read_is_the_local_result(s3_lake: str, tmp_path: Path) -> None:
    """Every read API gives on S3 exactly what it gives on a local lake with the same writes."""
    local = str(tmp_path / "lake")
    rows = cpu_rows(3, hosts=("a", "b"))
    facts = sample("host_facts", host="a")
    for root in (local, s3_lake):
        lake.write_table(root, "cpu", rows)
        lake.write_table(root, "host_facts", facts, partition_by_hour=False)
    assert lake.tables(s3_lake) == lake.tables(local) == ["cpu", "host_facts"]
    assert lake.hosts(s3_lake, "cpu") == ["a", "b"]
    for kw in ({}, {"start": T0 + timedelta(minutes=70), "end": T0 + timedelta(minutes=130), "hosts": ["b"]}):
        want = lake.read(local, "cpu", **kw)  # type: ignore[arg-type]
        got = lake.read(s3_lake, "cpu", **kw)  # type: ignore[arg-type]
        assert got.height > 0
        assert_frame_equal(_sorted(got), _sorted(want))
    assert_frame_equal(lake.read(s3_lake, "host_facts"), lake.read(local, "host_facts"))
    # the scan is lazy and typed like a local one, also when empty
    assert lake.scan(s3_lake, "cpu", start=T0 + timedelta(days=9)).collect().schema == \
        lake.scan(local, "cpu").collect().schema


def test_pruning_lists_only_the_asked_host_and_hour(s3_lake: str) -> None:
    lake.write_table(s3_lake, "cpu", cpu_rows(5, hosts=("a", "b", "c")))
    files = lake.files(s3_lake, "cpu", start=T0 + timedelta(hours=2), end=T0 + timedelta(hours=3), hosts=["b"])
    assert len(files) == 1
    assert files[0].parent.as_posix().endswith("cpu/host=b/date=2024-01-01/hour=02")


def test_missing_table_and_bucket_errors_name_them(s3_lake: str, s3_server: S3Server) -> None:  # noqa: F811
    lake.write_table(s3_lake, "cpu", cpu_rows(1))
    with pytest.raises(lake.LakeError, match="no table 'mem'.*tables: cpu"):
        lake.read(s3_lake, "mem")
    with pytest.raises(lake.LakeError, match="bucket 'no-such-bucket' does not exist"):
        lake.tables("s3://no-such-bucket/lake")
    with pytest.raises(lake.LakeError, match="bad lake URL"):
        lake.tables("s3:///lake")


def test_sink_commit_is_idempotent_per_token(s3_lake: str) -> None:
    """The agent's replay contract holds on S3: a second commit with the same token writes nothing."""
    sink = lake.LakeSink(s3_lake)
    rows = cpu_rows(2)
    assert sink.commit("cpu", rows, "0123abcd") == rows.height
    assert sink.commit("cpu", rows, "0123abcd") == 0
    sink.write("cpu", cpu_rows(1).with_columns(pl.col("user") + 1000))
    sink.close()
    assert lake.read(s3_lake, "cpu").height == rows.height + 10
