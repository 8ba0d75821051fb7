from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ingest.durations import readable
from jobs.timeparse import parse_duration, parse_range, parse_time

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("24h", NOW - timedelta(hours=24)),
        ("90m", NOW - timedelta(minutes=90)),
        ("7d", NOW - timedelta(days=7)),
        ("-30s", NOW - timedelta(seconds=30)),
        ("now-2w", NOW - timedelta(weeks=2)),
        ("1.5h", NOW - timedelta(minutes=90)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
        ("2026-11-30T02:00", datetime(2026, 11, 30, 2, tzinfo=UTC)),
        ("2026-11-30T02:00:00Z", datetime(2026, 11, 30, 2, tzinfo=UTC)),
        ("2026-11-30T04:00:00+02:00", datetime(2026, 11, 30, 2, tzinfo=UTC)),
        ("2026-11-30 02:00:00.250", datetime(2026, 11, 30, 2, 0, 0, 250000, tzinfo=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    got = parse_time(text, now=NOW)
    assert got == expected
    assert got.tzinfo is not None and got.utcoffset() == timedelta(0)


def test_parse_time_converts_offset_now() -> None:
    other = NOW.astimezone(timezone(timedelta(hours=5)))
    assert parse_time("1h", now=other) == NOW - timedelta(hours=1)


@pytest.mark.parametrize("text", ["", "yesterday", "24x", "h24", "2026-13-01", "now+1h"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="time"):
        parse_time(text, now=NOW)


def test_a_zero_relative_time_names_what_was_written() -> None:
    with pytest.raises(ValueError, match=r"^bad time '-0h': must be positive$"):
        parse_time("-0h", now=NOW)


def test_parse_duration() -> None:
    assert parse_duration("1m") == timedelta(minutes=1)
    assert parse_duration("100ms") == timedelta(milliseconds=100)
    assert parse_duration("2D") == timedelta(days=2)
    for bad in ("0s", "m", "1 minute", "-1m"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


def test_parse_range() -> None:
    assert parse_range(None, None, now=NOW) == (NOW - timedelta(hours=24), NOW)
    assert parse_range("2h", "1h", now=NOW) == (NOW - timedelta(hours=2), NOW - timedelta(hours=1))
    with pytest.raises(ValueError, match="empty interval"):
        parse_range("1h", "2h", now=NOW)


def test_parse_duration_names_the_flag_and_rejects_negative_and_huge() -> None:
    with pytest.raises(ValueError, match=r"^--every: bad duration '-5m': must be positive$"):
        parse_duration("-5m", "--every")
    with pytest.raises(ValueError, match=r"^bad duration '- 1s': must be positive$"):
        parse_duration("- 1s")
    with pytest.raises(ValueError, match=r"^bad duration '99999999999d': too long"):
        parse_duration("99999999999d")
    with pytest.raises(ValueError, match=r"^bad time '9999999d': reaches back before year 1$"):
        parse_time("9999999d", now=NOW)
    assert parse_duration("+2s") == timedelta(seconds=2)


def test_compound_durations_are_read_alike_by_every_command_and_the_scenario_files() -> None:
    from ingest.simulator.scenario import ScenarioError, parse_duration_s

    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2m 30s") == timedelta(seconds=150)
    assert parse_time("1h30m", now=NOW) == NOW - timedelta(minutes=90)
    assert parse_time("now-1d12h", now=NOW) == NOW - timedelta(hours=36)
    assert parse_duration_s("1h30m", "duration") == 5400.0
    assert parse_duration_s("2w", "duration") == 14 * 86400.0  # (weeks: the commands' unit too)
    with pytest.raises(ValueError, match=r"^--since: bad duration '1h30x': expected a number and a unit"):
        parse_duration("1h30x", "--since")
    with pytest.raises(ScenarioError, match=r"^--duration: bad duration '-1h30m': must be positive$"):
        parse_duration_s("-1h30m", "--duration")


def test_a_duration_is_written_back_in_units_to_read_at_a_glance() -> None:
    # the report's incident durations and the simulator's summary line
    assert [readable(s) for s in (0.0, 2.5, 20.0, 59.6, 303.0, 2400.0, 3600.0, 12345.0, 2 * 86400 + 3 * 3600 + 5)] == [
        "0 s", "2.5 s", "20 s", "1 min", "5 min 3 s", "40 min", "1 h", "3 h 25 min", "2 d 3 h"]
    assert readable(None) == ""
