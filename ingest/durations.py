"""Durations as users write them, one parser for every command, config key and scenario
file: a number and a unit (``ms``, ``s``, ``m``, ``h``, ``d``, ``w``), or several of them
added up (``1h30m``, ``2m 30s``)."""

from __future__ import annotations

import re

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
#: one or more (number, unit) parts, optionally signed; the sign is matched so that "-1m"
#: gets "must be positive", not "expected a number"
PARTS = r"(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)\s*)+"
_DURATION = re.compile(rf"^\s*([+-]?)\s*({PARTS})$")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_FORM = "a number and a unit (ms, s, m, h, d, w)"


def duration_seconds(text: str) -> float:
    """``"1h30m"`` -> 5400.0 (case-insensitive). Zero and negative durations are rejected.
    Raises ValueError naming ``text`` (callers prefix the flag or key it came from)."""
    m = _DURATION.match(text.lower())
    if m is None:
        raise ValueError(f"bad duration {text!r}: expected {_FORM}, e.g. '1m' or '1h30m'")
    seconds = sum(float(v) * UNITS[u] for v, u in _PART.findall(m.group(2)))
    if m.group(1) == "-" or seconds <= 0:
        raise ValueError(f"bad duration {text!r}: must be positive")
    return seconds


def is_duration(text: str) -> bool:
    """Whether ``text`` is written as a duration (signed or not), not, say, a time."""
    return _DURATION.match(text.lower()) is not None


def seconds_of(text: str) -> float:
    """A plain number of seconds (``150``, ``0.1``: returned as written, sign and all, for
    the caller's range check) or a duration (``2m30s``, :func:`duration_seconds`)."""
    try:
        return float(text)
    except ValueError:
        pass
    if not is_duration(text):
        raise ValueError(f"bad duration {text!r}: expected a number of seconds (150) or {_FORM}, e.g. '2m30s'")
    return duration_seconds(text)


def readable(seconds: float | None) -> str:
    """A duration to read at a glance: 20 s, 5 min 3 s, 3 h 25 min, 2 d 3 h (None: "")."""
    if seconds is None:
        return ""
    s = round(seconds)
    if s < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{s} s"
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s} s"  # unreachable: s >= 60
