"""Ad hoc and named SQL over the lake (jobs.query, ``unveil query``)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from jobs import query as q
from jobs.cli import main
from tests import demo_lake

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> demo_lake.DemoLake:
    return demo_lake.get(tmp_path_factory)


@pytest.fixture(scope="module")
def lake(demo: demo_lake.DemoLake) -> Path:
    return demo.lake


# ---------------------------------------------------------------- parameters, no lake


def test_bind_renders_typed_literals_and_skips_strings_comments_and_casts() -> None:
    sql = ("SELECT ':host' AS s, x::double -- :host in a comment\n"
           "FROM t /* :limit */ WHERE h = :host AND n < :n AND t >= :since LIMIT :n")
    lits = {"host": q.render_literal("a'b", "str"), "n": q.render_literal("5", "int"),
            "since": q.render_literal("2026-01-05T08:00Z", "timestamp")}
    out = q.bind(sql, lits)
    assert "':host' AS s" in out and "-- :host in a comment" in out and "/* :limit */" in out
    assert "x::double" in out
    assert "h = 'a''b'" in out and "n < 5" in out and "LIMIT 5" in out
    assert "CAST('2026-01-05 08:00:00.000000+00:00' AS TIMESTAMPTZ)" in out
    assert q.parameters_in(sql) == ["host", "n", "since"]


@pytest.mark.parametrize(("value", "type_"), [("abc", "int"), ("1; DROP", "int"), ("nan", "float"),
                                               ("maybe", "bool"), ("yesterday-ish", "timestamp")])
def test_render_literal_rejects_values_that_are_not_of_the_type(value: str, type_: str) -> None:
    with pytest.raises(q.QueryError, match=f"bad {type_} value"):
        q.render_literal(value, type_)


def test_bind_names_the_missing_parameter() -> None:
    with pytest.raises(q.QueryError, match=":host"):
        q.bind("SELECT * FROM t WHERE host = :host", {})


def test_unterminated_string_is_an_error() -> None:
    with pytest.raises(q.QueryError, match="unterminated string"):
        q.parameters_in("SELECT 'abc FROM t")


def test_parse_named_reads_header_and_params(tmp_path: Path) -> None:
    text = ("-- my-q: the answer.\n--\n-- more words\n--\n-- @param host str   the host\n"
            "-- @param limit int = 5  how many\n-- @param tag str = 'it''s'  a tag\nSELECT 1\n")
    nq = q.parse_named(text, tmp_path / "my-q.sql")
    assert nq.name == "my-q" and nq.summary == "the answer." and nq.sql == "SELECT 1"
    assert [(p.name, p.type, p.default) for p in nq.params] == [
        ("host", "str", None), ("limit", "int", "5"), ("tag", "str", "'it''s'")]
    assert nq.params[0].doc == "the host"


@pytest.mark.parametrize("decl", ["-- @param x wibble", "-- @param 9x int", "-- @param n int = abc"])
def test_parse_named_rejects_bad_declarations(tmp_path: Path, decl: str) -> None:
    with pytest.raises(q.QueryError, match=r"bad\.sql:\d"):
        q.parse_named(f"-- bad: x\n{decl}\nSELECT 1\n", tmp_path / "bad.sql")


def test_every_shipped_query_has_a_header_and_valid_params() -> None:
    named = q.named_queries()
    assert {"top-incidents", "host-timeline", "throttle-time-per-gpu", "irq-locality-per-device", "window-diff",
            "hugepage-coverage", "remediation-effects"} <= set(named)
    for nq in named.values():
        assert nq.summary and nq.summary[0].islower() or nq.summary[0].isupper(), nq.name
        used = set(q.parameters_in(nq.sql)) - {"since", "until"}
        assert used == {p.name for p in nq.params}, f"{nq.name}: used {used}, declared {nq.params}"


# ---------------------------------------------------------------- every named query


REQUIRED = {
    "host-timeline": {"host": "sim-00"},
    "window-diff": {"host": "sim-00", "a_start": "2026-01-05T08:01:00Z", "a_end": "2026-01-05T08:04:30Z",
                    "b_start": "2026-01-05T08:06:00Z", "b_end": "2026-01-05T08:10:30Z"},
}


@pytest.mark.parametrize("name", sorted(q.named_queries()))
def test_every_sql_file_runs_on_the_demo_lake(lake: Path, name: str) -> None:
    df = q.run_query(lake, name, params=REQUIRED.get(name, {}))
    assert df.width > 0
    # Queries over telemetry, features, scores and labels have rows on any demo lake; those
    # over findings, incidents and remediations depend on what the analytics found.
    if name in HAS_ROWS:
        assert df.height > 0, name


HAS_ROWS = {"throttle-time-per-gpu", "irq-locality-per-device", "hugepage-coverage", "window-diff",
            "host-timeline", "anomaly-rate-per-host"}


def test_throttle_time_puts_the_throttled_host_first(lake: Path) -> None:
    df = q.run_query(lake, "throttle-time-per-gpu")
    assert df.height == 4 * 8
    top = df.head(8)
    assert top["host"].unique().to_list() == ["sim-00"]  # gpu_power_throttle on all its GPUs
    assert (top["power_capped_s"] > 30).all() and (top["min_power_limit_ratio"] < 0.95).all()
    healthy = df.filter(pl.col("host") != "sim-00")
    assert healthy.select(pl.col("power_capped_s").max()).item() < top.select(pl.col("power_capped_s").min()).item()
    assert (healthy["min_power_limit_ratio"] == 1.0).all()


def test_irq_locality_finds_the_far_irqs(lake: Path) -> None:
    df = q.run_query(lake, "irq-locality-per-device", params={"max_locality": "0.9"})
    assert df.height > 0
    assert set(df["host"]) == {"sim-01"}  # irq_locality_miss on sim-01's node-0 NICs
    assert set(df["device"]) <= {"ens1np0", "ens2np0", "ens3np0", "ens4np0"}
    assert (df["locality"] < 0.9).all()
    everything = q.run_query(lake, "irq-locality-per-device")
    assert everything.filter(pl.col("host") != "sim-01").select(pl.col("locality").min()).item() > 0.9


def test_hugepage_coverage_drops_during_the_injection(lake: Path) -> None:
    df = q.run_query(lake, "hugepage-coverage", hosts=["sim-02"])
    assert set(df["host"]) == {"sim-02"}
    during = df.filter((pl.col("bucket") >= T0 + timedelta(minutes=7)) & (pl.col("bucket") < T0 + timedelta(minutes=12)))
    before = df.filter((pl.col("bucket") >= T0 + timedelta(minutes=2)) & (pl.col("bucket") < T0 + timedelta(minutes=5)))
    assert during["coverage"].mean() < 0.7 * before["coverage"].mean()  # type: ignore[operator]


def test_window_diff_ranks_the_power_features_of_the_throttled_host(lake: Path) -> None:
    df = q.run_query(lake, "window-diff", params={**REQUIRED["window-diff"], "limit": "20"})
    assert df.height == 20
    assert df["rel_change"].abs().is_sorted(descending=True)
    assert any(f.startswith(("gpu.power", "gpu.throttle_power")) for f in df["feature"].head(10))
    row = df.row(0, named=True)
    assert row["windows_a"] > 100 and row["windows_b"] > 100


def test_host_timeline_merges_labels_and_incidents_in_order(lake: Path) -> None:
    df = q.run_query(lake, "host-timeline", params={"host": "sim-00"})
    assert df["time"].is_sorted()
    labels = df.filter(pl.col("kind") == "label")["name"].to_list()
    assert labels == ["gpu_power_throttle", "nic_drops"]


def test_top_incidents_filters_and_limits(lake: Path) -> None:
    all_ = q.run_query(lake, "top-incidents", params={"limit": "1000"})
    assert not all_.is_empty(), "the demo lake has no incidents (see test_demo: the analytics found nothing)"
    assert all_["peak_score"].is_sorted(descending=True, nulls_last=True)
    for _, tied in all_.group_by("peak_score"):  # equal peaks (infinite ones): the longest first
        assert tied["n_windows"].is_sorted(descending=True)
    # one row per incident, as of its latest update (a finished run: every incident closed)
    assert all_["incident_id"].is_unique().all() and set(all_["state"]) == {"closed"}
    assert (all_["updated"] >= all_["start"]).all()
    one = q.run_query(lake, "top-incidents", params={"limit": "1"})
    assert one.height == 1 and one["incident_id"][0] == all_["incident_id"][0]
    un = q.run_query(lake, "top-incidents", params={"status": "unmatched", "limit": "1000"})
    assert set(un["status"]) <= {"unmatched"} and un.height == all_.filter(pl.col("status") == "unmatched").height


# ------------------------------------------------------------------ pruning, safety


def test_since_until_hosts_prune_the_scans(lake: Path) -> None:
    start, end = T0 + timedelta(minutes=3), T0 + timedelta(minutes=4)
    df = q.run_query(lake, "SELECT host, min(time) AS lo, max(time) AS hi, count(*) AS n FROM gpu GROUP BY host",
                     start=start, end=end, hosts=["sim-01", "sim-02"])
    assert sorted(df["host"]) == ["sim-01", "sim-02"]
    assert (df["lo"] >= start).all() and (df["hi"] < end).all()
    assert (df["n"] == 8 * 600).all()  # 8 GPUs x 60 s x 10 Hz


def test_since_and_until_are_parameters_of_ad_hoc_sql(lake: Path) -> None:
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    df = q.run_query(lake, "SELECT :since AS s, :until AS u, count(*) AS n FROM system", start=start, end=end)
    assert df["s"][0] == start and df["u"][0] == end and df["n"][0] == 4 * 60 * 10


def test_ad_hoc_params_are_literals_not_sql(lake: Path) -> None:
    evil = "sim-00' OR '1'='1"
    df = q.run_query(lake, "SELECT count(*) AS n FROM system WHERE host = :h", params={"h": evil})
    assert df["n"][0] == 0
    ok = q.run_query(lake, "SELECT count(*) AS n FROM system WHERE host = :h", params={"h": "sim-00"})
    assert ok["n"][0] > 0


def test_named_query_parameter_errors(lake: Path) -> None:
    with pytest.raises(q.QueryError, match="needs --param host"):
        q.run_query(lake, "host-timeline")
    with pytest.raises(q.QueryError, match="no parameter.*bogus.*its parameters: host"):
        q.run_query(lake, "host-timeline", params={"host": "x", "bogus": "1"})
    with pytest.raises(q.QueryError, match="parameter 'limit'.*bad int value"):
        q.run_query(lake, "top-incidents", params={"limit": "ten"})
    with pytest.raises(q.QueryError, match="no named query 'nope'.*top-incidents"):
        q.run_query(lake, "nope")


def test_feature_values_view_is_the_features_table_in_long_form(lake: Path) -> None:
    start, end = T0 + timedelta(minutes=5), T0 + timedelta(minutes=5, seconds=10)
    wide = q.run_query(lake, "SELECT * FROM features", start=start, end=end, hosts=["sim-00"])
    long = q.run_query(lake, "SELECT * FROM feature_values", start=start, end=end, hosts=["sim-00"])
    feats = [c for c in wide.columns if c not in ("time", "host", "window_start", "window_end")]
    assert long.height == wide.height * len(feats)
    f = "gpu.power_limit_ratio@gpu0"
    got = long.filter(pl.col("feature") == f).sort("window_start")
    assert got["value"].to_list() == wide.sort("window_start")[f].cast(pl.Float64).to_list()
    assert set(got["family"]) == {"gpu.power_limit_ratio"} and set(got["device"]) == {"gpu0"}
    assert set(got["subsystem"]) == {"gpu"}


# ---------------------------------------------------------------------- bad SQL


@pytest.mark.parametrize(("sql", "pattern"), [
    ("SELECT * FROM nosuchtable", r"unknown table 'nosuchtable'; tables in .*gpu.*host_facts"),
    ("SELECT * FROM gpu WHERE", r"SQL: sql parser error"),
    ("SELEC * FROM gpu", r"SQL: unveil query runs read-only queries \(SELECT/WITH\); 'SELEC' is not one"),
    ("SELECT nosuchcolumn FROM system", r"SQL: unable to find column \"nosuchcolumn\""),
])
def test_bad_sql_gets_a_clear_error(lake: Path, sql: str, pattern: str) -> None:
    with pytest.raises(q.QueryError, match=pattern):
        q.run_query(lake, sql)


def test_cli_bad_sql_exits_2_with_the_table_list(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["query", "--lake", str(lake), "SELECT * FROM gpus"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unveil query: error:" in err and "unknown table 'gpus'" in err and "gpu, " in err
    assert "Traceback" not in err


def test_cli_missing_lake_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(tmp_path / "none"), "SELECT 1"]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------------- formats

SMALL = "SELECT host, time, count, device FROM interrupts WHERE irq = '120' AND count IS NOT NULL ORDER BY host, time, node LIMIT 3"


def test_csv_output_is_stable(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(lake), "--format", "csv", SMALL]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 3 and list(rows[0]) == ["host", "time", "count", "device"]
    assert rows[0]["time"].endswith("Z") and datetime.fromisoformat(rows[0]["time"]).tzinfo is not None
    assert int(rows[0]["count"]) >= 0


def test_json_output_is_an_array_of_records(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(lake), "--format", "json",
                 "SELECT host, window_start, detector, score, flagged FROM scores "
                 "ORDER BY host, window_start, detector LIMIT 2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list) and len(data) == 2
    assert list(data[0]) == ["host", "window_start", "detector", "score", "flagged"]
    assert data[0]["window_start"].endswith("Z") and isinstance(data[0]["flagged"], bool)
    assert isinstance(data[0]["score"], float)


def test_json_keeps_nested_values_and_nulls() -> None:
    df = pl.DataFrame({"l": [["a"], None], "s": [{"x": 1.5}, None], "f": [float("nan"), 2.0],
                       "t": [datetime(2026, 1, 5, 8, tzinfo=UTC), None]})
    assert json.loads(q.to_json(df)) == [
        {"l": ["a"], "s": {"x": 1.5}, "f": None, "t": "2026-01-05T08:00:00.000000Z"},
        {"l": None, "s": None, "f": 2.0, "t": None}]


def test_csv_writes_nested_values_as_json_text() -> None:
    df = pl.DataFrame({"l": [["a", "b"], None], "s": [{"x": 1}, {"x": None}],
                       "t": [datetime(2026, 1, 5, 8, tzinfo=UTC), None]})
    rows = list(csv.DictReader(io.StringIO(q.to_csv(df))))
    assert json.loads(rows[0]["l"]) == ["a", "b"] and rows[1]["l"] == ""
    assert json.loads(rows[0]["s"]) == {"x": 1}
    assert rows[0]["t"] == "2026-01-05T08:00:00.000000Z" and rows[1]["t"] == ""


def test_parquet_output_round_trips(lake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.parquet"
    assert main(["query", "--lake", str(lake), "--format", "parquet", "--out", str(out), SMALL]) == 0
    assert "3 rows written" in capsys.readouterr().err
    back = pl.read_parquet(out)
    assert back.equals(q.run_query(lake, SMALL))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_parquet_needs_out(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(lake), "--format", "parquet", SMALL]) == 2
    assert "needs --out" in capsys.readouterr().err


def test_table_output_and_list(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(lake), "throttle-time-per-gpu", "--hosts", "sim-02"]) == 0
    out = capsys.readouterr().out
    assert "power_capped_s" in out and "shape: (8," in out
    assert main(["query", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "window-diff:" in listing and "--param a_start=<timestamp>  (required)" in listing


def test_missing_downstream_table_gives_empty_result(tmp_path: Path) -> None:
    from ingest.lake import write_table

    df = pl.DataFrame({"time": [T0], "host": ["h1"], "category": ["thp"], "device": [""], "key": ["enabled"],
                       "value": ["never"], "value_num": [None]}, schema_overrides={"value_num": pl.Float64})
    write_table(tmp_path, "host_facts", df, partition_by_hour=False)
    assert q.run_query(tmp_path, "top-incidents").height == 0
    assert q.run_query(tmp_path, "remediation-effects").height == 0
    assert q.run_query(tmp_path, "SELECT * FROM findings").height == 0
    assert q.run_query(tmp_path, "top-factors").height == 0
    with pytest.raises(q.QueryError, match="unknown table 'features'; tables in .*: host_facts$"):
        q.run_query(tmp_path, "SELECT * FROM features")


def test_corrupt_file_is_skipped_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingest.lake import write_table

    df = pl.DataFrame({"time": [T0, T0 + timedelta(hours=1)], "host": ["h1", "h1"], "load1": [1.0, 2.0]})
    paths = write_table(tmp_path, "system", df)
    assert len(paths) == 2  # one file per hour partition
    paths[1].write_bytes(b"PAR1 this is not parquet")
    assert main(["query", "--lake", str(tmp_path), "--format", "csv", "SELECT load1 FROM system"]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines() == ["load1", "1.0"]
    assert "skipped" in cap.err and str(paths[1]) in cap.err


# ------------------------------------------------------------ lake tables only (no files, no URLs)


@pytest.fixture
def small_lake(tmp_path: Path) -> Path:
    from ingest.lake import write_table

    root = tmp_path / "lake"
    write_table(root, "system", pl.DataFrame({"time": [T0], "host": ["h1"], "load1": [1.5]}))
    return root


@pytest.fixture
def outside_file(tmp_path: Path) -> Path:
    p = tmp_path / "outside" / "secret.csv"
    p.parent.mkdir()
    p.write_text("user,hash\nroot,s3cr3t-hash\n")
    return p


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on localhost that records every request it gets."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.path)
            body = b"a\n1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("template", [
    "SELECT * FROM read_csv('{f}')",
    "SELECT * FROM READ_CSV('{f}')",
    "SELECT * FROM \"read_csv\"('{f}')",
    "SELECT * FROM read_ndjson('{f}')",
    "SELECT * FROM read_json('{f}')",
    "SELECT * FROM read_parquet('{f}')",
    "SELECT * FROM read_ipc('{f}')",
    "SELECT * FROM read_delta('{f}')",
    "SELECT * FROM scan_csv('{f}')",
    "SELECT load1, (SELECT count(*) FROM read_csv('{f}')) AS n FROM system",
    "SELECT * FROM system WHERE EXISTS (SELECT 1 FROM read_csv('{f}'))",
    "SELECT load1 FROM system UNION ALL SELECT 1.0 FROM read_csv('{f}')",
    "WITH read_csv AS (SELECT 1 AS a) SELECT * FROM read_csv('{f}')",
    "SELECT * FROM \"{f}\"",
    "SELECT * FROM '{f}'",
    "CREATE TABLE t AS SELECT * FROM read_csv('{f}')",
])
def test_sql_cannot_read_files_outside_the_lake(small_lake: Path, outside_file: Path, template: str) -> None:
    sql = template.format(f=outside_file)
    with pytest.raises(q.QueryError, match=r"lake tables only|unknown table|read-only") as info:
        q.run_query(small_lake, sql)
    assert "s3cr3t" not in str(info.value)


def test_cli_read_csv_of_a_file_prints_nothing_of_it(small_lake: Path, outside_file: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(small_lake), f"SELECT * FROM read_csv('{outside_file}')"]) == 2
    cap = capsys.readouterr()
    assert "s3cr3t" not in cap.out + cap.err
    assert "read_csv" in cap.err and "lake tables only" in cap.err and "system" in cap.err


@pytest.mark.parametrize("fn", ["read_csv", "read_parquet", "read_ndjson", "read_json", "read_ipc"])
def test_sql_cannot_fetch_urls(small_lake: Path, http_server: tuple[str, list[str]], fn: str) -> None:
    url, seen = http_server
    with pytest.raises(q.QueryError, match="lake tables only"):
        q.run_query(small_lake, f"SELECT * FROM {fn}('{url}/data')")
    assert seen == []  # refused before anything was fetched


def test_ctes_and_lake_tables_still_work(small_lake: Path) -> None:
    got = q.run_query(small_lake, "WITH t AS (SELECT load1 FROM system), u (x) AS (SELECT load1 * 2 FROM t) "
                                  "SELECT t.load1, u.x FROM t, u")
    assert got.rows() == [(1.5, 3.0)]
    assert q.run_query(small_lake, "SELECT 'read_csv(x)' AS s FROM system").item() == "read_csv(x)"


def test_damaged_and_truncated_files_are_skipped_and_warned_once(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Damage inside a file with a valid footer used to fail the whole query without naming
    the file; now it is skipped like a truncated one, each warned once, the rest returned."""
    from ingest.lake import write_table
    from tests.test_lake import damage_column_chunk, truncate
    from tests.test_scheduler import assert_warned_once

    n = 2000
    paths = [write_table(tmp_path, "system", pl.DataFrame({
        "time": [T0 + timedelta(hours=h, milliseconds=100 * i) for i in range(n)], "host": ["h1"] * n,
        "load1": [float(h)] * n}))[0] for h in range(4)]
    damage_column_chunk(paths[1])
    truncate(paths[2])
    with caplog.at_level("INFO"):
        assert main(["query", "--lake", str(tmp_path), "--format", "csv",
                     "SELECT load1, count(*) AS n FROM system GROUP BY load1 ORDER BY load1"]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines() == ["load1,n", "0.0,2000", "3.0,2000"]
    assert_warned_once((paths[1], paths[2]), "query", cap.err, caplog)
    # the library: named in `corrupt`, or (without it) one log warning each
    caplog.clear()
    got: list = []
    assert q.run_query(tmp_path, "SELECT * FROM system", corrupt=got).height == 2 * n
    assert sorted(e.path for e in got) == paths[1:3]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    with caplog.at_level("WARNING"):
        q.run_query(tmp_path, "SELECT * FROM system")
    assert sorted(r.getMessage().count("corrupt lake file") for r in caplog.records) == [1, 1]


def test_top_factors_keeps_the_direction_a_feature_moved(tmp_path: Path) -> None:
    # A feature that went up in three windows and dipped (slightly, with little weight) in a
    # fourth went up; one that went down every window went down.
    from analytics.attribution import Factor, factors_series
    from analytics.pipeline import FINDINGS_SCHEMA
    from ingest.lake import write_table

    def f(feature: str, contrib: float, value: float, ref: float) -> Factor:
        return Factor(feature, feature.split(".")[0], "gpu0", "gpu", contrib, "up" if value >= ref else "down",
                      value, ref)

    tops = [[f("gpu_power_w", 0.5, 300.0, 200.0), f("gpu_sm_clock_mhz", 0.3, 900.0, 1900.0)]] * 3 + [
        [f("gpu_power_w", 0.05, 195.0, 200.0), f("gpu_sm_clock_mhz", 0.3, 1000.0, 1900.0)]]
    starts = [T0 + timedelta(seconds=10 * i) for i in range(4)]
    df = pl.DataFrame({"time": starts, "host": ["h1"] * 4, "window_start": starts,
                       "window_end": [s + timedelta(seconds=10) for s in starts], "reference": ["self"] * 4,
                       "score": [3.0] * 4, "detectors": [["zscore"]] * 4}).with_columns(
        factors_series(tops)).with_columns(pl.lit(0.0).alias(c) for c in FINDINGS_SCHEMA if c.startswith("share_"))
    write_table(tmp_path, "findings", df, partition_by_hour=False)
    out = q.run_query(tmp_path, "top-factors")
    got = dict(zip(out["feature"], out["direction"], strict=True))
    assert got == {"gpu_power_w": "up", "gpu_sm_clock_mhz": "down"}, out
    row = out.filter(pl.col("feature") == "gpu_power_w").row(0, named=True)
    assert row["windows"] == 4 and row["mean_value"] > row["mean_reference"]


def test_remediation_effects_on_a_lake_written_before_the_history_columns(tmp_path: Path) -> None:
    # remediations files written before attached_incidents / recurrence_of / came_back_after_s
    # existed: those read as null, the rest as written.
    from ingest.lake import write_table
    from remediation.queue import Queue

    with Queue(tmp_path / "q.db") as qu:
        a = qu.propose(host="h1", entry_id="thp_coverage_loss", incident_id="inc-1", script_id="thp",
                       params={"enabled": "always"})
        qu.approve(a.id, by="alice")
        frame = qu.to_frame()
    new_cols = ["attached_incidents", "recurrence_of", "came_back_after_s"]
    old = frame.drop(new_cols).with_columns(pl.col("updated").alias("time"))
    write_table(tmp_path / "lake", "remediations", old, partition_by_hour=False)
    out = q.run_query(tmp_path / "lake", "remediation-effects")
    assert out.height == 1
    row = out.row(0, named=True)
    assert row["action_id"] == a.id and row["state"] == "approved" and row["approved_by"] == "alice"
    assert all(row[c] is None for c in new_cols)
    assert out.schema["recurrence_of"] == pl.Int64 and out.schema["came_back_after_s"] == pl.Float64
    # and ad hoc SQL naming a new column works on the old files too
    assert q.run_query(tmp_path / "lake", "SELECT count(recurrence_of) AS n FROM remediations")["n"][0] == 0


# ------------------------------------------------------------- read-only statements


@pytest.mark.parametrize(("sql", "kind"), [
    ("DROP TABLE system", "DROP"),
    ("delete from system", "DELETE"),
    ("truncate table system", "TRUNCATE"),
    ("INSERT INTO system VALUES (1)", "INSERT"),
    ("copy system to '/tmp/unveil-query-copy.csv'", "COPY"),
    ("CREATE TABLE t AS SELECT 1", "CREATE"),
    ("-- a comment\n/* another */ ( drop table system)", "DROP"),
    ("EXPLAIN ANALYZE DROP TABLE system", "DROP"),
])
def test_cli_refuses_statements_that_are_not_reads(small_lake: Path, capsys: pytest.CaptureFixture[str],
                                                   sql: str, kind: str) -> None:
    assert main(["query", "--lake", str(small_lake), sql]) == 2
    err = capsys.readouterr().err
    assert f"runs read-only queries (SELECT/WITH); {kind!r} is not one" in err
    assert "Traceback" not in err and "Insert(" not in err and "unknown table" not in err
    assert not Path("/tmp/unveil-query-copy.csv").exists()
    assert q.run_query(small_lake, "SELECT load1 FROM system").rows() == [(1.5,)]  # untouched


@pytest.mark.parametrize("sql", [
    "-- leading comment\n/* block */ ( SELECT load1 FROM system )",
    "WITH t AS (SELECT load1 FROM system) SELECT * FROM t",
    "FROM system SELECT load1",
])
def test_read_queries_behind_comments_and_parentheses_still_run(small_lake: Path, sql: str) -> None:
    assert q.run_query(small_lake, sql).rows() == [(1.5,)]
    assert q.run_query(small_lake, "EXPLAIN SELECT load1 FROM system").height > 0


def test_show_tables_lists_the_lake_tables(small_lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert q.run_query(small_lake, "SHOW TABLES")["name"].to_list() == ["system"]
    assert main(["query", "--lake", str(small_lake), "--format", "csv", "show tables;"]) == 0
    assert capsys.readouterr().out.split() == ["name", "system"]
    assert main(["query", "--lake", str(small_lake), "SHOW COLUMNS FROM system"]) == 2
    assert "only 'SHOW TABLES'" in capsys.readouterr().err


def test_row_count_parameters_must_be_non_negative_integers(small_lake: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lake", str(small_lake), "top-incidents", "--param", "limit=-1"]) == 2
    err = capsys.readouterr().err
    assert "parameter 'limit'" in err and "must be a non-negative integer, not '-1'" in err
    assert "non-numeric arguments" not in err
    with pytest.raises(q.QueryError, match=r"SQL: parameter 'n' .*non-negative integer, not 'x'"):
        q.run_query(small_lake, "SELECT load1 FROM system LIMIT :n", params={"n": "x"})
    with pytest.raises(q.QueryError, match=r"parameter 'o' .*non-negative integer, not '1.5'"):
        q.run_query(small_lake, "SELECT load1 FROM system LIMIT 5 OFFSET :o", params={"o": "1.5"})
    assert q.run_query(small_lake, "SELECT load1 FROM system LIMIT :n", params={"n": "0"}).height == 0
    assert q.run_query(small_lake, "top-incidents", params={"limit": "0"}).height == 0


def test_cli_query_after_hosts_is_the_query(small_lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = str(small_lake)
    assert main(["query", "--lake", lake, "--format", "csv", "--hosts", "h1", "SELECT host, load1 FROM system"]) == 0
    assert capsys.readouterr().out.split() == ["host,load1", "h1,1.5"]
    assert main(["query", "--lake", lake, "--format", "csv", "--hosts", "h2", "SELECT host FROM system"]) == 0
    assert capsys.readouterr().out.split() == ["host"]  # the hosts still prune
    assert main(["query", "--lake", lake, "--format", "csv", "--hosts", "h1", "top-incidents"]) == 0
    assert capsys.readouterr().out.startswith("incident_id,host,")
    assert main(["query", "--lake", lake, "--hosts", "h1", "top-incidentz"]) == 2
    err = capsys.readouterr().err
    assert "--hosts took 'top-incidentz' as a host; put the SQL or query name before --hosts" in err
    assert main(["query", "--lake", lake, "--hosts", "top-incidents"]) == 2
    assert "--hosts needs at least one host" in capsys.readouterr().err
    assert main(["query", "--lake", lake]) == 2
    assert "give SQL or a query name" in capsys.readouterr().err


def test_cli_out_errors_name_the_users_path_and_missing_parents_are_made(small_lake: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = ["query", "--lake", str(small_lake), "--format", "csv", "SELECT load1 FROM system", "--out"]
    missing = tmp_path / "nodir" / "q.csv"  # created, as by every command's --out
    assert main([*base, str(missing)]) == 0
    assert missing.read_text().split() == ["load1", "1.5"]
    assert main([*base, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path} is a directory" in err and "Traceback" not in err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main([*base, str(afile / "q.csv")]) == 2
    assert f"{afile} is not a directory" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "q.csv")]) == 0
    assert (tmp_path / "q.csv").read_text().split() == ["load1", "1.5"]
