"""A small progress reporter for long runs (backfills, catch-up after an outage,
post-mortems over days, imports).

On a terminal (or when forced with ``--progress``) it redraws one line on stderr:
``catch-up  [#######.......]  5/12 chunks  41%  eta 0:01:10  sim-00..sim-02``.
Otherwise (cron, systemd, pipes) it logs one INFO line per step at most every
``log_every_s`` seconds, plus the last step, so logs stay readable.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import TextIO

log = logging.getLogger(__name__)

BAR_WIDTH = 24


def _fmt_s(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """``total`` steps of ``unit``; call :meth:`advance` after each, :meth:`close` at the end
    (or use it as a context manager). ``enabled=None``: draw when ``stream`` is a TTY."""

    def __init__(self, total: int, label: str, *, unit: str = "steps", enabled: bool | None = None,
                 stream: TextIO | None = None, log_every_s: float = 10.0) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.draw = bool(enabled) if enabled is not None else self._isatty(self.stream)
        self.log_every_s = log_every_s
        self.done = 0
        self._t0 = time.monotonic()
        self._last_log = -float("inf")
        self._drawn = False

    @staticmethod
    def _isatty(stream: TextIO) -> bool:
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def line(self, detail: str = "") -> str:
        """The status line as drawn (also used for the log)."""
        elapsed = time.monotonic() - self._t0
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * BAR_WIDTH)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            eta = elapsed / self.done * (self.total - self.done) if self.done else None
            eta_s = f"eta {_fmt_s(eta)}" if eta is not None and self.done < self.total else f"in {_fmt_s(elapsed)}"
            text = f"{self.label}  [{bar}]  {self.done}/{self.total} {self.unit}  {frac:4.0%}  {eta_s}"
        else:
            text = f"{self.label}  {self.done} {self.unit}  {_fmt_s(elapsed)}"
        return f"{text}  {detail}" if detail else text

    def advance(self, n: int = 1, detail: str = "") -> None:
        self.done += n
        text = self.line(detail)
        if self.draw:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()
            self._drawn = True
            return
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s or (self.total and self.done >= self.total):
            self._last_log = now
            log.info("%s", text)

    def close(self) -> None:
        if self.draw and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
