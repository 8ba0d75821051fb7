"""Time on the sweeps' grid: UTC normalisation, the stride grid windows start on, the
clock-aligned analysis steps, and the compact stamps in sweep and post-mortem ids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

US = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(ts: datetime) -> datetime:
    """``ts`` as an aware UTC time (a naive time is taken as UTC)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def floor_grid(ts: datetime, stride_s: float) -> datetime:
    """``ts`` rounded down to the stride grid (windows start on multiples of the stride)."""
    step = round(stride_s * 1e6)
    us = int((utc(ts) - _EPOCH) / US)
    return _EPOCH + timedelta(microseconds=us - us % step)


def steps(s: datetime, e: datetime, step: timedelta) -> list[tuple[datetime, datetime]]:
    """[s, e) cut at the multiples of ``step`` (on the UTC clock, not relative to ``s``)."""
    out = []
    step_us = round(step / US)
    b = s
    while b < e:
        us = int((utc(b) - _EPOCH) / US)
        nxt = _EPOCH + timedelta(microseconds=us - us % step_us + step_us)
        out.append((b, min(nxt, e)))
        b = nxt
    return out


def stamp(ts: datetime) -> str:
    """``20260105T080000`` (microseconds appended when there are any)."""
    return utc(ts).strftime("%Y%m%dT%H%M%S") + (f"{ts.microsecond:06d}" if ts.microsecond else "")
