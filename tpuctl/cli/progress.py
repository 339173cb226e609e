"""What people see while a command works: state changes as timestamped lines on stderr, a live
status line only on a terminal, and Ctrl-C or a CI runner's SIGTERM turned into an interrupt
the library reports on (what is left, the command to clean it up)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpuctl.clock import format_duration, rfc3339

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.watcher import WatchEvent
    from tpuctl.fanout.targets import WorkerTarget


class WaitProgress:
    """Each state change with its UTC time on stderr; on a terminal a live line with the state,
    how long it has lasted and how long tpuctl has waited (rich's spinner, on stderr), counted
    when the line is drawn: it ticks between polls, which come up to a minute apart."""

    def __init__(
        self, app: AppContext, name: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.name = name
        self._clock = clock
        self._seen: tuple[WatchEvent, float] | None = None  # the last event, when it came

    def __call__(self, event: WatchEvent) -> None:
        if event.kind == "state":
            arrow = f"{event.previous} → {event.state}" if event.previous else event.state
            self.app.info(f"{rfc3339(event.at)} {self.name}: {arrow}")
        elif event.kind == "warning":
            self.app.warn(f"{self.name}: {event.message}")
        self._seen = (event, self._clock())

    def line(self) -> str:
        """The live line as of now: the last event's timers plus the time since it came."""
        if self._seen is None:
            return f"{self.name}: …"
        event, came = self._seen
        since = max(0.0, self._clock() - came)
        return (
            f"{self.name}: {event.state} for {_seconds(event.in_state + since)} "
            f"(waiting {_seconds(event.elapsed + since)})"
        )

    def __rich__(self) -> str:
        # rich draws this at every refresh of the live display: the line of that moment.
        return self.line()

    @contextmanager
    def shown(self) -> Iterator[WaitProgress]:
        """The live line while waiting (terminal only), redrawn four times a second, with
        SIGTERM handled as Ctrl-C."""
        with sigterm_as_interrupt():
            if not self.app.animated:
                yield self
                return
            with self.app.stderr.status(self, refresh_per_second=4):
                yield self


def _seconds(value: float) -> str:
    """A live timer in whole seconds (tenths would flicker at every redraw)."""
    whole = int(value)
    return format_duration(float(whole)) if whole else "0s"


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


class FanoutProgress:
    """A fan-out's progress for people: on a terminal a live line on stderr with the workers
    done out of the total, the failures so far and, for a transfer, the bytes moved; always
    a note when a worker's connection is retried. A fan-out event callback."""

    def __init__(self, app: AppContext, what: str, total: int) -> None:
        self.app = app
        self.what = what
        self.total = total
        self.started = self.done = self.failed = self.bytes = 0
        self._lock = threading.Lock()
        self._status: Any = None

    def __call__(self, target: WorkerTarget, kind: str, message: str) -> None:
        if kind == "retry":
            self.app.info(f"[{target.label}] connection set-up failed, retrying: {message}")
            return
        with self._lock:
            if kind == "started":
                self.started += 1
            elif kind == "finished":
                self.done += 1
                self.failed += message != "ok"

    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.bytes += count

    def line(self) -> str:
        with self._lock:
            running = self.started - self.done
            text = f"{self.what}: {self.done}/{self.total} workers done"
            text += f", {running} running" if running > 0 else ""
            text += f", {self.failed} failed" if self.failed else ""
            text += f", {format_bytes(self.bytes)}" if self.bytes else ""
        return text

    @contextmanager
    def shown(self, *, streaming: bool = False) -> Iterator[FanoutProgress]:
        """The live line while the fan-out runs, redrawn a few times a second: on a terminal
        only (nothing in a pipe, with --quiet, or for JSON), and not while the workers' output
        streams to the same terminal (`streaming`: the output is the progress then). Output
        written to stdout is never rerouted."""
        if not self.app.animated or (streaming and sys.stdout.isatty()):
            yield self
            return
        from rich.live import Live
        from rich.spinner import Spinner

        spinner = Spinner("dots", self.line())
        stop = threading.Event()
        live = Live(
            spinner,
            console=self.app.stderr,
            transient=True,
            redirect_stdout=False,
            refresh_per_second=10,
        )
        with live:

            def redraw() -> None:
                while not stop.wait(0.2):
                    spinner.update(text=self.line())

            painter = threading.Thread(target=redraw, name="tpuctl-progress", daemon=True)
            painter.start()
            try:
                yield self
            finally:
                stop.set()
                painter.join()


def format_bytes(count: float) -> str:
    """1536 → 1.5 KiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover - unreachable
