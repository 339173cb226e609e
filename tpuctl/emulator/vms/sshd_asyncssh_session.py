"""One session channel of the asyncssh server: a real process, its signals and exit status.

Pipes or a pty, and SFTP (OpenSSH's sftp-server as a process, or asyncssh's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import struct
import subprocess
import termios
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import asyncssh
from asyncssh import DataType
from asyncssh.channel import SSHChannel

from tpuctl.emulator.vms import sshd, vm

_READ_CHUNK = 64 * 1024
_SETSID = shutil.which("setsid") or "/usr/bin/setsid"
# sshd accepts these from clients on Ubuntu TPU images (AcceptEnv LANG LC_*).
_ACCEPTED_ENV = re.compile(r"^(LANG|LC_[A-Z_]+)$")


class SessionHome(Protocol):
    """What a session needs from its worker (part of sshd_asyncssh.SessionHost)."""

    def session_env(self, user: str) -> tuple[Path, dict[str, str]]: ...


class SessionEndpoint(Protocol):
    """What a session needs from the server that accepted it (sshd_asyncssh.AsyncSshEndpoint),
    as a Protocol so that this module does not import sshd_asyncssh.py, which imports it."""

    @property
    def host(self) -> SessionHome: ...

    @property
    def ip(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def reaper(self) -> vm.ChildReaper: ...

    @property
    def sessions(self) -> set[WorkerSession]: ...

    @property
    def hung(self) -> bool: ...


class _HomeSFTPServer(asyncssh.SFTPServer):
    """Real filesystem paths, with relative ones resolved in the user's worker home."""

    def __init__(self, chan: asyncssh.SSHServerChannel[bytes], home: Path) -> None:
        super().__init__(chan)
        self._home = os.fsencode(home)

    def map_path(self, path: bytes) -> bytes:
        return path if path.startswith(b"/") else os.path.join(self._home, path)


def _set_window(fd: int, size: tuple[int, int, int, int]) -> None:
    width, height, pixwidth, pixheight = size
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))


class WorkerSession(asyncssh.SSHServerSession[bytes]):
    """One session channel: a real process with pipes (or a pty), signals and exit status.

    Output is pumped from non-blocking fds with loop readers, so a thousand sessions cost no
    threads; readers are removed while the channel is paused (flow control) or the worker
    is "hung".
    """

    def __init__(self, endpoint: SessionEndpoint, conn: asyncssh.SSHServerConnection) -> None:
        self._endpoint = endpoint
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._pty: tuple[str, tuple[int, int, int, int]] | None = None
        self._sftp: Any = None  # asyncssh's stream session, when this is an SFTP subsystem
        self._subsystem: list[str] | None = None  # argv of a subsystem run as a process
        self._proc: subprocess.Popen[bytes] | None = None
        self._master: int | None = None  # pty master
        self._outputs: dict[int, DataType] = {}  # open output fd → SSH data type
        self._reading: set[int] = set()
        self._stdin: int | None = None
        self._stdin_buffer = bytearray()
        self._stdin_eof = False
        self._stdin_waiting = False
        self._write_paused = False
        self._returncode: int | None = None
        self._closed = False

    # -- channel set-up ----------------------------------------------------------------
    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Mapping[int, int]
    ) -> bool:
        self._pty = (term_type or "xterm", term_size)
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp" or self._chan is None:
            return False
        if os.access(sshd.SFTP_SERVER, os.X_OK):
            # OpenSSH's own sftp-server as a worker process: its exact protocol extensions,
            # and an exit status at the end (OpenSSH's scp checks it).
            self._subsystem = [sshd.SFTP_SERVER]
            return True
        user = str(self._conn.get_extra_info("username"))
        home, _ = self._endpoint.host.session_env(user)
        # Without it, asyncssh's own stream session runs SFTP; this session only forwards.
        from asyncssh.stream import SSHServerStreamSession

        def factory(chan: SSHChannel[bytes]) -> asyncssh.SFTPServer:
            assert isinstance(chan, asyncssh.SSHServerChannel)
            return _HomeSFTPServer(chan, home)

        self._sftp = SSHServerStreamSession(None, factory, sftp_version=3)
        self._sftp.connection_made(self._chan)
        return bool(self._sftp.subsystem_requested(subsystem))

    def session_started(self) -> None:
        if self._sftp is not None:
            self._sftp.session_started()
            return
        assert self._chan is not None
        try:
            self._spawn(self._chan)
        except OSError as exc:
            self._chan.write_stderr(f"tpuctl emulator: cannot start session: {exc}\r\n".encode())
            self._chan.exit(255)
            return
        self._endpoint.sessions.add(self)
        self._update_readers()

    def _spawn(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        user = str(self._conn.get_extra_info("username"))
        home, env = self._endpoint.host.session_env(user)
        peer_host, peer_port = self._conn.get_extra_info("peername")[:2]
        env["SSH_CLIENT"] = f"{peer_host} {peer_port} {self._endpoint.port}"
        env["SSH_CONNECTION"] = f"{peer_host} {peer_port} {self._endpoint.ip} {self._endpoint.port}"
        env.update({k: v for k, v in chan.get_environment().items() if _ACCEPTED_ENV.match(k)})
        command = chan.get_command()
        if self._subsystem is not None:
            self._spawn_pipes(self._subsystem, home, env)
        elif self._pty is not None:
            self._spawn_pty(command, home, env)
        else:
            # sshd runs `$SHELL -c command`, or a login shell reading stdin when there is none.
            self._spawn_pipes([vm.BASH, "-c", command] if command else ["-bash"], home, env)
        assert self._proc is not None
        self._endpoint.reaper.watch(self._proc, self._on_exit)

    def _spawn_pipes(self, argv: list[str], home: Path, env: dict[str, str]) -> None:
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._proc = subprocess.Popen(
                argv,
                executable=vm.BASH if argv[0] == "-bash" else argv[0],
                stdin=stdin_r,
                stdout=out_w,
                stderr=err_w,
                cwd=home,
                env=env,
                start_new_session=True,
            )
        except OSError:
            for fd in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        for fd in (stdin_w, out_r, err_r):
            os.set_blocking(fd, False)
        self._stdin = stdin_w
        self._outputs = {out_r: None, err_r: asyncssh.EXTENDED_DATA_STDERR}

    def _spawn_pty(self, command: str | None, home: Path, env: dict[str, str]) -> None:
        assert self._pty is not None
        term_type, size = self._pty
        master, slave = os.openpty()
        _set_window(slave, size)
        env["TERM"] = term_type
        env["SSH_TTY"] = os.ttyname(slave)
        # `setsid -c` makes the pty the controlling terminal of a new session without a
        # preexec_fn (which would force fork() instead of vfork() in this threaded process).
        shell = [vm.BASH, "-c", command] if command is not None else [vm.BASH, "-l"]
        try:
            self._proc = subprocess.Popen(
                [_SETSID, "-c", *shell], stdin=slave, stdout=slave, stderr=slave, cwd=home, env=env
            )
        except OSError:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._master = master
        self._stdin = master
        self._outputs = {master: None}

    # -- output ------------------------------------------------------------------------
    def _update_readers(self) -> None:
        active = not (self._write_paused or self._endpoint.hung or self._closed)
        for fd in list(self._outputs):
            if active and fd not in self._reading:
                self._loop.add_reader(fd, self._on_output, fd)
                self._reading.add(fd)
            elif not active and fd in self._reading:
                self._loop.remove_reader(fd)
                self._reading.discard(fd)

    def _on_output(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # EIO: every holder of the pty slave has closed it
        if data and self._chan is not None and not self._closed:
            self._chan.write(data, self._outputs[fd])
            return
        self._close_output(fd)
        self._maybe_finish()

    def _close_output(self, fd: int) -> None:
        if fd in self._reading:
            self._loop.remove_reader(fd)
            self._reading.discard(fd)
        if fd in self._outputs:
            del self._outputs[fd]
            if fd != self._master:
                os.close(fd)

    def pause_writing(self) -> None:
        if self._sftp is not None:
            self._sftp.pause_writing()
        self._write_paused = True
        self._update_readers()

    def resume_writing(self) -> None:
        if self._sftp is not None:
            self._sftp.resume_writing()
        self._write_paused = False
        self._update_readers()

    def set_hung(self) -> None:
        """Called by the endpoint when its fault changes: stop or restart the output."""
        self._update_readers()
        self._maybe_finish()

    # -- input -------------------------------------------------------------------------
    def data_received(self, data: bytes, datatype: DataType) -> None:
        if self._sftp is not None:
            self._sftp.data_received(data, datatype)
            return
        if self._stdin is None:
            return
        self._stdin_buffer += data
        self._flush_stdin()

    def _flush_stdin(self) -> None:
        fd = self._stdin
        if fd is None:
            return
        while self._stdin_buffer:
            try:
                written = os.write(fd, self._stdin_buffer)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: the process stopped reading; sshd drops the data too
                self._stdin_buffer.clear()
                self._close_stdin()
                return
            del self._stdin_buffer[:written]
        if self._stdin_buffer:
            if not self._stdin_waiting:
                self._stdin_waiting = True
                self._loop.add_writer(fd, self._flush_stdin)
                if self._chan is not None:
                    self._chan.pause_reading()
            return
        was_waiting, self._stdin_waiting = self._stdin_waiting, False
        if was_waiting:
            self._loop.remove_writer(fd)
        if self._stdin_eof:
            self._close_stdin()
        elif was_waiting and self._chan is not None and not self._closed:
            # Last, because resuming delivers queued data and EOF re-entrantly.
            self._chan.resume_reading()

    def _close_stdin(self) -> None:
        fd, self._stdin = self._stdin, None
        if fd is None:
            return
        if self._stdin_waiting:
            self._stdin_waiting = False
            self._loop.remove_writer(fd)
        if fd != self._master:
            os.close(fd)

    def eof_received(self) -> bool:
        if self._sftp is not None:
            return bool(self._sftp.eof_received())
        # A pty has no half-close; sshd ignores EOF there too.
        if self._master is None:
            self._stdin_eof = True
            self._flush_stdin()
        return True  # keep the channel half-open: output still flows after stdin ends

    def signal_received(self, signal_name: str) -> None:
        if self._sftp is not None or self._proc is None or self._returncode is not None:
            return
        signum = getattr(signal, f"SIG{signal_name.upper()}", None)
        if isinstance(signum, signal.Signals):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signum)

    def break_received(self, msec: int) -> bool:
        if self._master is not None:
            with contextlib.suppress(OSError):
                termios.tcsendbreak(self._master, 0)
            return True
        return False

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self._master is not None:
            _set_window(self._master, (width, height, pixwidth, pixheight))

    # -- exit --------------------------------------------------------------------------
    def _on_exit(self, returncode: int) -> None:
        self._returncode = returncode
        if self._master is not None and self._master in self._outputs:
            # A pty session ends with its process (sshd does the same): take what is
            # buffered, then closing the master hangs up whatever still holds the tty.
            self._drain_pty()
        self._maybe_finish()

    def _drain_pty(self) -> None:
        assert self._master is not None
        while self._chan is not None and not self._closed and not self._endpoint.hung:
            try:
                data = os.read(self._master, _READ_CHUNK)
            except OSError:
                break
            if not data:
                break
            self._chan.write(data)
        self._close_output(self._master)

    def _maybe_finish(self) -> None:
        if self._returncode is None or self._outputs or self._closed or self._endpoint.hung:
            return
        chan = self._chan
        code = self._returncode
        self._cleanup()
        if chan is None:
            return
        with contextlib.suppress(OSError):
            if code >= 0:
                chan.exit(code)
            else:
                try:
                    name = signal.Signals(-code).name[3:]
                except ValueError:
                    name = "KILL"
                chan.exit_with_signal(name)

    def _cleanup(self) -> None:
        self._closed = True
        for fd in list(self._outputs):
            self._close_output(fd)
        self._close_stdin()
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None
        self._endpoint.sessions.discard(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sftp is not None:
            self._sftp.connection_lost(exc)
        # Like sshd without a pty, the process keeps running; it sees EOF on stdin and
        # EPIPE on output. With a pty, closing the master sends it SIGHUP.
        self._cleanup()
        self._chan = None
