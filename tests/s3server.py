"""A real S3-compatible server on loopback for the object-storage lake tests.

moto's server mode (``python -m moto.server``, PyPI ``moto[server]``): a separate process
speaking the S3 REST API over HTTP, started once per test session on a free port and
stopped (SIGTERM, then SIGKILL) at the end. Chosen because it is the S3 server installable
from the registries this project uses (Debian has no MinIO; its ``radosgw`` needs a Ceph
cluster). Each test gets its own bucket, so tests do not see each other's objects.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    region: str = "us-east-1"
    access_key: str = "testing"
    secret_key: str = "testing"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def create_bucket(self) -> str:
        import pyarrow.fs as pafs

        name = f"lake-{secrets.token_hex(6)}"
        fs = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region=self.region,
                               endpoint_override=self.endpoint, allow_bucket_creation=True)
        fs.create_dir(name)
        return name


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    port = free_port()
    workdir: Path = tmp_path_factory.mktemp("moto")
    log_path = workdir / "moto.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}; log:\n{log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer on {url} within {START_TIMEOUT_S} s") from None
                time.sleep(0.1)
        yield S3Server(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
