"""jobs/commands"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from ingest.lake import CorruptFileError


def warn_corrupt(command: str, errors: Iterable[CorruptFileError], seen: set[Path] | None = None) -> None:
    """The one warning per corrupt lake file a command skipped, on stderr, naming the path
    and the reason. The readers only collect them (ingest.lake ``report=``), so this is the
    only report; ``seen`` keeps a long-running command (the scheduler) from repeating a
    file in later cycles."""
    seen = set() if seen is None else seen
    for err in errors:
        if err.path in seen:
            continue
        seen.add(err.path)
        print(f"unveil {command}: warning: corrupt file skipped: {err.path} ({err.reason})", file=sys.stderr)
    sys.stderr.flush()
