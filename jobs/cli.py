"""The ``unveil`` command line. Every subcommand lives in one module of jobs/commands/
exposing ``add_parser(subparsers)``, which registers the subcommand and sets ``func``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand in argv (skipping the global options), before argparse runs."""
    it = iter(argv)
    for a in it:
        if a == "--config":
            next(it, None)
        elif not a.startswith("-"):
            return a
    return None


# The agent must stay on one core whatever the host's size: Polars sizes its thread pool
# when it is imported (below), so the limit has to be set before that.
#
# And it needs no OpenSSL: Polars imports hashlib (for its Iceberg reader), whose OpenSSL
# backend maps libcrypto, 3.4 MiB of the agent's resident memory. Without it hashlib uses
# CPython's own md5/sha1/sha2/sha3/blake2 (scrypt and OpenSSL-only algorithms go); TLS
# (the ssl module, for an https InfluxDB) loads OpenSSL itself and is unaffected.
if _command_word(sys.argv[1:]) == "agent":
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]

from ingest.lake import LakeError  # noqa: E402
from ingest.sink import SinkError  # noqa: E402
from jobs.engine import EngineError  # noqa: E402

#: the subcommands' modules under jobs.commands, in the order of --help
COMMANDS = (
    "agent",
    "remediate",
    "schema",
    "simulate",
    "import_",
    "sweep",
    "eval",
    "kb",
    "query",
    "report",
    "demo",
    "schedule",
    "postmortem",
    "drill",
)


def _command_modules(argv: Sequence[str]) -> list[ModuleType]:
    """The modules to register for ``argv``. ``unveil agent`` imports only its own: the
    others pull in scikit-learn, scipy, pyarrow and urllib3, over 100 MB of resident memory
    in a process that runs on every host for good."""
    names = ("agent",) if _command_word(argv) == "agent" else COMMANDS
    return [importlib.import_module(f"jobs.commands.{n}") for n in names]


class UserError(Exception):
    """An error the user can fix (bad argument, missing file); printed without a traceback."""


# Values that start with "-" but are not options: negative numbers and durations, as in
# `--since -24h` (documented in jobs/timeparse.py) or `--interval -1`. argparse's own
# pattern only knows plain numbers and would take "-24h" for an unknown option and print a
# usage dump; with this the value reaches the command, which accepts it or names the flag.
_NEGATIVE_VALUE = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*(ms|s|m|h|d|w)?$", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser (and, through ``add_subparsers``, every subcommand's) that takes
    negative numbers and durations as values. No option of ours looks like one."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = _NEGATIVE_VALUE

    def error(self, message: str) -> NoReturn:
        """One line, as the commands report bad values, not a usage dump; exit status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: every subcommand; see :func:`_command_modules`)."""
    parser = _Parser(
        prog="unveil",
        description="Find and fix silent inefficiencies in ML hosts from host-visible telemetry.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: $UNVEIL_CONFIG or none)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _command_modules(argv or ()):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed: its status
        return exc.code if isinstance(exc.code, int) else 2
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a reader that went away shows up here rather than at exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `unveil ... | head`: stop quietly, as a command killed by SIGPIPE would; stdout
        # goes to /dev/null so that the interpreter's last flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, FileNotFoundError, ValueError, LakeError, SinkError, EngineError) as exc:
        # notes say where (an engine names the item that failed in a worker)
        notes = "".join(f" ({n})" for n in getattr(exc, "__notes__", ()))
        print(f"unveil {args.command}: error: {exc}{notes}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
