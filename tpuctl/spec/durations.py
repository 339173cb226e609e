"""Spec durations (tpuctl.clock's one grammar, as timedeltas) and time bounds (a duration or an
RFC 3339 time)."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

from tpuctl.clock import DURATION_HINT
from tpuctl.clock import parse_duration as duration_seconds
from tpuctl.errors import quoted

_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]"
    r"(?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)

TIME_BOUND_HINT = DURATION_HINT + ", or an RFC 3339 time such as 2030-01-31T18:00:00Z"


def parse_duration(value: str | float) -> timedelta:
    """`"90s"`, `"1.5h"`, `"1h30m"`, a number of seconds… (tpuctl.clock.parse_duration) →
    timedelta. ValueError for anything else, including negatives and bools."""
    return timedelta(seconds=duration_seconds(value))


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
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return parse_duration(value)
        except ValueError:
            if not isinstance(value, str):
                raise
    if isinstance(value, str):
        match = _RFC3339.fullmatch(value.strip())
        if match:
            return _rfc3339(match)
    raise ValueError(f"neither a duration nor an RFC 3339 time: {quoted(value)}")


def _rfc3339(match: re.Match[str]) -> datetime:
    fraction = (match["fraction"] or "0")[:6].ljust(6, "0")
    zone = "+00:00" if match["zone"] in ("Z", "z") else match["zone"]
    # Python 3.10's fromisoformat wants exactly six fraction digits and no "Z".
    text = f"{match['date']}T{match['time']}.{fraction}{zone}"
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not a valid time: {quoted(match.group(0))} ({exc})") from None
