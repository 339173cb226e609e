"""Parsing of spec durations ("1h30m", seconds) and time bounds (a duration or RFC 3339 time)."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# ASCII digits only: str.isdigit() accepts "²", which int() then rejects.
_DURATION = re.compile(r"(?:[0-9]+\s*[smhd]\s*)+", re.ASCII)
_DURATION_PART = re.compile(r"([0-9]+)\s*([smhd])", re.ASCII)
_SECONDS = re.compile(r"[0-9]+", re.ASCII)
_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]"
    r"(?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
# timedelta overflows past ~2.7 million years; nobody queues that long.
_MAX_SECONDS = 100 * 365 * 86400

DURATION_HINT = "write e.g. 90s, 10m, 2h, 1d or 1h30m; a plain number is seconds"
TIME_BOUND_HINT = DURATION_HINT + ", or an RFC 3339 time such as 2030-01-31T18:00:00Z"


def parse_duration(text: str | int) -> timedelta:
    """`"90s"`, `"10m"`, `"2h"`, `"1d"`, `"1h30m"` or an int of seconds → timedelta.

    Raises ValueError for anything else, including negatives and bools.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int):
        seconds = text
    else:
        stripped = text.strip().lower()
        if _SECONDS.fullmatch(stripped):
            seconds = int(stripped)
        elif _DURATION.fullmatch(stripped):
            seconds = sum(
                int(number) * _UNIT_SECONDS[unit]
                for number, unit in _DURATION_PART.findall(stripped)
            )
        else:
            raise ValueError(f"not a duration: {text!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {text!r}")
    if seconds > _MAX_SECONDS:
        raise ValueError(f"duration too long: {text!r}")
    return timedelta(seconds=seconds)


def parse_time_bound(value: object) -> timedelta | datetime:
    """A duration (relative) or an RFC 3339 time with a timezone (absolute); ValueError else.

    YAML may already have turned an unquoted timestamp into a datetime: it is accepted when
    it carries a timezone.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"time {value.isoformat()} has no timezone (add Z or +00:00)")
        return value
    if isinstance(value, date):
        raise ValueError(f"{value.isoformat()} is a date; give a time with a timezone")
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return parse_duration(value)
        except ValueError:
            if isinstance(value, int):
                raise
    if isinstance(value, str):
        match = _RFC3339.fullmatch(value.strip())
        if match:
            return _rfc3339(match)
    raise ValueError(f"neither a duration nor an RFC 3339 time: {value!r}")


def _rfc3339(match: re.Match[str]) -> datetime:
    fraction = (match["fraction"] or "0")[:6].ljust(6, "0")
    zone = "+00:00" if match["zone"] in ("Z", "z") else match["zone"]
    # Python 3.10's fromisoformat wants exactly six fraction digits and no "Z".
    text = f"{match['date']}T{match['time']}.{fraction}{zone}"
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not a valid time: {match.group(0)!r} ({exc})") from None
