"""tpuctl's one duration grammar (tpuctl.clock): what it reads, what it refuses, that what
format_duration prints reads back as the value it shows, and that every duration flag of the
CLI takes it.

Rounding, as format_duration documents it: milliseconds under a second, tenths under ten
seconds, whole seconds under an hour, whole minutes under a day (the seconds dropped), whole
hours beyond. So parse(format(x)) is x on that grid and the nearest shown value off it, and
format(parse(format(x))) == format(x) everywhere.
"""

from __future__ import annotations

import math
from decimal import Decimal

import click
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tpuctl.clock import MAX_DURATION_SECONDS, format_duration, parse_duration

ACCEPTED = [
    ("90", 90),
    ("0.5", 0.5),
    (" 2H ", 7200),
    ("1.5h", 5400),
    ("0.5s", 0.5),
    ("1h30m", 5400),
    ("2d3h", 183600),
    ("1m30.5s", 90.5),
    ("1h 30m 5s", 5405),
    ("30 m", 1800),
    ("+30s", 30),
    # what format_duration prints
    ("850ms", 0.85),
    ("7.3s", 7.3),
    ("3m05s", 185),
    ("1h02m", 3720),
    ("2d03h", 183600),
    (45, 45),
    (2.5, 2.5),
    (0, 0),
]


@pytest.mark.parametrize(("text", "seconds"), ACCEPTED, ids=[repr(t) for t, _ in ACCEPTED])
def test_the_grammar_reads(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


REFUSED = [
    ("", "an empty duration"),
    ("   ", "an empty duration"),
    ("-5", "cannot be negative"),
    ("- 1h", "cannot be negative"),
    (-5, "cannot be negative"),
    (-0.5, "cannot be negative"),
    ("h", "not a duration"),
    ("1x", "not a duration"),
    ("1e3", "not a duration"),
    ("1h30", "not a duration"),
    ("1..5s", "not a duration"),
    ("1h-", "not a duration"),
    ("two hours", "not a duration"),
    ("²s", "not a duration"),  # "²".isdigit() is True
    ("١٢s", "not a duration"),  # Arabic-Indic digits
    ("nan", "not a duration"),
    (math.nan, "not a duration"),
    (math.inf, "not a duration"),
    (True, "not a duration"),
    (None, "not a duration"),
    ("9" * 30, "duration too long"),
    ("36600d", "duration too long"),
    (1e300, "duration too long"),
]


@pytest.mark.parametrize(("value", "fragment"), REFUSED, ids=[repr(v) for v, _ in REFUSED])
def test_the_grammar_refuses_with_one_line(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as refused:
        parse_duration(value)  # type: ignore[arg-type]
    assert "\n" not in str(refused.value)


# --- what the three parsers it replaces accepted, it still accepts with the same value ---------

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
blanks = st.sampled_from(["", " ", "  "])


@st.composite
def old_spec_durations(draw: st.DrawFn) -> tuple[str, int]:
    """The spec's old grammar: whole numbers with units, summed, or whole seconds."""
    if draw(st.booleans()):
        seconds = draw(st.integers(0, 10**6))
        return f"{draw(blanks)}{seconds}{draw(blanks)}", seconds
    parts = draw(
        st.lists(st.tuples(st.integers(0, 999), st.sampled_from(sorted(UNITS))), min_size=1)
    )
    text = "".join(f"{n}{draw(blanks)}{unit}{draw(blanks)}" for n, unit in parts)
    return text, sum(n * UNITS[unit] for n, unit in parts)


@given(old_spec_durations())
def test_the_specs_old_durations_read_the_same(case: tuple[str, int]) -> None:
    text, seconds = case
    assert parse_duration(text) == seconds
    assert parse_duration(text.upper()) == seconds


decimals = st.from_regex(r"\A(?:[0-9]{1,4}(?:\.[0-9]{0,3})?|\.[0-9]{1,3})\Z")


@given(st.sampled_from(["", "+", "+ "]), decimals, st.sampled_from(["", "ms", "s", "m", "h"]))
@example("+", "30", "s")
@example("", "1.5", "h")
def test_the_emulators_old_durations_read_the_same(sign: str, number: str, unit: str) -> None:
    """The emulator's old grammar: one (decimal) number, one optional unit, a leading `+`. It
    multiplied in floats; the grammar sums exactly and rounds once, so the two agree to the
    float's last digit."""
    old = float(number) * {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    assert math.isclose(parse_duration(f"{sign}{number}{unit}"), old, rel_tol=1e-15)


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_the_flags_old_plain_seconds_read_the_same(number: Decimal) -> None:
    """CLI flags took float(text): a plain number reads exactly as float() reads it."""
    assert parse_duration(str(number)) == float(str(number))
    assert parse_duration(float(number)) == float(number)


# --- format_duration and parse_duration are one grammar --------------------------------------


def grid() -> st.SearchStrategy[float]:
    """The values format_duration shows exactly."""
    return st.one_of(
        st.integers(0, 999).map(lambda k: k / 1000),
        st.integers(10, 99).map(lambda k: k / 10),
        st.integers(10, 3599).map(float),
        st.integers(60, 1439).map(lambda k: k * 60.0),
        st.integers(24, MAX_DURATION_SECONDS // 3600).map(lambda k: k * 3600.0),
    )


@given(grid())
def test_on_the_grid_what_format_prints_reads_back_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def shown_within(seconds: float) -> float:
    """How far the value shown may be from the value given."""
    if seconds < 1:
        return 0.0005
    if seconds < 10:
        return 0.05
    if seconds < 3600:
        return 0.5
    return 60.5 if seconds < 86400 else 3600.5


@given(st.floats(min_value=0, max_value=MAX_DURATION_SECONDS, allow_nan=False))
@example(0.9996)  # rounds up into the next unit: `1s`, not `1000ms`
@example(9.96)  # `10s`, not `10.0s`
@example(59.6)
@example(3599.6)
@example(86399.9)
def test_what_format_prints_reads_back_as_the_value_shown(seconds: float) -> None:
    text = format_duration(seconds)
    shown = parse_duration(text)
    assert abs(shown - seconds) <= shown_within(seconds) + 1e-9, text
    assert format_duration(shown) == text  # stable: the shown value prints the same


@given(st.sampled_from([text for text, _ in ACCEPTED if isinstance(text, str)]))
def test_format_of_parse_is_stable(text: str) -> None:
    once = format_duration(parse_duration(text))
    assert format_duration(parse_duration(once)) == once


# --- every flag that takes a duration takes this grammar ---------------------------------------

DURATION_FLAGS = {
    "--at",
    "--connect-timeout",
    "--grace",
    "--job-check-every",
    "--key-ttl",
    "--mtbf",
    "--older-than",
    "--poll",
    "--provision-timeout",
    "--queue-timeout",
    "--restart-seconds",
    "--save-seconds",
    "--settle",
    "--step-seconds",
    "--timeout",
}


def test_every_duration_flag_takes_the_grammar() -> None:
    from tpuctl.cli.options import DurationType
    from tpuctl.cli.reference import walk_commands

    typed: set[str] = set()
    for command, _ctx in walk_commands():
        for param in command.params:
            names = set(param.opts)
            if isinstance(param.type, DurationType):
                typed |= names
                assert param.type.convert("1.5h", param, None) == 5400.0
            elif names & DURATION_FLAGS:
                raise AssertionError(f"{command.name} {sorted(names)} is {param.type.name}")
            # A float flag is a duration in disguise, but for the emulator's --speed.
            assert not isinstance(param.type, click.types.FloatParamType) or "--speed" in names
    assert typed >= DURATION_FLAGS
