"""One executor process of the concurrency test (tests/test_remediation_executor.py).

Usage: python worker.py QUEUE_DB ROOT GO_FILE NAME. Waits for GO_FILE (so both processes start
together), then claims and applies approved actions until none is left."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from remediation.executor import Executor, ExecutorConfig
from remediation.queue import Queue

db, root, go, name = sys.argv[1:5]
queue = Queue(db)
ex = Executor(queue, ExecutorConfig(root=root), worker=name)
while not Path(go).exists():
    time.sleep(0.005)
while True:
    if ex.run_next() is None:
        if not queue.actions(state="approved"):
            break
        time.sleep(0.005)  # every approved action's host is busy: wait for it to free up
queue.close()
