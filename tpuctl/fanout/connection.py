"""One SSH connection to one worker with paramiko: connect, verify the host key, auth, exec.

Set-up is split from running on purpose: `connect()` may be retried (nothing ran yet);
`start()` sends the exec request, after which the command may be running and is never retried.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

# paramiko's transport thread wakes every `_active_check_timeout` (0.1 s) to look for a close
# or send a keepalive. tpuctl sends its own keepalives (with replies, see engine) and shuts the
# socket down to stop a transport, so 1,024 idle connections need not wake 10,240 times a second.
TRANSPORT_POLL_SECONDS = 2.0
# How long a failed set-up waits for a route's process to say why (it is exiting).
ROUTE_FAILURE_WAIT = 1.0
# Host key algorithms paramiko can verify, by the name guest attributes publish them under.
_HOSTKEY_ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}


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


class SetupError(Exception):
    """Set-up failed before anything ran. `kind`: unreachable | timeout | hostkey-mismatch;
    `hint`: the fix, when there is one to say."""

    def __init__(
        self, kind: str, message: str, *, retryable: bool = False, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.hint = hint


class StartError(Exception):
    """The exec request was sent but not confirmed: the command may have started."""


def _transport_class() -> type[paramiko.Transport]:
    import logging

    import paramiko

    # paramiko logs a dropped socket ("Socket exception: Connection reset by peer") and, with
    # no handler configured, Python's last-resort handler prints it over the progress output.
    # Each worker's failure is reported in the result instead; handlers set up on the root
    # logger (for debugging) still receive these records.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    # paramiko compares every packet's MAC in a Python loop (~14% of a fan-out's client CPU);
    # hmac.compare_digest is the same constant-time comparison, in C.
    paramiko.util.constant_time_bytes_eq = hmac.compare_digest  # type: ignore[assignment]

    class QuietTransport(paramiko.Transport):
        _active_check_timeout = TRANSPORT_POLL_SECONDS
        # AES-GCM first, as OpenSSH prefers it after chacha20 (which paramiko lacks): one C
        # call seals or opens a packet, where CTR adds a Python HMAC per packet. CBC and 3DES
        # are not offered at all.
        _preferred_ciphers = (
            "aes128-gcm@openssh.com",
            "aes256-gcm@openssh.com",
            "aes128-ctr",
            "aes192-ctr",
            "aes256-ctr",
        )

        def _filter_algorithm(self, type_: str) -> tuple[str, ...]:
            # Asked ~16 times per handshake with the same answer: computed once per list.
            if self.disabled_algorithms:
                return tuple(super()._filter_algorithm(type_))  # type: ignore[misc]
            return tuple(getattr(self, f"_preferred_{type_}"))

        def _log(self, level: int, msg: Any, *args: Any) -> None:
            if self.logger.isEnabledFor(level):  # ~33 calls per worker, almost all DEBUG
                super()._log(level, msg, *args)  # type: ignore[misc]

        def __init__(self, sock: Any) -> None:
            super().__init__(sock)
            # No handshake timer thread per connection: start_client(timeout=…) bounds the
            # negotiation, and a transport that overruns it is closed by its set-up thread.
            self.packetizer.start_handshake = _no_timer  # type: ignore[method-assign,assignment]

    return QuietTransport


def _no_timer(_timeout: float) -> None:
    return None


_TRANSPORT: type[paramiko.Transport] | None = None
_TRANSPORT_LOCK = threading.Lock()


def transport_class() -> type[paramiko.Transport]:
    global _TRANSPORT  # noqa: PLW0603 - built once, lazily (paramiko is a lazy import)
    with _TRANSPORT_LOCK:
        if _TRANSPORT is None:
            _TRANSPORT = _transport_class()
        return _TRANSPORT


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
    within connect_timeout."""
    try:
        return _connect(target, options)
    except SetupError as error:
        raise _firewall_hint(target, options, error) from None


def _connect(target: WorkerTarget, options: ConnectOptions) -> paramiko.Transport:
    import paramiko

    deadline = time.monotonic() + options.connect_timeout
    # Before any packet: a worker with no key to check against is refused without a connection.
    algorithms = expected_algorithms(target, options.pins) if options.verify_host_keys else None

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SetupError("timeout", f"connect timeout ({options.connect_timeout:g} s)")
        return remaining

    sock = _dial(target, options, left)
    transport = transport_class()(sock)
    try:
        _handshake(transport, target, options, algorithms, left)
        transport.auth_publickey(options.user, options.pkey)
    except SetupError as error:
        said = _route_failure(options, sock, deadline) if error.kind == "timeout" else None
        _discard(transport, sock)
        if said:
            raise SetupError(error.kind, f"{error}; {said}", retryable=error.retryable) from None
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
        if said:  # the route broke (a tunnel process exited): what it said is the news
            raise SetupError("unreachable", said, retryable=True) from None
        if time.monotonic() >= deadline - 0.05:
            raise SetupError(
                "timeout", f"no SSH answer within {options.connect_timeout:g} s ({error})"
            ) from None
        raise SetupError("unreachable", f"SSH set-up failed: {error}", retryable=True) from None
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
            "timeout", f"TCP connect timed out after {options.connect_timeout:g} s"
        ) from None
    except OSError as error:
        raise SetupError(
            "unreachable",
            f"cannot connect to {target.address}:{target.port}: {error}",
            retryable=True,
        ) from None
    _tcp_keepalive(sock, options.keepalive)
    return sock


def _route_failure(options: ConnectOptions, sock: Any, deadline: float) -> str | None:
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
    VPC nothing gets in but IAP or a host inside it, so say so (a firewall drops packets: a
    timeout, which here means unreachable, not a command's deadline)."""
    if target.has_external_ip or options.route is not None:
        return error
    if error.kind not in ("timeout", "unreachable") or "authentication" in str(error):
        return error
    hint = (
        f"node {target.node_id} has no external IP: from outside its VPC, reach it with "
        "--tunnel-through-iap (a firewall rule must admit 35.235.240.0/20 on tcp:22) or "
        "--proxy-jump HOST (a bastion in the VPC); --internal-ip works only from inside it"
    )
    return SetupError("unreachable", f"{error} ({hint})", retryable=error.retryable, hint=hint)


def _handshake(
    transport: paramiko.Transport,
    target: WorkerTarget,
    options: ConnectOptions,
    algorithms: list[str] | None,
    left: Callable[[], float],
) -> None:
    if algorithms:
        # Ask only for host key types we can check against what we expect.
        transport.get_security_options().key_types = algorithms
    timeout = left()
    transport.banner_timeout = timeout
    transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    transport.start_client(timeout=timeout)
    if options.verify_host_keys:
        verify_host_key(transport, target, options.pins)
    left()


def expected_algorithms(target: WorkerTarget, pins: HostKeyPins | None) -> list[str] | None:
    """The host key algorithms to ask `target` for: those of the keys it published, else of
    its pinned keys, else None (any: a key trusted on first use). Raises SetupError when
    nothing may be trusted (no key published, none pinned, no trust on first use)."""
    keys: list[tuple[str, str]] = list(target.host_keys)
    if not keys and pins is not None:
        keys = [(pin.algorithm, pin.blob) for pin in pins.pinned(target)]
    if keys:
        return host_key_algorithms(keys)
    if pins is not None and pins.accepts_new:
        return None
    where = f" and none is pinned in {pins.path}" if pins is not None else ""
    raise SetupError(
        "hostkey-mismatch",
        f"worker {target.label} ({target.node_id}) published no host key in its guest "
        f"attributes (hostkeys/){where}; refusing to trust an unknown host",
        hint="to trust the key it presents and pin it, run once with "
        "--strict-host-key-checking accept-new",
    )


def host_key_algorithms(keys: Sequence[tuple[str, str]]) -> list[str]:
    """The algorithms to ask a server for, to get one of `keys` (algorithm, blob)."""
    names = [
        name for algorithm, _ in keys for name in _HOSTKEY_ALGORITHMS.get(algorithm, (algorithm,))
    ]
    return list(dict.fromkeys(names))


def verify_host_key(
    transport: paramiko.Transport, target: WorkerTarget, pins: HostKeyPins | None = None
) -> None:
    """The key the worker presented must be one it published in its guest attributes (then it
    is pinned), else its pinned key; with neither, it is pinned on first use (accept-new)."""
    key = transport.get_remote_server_key()
    algorithm, blob = key.get_name(), key.get_base64()
    presented = f"{algorithm} {fingerprint(blob)}"
    if target.host_keys:
        if not any(same_key(key_pair, (algorithm, blob)) for key_pair in target.host_keys):
            raise SetupError(
                "hostkey-mismatch",
                f"HOST KEY MISMATCH for worker {target.label} ({target.node_id}, "
                f"{target.address}): it presented {presented}, which is not the key in its "
                "guest attributes; not connecting",
            )
        if pins is not None:
            pins.remember(target, algorithm, blob, first_use=False)
        return
    if pins is None:  # expected_algorithms refused a worker without published keys
        raise SetupError("hostkey-mismatch", f"worker {target.label} has no known host key")
    pinned = pins.pinned(target)
    if pinned:
        if not any(same_key((pin.algorithm, pin.blob), (algorithm, blob)) for pin in pinned):
            raise _changed(target, presented, pinned[0], pins)
        return
    if not pins.accepts_new:  # expected_algorithms refused it already
        raise SetupError("hostkey-mismatch", f"worker {target.label} has no known host key")
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
    import paramiko

    try:
        channel = transport.open_session(timeout=timeout)
        if pty is not None:
            term, width, height = pty
            channel.get_pty(term=term, width=width, height=height)
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise SetupError("unreachable", f"cannot open a session: {error}", retryable=True) from None
    return channel


def start(channel: paramiko.Channel, command: str | None) -> None:
    """Send exec (or shell). From here on the command may be running: StartError, no retry."""
    import paramiko

    try:
        if command is None:
            channel.invoke_shell()
        else:
            channel.exec_command(command)
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise StartError(
            f"connection lost while starting the command ({error}); not retried, as it may "
            "have started"
        ) from None


def send_signal(channel: paramiko.Channel, name: str) -> None:
    """RFC 4254 §6.9 "signal" request (paramiko has no API for it); best effort."""
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    raw: Any = channel
    if channel.closed or not raw.active:
        return
    message = Message()
    message.add_byte(cMSG_CHANNEL_REQUEST)
    message.add_int(raw.remote_chanid)
    message.add_string("signal")
    message.add_boolean(False)
    message.add_string(name)
    with contextlib.suppress(Exception):
        raw.transport._send_user_message(message)


def send_keepalive(transport: paramiko.Transport, event: threading.Event) -> bool:
    """A keepalive@openssh.com global request WITH want_reply (paramiko's own keepalive asks
    for none, so it can never notice a worker that stopped answering). `event` is set when
    the reply (success or failure) arrives."""
    from paramiko.common import cMSG_GLOBAL_REQUEST
    from paramiko.message import Message

    raw: Any = transport
    if not transport.is_active():
        return False
    raw.completion_event = event  # paramiko sets it on MSG_REQUEST_SUCCESS/FAILURE
    message = Message()
    message.add_byte(cMSG_GLOBAL_REQUEST)
    message.add_string("keepalive@openssh.com")
    message.add_boolean(True)
    try:
        raw._send_user_message(message)
    except Exception:
        return False
    return True


def close_transport(transport: paramiko.Transport) -> None:
    """Close without waiting: shutting the socket down wakes the transport thread at once."""
    sock: Any = transport.sock
    with contextlib.suppress(Exception):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        transport.close()
