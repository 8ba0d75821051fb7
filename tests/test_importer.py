from __future__ import annotations

import logging
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ingest.importer import ImportFileError, import_files
from ingest.lake import scan, tables

DATA = Path(__file__).parent / "data" / "importer"
T0 = datetime(2026, 11, 30, tzinfo=UTC)


def read_wide(path: Path, **kw: Any) -> tuple[pl.DataFrame, list[str]]:
    """One file through `import_files` into a scratch lake: (its rows as stored, without the
    host column; the skipped rows the report names)."""
    with tempfile.TemporaryDirectory() as lake:
        rep = import_files(lake, "h", [path], **kw)
        return scan(lake, rep.table).collect().drop("host").sort("time"), rep.skipped


def test_csv_bad_rows_skipped_good_rows_kept() -> None:
    df, skipped = read_wide(DATA / "metrics.csv")
    assert df.columns == ["time", "cpu_busy", "mem_used", "disk_lat_ms"]
    assert all(df.schema[c] == pl.Float64 for c in df.columns[1:])
    # line 4: 'oops', line 5: 3 fields, line 6: bad time; the others are kept
    assert [s.split(": ")[0] for s in skipped] == [f"{DATA / 'metrics.csv'}:{n}" for n in (4, 5, 6)]
    assert "'oops' is not a number" in skipped[0] and "3 fields, expected 4" in skipped[1]
    assert "'not-a-time'" in skipped[2]
    assert df["time"].to_list() == [
        T0,
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=5),
        T0 + timedelta(minutes=6),
    ]
    assert df["mem_used"].to_list() == [1024.0, 1030.0, 1070.0, 1080.0]
    # an empty cell and NaN are missing values, not bad rows
    assert df["disk_lat_ms"].to_list()[1] is None and df["cpu_busy"].to_list()[3] is None


def test_non_numeric_column_rejected_by_name() -> None:
    with pytest.raises(ImportFileError, match=r"nonnumeric.csv: column 'state' is not numeric"):
        read_wide(DATA / "nonnumeric.csv")


def test_truncated_parquet_names_file() -> None:
    with pytest.raises(ImportFileError, match=r"truncated.parquet: cannot read Parquet"):
        read_wide(DATA / "truncated.parquet")


def test_parquet_with_time_column_and_text_numbers() -> None:
    df, skipped = read_wide(DATA / "metrics.parquet")
    assert df.columns == ["time", "gpu_power", "queue_depth", "text_num"]
    assert skipped == [
        f"{DATA / 'metrics.parquet'}: row 3: column 'text_num': 'bad' is not a number"
    ]
    assert df.height == 5 and df["queue_depth"].to_list() == [1.0, 2.0, 4.0, 5.0, 6.0]


def test_row_index_timing_without_header() -> None:
    df, skipped = read_wide(
        DATA / "noheader.csv", has_header=False, interval=timedelta(minutes=1), start=T0
    )
    assert df.columns == ["time", "c1", "c2", "c3"]
    assert len(skipped) == 1 and skipped[0].startswith(f"{DATA / 'noheader.csv'}:3:")
    assert df["time"].to_list() == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=3)]


def test_no_time_source_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(ImportFileError, match="no time column"):
        read_wide(DATA / "noheader.csv", has_header=False)


def test_import_writes_lake_table(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    rep = import_files(lake, "srv1", [DATA / "metrics.csv"])
    assert (
        rep.rows == 4
        and rep.metrics == ["cpu_busy", "mem_used", "disk_lat_ms"]
        and len(rep.skipped) == 3
    )
    got = scan(lake, "imported").collect().sort("time")
    assert got.columns == ["time", "host", "cpu_busy", "mem_used", "disk_lat_ms"]
    assert got["host"].unique().to_list() == ["srv1"]
    assert got["mem_used"].to_list() == [1024.0, 1030.0, 1070.0, 1080.0]


def test_import_creates_a_lake_that_does_not_exist_yet(tmp_path: Path) -> None:
    # the first step of a post-mortem of another tool's data: nothing to mkdir first
    lake = tmp_path / "new" / "lake"
    rep = import_files(lake, "srv1", [DATA / "metrics.csv"])
    assert tables(lake) == [rep.table] and scan(lake, rep.table).collect().height == rep.rows > 0


def test_fatal_error_writes_nothing(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    with pytest.raises(ImportFileError, match="truncated.parquet"):
        import_files(lake, "srv1", [DATA / "metrics.csv", DATA / "truncated.parquet"])
    assert tables(lake) == []


def test_cli_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import main

    lake = tmp_path / "lake"
    lake.mkdir()
    rc = main(
        [
            "import",
            "--lake",
            str(lake),
            "--host",
            "m1",
            "--table",
            "smd",
            "--no-header",
            "--interval",
            "1m",
            "--start",
            "2026-11-30T00:00Z",
            str(DATA / "noheader.csv"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "imported 3 rows x 3 metrics" in out and "noheader.csv:3" in out
    assert scan(lake, "smd").collect().height == 3
    rc = main(["import", "--lake", str(lake), "--host", "m1", str(DATA / "nonnumeric.csv")])
    assert rc == 2 and "column 'state' is not numeric" in capsys.readouterr().err


def test_importing_the_same_rows_again_is_refused_unless_appended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    from jobs.cli import main

    lake = tmp_path / "lake"
    lake.mkdir()
    argv = ["import", "--lake", str(lake), "--host", "m1", str(DATA / "metrics.csv")]
    assert main(argv) == 0
    n = scan(lake, "imported").collect().height
    capsys.readouterr()
    assert main(argv) == 2  # the lake appends: a second import would double every row
    assert "already has" in capsys.readouterr().err
    assert scan(lake, "imported").collect().height == n
    # another host, or rows after the stored ones, are not an overlap
    assert main(["import", "--lake", str(lake), "--host", "m2", str(DATA / "metrics.csv")]) == 0
    assert main([*argv, "--append"]) == 0
    assert scan(lake, "imported", hosts=["m1"]).collect().height == 2 * n
    # skipped rows and null cells are told once, by the command (not again as log warnings)
    assert "skipped" in capsys.readouterr().out
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warned if "skipped" in m or "non-finite" in m], warned


def test_epoch_time_column_and_reserved_names(tmp_path: Path) -> None:
    f = tmp_path / "epoch.csv"
    f.write_text("ts,x\n1795996800,1\n1795996860,2\n")
    df, skipped = read_wide(f)
    assert skipped == [] and df["time"].to_list() == [T0, T0 + timedelta(minutes=1)]
    ms = tmp_path / "ms.csv"
    ms.write_text("ts,x\n1795996800000,1\n")
    assert read_wide(ms)[0]["time"].to_list() == [T0]
    bad = tmp_path / "reserved.csv"
    bad.write_text("time,host,x\n2026-11-30T00:00Z,1,2\n")
    with pytest.raises(ImportFileError, match="'host' is a reserved name"):
        read_wide(bad)
    at = tmp_path / "at.csv"
    at.write_text("time,gpu@0\n2026-11-30T00:00Z,1\n")
    with pytest.raises(ImportFileError, match="'@' is not allowed"):
        read_wide(at)
    with pytest.raises(ImportFileError, match="time column 'when' not found"):
        read_wide(f, time_column="when")


def test_consecutive_files_by_row_index(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    rep = import_files(lake, "m", [DATA / "noheader.csv", DATA / "noheader.csv"], has_header=False,
                       interval=timedelta(minutes=1), start=T0)
    # the second file starts one interval after the last row of the first (row 4 = 00:03)
    assert rep.rows == 6 and rep.end == T0 + timedelta(minutes=7)
    assert scan(lake, "imported").collect()["time"].n_unique() == 6


def test_row_index_timing_keeps_gaps_of_skipped_rows(tmp_path: Path) -> None:
    f = tmp_path / "ragged.csv"
    f.write_text("0.1,0.2,0.3\n0.2,0.3\n0.3,0.4,0.5\n")
    df, skipped = read_wide(f, has_header=False, interval=timedelta(minutes=1), start=T0)
    assert skipped == [f"{f}:2: 2 fields, expected 3"]
    assert df["time"].to_list() == [T0, T0 + timedelta(minutes=2)]
    with pytest.raises(ImportFileError, match="has a time column 'time'; drop --interval"):
        read_wide(DATA / "metrics.csv", interval=timedelta(minutes=1), start=T0)


# ----------------------------------------------------------------- edges (issue item 9)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from jobs.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_header_only_csv_imports_nothing_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "header.csv"
    f.write_text("time,cpu\n")
    with pytest.raises(ImportFileError, match=r"header.csv: no data rows \(header only\)"):
        read_wide(f)
    lake = tmp_path / "lake"
    lake.mkdir()
    rc, _, err = _cli(capsys, "import", "--lake", str(lake), "--host", "h", str(f))
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"unveil import: error: {f}: no data rows (header only); nothing imported"]
    assert tables(lake) == []


def test_empty_parquet_imports_nothing_with_a_clear_message(tmp_path: Path) -> None:
    f = tmp_path / "empty.parquet"
    pl.DataFrame({"time": pl.Series([], dtype=pl.Datetime("us", "UTC")), "x": pl.Series([], dtype=pl.Float64)}).write_parquet(f)
    with pytest.raises(ImportFileError, match=r"empty.parquet: no data rows"):
        read_wide(f)


@pytest.mark.parametrize("cell", ["1e20", "-1795996800", "7258118400", "inf", "-inf", "nan"])
def test_epoch_time_outside_1970_2200_skips_the_row_named(tmp_path: Path, cell: str) -> None:
    f = tmp_path / "epoch.csv"
    # the unit follows the column's typical magnitude (seconds here), so one wild value
    # is a bad row, not a reason to read the whole column as nanoseconds
    f.write_text(f"ts,x\n1795996800,1\n{cell},2\n1795996860,3\n")
    df, skipped = read_wide(f)
    assert df["time"].to_list() == [T0, T0 + timedelta(minutes=1)] and df["x"].to_list() == [1.0, 3.0]
    assert len(skipped) == 1 and skipped[0].startswith(f"{f}:3: time {cell!r}")
    assert "1970" in skipped[0] and "2200" in skipped[0]


def test_epoch_units_by_magnitude_s_ms_us_ns(tmp_path: Path) -> None:
    for scale in (1, 1000, 10**6, 10**9):
        f = tmp_path / f"e{scale}.csv"
        f.write_text(f"ts,x\n{1795996800 * scale},1\n")
        df, skipped = read_wide(f)
        assert skipped == [] and df["time"].to_list() == [T0], scale


def test_epoch_column_entirely_out_of_range_is_fatal_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "huge.csv"
    f.write_text("time,a\n1e20,1\n")
    with pytest.raises(ImportFileError, match=r"huge.csv: no good rows; first problem: .*huge.csv:2: time '1e20'"):
        read_wide(f)
    lake = tmp_path / "lake"
    lake.mkdir()
    rc, _, err = _cli(capsys, "import", "--lake", str(lake), "--host", "h", str(f))
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_iso_and_parquet_times_outside_1970_2200_are_rejected(tmp_path: Path) -> None:
    f = tmp_path / "iso.csv"
    f.write_text("time,x\n1969-12-31T23:59:59Z,1\n2026-11-30T00:00Z,2\n2200-01-01T00:00Z,3\n")
    df, skipped = read_wide(f)
    assert df["x"].to_list() == [2.0]
    assert [s.split(": time")[0] for s in skipped] == [f"{f}:2", f"{f}:4"]
    p = tmp_path / "t.parquet"
    pl.DataFrame({"time": [datetime(1900, 1, 1), datetime(2026, 11, 30)], "x": [1.0, 2.0]}).write_parquet(p)
    df, skipped = read_wide(p)
    assert df["x"].to_list() == [2.0] and skipped[0].startswith(f"{p}: row 1: time")


def test_non_finite_values_are_stored_as_null_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "inf.csv"
    f.write_text("time,a,b\n1795996800,inf,1\n1795996860,-Infinity,nan\n1795996920,3,1e400\n1795996980,4,\n")
    lake = tmp_path / "lake"
    lake.mkdir()
    rep = import_files(lake, "h", [f])
    # rows are kept (other cells are good); the cells become null; the empty cell is just missing
    assert rep.rows == 4 and rep.skipped == []
    assert rep.nonfinite == 4
    assert rep.nonfinite_examples[0] == f"{f}:2: column 'a': 'inf'"
    got = scan(lake, "imported").collect().sort("time")
    assert got["a"].to_list() == [None, None, 3.0, 4.0] and got["b"].to_list() == [1.0, None, None, None]
    p = tmp_path / "inf.parquet"
    pl.DataFrame({"time": [T0, T0 + timedelta(minutes=1)], "x": [float("inf"), 1.0]}).write_parquet(p)
    rep = import_files(lake, "p", [p])
    assert rep.nonfinite == 1 and rep.nonfinite_examples == [f"{p}: row 1: column 'x': inf"]
    rc, out, _ = _cli(capsys, "import", "--lake", str(lake), "--host", "c", str(f))
    assert rc == 0 and "4 non-finite values (inf, -inf, nan) stored as null" in out


def test_row_index_times_outside_1970_2200_are_skipped_even_with_a_huge_interval(tmp_path: Path) -> None:
    f = tmp_path / "rows.csv"
    f.write_text("1\n2\n3\n")
    df, skipped = read_wide(f, has_header=False, interval=timedelta(days=100_000), start=T0)
    assert df["c1"].to_list() == [1.0]
    assert skipped == [f"{f}:2: time start + 1 x interval is outside 1970-01-01..2200-01-01",
                       f"{f}:3: time start + 2 x interval is outside 1970-01-01..2200-01-01"]
    # an interval past Int64 microseconds once overflowed into a traceback
    df, skipped = read_wide(f, has_header=False, interval=timedelta(days=9_999_999), start=T0)
    assert df.height == 1 and len(skipped) == 2
    with pytest.raises(ImportFileError, match=r"rows.csv: no good rows; first problem: .*rows.csv:1: time start \+ 0"):
        read_wide(f, has_header=False, interval=timedelta(minutes=1), start=datetime(1900, 1, 1, tzinfo=UTC))
    with pytest.raises(ImportFileError, match=r"rows.csv: the file after it would start past year 9999"):
        import_files(tmp_path / "lake", "h", [f, f], has_header=False, interval=timedelta(days=9_999_999), start=T0)
