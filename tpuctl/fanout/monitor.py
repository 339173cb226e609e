"""How the fan-out's one monitor thread learns that a worker's channel has something for it.

paramiko's channel buffers call `.set()` on an event object when data, EOF or an exit status
arrive; these stand in for those events, mark the session ready and wake the monitor through one
pipe. No thread per worker, no polling per channel.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from tpuctl.fanout.results import WorkerResult

if TYPE_CHECKING:
    import paramiko


class Wake:
    """Stands in for paramiko's event objects (BufferedPipe.set_event, Channel.status_event):
    every set() marks the session ready for the monitor."""

    __slots__ = ("_flag", "_monitor", "_session")

    def __init__(self, monitor: Monitor, session: Session) -> None:
        self._monitor = monitor
        self._session = session
        self._flag = False

    def set(self) -> None:
        self._flag = True
        self._monitor.notify(self._session)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:  # Event API; unused by paramiko here
        return self._flag


class StatusEvent(threading.Event):
    """Channel.status_event that also wakes the monitor (exit-status, close)."""

    def __init__(self, wake: Wake) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.set()


class Session:
    """One worker whose command has started."""

    def __init__(
        self,
        result: WorkerResult,
        transport: paramiko.Transport,
        channel: paramiko.Channel,
        began: float,
    ) -> None:
        self.result = result
        self.transport = transport
        self.channel = channel
        self.began = began  # set-up start, for duration_s
        self.started = 0.0
        self.deadline: float | None = None
        self.timed_out = False  # SIGTERM sent at its --timeout; it closes at the new deadline
        self.partial: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.probe: threading.Event | None = None
        self.missed = 0
        self.last_input = 0.0
        self.accepted = False  # the monitor has taken it over from its set-up thread
        self.done = False


class Monitor:
    """The wake-up pipe, the ready set and the inbox from set-up threads."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._ready: set[Session] = set()
        self._inbox: list[Session | WorkerResult] = []
        self._signalled = False
        self._closed = False

    def _signal(self) -> None:
        # Set-up threads still connecting after an interrupt may post late: never write to a
        # closed (and possibly reused) descriptor.
        if not self._signalled and not self._closed:
            self._signalled = True
            with contextlib.suppress(BlockingIOError):
                os.write(self._write_fd, b"x")

    def wake(self) -> None:
        """Wake the monitor from a signal handler: no lock (the interrupted thread may hold
        it); a spare byte in the pipe is drained by the next take()."""
        if not self._closed:
            with contextlib.suppress(OSError):
                os.write(self._write_fd, b"x")

    def notify(self, session: Session) -> None:
        with self._lock:
            self._ready.add(session)
            self._signal()

    def post(self, item: Session | WorkerResult) -> None:
        with self._lock:
            self._inbox.append(item)
            self._signal()

    @property
    def fileno(self) -> int:
        return self._read_fd

    def take(self) -> tuple[list[Session | WorkerResult], set[Session]]:
        with self._lock:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read_fd, 4096):
                    pass
            self._signalled = False
            inbox, self._inbox = self._inbox, []
            ready, self._ready = self._ready, set()
        return inbox, ready

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)
