"""InfluxDB sink and source: line protocol, spool, and round trips through real servers
(influxd 1.x for the v1 write path and InfluxQL; victoria-metrics for /api/v2/write)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import os
import shutil
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ingest import schema
from ingest.influx import (
    InfluxConfig,
    InfluxError,
    InfluxSink,
    InfluxSource,
    to_line_protocol,
)
from tests.servers import InfluxdServer, VictoriaServer, free_port

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
SECRET = "s3cr3t-T0KEN-do-not-log"
NASTY = ["a b", "c,d", "e=f", 'q"uote', "ünïcødé ✓", "mid\\dle", " lead", "trail ", "x,=y z"]


def _db() -> str:
    return "t_" + uuid.uuid4().hex[:10]


def gpu_frame(n: int, *, start: dt.datetime = T0, host: str = "node-1") -> pl.DataFrame:
    """A gpu frame with every dtype of the measurement, nulls included, ms-aligned times."""
    m = schema.get("gpu")
    data: dict[str, object] = {
        "time": [start + dt.timedelta(milliseconds=100 * i) for i in range(n)],
        "host": [host] * n,
        "gpu": [str(i % 4) for i in range(n)],
        "uuid": [f"GPU-{i % 4}" for i in range(n)],
    }
    for k, f in enumerate(m.fields):
        if f.dtype == pl.Int64():
            data[f.name] = [
                None if (i + k) % 7 == 0 else (i * 1_000_003 + k) * (-1) ** k for i in range(n)
            ]
        else:
            data[f.name] = [None if (i + k) % 5 == 0 else i / 7 + k * 0.1 for i in range(n)]
    return schema.conform("gpu", pl.DataFrame(data))


def sink_config(url: str, tmp_path: Path, **kw: object) -> InfluxConfig:
    args: dict[str, object] = {
        "url": url,
        "database": _db(),
        "spool_dir": tmp_path / "spool",
        "flush_interval_s": 60.0,
        "timeout_s": 5.0,
    }
    args.update(kw)
    return InfluxConfig(**args)  # type: ignore[arg-type]


def _count(source: InfluxSource, measurement: str) -> int:
    """Points stored (one point per distinct time and tag set, whatever fields it has)."""
    df = source.query(f'SELECT * FROM "{measurement}"')
    return df.height


# ------------------------------------------------------------------ line protocol (unit)


def test_line_protocol_types_nulls_escaping_and_tag_order() -> None:
    df = pl.DataFrame(
        {
            "time": [T0, T0 + dt.timedelta(microseconds=1500), T0 + dt.timedelta(seconds=1)],
            "zone": ["z 1", None, ""],
            "host": ["h,1", "h=2", "h\\"],
            "i": pl.Series([1, None, None], dtype=pl.Int32),
            "f": [0.25, float("nan"), None],
            "f32": pl.Series([0.1, None, None], dtype=pl.Float32),
            "b": [True, False, None],
            "s": ['say "hi" \\ there', "line\nbreak", None],
            "when": [T0, None, None],
        }
    ).with_columns(pl.col("time").dt.cast_time_unit("us"))
    lines = to_line_protocol("my table,x", df, tags=["zone", "host"], precision="us")
    t = int(T0.timestamp()) * 1_000_000
    assert lines == [
        f'my\\ table\\,x,host=h\\,1,zone=z\\ 1 i=1i,f=0.25,f32=0.1,b=true,s="say \\"hi\\" \\\\ there",when={t}i {t}',
        f'my\\ table\\,x,host=h\\=2 b=false,s="line\nbreak" {t + 1500}',
    ]  # third row: no non-null field, so no line; NaN omitted; trailing backslash replaced
    df3 = df.with_columns(pl.lit(1).alias("i")).select("time", "host", "i")
    assert to_line_protocol("m", df3, tags=["host"], precision="ms")[2] == (
        f"m,host=h\u29f5 i=1i {int(T0.timestamp()) * 1000 + 1000}"
    )
    ns = to_line_protocol("m", df3.head(2), tags=[], precision="ns")
    assert [x.rsplit(" ", 1)[1] for x in ns] == [str(t * 1000), str((t + 1500) * 1000)]
    assert to_line_protocol("m", df3.head(2), tags=[], precision="ms")[1].endswith(
        f" {t // 1000 + 1}"
    )


def test_line_protocol_repeated_tags_escape_like_single_rows() -> None:
    # Low-cardinality tags are escaped once per distinct value: same lines as row by row.
    n = len(NASTY) * 10
    df = pl.DataFrame(
        {
            "time": [T0 + dt.timedelta(milliseconds=i) for i in range(n)],
            "host": NASTY * 10,
            "dev": [None if i % 3 == 0 else NASTY[i % 4] + "\\" for i in range(n)],
            "v": list(range(n)),
        }
    )
    lines = to_line_protocol("m", df, tags=["host", "dev"])
    assert lines == [to_line_protocol("m", df[i], tags=["host", "dev"])[0] for i in range(n)]
    assert lines[1] == f"m,dev=c\\,d\u29f5,host=c\\,d v=1i {int(T0.timestamp()) * 1000 + 1}"


def test_line_protocol_schema_tags_and_bad_input() -> None:
    df = gpu_frame(3)
    line = to_line_protocol("gpu", df)[1]
    assert line.startswith("gpu,gpu=1,host=node-1,uuid=GPU-1 ")
    assert "mem_used=" in line and "i," in line
    with pytest.raises(ValueError, match="'gpu'.*time"):
        to_line_protocol("gpu", df.drop("time"))
    with pytest.raises(ValueError, match="null time"):
        to_line_protocol("gpu", df.with_columns(pl.lit(None, schema.TIME_DTYPE).alias("time")))
    with pytest.raises(ValueError, match="column 'l'"):
        to_line_protocol("x", df.with_columns(pl.lit([1, 2]).alias("l")))
    with pytest.raises(ValueError, match="tag columns"):
        to_line_protocol("x", df, tags=["nope"])


def test_config_validation_env_and_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="influx.url"):
        InfluxConfig(url="localhost:8086")
    with pytest.raises(ValueError, match="influx.url.*credentials"):
        InfluxConfig(url="http://u:p@localhost:8086")
    with pytest.raises(ValueError, match="influx.batch_size"):
        InfluxConfig(url="http://localhost:8086", batch_size=0)
    with pytest.raises(ValueError, match="influx.precision"):
        InfluxConfig(url="http://localhost:8086", precision="s")  # type: ignore[arg-type]
    monkeypatch.setenv("UNVEIL_INFLUX_TOKEN", SECRET)
    monkeypatch.setenv("UNVEIL_INFLUX_PASSWORD", SECRET + "pw")
    c = InfluxConfig(url="http://localhost:8086", username="bob")
    assert c.token == SECRET and c.password == SECRET + "pw"
    assert SECRET not in repr(c) and "bob" not in repr(c)
    assert InfluxConfig(url="http://x:1", database="db", retention="rp").v2_bucket == "db/rp"
    c = InfluxConfig.from_mapping({"url": "http://x:1", "spool_dir": "/tmp/s", "batch_size": 10})
    assert c.spool_dir == Path("/tmp/s") and c.batch_size == 10
    with pytest.raises(ValueError, match=r"unknown keys \['bach_size'\]"):
        InfluxConfig.from_mapping({"url": "http://x:1", "bach_size": 10})
    with pytest.raises(ValueError, match="influx.url: required"):
        InfluxConfig.from_mapping({})


# --------------------------------------------------------------- spool without a server


def test_server_down_at_start_spools_logs_once_and_cap_evicts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = sink_config(url, tmp_path, batch_size=50, token=SECRET, spool_max_bytes=6_000)
    sink = InfluxSink(cfg)  # must not raise
    for k in range(4):
        sink.write("gpu", gpu_frame(100, start=T0 + dt.timedelta(minutes=k)))
        sink.flush()
    sink.close()
    s = sink.stats
    assert s.points_sent == 0 and s.points_spooled == 400 and s.batches_spooled == 8
    assert s.outages == 1
    warned = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "unavailable" in r.getMessage()
    ]
    assert len(warned) == 1  # once per outage, not once per batch
    # the cap kept the newest batches and said so loudly
    files = sorted((tmp_path / "spool").glob("*.lp.gz"))
    assert s.points_evicted > 0 and s.points_evicted + 50 * len(files) == 400
    assert any(r.levelno == logging.ERROR and "DROPPED" in r.getMessage() for r in caplog.records)
    assert sum(f.stat().st_size for f in files) <= 6_000
    newest = gzip.decompress(files[-1].read_bytes()).decode().splitlines()
    assert (
        len(newest) == 50
        and newest
        == to_line_protocol("gpu", gpu_frame(100, start=T0 + dt.timedelta(minutes=3)))[50:]
    )
    assert not list((tmp_path / "spool").glob("*.tmp"))
    assert SECRET not in caplog.text and SECRET not in repr(sink)
    with pytest.raises(InfluxError, match="closed"):
        sink.write("gpu", gpu_frame(1))


def test_private_spool_is_removed_when_empty_and_kept_when_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    idle = InfluxSink(sink_config(url, tmp_path, spool_dir=None))
    idle_dir = idle.spool_dir
    assert idle_dir.is_dir()
    idle.close()
    assert not idle_dir.exists()  # one run, one temp dir: none may be left in /tmp

    down = InfluxSink(sink_config(url, tmp_path, spool_dir=None))
    down.write("gpu", gpu_frame(10))
    down.close()
    try:
        assert down.stats.points_spooled == 10
        assert len(list(down.spool_dir.glob("*.lp.gz"))) == 1  # unsent data is never deleted
        assert any(
            r.levelno == logging.ERROR and str(down.spool_dir) in r.getMessage()
            for r in caplog.records
        )
    finally:
        shutil.rmtree(down.spool_dir)

    refused = InfluxSink(sink_config(url, tmp_path, spool_dir=None))
    kept = refused.spool_dir / "rejected" / "0000000000000001-ns-1.lp.gz"
    kept.write_bytes(gzip.compress(b"conflict x=1i 0"))  # what a 400 leaves there
    refused.close()
    try:
        assert kept.exists()
    finally:
        shutil.rmtree(refused.spool_dir)


# ------------------------------------------------------------------------ influxd (v1)


@pytest.mark.server
def test_influxd_round_trip_equal_rows(influxd_server: InfluxdServer, tmp_path: Path) -> None:
    cfg = sink_config(influxd_server.url, tmp_path, batch_size=1000)
    df = pl.concat([gpu_frame(1500, host="node-1"), gpu_frame(700, host="node-2")])
    facts = schema.conform(
        "host_facts",
        pl.DataFrame(
            {
                "time": [T0] * 3,
                "host": ["node-1"] * 3,
                "category": ["numa", "gpu", "thp"],
                "device": ["", "0000:3b:00.0", ""],
                "key": ["nodes", "numa_node", "enabled"],
                "value": ["2", "1", 'always [madvise] "never"'],
                "value_num": [2.0, 1.0, None],
            }
        ),
    )
    with InfluxSink(cfg) as sink:
        sink.write("gpu", df)
        sink.write("host_facts", facts)
        sink.flush()
        assert sink.stats.points_sent == 2203 and sink.stats.batches_sent == 3
        assert sink.stats.points_spooled == 0 and sink._transport.api == "v1"
    src = InfluxSource(cfg)
    got = src.read("gpu", start=T0, end=T0 + dt.timedelta(hours=1))
    want = df.sort(["time", "host", "gpu", "uuid"])
    assert_frame_equal(got, want)
    one = src.read("gpu", start=T0, end=T0 + dt.timedelta(hours=1), hosts=["node-2"])
    assert_frame_equal(one, want.filter(pl.col("host") == "node-2"))
    # host_facts: string fields and an empty tag value (omitted on write, null on read)
    got_facts = src.read("host_facts", start=T0, end=T0 + dt.timedelta(seconds=1))
    assert got_facts["value"].to_list() == ["1", "2", 'always [madvise] "never"']
    assert got_facts["device"].to_list() == ["0000:3b:00.0", None, None]
    assert src.read("gpu", start=T0 - dt.timedelta(hours=1), end=T0).is_empty()
    with pytest.raises(InfluxError, match=influxd_server.url):
        src.query("SELEKT nonsense")


@pytest.mark.server
def test_influxd_nanosecond_times_and_downstream_table(
    influxd_server: InfluxdServer, tmp_path: Path
) -> None:
    cfg = sink_config(influxd_server.url, tmp_path, precision="ns")
    base = int(T0.timestamp()) * 10**9
    findings = pl.DataFrame(
        {
            "time": pl.Series([base + 1, base + 999_999_999, base + 2_000_000_007]).cast(
                pl.Datetime("ns", "UTC")
            ),
            "host": ["h1", "h1", "h2"],
            "detector": ["iforest", "zscore", "iforest"],
            "score": [0.5, 1e-300, 3.25e12],
            "top_factor": ["irq_locality", 'thp "coverage"', None],
            "window": pl.Series([3, -4, 2**62], dtype=pl.Int64),
            "flag": [True, False, True],
        }
    )
    with InfluxSink(cfg) as sink:
        sink.write("findings", findings, tags=["host", "detector"])
        sink.flush()
    got = InfluxSource(cfg).query('SELECT * FROM "findings" ORDER BY time')
    got = got.select(findings.columns)
    assert got["time"].to_list() == findings["time"].to_list()
    assert_frame_equal(got, findings, check_dtypes=False)


@pytest.mark.server
def test_influxd_escaping_round_trip(influxd_server: InfluxdServer, tmp_path: Path) -> None:
    cfg = sink_config(influxd_server.url, tmp_path)
    n = len(NASTY)
    df = pl.DataFrame(
        {
            "time": [T0 + dt.timedelta(milliseconds=i) for i in range(n)],
            "host": NASTY,
            "tag, =key": list(reversed(NASTY)),
            'field "key", =x': [f'{v} "\\ \n' for v in NASTY],
            "v": list(range(n)),
        }
    )
    table = 'meas urement,"x"=1'
    with InfluxSink(cfg) as sink:
        sink.write(table, df, tags=["host", "tag, =key"])
        sink.flush()
        assert sink.stats.points_sent == n and sink.stats.points_rejected == 0
    got = InfluxSource(cfg).read(table, start=T0, end=T0 + dt.timedelta(seconds=1))
    assert_frame_equal(got.select(df.columns), df, check_dtypes=False)


@pytest.mark.server
def test_influxd_outage_every_point_exactly_once(
    influxd_server: InfluxdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ingest.influx")
    cfg = sink_config(influxd_server.url, tmp_path, batch_size=200, timeout_s=2.0)
    frames = [gpu_frame(300, start=T0 + dt.timedelta(minutes=k)) for k in range(6)]
    sink = InfluxSink(cfg)
    sink.write("gpu", frames[0])
    sink.flush()
    influxd_server.stop()
    for f in frames[1:4]:  # outage: written and flushed while the server is gone
        sink.write("gpu", f)
        sink.flush()
    assert sink.spooled_batches == 6 and sink.stats.points_spooled == 900
    influxd_server.start()
    sink.write("gpu", frames[4])
    sink.flush()  # replays the spool first, in order, then sends the new batch
    assert sink.spooled_batches == 0
    sink.write("gpu", frames[5])
    sink.close()
    s = sink.stats
    assert (s.points_sent, s.points_spooled, s.points_replayed, s.replays) == (1800, 900, 900, 6)
    assert s.outages == 1
    assert (
        len(
            [
                r
                for r in caplog.records
                if r.levelno >= logging.WARNING and "unavailable" in r.getMessage()
            ]
        )
        == 1
    )
    assert not list((tmp_path / "spool").glob("*.lp.gz"))
    src = InfluxSource(cfg)
    assert _count(src, "gpu") == 1800
    got = src.read("gpu", start=T0, end=T0 + dt.timedelta(hours=1))
    assert_frame_equal(got, pl.concat(frames).sort(["time", "host", "gpu", "uuid"]))


@pytest.mark.server
def test_influxd_spool_survives_sink_restart(influxd_server: InfluxdServer, tmp_path: Path) -> None:
    cfg = sink_config(influxd_server.url, tmp_path)
    influxd_server.stop()
    first = InfluxSink(cfg)  # the server is down at start: no exception
    first.write("gpu", gpu_frame(120))
    first.close()
    assert first.stats.points_spooled == 120
    influxd_server.start()
    with InfluxSink(cfg) as second:  # a new process would do the same: replay on flush
        second.flush()
        assert second.stats.points_replayed == 120
    assert _count(InfluxSource(cfg), "gpu") == 120


@pytest.mark.server
def test_influxd_bad_data_goes_to_rejected(
    influxd_server: InfluxdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = sink_config(influxd_server.url, tmp_path)
    ints = pl.DataFrame({"time": [T0], "host": ["h"], "x": [1]})
    with InfluxSink(cfg) as sink:
        sink.write("conflict", ints)
        sink.flush()
        # same field as a string: InfluxDB answers 400 (field type conflict)
        sink.write(
            "conflict",
            ints.with_columns(
                pl.lit("text").alias("x"), pl.lit(T0 + dt.timedelta(seconds=1)).alias("time")
            ),
        )
        sink.flush()
        sink.write(
            "conflict", ints.with_columns(pl.lit(T0 + dt.timedelta(seconds=2)).alias("time"))
        )
        sink.flush()
        s = sink.stats
    assert (s.points_sent, s.points_rejected, s.points_spooled) == (2, 1, 0)
    rejected = sorted((tmp_path / "spool" / "rejected").glob("*.lp.gz"))
    assert len(rejected) == 1
    assert b'x="text"' in gzip.decompress(rejected[0].read_bytes())
    assert "conflict" in rejected[0].with_suffix(".err").read_text()
    assert any("rejected" in r.getMessage() and "400" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ victoria-metrics (v2)


def _export(server: VictoriaServer, match: str) -> list[dict[str, Any]]:
    server.force_flush()
    q = urllib.parse.urlencode({"match[]": match, "start": "0"})
    with urllib.request.urlopen(f"{server.url}/api/v1/export?{q}", timeout=10) as r:
        return [json.loads(line) for line in r.read().splitlines() if line.strip()]


@pytest.mark.server
def test_victoria_v2_write_values(
    victoria_server: VictoriaServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host = "vm-" + uuid.uuid4().hex[:8]
    df = gpu_frame(250, host=host)
    cfg = sink_config(victoria_server.url, tmp_path, token=SECRET, batch_size=100)
    with InfluxSink(cfg) as sink:
        sink.write("gpu", df)
        nasty = pl.DataFrame(
            {
                "time": [T0] * len(NASTY),
                "host": [host] * len(NASTY),
                "label": NASTY,
                "v": list(range(len(NASTY))),
            }
        )
        sink.write("nasty", nasty, tags=["host", "label"])
        sink.flush()
        assert sink._transport.api == "v2"
        assert sink.stats.points_sent == 250 + len(NASTY) and sink.stats.batches_sent == 3
    assert SECRET not in caplog.text and SECRET not in repr(cfg)

    series = _export(victoria_server, f'{{__name__=~"gpu_.+",host="{host}"}}')
    got = {}
    for s in series:
        metric = s["metric"]
        field = str(metric["__name__"])[len("gpu_") :]
        for ts, v in zip(s["timestamps"], s["values"], strict=True):
            got[(ts, metric["gpu"], metric["uuid"], field)] = v
    want = {}
    for row in df.iter_rows(named=True):
        ts = int(row["time"].timestamp() * 1000)
        for f in schema.get("gpu").fields:
            if row[f.name] is not None:
                want[(ts, row["gpu"], row["uuid"], f.name)] = row[f.name]
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k  # float32 values, written shortest-repr

    nasty_series = _export(victoria_server, f'{{__name__="nasty_v",host="{host}"}}')
    labels = sorted((s["metric"]["label"], s["values"][0]) for s in nasty_series)
    assert labels == sorted((v, i) for i, v in enumerate(NASTY))


@pytest.mark.server
def test_victoria_outage_and_auto_detection_after_start(
    victoria_server: VictoriaServer, tmp_path: Path
) -> None:
    host = "vm-" + uuid.uuid4().hex[:8]
    cfg = sink_config(victoria_server.url, tmp_path, api="auto")
    victoria_server.stop()
    with InfluxSink(cfg) as sink:
        sink.write("gpu", gpu_frame(50, host=host))
        sink.flush()
        assert sink.stats.points_spooled == 50 and sink._transport.api is None
        victoria_server.start()
        sink.write("gpu", gpu_frame(50, host=host, start=T0 + dt.timedelta(minutes=1)))
        sink.flush()
        assert sink.stats.points_sent == 100 and sink.spooled_batches == 0
    series = _export(victoria_server, f'{{__name__="gpu_power_w",host="{host}"}}')
    stored = sum(len(s["timestamps"]) for s in series)
    assert stored == sum(1 for i in range(100) if (i % 50 + 4) % 5 != 0)  # power_w non-null


@pytest.mark.server
def test_influxd_413_splits_batches_and_rejects_a_single_huge_line(
    influxd_factory: Callable[..., InfluxdServer], tmp_path: Path
) -> None:
    server = influxd_factory(max_body_size=4000)  # bytes of (gzip) body
    cfg = sink_config(server.url, tmp_path, batch_size=5000)
    df = gpu_frame(400)
    huge = pl.DataFrame({"time": [T0], "host": ["h"], "blob": [os.urandom(8000).hex()]})
    with InfluxSink(cfg) as sink:
        sink.write("gpu", df)
        sink.flush()
        assert sink.stats.points_sent == 400 and sink.stats.batches_sent > 4
        sink.write("blob", huge)
        sink.flush()
        assert sink.stats.points_rejected == 1 and sink.stats.points_spooled == 0
    assert_frame_equal(
        InfluxSource(cfg).read("gpu", start=T0, end=T0 + dt.timedelta(hours=1)),
        df.sort(["time", "host", "gpu", "uuid"]),
    )
    err = next((tmp_path / "spool" / "rejected").glob("*.err")).read_text()
    assert "413" in err


@pytest.mark.server
def test_influxd_auth_basic_and_wrong_password_spools(
    influxd_factory: Callable[..., InfluxdServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = influxd_factory(auth_enabled=True)
    q = urllib.parse.urlencode(
        {"q": f"CREATE USER admin WITH PASSWORD '{SECRET}' WITH ALL PRIVILEGES"}
    )
    with urllib.request.urlopen(f"{server.url}/query", data=q.encode(), timeout=10) as r:
        assert r.status == 200
    good = sink_config(server.url, tmp_path, username="admin", password=SECRET)
    with InfluxSink(good) as sink:
        sink.write("gpu", gpu_frame(30))
        sink.flush()
        assert sink.stats.points_sent == 30
    assert _count(InfluxSource(good), "gpu") == 30

    bad = InfluxConfig(**{**good.__dict__, "password": SECRET + "x", "spool_dir": tmp_path / "s2"})
    with InfluxSink(bad) as sink:
        sink.write("gpu", gpu_frame(30))
        sink.flush()  # 401: the data is good, the config is not; keep it for later
        assert sink.stats.points_spooled == 30 and sink.stats.points_rejected == 0
    with pytest.raises(InfluxError, match="401") as exc:
        InfluxSource(bad).query('SELECT * FROM "gpu"')
    assert server.url in str(exc.value) and SECRET not in str(exc.value)
    assert any("401" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert SECRET not in caplog.text and SECRET not in repr(bad)


@pytest.mark.server
def test_influxd_timer_flush_and_datetime_fields(
    influxd_server: InfluxdServer, tmp_path: Path
) -> None:
    cfg = sink_config(influxd_server.url, tmp_path, flush_interval_s=0.2)
    labels = schema.conform(
        "labels",
        pl.DataFrame(
            {
                "time": [T0, T0 + dt.timedelta(seconds=30)],
                "host": ["node-1", "node-1"],
                "type": ["numa_misplacement", "gpu_power_cap"],
                "devices": ["gpu0,mlx5_0", None],
                "end": [T0 + dt.timedelta(seconds=20, microseconds=7), None],
                "severity": [0.75, 1.0],
                "label_id": ["L1", "L2"],
            }
        ),
    )
    sink = InfluxSink(cfg)
    try:
        sink.write("labels", labels)
        deadline = time.monotonic() + 10
        while sink.stats.points_sent < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sink.stats.points_sent == 2  # sent by the timer, no flush() called
    finally:
        sink.close()
    got = InfluxSource(cfg).read("labels", start=T0, end=T0 + dt.timedelta(minutes=1))
    assert_frame_equal(got, labels)


@pytest.mark.server
def test_influxd_hung_server_times_out_spools_and_resend_is_harmless(
    influxd_server: InfluxdServer, tmp_path: Path
) -> None:
    cfg = sink_config(influxd_server.url, tmp_path, timeout_s=0.5, batch_size=100)
    frames = [gpu_frame(100, start=T0 + dt.timedelta(minutes=k)) for k in range(3)]
    with InfluxSink(cfg) as sink:
        sink.write("gpu", frames[0])
        sink.flush()
        influxd_server.pause()
        try:
            sink.write("gpu", frames[1])
            sink.flush()  # times out: the server may still write it once it wakes up
            assert sink.stats.points_spooled == 100 and sink.stats.outages == 1
        finally:
            influxd_server.resume()
        sink.write("gpu", frames[2])
        sink.flush()
        assert sink.stats.points_sent == 300 and sink.spooled_batches == 0
    got = InfluxSource(cfg).read("gpu", start=T0, end=T0 + dt.timedelta(hours=1))
    assert_frame_equal(got, pl.concat(frames).sort(["time", "host", "gpu", "uuid"]))
