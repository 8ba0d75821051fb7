"""jobs/commands"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ingest import lake as lake_mod
from ingest.lake import CorruptFileError


def verb_options(parser: argparse.ArgumentParser,
                 add: Callable[[argparse.ArgumentParser], object]) -> argparse.ArgumentParser:
    """Options of a command with verbs (``unveil remediate list``) that go before or after
    the verb: ``add`` puts them on the command, and on the returned parent parser (give it
    to every verb's ``parents``) without defaults, so one given after the verb wins and one
    given before it is kept."""
    add(parser)
    after = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    add(after)
    return after


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


def output_file(path: str | None, option: str) -> Path | None:
    """A user's ``--out FILE`` checked before any work: a directory is an error naming the
    option (not a traceback from the final rename), and missing parent directories are
    created, as for every command that writes a file."""
    if path is None:
        return None
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{option} {out} is a directory; give a file name")
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{option} {out}: {parent} is not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option} {out}: cannot create {parent}: {exc.strerror}") from None
    return out


def unknown_hosts(lake: str | Path, hosts: Iterable[str] | None) -> str | None:
    """None when every host asked for has data in the lake; else what to tell the user."""
    if not hosts or not lake_mod.exists(lake):
        return None
    from jobs.telemetry import fleet_hosts  # (the analytics' imports: not for every command)

    known = set(fleet_hosts(lake))
    missing = sorted(set(hosts) - known)
    if not missing:
        return None
    have = sorted(known)
    listed = ", ".join(have[:10]) + (f" and {len(have) - 10} more" if len(have) > 10 else "")
    return f"no data in {lake} for host(s) {', '.join(missing)} (it has: {listed or 'none'})"


def check_hosts(lake: str | Path, hosts: Iterable[str] | None) -> None:
    """A ``--hosts`` name with no data is a typo more often than not: an error, not an
    empty result."""
    if (msg := unknown_hosts(lake, hosts)) is not None:
        raise ValueError(f"--hosts: {msg}")
