"""The emulator's clock: real wall time for timestamps, every delay divided by the speed."""

from __future__ import annotations

import time
from datetime import datetime, timezone


class Clock:
    """Timestamps stay real (so clients can compare them with their own clock); every interval
    the emulator waits, and every interval a client asks for (queueing windows, grace periods),
    is divided by `speed`, measured from the moment the request arrives."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, not {speed}")
        self.speed = speed

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(timezone.utc)

    def scaled(self, seconds: float) -> float:
        """Real seconds the emulator waits for `seconds` of emulated time."""
        return max(0.0, seconds) / self.speed

    def monotonic_at(self, moment: datetime) -> float:
        """The monotonic instant of the real wall-clock time `moment` (nothing scaled: for
        times the emulator itself set, like a termination time)."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return self.monotonic() + (moment - self.wall()).total_seconds()

    def deadline_for_time(self, moment: datetime) -> float:
        """The monotonic instant standing for the absolute emulated time `moment`."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return self.monotonic() + (moment - self.wall()).total_seconds() / self.speed


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds and a Z."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    text = moment.astimezone(timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")
