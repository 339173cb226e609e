"""The SSH server of one emulated worker: asyncssh in-process, or a real OpenSSH sshd."""

from __future__ import annotations

import asyncio
import contextlib
import errno
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

from tpuctl.emulator import vm

_READ_CHUNK = 64 * 1024
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
_SETSID = shutil.which("setsid") or "/usr/bin/setsid"
# sshd accepts these from clients on Ubuntu TPU images (AcceptEnv LANG LC_*).
_ACCEPTED_ENV = re.compile(r"^(LANG|LC_[A-Z_]+)$")


def valid_user(user: str) -> bool:
    return bool(_USER_RE.match(user)) and user not in (".", "..")


def parse_ssh_keys(text: str) -> dict[str, list[str]]:
    """`ssh-keys` metadata → {user: [public key lines]}; malformed lines are skipped."""
    keys: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        user, sep, key = line.partition(":")
        if not sep or not valid_user(user) or not key.strip():
            continue
        try:
            asyncssh.import_authorized_keys(key.strip())
        except (asyncssh.KeyImportError, ValueError):
            continue
        keys.setdefault(user, []).append(key.strip())
    return keys


def authorized_keys(lines: list[str]) -> asyncssh.SSHAuthorizedKeys:
    return asyncssh.import_authorized_keys("\n".join(lines) + "\n")


def generate_host_key() -> tuple[asyncssh.SSHKey, str]:
    """A fresh ed25519 host key and its public line "ssh-ed25519 AAAA…"."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key("openssh").decode().split()
    return key, f"{public[0]} {public[1]}"


async def server_options() -> asyncssh.SSHServerConnectionOptions:
    """Options shared by every worker listener; each adds only its own host key."""
    placeholder = asyncssh.generate_private_key("ssh-ed25519")
    options: asyncssh.SSHServerConnectionOptions = (
        await asyncssh.SSHServerConnectionOptions.construct(
            config=None,
            server_host_keys=[placeholder],
            encoding=None,
            password_auth=False,
            kbdint_auth=False,
            gss_host=None,
            x11_forwarding=False,
            agent_forwarding=False,
            allow_scp=False,
            line_editor=False,  # the pty is a real one; the process does its own line editing
        )
    )
    return options


class SessionHost(Protocol):
    """What an SSH server needs to know about the worker it serves."""

    def authorized_keys(self, user: str) -> asyncssh.SSHAuthorizedKeys | None: ...

    def session_env(self, user: str) -> tuple[Path, dict[str, str]]:
        """The user's home (created if missing) and the base environment of a session."""
        ...


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


class _WorkerSession(asyncssh.SSHServerSession[bytes]):
    """One session channel: a real process with pipes (or a pty), signals and exit status.

    Output is pumped from non-blocking fds with loop readers, so a thousand sessions cost no
    threads; readers are removed while the channel is paused (flow control) or the worker
    is "hung".
    """

    def __init__(self, endpoint: AsyncSshEndpoint, conn: asyncssh.SSHServerConnection) -> None:
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
        if os.access(SFTP_SERVER, os.X_OK):
            # OpenSSH's own sftp-server as a worker process: its exact protocol extensions,
            # and an exit status at the end (OpenSSH's scp checks it).
            self._subsystem = [SFTP_SERVER]
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


class _WorkerServer(asyncssh.SSHServer):
    def __init__(self, endpoint: AsyncSshEndpoint) -> None:
        self._endpoint = endpoint
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._endpoint.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._endpoint.connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        keys = self._endpoint.host.authorized_keys(username) if valid_user(username) else None
        if keys is not None and self._conn is not None:
            self._conn.set_authorized_keys(keys)
        return True

    def session_requested(self) -> _WorkerSession:
        assert self._conn is not None
        return _WorkerSession(self._endpoint, self._conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        return True  # local port forwarding, allowed by a default sshd (TensorBoard tunnels)


class _SilentProtocol(asyncio.Protocol):
    """A hung worker: the kernel accepts the TCP connection, nothing ever answers."""

    def __init__(self, endpoint: AsyncSshEndpoint) -> None:
        self._endpoint = endpoint
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._endpoint.silent.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._endpoint.silent.discard(self._transport)


def _connection_transport(conn: asyncssh.SSHServerConnection) -> asyncio.Transport | None:
    # asyncssh has no public pause for a whole connection; a hang must stop answering
    # keepalives on connections that already exist, so reach for the transport.
    transport = getattr(conn, "_transport", None)
    return transport if isinstance(transport, asyncio.Transport) else None


class AsyncSshEndpoint:
    """An in-process asyncssh server for one worker, with hang/refuse faults."""

    def __init__(
        self,
        host: SessionHost,
        *,
        ip: str,
        port: int,
        host_key: asyncssh.SSHKey,
        options: asyncssh.SSHServerConnectionOptions,
        reaper: vm.ChildReaper,
    ) -> None:
        self.host = host
        self.reaper = reaper
        self.ip = ip
        self.port = port
        self._host_key = host_key
        self._options = options
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._silent_server: asyncio.Server | None = None
        self.fault: str | None = None
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self.sessions: set[_WorkerSession] = set()
        self.silent: set[asyncio.BaseTransport] = set()

    @property
    def hung(self) -> bool:
        return self.fault == "hang"

    async def start(self) -> None:
        self._acceptor = await asyncssh.listen(
            self.ip,
            self.port,
            options=self._options,
            config=None,
            server_host_keys=[self._host_key],
            server_factory=lambda: _WorkerServer(self),
            reuse_address=True,
        )

    async def _stop_listening(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        if self._silent_server is not None:
            self._silent_server.close()
            self._silent_server = None
        for transport in list(self.silent):
            transport.close()
        self.silent.clear()

    async def set_fault(self, mode: str | None) -> None:
        if mode == self.fault:
            return
        await self._stop_listening()
        self.fault = mode
        for conn in list(self.connections):
            transport = _connection_transport(conn)
            if transport is not None and not transport.is_closing():
                if mode == "hang":
                    transport.pause_reading()
                else:
                    transport.resume_reading()
        for session in list(self.sessions):
            session.set_hung()
        if mode is None:
            await self.start()
        elif mode == "hang":
            loop = asyncio.get_running_loop()
            self._silent_server = await loop.create_server(
                lambda: _SilentProtocol(self), self.ip, self.port, reuse_address=True
            )

    def drop_connections(self) -> None:
        """The VM went down: every TCP connection to it is gone."""
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()

    async def close(self) -> None:
        await self._stop_listening()
        self.drop_connections()


# -- OpenSSH ----------------------------------------------------------------------------

# sshd starts sessions in the OS user's passwd home with HOME set from SetEnv. HOME points
# at this shim directory: bash sources its .bashrc (`bash -c` run by sshd) or .bash_profile
# (login shells), which move to the worker's home and hand over to the user's own files. No
# ForceCommand: sshd refuses signal requests for forced-command sessions.
_SHIM_ENTER = """\
# tpuctl emulator: enter this worker's home instead of the OS user's.
export HOME="$TPUCTL_VM_ROOT/home/$USER"
mkdir -p "$HOME" && cd "$HOME"
"""
SHIM_FILES = {
    ".bashrc": _SHIM_ENTER + '[ -f "$HOME/.bashrc" ] && . "$HOME/.bashrc"\n',
    ".bash_profile": _SHIM_ENTER
    + "for profile in .bash_profile .bash_login .profile; do\n"
    + '  if [ -f "$HOME/$profile" ]; then . "$HOME/$profile"; break; fi\n'
    + "done\n",
}


def write_shim_home(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in SHIM_FILES.items():
        (directory / name).write_text(text)


def _quote_config(value: str) -> str:
    if any(c in value for c in '"\n'):
        raise ValueError(f"cannot put {value!r} in sshd_config")
    return f'"{value}"'


class OpenSshEndpoint:
    """A real /usr/sbin/sshd for one worker, with its own config, host key and keys files.

    sshd only logs in users that exist on this machine, and runs sessions as that user;
    tests use the current OS user.
    """

    def __init__(
        self,
        *,
        ip: str,
        port: int,
        host_key: asyncssh.SSHKey,
        workdir: Path,
        session_env: Mapping[str, str],
        shim_home: Path,
        homes: Path,
        sshd: str = "/usr/sbin/sshd",
    ) -> None:
        self.ip = ip
        self.port = port
        self.workdir = workdir
        self._host_key = host_key
        self._session_env = dict(session_env)
        self._shim_home = shim_home
        self._homes = homes
        self._sshd = sshd
        self._proc: subprocess.Popen[bytes] | None = None
        self.fault: str | None = None

    def write_authorized_keys(self, keys: Mapping[str, list[str]]) -> None:
        """One file per user (regenerated on every metadata change), and their homes.

        The guest agent creates an account with a home when a key is published; here that
        lets sftp-server start in it before any shell has run.
        """
        for user in keys:
            (self._homes / user).mkdir(parents=True, exist_ok=True)
        directory = self.workdir / "authorized_keys"
        directory.mkdir(parents=True, exist_ok=True)
        for existing in directory.iterdir():
            if existing.name not in keys and not existing.name.endswith(".tmp"):
                existing.unlink(missing_ok=True)
        for user, lines in keys.items():
            tmp = directory / f"{user}.tmp"
            tmp.write_text("".join(line + "\n" for line in lines))
            tmp.replace(directory / user)

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        key_path = self.workdir / "ssh_host_ed25519_key"
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(self._host_key.export_private_key("openssh"))
        env = {**self._session_env, "HOME": str(self._shim_home)}
        setenv = " ".join(f"{key}={_quote_config(value)}" for key, value in sorted(env.items()))
        config = f"""\
ListenAddress {self.ip}:{self.port}
HostKey {key_path}
PidFile {self.workdir / "sshd.pid"}
AuthorizedKeysFile {self.workdir / "authorized_keys"}/%u
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
AcceptEnv LANG LC_*
Subsystem sftp {SFTP_SERVER} -d {self._homes}/%u
SetEnv {setenv}
"""
        path = self.workdir / "sshd_config"
        path.write_text(config)
        return path

    async def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege separation
        config = self._write_config()
        log = open(self.workdir / "sshd.log", "ab")  # noqa: SIM115 - sshd owns it from here
        try:
            self._proc = subprocess.Popen(
                [self._sshd, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        """Until sshd sends its banner; fails with sshd's own log if it exits."""
        assert self._proc is not None
        for _ in range(200):
            if self._proc.poll() is not None:
                log = (self.workdir / "sshd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sshd for {self.ip}:{self.port} exited: {log}")
            try:
                reader, writer = await asyncio.open_connection(self.ip, self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            try:
                banner = await asyncio.wait_for(reader.readline(), 5)
            finally:
                writer.close()
            if banner.startswith(b"SSH-"):
                return
            await asyncio.sleep(0.02)
        raise RuntimeError(f"sshd for {self.ip}:{self.port} did not start")

    def _sshd_pids(self) -> list[int]:
        """The listener and its per-connection children (not the user's processes)."""
        if self._proc is None:
            return []
        pids = [self._proc.pid]
        for pid in vm.descendants(self._proc.pid):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name.startswith("sshd"):
                pids.append(pid)
        return pids

    async def _stop_sshd(self) -> None:
        if self._proc is None:
            return
        vm.signal_pids(self._sshd_pids()[:1], signal.SIGCONT)
        vm.signal_pids([self._proc.pid], signal.SIGTERM)
        for _ in range(250):
            if self._proc.poll() is not None:
                break
            await asyncio.sleep(0.02)
        else:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    async def set_fault(self, mode: str | None) -> None:
        if mode == self.fault:
            return
        previous, self.fault = self.fault, mode
        if previous == "hang" and self._proc is not None:
            vm.signal_pids([self._proc.pid], signal.SIGCONT)
        if mode == "hang":
            if self._proc is None:
                await self.start()
            # A stopped sshd: the kernel still completes handshakes into the backlog, but
            # nobody sends a banner.
            vm.signal_pids([self._proc.pid] if self._proc else [], signal.SIGSTOP)
        elif mode == "refuse":
            await self._stop_sshd()
        elif self._proc is None:
            await self.start()

    def drop_connections(self) -> None:
        if self._proc is not None:
            vm.signal_pids(self._sshd_pids()[1:], signal.SIGKILL)

    async def close(self) -> None:
        self.drop_connections()
        await self._stop_sshd()


Endpoint = AsyncSshEndpoint | OpenSshEndpoint


def is_address_in_use(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
