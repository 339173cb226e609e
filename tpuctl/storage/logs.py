"""What a job's log says about its progress: the step lines and where a boot resumed from."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The toy trainer's `step N/TOTAL` and MaxText's `completed step: N`.
DEFAULT_STEP_PATTERN = r"\bstep (\d+)/|completed step: (\d+)"
_RESUMED = re.compile(r"resumed from step (\d+)")
_FRESH = re.compile(r"starting fresh")


@dataclass(frozen=True)
class LogFacts:
    """What a job log says about progress."""

    last_step: int | None = None
    first_step: int | None = None
    resumed_from: int | None = None  # `resumed from step N`, 0 for `starting fresh`
    step_lines: int = 0

    @property
    def resume_point(self) -> int | None:
        """Where this boot started: the resume line, else the first step logged − 1."""
        if self.resumed_from is not None:
            return self.resumed_from
        if self.first_step is not None:
            return self.first_step - 1
        return None


def compile_step_pattern(pattern: str | None) -> re.Pattern[str]:
    """A step regex; its first group that matched is the step number."""
    compiled = re.compile(pattern or DEFAULT_STEP_PATTERN)
    if compiled.groups < 1:
        raise ValueError("the step pattern needs a capture group for the step number")
    return compiled


def parse_log(text: str, step_pattern: re.Pattern[str] | None = None) -> LogFacts:
    pattern = step_pattern or compile_step_pattern(None)
    first = last = resumed = None
    lines = 0
    for line in text.splitlines():
        if resumed is None:
            found = _RESUMED.search(line)
            if found:
                resumed = int(found.group(1))
            elif _FRESH.search(line):
                resumed = 0
        match = pattern.search(line)
        if match is None:
            continue
        number = next((group for group in match.groups() if group is not None), None)
        if number is None or not number.isdigit():
            continue
        step = int(number)
        lines += 1
        if first is None:
            first = step
        last = step
    return LogFacts(last_step=last, first_step=first, resumed_from=resumed, step_lines=lines)
