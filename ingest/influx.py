"""InfluxDB sink (line protocol, with an on-disk spool) and InfluxQL source.

The sink turns telemetry frames into line protocol with Polars string expressions (no
Python loop per value), buffers them, and sends batches from one background thread so
``write()`` never waits on the network. Two write paths:

* ``v1``: ``POST /write?db=..&rp=..&precision=..`` (InfluxDB < 1.8, e.g. Debian's 1.6);
  the database is created when missing.
* ``v2``: ``/api/v2/write`` through influxdb-client's synchronous WriteApi (InfluxDB 2.x,
  3.x, 1.8+ compatibility API with bucket ``database/retention``, VictoriaMetrics).

``api="auto"`` reads ``X-Influxdb-Version`` from ``/ping`` when the first batch is sent.

An outage loses nothing: a batch that fails transiently (connection refused, timeout, 5xx,
429, 401/403) is written atomically to the spool directory (gzip line protocol, one file
per batch) and replayed oldest-first before any newer batch; a spool file is deleted only
after a 2xx. A batch is either sent or spooled, never both; a timeout whose request the
server did complete is replayed once more, which is harmless because InfluxDB overwrites a
point with the same (measurement, tag set, time). Bad data (other 4xx) goes to
``spool/rejected/`` with the server's message. See docs/influxdb.md.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from ingest import schema
from ingest.atomic import TMP_PREFIX, write_atomic
from ingest.sink import SinkError

if TYPE_CHECKING:  # urllib3 maps OpenSSL: imported only where a client talks to a server
    import urllib3

log = logging.getLogger(__name__)

Precision = Literal["ms", "us", "ns"]
Api = Literal["auto", "v2", "v1"]

_PRECISIONS: tuple[str, ...] = ("ms", "us", "ns")
_V1_PRECISION = {"ms": "ms", "us": "u", "ns": "n"}


class InfluxError(SinkError):
    """InfluxDB cannot be used (bad config, query error); the message names the URL, never
    credentials."""


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class InfluxConfig:
    """Where and how to write. Credentials default to the environment variables
    ``UNVEIL_INFLUX_TOKEN`` / ``UNVEIL_INFLUX_USERNAME`` / ``UNVEIL_INFLUX_PASSWORD`` and never
    appear in ``repr`` or logs."""

    url: str | None = None  # None: not configured (no InfluxDB); a sink or source needs one
    database: str = "unveil"
    retention: str = ""  # v1 retention policy; 1.8 compat bucket "database/retention"
    org: str = ""
    bucket: str = ""  # v2 bucket; default: database[/retention]
    token: str | None = field(default=None, repr=False)
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    api: Api = "auto"
    spool_dir: Path | None = None  # None: a private temp dir (survives outages, not crashes)
    spool_max_bytes: int = 1 << 30
    batch_size: int = 5000
    flush_interval_s: float = 5.0
    timeout_s: float = 10.0
    precision: Precision = "ms"
    verify_ssl: bool = True

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url or "")
        if self.url is not None and (parsed.scheme not in ("http", "https") or not parsed.hostname):
            raise ValueError(f"influx.url: expected http(s)://host[:port], got {self.url!r}")
        if parsed.username or parsed.password:
            raise ValueError("influx.url: put credentials in token/username/password, not the URL")
        if not self.database:
            raise ValueError("influx.database: must not be empty")
        if self.api not in ("auto", "v1", "v2"):
            raise ValueError(f"influx.api: expected auto, v1 or v2, got {self.api!r}")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"influx.precision: expected ms, us or ns, got {self.precision!r}")
        for key in ("batch_size", "spool_max_bytes"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"influx.{key}: must be > 0, got {getattr(self, key)!r}")
        for key in ("flush_interval_s", "timeout_s"):
            if not float(getattr(self, key)) > 0:
                raise ValueError(f"influx.{key}: must be > 0, got {getattr(self, key)!r}")
        for attr, env in (
            ("token", "UNVEIL_INFLUX_TOKEN"),
            ("username", "UNVEIL_INFLUX_USERNAME"),
            ("password", "UNVEIL_INFLUX_PASSWORD"),
        ):
            if getattr(self, attr) is None and os.environ.get(env):
                object.__setattr__(self, attr, os.environ[env])
        if self.spool_dir is not None:
            object.__setattr__(self, "spool_dir", Path(self.spool_dir))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> InfluxConfig:
        """From a TOML ``[influx]`` table; unknown keys are an error naming them."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"influx: unknown keys {unknown}; known: {', '.join(known)}")
        if "url" not in data:
            raise ValueError("influx.url: required")
        return cls(**data)

    @property
    def base_url(self) -> str:
        if not self.url:
            raise ValueError("influx.url: required (no InfluxDB is configured)")
        return self.url.rstrip("/")

    @property
    def v2_bucket(self) -> str:
        if self.bucket:
            return self.bucket
        return f"{self.database}/{self.retention}" if self.retention else self.database


# ---------------------------------------------------------------------- line protocol


def _escape_name(s: str, specials: str) -> str:
    """Escape a constant key (measurement, tag key, field key) in Python: one per column."""
    s = re.sub(r"\\(?=[ ,=]|$)", "\u29f5", s)
    for ch, rep in (("\n", r"\n"), ("\r", r"\r"), ("\t", r"\t"), ("\f", r"\f")):
        s = s.replace(ch, rep)
    for ch in specials:
        s = s.replace(ch, "\\" + ch)
    return s


def _escape_tag_expr(e: pl.Expr) -> pl.Expr:
    # InfluxDB keeps backslashes in tags literally, except before ',', '=' or ' ' (an escape)
    # and at the end (a parse error): such a backslash becomes U+29F5 (see docs/influxdb.md).
    e = e.str.replace_all(r"\\([ ,=])|\\$", "\u29f5$1")
    for ch, rep in (("\n", r"\n"), ("\r", r"\r"), ("\t", r"\t"), ("\f", r"\f")):
        e = e.str.replace_all(ch, rep, literal=True)
    for ch in (",", "=", " "):
        e = e.str.replace_all(ch, "\\" + ch, literal=True)
    return e


def _field_expr(name: str, s: pl.Series) -> pl.Expr | None:
    """``key=value`` for one field column, null where the value is null (the field is then
    omitted from that line); None for a column with no values at all. ``s`` is the column,
    looked at once so the common case skips work (no NaN check when all are finite)."""
    dtype = s.dtype
    col = pl.col(name)
    key = pl.lit(_escape_name(name, ", =") + "=")
    if dtype == pl.Null or s.null_count() == s.len():
        return None
    # concat_str is null when any input is null: exactly "omit this field on this line".
    if dtype.is_integer():
        return pl.concat_str([key, col.cast(pl.String), pl.lit("i")])
    if dtype.is_float() or dtype.is_decimal():
        if dtype.is_decimal():
            col = col.cast(pl.Float64)
            s = s.cast(pl.Float64)
        text = pl.concat_str([key, col.cast(pl.String)])
        if s.is_finite().all():  # ignores nulls
            return text
        # NaN and infinities do not exist in line protocol: omitted like nulls.
        return pl.when(col.is_finite()).then(text)
    if dtype == pl.Boolean:
        return pl.concat_str([key, col.cast(pl.String)])
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum):
        v = col.cast(pl.String)
        v = v.str.replace_all("\\", "\\\\", literal=True).str.replace_all('"', '\\"', literal=True)
        return pl.concat_str([key, pl.lit('"'), v, pl.lit('"')])
    if isinstance(dtype, pl.Datetime):
        # Datetime fields (e.g. labels.end) travel as integer epoch microseconds.
        return pl.concat_str([key, col.dt.epoch("us").cast(pl.String), pl.lit("i")])
    raise ValueError(f"column {name!r}: dtype {dtype} cannot be written as an InfluxDB field")


_TAG_SPECIAL = r"[ ,=\\\n\r\t\f]"


def _tag_expr(key: str, s: pl.Series) -> pl.Expr:
    """``,key=value`` for one tag column; null where the value is null or empty (InfluxDB
    has no empty tag values: the tag is omitted). Tags repeat a lot, so distinct values are
    escaped once and mapped back."""
    prefix = pl.lit("," + _escape_name(key, ", =") + "=")
    v = pl.col(key).cast(pl.String)
    distinct = s.cast(pl.String).drop_nulls().unique()
    if not distinct.str.contains(_TAG_SPECIAL).any():
        return pl.when(v != "").then(pl.concat_str([prefix, v]))
    if distinct.len() * 4 > s.len():  # mostly distinct: escape every row
        return pl.when(v != "").then(pl.concat_str([prefix, _escape_tag_expr(v)]))
    escaped = distinct.to_frame("v").select(_escape_tag_expr(pl.col("v"))).to_series()
    return pl.when(v != "").then(
        pl.concat_str([prefix, v.replace_strict(distinct, escaped, return_dtype=pl.String)])
    )


def default_tags(table: str, df: pl.DataFrame) -> tuple[str, ...]:
    """``host`` + the measurement's tags for schema tables; ``host`` alone otherwise."""
    if table in schema.MEASUREMENTS:
        wanted: tuple[str, ...] = (schema.HOST, *schema.MEASUREMENTS[table].tags)
    else:
        wanted = (schema.HOST,)
    return tuple(t for t in wanted if t in df.columns)


def line_protocol_series(
    table: str,
    df: pl.DataFrame,
    *,
    tags: Sequence[str] | None = None,
    precision: Precision = "ms",
) -> pl.Series:
    """One line-protocol line per row of ``df`` (rows without any non-null field are
    dropped), as a String Series. ``tags=None`` uses :func:`default_tags`."""
    if precision not in _PRECISIONS:
        raise ValueError(f"precision: expected ms, us or ns, got {precision!r}")
    if schema.TIME not in df.columns:
        raise ValueError(f"table {table!r}: no {schema.TIME!r} column")
    tdtype = df.schema[schema.TIME]
    if not isinstance(tdtype, pl.Datetime):
        raise ValueError(f"table {table!r}: column 'time' must be a Datetime, got {tdtype}")
    nulls = df.get_column(schema.TIME).null_count()
    if nulls:
        raise ValueError(f"table {table!r}: {nulls} row(s) with a null time")
    tag_cols = tuple(default_tags(table, df) if tags is None else tags)
    missing = [t for t in tag_cols if t not in df.columns]
    if missing:
        raise ValueError(f"table {table!r}: tag columns {missing} not in the frame")

    tag_exprs = []
    # InfluxDB wants tags sorted by key (fastest to index); empty/null tag values are omitted.
    for t in sorted(tag_cols, key=lambda k: _escape_name(k, ", =").encode()):
        tag_exprs.append(_tag_expr(t, df.get_column(t)))
    field_exprs = []
    for c in df.columns:
        if c == schema.TIME or c in tag_cols:
            continue
        e = _field_expr(c, df.get_column(c))
        if e is not None:
            field_exprs.append(e)
    if not field_exprs:
        return pl.Series("line", [], dtype=pl.String)

    fields = pl.concat_str(field_exprs, separator=",", ignore_nulls=True)
    tagset = pl.concat_str(tag_exprs, ignore_nulls=True) if tag_exprs else pl.lit("")
    ts = pl.col(schema.TIME).dt.epoch(precision).cast(pl.String)
    measurement = pl.lit(_escape_name(table, ", "))
    out = df.lazy().select(
        pl.concat_str([measurement, tagset, pl.lit(" "), fields, pl.lit(" "), ts]).alias("line"),
        (fields != "").alias("_has_fields"),
    )
    return out.filter(pl.col("_has_fields")).select("line").collect().to_series()


def to_line_protocol(
    table: str,
    df: pl.DataFrame,
    *,
    tags: Sequence[str] | None = None,
    precision: Precision = "ms",
) -> list[str]:
    """Line protocol for ``df`` as a list of lines (see :func:`line_protocol_series`)."""
    return line_protocol_series(table, df, tags=tags, precision=precision).to_list()


def _join(lines: pl.Series) -> bytes:
    if lines.len() == 0:
        return b""
    return str(lines.str.join("\n").item()).encode() + b"\n"


# ----------------------------------------------------------------------------- spool

_SPOOL_RE = re.compile(r"^(\d{16})-(ms|us|ns)-(\d+)\.lp\.gz$")


@dataclass(frozen=True)
class _SpoolItem:
    path: Path
    seq: int
    precision: Precision
    points: int
    size: int


class _Spool:
    """One gzip line-protocol file per failed batch, named ``<seq>-<precision>-<points>``
    so replay keeps the order and the precision survives a restart with another config."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.rejected_dir = directory / "rejected"
        self.max_bytes = max_bytes
        try:
            self.rejected_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InfluxError(f"influx spool: cannot create {directory}: {exc}") from exc
        for pattern in (f"{TMP_PREFIX}*", "*.tmp"):  # half-written by a crash (*.tmp: older versions)
            for tmp in directory.glob(pattern):
                tmp.unlink(missing_ok=True)
        self.items: list[_SpoolItem] = []
        for p in sorted(directory.iterdir()):
            m = _SPOOL_RE.match(p.name)
            if m:
                self.items.append(
                    _SpoolItem(p, int(m[1]), m[2], int(m[3]), p.stat().st_size)  # type: ignore[arg-type]
                )
            elif p.is_file():
                log.warning("influx spool %s: ignoring unknown file %s", directory, p.name)
        self._seq = max((i.seq for i in self.items), default=0)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def size(self) -> int:
        return sum(i.size for i in self.items)

    @property
    def points(self) -> int:
        return sum(i.points for i in self.items)

    def _write_atomic(self, path: Path, data: bytes) -> None:
        write_atomic(path, data, mode=0o600)  # the spool is private to the writer

    def append(self, payload: bytes, points: int, precision: Precision) -> int:
        """Store a batch; returns the number of points evicted to respect the size cap."""
        self._seq += 1
        path = self.dir / f"{self._seq:016d}-{precision}-{points}.lp.gz"
        data = gzip.compress(payload, compresslevel=5)
        self._write_atomic(path, data)
        self.items.append(_SpoolItem(path, self._seq, precision, points, len(data)))
        evicted = 0
        while self.size > self.max_bytes and len(self.items) > 1:
            old = self.items.pop(0)
            old.path.unlink(missing_ok=True)
            evicted += old.points
            log.error(
                "influx spool %s over its cap of %d bytes: DROPPED the oldest batch %s (%d points)",
                self.dir,
                self.max_bytes,
                old.path.name,
                old.points,
            )
        return evicted

    def oldest(self) -> _SpoolItem | None:
        return self.items[0] if self.items else None

    def read(self, item: _SpoolItem) -> bytes:
        return gzip.decompress(item.path.read_bytes())

    def remove(self, item: _SpoolItem) -> None:
        item.path.unlink(missing_ok=True)
        self.items.remove(item)

    def reject(self, payload: bytes, points: int, precision: Precision, message: str) -> Path:
        self._seq += 1
        path = self.rejected_dir / f"{self._seq:016d}-{precision}-{points}.lp.gz"
        self._write_atomic(path, gzip.compress(payload, compresslevel=5))
        self._write_atomic(path.with_suffix(".err"), message.encode(errors="replace"))
        return path


# ------------------------------------------------------------------------- transport

Outcome = Literal["ok", "transient", "rejected", "too_large"]


class _Transport:
    """HTTP to one InfluxDB; classifies every answer as ok / transient / rejected."""

    def __init__(self, config: InfluxConfig) -> None:
        import urllib3

        self.config = config
        self.url = config.base_url
        self.api: Literal["v1", "v2"] | None = None if config.api == "auto" else config.api
        self.version = ""
        self._db_ready = False
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=2,
            retries=False,
            timeout=urllib3.Timeout(total=config.timeout_s),
            cert_reqs="CERT_REQUIRED" if config.verify_ssl else "CERT_NONE",
        )
        self._client: Any = None
        self._write_api: Any = None

    def headers(self) -> dict[str, str]:
        c = self.config
        if c.token:
            return {"Authorization": f"Token {c.token}"}
        if c.username:
            raw = f"{c.username}:{c.password or ''}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        return {}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self.pool.clear()

    def request(self, method: str, path: str, **kw: Any) -> urllib3.BaseHTTPResponse:
        headers = {**self.headers(), **kw.pop("headers", {})}
        return self.pool.request(method, self.url + path, headers=headers, **kw)

    def detect(self) -> Literal["v1", "v2"]:
        """Pick the write API from /ping; raises OSError/urllib3 errors when unreachable."""
        if self.api is None:
            r = self.request("GET", "/ping")
            self.version = r.headers.get("X-Influxdb-Version", "")
            m = re.match(r"v?(\d+)\.(\d+)", self.version)
            if m and (int(m[1]), int(m[2])) < (1, 8):
                self.api = "v1"
            else:
                self.api = "v2"  # 1.8+, 2.x, 3.x and servers without the header (VictoriaMetrics)
            log.info(
                "InfluxDB at %s: version %s, using the %s write API",
                self.url,
                self.version or "unknown",
                self.api,
            )
        return self.api

    def ensure_database(self) -> None:
        if self._db_ready:
            return
        q = f"CREATE DATABASE {quote_ident(self.config.database)}"
        r = self.request("POST", "/query", fields={"q": q}, encode_multipart=False)
        if r.status >= 300:
            # No admin rights is fine when the database exists; the write will tell.
            log.warning(
                "InfluxDB at %s: %s answered HTTP %d: %s",
                self.url,
                q,
                r.status,
                _short(r.data),
            )
        self._db_ready = True

    def send(self, payload: bytes, precision: Precision) -> tuple[Outcome, str]:
        """Send one batch. Network errors, timeouts, 5xx, 429 and auth errors are transient."""
        import urllib3

        try:
            api = self.detect()
            if api == "v1":
                return self._send_v1(payload, precision)
            return self._send_v2(payload, precision)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return "transient", f"{type(exc).__name__}: {_redact(str(exc))}"

    def _classify(self, status: int, body: bytes | str | None) -> tuple[Outcome, str]:
        if 200 <= status < 300:
            return "ok", ""
        msg = f"HTTP {status}: {_short(body)}"
        if status == 413:
            return "too_large", msg
        if status >= 500 or status in (401, 403, 408, 429):
            return "transient", msg
        return "rejected", msg

    def _send_v1(self, payload: bytes, precision: Precision) -> tuple[Outcome, str]:
        self.ensure_database()
        params = {"db": self.config.database, "precision": _V1_PRECISION[precision]}
        if self.config.retention:
            params["rp"] = self.config.retention
        path = "/write?" + urllib.parse.urlencode(params)
        body = gzip.compress(payload, compresslevel=1)
        hdrs = {"Content-Encoding": "gzip", "Content-Type": "text/plain; charset=utf-8"}
        r = self.request("POST", path, body=body, headers=hdrs)
        if r.status == 404 and b"database not found" in r.data:
            self._db_ready = False  # dropped behind our back: create it again and retry once
            self.ensure_database()
            r = self.request("POST", path, body=body, headers=hdrs)
        return self._classify(r.status, r.data)

    def _send_v2(self, payload: bytes, precision: Precision) -> tuple[Outcome, str]:
        from influxdb_client import InfluxDBClient, WritePrecision
        from influxdb_client.client.write_api import SYNCHRONOUS
        from influxdb_client.rest import ApiException

        c = self.config
        if self._write_api is None:
            token = c.token or (f"{c.username}:{c.password or ''}" if c.username else None)
            self._client = InfluxDBClient(
                url=self.url,
                token=token or "",
                org=c.org or "-",
                timeout=int(c.timeout_s * 1000),
                enable_gzip=True,
                verify_ssl=c.verify_ssl,
                retries=False,  # the spool is the retry mechanism
            )
            self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        wp = {"ms": WritePrecision.MS, "us": WritePrecision.US, "ns": WritePrecision.NS}[precision]
        try:
            self._write_api.write(
                bucket=c.v2_bucket, org=c.org or "-", record=payload, write_precision=wp
            )
        except ApiException as exc:
            return self._classify(int(exc.status or 0), exc.body)
        return "ok", ""


def _short(body: bytes | str | None, limit: int = 500) -> str:
    if body is None:
        return ""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _redact(text: str) -> str:
    # urllib3 messages carry the URL; our URLs never carry credentials (rejected in config),
    # but query strings could in a user-built URL: strip u=/p= just in case.
    return re.sub(r"([?&](?:u|p|token)=)[^&\s]*", r"\1***", text)


# ------------------------------------------------------------------------------ sink


@dataclass
class InfluxStats:
    points_sent: int = 0  # delivered with a 2xx, directly or from the spool
    batches_sent: int = 0
    bytes_sent: int = 0  # line-protocol bytes before gzip
    points_spooled: int = 0
    batches_spooled: int = 0
    replays: int = 0  # spooled batches delivered later
    points_replayed: int = 0
    points_rejected: int = 0
    points_evicted: int = 0  # dropped by the spool size cap
    points_lost: int = 0  # could not be spooled (disk full)
    rows_without_fields: int = 0
    outages: int = 0


class InfluxSink:
    """The :class:`ingest.sink.Sink` for InfluxDB. ``write`` converts and enqueues; one
    background thread sends every ``batch_size`` points or ``flush_interval_s`` seconds;
    ``flush`` blocks until everything written before it was sent or spooled."""

    name = "influx"

    def __init__(self, config: InfluxConfig) -> None:
        self.config = config
        self.stats = InfluxStats()
        spool_dir = config.spool_dir
        self._tmp_spool = spool_dir is None
        if spool_dir is None:
            spool_dir = Path(tempfile.mkdtemp(prefix="unveil-influx-spool-"))
        self._spool = _Spool(spool_dir, config.spool_max_bytes)
        if len(self._spool):
            log.info(
                "influx spool %s holds %d batches (%d points) from an earlier run; replaying",
                spool_dir,
                len(self._spool),
                self._spool.points,
            )
        self._transport = _Transport(config)
        self._down = False
        self._cond = threading.Condition()
        self._pending: list[pl.Series] = []
        self._pending_points = 0
        self._flush_gen = 0
        self._done_gen = 0
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="unveil-influx-sink", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"InfluxSink({self.config!r})"

    @property
    def spool_dir(self) -> Path:
        return self._spool.dir

    @property
    def spooled_batches(self) -> int:
        return len(self._spool)

    # -- Sink API --------------------------------------------------------------

    def write(self, table: str, df: pl.DataFrame, *, tags: Sequence[str] | None = None) -> None:
        """Convert ``df`` to line protocol now (bad frames raise ValueError here, naming the
        table and column) and enqueue it; never touches the network."""
        if self._closing:
            raise InfluxError(f"influx sink for {self.config.base_url} is closed")
        lines = line_protocol_series(table, df, tags=tags, precision=self.config.precision)
        with self._cond:
            self.stats.rows_without_fields += df.height - lines.len()
            if lines.len():
                self._pending.append(lines)
                self._pending_points += lines.len()
                if self._pending_points >= self.config.batch_size:
                    self._cond.notify_all()

    def flush(self) -> None:
        """Send (or spool) everything written so far, replaying the spool first."""
        with self._cond:
            if not self._thread.is_alive():
                return
            self._flush_gen += 1
            gen = self._flush_gen
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._done_gen >= gen or not self._thread.is_alive())

    def close(self) -> None:
        if self._closed:
            return
        with self._cond:
            self._closing = True
            self._flush_gen += 1
            self._cond.notify_all()
        self._thread.join()
        self._transport.close()
        self._closed = True
        if not self._tmp_spool:
            return
        if self.spooled_batches:
            log.error(
                "influx sink closed with %d points still spooled in the temporary directory %s "
                "(set spool_dir to keep them across restarts)",
                self._spool.points,
                self._spool.dir,
            )
        elif any(self._spool.rejected_dir.iterdir()):
            log.warning(
                "influx sink closed; the batches InfluxDB rejected are kept in %s",
                self._spool.rejected_dir,
            )
        else:
            # A private spool that holds nothing: one temp dir per run would pile up in /tmp.
            shutil.rmtree(self._spool.dir, ignore_errors=True)

    def __enter__(self) -> InfluxSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- background thread -----------------------------------------------------

    def _run(self) -> None:
        size = self.config.batch_size
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._closing
                        or self._flush_gen > self._done_gen
                        or self._pending_points >= size
                    ),
                    timeout=self.config.flush_interval_s,
                )
                gen = self._flush_gen
                closing = self._closing
                chunks, self._pending, self._pending_points = self._pending, [], 0
                if not closing and gen == self._done_gen and chunks:
                    # Woken by size alone: send full batches, keep the tail for the next one.
                    lines = pl.concat(chunks, rechunk=False)
                    full = lines.len() - lines.len() % size
                    if 0 < full < lines.len():
                        chunks = [lines.slice(0, full)]
                        self._pending = [lines.slice(full)]
                        self._pending_points = lines.len() - full
            try:
                self._cycle(chunks)
            except Exception:  # the thread must survive anything
                log.exception(
                    "influx sink for %s: unexpected error; up to %d points of this cycle lost",
                    self.config.base_url,
                    sum(c.len() for c in chunks),
                )
            with self._cond:
                self._done_gen = max(self._done_gen, gen)
                self._cond.notify_all()
            if closing:
                return

    def _batches(self, chunks: list[pl.Series]) -> Iterator[tuple[bytes, int]]:
        if not chunks:
            return
        lines = pl.concat(chunks, rechunk=False)
        size = self.config.batch_size
        for off in range(0, lines.len(), size):
            part = lines.slice(off, size)
            yield _join(part), part.len()

    def _cycle(self, chunks: list[pl.Series]) -> None:
        up = self._replay()
        precision = self.config.precision
        for payload, n in self._batches(chunks):
            if up:
                up = self._deliver(payload, n, precision)  # spools the batch itself on failure
            else:
                self._to_spool(payload, n, precision)

    def _replay(self) -> bool:
        """Replay the spool oldest first; True when it is empty (the server answers)."""
        while (item := self._spool.oldest()) is not None:
            try:
                payload = self._spool.read(item)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                log.error("influx spool: unreadable file %s (%s); moved aside", item.path, exc)
                item.path.rename(self._spool.rejected_dir / item.path.name)
                self._spool.items.remove(item)
                continue
            outcome, msg = self._send_split(payload, item.points, item.precision)
            if outcome == "transient":
                self._note_down(msg)
                return False
            self._spool.remove(item)
            if outcome == "ok":
                self.stats.replays += 1
                self.stats.points_replayed += item.points
        return True

    def _deliver(self, payload: bytes, n: int, precision: Precision) -> bool:
        """Send a new batch; on a transient failure spool it. True when the server answered."""
        outcome, msg = self._send_split(payload, n, precision)
        if outcome == "transient":
            self._note_down(msg)
            self._to_spool(payload, n, precision)
            return False
        return True

    def _send_split(self, payload: bytes, n: int, precision: Precision) -> tuple[Outcome, str]:
        """Send; a 413 splits the batch in halves. Rejected data goes to spool/rejected."""
        outcome, msg = self._transport.send(payload, precision)
        if outcome == "ok":
            self._note_up()
            self.stats.points_sent += n
            self.stats.batches_sent += 1
            self.stats.bytes_sent += len(payload)
            return outcome, msg
        if outcome == "too_large" and n > 1:
            lines = payload.splitlines(keepends=True)
            half = len(lines) // 2
            first, fmsg = self._send_split(b"".join(lines[:half]), half, precision)
            if first == "transient":
                return first, fmsg  # the caller spools the whole batch: the first half
                # may have landed; replaying it is harmless (same points).
            return self._send_split(b"".join(lines[half:]), n - half, precision)
        if outcome in ("rejected", "too_large"):
            self._note_up()
            path = self._spool.reject(payload, n, precision, msg)
            self.stats.points_rejected += n
            log.error(
                "InfluxDB at %s rejected a batch of %d points (%s); kept in %s",
                self._transport.url,
                n,
                msg,
                path,
            )
            return "rejected", msg
        return outcome, msg

    def _to_spool(self, payload: bytes, n: int, precision: Precision) -> None:
        try:
            evicted = self._spool.append(payload, n, precision)
        except OSError as exc:  # disk full, spool dir gone: nothing else can keep it
            self.stats.points_lost += n
            log.error(
                "influx spool %s: cannot store a batch of %d points (%s): LOST",
                self._spool.dir,
                n,
                exc,
            )
            return
        self.stats.points_spooled += n
        self.stats.batches_spooled += 1
        self.stats.points_evicted += evicted

    def _note_down(self, msg: str) -> None:
        if not self._down:  # log once per outage, not once per batch
            self._down = True
            self.stats.outages += 1
            log.warning(
                "InfluxDB at %s unavailable (%s); spooling batches to %s until it answers",
                self._transport.url,
                msg,
                self._spool.dir,
            )
        else:
            log.debug("InfluxDB at %s still unavailable: %s", self._transport.url, msg)

    def _note_up(self) -> None:
        if self._down:
            self._down = False
            log.warning(
                "InfluxDB at %s answers again; replaying %d spooled batches",
                self._transport.url,
                self.spooled_batches,
            )


# ----------------------------------------------------------------------------- source


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_str(value: str) -> str:
    """An InfluxQL string literal in single quotes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _time_literal(t: dt.datetime | str) -> str:
    if isinstance(t, str):
        t = dt.datetime.fromisoformat(t)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return quote_str(t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


class InfluxSource:
    """Read back over ``/query`` (InfluxQL): InfluxDB 1.x, the 2.x compatibility API (with a
    DBRP mapping) and 3.x."""

    def __init__(self, config: InfluxConfig) -> None:
        self.config = config
        self._transport = _Transport(config)

    def __repr__(self) -> str:
        return f"InfluxSource({self.config!r})"

    def close(self) -> None:
        self._transport.close()

    def query(self, influxql: str) -> pl.DataFrame:
        """Run one InfluxQL statement; ``time`` comes back as Datetime(ns, UTC), tags and fields
        as columns (tags of ``GROUP BY`` series too)."""
        c = self.config
        params = {
            "db": c.database,
            "q": influxql,
            "epoch": "ns",
            "chunked": "true",
            "chunk_size": "20000",
        }
        if c.retention:
            params["rp"] = c.retention
        url = c.base_url + "/query"
        import urllib3

        try:
            r = self._transport.request("POST", "/query", fields=params, encode_multipart=False)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise InfluxError(
                f"InfluxDB at {url}: {type(exc).__name__}: {_redact(str(exc))}"
            ) from exc
        if r.status >= 300:
            raise InfluxError(f"InfluxDB at {url}: HTTP {r.status}: {_short(r.data)}")
        frames: list[pl.DataFrame] = []
        names: set[str] = set()
        for raw in r.data.splitlines():
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                raise InfluxError(f"InfluxDB at {url}: unparsable answer: {_short(raw)}") from exc
            if "error" in doc:
                raise InfluxError(f"InfluxDB at {url}: {doc['error']}")
            for res in doc.get("results", []):
                if "error" in res:
                    raise InfluxError(f"InfluxDB at {url}: query {influxql!r}: {res['error']}")
                for s in res.get("series", []):
                    names.add(s.get("name", ""))
                    f = pl.DataFrame(
                        s.get("values", []),
                        schema=s["columns"],
                        orient="row",
                        infer_schema_length=None,
                        strict=False,
                    )
                    tags = s.get("tags") or {}
                    if tags:
                        f = f.with_columns(pl.lit(v, pl.String).alias(k) for k, v in tags.items())
                    if len(names) > 1 or s.get("name"):
                        f = f.with_columns(
                            pl.lit(s.get("name", ""), pl.String).alias("_measurement")
                        )
                    frames.append(f)
        if not frames:
            return pl.DataFrame()
        out = pl.concat(frames, how="diagonal_relaxed")
        if len(names) <= 1:
            out = out.drop("_measurement", strict=False)
        if "time" in out.columns:
            out = out.with_columns(
                pl.from_epoch(pl.col("time").cast(pl.Int64), "ns").dt.replace_time_zone("UTC")
            )
        return out

    def read(
        self,
        table: str,
        *,
        start: dt.datetime | str,
        end: dt.datetime | str,
        hosts: Sequence[str] | None = None,
    ) -> pl.DataFrame:
        """Rows of ``table`` with ``start <= time < end`` (naive times are UTC), optionally
        only some hosts, with the lake's columns and dtypes for schema measurements, sorted
        by time, host and tags."""
        target = quote_ident(table)
        if self.config.retention:
            target = (
                f"{quote_ident(self.config.database)}.{quote_ident(self.config.retention)}.{target}"
            )
        q = f"SELECT * FROM {target} WHERE time >= {_time_literal(start)} AND time < {_time_literal(end)}"
        if hosts is not None:
            if not hosts:
                q += " AND false"
            else:
                q += (
                    " AND ("
                    + " OR ".join(f"{quote_ident(schema.HOST)} = {quote_str(h)}" for h in hosts)
                    + ")"
                )
        df = self.query(q)
        m = schema.MEASUREMENTS.get(table)
        if m is None:
            if df.is_empty() and not df.columns:
                return pl.DataFrame(schema={schema.TIME: schema.TIME_DTYPE})
            return df.with_columns(pl.col(schema.TIME).cast(schema.TIME_DTYPE)).sort(schema.TIME)
        cols = m.polars_schema()
        exprs = []
        for c, dtype in cols.items():
            if c not in df.columns:
                exprs.append(pl.lit(None, dtype=dtype).alias(c))
            elif isinstance(dtype, pl.Datetime) and c != schema.TIME:
                exprs.append(
                    pl.col(c)
                    .cast(pl.Int64)
                    .cast(pl.Datetime("us"))
                    .dt.replace_time_zone("UTC")
                    .cast(dtype)
                )
            else:
                exprs.append(pl.col(c).cast(dtype))
        extra = [c for c in df.columns if c not in cols]
        if extra:
            log.warning("InfluxDB %s: columns %s are not in the schema; not returned", table, extra)
        out = df.select(exprs) if df.columns else pl.DataFrame(schema=cols)
        return out.sort([schema.TIME, schema.HOST, *m.tags], nulls_last=True)
