"""The live line of a wait says how long the state has lasted and how long tpuctl has waited,
counted when it is drawn, not when the last poll answered: it ticks between polls."""

from __future__ import annotations

import io
from datetime import datetime, timezone

from tpuctl.cli.context import AppContext
from tpuctl.cli.progress import WaitProgress
from tpuctl.cloud.watcher import WatchEvent


def test_the_wait_line_counts_from_the_clock_between_polls() -> None:
    from rich.console import Console

    now = [100.0]
    progress = WaitProgress(AppContext(quiet=True), "job", clock=lambda: now[0])
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    progress(WatchEvent("state", at, "WAITING_FOR_RESOURCES", in_state=0.0, elapsed=2.0))
    assert progress.line() == "job: WAITING_FOR_RESOURCES for 0s (waiting 2s)"
    now[0] += 7.4  # no poll meanwhile
    assert progress.line() == "job: WAITING_FOR_RESOURCES for 7s (waiting 9s)"

    # What a live display draws is the line of the moment it draws.
    screen = io.StringIO()
    Console(file=screen, width=80, force_terminal=False).print(progress)
    assert "for 7s (waiting 9s)" in screen.getvalue()

    progress(WatchEvent("poll", at, "WAITING_FOR_RESOURCES", in_state=8.0, elapsed=10.0))
    assert progress.line() == "job: WAITING_FOR_RESOURCES for 8s (waiting 10s)"
