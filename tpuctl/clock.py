"""Time, as every layer sees it: an injectable clock and the one timestamp format (RFC 3339)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone


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


def format_duration(seconds: float | None, *, none: str = "-") -> str:
    """The one way tpuctl shows a duration, in the spec's own syntax: `850ms`, `7.3s`, `45s`,
    `3m05s`, `30m`, `1h02m`, `2d03h` (coarser units drop the finest; zero parts are left out)."""
    if seconds is None:
        return none
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
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
