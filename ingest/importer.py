"""Import wide CSV or Parquet files (one column per metric) into a lake table.

Exported data from other tools (Prometheus/InfluxDB dumps, PCP, spreadsheets, public
datasets such as SMD) become one lake table — ``imported`` by default — with ``time``,
``host`` and one Float64 column per metric, so post-mortem analysis can run on them.
Their metrics have no known semantics: analytics treats them as generic gauges of
subsystem "other".

Time comes from a time column (ISO-8601 text, a datetime/date column, or epoch numbers:
seconds, milliseconds, microseconds or nanoseconds, the unit chosen by the column's median
magnitude so one wild value cannot change it) or, when there is none, from the row index:
``start + i * interval``. Times before 1970-01-01 or from 2200-01-01 on are not plausible
telemetry (a wrong unit, a corrupt cell): such a row is skipped and reported like any bad row.

Non-finite numbers (``inf``, ``-inf``, ``nan``, also overflowing ones like ``1e400``) are
stored as null — missing, as analytics treats a non-finite ratio — and counted: the report's
``nonfinite`` and a warning name the first few cells. An empty cell (or ``NA``/``null``) is
simply missing and not counted.

Error policy: a problem with the whole file (unreadable or corrupt file, a non-numeric
metric column, no time source, a file with no data rows) is fatal and raises :class:`ImportFileError` naming the
file and the column. A problem with one row (a cell that is not a number, a time that does
not parse, a wrong number of fields) skips that row and is reported as ``file:line``; the
good rows are kept. Everything is read and validated before anything is written, and the
lake write itself is atomic, so a fatal error leaves the lake untouched.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from ingest.lake import LakeError, exists, scan, tables, write_table
from ingest.schema import HOST, TIME, TIME_DTYPE

log = logging.getLogger(__name__)

#: column names recognised as the time column when --time-column is not given (case-insensitive)
TIME_COLUMN_NAMES: tuple[str, ...] = ("time", "timestamp", "datetime", "date", "ts", "_time")
#: names that cannot be metrics: they are lake columns or hive partition keys
RESERVED: frozenset[str] = frozenset({TIME, HOST, "date", "hour"})
#: a column whose non-empty cells fail to parse as numbers more often than this is non-numeric
NON_NUMERIC_SHARE = 0.5
DEFAULT_TABLE = "imported"
#: plausible times: earlier or later ones are bad rows (a wrong unit or a corrupt cell)
TIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
TIME_MAX = datetime(2200, 1, 1, tzinfo=UTC)
_SPAN_US = (TIME_MAX - TIME_MIN) // timedelta(microseconds=1)
#: epoch units, smallest first, with the factor to microseconds
_EPOCH_UNITS: tuple[tuple[str, float], ...] = (("s", 1e6), ("ms", 1e3), ("us", 1.0), ("ns", 1e-3))
#: non-finite cells named in the report (the count covers all of them)
NONFINITE_EXAMPLES = 5


class ImportFileError(ValueError):
    """A file cannot be imported at all; the message names the file (and column)."""


@dataclass
class ImportReport:
    """What an import did: rows kept, rows skipped (``file:line: reason``), metric columns."""

    table: str
    host: str
    rows: int = 0
    metrics: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    start: datetime | None = None
    end: datetime | None = None
    files: list[str] = field(default_factory=list)
    nonfinite: int = 0  # inf/-inf/nan cells stored as null
    nonfinite_examples: list[str] = field(default_factory=list)  # ``file:line: column 'c': 'inf'``


@dataclass
class _Read:
    """One file validated: the frame to import, rows skipped, non-finite cells made null."""

    frame: pl.DataFrame
    skipped: list[str]
    nonfinite: int
    nonfinite_examples: list[str]


@dataclass
class _Raw:
    """One file read as text cells (CSV) or typed columns (Parquet), before validation."""

    path: Path
    frame: pl.DataFrame  # columns as read
    lines: list[int]  # source line (CSV) or row number (Parquet) of each row, for messages
    ordinals: list[int]  # position of each row among all data records, bad ones included
    where: str  # "line" or "row"
    skipped: list[tuple[int, str]]  # (line, reason) of rows dropped while reading


def _read_csv(path: Path, has_header: bool) -> _Raw:
    # csv gives exact line numbers (quoted newlines included) and tolerates ragged rows,
    # which polars' reader either rejects wholesale or pads silently.
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            rows: list[list[str]] = []
            lines: list[int] = []
            ordinals: list[int] = []
            n_records = 0
            header: list[str] | None = None
            skipped: list[tuple[int, str]] = []
            for rec in reader:
                if not rec or all(not c.strip() for c in rec):
                    continue
                if header is None:
                    if has_header:
                        header = [c.strip() for c in rec]
                        continue
                    header = [f"c{i + 1}" for i in range(len(rec))]
                n_records += 1
                if len(rec) != len(header):
                    skipped.append((reader.line_num, f"{len(rec)} fields, expected {len(header)}"))
                    continue
                rows.append(rec)
                lines.append(reader.line_num)
                ordinals.append(n_records - 1)
    except UnicodeDecodeError as exc:
        raise ImportFileError(f"{path}: not a UTF-8 text CSV ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise ImportFileError(f"{path}: malformed CSV: {exc}") from None
    if header is None:
        raise ImportFileError(f"{path}: empty file")
    _check_names(path, header)
    if n_records == 0:
        raise ImportFileError(f"{path}: no data rows (header only); nothing imported")
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    frame = pl.DataFrame({h: pl.Series(h, list(c), dtype=pl.String) for h, c in zip(header, cols, strict=True)})
    return _Raw(path, frame, lines, ordinals, "line", skipped)


def _read_parquet(path: Path) -> _Raw:
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for truncated/corrupt files
        raise ImportFileError(f"{path}: cannot read Parquet file (truncated or corrupt?): {exc}") from None
    _check_names(path, frame.columns)
    if frame.height == 0:
        raise ImportFileError(f"{path}: no data rows; nothing imported")
    return _Raw(path, frame, list(range(frame.height)), list(range(frame.height)), "row", [])


def _where(raw: _Raw, pos: int) -> str:
    """``file:LINE`` for CSV (1-based source line), ``file: row N`` for Parquet (1-based)."""
    return f"{raw.path}:{pos}" if raw.where == "line" else f"{raw.path}: row {pos + 1}"


def _check_names(path: Path, names: Sequence[str]) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if not n:
            raise ImportFileError(f"{path}: column {i + 1} has an empty name")
        if n in seen:
            raise ImportFileError(f"{path}: duplicate column name {n!r}")
        if "@" in n:
            # '@' separates a feature family from its device in feature names
            raise ImportFileError(f"{path}: column {n!r}: '@' is not allowed in metric names")
        seen.add(n)


def _epoch(values: pl.Series) -> tuple[pl.Series, str]:
    """Epoch numbers to UTC datetimes and the unit read: the first of s, ms, us, ns in which
    the column's median magnitude is a plausible time. Values outside 1970..2200 in that unit
    (and non-finite ones) become null, so their rows are reported, not cast into garbage."""
    v = values.cast(pl.Float64)
    finite = v.filter(v.is_finite())
    mid = float(finite.abs().median()) if len(finite) else 0.0  # type: ignore[arg-type]
    # no unit fits the median: every row is out of range whichever unit was meant
    unit, factor = next(((u, f) for u, f in _EPOCH_UNITS if mid * f < _SPAN_US), ("s/ms/us/ns", 1e-3))
    us = (v * factor).round(0)
    ok = us.is_finite() & (us >= 0) & (us < _SPAN_US)
    us = pl.select(pl.when(ok).then(us).otherwise(None)).to_series()
    return us.cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"), unit


def _fromiso(text: str | None) -> datetime | None:
    if text is None:
        return None
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _parse_times(values: pl.Series) -> tuple[pl.Series, str | None]:
    """Any supported time column -> (Datetime(us, UTC), the epoch unit read or None), null
    where a value does not parse (or, for epoch numbers, is out of range)."""
    dt = values.dtype
    if isinstance(dt, pl.Datetime):
        out = values if dt.time_zone else values.dt.replace_time_zone("UTC")
        return out.dt.convert_time_zone("UTC").cast(TIME_DTYPE), None
    if dt == pl.Date:
        return values.cast(pl.Datetime("us")).dt.replace_time_zone("UTC"), None
    if dt.is_numeric():
        return _epoch(values)
    if dt != pl.String:
        raise TypeError(f"unsupported time dtype {dt}")
    text = values.str.strip_chars()
    nums = text.cast(pl.Float64, strict=False)
    nonempty = text.is_not_null() & (text != "")
    if nonempty.sum() > 0 and nums.filter(nonempty).null_count() == 0:
        return _epoch(nums)
    fast = text.str.to_datetime(time_zone="UTC", strict=False, time_unit="us")
    missing = fast.is_null() & nonempty
    if missing.any():
        # mixed ISO formats in one column: finish the stragglers one by one
        slow = pl.Series(
            [_fromiso(t) if m else None for t, m in zip(text.to_list(), missing.to_list(), strict=True)],
            dtype=TIME_DTYPE,
        )
        fast = fast.cast(TIME_DTYPE).zip_with(~missing, slow)
    return fast.cast(TIME_DTYPE), None


def _to_float(values: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """(Float64 values with non-finite ones null, mask of cells that were present but not a
    number, mask of non-finite cells)."""
    none = pl.Series([False] * len(values))
    if values.dtype == pl.Null:
        return values.cast(pl.Float64), none, none
    if values.dtype.is_numeric():
        out = values.cast(pl.Float64)
        bad = none
    elif values.dtype == pl.String:
        text = values.str.strip_chars()
        out = text.cast(pl.Float64, strict=False)
        bad = out.is_null() & text.is_not_null() & (text != "") & ~text.str.to_lowercase().is_in(["null", "na"])
    else:
        raise TypeError(str(values.dtype))
    nonfinite = (out.is_not_null() & ~out.is_finite()).fill_null(False)
    return pl.select(pl.when(nonfinite).then(None).otherwise(out)).to_series(), bad, nonfinite


def _cell(value: object) -> str:
    """A cell for a message: text quoted (as in the file), other values as printed."""
    return repr(value) if isinstance(value, str) else str(value)


def _validate(
    raw: _Raw,
    *,
    time_column: str | None,
    interval: timedelta | None,
    start: datetime | None,
) -> _Read:
    path, frame = raw.path, raw.frame
    problems = list(raw.skipped)
    tcol = time_column
    if tcol is not None and tcol not in frame.columns:
        raise ImportFileError(f"{path}: time column {tcol!r} not found; columns: {', '.join(frame.columns[:20])}")
    lower = {c.lower(): c for c in frame.columns}
    found = next((lower[n] for n in TIME_COLUMN_NAMES if n in lower), None)
    if tcol is None and interval is not None and found is not None:
        raise ImportFileError(f"{path}: has a time column {found!r}; drop --interval/--start to use it")
    if tcol is None and interval is None:
        tcol = found
        if tcol is None:
            raise ImportFileError(
                f"{path}: no time column (looked for {', '.join(TIME_COLUMN_NAMES)}); "
                "name one with --time-column, or give --interval and --start to time rows by index"
            )
    metrics = [c for c in frame.columns if c != tcol]
    if not metrics:
        raise ImportFileError(f"{path}: no metric columns besides the time column")
    for m in metrics:
        if m in RESERVED:
            raise ImportFileError(f"{path}: column {m!r} is a reserved name ({', '.join(sorted(RESERVED))}); rename it")

    bad_rows = pl.Series([False] * frame.height)
    reasons: dict[int, str] = {}
    cols: dict[str, pl.Series] = {}
    nonfinite: dict[str, pl.Series] = {}
    for m in metrics:
        try:
            values, bad, nonfinite[m] = _to_float(frame[m])
        except TypeError:
            raise ImportFileError(f"{path}: column {m!r} is not numeric (dtype {frame[m].dtype})") from None
        n_bad = int(bad.sum())
        present = int((frame[m].cast(pl.String).str.strip_chars().fill_null("") != "").sum())
        if n_bad and n_bad > NON_NUMERIC_SHARE * present:
            example = frame[m].filter(bad).head(1).to_list()[0]
            raise ImportFileError(
                f"{path}: column {m!r} is not numeric ({n_bad} of {present} values, e.g. {example!r}); "
                "remove it or convert it to numbers"
            )
        for i in bad.arg_true().to_list():
            reasons.setdefault(i, f"column {m!r}: {frame[m][i]!r} is not a number")
        bad_rows = bad_rows | bad
        cols[m] = values

    span = f"outside {TIME_MIN:%Y-%m-%d}..{TIME_MAX:%Y-%m-%d}"
    if tcol is not None:
        try:
            times, unit = _parse_times(frame[tcol])
        except TypeError:
            raise ImportFileError(f"{path}: time column {tcol!r} has unsupported dtype {frame[tcol].dtype}") from None
        why = "does not parse" if unit is None else f"is {span} read as epoch {unit}"
        for i in times.is_null().arg_true().to_list():
            reasons.setdefault(i, f"time {_cell(frame[tcol][i])} {why}")
        bad_rows = bad_rows | times.is_null()
    else:
        if interval is None or start is None:
            raise ImportFileError(f"{path}: timing rows by index needs both --interval and --start")
        step_us = interval // timedelta(microseconds=1)
        base = (start.astimezone(UTC) - TIME_MIN) // timedelta(microseconds=1)
        # a row's time follows its place in the file, so a skipped row leaves a gap. In
        # float (exact for integers below 2**53 us, year 2255), so a huge interval cannot
        # overflow Int64; times out of range are null before the cast.
        us = pl.Series(raw.ordinals, dtype=pl.Float64) * float(step_us) + float(base)
        ok = (us >= 0) & (us < _SPAN_US)
        times = (
            pl.select(pl.when(ok).then(us).otherwise(None)).to_series()
            .cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
        )
        for i in (~ok).arg_true().to_list():
            reasons.setdefault(i, f"time start + {raw.ordinals[i]} x interval is {span}")
        bad_rows = bad_rows | ~ok
    late = ((times < TIME_MIN) | (times >= TIME_MAX)).fill_null(False)
    for i in late.arg_true().to_list():
        reasons.setdefault(i, f"time {_cell(frame[tcol][i]) if tcol is not None else times[i]} is {span}")
    bad_rows = bad_rows | late

    problems += [(raw.lines[i], reason) for i, reason in reasons.items()]
    skipped = [f"{_where(raw, pos)}: {reason}" for pos, reason in sorted(problems)]
    out = pl.DataFrame({TIME: times, **cols}).filter(~bad_rows)
    if out.height == 0:
        detail = f"; first problem: {skipped[0]}" if skipped else ""
        raise ImportFileError(f"{path}: no good rows{detail}")
    # non-finite cells of the rows kept: counted, the first few named in row order
    cells = sorted((i, m) for m, mask in nonfinite.items() for i in (mask & ~bad_rows).arg_true().to_list())
    examples = [f"{_where(raw, raw.lines[i])}: column {m!r}: {_cell(frame[m][i])}" for i, m in cells[:NONFINITE_EXAMPLES]]
    return _Read(out, skipped, len(cells), examples)


def _n_records(path: str | Path, has_header: bool) -> int:
    """Data records of a file (bad ones included): its length in the row-index time base."""
    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return int(pq.read_metadata(p).num_rows)
    with p.open(newline="", encoding="utf-8-sig") as fh:
        n = sum(1 for rec in csv.reader(fh) if rec and any(c.strip() for c in rec))
    return max(0, n - (1 if has_header else 0))


def _read(
    path: str | Path,
    *,
    time_column: str | None,
    interval: timedelta | None,
    start: datetime | None,
    has_header: bool,
) -> _Read:
    p = Path(path)
    if not p.is_file():
        raise ImportFileError(f"{p}: no such file")
    raw = _read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else _read_csv(p, has_header)
    return _validate(raw, time_column=time_column, interval=interval, start=start)


def _refuse_overlap(lake_root: str | Path, table: str, host: str, first: Any, last: Any) -> None:
    if not exists(lake_root) or table not in tables(lake_root):
        return  # (a new lake: write_table creates it)
    end = last + timedelta(microseconds=1)
    have = scan(lake_root, table, start=first, end=end, hosts=[host]).filter(
        pl.col(TIME).is_between(first, last)).select(pl.len()).collect().item()
    if have:
        raise ImportFileError(
            f"host {host} already has {have} rows in table {table} between {first} and {last}: importing "
            f"again would store them twice (the lake appends). Nothing was written; use --append to add "
            f"the rows anyway, or --host/--table to import them elsewhere")


def import_files(
    lake_root: str | Path,
    host: str,
    files: Sequence[str | Path],
    *,
    table: str = DEFAULT_TABLE,
    time_column: str | None = None,
    interval: timedelta | None = None,
    start: datetime | None = None,
    has_header: bool = True,
    append: bool = False,
) -> ImportReport:
    """Import files for one host into ``table`` of the lake; all or nothing per call.

    Several files are concatenated (metric columns are the union; missing ones null). With
    row-index timing each file starts at ``start`` unless it follows the previous one —
    files given together are taken as consecutive: file k starts where file k-1 ended.
    When the host already has rows in ``table`` inside the imported time range (the same
    file imported again, say) nothing is written unless ``append``: the lake appends, so
    a second import would double every row.
    """
    if not files:
        raise ImportFileError("no files to import")
    frames: list[pl.DataFrame] = []
    report = ImportReport(table=table, host=host)
    next_start = start
    for i, f in enumerate(files):
        r = _read(f, time_column=time_column, interval=interval, start=next_start, has_header=has_header)
        if time_column is None and interval is not None and next_start is not None and i + 1 < len(files):
            # files given together are consecutive: the next starts after this one's last record
            n = _n_records(f, has_header)
            try:
                next_start = next_start + interval * n
            except OverflowError:
                raise ImportFileError(f"{f}: the file after it would start past year 9999 ({n} rows x {interval})") from None
        frames.append(r.frame)
        report.skipped.extend(r.skipped)
        report.files.append(str(f))
        report.nonfinite += r.nonfinite
        report.nonfinite_examples.extend(r.nonfinite_examples[: NONFINITE_EXAMPLES - len(report.nonfinite_examples)])
        if r.nonfinite:
            log.debug("%s: %d non-finite values stored as null (first: %s)", f, r.nonfinite, r.nonfinite_examples[0])
    for s in report.skipped:
        log.debug("skipped %s", s)  # the report carries them; the command prints them
    data = pl.concat(frames, how="diagonal_relaxed").sort(TIME)
    if not append and data.height:
        _refuse_overlap(lake_root, table, host, data[TIME].min(), data[TIME].max())
    metrics = [c for c in data.columns if c != TIME]
    data = data.select(
        pl.col(TIME).cast(TIME_DTYPE), pl.lit(host, dtype=pl.String).alias(HOST), *[pl.col(m).cast(pl.Float64) for m in metrics]
    )
    try:
        write_table(lake_root, table, data)  # validates host and table names before writing
    except LakeError as exc:
        raise ImportFileError(str(exc)) from exc
    report.rows = data.height
    report.metrics = metrics
    report.start = data[TIME].min()  # type: ignore[assignment]
    report.end = data[TIME].max()  # type: ignore[assignment]
    return report
