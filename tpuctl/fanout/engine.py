"""The fan-out scheduler: bounded connection set-up, one monitor for every running command.

- `batch_size` threads set connections up (TCP, handshake, host key, auth, channel, exec); a
  slot is released as soon as the command has started, so a long command on 1,024 workers
  starts everywhere (gcloud's batches deadlock there).
- One monitor (the calling thread) serves every running channel. paramiko's channel buffers
  call `.set()` on an event object when data, EOF or exit status arrive; tpuctl's event
  object marks the session ready and wakes the monitor through one pipe. No thread per worker,
  no polling per channel.
- Only set-up is retried; once the exec request is sent a worker is never retried.
- Ctrl-C (KeyboardInterrupt in the monitor) stops set-ups, signals running commands (attached
  mode) and returns a result where every unfinished worker is `interrupted`.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tpuctl.fanout.connection import (
    ConnectOptions,
    StartError,
    connect,
    encode_command,
    open_channel,
    start,
)
from tpuctl.fanout.handshake import SetupError, close_transport, send_keepalive, send_signal
from tpuctl.fanout.monitor import Monitor, Session, StatusEvent, Wake
from tpuctl.fanout.results import FanoutResult, Tail, WorkerResult
from tpuctl.fanout.targets import WorkerTarget

if TYPE_CHECKING:
    import paramiko

DEFAULT_BATCH_SIZE = 64
_READ = 65536
# The last word to a session being closed (timeout, Ctrl-C) waits this long for a key exchange
# to end rather than leave the remote command running.
_SIGNAL_WAIT = 1.0
# At Ctrl-C, how long the signalled commands get to end before their connections close: a
# connection closed at once can be reset before the worker's sshd has read the signal, which
# then never reaches the command.
_SIGNAL_GRACE = 2.0
FEED_CHUNK = 32768  # stdin (an upload's archive) goes out in slices of this many bytes
# The longest partial line held for line-wise output; longer ones go out in pieces, each
# ended by CUT_MARK (an ellipsis) so a reader sees the line was cut, not ended.
LINE_LIMIT = 65536
CUT_MARK = "\u2026\n".encode()

# (target, "stdout" | "stderr", complete lines as bytes)
OutputCallback = Callable[[WorkerTarget, str, bytes], None]
# (target, kind, message): kind is retry | started | finished
EventCallback = Callable[[WorkerTarget, str, str], None]
Command = str | Callable[[WorkerTarget], str]


@dataclass(frozen=True)
class FanoutOptions:
    batch_size: int = DEFAULT_BATCH_SIZE
    timeout: float | None = None  # per command, from its start
    stdin: bytes | None = None  # sent to every command, then EOF (None: EOF at once)
    keep_output: bool = False  # keep all stdout (probes parse it), not just the tail
    # on_output gets every chunk as it arrives (bytes: a download's archive), not whole lines
    raw_output: bool = False
    interrupt_signal: str | None = "TERM"  # sent to running commands on Ctrl-C


class FanOut:
    """Run one command on many workers; `run()` returns a FanoutResult in target order."""

    def __init__(
        self,
        targets: Sequence[WorkerTarget],
        command: Command,
        connect_options: ConnectOptions,
        options: FanoutOptions | None = None,
        *,
        on_output: OutputCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.targets = list(targets)
        self.command = command
        self.connect_options = connect_options
        self.options = options or FanoutOptions()
        self.on_output = on_output
        self.on_event = on_event
        self._monitor = Monitor()
        self._cancel = threading.Event()
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._results: dict[int, WorkerResult] = {}
        self._live: dict[int, Session] = {}
        self._connecting: set[Any] = set()
        self._connecting_lock = threading.Lock()
        # Targets whose command is being started (exec sent, the session not yet posted):
        # Ctrl-C waits for them, or their commands would run on unsignalled.
        self._starting: set[int] = set()
        self._sigint = threading.Event()  # Ctrl-C seen, for the monitor's next step
        self._index = {id(t): i for i, t in enumerate(self.targets)}
        self._setups_over = 0  # set-up outcomes accepted (a session, or a worker's result)
        self._commands: list[bytes] = []

    # -- set-up (batch_size threads) ----------------------------------------------------
    def _encode_commands(self) -> list[bytes]:
        """Every target's command as the bytes its shell gets; UsageError (a command too long
        to run) before any connection is made."""
        if not callable(self.command):
            return [encode_command(self.command)] * len(self.targets)
        return [encode_command(self.command(target)) for target in self.targets]

    def _setup_loop(self) -> None:
        while not self._cancel.is_set():
            try:
                index = self._queue.get_nowait()
            except queue.Empty:
                return
            target = self.targets[index]
            began = time.monotonic()
            try:
                outcome = self._setup(target, self._commands[index])
            except Exception as error:  # any failure is this worker's result
                # Never a dead set-up thread and a fan-out waiting for ever for its worker.
                outcome = self._failed(
                    WorkerResult(target, "unreachable", attempts=1),
                    began,
                    "unreachable",
                    f"SSH set-up failed: {type(error).__name__}: {error}",
                )
            self._monitor.post(outcome)
            with self._connecting_lock:
                self._starting.discard(index)
            if isinstance(outcome, Session):
                # Feeding stdin keeps this slot: transfers stay bounded by batch_size too.
                self._feed(outcome, self.options.stdin)

    def _setup(self, target: WorkerTarget, command: bytes) -> Session | WorkerResult:
        options = self.connect_options
        result = WorkerResult(target, "unreachable")
        began = time.monotonic()
        for attempt in range(1, max(1, options.connect_attempts) + 1):
            result.attempts = attempt
            if self._cancel.is_set():
                return self._interrupted(result, began, "interrupted before it started")
            try:
                transport = connect(target, options)
            except SetupError as error:
                if error.retryable and attempt < options.connect_attempts:
                    self._event(target, "retry", f"attempt {attempt}: {error}")
                    self._cancel.wait(options.retry_backoff * 2 ** (attempt - 1))
                    continue
                return self._failed(result, began, error.kind, str(error), error.hint)
            with self._connecting_lock:
                self._connecting.add(transport)
            try:
                outcome = self._open_and_start(target, transport, result, began, command)
            finally:
                with self._connecting_lock:
                    self._connecting.discard(transport)
            if isinstance(outcome, SetupError):
                if outcome.retryable and attempt < options.connect_attempts:
                    self._event(target, "retry", f"attempt {attempt}: {outcome}")
                    continue
                return self._failed(result, began, outcome.kind, str(outcome), outcome.hint)
            return outcome
        return result  # not reached: the last attempt returns

    def _open_and_start(
        self,
        target: WorkerTarget,
        transport: paramiko.Transport,
        result: WorkerResult,
        began: float,
        command: bytes,
    ) -> Session | WorkerResult | SetupError:
        try:
            channel = open_channel(transport, self.connect_options.connect_timeout)
        except SetupError as error:
            close_transport(transport)
            return error
        except BaseException:
            close_transport(transport)
            raise
        with self._connecting_lock:
            if self._cancel.is_set():
                close_transport(transport)
                return self._interrupted(result, began, "interrupted before it started")
            # From here Ctrl-C leaves this transport to the session the monitor will get.
            self._connecting.discard(transport)
            self._starting.add(self._index[id(target)])
        session = Session(result, transport, channel, began)
        wake = Wake(self._monitor, session)
        # Duck-typed: BufferedPipe only ever calls set() and clear() on its event.
        for buffer in (channel.in_buffer, channel.in_stderr_buffer):
            buffer.set_event(cast(Any, wake))
        channel.status_event = StatusEvent(wake)
        result.stdout = Tail(self.options.keep_output)
        try:
            start(channel, command)
        except StartError as error:
            close_transport(transport)
            result.started = True
            return self._failed(result, began, "unreachable", str(error))
        except BaseException:
            close_transport(transport)
            raise
        session.started = time.monotonic()
        result.started = True
        if self.options.timeout is not None:
            session.deadline = session.started + self.options.timeout
        return session

    def _feed(self, session: Session, data: bytes | None) -> None:
        """Send `data`, then EOF. Always EOF: a command that reads stdin (`head -c 10`, a
        shell script reading lines) would otherwise wait for input that never comes."""
        channel = session.channel
        try:
            offset = 0
            while data and offset < len(data):
                # Not channel.sendall: it re-slices what is left after every packet, copying
                # the rest each time (quadratic in the size, per worker).
                offset += channel.send(data[offset : offset + FEED_CHUNK])
            channel.shutdown_write()
        except Exception:
            pass  # the worker closed its stdin or the connection: its result says which

    def _failed(
        self, result: WorkerResult, began: float, kind: str, error: str, hint: str | None = None
    ) -> WorkerResult:
        result.status = kind  # type: ignore[assignment]
        result.error = error
        result.hint = hint
        result.duration_s = time.monotonic() - began
        return result

    def _interrupted(self, result: WorkerResult, began: float, error: str) -> WorkerResult:
        return self._failed(result, began, "interrupted", error)

    def _event(self, target: WorkerTarget, kind: str, message: str) -> None:
        if self.on_event is not None:
            self.on_event(target, kind, message)

    # -- monitor (the calling thread) ---------------------------------------------------
    def run(self) -> FanoutResult:
        began = time.monotonic()
        self._commands = self._encode_commands()
        for index in range(len(self.targets)):
            self._queue.put(index)
        threads = [
            threading.Thread(target=self._setup_loop, name=f"tpuctl-setup-{n}", daemon=True)
            for n in range(min(max(1, self.options.batch_size), len(self.targets)))
        ]
        route = self.connect_options.route
        interrupted = False
        # A bastion is opened by the first set-up that needs it and closed here, at the end.
        with route.hold() if route is not None else contextlib.nullcontext():
            for thread in threads:
                thread.start()
            try:
                with self._sigint_deferred():
                    self._loop()
            except KeyboardInterrupt:
                interrupted = True
                self._interrupt()
            finally:
                self._monitor.close()
                self._settle_pins()
        ordered = [
            self._results.get(i) or WorkerResult(t, "interrupted", error="not started")
            for i, t in enumerate(self.targets)
        ]
        return FanoutResult(ordered, time.monotonic() - began, interrupted)

    @contextlib.contextmanager
    def _sigint_deferred(self) -> Iterator[None]:
        """Ctrl-C wakes the monitor, which raises KeyboardInterrupt between two of its steps:
        raised anywhere, it could drop a session just taken from the inbox, whose command would
        then run on unsignalled. Only where Python's own handler is in place (main thread)."""

        def handler(signum: int, frame: Any) -> None:
            self._sigint.set()
            self._monitor.wake()

        previous: Any = None
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            try:
                previous = signal.signal(signal.SIGINT, handler)
            except ValueError:  # not the main thread: KeyboardInterrupt never comes here
                previous = None
        try:
            yield
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._monitor.fileno, selectors.EVENT_READ)
        keepalive = self.connect_options.keepalive
        next_tick = time.monotonic() + keepalive
        try:
            while len(self._results) < len(self.targets):
                if self._sigint.is_set():
                    raise KeyboardInterrupt
                now = time.monotonic()
                wait = next_tick - now
                deadlines = [s.deadline for s in self._live.values() if s.deadline is not None]
                if deadlines:
                    wait = min(wait, min(deadlines) - now)
                selector.select(max(0.0, wait))
                inbox, ready = self._monitor.take()
                for item in inbox:
                    self._accept(item)
                for session in ready:
                    if session.accepted and not session.done:
                        self._service(session)
                now = time.monotonic()
                self._check_deadlines(now)
                if now >= next_tick:
                    self._keepalive(now)
                    next_tick = now + keepalive
        finally:
            selector.close()

    def _settle_pins(self) -> None:
        """Write the host keys pinned while connecting, and say which were trusted on first
        use: once every worker's set-up is over, not when (maybe hours later) commands end."""
        pins = self.connect_options.pins
        if pins is not None:
            pins.settle()

    def _accept(self, item: Session | WorkerResult) -> None:
        self._setups_over += 1
        if self._setups_over == len(self.targets):
            self._settle_pins()
        if isinstance(item, WorkerResult):
            self._finish_result(item)
            return
        index = self._index[id(item.result.target)]
        self._live[index] = item
        item.accepted = True
        item.last_input = time.monotonic()
        self._event(item.result.target, "started", "")
        self._service(item)

    def _finish_result(self, result: WorkerResult) -> None:
        index = self._index[id(result.target)]
        self._results[index] = result
        self._live.pop(index, None)
        self._event(result.target, "finished", result.status)

    def _service(self, session: Session) -> None:
        channel = session.channel
        got = False
        while channel.recv_ready():
            data = channel.recv(_READ)
            if not data:
                break
            got = True
            self._output(session, "stdout", data)
        while channel.recv_stderr_ready():
            data = channel.recv_stderr(_READ)
            if not data:
                break
            got = True
            self._output(session, "stderr", data)
        if got:
            session.last_input = time.monotonic()
        status_known = channel.status_event.is_set()
        if channel.closed or (status_known and channel.eof_received):
            if channel.recv_ready() or channel.recv_stderr_ready():
                self._monitor.notify(session)  # more arrived meanwhile: come back
                return
            self._complete(session)

    def _output(self, session: Session, stream: str, data: bytes) -> None:
        result = session.result
        (result.stdout if stream == "stdout" else result.stderr).add(data)
        if self.options.raw_output and self.on_output is not None:
            self.on_output(result.target, stream, data)
            return
        if self.on_output is None:
            return
        # Whole lines go out; a partial one waits in `buffer`, which never grows past
        # LINE_LIMIT (a longer line goes out in pieces, each ended by CUT_MARK). Only the new
        # chunk is scanned, so a long line costs linear time.
        buffer = session.partial[stream]
        cut = data.rfind(b"\n")
        if cut >= 0:
            lines = bytes(buffer) + data[: cut + 1] if buffer else data[: cut + 1]
            buffer[:] = data[cut + 1 :]
            self.on_output(result.target, stream, lines)
        else:
            buffer += data
        while len(buffer) >= LINE_LIMIT:
            self.on_output(result.target, stream, bytes(buffer[:LINE_LIMIT]) + CUT_MARK)
            del buffer[:LINE_LIMIT]

    def _flush(self, session: Session) -> None:
        if self.on_output is None or self.options.raw_output:
            return
        for stream, buffer in session.partial.items():
            if buffer:
                self.on_output(session.result.target, stream, bytes(buffer) + b"\n")
                buffer.clear()

    def _complete(self, session: Session) -> None:
        if session.timed_out:  # it ended on the SIGTERM of its --timeout
            self._timed_out(session)
            return
        channel = session.channel
        result = session.result
        code = channel.exit_status
        if code >= 0:
            result.exit_code = code
            result.status = "ok" if code == 0 else "failed"
            if code != 0:
                result.error = f"exited with {code}"
        elif session.transport.is_active():
            result.status = "failed"
            result.error = "no exit status (killed by a signal?)"
        else:
            result.status = "unreachable"
            result.error = "connection lost while the command ran (not re-run)"
            said = self._route_failure(session)
            if said:
                result.error += f"; {said}"
        self._close(session)
        self._finish_result(result)

    def _route_failure(self, session: Session) -> str | None:
        """Why the route broke under a running command (a tunnel process that exited)."""
        route = self.connect_options.route
        if route is None:
            return None
        try:
            said = route.failure(session.transport.sock, 0.0)
        except Exception:
            return None
        return None if said is None else str(said)

    def _close(self, session: Session) -> None:
        session.done = True
        self._flush(session)
        session.result.duration_s = time.monotonic() - session.began
        close_transport(session.transport)

    def _check_deadlines(self, now: float) -> None:
        for session in list(self._live.values()):
            if session.deadline is not None and now >= session.deadline and not session.done:
                self._service(session)  # output that arrived just in time
                if session.done:
                    continue
                if not session.timed_out:
                    # SIGTERM, then the command gets a moment to end before the session closes
                    # (_complete sees it end; a connection closed at once may lose the signal).
                    session.timed_out = send_signal(session.channel, "TERM", wait=_SIGNAL_WAIT)
                    if session.timed_out:
                        session.deadline = now + _SIGNAL_GRACE
                        continue
                self._timed_out(session)

    def _timed_out(self, session: Session) -> None:
        sent = "sent SIGTERM" if session.timed_out else "SIGTERM could not be sent"
        session.result.status = "timeout"
        session.result.error = (
            f"still running after --timeout {self.options.timeout:g} s; {sent} "
            "and closed the session"
        )
        self._close(session)
        self._finish_result(session.result)

    def _keepalive(self, now: float) -> None:
        """A probe per quiet connection; `keepalive_count` unanswered ones mean it is lost."""
        limit = self.connect_options.keepalive_count
        for session in list(self._live.values()):
            if session.done:
                continue
            if session.probe is not None and not session.probe.is_set():
                session.missed += 1
                if session.missed >= limit:
                    self._lost(session, now)
                    continue
            else:
                session.missed = 0
                if now - session.last_input < self.connect_options.keepalive:
                    session.probe = None
                    continue
            probe = threading.Event()
            if send_keepalive(session.transport, probe):
                session.probe = probe

    def _lost(self, session: Session, now: float) -> None:
        waited = self.connect_options.keepalive * self.connect_options.keepalive_count
        session.result.status = "unreachable"
        session.result.error = (
            f"the worker stopped answering keepalives for {waited:g} s while the command ran "
            "(not re-run)"
        )
        self._close(session)
        self._finish_result(session.result)

    def _interrupt(self) -> None:
        with self._connecting_lock:
            self._cancel.set()
            connecting = list(self._connecting)
        for transport in connecting:
            close_transport(transport)
        _await(lambda: not self._starting, _SIGNAL_GRACE)  # commands being started: signal them too
        inbox, _ = self._monitor.take()
        for item in inbox:
            if isinstance(item, WorkerResult):
                self._finish_result(item)
            else:
                self._live[self._index[id(item.result.target)]] = item
        signal_name = self.options.interrupt_signal
        running = [session for session in self._live.values() if not session.done]
        signalled = [
            s for s in running if signal_name and send_signal(s.channel, signal_name, _SIGNAL_WAIT)
        ]
        _await(lambda: all(s.channel.exit_status_ready() for s in signalled), _SIGNAL_GRACE)
        for session in running:
            session.result.status = "interrupted"
            session.result.error = "still running at Ctrl-C" + (
                ""
                if not signal_name
                else f"; sent SIG{signal_name} and closed the session"
                if session in signalled
                else f"; SIG{signal_name} could not be sent, closed the session"
            )
            self._close(session)
            self._finish_result(session.result)


def _await(done: Callable[[], bool], grace: float) -> None:
    """Wait up to `grace` s for `done()` (commands ending, set-ups handing over) at Ctrl-C."""
    deadline = time.monotonic() + grace
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)


def run_fanout(
    targets: Sequence[WorkerTarget],
    command: Command,
    connect_options: ConnectOptions,
    options: FanoutOptions | None = None,
    *,
    on_output: OutputCallback | None = None,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """Run `command` (a string, or one per target) on every target; see FanOut."""
    return FanOut(
        targets, command, connect_options, options, on_output=on_output, on_event=on_event
    ).run()
