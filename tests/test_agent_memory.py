"""The agent's resident memory: which modules its process loads, and that the frames it
builds without Arrow are the ones it built through Arrow (same schema, same rows, same
Parquet files)."""

from __future__ import annotations

import ctypes
import json
import math
import random
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest import lake, schema
from ingest.agent import Agent, AgentConfig, _Buffer

ROOT = Path(__file__).resolve().parents[1]

#: modules the agent process must not load at default settings: each costs MiB to tens of
#: MiB of resident memory (pyarrow.parquet ~75) and the agent needs none of them
# The agent validates the whole config file at start (jobs.config.load), so it imports the
# light [remediation] type (remediation.executor: +1.8 MiB measured over polars + numpy).
HEAVY = ("pyarrow", "sklearn", "scipy", "urllib3", "influxdb_client", "analytics", "knowledge_base")


def _has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _run(code: str, tmp_path: Path) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (the repository on its path); it must print one
    JSON line last."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


_REPORT = """
    import json, sys
    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) // 1024
    import hashlib
    print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}),
                      "hwm_mib": vm("VmHWM:"),
                      "libcrypto": any("libcrypto" in line for line in open("/proc/self/maps")),
                      "sha256": hashlib.sha256(b"unveil").hexdigest()}))
"""


def test_agent_command_loads_no_heavy_module(tmp_path: Path) -> None:
    """`unveil agent` at default settings, through the CLI entry, with a commit to the lake
    and a compaction of it: none of HEAVY is imported (nor pynvml on a host without NVML),
    and the process stays far below what any of them would add."""
    lake_dir = tmp_path / "lake"
    code = f"""
        import sys, runpy
        sys.argv = ["unveil", "agent", "--lake", {str(lake_dir)!r}, "--host", "memtest",
                    "--duration", "1.5", "--flush-interval", "0.5", "--commit-interval", "0.5", "--quiet"]
        try:
            runpy.run_module("jobs.cli", run_name="__main__")
        except SystemExit as exc:
            assert not exc.code, exc.code
        from datetime import UTC, datetime, timedelta
        from ingest import lake
        st = lake.compact({str(lake_dir)!r}, older_than=timedelta(0), now=datetime.now(UTC) + timedelta(hours=2))
        assert st.tables > 0, st
    """
    out = _run(textwrap.dedent(code) + textwrap.dedent(_REPORT), tmp_path)
    loaded = set(out["modules"])  # type: ignore[arg-type]
    heavy = set(HEAVY) | (set() if _has_nvml() else {"pynvml"})
    assert not loaded & heavy, sorted(loaded & heavy)
    # ~95 MiB measured (numpy + polars alone: ~77); pyarrow or the other commands' imports
    # would add 65 to 165 MiB. A loose bound: other builds of the libraries differ a little.
    assert out["hwm_mib"] < 130, out["hwm_mib"]  # type: ignore[operator]
    # no OpenSSL mapped for hashlib (jobs/cli.py), and hashlib still hashes
    assert out["libcrypto"] is False
    assert out["sha256"] == "02ddbea2b67e54f6226af95ef6f018338e623ab294cef75fcfac43fc7543a6a4"
    assert "polars" in loaded and "ingest" in loaded  # it did run the agent
    assert lake.read(lake_dir, "system").height > 0


def test_other_commands_still_registered() -> None:
    """Only `unveil agent` skips the other subcommands' imports: the full CLI has them all."""
    from jobs import cli

    full = cli.build_parser().format_help()
    for word in ("agent", "sweep", "query", "remediate", "kb", "schedule", "postmortem"):
        assert word in full
    agent_only = cli.build_parser(["agent", "--lake", "x"])
    assert "sweep" not in agent_only.format_help()
    assert agent_only.parse_args(["agent", "--lake", "x"]).lake == "x"


def _arrow_frame(buf: _Buffer, columns: dict[str, list[object]], host: str | None) -> pl.DataFrame:
    """The agent's frames as it built them through Arrow before: the reference."""
    arrow_schema = pl.DataFrame(schema=buf.measurement.polars_schema(with_host=False)).to_arrow().schema
    n = len(columns.get(schema.TIME, ()))
    arrays = []
    for fld in arrow_schema:
        col = columns.get(fld.name)
        if col is None:
            arrays.append(pa.nulls(n, type=fld.type))
        elif fld.name == schema.TIME:
            arrays.append(pa.array(col, type=pa.int64()).cast(fld.type))
        else:
            arrays.append(pa.array(col, type=fld.type, from_pandas=False))
    names = list(arrow_schema.names)
    if host is not None:
        arrays.insert(1, pa.array([host] * n, type=pa.large_string()))
        names.insert(1, schema.HOST)
    return pl.from_arrow(pa.Table.from_arrays(arrays, names=names))  # type: ignore[return-value]


def _random_columns(m: schema.Measurement, n: int, rng: random.Random) -> dict[str, list[object]]:
    cols: dict[str, list[object]] = {schema.TIME: [1_767_225_600_000_000 + i * 100_000 for i in range(n)]}
    for i, (name, dtype) in enumerate(m.polars_schema(with_host=False).items()):
        if name == schema.TIME or i % 5 == 4:
            continue  # every fifth column missing: it becomes nulls
        vals: list[object]
        if dtype == pl.String:
            vals = [f"dev{rng.randrange(8)}" for _ in range(n)]
        elif dtype.is_float():
            vals = [rng.choice((rng.random() * 1e6, 0.1, -3.25, math.nan, 7)) for _ in range(n)]
        elif isinstance(dtype, pl.Datetime):
            vals = [1_767_225_600_000_000 + rng.randrange(10**9) for _ in range(n)]
        else:
            vals = [rng.choice((0, 1, -1, 2**62, rng.randrange(10**12))) for _ in range(n)]
        for j in range(0, n, 7):
            vals[j] = None
        cols[name] = vals
    return cols


@pytest.mark.parametrize("host", [None, "h1"])
def test_frames_without_arrow_match_the_arrow_ones(host: str | None) -> None:
    """Every measurement, with nulls, NaN, ints in float columns and missing columns."""
    rng = random.Random(11)
    for m in schema.MEASUREMENTS.values():
        buf = _Buffer(m)
        for n in (0, 1, 37):
            cols = _random_columns(m, n, rng)
            got, want = buf.frame(cols, host), _arrow_frame(buf, cols, host)
            assert got.schema == want.schema, m.name
            assert got.equals(want, null_equal=True), m.name
            # NaN stays NaN (not null), as from_pandas=False kept it
            for c, dt in got.schema.items():
                if dt.is_float():
                    assert got[c].is_nan().sum() == want[c].is_nan().sum(), (m.name, c)


def test_committed_files_keep_their_parquet_schema(tmp_path: Path) -> None:
    """The agent's commit writes the same Parquet schema and rows as a file written from
    the Arrow-built frame of the same rows."""
    rng = random.Random(5)
    sink = lake.LakeSink(tmp_path / "a", durable=False)
    for m in dict.fromkeys((schema.SYSTEM, *list(schema.MEASUREMENTS.values())[:6])):
        buf = _Buffer(m)
        cols = _random_columns(m, 20, rng)
        ref = _arrow_frame(buf, cols, "h1")
        buf.load(cols)
        assert buf.commit_to(sink, m.name, "h1", "0000abcd") == 20
        lake.write_table(tmp_path / "b", m.name, ref)
        (got_file,) = lake.files(tmp_path / "a", m.name)
        (ref_file,) = lake.files(tmp_path / "b", m.name)
        assert pq.read_schema(got_file).remove_metadata() == pq.read_schema(ref_file).remove_metadata()
        assert pl.read_parquet(got_file).equals(pl.read_parquet(ref_file), null_equal=True)


def test_agent_rows_unchanged_end_to_end(tmp_path: Path) -> None:
    """A short real run on this host: what reaches the lake reads back in the schema's types."""
    cfg = AgentConfig(lake=tmp_path, host="h1", duration_s=0.5, flush_interval_s=0.2,
                      commit_interval_s=0.2, compact_every_s=0)
    Agent(cfg, [lake.LakeSink(tmp_path, durable=False)]).run()
    df = lake.read(tmp_path, "cpu")
    assert df.height > 0
    assert df.schema == schema.get("cpu").polars_schema()


def _old_hour(root: Path, host: str, files: int) -> Path:
    """``files`` small files of ``system`` in an hour that closed three hours ago."""
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    for k in range(files):
        times = [t0 + timedelta(minutes=k, seconds=i) for i in range(5)]
        df = pl.DataFrame({"time": times, "host": [host] * 5, "ctxt": [k * 10 + i for i in range(5)]})
        lake.write_table(root, "system", df)
    (path,) = {p.parent for p in lake.files(root, "system", hosts=[host])}
    return path


def test_compaction_candidates_lists_closed_partitions_with_files_to_merge(tmp_path: Path) -> None:
    old = _old_hour(tmp_path, "h1", 3)
    _old_hour(tmp_path, "h2", 1)  # one file: nothing to merge
    lake.write_table(tmp_path, "system", pl.DataFrame(  # the current hour: not closed
        {"time": [datetime.now(UTC)] * 2, "host": ["h1", "h1"], "ctxt": [1, 2]}))
    lake.write_table(tmp_path, "system", pl.DataFrame(
        {"time": [datetime.now(UTC)], "host": ["h1"], "ctxt": [3]}))
    got = lake.compaction_candidates(tmp_path)
    assert list(got) == [old]
    assert got[old] == frozenset(p.name for p in old.iterdir())
    lake.compact(tmp_path)
    assert lake.compaction_candidates(tmp_path) == {}


def test_agent_compacts_in_a_child_process_and_only_when_needed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's compaction loop merges a closed hour's files, but not in its own process
    (lake.compact here raises), and starts a child only when there is something new."""
    import ingest.agent as agent_mod

    old = _old_hour(tmp_path, "h1", 4)
    rows = lake.read(tmp_path, "system").sort("time")

    def in_process(*_a: object, **_k: object) -> None:
        raise AssertionError("compaction ran in the agent's process")

    calls: list[str] = []
    real = agent_mod.compact_in_child

    def counted(root: Path, hosts: list[str] | None = None) -> str:
        calls.append(str(root))
        assert hosts is None  # (a lake directory has a lock: every host's partitions)
        return real(root, hosts)

    monkeypatch.setattr(lake, "compact", in_process)
    monkeypatch.setattr(agent_mod, "compact_in_child", counted)
    cfg = AgentConfig(lake=tmp_path, host="h1", duration_s=4, compact_every_s=0.3,
                      collectors=("memory",))
    Agent(cfg, [lake.LakeSink(tmp_path, durable=False)]).run()
    assert len(calls) == 1
    deadline = time.monotonic() + 30  # the child may outlive a run on a loaded machine
    while len([p for p in old.iterdir() if p.suffix == ".parquet"]) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len([p for p in old.iterdir() if p.suffix == ".parquet"]) == 1
    monkeypatch.undo()
    after = lake.read(tmp_path, "system", hosts=["h1"]).filter(pl.col("time") <= rows["time"].max())
    assert after.sort("time").equals(rows)


def test_compact_in_child_reports_failure(tmp_path: Path) -> None:
    from ingest.agent import compact_in_child

    (tmp_path / "f").write_text("not a lake")
    with pytest.raises(lake.LakeError, match="child process"):
        compact_in_child(tmp_path / "f")
