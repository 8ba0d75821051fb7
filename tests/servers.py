"""Fixtures that start real servers (influxd 1.x, victoria-metrics) on free loopback ports.

A missing binary FAILS the test with a clear message (CI installs both with apt); it never
skips. Each server lives in its own tmp dir (config, data, logs) and is stopped (SIGTERM,
then SIGKILL) at teardown.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name!r} is not on PATH: install the Debian package {package!r} "
            f"(apt-get install {package}); server tests never skip",
            pytrace=False,
        )
    return path


class ServerProcess:
    """One server subprocess that can be stopped and started again on the same port and
    data directory (to simulate an outage)."""

    name = "server"

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir = workdir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} at start; log:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=1) as r:
                    if r.status < 300:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"{self.name} did not answer /ping within {START_TIMEOUT_S} s; log:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


class InfluxdServer(ServerProcess):
    name = "influxd"

    def __init__(self, workdir: Path, binary: str, **http: str | int | bool) -> None:
        super().__init__(workdir, free_port())
        self.binary = binary
        self.rpc_port = free_port()
        extra = "".join(f"  {k} = {json.dumps(v)}\n" for k, v in http.items())
        self.config_path = workdir / "influxdb.conf"
        self.config_path.write_text(
            f"""reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"

[meta]
  dir = "{workdir / "meta"}"

[data]
  dir = "{workdir / "data"}"
  wal-dir = "{workdir / "wal"}"
  query-log-enabled = false

[http]
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
{extra}
[monitor]
  store-enabled = false

[continuous_queries]
  enabled = false
"""
        )

    def command(self) -> list[str]:
        return [self.binary, "-config", str(self.config_path)]


class VictoriaServer(ServerProcess):
    name = "victoria-metrics"

    def __init__(self, workdir: Path, binary: str) -> None:
        super().__init__(workdir, free_port())
        self.binary = binary

    def command(self) -> list[str]:
        return [
            self.binary,
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.workdir / 'data'}",
            "-retentionPeriod=100y",
            "-loggerLevel=WARN",
        ]

    def force_flush(self) -> None:
        """Make just-written samples visible to export (they sit in memory buffers)."""
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=10):
            pass


def _serve(server: Any) -> Iterator[Any]:
    """Start a server for a session fixture and stop it afterwards, whatever the tests did."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _influxd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxdServer]:
    binary = _binary("influxd", "influxdb")
    yield from _serve(InfluxdServer(tmp_path_factory.mktemp("influxd"), binary))


@pytest.fixture
def influxd_server(_influxd_session: InfluxdServer) -> Iterator[InfluxdServer]:
    """A running influxd 1.x (shared by the session; a test that stops it gets it restarted)."""
    _influxd_session.start()
    yield _influxd_session
    _influxd_session.start()


@pytest.fixture(scope="session")
def _victoria_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaServer]:
    binary = _binary("victoria-metrics", "victoria-metrics")
    yield from _serve(VictoriaServer(tmp_path_factory.mktemp("victoria"), binary))


@pytest.fixture
def victoria_server(_victoria_session: VictoriaServer) -> Iterator[VictoriaServer]:
    """A running victoria-metrics (shared by the session)."""
    _victoria_session.start()
    yield _victoria_session
    _victoria_session.start()


@pytest.fixture
def influxd_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., InfluxdServer]]:
    """Start a private influxd with extra ``[http]`` options (``auth_enabled=True`` ->
    ``auth-enabled = true``); stopped at teardown."""
    binary = _binary("influxd", "influxdb")
    started: list[InfluxdServer] = []

    def make(**http: str | int | bool) -> InfluxdServer:
        opts = {k.replace("_", "-"): v for k, v in http.items()}
        server = InfluxdServer(tmp_path_factory.mktemp("influxd"), binary, **opts)
        started.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()
