"""parse_duration and parse_time_bound: the spec's view of tpuctl's one duration grammar (its
grammar itself is tests/test_clock.py's)."""

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
        ("1.5h", timedelta(minutes=90)),
        (2.5, timedelta(seconds=2.5)),
        ("850ms", timedelta(milliseconds=850)),
    ],
)
def test_parse_duration(text: str | int, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "h", "1x", "-5", -5, "1h-", "two hours", "²s", "1e3", True, "9" * 30, None]
)
def test_parse_duration_rejects(text: str | int) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_time_bound() -> None:
    assert parse_time_bound("6h") == timedelta(hours=6)
    assert parse_time_bound(600) == timedelta(minutes=10)
    assert parse_time_bound(1.5) == timedelta(seconds=1.5)  # YAML reads `1.5` as a float
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
        -1.5,
        None,
        True,
    ],
)
def test_parse_time_bound_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_time_bound(value)


def test_a_spec_takes_the_whole_grammar_and_still_names_the_line_when_wrong() -> None:
    from tpuctl.errors import SpecError
    from tpuctl.spec.load import load_spec_text

    head = "apiVersion: tpuctl/v1\nname: demo\ntpu: {accelerator: v4-8, runtime: r}\n"
    spec = load_spec_text(head + "deadlines:\n  queue: 1.5h\n  provision: 90.5\n").spec
    assert spec.deadlines.queue == timedelta(minutes=90)
    assert spec.deadlines.provision == timedelta(seconds=90.5)
    with pytest.raises(SpecError) as refused:
        load_spec_text(head + "deadlines:\n  queue: 1.5 hours\n", source="job.yaml")
    line = refused.value.one_line()
    assert line.startswith("job.yaml:5:10: deadlines.queue: not a duration: '1.5 hours'"), line
    assert "write e.g. 90s, 10m, 1.5h" in line
