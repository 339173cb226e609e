"""An interactive shell on one worker: a pty, the local terminal in raw mode, window resizes."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from collections.abc import Iterator
from typing import Any

from tpuctl.errors import UnreachableError
from tpuctl.fanout.connection import (
    ConnectOptions,
    SetupError,
    StartError,
    close_transport,
    connect,
    open_channel,
    start,
)
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
) -> int:
    """Open a login shell on `target` with the local terminal attached; its exit status."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    try:
        transport = connect(target, options)
        width, height = _terminal_size(out_fd)
        term = os.environ.get("TERM", "xterm-256color")
        channel = open_channel(transport, options.connect_timeout, pty=(term, width, height))
    except SetupError as error:
        raise UnreachableError(
            f"worker {target.label}: {error}", worker=target.label, status=error.kind
        ) from None
    try:
        start(channel, None)
    except StartError as error:
        close_transport(transport)
        raise UnreachableError(f"worker {target.label}: {error}") from None

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
