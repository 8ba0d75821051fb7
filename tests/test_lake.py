"""The Parquet lake on real files and real processes (tmp_path)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from ingest import lake, schema
from ingest.sink import SinkError

T0 = datetime(2024, 1, 1, tzinfo=UTC)
HELPER = Path(__file__).with_name("lake_crash_helper.py")
PART_RE = re.compile(r"^part-\d{8}T\d{6}-[0-9a-f]{8}\.parquet$")


def sample(name: str, n: int = 5, host: str = "h1", start: datetime = T0) -> pl.DataFrame:
    """A frame of measurement ``name`` with a value of the right type in every column."""
    cols: dict[str, list[object]] = {}
    for c, dt in schema.get(name).polars_schema().items():
        if c == schema.TIME:
            vals: list[object] = [start + timedelta(seconds=17 * i) for i in range(n)]
        elif c == schema.HOST:
            vals = [host] * n
        elif dt == pl.String():
            vals = [f"{c}{i % 2}" for i in range(n)]
        elif isinstance(dt, pl.Datetime):
            vals = [start + timedelta(hours=i) for i in range(n)]
        elif dt.is_integer():
            vals = [i * 3 for i in range(n)]
        else:
            vals = [i / 4 for i in range(n)]
        vals[-1] = None if c not in (schema.TIME, schema.HOST) else vals[-1]  # nulls survive too
        cols[c] = vals
    return schema.conform(name, pl.DataFrame(cols))


def cpu_rows(hours: int, hosts: tuple[str, ...] = ("h1",), per_hour: int = 10) -> pl.DataFrame:
    step = timedelta(hours=1) / per_hour
    n = hours * per_hour
    return pl.DataFrame(
        {
            "time": [T0 + step * i for i in range(n) for _ in hosts],
            "host": [h for _ in range(n) for h in hosts],
            "cpu": "0",
            "user": list(range(n * len(hosts))),
        }
    )


def parquet_files(root: Path, hidden: bool = False) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*.parquet")
        if hidden or not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    )


def sorted_rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


# ----------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(schema.MEASUREMENTS))
def test_roundtrip_every_measurement(tmp_path: Path, name: str) -> None:
    df = sample(name)
    sink = lake.LakeSink(tmp_path)
    sink.write(name, df.sample(fraction=1.0, shuffle=True, seed=1))
    sink.write(name, df.clear())  # empty frames are accepted and write nothing
    sink.close()

    got = lake.scan(tmp_path, name).collect()
    assert got.schema == schema.empty_frame(name).schema
    assert_frame_equal(sorted_rows(got), sorted_rows(df))

    # nothing but the data columns is stored; time is us UTC; zstd, statistics, sorted
    for f in parquet_files(tmp_path):
        meta = pq.read_metadata(f)
        stored = meta.schema.to_arrow_schema()
        assert not {"host", "date", "hour"} & set(stored.names)
        assert str(stored.field("time").type) == "timestamp[us, tz=UTC]"
        col = meta.row_group(0).column(0)
        assert col.compression == "ZSTD" and col.statistics is not None
        assert pl.read_parquet(f)["time"].is_sorted()
        assert PART_RE.match(f.name)

    # empty: a range with no rows gives the exact schema, and an empty write adds no file
    empty = lake.scan(tmp_path, name, start=T0 - timedelta(days=9), end=T0 - timedelta(days=8))
    assert_frame_equal(empty.collect(), schema.empty_frame(name))
    before = parquet_files(tmp_path)
    assert lake.write_table(tmp_path, name, schema.empty_frame(name)) == []
    assert parquet_files(tmp_path) == before


def test_layout_hive_and_daily_tables(tmp_path: Path) -> None:
    paths = lake.write_table(tmp_path, "cpu", cpu_rows(3, ("h1", "h2")))
    rel = sorted(str(p.parent.relative_to(tmp_path)) for p in paths)
    assert rel == [
        f"cpu/host={h}/date=2024-01-01/hour={hh:02d}" for h in ("h1", "h2") for hh in range(3)
    ]
    facts = sample("host_facts", n=4)
    (daily,) = lake.write_table(tmp_path, "host_facts", facts, partition_by_hour=False)
    assert daily.parent == tmp_path / "host_facts" / "host=h1" / "date=2024-01-01"
    # the sink picks daily partitions for static-tier tables by itself
    sink = lake.LakeSink(tmp_path / "other")
    sink.write("labels", sample("labels"))
    sink.close()
    assert all(p.parent.name.startswith("date=") for p in parquet_files(tmp_path / "other"))
    assert lake.tables(tmp_path / "other") == ["labels"]
    assert lake.tables(tmp_path) == ["cpu", "host_facts", "other"]  # any directory is a table
    assert lake.hosts(tmp_path, "cpu") == ["h1", "h2"]
    # readable without this project: pyarrow's hive dataset sees the same rows
    table = ds.dataset(tmp_path / "cpu", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 60 and "host" in table.column_names


def test_hourly_and_daily_files_of_one_table_scan_together(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "incidents", pl.DataFrame({"time": [T0], "host": ["h1"], "n": [1]}))
    lake.write_table(tmp_path, "incidents", pl.DataFrame(
        {"time": [T0 + timedelta(hours=5)], "host": ["h1"], "n": [2]}), partition_by_hour=False)
    assert lake.read(tmp_path, "incidents")["n"].sort().to_list() == [1, 2]
    assert lake.read(tmp_path, "incidents", start=T0 + timedelta(hours=1))["n"].to_list() == [2]


def test_downstream_tables_written_as_given(tmp_path: Path) -> None:
    df = pl.DataFrame(
        {"time": [T0.replace(tzinfo=None)], "host": ["h1"], "score": [0.5], "note": ["x"]}
    )
    lake.write_table(tmp_path, "scores", df)
    got = lake.scan(tmp_path, "scores").collect()
    assert got.columns == ["time", "host", "score", "note"]
    assert got["time"].dtype == schema.TIME_DTYPE and got["time"][0] == T0  # naive = UTC


def test_frames_are_conformed_to_the_contract(tmp_path: Path) -> None:
    """Loose dtypes (Int32 counters, naive or other-zone ns times) are cast on the way in."""
    loose = pl.DataFrame({
        "time": pl.Series([datetime(2024, 1, 1, 1, 0)]).dt.cast_time_unit("ns")
        .dt.replace_time_zone("Europe/Paris"),
        "host": ["h1"], "cpu": ["0"], "user": pl.Series([5], dtype=pl.Int32),
    })
    sink = lake.LakeSink(tmp_path)
    sink.write("cpu", loose)
    sink.write("cpu", sample("cpu", n=3))  # already conformed: the fast path
    sink.close()
    got = lake.read(tmp_path, "cpu").sort("time")
    assert got.schema == schema.empty_frame("cpu").schema
    assert got["time"][0] == T0 and got["user"][0] == 5  # 01:00 Paris = 00:00 UTC
    (stored,) = [f for f in parquet_files(tmp_path) if pq.read_metadata(f).num_rows == 4]
    assert str(pq.read_schema(stored).field("user").type) == "int64"


def test_host_names_are_checked_on_every_frame(tmp_path: Path) -> None:
    sink = lake.LakeSink(tmp_path)
    sink.write("cpu", cpu_rows(1))  # h1 is now known
    mixed = cpu_rows(1).with_columns(host=pl.Series(["h1"] * 9 + ["a/b"]))
    with pytest.raises(lake.LakeError, match="invalid host name 'a/b'"):
        sink.write("cpu", mixed)
    sink.close()
    assert lake.hosts(tmp_path, "cpu") == ["h1"]


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pl.DataFrame({"time": [T0], "host": ["h1"], "bogus": [1]}), "unknown columns"),
        (pl.DataFrame({"time": [T0], "cpu": ["0"]}), "no 'host'"),
        (pl.DataFrame({"time": [T0], "host": ["../etc"]}), "invalid host"),
        (pl.DataFrame({"time": [None, T0], "host": ["h1", "h1"]}), "null time"),
    ],
)
def test_bad_frames_are_rejected_with_the_reason(
    tmp_path: Path, frame: pl.DataFrame, message: str
) -> None:
    sink = lake.LakeSink(tmp_path)
    with pytest.raises(lake.LakeError, match=message):
        sink.write("cpu", frame)
    sink.close()
    assert parquet_files(tmp_path, hidden=True) == []


def test_missing_table_and_root_errors_name_the_path(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "cpu", cpu_rows(1))
    with pytest.raises(lake.LakeError, match=r"no table 'gpu'.*tables: cpu"):
        lake.scan(tmp_path, "gpu")
    with pytest.raises(lake.LakeError, match="nope"):
        lake.tables(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(SinkError, match="file"):
        lake.LakeSink(tmp_path / "file")


# --------------------------------------------------------------------- reading


def test_partition_pruning_opens_only_the_hour_asked_for(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "cpu", cpu_rows(48, ("h1", "h2")))
    hour = T0 + timedelta(hours=30)
    wanted = lake.files(tmp_path, "cpu", start=hour, end=hour + timedelta(hours=1), hosts=["h1"])
    assert [p.parent.relative_to(tmp_path).as_posix() for p in wanted] == [
        "cpu/host=h1/date=2024-01-02/hour=06"
    ]
    # Every other file becomes garbage: a scan that opened one would raise.
    for f in parquet_files(tmp_path):
        if f not in wanted:
            f.write_bytes(b"not parquet")
    got = lake.scan(
        tmp_path, "cpu", start=hour, end=hour + timedelta(hours=1), hosts=["h1"]
    ).collect()
    assert got.height == 10 and set(got["host"]) == {"h1"}
    assert got["time"].to_list() == [hour + timedelta(minutes=6 * i) for i in range(10)]
    with pytest.raises(lake.CorruptFileError):
        lake.scan(tmp_path, "cpu", start=hour, end=hour + timedelta(hours=1))  # h2 is garbage


def test_time_filter_is_pushed_down_and_bounds_are_half_open(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "cpu", cpu_rows(2))  # a row every 6 minutes
    start, end = T0 + timedelta(minutes=12), T0 + timedelta(minutes=36)
    lf = lake.scan(tmp_path, "cpu", start=start, end=end)
    plan = lf.explain()
    scan_part = plan[plan.index("Parquet SCAN") :]
    assert "SELECTION" in scan_part and 'col("time")' in scan_part
    assert lf.collect()["time"].to_list() == [start + timedelta(minutes=6 * i) for i in range(4)]
    naive = lake.scan(
        tmp_path, "cpu", start=start.replace(tzinfo=None), end=end.replace(tzinfo=None)
    )
    assert naive.collect().height == 4
    assert lake.scan(tmp_path, "cpu", start=end, end=start).collect().height == 0


def test_files_whose_statistics_put_them_out_of_range_are_not_opened(tmp_path: Path) -> None:
    # the agent commits a file a minute: a read of the last minutes passes Polars only the
    # files whose time statistics overlap the range, plus any without statistics
    rows = cpu_rows(1, per_hour=60)  # a row a minute
    paths = [lake.write_table(tmp_path, "cpu", rows.slice(m, 10))[0] for m in (0, 10, 20)]
    bare = paths[0].with_name("part-20240101T004000-0badc0de.parquet")
    schema.conform("cpu", rows.slice(40, 10)).drop("host").write_parquet(bare, statistics=False)
    assert not pq.read_metadata(bare).row_group(0).column(0).statistics
    nanos = paths[0].with_name("part-20240101T005000-0feedbee.parquet")  # another writer's unit
    schema.conform("cpu", rows.slice(50, 5)).drop("host").with_columns(
        pl.col("time").dt.cast_time_unit("ns")).write_parquet(nanos)

    def opened(start: datetime, end: datetime) -> list[Path]:
        return lake._scan(tmp_path, "cpu", start, end, None, "raise", None, frozenset())[1]

    at = T0 + timedelta(minutes=12)
    assert sorted(opened(at, at + timedelta(minutes=5))) == sorted([paths[1], bare])
    assert sorted(opened(T0 + timedelta(minutes=9), T0 + timedelta(minutes=11))) == sorted([*paths[:2], bare])
    assert sorted(opened(T0 + timedelta(minutes=30), T0 + timedelta(minutes=40))) == [bare]  # (end is open)
    assert sorted(opened(T0 + timedelta(minutes=54), T0 + timedelta(minutes=55))) == sorted([bare, nanos])
    got = lake.read(tmp_path, "cpu", start=T0 + timedelta(minutes=5), end=T0 + timedelta(minutes=52)).sort("time")
    assert got["time"].to_list() == [T0 + timedelta(minutes=m) for m in (*range(5, 30), *range(40, 52))]


def test_corrupt_and_truncated_files(tmp_path: Path) -> None:
    paths = lake.write_table(tmp_path, "cpu", cpu_rows(4))
    garbage, truncated = paths[1], paths[2]
    garbage.write_bytes(b"PAR1 this is not a parquet file")
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])

    with pytest.raises(lake.CorruptFileError) as info:
        lake.scan(tmp_path, "cpu")
    assert info.value.path == garbage and str(garbage) in str(info.value)

    report: list[lake.CorruptFileError] = []
    got = lake.scan(tmp_path, "cpu", on_corrupt="skip", report=report).collect()
    assert [e.path for e in report] == [garbage, truncated]
    assert got.height == 20  # hours 0 and 3 kept
    assert sorted({t.hour for t in got["time"]}) == [0, 3]


def _damage_pages(path: Path) -> None:
    """Overwrite bytes after the leading magic: the footer stays valid, the pages do not."""
    data = bytearray(path.read_bytes())
    data[40:200] = b"\xab" * 160
    path.write_bytes(bytes(data))


def test_damaged_pages_are_named_by_read_and_left_out_by_compaction(tmp_path: Path) -> None:
    rows = cpu_rows(1, per_hour=500)
    paths = [lake.write_table(tmp_path, "cpu", rows.with_columns(user=pl.col("user") + 1000 * i))[0]
             for i in range(3)]
    _damage_pages(paths[1])
    with pytest.raises(lake.CorruptFileError) as info:
        lake.read(tmp_path, "cpu")
    assert info.value.path == paths[1]
    report: list[lake.CorruptFileError] = []
    got = lake.read(tmp_path, "cpu", on_corrupt="skip", report=report)
    assert [e.path for e in report] == [paths[1]] and got.height == 1000

    stats = lake.compact(tmp_path, older_than=timedelta(0))
    assert stats.corrupt == [paths[1]] and stats.merges == 1 and stats.files_before == 2
    assert paths[1].exists()  # left for an operator, still reported
    assert_frame_equal(lake.read(tmp_path, "cpu", on_corrupt="skip").sort("user"), got.sort("user"))


def damage_column_chunk(path: Path) -> None:
    """Overwrite 16 bytes in the middle of a column chunk of ``path`` (the first chunk, from
    the last column back, whose damage a full read notices: damage inside plain values
    reads back as other values). The footer stays valid."""
    good = path.read_bytes()
    md = pq.read_metadata(path)
    for rg in range(md.num_row_groups):
        for ci in reversed(range(md.num_columns)):
            c = md.row_group(rg).column(ci)
            first = c.dictionary_page_offset or c.data_page_offset
            mid = first + c.total_compressed_size // 2
            data = bytearray(good)
            data[mid:mid + 16] = b"\xab" * 16
            path.write_bytes(bytes(data))
            try:
                pl.read_parquet(path)
            except pl.exceptions.PolarsError:
                assert pq.read_metadata(path).num_rows == md.num_rows  # the footer still reads
                return
    raise AssertionError(f"no damage to {path} that a read notices")


def truncate(path: Path) -> None:
    """A torn write: the first half of the file, no footer."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_each_skipped_file_is_reported_exactly_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One policy: a skipped file is reported once, to ``report`` when the caller passes
    one (the caller warns), else as one log warning; the rest is read."""
    rows = cpu_rows(1, per_hour=500)
    paths = [lake.write_table(tmp_path, "cpu", rows.with_columns(user=pl.col("user") + 1000 * i))[0]
             for i in range(4)]
    damage_column_chunk(paths[1])
    truncate(paths[2])

    def warned(p: Path) -> int:
        return sum(str(p) in r.getMessage() for r in caplog.records if r.levelname == "WARNING")

    with caplog.at_level("INFO"):
        report: list[lake.CorruptFileError] = []
        got = lake.read(tmp_path, "cpu", on_corrupt="skip", report=report)
        assert got.height == 1000 and set(got["user"] // 1000) == {0, 3}
        assert sorted(e.path for e in report) == sorted(paths[1:3])
        assert all(e.reason for e in report)
        assert warned(paths[1]) == warned(paths[2]) == 0  # the caller reports
        report = []
        lake.scan(tmp_path, "cpu", on_corrupt="skip", report=report)  # footers only: the truncated one
        assert [e.path for e in report] == [paths[2]] and warned(paths[2]) == 0

        assert lake.read(tmp_path, "cpu", on_corrupt="skip").height == 1000
        assert warned(paths[1]) == 1 and warned(paths[2]) == 1  # no report: one warning each
        lake.scan(tmp_path, "cpu", on_corrupt="skip")
        assert warned(paths[2]) == 2  # a second scan is a second reader: one more


def test_probe_and_exclude_let_a_lazy_reader_skip_damaged_pages(tmp_path: Path) -> None:
    rows = cpu_rows(1, per_hour=500)
    paths = [lake.write_table(tmp_path, "cpu", rows.with_columns(user=pl.col("user") + 1000 * i))[0]
             for i in range(3)]
    damage_column_chunk(paths[0])
    with pytest.raises(pl.exceptions.ComputeError):
        lake.scan(tmp_path, "cpu").collect()
    bad = lake.probe(paths)
    assert [e.path for e in bad] == [paths[0]]
    got = lake.scan(tmp_path, "cpu", exclude={paths[0]}).collect()
    assert got.height == 1000 and set(got["user"] // 1000) == {1, 2}


def test_dot_and_underscore_files_are_ignored(tmp_path: Path) -> None:
    (path,) = lake.write_table(tmp_path, "cpu", cpu_rows(1))
    extra = cpu_rows(1).drop("host")
    for name in (".tmp-part-x.parquet", "_SUCCESS.parquet"):
        extra.write_parquet(path.parent / name)
    (path.parent / ".tmp-half.parquet").write_bytes(b"PAR1 half written")
    assert lake.scan(tmp_path, "cpu").collect().height == 10
    # external readers with their usual settings agree
    assert ds.dataset(tmp_path / "cpu", format="parquet", partitioning="hive").count_rows() == 10
    assert pl.scan_parquet(tmp_path / "cpu", hidden_file_prefix=(".", "_")).collect().height == 10
    # hidden directories too (polars' hidden_file_prefix does not apply to them: the lake
    # never leaves a hidden directory inside a table)
    hidden_dir = path.parent.parent / ".hour=01"
    hidden_dir.mkdir()
    extra.write_parquet(hidden_dir / "part-x.parquet")
    assert lake.scan(tmp_path, "cpu").collect().height == 10


def test_schema_evolution_missing_and_extra_columns(tmp_path: Path) -> None:
    part = tmp_path / "cpu" / "host=h1" / "date=2024-01-01" / "hour=00"
    part.mkdir(parents=True)
    # an "old" file: no freq_mhz, user as Int32, and a field since removed from the schema
    pl.DataFrame(
        {"time": [T0], "cpu": ["0"], "user": pl.Series([7], dtype=pl.Int32), "retired": [1.0]}
    ).with_columns(pl.col("time").dt.cast_time_unit("us")).write_parquet(part / "part-old.parquet")
    lake.write_table(tmp_path, "cpu", sample("cpu", n=2))
    got = lake.scan(tmp_path, "cpu").collect().sort("time", "user")
    assert got.schema == schema.empty_frame("cpu").schema
    old = got.filter(pl.col("user") == 7)
    assert old.height == 1 and old["freq_mhz"][0] is None and old["host"][0] == "h1"

    # downstream tables: the union of the files' columns, numeric types widened
    lake.write_table(tmp_path, "features", pl.DataFrame({"time": [T0], "host": ["h1"], "a": [1]}))
    lake.write_table(
        tmp_path,
        "features",
        pl.DataFrame({"time": [T0 + timedelta(hours=1)], "host": ["h1"], "a": [2.5], "b": ["x"]}),
    )
    feats = lake.scan(tmp_path, "features").collect().sort("time")
    assert feats.schema == pl.Schema(
        {"time": schema.TIME_DTYPE, "host": pl.String(), "a": pl.Float64(), "b": pl.String()}
    )
    assert feats["a"].to_list() == [1.0, 2.5] and feats["b"].to_list() == [None, "x"]


# --------------------------------------------------------------------------- sink


def test_sink_buffers_until_rows_or_age_then_flushes(tmp_path: Path) -> None:
    sink = lake.LakeSink(tmp_path, max_buffer_rows=25, max_buffer_age_s=3600)
    sink.write("cpu", cpu_rows(1))  # 10 rows: buffered
    assert parquet_files(tmp_path) == []
    sink.write("cpu", cpu_rows(2))  # 30 rows buffered: flushed
    assert len(parquet_files(tmp_path)) == 2  # two hour partitions
    aged = lake.LakeSink(tmp_path / "aged", max_buffer_rows=10**6, max_buffer_age_s=0)
    aged.write("cpu", cpu_rows(1))
    assert len(parquet_files(tmp_path / "aged")) == 1
    sink.close()
    aged.close()
    with pytest.raises(lake.LakeError, match="closed"):
        sink.write("cpu", cpu_rows(1))


def test_sink_keeps_rows_when_a_write_fails_and_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = lake.LakeSink(tmp_path)
    (tmp_path / "cpu").write_text("a file where the table directory should be")
    sink.write("cpu", cpu_rows(2))
    sink.flush()  # fails: logged, rows kept
    assert "cannot write" in caplog.text
    (tmp_path / "cpu").unlink()
    sink.close()  # retried: written once
    assert lake.scan(tmp_path, "cpu").collect()["user"].sort().to_list() == list(range(20))


# --------------------------------------------------------------------- compaction


def test_compaction_preserves_the_exact_multiset_of_rows(tmp_path: Path) -> None:
    rng = random.Random(3)
    for _ in range(12):  # many small files over 3 hours x 2 hosts, duplicate rows included
        df = cpu_rows(3, ("h1", "h2"))
        df = df.sample(n=rng.randint(1, df.height), seed=rng.randint(0, 99), with_replacement=True)
        lake.write_table(tmp_path, "cpu", df)
    lake.write_table(
        tmp_path, "cpu", cpu_rows(1).with_columns(time=pl.col("time") + timedelta(days=1))
    )
    lake.write_table(
        tmp_path, "cpu", cpu_rows(1).with_columns(time=pl.col("time") + timedelta(days=1))
    )
    before = sorted_rows(lake.scan(tmp_path, "cpu").collect())
    n_before = len(parquet_files(tmp_path))

    now = T0 + timedelta(days=1, minutes=30)  # the day-2 hour is still open: left alone
    stats = lake.compact(tmp_path, older_than=timedelta(minutes=5), target_rows=150, now=now)
    after = sorted_rows(lake.scan(tmp_path, "cpu").collect())
    assert_frame_equal(after, before)
    files = parquet_files(tmp_path)
    assert len(files) == n_before - stats.files_before + stats.files_after < n_before
    assert stats.rows == before.filter(pl.col("time") < T0 + timedelta(days=1)).height
    assert len([f for f in files if "date=2024-01-02" in str(f)]) == 2
    for f in files:
        assert pq.read_metadata(f).num_rows <= 150 or "date=2024-01-02" not in str(f)
        assert pl.read_parquet(f)["time"].is_sorted()
    assert not list((tmp_path / "cpu" / lake.JOURNAL_DIR).glob("*.json"))
    # idempotent
    assert (
        lake.compact(
            tmp_path, older_than=timedelta(minutes=5), target_rows=150, now=now
        ).files_before
        == 0
    )


def _interrupted(tmp_path: Path, *, committed: bool, inputs_left: int) -> tuple[Path, pl.DataFrame]:
    """A compaction stopped mid-way, built with the same journal format compact() writes."""
    paths = [p for _ in range(3) for p in lake.write_table(tmp_path, "cpu", cpu_rows(1))]
    expected = sorted_rows(lake.scan(tmp_path, "cpu").collect())
    part = paths[0].parent
    tdir = tmp_path / "cpu"
    merged = pl.concat([pl.read_parquet(p) for p in paths]).sort("time")
    (tdir / lake.JOURNAL_DIR).mkdir(exist_ok=True)
    output, temp = "part-20990101T000000-0000beef.parquet", ".tmp-compact-0000beef.parquet"
    journal = {
        "version": 1,
        "table": "cpu",
        "partition": str(part.relative_to(tdir)),
        "inputs": [p.name for p in paths],
        "output": output,
        "temp": temp,
    }
    (tdir / lake.JOURNAL_DIR / "x.json").write_text(json.dumps(journal))
    merged.write_parquet(part / (output if committed else temp))
    for p in paths[inputs_left:]:
        if committed:
            p.unlink()
    return part, expected


@pytest.mark.parametrize(
    ("committed", "inputs_left"), [(False, 3), (True, 3), (True, 1), (True, 0)]
)
def test_scan_is_correct_before_recovery_and_recovery_finishes(
    tmp_path: Path, committed: bool, inputs_left: int
) -> None:
    part, expected = _interrupted(tmp_path, committed=committed, inputs_left=inputs_left)
    assert_frame_equal(sorted_rows(lake.scan(tmp_path, "cpu").collect()), expected)
    stats = lake.compact(tmp_path, "cpu", older_than=timedelta(days=10**4))  # recovery only
    assert stats.recovered == 1
    assert_frame_equal(sorted_rows(lake.scan(tmp_path, "cpu").collect()), expected)
    names = sorted(os.listdir(part))
    assert len(names) == (1 if committed else 3) and not any(n.startswith(".") for n in names)
    assert not list((tmp_path / "cpu" / lake.JOURNAL_DIR).glob("*.json"))


def test_unreadable_journal_is_reported(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "cpu", cpu_rows(1))
    jdir = tmp_path / "cpu" / lake.JOURNAL_DIR
    jdir.mkdir()
    (jdir / "broken.json").write_text("{not json")
    with pytest.raises(lake.CorruptFileError) as info:
        lake.scan(tmp_path, "cpu")
    assert info.value.path == jdir / "broken.json"
    report: list[lake.CorruptFileError] = []
    assert lake.read(tmp_path, "cpu", on_corrupt="skip", report=report).height == 10
    assert [e.path for e in report] == [jdir / "broken.json"]


def test_retention_deletes_old_partitions_only(tmp_path: Path) -> None:
    lake.write_table(tmp_path, "cpu", cpu_rows(30, ("h1", "h2")))
    now = T0 + timedelta(hours=30)
    assert lake.retention(tmp_path, "cpu", keep=timedelta(hours=6), now=now) == 48
    got = lake.scan(tmp_path, "cpu").collect()
    assert got["time"].min() == T0 + timedelta(hours=24) and got.height == 2 * 6 * 10
    assert not (tmp_path / "cpu" / "host=h1" / "date=2024-01-01").exists()  # empty dirs go too
    assert lake.retention(tmp_path, "cpu", keep=timedelta(hours=6), now=now) == 0


# ---------------------------------------------------------------- kill -9 tests


def _run_and_kill(
    mode: str, root: Path, first: int, rng: random.Random, while_running: object = None
) -> int:
    """Start the helper, SIGKILL it at a random moment, return the committed watermark."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), mode, str(root), str(first)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + rng.uniform(0.05, 0.4)
    while time.monotonic() < deadline:
        if callable(while_running):
            while_running()
        else:
            time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    committed = first
    for line in proc.stdout.read().splitlines():
        if line.startswith("committed "):
            committed = int(line.split()[1])
    proc.stdout.close()
    return committed


def _check(root: Path, runs: list[tuple[int, int, int]]) -> None:
    """Visible ids: unique, all committed ones, and only ids a run may have written."""
    ids = lake.scan(root, "cpu").select("user").collect()["user"]
    assert ids.n_unique() == ids.len(), "duplicated rows"
    seen = set(ids.to_list())
    allowed: set[int] = set()
    for first, committed, slack in runs:
        missing = set(range(first, committed)) - seen
        assert not missing, f"lost committed rows {sorted(missing)[:5]}"
        allowed.update(range(first, committed + slack))
    assert seen <= allowed, f"rows nobody wrote: {sorted(seen - allowed)[:5]}"


def test_kill_9_while_writing_through_the_sink(tmp_path: Path) -> None:
    rng = random.Random(20240101)
    runs: list[tuple[int, int, int]] = []
    for i in range(4):
        first = i * 1_000_000
        runs.append(
            (first, _run_and_kill("sink", tmp_path, first, rng), 100)
        )  # one flush in flight
        _check(tmp_path, runs)
    assert sum(c - f for f, c, _ in runs) > 0, "the helper never committed anything"
    lake.LakeSink(tmp_path).close()  # recovery on open changes nothing visible
    _check(tmp_path, runs)


def test_kill_9_while_compacting_with_a_concurrent_reader(tmp_path: Path) -> None:
    rng = random.Random(7)
    runs: list[tuple[int, int, int]] = []
    reads = {"ok": 0}

    def read_concurrently() -> None:
        if not (tmp_path / "cpu").exists():
            return
        # read() lists again when an input vanished between listing and reading (the helper
        # recompacts every few ms, far more often than a real lake: allow many retries)
        ids = lake.read(tmp_path, "cpu", columns=["user"], attempts=50)["user"]
        assert ids.n_unique() == ids.len(), "a reader saw a merged file and its inputs"
        reads["ok"] += 1

    for i in range(4):
        first = i * 1_000_000
        runs.append((first, _run_and_kill("compact", tmp_path, first, rng, read_concurrently), 20))
        _check(tmp_path, runs)
    stats = lake.compact(tmp_path, "cpu", older_than=timedelta(0), target_rows=400)
    _check(tmp_path, runs)
    assert stats.tables == 1
    assert not list((tmp_path / "cpu" / lake.JOURNAL_DIR).glob("*.json"))
    assert not [p for p in (tmp_path / "cpu").rglob(".tmp-compact-*")]
    assert reads["ok"] > 0


def test_a_corrupt_file_error_crosses_processes(tmp_path: Path) -> None:
    """A sweep's per-host worker returns the files it skipped to the command: the error
    pickles with its path and reason."""
    import pickle

    err = lake.CorruptFileError(tmp_path / "x.parquet", "Parquet magic bytes not found")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.path, back.reason, str(back)) == (type(err), err.path, err.reason, str(err))
