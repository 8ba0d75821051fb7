"""jobs.engine: the same map serially, on a spawn process pool and on a real Ray cluster.

The Ray cluster is real: ``ray start --head --block`` on loopback ports in a short temp dir
(Ray's socket paths must fit 107 bytes), started once for the module and stopped by
SIGTERM to its ``ray start`` process (which drains and stops the node's processes). The
local spec (``ray:2``) starts its own cluster with ``ray.init``. Ray listens on loopback
only: the variable below is read when Ray is imported.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import polars as pl
import pytest

from ingest import lake as lake_mod
from jobs.cli import main
from jobs.engine import (
    DEFAULT,
    EngineError,
    ProcessEngine,
    RayEngine,
    SerialEngine,
    local_cores,
    make_engine,
    parse_spec,
)
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 90.0


# ------------------------------------------------------------- mapped functions (top-level: they pickle)


def frame_stats(n: int) -> tuple[int, float, str]:
    """Polars work in the worker (Polars must run in a spawned worker as it does here)."""
    df = pl.DataFrame({"x": list(range(n))}).with_columns((pl.col("x") * 0.5).alias("y"))
    return df.height, float(df["y"].sum()), f"item-{n}"


def lake_settings(_: int) -> tuple[str | None, str | None]:
    """The object-storage endpoint and region a worker's stores would use."""
    from ingest import objstore

    st = objstore._settings()
    return st.endpoint, st.region


def pid_of(_: int) -> int:
    time.sleep(0.2)  # long enough that both workers take items
    return os.getpid()


#: changed by a test in this process: a spawned worker imports the module afresh and sees "import"
STATE = "import"


def state_of(_: int) -> str:
    return STATE


def polars_threads(_: int) -> int:
    return pl.thread_pool_size()


def fail_on_three(n: int) -> int:
    if n == 3:
        raise ValueError(f"no good: {n}")
    return n


def die_on_two(n: int) -> int:
    """The worker that takes item 2 is killed (as the OOM killer would) mid-map."""
    if n == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.1)
    return n


# ------------------------------------------------------------------ the Ray cluster


@pytest.fixture(scope="module", autouse=True)
def ray_env() -> Iterator[Path]:
    """Ray's settings for this module (Ray is imported by the tests, after this): loopback
    only, no usage stats, token authentication with a token of its own (not ~/.ray's)."""
    tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths
    token = tmp / "token"
    token.write_text(os.urandom(16).hex())
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_TMPDIR": str(tmp),
           "RAY_AUTH_TOKEN_PATH": str(token)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield tmp
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def ray_address(ray_env: Path) -> Iterator[str]:
    """``ray://127.0.0.1:PORT`` of a real 2-CPU Ray head started for this module, before
    any of its tests (autouse): a head started while this process held a spawn pool could
    not start its client servers (seen here, cause not found). Ready once a client ran a
    task on it: on a fresh 2-core machine the head's first client server failed to start
    although its port accepted (CI, stop 22). A head whose client server found its port
    taken (by another process between our pick and its bind: CI, 2026-12-06) is stopped and
    another started on fresh ports, up to three times."""
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        pytest.fail(f"{ray_bin} is missing: pip install 'ray[client]' (a dependency of unveil)", pytrace=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    heads: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    try:
        for attempt in range(3):
            tmp = ray_env / f"head{attempt}"
            gcs, client = free_port(), free_port()
            tmp.mkdir()
            log = open(tmp / "start.log", "wb")  # noqa: SIM115 -- closed at teardown
            proc = subprocess.Popen(
                [str(ray_bin), "start", "--head", "--block", "--port", str(gcs), "--node-ip-address", "127.0.0.1",
                 "--ray-client-server-port", str(client), "--num-cpus", "2", "--include-dashboard", "false",
                 "--object-store-memory", str(100 * 2**20), "--temp-dir", str(tmp), "--disable-usage-stats"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            heads.append((proc, log))
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"ray start exited {proc.returncode}:\n{(tmp / 'start.log').read_text()[-3000:]}")
                if b"Ray runtime started" in (tmp / "start.log").read_bytes():
                    try:
                        with socket.create_connection(("127.0.0.1", client), timeout=5):
                            break
                    except OSError:  # its client server listens a moment later
                        pass
                if time.monotonic() > deadline:
                    pytest.fail(f"ray start did not start in {START_TIMEOUT_S:.0f} s:\n"
                                f"{(tmp / 'start.log').read_text()[-3000:]}")
                time.sleep(0.5)
            address = f"ray://127.0.0.1:{client}"
            try:
                _wait_ready(address, deadline, tmp)
            except _PortTaken:
                _stop_head(*heads.pop())
                continue
            break
        else:
            pytest.fail("three Ray heads in a row found their client server's port taken")
        yield address
    finally:
        for head in heads:
            _stop_head(*head)


class _PortTaken(Exception):
    """A Ray head's client server could not bind its port."""


def _port_taken(tmp: Path) -> bool:
    return any("Address already in use" in p.read_text(errors="replace")
               for p in tmp.rglob("ray_client_server*.err"))


def _stop_head(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    proc.terminate()  # `ray start --block` stops the node's processes on SIGTERM
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the session it was started in
        proc.wait(10)
    log.close()


@pytest.fixture
def bounded() -> Iterator[None]:
    """A map that hangs fails the test after 120 s instead of hanging it."""
    def _timeout(*_: object) -> None:
        raise TimeoutError("the map hung")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(120)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


ENGINES = ["serial", "processes:2", "ray"]


def _wait_ready(address: str, deadline: float, tmp: Path) -> None:
    """Until a client maps one item on the cluster (each try a fresh connection)."""
    errors: list[str] = []
    while True:
        try:
            with make_engine(address) as eng:
                if eng.map(frame_stats, [3]) == [frame_stats(3)]:
                    return
        except (EngineError, ConnectionError) as exc:
            errors.append(str(exc).splitlines()[0])
        if _port_taken(tmp):
            raise _PortTaken(address)
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}"
                              for p in sorted(tmp.rglob("ray_client_server*.err")))
            pytest.fail(f"the Ray head at {address} ran no task in {START_TIMEOUT_S:.0f} s: {errors}\n{logs}")
        time.sleep(2.0)


@pytest.fixture
def engine_of(ray_address: str) -> Iterator[Callable[[str], object]]:
    """spec -> an open engine ('ray': the module's cluster), closed after the test."""
    opened = []

    def make(spec: str) -> object:
        eng = make_engine(ray_address if spec == "ray" else spec)
        opened.append(eng)
        return eng

    yield make
    for e in opened:
        e.close()


# ------------------------------------------------------------------ specs


@pytest.mark.parametrize(("spec", "want"), [
    (None, "processes"), ("serial", "serial"), (" processes:3 ", "processes:3"), ("ray", "ray"),
    ("ray:2", "ray:2"), ("ray://10.0.0.5:10001", "ray://10.0.0.5:10001")])
def test_specs_are_normalised(spec: str | None, want: str) -> None:
    assert parse_spec(spec) == want
    assert DEFAULT == "processes"


@pytest.mark.parametrize(("spec", "message"), [
    ("threads", r"--engine: unknown engine 'threads'; expected serial, processes"),
    ("processes:0", r"--engine: the worker count must be >= 1"),
    ("serial:2", r"--engine: 'serial' takes no worker count"),
    ("ray://host", r"--engine: unknown engine 'ray://host'"),
    (2, r"--engine: expected one of serial"),
])
def test_a_bad_spec_is_rejected_naming_where(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec, "--engine")  # type: ignore[arg-type]


def test_the_default_is_a_process_pool_of_every_local_core() -> None:
    with make_engine(None) as eng:
        assert isinstance(eng, ProcessEngine) and eng.workers == local_cores() == len(os.sched_getaffinity(0))
    assert isinstance(make_engine("serial"), SerialEngine)


# ------------------------------------------------------------------ behaviour, every engine


def test_the_same_results_serially_in_processes_and_on_ray(engine_of: Callable[[str], object]) -> None:
    items = [5, 1, 40, 7, 0, 12]
    want = [(n, sum(range(n)) * 0.5, f"item-{n}") for n in items]
    for spec in ENGINES:
        eng = engine_of(spec)
        assert eng.map(frame_stats, items) == want, spec  # type: ignore[attr-defined]
        assert eng.map(frame_stats, []) == [], spec  # type: ignore[attr-defined]


def test_processes_run_in_other_processes_on_every_worker() -> None:
    with make_engine("processes:2") as eng:
        pids = set(eng.map(pid_of, list(range(6))))
    assert os.getpid() not in pids and len(pids) == 2


@pytest.mark.parametrize("spec", ENGINES)
def test_an_exception_keeps_its_type_and_names_the_item(spec: str, engine_of: Callable[[str], object]) -> None:
    eng = engine_of(spec)
    with pytest.raises(ValueError, match="no good: 3") as exc:
        eng.map(fail_on_three, [1, 2, 3, 4])  # type: ignore[attr-defined]
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "tests.test_engine.fail_on_three" in notes and "item #2 3" in notes, notes
    assert eng.map(fail_on_three, [4, 5]) == [4, 5]  # type: ignore[attr-defined] # still usable


@pytest.mark.parametrize("spec", ["processes:2", "ray"])
def test_a_worker_killed_mid_map_raises_a_clear_error(spec: str, engine_of: Callable[[str], object],
                                                      bounded: None) -> None:
    eng = engine_of(spec)
    t = time.monotonic()
    with pytest.raises(EngineError, match=r"(died|WorkerCrashedError).*unfinished items: .*#2 2"):
        eng.map(die_on_two, [0, 1, 2, 3])  # type: ignore[attr-defined]
    assert time.monotonic() - t < 60
    assert eng.map(frame_stats, [3]) == [(3, 1.5, "item-3")]  # type: ignore[attr-defined] # a new worker


def test_workers_share_the_cores_out_between_their_polars_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """N workers on C cores run Polars on C // N threads each (not C each), unless the
    operator set POLARS_MAX_THREADS; this process's environment is left as it was."""
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    for n in (1, 2):
        with make_engine(f"processes:{n}") as eng:
            assert set(eng.map(polars_threads, range(2 * n))) == {max(1, local_cores() // n)}
    assert "POLARS_MAX_THREADS" not in os.environ
    monkeypatch.setenv("POLARS_MAX_THREADS", "3")
    with make_engine("processes:2") as eng:
        assert set(eng.map(polars_threads, range(4))) == {3}


def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    """A command killed with SIGKILL (the OOM killer, a crash test) leaves no pool workers
    behind: they would hold their memory, and the command's stdout/stderr, for good."""
    script = ("import os, signal, sys\n"
              "from jobs.engine import make_engine\n"
              "from tests.test_engine import pid_of\n"
              "eng = make_engine('processes:2')\n"
              "print(*sorted(set(eng.map(pid_of, range(6)))), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # stdout is a file, not a pipe: a left-over worker must not be what the test waits on
    out = tmp_path / "out"
    with out.open("w") as f:
        r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                           timeout=120)
    assert r.returncode == -signal.SIGKILL, out.read_text()
    workers = [int(p) for p in out.read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while (alive := [p for p in workers if Path(f"/proc/{p}").exists()
                     and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"pool workers {alive} outlived their killed parent"


def test_workers_are_spawned_not_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked worker would carry this process's state (Polars' thread pool, open files,
    the scheduler's lock); a spawned one starts from a fresh import."""
    monkeypatch.setattr(sys.modules[__name__], "STATE", "changed in the parent")
    with make_engine("processes:1") as eng:
        assert eng.map(state_of, [0]) == ["import"]
    assert SerialEngine().map(state_of, [0]) == ["changed in the parent"]


def test_a_function_that_cannot_reach_a_worker_is_named() -> None:
    with make_engine("processes:1") as eng, pytest.raises(TypeError, match="cannot be sent to a worker"):
        eng.map(lambda n: n, [1])


def test_a_local_ray_listens_on_loopback_with_the_cpus_asked(bounded: None) -> None:
    """... and its workers, like a spawned pool's, reach the object-storage endpoint the
    config file named (ingest.objstore.configure), which they do not import."""
    from ingest import objstore

    objstore.configure(endpoint="http://127.0.0.1:9", region="eu-test-1")
    try:
        with make_engine("ray:2") as eng:
            assert isinstance(eng, RayEngine) and eng.workers == 2
            import ray

            assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
            assert eng.map(frame_stats, [4, 2]) == [frame_stats(4), frame_stats(2)]
            assert eng.map(lake_settings, [0]) == [("http://127.0.0.1:9", "eu-test-1")]
        assert not ray.is_initialized()  # the engine started it, the engine shut it down
        with make_engine("processes:1") as eng:
            assert eng.map(lake_settings, [0]) == [("http://127.0.0.1:9", "eu-test-1")]
    finally:
        objstore.configure()


@pytest.mark.filterwarnings("ignore:Ray Client connection timed out")
def test_a_client_server_that_failed_to_start_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray starts a server process per client; when that start fails (seen on a loaded CI
    machine) the connection is tried again, and only that failure is. (Ray's init is
    replaced here: the failure cannot be caused on demand.)"""
    import ray

    from jobs import engine as engine_mod

    calls: list[str] = []

    def flaky(address: str | None, **_: object) -> None:
        calls.append(str(address))
        if len(calls) < 3:
            raise ConnectionAbortedError("Initialization failure from server: RuntimeError: Starting Ray client "
                                         "server failed. See ray_client_server_23003.err for detailed logs.")

    monkeypatch.setattr(engine_mod.time, "sleep", lambda _s: None)
    monkeypatch.setattr(ray, "init", flaky)
    engine_mod._init_ray(ray, "ray://127.0.0.1:1", {})
    assert calls == ["ray://127.0.0.1:1"] * 3
    calls.clear()

    def refused(address: str | None, **_: object) -> None:
        calls.append(str(address))
        raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(ConnectionError, match="timeout"):
        engine_mod._init_ray(ray, "ray://127.0.0.1:1", {})
    assert len(calls) == 1  # an unreachable cluster is not retried


def test_an_unreachable_ray_cluster_is_an_engine_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.util.client import worker

    # Ray Client retries 3 times with growing waits (5, 10, 15 s): 1 s each here
    monkeypatch.setattr(worker, "INITIAL_TIMEOUT_SEC", 1)
    monkeypatch.setattr(worker, "MAX_TIMEOUT_SEC", 1)
    with pytest.raises(EngineError, match=r"ray://127.0.0.1:\d+: cannot start or reach"):
        make_engine(f"ray://127.0.0.1:{free_port()}")


# ------------------------------------------------------------------ a real job: the simulator


def _tables(lake: Path) -> dict[str, pl.DataFrame]:
    out = {}
    for t in lake_mod.tables(lake):
        df = lake_mod.read(lake, t)
        out[t] = df.sort(df.columns)
    return out


SCENARIO = """
name = "three"
seed = 4
start = "2026-01-05T08:59:00Z"   # crosses an hour: two partitions per host
duration = "2m"

[[hosts]]
name = "a-00"
workload = "training"

[[hosts]]
name = "a-01"
workload = "llm_serving"

[[hosts]]
name = "a-02"
workload = "training"

[[injections]]
type = "thermal_throttle"
host = "a-01"
devices = ["5"]
start = "30s"
duration = "60s"
severity = 0.7
"""


def test_unveil_simulate_writes_the_same_lake_on_every_engine(tmp_path: Path, ray_address: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "three.toml"
    scenario.write_text(SCENARIO)
    lakes = {}
    for spec in ("serial", "processes:2", ray_address):
        lake = tmp_path / spec.replace(":", "_").replace("/", "")
        assert main(["simulate", "--lake", str(lake), "--scenario", str(scenario), "--engine", spec]) == 0
        assert "simulated 3 host(s)" in capsys.readouterr().out
        lakes[spec] = _tables(lake)
    ref = lakes.pop("serial")
    assert {"gpu", "cpu", "host_facts", "labels"} <= set(ref) and ref["gpu"]["host"].n_unique() == 3
    assert ref["labels"]["host"].to_list() == ["a-01"]
    for spec, got in lakes.items():
        assert set(got) == set(ref), spec
        for t, df in ref.items():
            assert got[t].equals(df), f"{spec}: table {t} differs"


def test_unveil_schedule_writes_the_same_verdicts_on_every_engine(tmp_path: Path, ray_address: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's map steps (per-host features, blocks of analysis steps; a cycle of one
    minute, one step: its hosts' profiles, its cohorts' references, slices of its hosts) on
    2 worker processes and on the Ray cluster: the same features, scores and findings as
    serially."""
    scenario = tmp_path / "three.toml"
    scenario.write_text(SCENARIO)
    template = tmp_path / "template"
    assert main(["simulate", "--lake", str(template), "--scenario", str(scenario), "--engine", "serial"]) == 0
    # (a slice of a step is at least half a batch: 3 hosts make 2 slices; cohorts from 2 hosts
    # and no warm-up: the step's cohort references are items of its maps too)
    config = tmp_path / "unveil.toml"
    config.write_text("[scheduler]\nbatch_hosts = 2\n[analytics]\nmin_cohort = 2\nwarmup = \"0s\"\n")
    got = {}
    for spec in ("serial", "processes:2", ray_address):
        lake = tmp_path / spec.replace(":", "_").replace("/", "")
        shutil.copytree(template, lake)
        for until in ("2026-01-05T09:00:00Z", "2026-01-05T09:01:00Z"):  # (the live scheduler's minutes)
            assert main(["--config", str(config), "schedule", "--once", "--lake", str(lake), "--until", until,
                         "--no-progress", "--engine", spec]) == 0
        capsys.readouterr()
        tables = _tables(lake)
        got[spec] = {t: tables[t].select(sorted(tables[t].columns)) for t in ("features", "scores", "findings")}
    ref = got.pop("serial")
    assert ref["findings"].height > 0 and ref["features"]["host"].n_unique() == 3
    assert {"a-00", "a-02"} <= set(ref["scores"].filter(pl.col("reference") == "cohort")["host"])
    for spec, tables in got.items():
        for t, df in ref.items():
            assert tables[t].equals(df), f"{spec}: table {t} differs"


def test_a_failing_host_is_named_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["simulate", "--lake", str(blocker / "lake"), "--hosts", "2", "--duration", "10s",
                 "--engine", "processes:2"]) == 2
    err = capsys.readouterr().err
    assert "not a writable directory" in err and "<host sim-00 of scenario 'healthy'>" in err, err


def test_the_engine_key_and_flags_arrive_in_the_sweep_config(tmp_path: Path) -> None:
    from jobs import config
    from jobs.cli import build_parser
    from jobs.commands.schedule import sweep_config
    from jobs.commands.sweep import _settings

    p = tmp_path / "c.toml"
    p.write_text('[scheduler]\nengine = "processes:3"\n')
    cfg = config.load(p)
    assert cfg.sweep.engine == "processes:3"

    def schedule(*flags: str) -> str:
        argv = ["schedule", "--once", "--lake", str(tmp_path), *flags]
        return sweep_config(build_parser(argv).parse_args(argv), cfg, tmp_path).engine

    def sweep(*flags: str) -> str:
        argv = ["--config", str(p), "sweep", "--lake", str(tmp_path), *flags]
        return _settings(build_parser(argv).parse_args(argv))[3]

    assert schedule() == sweep() == "processes:3"  # the config's
    assert schedule("--engine", "ray://10.1.2.3:10001") == sweep("--engine", "ray://10.1.2.3:10001") \
        == "ray://10.1.2.3:10001"
    for run in (schedule, sweep):
        with pytest.raises(ValueError, match="--engine: unknown engine 'fast'"):
            run("--engine", "fast")


def test_simulate_on_a_mapper_wants_sinks_each_worker_opens(tmp_path: Path) -> None:
    from ingest.simulator import from_dict, simulate

    sink = lake_mod.LakeSink(tmp_path / "lake")
    try:
        with pytest.raises(TypeError, match="sinks must be a picklable callable that returns the sinks"):
            simulate(from_dict({"hosts": 1, "duration": "10s"}), [sink], mapper=SerialEngine().map)
    finally:
        sink.close()
