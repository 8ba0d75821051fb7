"""Parse the times the command line accepts: ISO-8601 and relative forms.

``now``; a duration back from now (``90s``, ``90m``, ``24h``, ``7d``, ``2w``, ``1h30m``: see
:mod:`ingest.durations`; also written ``-24h`` or ``now-24h``); or an ISO-8601 date/time
(``2026-11-30``, ``2026-11-30T02:00``, ``2026-11-30T02:00:00Z``, ``...+02:00``). Naive ISO
times are taken as UTC. Every result is a timezone-aware UTC :class:`datetime.datetime`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ingest.durations import PARTS, duration_seconds

_RELATIVE = re.compile(rf"^\s*(?:now\s*)?-?\s*({PARTS})$")


def parse_duration(text: str, name: str | None = None) -> timedelta:
    """``"1m"`` -> 60 s, ``"1h30m"`` -> 90 min (:func:`ingest.durations.duration_seconds`).
    Zero or negative durations are rejected.

    ``name`` (a flag or config key) starts the error message, so the user sees which value.
    """
    where = f"{name}: " if name else ""
    try:
        seconds = duration_seconds(text)
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from None
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{where}bad duration {text!r}: too long (at most {timedelta.max.days} days)") from None


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """Parse an absolute or relative time to an aware UTC datetime.

    ``now`` (default: the current time) anchors relative forms, so tests are deterministic.
    """
    ref = (now or datetime.now(UTC)).astimezone(UTC)
    s = text.strip()
    if not s:
        raise ValueError("empty time: expected ISO-8601 (2026-11-30T02:00Z), 'now' or a relative form like '24h'")
    if s.lower() == "now":
        return ref
    rel = _RELATIVE.match(s.lower())
    if rel is not None:
        try:
            back = parse_duration(rel.group(1))
        except ValueError as exc:  # name what the user wrote ("-0h"), not the part parsed ("0h")
            raise ValueError(f"bad time {text!r}: {str(exc).split(': ', 1)[-1]}") from None
        try:
            return ref - back
        except OverflowError:
            raise ValueError(f"bad time {text!r}: reaches back before year 1") from None
    iso = s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"bad time {text!r}: expected ISO-8601 (2026-11-30T02:00Z), 'now' or a relative form like '24h', '90m', '7d'"
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def parse_range(
    since: str | None, until: str | None, *, default_since: str = "24h", now: datetime | None = None
) -> tuple[datetime, datetime]:
    """(start, end) of ``--since``/``--until`` (defaults: ``default_since`` ago .. now); start < end."""
    ref = now or datetime.now(UTC)
    start = parse_time(since if since is not None else default_since, now=ref)
    end = parse_time(until if until is not None else "now", now=ref)
    if start >= end:
        raise ValueError(f"empty interval: --since {start.isoformat()} is not before --until {end.isoformat()}")
    return start, end
