"""Ad hoc and named SQL over every table of the lake (Polars SQL).

Every lake table (each measurement, host_facts, features, scores, findings, incidents,
remediations, labels ...) is registered under its own name as a LazyFrame from
:func:`ingest.lake.scan`, so ``start``/``end``/``hosts`` prune partition directories and
row groups *before* the SQL runs. Only the tables the query names are scanned. Two
derived views help with the wide and nested tables:

* ``feature_values``: the features table in long form — host, time, window_start,
  window_end, feature, family, device, subsystem, floor (the smallest change of the feature
  worth noticing, from analytics.catalog), value (one row per window and feature);
* ``finding_factors``: the findings' top factors, one row per factor — host, time,
  window_start, window_end, score, reference, rank, feature, family, device, subsystem,
  contribution, direction, value, reference_value.

``incidents`` shows each incident's latest row (the table holds a row per update of an
open incident and one when it closed; see knowledge_base.incidents), and the view
``lasting_incidents`` one row per lasting problem: the parts the scheduler cuts a long
incident into (every ``max_incident``) joined, with ``parts`` (knowledge_base.incidents.episodes).

Time pruning: rows with ``start <= time < end``, except ``host_facts`` (facts read before
``start`` are still in force: only ``time < end``) and ``labels`` (an injection that began
before ``start`` but overlaps it is kept: ``time < end`` and ``end > start``).

Only read queries run: the statement's first keyword (past comments and parentheses) must
be SELECT, WITH, VALUES or FROM, or EXPLAIN of one of them; anything else (DROP, INSERT,
COPY, CREATE ...) is refused before anything is read. ``SHOW TABLES`` lists the lake's
tables and views (tables are registered per query, so Polars alone would list none).
A parameter used as a LIMIT/OFFSET/FETCH row count must be a non-negative integer.

Named queries are the files ``sql/<name>.sql``. Their header comment describes them and
declares their parameters (see docs/query.md)::

    -- top-incidents: the worst incidents of the interval.
    --
    -- @param limit int = 20  how many incidents

Parameters appear in the SQL as ``:name`` and are substituted as typed literals (int,
float, bool, str, timestamp), never pasted as text: a string is one quoted literal with
quotes doubled, a number is checked to be a number. ``:since`` and ``:until`` are always
available (the query's time range; the lake's extremes when none is given).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

import polars as pl

from ingest import lake as lake_mod
from ingest import schema
from ingest.atomic import write_atomic
from jobs.timeparse import parse_time

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
FORMATS: tuple[str, ...] = ("table", "csv", "json", "parquet")
ParamType = Literal["int", "float", "bool", "str", "timestamp"]
PARAM_TYPES: tuple[str, ...] = ("int", "float", "bool", "str", "timestamp")
VIEWS: dict[str, str] = {"feature_values": "features", "finding_factors": "findings", "lasting_incidents": "incidents"}
# Time pruning that is not "start <= time < end" (see the module docstring).
_UNTIL_ONLY = frozenset({"host_facts", "labels"})
# Bounds of :since / :until when the query has no range.
_MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_TIME = datetime(2200, 1, 1, tzinfo=UTC)
_TIME_FMT = "%Y-%m-%dT%H:%M:%S%.6fZ"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_PARAM_DECL = re.compile(
    r"^@param\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s+(?P<type>[a-z]+)"
    r"(?:\s*=\s*(?P<default>'(?:[^']|'')*'|\S+))?\s*(?P<doc>.*)$"
)


class QueryError(ValueError):
    """A query cannot run: bad SQL, unknown table or parameter, bad parameter value."""


# --------------------------------------------------------------------- named queries


@dataclass(frozen=True)
class Param:
    name: str
    type: ParamType
    default: str | None  # as written in the header (None: required)
    doc: str


@dataclass(frozen=True)
class NamedQuery:
    name: str
    summary: str  # the first header line
    description: str  # the whole header, without the @param lines
    params: tuple[Param, ...]
    sql: str
    path: Path


def parse_named(text: str, path: str | os.PathLike[str], name: str | None = None) -> NamedQuery:
    """A named query from its file text: the leading ``--`` comment block is the header."""
    p = Path(path)
    qname = name or p.stem
    header: list[str] = []
    params: list[Param] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("--") or not lines[i].strip()):
        body = lines[i][2:].strip() if lines[i].startswith("--") else ""
        i += 1
        if body.startswith("@param"):
            m = _PARAM_DECL.match(body)
            if m is None or m.group("type") not in PARAM_TYPES:
                raise QueryError(f"{p}:{i}: bad parameter declaration {body!r}: expected "
                                 f"'@param NAME TYPE [= DEFAULT] description', TYPE one of {', '.join(PARAM_TYPES)}")
            if any(x.name == m.group("name") for x in params):
                raise QueryError(f"{p}:{i}: parameter {m.group('name')!r} declared twice")
            prm = Param(m.group("name"), m.group("type"), m.group("default"), m.group("doc").strip())  # type: ignore[arg-type]
            if prm.default is not None:
                try:
                    render_literal(_unquote(prm.default), prm.type)
                except QueryError as exc:
                    raise QueryError(f"{p}:{i}: default of parameter {prm.name!r}: {exc}") from None
            params.append(prm)
        else:
            header.append(body)
    sql = "\n".join(lines[i:]).strip()
    while header and not header[-1]:
        header.pop()
    if not header or not sql:
        raise QueryError(f"{p}: a named query needs a header comment ('-- {qname}: what it answers') and SQL")
    summary = header[0]
    if summary.startswith(f"{qname}:"):
        summary = summary[len(qname) + 1:].strip()
    return NamedQuery(qname, summary, "\n".join(header), tuple(params), sql, p)


def _unquote(default: str) -> str:
    if len(default) >= 2 and default[0] == default[-1] == "'":
        return default[1:-1].replace("''", "'")
    return default


def named_queries(sql_dir: str | os.PathLike[str] | None = None) -> dict[str, NamedQuery]:
    """Every ``*.sql`` file of ``sql_dir`` (default: the project's sql/), by name."""
    d = Path(sql_dir) if sql_dir is not None else SQL_DIR
    return {p.stem: parse_named(p.read_text(encoding="utf-8"), p) for p in sorted(d.glob("*.sql"))}


def load_named(name: str, sql_dir: str | os.PathLike[str] | None = None) -> NamedQuery:
    d = Path(sql_dir) if sql_dir is not None else SQL_DIR
    if not _NAME_RE.match(name):
        raise QueryError(f"bad query name {name!r}")
    p = d / f"{name}.sql"
    if not p.is_file():
        known = ", ".join(sorted(x.stem for x in d.glob("*.sql"))) or "none"
        raise QueryError(f"no named query {name!r} (looked for {p}); named queries: {known}")
    return parse_named(p.read_text(encoding="utf-8"), p)


def is_named(text: str) -> bool:
    """A bare word like ``top-incidents`` names a query; anything else is SQL."""
    return bool(_NAME_RE.match(text.strip())) and " " not in text.strip()


# ------------------------------------------------------------------------ parameters


def render_literal(value: Any, type_: str) -> str:
    """``value`` as one SQL literal of ``type_``. Text from the command line is parsed to
    the type first, so nothing but a literal can come out."""
    try:
        if type_ == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return str(int(value))
        if type_ == "float":
            if isinstance(value, bool):
                raise ValueError(value)
            f = float(value)
            if not math.isfinite(f):
                raise ValueError(value)
            return repr(f)
        if type_ == "bool":
            if isinstance(value, bool):
                return "TRUE" if value else "FALSE"
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return "TRUE"
            if s in ("false", "0", "no", "off"):
                return "FALSE"
            raise ValueError(value)
        if type_ == "str":
            return "'" + str(value).replace("'", "''") + "'"
        if type_ == "timestamp":
            ts = value if isinstance(value, datetime) else parse_time(str(value))
            ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
            return f"CAST('{ts.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00' AS TIMESTAMPTZ)"
    except (TypeError, ValueError) as exc:
        raise QueryError(f"bad {type_} value {value!r}"
                         + (f": {exc}" if type_ == "timestamp" else "")) from None
    raise QueryError(f"unknown parameter type {type_!r}; known: {', '.join(PARAM_TYPES)}")


def _infer_type(text: str) -> str:
    """Type of an ad hoc (undeclared) parameter given as text: int, float, else str."""
    for t, conv in (("int", int), ("float", float)):
        try:
            conv(text)
            return t
        except ValueError:
            continue
    return "str"


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, datetime):
        return "timestamp"
    return _infer_type(str(value))


def _segments(sql: str) -> list[tuple[bool, str]]:
    """Split SQL into (is_code, text) pieces: string literals, quoted identifiers and
    comments are not code (no parameter or table name is looked for in them)."""
    out: list[tuple[bool, str]] = []
    i, n, start = 0, len(sql), 0
    while i < n:
        c = sql[i]
        end = -1
        if c in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:  # doubled quote
                        j += 2
                        continue
                    break
                j += 1
            if j >= n:
                raise QueryError(f"unterminated {'string' if c == chr(39) else 'quoted identifier'} "
                                 f"starting at character {i + 1}")
            end = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            end = n if j < 0 else j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise QueryError(f"unterminated comment starting at character {i + 1}")
            end = j + 2
        if end >= 0:
            if start < i:
                out.append((True, sql[start:i]))
            out.append((False, sql[i:end]))
            i = start = end
        else:
            i += 1
    if start < n:
        out.append((True, sql[start:]))
    return out


_PARAM_REF = re.compile(r"(?<![:A-Za-z0-9_]):([A-Za-z_][A-Za-z0-9_]*)")


def parameters_in(sql: str) -> list[str]:
    """The ``:name`` parameters SQL refers to (``::type`` casts are not parameters)."""
    names: list[str] = []
    for code, text in _segments(sql):
        if code:
            names += [m.group(1) for m in _PARAM_REF.finditer(text)]
    return list(dict.fromkeys(names))


def bind(sql: str, literals: Mapping[str, str]) -> str:
    """Replace every ``:name`` outside literals and comments by ``literals[name]`` (already
    rendered by :func:`render_literal`)."""
    missing = [p for p in parameters_in(sql) if p not in literals]
    if missing:
        raise QueryError(f"no value for parameter(s) {', '.join(':' + m for m in missing)}; give --param NAME=VALUE")
    parts = []
    for code, text in _segments(sql):
        parts.append(_PARAM_REF.sub(lambda m: literals[m.group(1)], text) if code else text)
    return "".join(parts)


def parse_param_args(items: Sequence[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from ``--param`` to a dict; a bad item names itself."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not _IDENT.fullmatch(name):
            raise QueryError(f"bad --param {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


# A parameter that gives a row count: LIMIT :n, OFFSET :n, FETCH FIRST/NEXT :n.
_ROW_COUNT_PARAM = re.compile(r"\b(?:LIMIT|OFFSET|FETCH\s+(?:FIRST|NEXT))\s*\(?\s*:([A-Za-z_][A-Za-z0-9_]*)",
                              re.IGNORECASE)
_NON_NEGATIVE_INT = re.compile(r"[0-9]+")


def row_count_parameters(sql: str) -> set[str]:
    """The parameters ``sql`` uses as a LIMIT / OFFSET / FETCH row count (outside literals
    and comments)."""
    return {m.group(1) for m in _ROW_COUNT_PARAM.finditer(_code_only(sql))}


def _check_row_count(name: str, literal: str, raw: Any, where: str) -> None:
    if not _NON_NEGATIVE_INT.fullmatch(literal):
        raise QueryError(f"{where}parameter {name!r} sets a LIMIT/OFFSET row count: "
                         f"it must be a non-negative integer, not {raw!r}")


def _literals(query: NamedQuery | None, sql: str, values: Mapping[str, Any],
              start: datetime | None, end: datetime | None) -> dict[str, str]:
    lits = {"since": render_literal(start or _MIN_TIME, "timestamp"),
            "until": render_literal(end or _MAX_TIME, "timestamp")}
    counts = row_count_parameters(sql)
    if query is not None:
        declared = {p.name: p for p in query.params}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            known = ", ".join(f"{p.name} ({p.type})" for p in query.params) or "none"
            raise QueryError(f"query {query.name!r} has no parameter(s) {', '.join(unknown)}; its parameters: {known}")
        for p in query.params:
            if p.name in values:
                raw: Any = values[p.name]
            elif p.default is not None:
                raw = _unquote(p.default)
            else:
                raise QueryError(f"query {query.name!r} needs --param {p.name}=<{p.type}> ({p.doc or 'no description'})")
            try:
                lits[p.name] = render_literal(raw, p.type)
            except QueryError as exc:
                raise QueryError(f"parameter {p.name!r} of query {query.name!r}: {exc}") from None
            if p.name in counts:
                _check_row_count(p.name, lits[p.name], raw, f"query {query.name!r}: ")
    else:
        for k, v in values.items():
            lits[k] = render_literal(v, _type_of(v))
            if k in counts:
                _check_row_count(k, lits[k], v, "SQL: ")
    return lits


# ---------------------------------------------------------------------------- tables


def _scan(lake: str | os.PathLike[str], table: str, start: datetime | None, end: datetime | None,
          hosts: Sequence[str] | None, corrupt: list[lake_mod.CorruptFileError],
          exclude: Collection[Path] = ()) -> pl.LazyFrame:
    if table in _UNTIL_ONLY:
        lf = lake_mod.scan(lake, table, end=end, hosts=hosts, on_corrupt="skip", report=corrupt, exclude=exclude)
        if table == "labels" and start is not None:
            lf = lf.filter(pl.col("end").is_null() | (pl.col("end") > start))
        return lf
    return _complete(table, lake_mod.scan(lake, table, start=start, end=end, hosts=hosts, on_corrupt="skip",
                                          report=corrupt, exclude=exclude))


def _complete(table: str, lf: pl.LazyFrame) -> pl.LazyFrame:
    """A downstream table with the columns its files predate added as typed nulls (e.g.
    remediations written before attached_incidents / recurrence_of / came_back_after_s), so
    the named queries that select them run on older lakes."""
    if table not in _KNOWN_EMPTY:
        return lf
    known = _empty_known(table)
    if known is None:
        return lf
    have = set(lf.collect_schema().names())
    missing = [pl.lit(None, dt).alias(c) for c, dt in known.collect_schema().items() if c not in have]
    return lf.with_columns(missing) if missing else lf


def _scanned(sql: str, available: Sequence[str]) -> list[str]:
    """The lake tables a context for ``sql`` scans (named ones and the views' bases)."""
    wanted = referenced_names(sql)
    out = [t for t in available if t in wanted or t.lower() in wanted]
    out += [b for v, b in VIEWS.items() if v in wanted and b in available and b not in out]
    return out


def _damaged(lake: str | os.PathLike[str], tables: Sequence[str], start: datetime | None, end: datetime | None,
             hosts: Sequence[str] | None, known: Collection[Path]) -> list[lake_mod.CorruptFileError]:
    """Files of ``tables`` in the range whose pages fail a full read (a footer-valid file
    with damage inside fails only when a lazy scan reaches it, without naming it)."""
    paths: list[Path] = []
    for t in tables:
        try:
            listed = lake_mod.files(lake, t, start=None if t in _UNTIL_ONLY else start, end=end, hosts=hosts)
        except lake_mod.LakeError:  # an unreadable journal: already reported by the scan
            continue
        paths += [p for p in listed if p not in known]
    return lake_mod.probe(paths, root=lake)


def _feature_values(features: pl.LazyFrame) -> pl.LazyFrame:
    # Deferred import: jobs wires analytics in, the query module stays light otherwise.
    from analytics.catalog import lookup

    cols = features.collect_schema().names()
    keys = [c for c in ("time", "host", "window_start", "window_end") if c in cols]
    feats = [c for c in cols if c not in keys and c not in lake_mod.PARTITION_COLUMNS]
    if not feats:  # no features yet: the view's columns, no rows
        return pl.LazyFrame(schema={**{k: features.collect_schema()[k] for k in keys}, "feature": pl.String,
                                    "family": pl.String, "device": pl.String, "subsystem": pl.String,
                                    "floor": pl.Float64, "value": pl.Float64})
    meta = pl.LazyFrame(
        [(f, (i := lookup(f)).family, i.device, i.subsystem, i.floor) for f in feats],
        schema={"feature": pl.String, "family": pl.String, "device": pl.String, "subsystem": pl.String,
                "floor": pl.Float64},
        orient="row",
    )
    long = features.select(*keys, *[pl.col(f).cast(pl.Float64) for f in feats]).unpivot(
        index=keys, on=feats, variable_name="feature", value_name="value")
    return long.join(meta, on="feature", how="left").select(*keys, "feature", "family", "device", "subsystem",
                                                       "floor", "value")


def _finding_factors(findings: pl.LazyFrame) -> pl.LazyFrame:
    cols = findings.collect_schema().names()
    keys = [c for c in ("time", "host", "window_start", "window_end", "score", "reference") if c in cols]
    if "top_factors" not in cols:
        return findings.select(keys)
    return (findings.select(*keys, pl.col("top_factors"))
            .with_columns(pl.int_ranges(1, pl.col("top_factors").list.len() + 1).alias("rank"))
            .explode("top_factors", "rank")
            .drop_nulls("top_factors")
            .with_columns(pl.col("top_factors").struct.rename_fields(
                [f if f != "reference" else "reference_value"
                 for f in findings.collect_schema()["top_factors"].inner.to_schema()]))  # type: ignore[attr-defined]
            .unnest("top_factors"))


# (knowledge_base.incidents is imported when a query reads incidents: it brings
# scikit-learn, ~1.5 s at every start otherwise)
def _latest_incidents(lf: pl.LazyFrame) -> pl.LazyFrame:
    from knowledge_base.incidents import latest_incidents_lazy

    return latest_incidents_lazy(lf)


def _lasting_incidents(lf: pl.LazyFrame) -> pl.LazyFrame:
    from knowledge_base.incidents import episodes_lazy

    return episodes_lazy(lf)


#: how each of VIEWS is derived from its base table
_VIEW_OF: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "feature_values": _feature_values, "finding_factors": _finding_factors, "lasting_incidents": _lasting_incidents}


def _empty_base(table: str) -> pl.LazyFrame:
    """The base table of a view, empty (a lake not swept yet, or a sweep with no findings)."""
    known = _empty_known(table)
    if known is not None:
        return known
    return pl.LazyFrame(schema={"time": schema.TIME_DTYPE, "host": pl.String(),
                                "window_start": schema.TIME_DTYPE, "window_end": schema.TIME_DTYPE})


#: downstream tables that read as empty before the lake has them (with the measurements)
_KNOWN_EMPTY = ("scores", "findings", "incidents", "remediations")


def _empty_known(table: str) -> pl.LazyFrame | None:
    """A typed empty frame for a known table the lake does not have yet (measurements,
    scores, findings, incidents, remediations), so named queries return no rows instead of
    failing on a young lake or after a sweep that found nothing."""
    if table in schema.MEASUREMENTS:
        return pl.LazyFrame(schema=schema.get(table).polars_schema())
    if table in _KNOWN_EMPTY[:2]:
        from analytics.pipeline import FINDINGS_SCHEMA, SCORES_SCHEMA

        return pl.LazyFrame(schema={"time": schema.TIME_DTYPE,
                                    **(SCORES_SCHEMA if table == "scores" else FINDINGS_SCHEMA)})
    if table == "incidents":
        from knowledge_base.incidents import INCIDENT_SCHEMA

        return pl.LazyFrame(schema={"time": schema.TIME_DTYPE, **INCIDENT_SCHEMA})
    if table == "remediations":
        return pl.LazyFrame(schema={"time": schema.TIME_DTYPE, **_remediations_schema()})
    return None


@functools.cache
def _remediations_schema() -> dict[str, pl.DataType]:
    # The queue defines the table; an empty queue in a scratch directory gives its schema.
    from remediation.queue import Queue

    with tempfile.TemporaryDirectory() as d, Queue(Path(d) / "queue.db") as q:
        return dict(q.to_frame().schema)


def referenced_names(sql: str) -> set[str]:
    """Identifiers in the code parts of ``sql`` (and in double-quoted identifiers)."""
    names: set[str] = set()
    for code, text in _segments(sql):
        if code:
            names.update(m.group(0).lower() for m in _IDENT.finditer(text))
        elif text.startswith('"'):
            names.add(text[1:-1].replace('""', '"'))
    return names


# Polars SQL table functions (read_csv('/any/file'), read_parquet('https://...'), ...) read
# outside the lake; every name of that form is refused, whatever Polars adds later.
_TABLE_FUNCTION = re.compile(r"(?:read|scan)_[a-z0-9_]*", re.IGNORECASE)
_TABLE_FUNCTION_CALL = re.compile(r"\b(?:read|scan)_[A-Za-z0-9_]*\s*\(", re.IGNORECASE)
_CTE = re.compile(r"(?:\bWITH\s+(?:RECURSIVE\s+)?|,\s*)(?P<name>[A-Za-z_][A-Za-z0-9_]*|\"(?:[^\"]|\"\")+\")\s*"
                  r"(?:\([^()]*\)\s*)?AS\s*(?:NOT\s+)?(?:MATERIALIZED\s+)?\(", re.IGNORECASE)


def _cte_names(sql: str) -> set[str]:
    """Names the query defines in WITH clauses (lower case; literals and comments masked)."""
    masked = "".join(text if code or text.startswith('"') else " " * len(text) for code, text in _segments(sql))
    out = set()
    for m in _CTE.finditer(masked):
        name = m.group("name")
        out.add((name[1:-1].replace('""', '"') if name.startswith('"') else name).lower())
    return out


def table_references(sql: str, what: str = "SQL") -> list[str]:
    """The relations ``sql`` reads (FROM/JOIN, subqueries, CTE references), as Polars'
    own SQL parser finds them."""
    from polars._plr import PySQLContext  # the parser SQLContext.execute_global uses

    try:
        return list(PySQLContext.table_identifiers(sql, include_schema=True, unique=True))
    except pl.exceptions.PolarsError as exc:
        raise QueryError(f"{what}: {_first_line(exc)}") from None


def check_tables(sql: str, allowed: Collection[str], shown: Sequence[str], lake: str | os.PathLike[str],
                 what: str = "SQL") -> None:
    """Refuse, before anything is read, SQL that reads anything but ``allowed`` (the lake's
    tables and views) and the query's own CTEs: table functions (``read_csv('/etc/shadow')``,
    a URL), paths. ``shown``: the table names an error lists."""
    tables = ", ".join(shown) or "none"
    for code, text in _segments(sql):  # a second net under the parser: any table-function call
        m = _TABLE_FUNCTION_CALL.search(text) if code else None
        if m:
            name = m.group(0).rstrip("( \t\n")
            raise QueryError(f"{what}: {name}(...) is not allowed: queries read lake tables only "
                             f"(tables in {lake}: {tables})")
    known = {t.lower() for t in allowed}
    ctes = _cte_names(sql)
    for ref in table_references(sql, what):
        low = ref.lower()
        if _TABLE_FUNCTION.fullmatch(low):
            raise QueryError(f"{what}: {ref}(...) is not allowed: queries read lake tables only "
                             f"(tables in {lake}: {tables})")
        if low not in known and low not in ctes:
            raise QueryError(f"{what}: unknown table {ref!r}; tables in {lake}: {tables}")


def lake_context(lake: str | os.PathLike[str], sql: str, *, start: datetime | None = None,
                 end: datetime | None = None, hosts: Sequence[str] | None = None,
                 corrupt: list[lake_mod.CorruptFileError] | None = None,
                 exclude: Collection[Path] = ()) -> tuple[pl.SQLContext, list[str]]:
    """A SQLContext with the lake tables (and views) ``sql`` names, pruned to the range,
    without the files in ``exclude``. Returns it with the names of all tables available in
    the lake. Corrupt files skipped go to ``corrupt`` (else one log warning each)."""
    try:
        available = lake_mod.tables(lake)
    except lake_mod.LakeError as exc:
        raise QueryError(str(exc)) from None
    found: list[lake_mod.CorruptFileError] = []
    wanted = referenced_names(sql)
    frames: dict[str, pl.LazyFrame] = {}
    views = [v for v in VIEWS if v in wanted]
    bases = {VIEWS[v] for v in views}
    for t in available:
        if t in wanted or t.lower() in wanted or t in bases:
            frames[t] = _scan(lake, t, start, end, hosts, found, exclude)
    if "incidents" in frames:  # append-only open/closed rows: queries see each incident's latest
        frames["incidents"] = _latest_incidents(frames["incidents"])
    for view in views:
        base = VIEWS[view]
        frames[view] = _VIEW_OF[view](frames[base] if base in frames else _empty_base(base))
    for t in wanted - set(frames):
        empty = _empty_known(t)
        if empty is not None:
            frames[t] = empty
    _report(found, corrupt)
    return pl.SQLContext(frames=frames), available


def _report(errors: Sequence[lake_mod.CorruptFileError], into: list[lake_mod.CorruptFileError] | None) -> None:
    """One entry per file into ``into``; without it, one log warning per file."""
    unique = list({e.path: e for e in reversed(errors)}.values())[::-1]  # first entry per file
    if into is not None:
        into.extend(unique)
    else:
        for e in unique:
            log.warning("query: skipped %s", e)


_UNKNOWN_TABLE = re.compile(r"relation '([^']+)' was not found")

#: the statements ``unveil query`` runs: reads only (EXPLAIN of one of them, SHOW TABLES)
READ_ONLY = ("SELECT", "WITH", "VALUES", "FROM")
_WORD = re.compile(r"[A-Za-z_]+")
_EXPLAIN_OPTIONS = frozenset({"ANALYZE", "VERBOSE", "PLAN", "QUERY"})
_SHOW_TABLES = re.compile(r"SHOW\s+TABLES\s*;?\s*", re.IGNORECASE)


def statement_kind(sql: str) -> str:
    """The first keyword of ``sql`` in upper case, past comments, whitespace and opening
    parentheses ('' when there is none; the first characters when it does not start with
    a word, e.g. a string literal)."""
    for code, text in _segments(sql):
        if not code:
            if text.startswith(("--", "/*")):
                continue
            return text[:20]
        rest = text.lstrip()
        while rest.startswith("("):
            rest = rest[1:].lstrip()
        if not rest:
            continue
        m = _WORD.match(rest)
        return m.group(0).upper() if m else rest.split()[0][:20]
    return ""


def _code_only(sql: str) -> str:
    """``sql`` with comments, string literals and quoted identifiers each replaced by a space."""
    return "".join(text if code else " " for code, text in _segments(sql))


def check_read_only(sql: str, what: str = "SQL") -> None:
    """Refuse, before anything is read, a statement that is not a read query: SELECT,
    WITH ... SELECT, VALUES, FROM ... SELECT, EXPLAIN of one of them, SHOW TABLES."""
    code = _code_only(sql)
    kind = statement_kind(sql)
    if kind == "EXPLAIN":  # EXPLAIN [ANALYZE] [VERBOSE] <statement>: the statement must be a read
        words = iter(_WORD.finditer(code))
        next(words)
        for m in words:
            if m.group(0).upper() not in _EXPLAIN_OPTIONS:
                check_read_only(code[m.start():], what)
                return
        raise QueryError(f"{what}: EXPLAIN needs a query to explain")
    if kind == "SHOW":
        if _SHOW_TABLES.fullmatch(code.strip()):
            return
        raise QueryError(f"{what}: unveil query runs read-only queries (SELECT/WITH); of SHOW it runs only "
                         f"'SHOW TABLES' (the lake's tables and views)")
    if kind in READ_ONLY:
        return
    if not kind:
        raise QueryError(f"{what}: no SQL statement (only comments or whitespace)")
    raise QueryError(f"{what}: unveil query runs read-only queries (SELECT/WITH); {kind!r} is not one "
                     f"(nothing was read or changed)")


def run_query(lake: str | os.PathLike[str], text: str, *, start: datetime | None = None,
              end: datetime | None = None, hosts: Sequence[str] | None = None,
              params: Mapping[str, Any] | None = None, sql_dir: str | os.PathLike[str] | None = None,
              corrupt: list[lake_mod.CorruptFileError] | None = None) -> pl.DataFrame:
    """Run SQL, or the named query ``text``, over the lake and return the result.

    ``params`` are the values of the query's parameters (text as from the command line,
    or Python values). Raises :class:`QueryError` with what went wrong and where.

    A corrupt file (truncated, or damaged inside behind a valid footer) is skipped, the
    rest queried, and the file named once in ``corrupt`` (without it: one log warning)."""
    named = load_named(text.strip(), sql_dir) if is_named(text) else None
    raw = named.sql if named is not None else text
    what = f"query {named.name!r} ({named.path})" if named is not None else "SQL"
    check_read_only(raw, what)  # before anything else: DROP, INSERT, COPY ... never reach Polars
    sql = bind(raw, _literals(named, raw, params or {}, start, end))
    try:
        available = lake_mod.tables(lake)
    except lake_mod.LakeError as exc:
        raise QueryError(str(exc)) from None
    # lake tables only: checked on the parsed statement before any table is scanned
    shown = [*available, *(v for v, b in VIEWS.items() if b in available)]
    if statement_kind(sql) == "SHOW":  # SHOW TABLES (no other SHOW passed the check): tables
        # are registered per query, so Polars would list none; the lake's own are the answer
        return pl.DataFrame({"name": sorted(shown)}, schema={"name": pl.String})
    check_tables(sql, {*available, *VIEWS, *_KNOWN_EMPTY, *schema.MEASUREMENTS}, shown, lake, what)
    damaged: list[lake_mod.CorruptFileError] = []
    while True:
        found: list[lake_mod.CorruptFileError] = []
        df = _execute(lake, sql, what, start, end, hosts, found, damaged)
        if df is not None:
            _report(found + damaged, corrupt)
            return df


def _execute(lake: str | os.PathLike[str], sql: str, what: str, start: datetime | None, end: datetime | None,
             hosts: Sequence[str] | None, found: list[lake_mod.CorruptFileError],
             damaged: list[lake_mod.CorruptFileError]) -> pl.DataFrame | None:
    """One try without the ``damaged`` files; None when it found more damaged files (added
    to ``damaged``): the caller tries again without them."""
    ctx, available = lake_context(lake, sql, start=start, end=end, hosts=hosts, corrupt=found,
                                  exclude={e.path for e in damaged})
    try:
        return ctx.execute(sql, eager=False).collect()
    except pl.exceptions.ComputeError as exc:
        known = {e.path for e in found + damaged}
        bad = _damaged(lake, _scanned(sql, available), start, end, hosts, known)
        if not bad:
            raise QueryError(f"{what}: {_first_line(exc)}") from None
        damaged += bad
        return None
    except pl.exceptions.SQLInterfaceError as exc:
        m = _UNKNOWN_TABLE.search(str(exc))
        if m:
            views = [v for v, b in VIEWS.items() if b in available]
            raise QueryError(f"{what}: unknown table {m.group(1)!r}; tables in {lake}: "
                             f"{', '.join(available + views) or 'none'}") from None
        raise QueryError(f"{what}: {_first_line(exc)}") from None
    except pl.exceptions.ColumnNotFoundError as exc:
        raise QueryError(f"{what}: {_first_line(exc)}") from None
    except (pl.exceptions.SQLSyntaxError, pl.exceptions.InvalidOperationError, pl.exceptions.SchemaError,
            pl.exceptions.DuplicateError) as exc:
        raise QueryError(f"{what}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split("\n\nResolved plan")[0].split("\n\nThis error occurred")[0].strip()


# ---------------------------------------------------------------------------- output


def _flat(df: pl.DataFrame, *, nested_as_json: bool) -> pl.DataFrame:
    """Times as UTC ISO-8601 text with microseconds and ``Z``; durations as seconds;
    nested values (lists, structs) as JSON text when ``nested_as_json``."""
    out: list[pl.Expr | pl.Series] = []
    for name, dt in df.schema.items():
        col = pl.col(name)
        if isinstance(dt, pl.Datetime):
            expr = (col.dt.convert_time_zone("UTC") if dt.time_zone else col.dt.replace_time_zone("UTC"))
            out.append(expr.dt.strftime(_TIME_FMT))
        elif isinstance(dt, pl.Duration):
            out.append(col.dt.total_microseconds() / 1e6)
        elif isinstance(dt, pl.Date):
            out.append(col.dt.strftime("%Y-%m-%d"))
        elif nested_as_json and dt.is_nested():
            out.append(pl.Series(name, [None if v is None else json.dumps(v, default=str)
                                        for v in _flat(df.select(name), nested_as_json=False)[name].to_list()],
                                 dtype=pl.String))
        else:
            out.append(col)
    return df.select(out)


def to_csv(df: pl.DataFrame) -> str:
    """CSV with a header row; times ISO-8601 UTC (``...Z``), nested values as JSON text,
    null as an empty field."""
    return _flat(df, nested_as_json=True).write_csv()


def to_json(df: pl.DataFrame) -> str:
    """A JSON array of row objects (column -> value); times ISO-8601 UTC (``...Z``),
    NaN and null as ``null``, lists and structs as JSON arrays and objects."""
    return _flat(df, nested_as_json=False).write_json()


def to_table(df: pl.DataFrame, max_rows: int = 1000) -> str:
    with pl.Config(tbl_rows=max_rows, tbl_cols=-1, fmt_str_lengths=80, tbl_width_chars=250,
                   tbl_hide_dataframe_shape=False, fmt_table_cell_list_len=6):
        return str(df)


def write_output(df: pl.DataFrame, fmt: str, out: str | os.PathLike[str] | None = None,
                 stream: IO[str] | None = None) -> None:
    """Write ``df`` as ``fmt`` to the file ``out`` (atomically: temp + rename) or to
    ``stream`` (default stdout). Parquet needs ``out``."""
    if fmt not in FORMATS:
        raise QueryError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if fmt == "parquet" and out is None:
        raise QueryError("--format parquet needs --out FILE")
    if out is None:
        s = stream or sys.stdout
        text = to_table(df) if fmt == "table" else to_csv(df) if fmt == "csv" else to_json(df)
        s.write(text if text.endswith("\n") else text + "\n")
        return
    path = Path(out)
    if fmt == "parquet":
        write_atomic(path, lambda tmp: df.write_parquet(tmp), mode=0o666)  # a user's file: the umask decides
    else:
        text = to_table(df) if fmt == "table" else to_csv(df) if fmt == "csv" else to_json(df)
        write_atomic(path, text if text.endswith("\n") else text + "\n", mode=0o666)
