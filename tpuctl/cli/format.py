"""How values look in a table cell: the one place for times, durations and missing values.

Times are relative on a terminal ("3m ago") and RFC 3339 in a pipe (scripts parse them);
durations use tpuctl's one duration format (tpuctl.clock.format_duration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tpuctl.clock import as_utc, format_duration, rfc3339, utc_now

MISSING = "-"


@dataclass(frozen=True)
class Style:
    """Where a table goes: a terminal of `width` columns, or a pipe (width None)."""

    width: int | None = None
    wide: bool = False
    all_rows: bool = False  # every worker's row even in a large fan-out (`--all-rows`)
    now: datetime = field(default_factory=utc_now)

    @property
    def terminal(self) -> bool:
        return self.width is not None

    def time(self, moment: datetime | None) -> str:
        """`3m ago` on a terminal, RFC 3339 in a pipe; `-` when unknown."""
        if moment is None:
            return MISSING
        if not self.terminal:
            return rfc3339(moment)
        return ago(moment, self.now)

    def duration(self, seconds: float | None) -> str:
        return format_duration(seconds, none=MISSING)


def ago(moment: datetime, now: datetime) -> str:
    seconds = (as_utc(now) - as_utc(moment)).total_seconds()
    if seconds < 0:
        return "in " + format_duration(-seconds)
    if seconds < 1:
        return "just now"
    return format_duration(seconds if seconds < 10 else round(seconds)) + " ago"


def value(item: object) -> str:
    """A plain cell: `-` for None, the text otherwise."""
    return MISSING if item is None else str(item)
