"""What people see while a command works: state changes as timestamped lines on stderr, a live
status line only on a terminal, and Ctrl-C or a CI runner's SIGTERM turned into an interrupt
the library reports on (what is left, the command to clean it up)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpuctl.clock import format_duration, rfc3339

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.watcher import WatchEvent


class WaitProgress:
    """Each state change with its UTC time on stderr; on a terminal a live line with the state
    and how long it has lasted (rich's spinner, on stderr)."""

    def __init__(self, app: AppContext, name: str) -> None:
        self.app = app
        self.name = name
        self._status: Any = None

    def __call__(self, event: WatchEvent) -> None:
        if event.kind == "state":
            arrow = f"{event.previous} → {event.state}" if event.previous else event.state
            self.app.info(f"{rfc3339(event.at)} {self.name}: {arrow}")
        elif event.kind == "warning":
            self.app.warn(f"{self.name}: {event.message}")
        if self._status is not None:
            self._status.update(
                f"{self.name}: {event.state} for {format_duration(event.in_state)} "
                f"(waiting {format_duration(event.elapsed)})"
            )

    @contextmanager
    def shown(self) -> Iterator[WaitProgress]:
        """The live line while waiting (terminal only), with SIGTERM handled as Ctrl-C."""
        with sigterm_as_interrupt():
            if not self.app.animated:
                yield self
                return
            with self.app.stderr.status(f"{self.name}: …") as status:
                self._status = status
                try:
                    yield self
                finally:
                    self._status = None


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A CI runner cancelling the job sends SIGTERM: treat it like Ctrl-C (report, clean up)."""

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopFlag:
    """Set by Ctrl-C or SIGTERM, which also raise KeyboardInterrupt; the flag survives code that
    absorbs the exception (the SSH engine returns an interrupted result instead)."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self) -> bool:
        return self.raised


@contextmanager
def interrupts() -> Iterator[StopFlag]:
    flag = StopFlag()

    def handler(_signum: int, _frame: Any) -> None:
        flag.raised = True
        raise KeyboardInterrupt

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield flag
        return
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
