"""A process the kill -9 tests of tests/test_lake.py start and kill at random moments.

    python tests/lake_crash_helper.py sink ROOT FIRST_ID     # LakeSink writes + flushes
    python tests/lake_crash_helper.py compact ROOT FIRST_ID  # small writes + compactions

Rows are ``cpu`` rows whose ``user`` field is a unique id, counting up from FIRST_ID.
After every durable step it prints ``committed N``: every id below N is committed.
It prints ``ready`` once imports are done, and stops by itself after 30 s.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

import polars as pl

from ingest import lake

T0 = datetime(2024, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=7)  # ~514 ids per hour partition: batches cross partitions
BATCH = 50


def batch(first: int, n: int = BATCH) -> pl.DataFrame:
    ids = list(range(first, first + n))
    return pl.DataFrame(
        {
            "time": [T0 + STEP * (i % 20_000) for i in ids],
            "host": ["h1" if i % 3 else "h2" for i in ids],
            "cpu": [str(i % 2) for i in ids],
            "node": "0",
            "user": ids,
        }
    )


def main(mode: str, root: str, first: int) -> None:
    deadline = time.monotonic() + 30
    next_id = first
    if mode == "sink":
        # the agent's setting: no fsync; a killed process must still never expose a partial file
        sink = lake.LakeSink(root, max_buffer_rows=10**9, max_buffer_age_s=1e9, durable=False)
        print("ready", flush=True)
        while time.monotonic() < deadline:
            for _ in range(2):
                sink.write("cpu", batch(next_id))
                next_id += BATCH
            sink.flush()
            print(f"committed {next_id}", flush=True)
    elif mode == "compact":
        print("ready", flush=True)
        while time.monotonic() < deadline:
            for _ in range(3):
                lake.write_table(root, "cpu", batch(next_id, 20))
                next_id += 20
                print(f"committed {next_id}", flush=True)
            lake.compact(root, "cpu", older_than=timedelta(0), target_rows=400)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
