"""A shell on one worker: at a terminal, interactive (a pty, the local terminal in raw mode,
window resizes); otherwise a shell reading local stdin (a script) until EOF, with no pty."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from tpuctl.errors import AuthError, UnreachableError
from tpuctl.fanout.connection import ConnectOptions, StartError, connect, open_channel, start
from tpuctl.fanout.handshake import AUTH_KINDS, SetupError, close_transport
from tpuctl.fanout.targets import WorkerTarget


def _terminal_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return size.columns, size.lines


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """Raw mode while the shell runs (Ctrl-C goes to the worker), restored whatever happens."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def interactive_shell(
    target: WorkerTarget,
    options: ConnectOptions,
    *,
    stdin_fd: int | None = None,
    stdout_fd: int | None = None,
    stderr_fd: int | None = None,
) -> int:
    """Open a login shell on `target`; its exit status. With stdin a terminal, the terminal is
    attached through a pty. Otherwise no pty is asked for (as `ssh host < script.sh`): local
    stdin is forwarded until EOF, then the shell's stdin is closed, so it runs what it read
    and ends; its stdout and stderr stay apart."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    err_fd = sys.stderr.fileno() if stderr_fd is None else stderr_fd
    route = options.route
    # A bastion opened for this shell is closed when it ends.
    with route.hold() if route is not None else contextlib.nullcontext():
        return _shell(target, options, in_fd, out_fd, err_fd)


def _shell(
    target: WorkerTarget, options: ConnectOptions, in_fd: int, out_fd: int, err_fd: int
) -> int:
    terminal = os.isatty(in_fd)
    try:
        transport = connect(target, options)
        if options.pins is not None:
            options.pins.settle()  # pinned now, not when (maybe hours later) the shell ends
        width, height = _terminal_size(out_fd)
        term = os.environ.get("TERM", "xterm-256color")
        pty = (term, width, height) if terminal else None
        channel = open_channel(transport, options.connect_timeout, pty=pty)
    except SetupError as error:
        # A refused host key is an authentication failure (exit 8), as in a fan-out.
        kind = AuthError if error.kind in AUTH_KINDS else UnreachableError
        raise kind(
            f"worker {target.label}: {error}",
            hint=error.hint,
            worker=target.label,
            status=error.kind,
        ) from None
    try:
        start(channel, None)
    except StartError as error:
        close_transport(transport)
        raise UnreachableError(f"worker {target.label}: {error}") from None
    if not terminal:
        try:
            return _piped(channel, in_fd, out_fd, err_fd)
        finally:
            close_transport(transport)

    def resize(_signum: int, _frame: Any) -> None:
        with contextlib.suppress(Exception):
            channel.resize_pty(*_terminal_size(out_fd))

    previous = signal.signal(signal.SIGWINCH, resize)
    try:
        with _raw(in_fd):
            _pump(channel, in_fd, out_fd)
        return channel.recv_exit_status()
    finally:
        signal.signal(signal.SIGWINCH, previous)
        close_transport(transport)


def _piped(channel: Any, in_fd: int, out_fd: int, err_fd: int) -> int:
    """Forward stdin (a thread: sending may wait for the worker's window while its output must
    still be read here) and copy stdout and stderr until the worker's EOF; the exit status."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what tpuctl printed comes before what the shell prints
    forwarder = threading.Thread(
        target=_forward, args=(channel, in_fd), name="tpuctl-stdin", daemon=True
    )
    forwarder.start()
    while True:
        # The channel's fd is readable when stdout or stderr data, EOF or a close arrives.
        select.select([channel], [], [])
        while channel.recv_ready():
            _write_all(out_fd, channel.recv(65536))
        while channel.recv_stderr_ready():
            _write_all(err_fd, channel.recv_stderr(65536))
        ended = channel.eof_received or channel.closed
        if ended and not (channel.recv_ready() or channel.recv_stderr_ready()):
            break
    # A shell that ended before its stdin did (`exit` early) leaves the forwarder blocked on
    # a read; it is a daemon thread and goes with the process.
    return int(channel.recv_exit_status())


def _forward(channel: Any, in_fd: int) -> None:
    """Local stdin to the channel until EOF, then EOF to the worker."""
    try:
        while data := os.read(in_fd, 65536):
            channel.sendall(data)
        channel.shutdown_write()
    except Exception:
        # The shell ended or the connection dropped: the reading side reports it, and a
        # thread must not print a traceback over the shell's output.
        return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(channel: Any, in_fd: int, out_fd: int) -> None:
    stdin_open = True
    while True:
        readers = [channel] + ([in_fd] if stdin_open else [])
        try:
            ready, _, _ = select.select(readers, [], [], 1.0)
        except InterruptedError:  # SIGWINCH
            continue
        if channel in ready:
            data = channel.recv(65536)
            if not data:
                return
            os.write(out_fd, data)
        if in_fd in ready:
            data = os.read(in_fd, 4096)
            if data:
                channel.sendall(data)
            else:
                stdin_open = False
                channel.shutdown_write()
        if channel.exit_status_ready() and not channel.recv_ready():
            return
