"""The same lake on an S3-compatible server and on local disk: one write_table of many hour
partitions, then one-hour one-host reads.

Starts moto's S3 server (``moto[server]``, the test extra) on a free loopback port unless
``--endpoint`` names another server (credentials then from the AWS variables). moto is an
in-memory Python server: its figures are the protocol's request counts and sizes on this
machine, not the latency of a real object store.

    .venv/bin/python benchmarks/lake_s3.py --hosts 3 --days 14
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import polars as pl

from ingest import lake

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto did not start on {url}")


def moto_bucket(bucket: str) -> subprocess.Popen[bytes]:
    """Start moto on loopback, point this process and its children at it (the AWS
    variables) and create ``bucket``; the caller stops the returned process."""
    proc, endpoint = _moto()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench")
    import pyarrow.fs as pafs

    pafs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1", endpoint_override=endpoint,
                      allow_bucket_creation=True).create_dir(bucket)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--reads", type=int, default=10)
    ap.add_argument("--endpoint", help="an existing S3-compatible server (default: start moto)")
    ap.add_argument("--bucket", default="unveil-bench", help="created on moto; must exist elsewhere")
    args = ap.parse_args()
    proc = None
    if args.endpoint is None:
        proc = moto_bucket(args.bucket)
    else:
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    hosts = [f"h{i:02d}" for i in range(args.hosts)]
    n = args.days * 24 * 3  # one row every 20 minutes
    df = pl.DataFrame({"time": [T0 + timedelta(minutes=20 * i) for i in range(n) for _ in hosts],
                       "host": [h for _ in range(n) for h in hosts], "cpu": "0", "user": list(range(n * len(hosts)))})
    mid = T0 + timedelta(days=args.days // 2)
    try:
        with tempfile.TemporaryDirectory() as d:
            for root in (f"s3://{args.bucket}/lake-{time.time_ns()}", d):
                t = time.perf_counter()
                lake.write_table(root, "cpu", df)
                w = time.perf_counter() - t
                ts = []
                for _ in range(args.reads):
                    t = time.perf_counter()
                    out = lake.read(root, "cpu", start=mid, end=mid + timedelta(hours=1), hosts=[hosts[-1]])
                    ts.append(time.perf_counter() - t)
                assert out.height == 3, out
                kind = "s3   " if root.startswith("s3://") else "local"
                print(f"{kind} write_table {df.height} rows, {len(hosts) * args.days * 24} partitions: {w:.1f} s; "
                      f"one-hour one-host read: median {statistics.median(ts) * 1e3:.1f} ms, "
                      f"min {min(ts) * 1e3:.1f} ms")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
