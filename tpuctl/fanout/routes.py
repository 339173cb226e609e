"""How a connection reaches a worker it cannot dial: through an IAP tunnel (one
`gcloud compute start-iap-tunnel` process per connection, its stdio the connection's byte
stream, as `gcloud … ssh --tunnel-through-iap` does with OpenSSH's ProxyCommand) or through a
bastion (one SSH connection to it, shared, and a `direct-tcpip` channel per worker, as
`ssh -J`; tpuctl.fanout.bastion). connection.connect() asks a route for the stream and speaks
SSH over it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

from tpuctl.errors import UsageError
from tpuctl.fanout.handshake import SetupError
from tpuctl.fanout.targets import WorkerTarget

if TYPE_CHECKING:
    pass

GCLOUD_ENV = "TPUCTL_GCLOUD"
# gcloud's own check on an instance name it puts in a ProxyCommand (ssh.py), plus: no leading
# '-', so a name can never be read as a flag.
_INSTANCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
STDERR_SAID = 500  # characters of a tunnel's stderr put in a worker's error
# What gcloud says when it has no credentials to open a tunnel with, or IAP refuses them
# (4033: the caller may not use IAP on that instance). No retry can change it.
_IAP_AUTH_FAILED = re.compile(
    r"gcloud auth login|active account|refreshing your current auth tokens|reauthentication"
    r"|could not load the default credentials|\b4033\b|not authorized",
    re.IGNORECASE,
)
TERMINATE_GRACE = 2.0  # seconds between SIGTERM and SIGKILL to a tunnel's process group


class Route(Protocol):
    """A way to a worker; `hold()` spans one fan-out (a bastion is opened at most once in it
    and closed at its end)."""

    def open(self, target: WorkerTarget, timeout: float) -> Any:
        """A socket-like byte stream to target's SSH port (paramiko's `sock`); SetupError."""
        ...

    def failure(self, stream: Any, wait: float) -> SetupError | None:
        """What the route knows of why `stream` broke (a tunnel's exit and stderr) as the
        worker's failure, or None."""
        ...

    def hold(self) -> contextlib.AbstractContextManager[None]: ...


# ------------------------------------------------------------------------------ IAP


def find_gcloud(environ: Mapping[str, str] | None = None) -> str:
    """The gcloud to run: $TPUCTL_GCLOUD (a path or a name on PATH), else `gcloud` on PATH."""
    env = os.environ if environ is None else environ
    configured = env.get(GCLOUD_ENV, "").strip()
    if configured:
        found = shutil.which(configured, path=env.get("PATH"))
        if found is None:
            raise UsageError(
                f"{GCLOUD_ENV}={configured!r} is not an executable program",
                hint=f"point {GCLOUD_ENV} at gcloud, or unset it to use the gcloud on PATH",
            )
        return found
    found = shutil.which("gcloud", path=env.get("PATH"))
    if found is None:
        raise UsageError(
            "--tunnel-through-iap runs `gcloud compute start-iap-tunnel`, and there is no "
            "gcloud on PATH",
            hint="install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), "
            f"or set {GCLOUD_ENV} to its path",
        )
    return found


def check_instance(name: str) -> str:
    if not _INSTANCE.match(name):
        raise SetupError("unreachable", f"refusing to tunnel to instance name {name!r}")
    return name


@dataclass(frozen=True)
class IapTunnel:
    """Each connection is the stdio of its own `gcloud compute start-iap-tunnel INSTANCE PORT
    --listen-on-stdin` (INSTANCE: the worker's `hostname` guest attribute), the command gcloud
    puts in OpenSSH's ProxyCommand, with the same flags.

    A tunnel refused for want of credentials (no gcloud login, an expired one, no IAP
    permission) fails its worker with `auth-failed` (exit 8), not retried; every later worker
    of the same fan-out fails the same way at once, without starting gcloud again.
    """

    gcloud: str
    project: str
    zone: str
    _refused: list[SetupError] = field(default_factory=list, compare=False, repr=False)

    def command(self, target: WorkerTarget) -> list[str]:
        return [
            self.gcloud,
            "compute",
            "start-iap-tunnel",
            check_instance(target.instance),
            str(target.port),
            "--listen-on-stdin",
            f"--project={self.project}",
            f"--zone={self.zone}",
            "--verbosity=warning",
        ]

    def open(self, target: WorkerTarget, timeout: float) -> TunnelStream:
        if self._refused:
            refused = self._refused[0]
            raise SetupError(refused.kind, str(refused), hint=refused.hint)
        return TunnelStream.start(self.command(target), f"{target.instance} port {target.port}")

    def failure(self, stream: Any, wait: float) -> SetupError | None:
        said = stream.failure(wait) if isinstance(stream, TunnelStream) else None
        if said is None:
            return None
        if stream.process.returncode and _IAP_AUTH_FAILED.search(said):
            refused = SetupError(
                "auth-failed",
                said,
                hint="gcloud has no usable credentials for IAP: run `gcloud auth login` (or "
                "activate a service account), and check that you may use IAP tunnels "
                "(roles/iap.tunnelResourceAccessor)",
            )
            self._refused[:1] = [refused]
            return refused
        return SetupError("unreachable", said, retryable=True)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """A refusal is remembered for one fan-out only: the next one (after a `gcloud auth
        login`, say, while `up` runs for hours) starts gcloud again."""
        try:
            yield
        finally:
            self._refused.clear()


class TunnelStream:
    """One tunnel process as paramiko's socket: what paramiko sends goes to the process's
    stdin, what it reads comes from its stdout; closing it ends and reaps the process.

    Two socket pairs, not one: gcloud makes its stdin non-blocking (iap_tunnel._StdinSocket),
    and stdin and stdout on one socket would share that flag, so a full buffer would break
    gcloud's writes to stdout. (OpenSSH gives a ProxyCommand two pipes for the same reason.)
    Sockets on our side give paramiko the timeouts it polls with; no thread pumps anything.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        to_process: socket.socket,
        from_process: socket.socket,
        stderr: IO[bytes],
        label: str,
    ) -> None:
        self.process = process
        self.label = label
        self._to = to_process
        self._from = from_process
        self._stderr = stderr
        self._lock = threading.Lock()
        self._is_closed = False
        self._said: str | None = None  # stderr's tail, kept once the file is closed

    @classmethod
    def start(cls, argv: list[str], label: str) -> TunnelStream:
        ours_in, their_in = socket.socketpair()
        ours_out, their_out = socket.socketpair()
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the stream
        try:
            # Its own session: the whole group (gcloud's shell wrapper, its Python) can be
            # ended at once, and a Ctrl-C at the terminal reaches tpuctl, not the tunnels.
            process = subprocess.Popen(
                argv,
                stdin=their_in.fileno(),
                stdout=their_out.fileno(),
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as error:
            for end in (ours_in, ours_out):
                end.close()
            stderr.close()
            raise SetupError(
                "unreachable", f"cannot start {argv[0]} for the IAP tunnel: {error}"
            ) from None
        finally:
            their_in.close()  # the child holds its ends; ours must go, or EOF never comes
            their_out.close()
        return cls(process, ours_in, ours_out, stderr, label)

    # -- what paramiko calls --------------------------------------------------------------
    def send(self, data: bytes) -> int:
        return self._to.send(data)

    def recv(self, size: int) -> bytes:
        return self._from.recv(size)

    def settimeout(self, timeout: float | None) -> None:
        self._to.settimeout(timeout)
        self._from.settimeout(timeout)

    def getpeername(self) -> tuple[str, int]:
        return (self.label, 0)

    @property
    def _closed(self) -> bool:  # paramiko's Transport.stop_thread reads it
        return self._is_closed

    def shutdown(self, how: int) -> None:
        for end in (self._to, self._from):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close our ends (the process reads EOF), then end its process group: SIGTERM,
        SIGKILL after TERMINATE_GRACE; the process is reaped before this returns."""
        with self._lock:
            if self._is_closed:
                return
            self._is_closed = True
        self.shutdown(socket.SHUT_RDWR)
        for end in (self._to, self._from):
            end.close()
        _end_group(self.process)
        self._said = self._read_stderr()
        self._stderr.close()

    # -- why it broke -------------------------------------------------------------------------
    def failure(self, wait: float) -> str | None:
        """The process's exit status and the last lines of its stderr (waiting up to `wait`
        seconds for it to exit: EOF comes as it dies); None when it says nothing."""
        code = self.process.poll()
        if code is None and wait > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(wait)
        said = self._said if self._said is not None else self._read_stderr()
        if code is None and not said:
            return None
        if code is None:
            state = "is still running"
        elif code < 0:
            state = f"was killed by signal {-code}"
        else:
            state = f"exited with {code}"
        return f"the IAP tunnel to {self.label} {state}" + (f": {said}" if said else "")

    def _read_stderr(self) -> str:
        try:
            self._stderr.seek(0)
            data = self._stderr.read()
        except (OSError, ValueError):
            return self._said or ""
        lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
        text = " | ".join(line for line in lines if line)
        return text if len(text) <= STDERR_SAID else "…" + text[-STDERR_SAID:]


def _end_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's group, SIGKILL if it lingers; reap the leader."""

    def signal_group(number: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, number)

    signal_group(signal.SIGTERM)  # the leader is unreaped, so its group id is still its own
    try:
        process.wait(TERMINATE_GRACE)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        process.wait()
