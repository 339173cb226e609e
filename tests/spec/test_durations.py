"""parse_duration and parse_time_bound."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from tpuctl.spec.load import parse_duration, parse_time_bound


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m 5s", timedelta(hours=1, minutes=30, seconds=5)),
        (" 2H ", timedelta(hours=2)),
        ("0s", timedelta(0)),
        ("45", timedelta(seconds=45)),
        (45, timedelta(seconds=45)),
        (0, timedelta(0)),
    ],
)
def test_parse_duration(text: str | int, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "h", "1x", "1.5h", "-5", -5, "1h-", "two hours", "²s", "1e3", True, "9" * 30]
)
def test_parse_duration_rejects(text: str | int) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_time_bound() -> None:
    assert parse_time_bound("6h") == timedelta(hours=6)
    assert parse_time_bound(600) == timedelta(minutes=10)
    assert parse_time_bound("2030-01-31T18:00:00Z") == datetime(
        2030, 1, 31, 18, tzinfo=timezone.utc
    )
    assert parse_time_bound("2030-01-31t18:00:00.5+01:00") == datetime(
        2030, 1, 31, 18, 0, 0, 500000, tzinfo=timezone(timedelta(hours=1))
    )
    aware = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert parse_time_bound(aware) is aware


@pytest.mark.parametrize(
    "value",
    [
        "2030-01-31T18:00:00",  # no timezone
        "2030-01-31",
        date(2030, 1, 31),
        datetime(2030, 1, 31),
        "2030-13-31T18:00:00Z",
        "tomorrow",
        -1,
        None,
        1.5,
    ],
)
def test_parse_time_bound_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_time_bound(value)
