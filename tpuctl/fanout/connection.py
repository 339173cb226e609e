"""One SSH connection to one worker with paramiko: connect, verify the host key, auth, exec.

Set-up is split from running on purpose: `connect()` may be retried (nothing ran yet);
`start()` sends the exec request, after which the command may be running and is never retried.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.fanout.handshake import (
    SetupError,
    close_transport,
    handshake,
    new_transport,
)
from tpuctl.fanout.imports import load_paramiko
from tpuctl.fanout.known_hosts import (
    HostKeyPins,
    Pin,
    fingerprint,
    forget_command,
    host_alias,
    same_key,
)
from tpuctl.fanout.targets import WorkerTarget

if TYPE_CHECKING:
    import paramiko

    from tpuctl.fanout.routes import Route

# How long a failed set-up waits for a route's process to say why (it is exiting).
ROUTE_FAILURE_WAIT = 1.0
# The longest command a worker can run: its SSH server execs `$SHELL -c COMMAND`, and Linux
# refuses any one argument longer than MAX_ARG_STRLEN (32 pages: 131,072 bytes with its NUL).
COMMAND_LIMIT = 131071
# A worker's SSH set-up (TCP, handshake, authentication, session) that did not answer in time.
# It is `unreachable` (exit 10) whether the worker has a public IP (a hung sshd, an overloaded
# VM) or not (a firewall dropping packets): in both, tpuctl never reached a shell and nothing
# ran. Exit 4 stays what the user set a deadline for: --timeout on a command that started.
NO_ANSWER = "unreachable"


@dataclass(frozen=True)
class ConnectOptions:
    """How every connection of a fan-out is made (one key object, shared by all)."""

    user: str
    pkey: Any  # paramiko.PKey, loaded once
    connect_timeout: float = 20.0
    keepalive: float = 15.0  # seconds between keepalive probes on a quiet connection
    keepalive_count: int = 3  # unanswered probes before the worker counts as lost
    verify_host_keys: bool = True
    # Pinned keys (tpuctl's known hosts) and whether to pin a new one on first use; None:
    # only the keys a worker publishes in its guest attributes are trusted.
    pins: HostKeyPins | None = None
    connect_attempts: int = 3  # refused/reset/EOF during set-up are retried, timeouts are not
    retry_backoff: float = 0.5
    # How the bytes get there (routes.py): an IAP tunnel or a bastion; None: straight TCP.
    route: Route | None = None


class StartError(Exception):
    """The exec request was sent but not confirmed: the command may have started."""


def _tcp_keepalive(sock: socket.socket, interval: float) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    seconds = max(1, int(interval))
    for name, value in (("TCP_KEEPIDLE", seconds), ("TCP_KEEPINTVL", seconds), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(target: WorkerTarget, options: ConnectOptions) -> paramiko.Transport:
    """Reach the worker (TCP, or its route), SSH handshake, host key check and public-key auth
    within connect_timeout. Raises SetupError and nothing else: whatever goes wrong in set-up
    (a ValueError from paramiko, a bug) is this worker's failure, never its thread's death."""
    try:
        return _connect(target, options)
    except SetupError as error:
        raise _firewall_hint(target, options, error) from None
    except Exception as error:  # the worker's result says what it was
        raise SetupError(
            "unreachable", f"SSH set-up failed: {type(error).__name__}: {error}"
        ) from None


def _connect(target: WorkerTarget, options: ConnectOptions) -> paramiko.Transport:
    load_paramiko()
    import paramiko

    deadline = time.monotonic() + options.connect_timeout
    # Before any packet: a worker with no key to check against is refused without a connection.
    known = expected_keys(target, options.pins) if options.verify_host_keys else None

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SetupError(
                NO_ANSWER, f"connect timeout ({options.connect_timeout:g} s)", timed_out=True
            )
        return remaining

    sock = _dial(target, options, left)
    try:
        transport = new_transport(sock)
    except BaseException:
        with contextlib.suppress(Exception):
            sock.close()
        raise
    try:
        check = _worker_check(target, options.pins) if options.verify_host_keys else None
        handshake(
            transport,
            left(),
            known=known,
            check=check,
            who=f"worker {target.label} ({target.node_id})",
            known_from="" if target.host_keys else " (pinned)",
        )
        left()
        transport.auth_publickey(options.user, options.pkey)
    except SetupError as error:
        said = _route_failure(options, sock, deadline) if error.timed_out else None
        _discard(transport, sock)
        if said is not None:
            raise SetupError(
                said.kind, f"{error}; {said}", hint=said.hint, timed_out=True
            ) from None
        raise
    except paramiko.AuthenticationException as error:
        _discard(transport, sock)
        raise SetupError(
            "unreachable",
            f"authentication as {options.user} failed ({error}); is the key in the node's "
            "ssh-keys metadata?",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as error:
        said = _route_failure(options, sock, deadline)
        _discard(transport, sock)
        if said is not None:  # the route broke (a tunnel process exited): what it said is the news
            raise said from None
        if time.monotonic() >= deadline - 0.05:
            raise SetupError(
                NO_ANSWER,
                f"no SSH answer within {options.connect_timeout:g} s ({error})",
                timed_out=True,
            ) from None
        raise SetupError("unreachable", f"SSH set-up failed: {error}", retryable=True) from None
    except BaseException:
        _discard(transport, sock)
        raise
    return transport


def _dial(target: WorkerTarget, options: ConnectOptions, left: Callable[[], float]) -> Any:
    """The byte stream to the worker's SSH port: a TCP socket, or what its route opens."""
    route = options.route
    if route is not None:
        try:
            return route.open(target, left())
        except SetupError:
            raise
        except Exception as error:  # a setup thread must always end with a SetupError
            raise SetupError("unreachable", f"cannot open the route: {error}") from None
    try:
        sock = socket.create_connection((target.address, target.port), timeout=left())
    except TimeoutError:
        raise SetupError(
            NO_ANSWER,
            f"TCP connect timed out after {options.connect_timeout:g} s",
            timed_out=True,
        ) from None
    except OSError as error:
        raise SetupError(
            "unreachable",
            f"cannot connect to {target.address}:{target.port}: {error}",
            retryable=True,
        ) from None
    _tcp_keepalive(sock, options.keepalive)
    return sock


def _route_failure(options: ConnectOptions, sock: Any, deadline: float) -> SetupError | None:
    if options.route is None:
        return None
    wait = min(ROUTE_FAILURE_WAIT, max(0.1, deadline - time.monotonic()))
    with contextlib.suppress(Exception):
        return options.route.failure(sock, wait)
    return None


def _discard(transport: paramiko.Transport, sock: Any) -> None:
    """Close a transport that failed to set up, and its stream: a transport whose thread never
    ran does not close it (and a tunnel's process must end). A running thread closes it as it
    ends; closing it under that thread's read would only make it log a bad descriptor."""
    close_transport(transport)
    if not transport.is_alive():
        with contextlib.suppress(Exception):
            sock.close()


def _firewall_hint(target: WorkerTarget, options: ConnectOptions, error: SetupError) -> SetupError:
    """A worker with no external IP, dialled directly, that did not answer: from outside its
    VPC nothing gets in but IAP or a host inside it, so say so."""
    if target.has_external_ip or options.route is not None:
        return error
    if error.kind != "unreachable" or "authentication" in str(error):
        return error
    hint = (
        f"node {target.node_id} has no external IP: from outside its VPC, reach it with "
        "--tunnel-through-iap (a firewall rule must admit 35.235.240.0/20 on tcp:22) or "
        "--proxy-jump HOST (a bastion in the VPC); --internal-ip works only from inside it"
    )
    return SetupError(
        error.kind,
        f"{error} ({hint})",
        retryable=error.retryable,
        hint=hint,
        timed_out=error.timed_out,
    )


def expected_keys(target: WorkerTarget, pins: HostKeyPins | None) -> list[tuple[str, str]] | None:
    """The host keys `target` may present: those it published, else its pinned keys, else None
    (any: a key trusted on first use). Raises SetupError when nothing may be trusted (no key
    published, none pinned, no trust on first use)."""
    keys: list[tuple[str, str]] = list(target.host_keys)
    if not keys and pins is not None:
        keys = [(pin.algorithm, pin.blob) for pin in pins.pinned(target)]
    if keys:
        return keys
    if pins is not None and pins.accepts_new:
        return None
    where = f" and none is pinned in {pins.path}" if pins is not None else ""
    raise SetupError(
        "hostkey-unknown",
        f"worker {target.label} ({target.node_id}) published no host key in its guest "
        f"attributes (hostkeys/){where}; refusing to trust an unknown host",
        hint="to trust the key it presents and pin it, run once with "
        "--strict-host-key-checking accept-new",
    )


def _worker_check(target: WorkerTarget, pins: HostKeyPins | None) -> Callable[[str, str], None]:
    def check(algorithm: str, blob: str) -> None:
        verify_host_key(algorithm, blob, target, pins)

    return check


def verify_host_key(
    algorithm: str, blob: str, target: WorkerTarget, pins: HostKeyPins | None = None
) -> None:
    """The key the worker presented must be one it published in its guest attributes (then it
    is pinned), else its pinned key; with neither, it is pinned on first use (accept-new)."""

    def presented() -> str:  # its fingerprint, computed only for a refusal
        return f"{algorithm} {fingerprint(blob)}"

    if target.host_keys:
        if not any(same_key(key_pair, (algorithm, blob)) for key_pair in target.host_keys):
            raise SetupError(
                "hostkey-mismatch",
                f"HOST KEY MISMATCH for worker {target.label} ({target.node_id}, "
                f"{target.address}): it presented {presented()}, "
                "which is not the key in its guest attributes; not connecting",
            )
        if pins is not None:
            pins.remember(target, algorithm, blob, first_use=False)
        return
    if pins is None:  # expected_keys refused a worker without published keys
        raise SetupError("hostkey-unknown", f"worker {target.label} has no known host key")
    pinned = pins.pinned(target)
    if pinned:
        if not any(same_key((pin.algorithm, pin.blob), (algorithm, blob)) for pin in pinned):
            raise _changed(target, presented(), pinned[0], pins)
        return
    if not pins.accepts_new:  # expected_keys refused it already
        raise SetupError("hostkey-unknown", f"worker {target.label} has no known host key")
    pins.remember(target, algorithm, blob, first_use=True)


def _changed(target: WorkerTarget, presented: str, pin: Pin, pins: HostKeyPins) -> SetupError:
    alias = host_alias(target)
    where = f"{pins.path} line {pin.line}" if pin.line else str(pins.path)
    fix = forget_command(alias, pins.path)
    return SetupError(
        "hostkey-mismatch",
        f"HOST KEY CHANGED for worker {target.label} ({target.node_id}, {target.address}): it "
        f"presented {presented}, but {pin.algorithm} {fingerprint(pin.blob)} is pinned for "
        f"{alias} ({where}) and its guest attributes publish no key; someone may be "
        "impersonating it, or the VM was rebuilt with a new key. Not connecting. If the change "
        f"is expected, forget the old key: {fix}",
        hint=f"if the new host key of {target.label} is expected: {fix}",
    )


def open_channel(
    transport: paramiko.Transport, timeout: float, *, pty: tuple[str, int, int] | None = None
) -> paramiko.Channel:
    """A session channel (and a pty when asked); nothing has run yet."""
    load_paramiko()
    import paramiko

    try:
        channel = transport.open_session(timeout=timeout)
        if pty is not None:
            term, width, height = pty
            channel.get_pty(term=term, width=width, height=height)
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise SetupError("unreachable", f"cannot open a session: {error}", retryable=True) from None
    return channel


def encode_command(command: str) -> bytes:
    """The bytes of `command` as the worker's shell gets them. Arguments that were not valid
    UTF-8 reach Python as surrogate escapes; os.fsencode gives back their exact bytes (SSH's
    exec request carries bytes). UsageError (before any connection) for a command no worker's
    shell could run."""
    data = os.fsencode(command)
    if len(data) > COMMAND_LIMIT:
        raise UsageError(
            f"the command is {len(data):,} bytes, more than a worker's shell accepts in one "
            f"command ({COMMAND_LIMIT:,} bytes, Linux's limit on one argument)",
            hint="put the data in a file and copy it with `tpuctl upload`, or pipe it to the "
            "command's stdin with `tpuctl ssh --stdin`",
        )
    return data


def start(channel: paramiko.Channel, command: str | bytes | None) -> None:
    """Send exec (or shell). From here on the command may be running: StartError, no retry."""
    load_paramiko()
    import paramiko

    try:
        if command is None:
            channel.invoke_shell()
        else:
            channel.exec_command(encode_command(command) if isinstance(command, str) else command)
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise StartError(
            f"connection lost while starting the command ({error}); not retried, as it may "
            "have started"
        ) from None
