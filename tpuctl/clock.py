"""Time, as every layer sees it: an injectable clock, the one timestamp format (RFC 3339), and
the one duration grammar (`90s`, `1.5h`, `1h30m`, `850ms`, plain seconds), read and written."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpuctl.errors import quoted

if TYPE_CHECKING:
    from decimal import Decimal


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Clock:
    """Monotonic seconds for deadlines, wall time for timestamps, and sleep; tests inject a fake."""

    monotonic: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = field(default=utc_now)
    sleep: Callable[[float], None] = time.sleep


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def rfc3339(moment: datetime, timespec: str = "seconds") -> str:
    """RFC 3339 in UTC with a Z, the one timestamp format tpuctl prints and stores."""
    return as_utc(moment).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_rfc3339(text: str | None) -> datetime | None:
    """`2030-01-01T12:00:00Z` (or with an offset) → an aware datetime; None when unparsable."""
    if not text:
        return None
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def from_nanoseconds(nanoseconds: int) -> datetime:
    """A UTC datetime from nanoseconds since the epoch, exact to the microsecond."""
    seconds, rest = divmod(nanoseconds, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.replace(microsecond=rest // 1000)


# --- durations ---------------------------------------------------------------------------------
# One grammar for the spec, every CLI flag and the emulator: a plain number of seconds (`90`,
# `0.5`), or numbers with units (ms, s, m, h, d), decimals on any of them, summed (`1h30m`,
# `1.5h`, `1m30.5s`, `2d 3h`); case and blanks between parts do not matter, a leading `+` is
# allowed (`+30s`: from now). Everything format_duration prints is in it.
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits: "²".isdigit() is True
_UNIT = r"(?:ms|[smhd])"
_DURATION = re.compile(rf"\+?\s*(?:{_NUMBER}|(?:{_NUMBER}\s*{_UNIT}\s*)+)", re.ASCII)
_DURATION_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})", re.ASCII)
_UNIT_SECONDS = {"ms": "0.001", "s": "1", "m": "60", "h": "3600", "d": "86400"}
# timedelta overflows past ~2.7 million years; nobody waits a century.
MAX_DURATION_SECONDS = 100 * 365 * 86400
DURATION_HINT = "write e.g. 90s, 10m, 1.5h, 2d or 1h30m; a plain number is seconds"
# The grammar as a JSON Schema pattern (ECMA-262 has no flags: units in either case).
DURATION_PATTERN = rf"^\s*\+?\s*(?:{_NUMBER}|(?:{_NUMBER}\s*(?:[mM][sS]|[sSmMhHdD])\s*)+)\s*$"


def parse_duration(value: str | float) -> float:
    """A duration in the one grammar (or a number of seconds) → seconds.

    ValueError, with one line saying what is wrong, for anything else: negatives, NaN,
    bools, an empty string, more than a century. Parts are summed exactly (decimal) and
    rounded to a float once, so `7.3s` is exactly 7.3 and `1m30.5s` exactly 90.5.
    """
    from decimal import Decimal  # exact sums; imported here to keep startup light

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a duration: {quoted(value)}")
    if isinstance(value, str):
        seconds = _duration_text(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a duration: {quoted(value)}")
    else:
        seconds = Decimal(value)
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {quoted(value)}")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"duration too long: {quoted(value)} (at most 100 years)")
    return float(seconds)


def _duration_text(text: str) -> Decimal:
    from decimal import Decimal

    stripped = text.strip().lower()
    if not stripped:
        raise ValueError("an empty duration")
    if stripped.startswith("-") and _DURATION.fullmatch(stripped[1:].lstrip()):
        raise ValueError(f"a duration cannot be negative: {quoted(text)}")
    if not _DURATION.fullmatch(stripped):
        raise ValueError(f"not a duration: {quoted(text)}")
    parts = _DURATION_PART.findall(stripped)
    if not parts:  # a plain number
        return Decimal(stripped.lstrip("+").strip())
    return sum(
        (Decimal(number) * Decimal(_UNIT_SECONDS[unit]) for number, unit in parts), Decimal(0)
    )


def format_duration(seconds: float | None, *, none: str = "-") -> str:
    """The one way tpuctl shows a duration, in the grammar parse_duration reads: `850ms`,
    `7.3s`, `45s`, `3m05s`, `30m`, `1h02m`, `2d03h`.

    Under a second it rounds to the millisecond, under ten seconds to the tenth, else to the
    second; from an hour on, the finest part is dropped (`1h02m` for 1h02m59s) and zero parts
    are left out. What it prints parses back to the value shown, and formats to the same text
    again: a value that rounds up to the next unit is shown in that unit (0.9996 → `1s`, not
    `1000ms`; 9.96 → `10s`, not `10.0s`).
    """
    if seconds is None:
        return none
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        milliseconds = f"{seconds * 1000:.0f}"
        if int(milliseconds) < 1000:
            return f"{milliseconds}ms"
        seconds = 1.0
    if seconds < 10 and seconds != int(seconds):
        tenths = f"{seconds:.1f}"
        if not tenths.endswith(".0"):
            return f"{tenths}s"
        seconds = float(tenths)
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"
