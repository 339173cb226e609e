"""The SSH handshake every connection makes, a worker's or a bastion's: paramiko's transport as
tpuctl tunes it, the key exchange, and the check of the host key the server presents.

paramiko internals used here, each guarded by a canary test (tests/fanout/test_paramiko_canary.py)
that fails when a release changes it:
- `Transport._active_check_timeout`, the transport thread's socket timeout;
- the requests paramiko has no API for (a keepalive with a reply, a signal), built from
  paramiko.message and paramiko.common and sent without waiting through the transport's
  `clear_to_send` lock and `_send_message`, and the `completion_event` the reply sets.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tpuctl.fanout.imports import load_paramiko

if TYPE_CHECKING:
    import paramiko

# paramiko's transport thread wakes every `_active_check_timeout` (0.1 s) to look for a close
# or send a keepalive. tpuctl sends its own keepalives (with replies, see engine) and shuts the
# socket down to stop a transport, so 1,024 idle connections need not wake 10,240 times a second.
TRANSPORT_POLL_SECONDS = 2.0
# AES-GCM first, as OpenSSH prefers it after chacha20 (which paramiko lacks): one C call seals
# or opens a packet, where CTR adds a Python HMAC per packet. CBC and 3DES are not offered.
# (paramiko lists GCM last; the client's order is the one that counts.)
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)
# Host key algorithms to ask for, by the key type guest attributes and known_hosts name.
_SIGNATURE_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}

# SetupError kinds that are an authentication failure (exit 8), not a worker out of reach.
AUTH_KINDS = frozenset(("hostkey-mismatch", "hostkey-unknown", "auth-failed"))
# (algorithm, base64 blob) of the key the server presented → None, or SetupError.
HostKeyCheck = Callable[[str, str], None]


class SetupError(Exception):
    """Set-up failed before anything ran. `kind`: unreachable | hostkey-mismatch |
    hostkey-unknown | auth-failed; `hint`: the fix, when there is one to say. `timed_out`: the
    connection's own deadline passed (nothing answered), which is not retried."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool = False,
        hint: str | None = None,
        timed_out: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.hint = hint
        self.timed_out = timed_out


def _transport_class() -> type[paramiko.Transport]:
    import logging

    load_paramiko()
    import paramiko

    # paramiko logs a dropped socket ("Socket exception: Connection reset by peer") and, with
    # no handler configured, Python's last-resort handler prints it over the progress output.
    # Each worker's failure is reported in the result instead; handlers set up on the root
    # logger (for debugging) still receive these records.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())

    class QuietTransport(paramiko.Transport):
        _active_check_timeout = TRANSPORT_POLL_SECONDS

    return QuietTransport


def _packetizer_class() -> type[Any]:
    from paramiko.packet import Packetizer

    class UntimedPacketizer(Packetizer):
        """No handshake timer thread per connection: start_client(timeout=…) bounds the
        negotiation, and a transport that overruns it is closed by its set-up thread."""

        def start_handshake(self, timeout: float) -> None:
            return None

    return UntimedPacketizer


_CLASSES: tuple[type[paramiko.Transport], type[Any]] | None = None
_CLASSES_LOCK = threading.Lock()


def new_transport(sock: Any) -> paramiko.Transport:
    """A client transport over `sock` (a socket, or a route's stream), not started yet."""
    global _CLASSES  # noqa: PLW0603 - built once, lazily (paramiko is a lazy import)
    with _CLASSES_LOCK:
        if _CLASSES is None:
            _CLASSES = (_transport_class(), _packetizer_class())
        transport_class, packetizer_class = _CLASSES
    transport = transport_class(sock, packetizer_class=packetizer_class)
    transport.get_security_options().ciphers = CIPHERS
    return transport


def host_key_algorithms(keys: Sequence[tuple[str, str]], supported: Sequence[str]) -> list[str]:
    """The algorithms to ask a server for, to get one of `keys` (algorithm, blob): those of
    `supported` (what paramiko can verify) that sign with a key of those types."""
    wanted = [
        name for algorithm, _ in keys for name in _SIGNATURE_ALGORITHMS.get(algorithm, (algorithm,))
    ]
    known = set(supported)
    return [name for name in dict.fromkeys(wanted) if name in known]


def handshake(
    transport: paramiko.Transport,
    timeout: float,
    *,
    known: Sequence[tuple[str, str]] | None,
    check: HostKeyCheck | None,
    who: str,
    known_from: str = "",
) -> None:
    """Key exchange on `transport`, then `check` the host key it presented (None: no check).

    With `known` keys, only their types are asked for, so the server presents one of them; a
    server whose known keys are all of types paramiko cannot verify (ssh-dss, which paramiko
    4 removed; sk-* security keys; a typo) is refused here, before a packet is sent. paramiko's
    own errors (SSHException, OSError, EOFError) are the caller's to map: it knows its route
    and its deadline. The caller closes the transport on any error.
    """
    if known:
        options = transport.get_security_options()
        algorithms = host_key_algorithms(known, options.key_types)
        if not algorithms:
            load_paramiko()
            import paramiko

            types = ", ".join(dict.fromkeys(algorithm for algorithm, _ in known))
            raise SetupError(
                "unreachable",
                f"{who}: its known host keys{known_from} are of types paramiko "
                f"{paramiko.__version__} cannot verify ({types}); not connecting",
                hint="publish or pin an ssh-ed25519, ecdsa-sha2-nistp* or ssh-rsa host key",
            )
        options.key_types = algorithms
    transport.banner_timeout = timeout
    transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    transport.start_client(timeout=timeout)
    if check is not None:
        key = transport.get_remote_server_key()
        check(key.get_name(), key.get_base64())


def close_transport(transport: paramiko.Transport) -> None:
    """Close without waiting: shutting the socket down wakes the transport thread at once."""
    sock: Any = transport.sock
    with contextlib.suppress(Exception):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        transport.close()


def send_now(transport: paramiko.Transport, message: paramiko.Message, wait: float = 0.0) -> bool:
    """Send `message` unless the transport is renegotiating keys; waits at most `wait` s.

    paramiko's `_send_user_message` waits (up to 30 s) while a key exchange runs; from the
    one monitor thread that serves every worker, that would stall all of them for one. This
    takes the same lock (without blocking by default) and sends only when the transport is
    clear to send; False when it did not send (a rekey under way, or the connection is gone).
    """
    raw: Any = transport
    lock = raw.clear_to_send_lock
    if wait > 0:
        raw.clear_to_send.wait(wait)  # outside the lock: the transport sets it under the lock
    if not (lock.acquire(timeout=wait) if wait > 0 else lock.acquire(blocking=False)):
        return False
    try:
        if not raw.clear_to_send.is_set() or not transport.is_active():
            return False
        raw._send_message(message)
    except Exception:
        return False
    finally:
        lock.release()
    return True


def send_keepalive(transport: paramiko.Transport, event: threading.Event) -> bool:
    """A keepalive@openssh.com global request WITH want_reply (paramiko's own keepalive asks
    for none, so it can never notice a worker that stopped answering). `event` is set when
    the reply (success or failure) arrives. False: not sent (a rekey, or a closed transport);
    try again at the next tick."""
    from paramiko.common import cMSG_GLOBAL_REQUEST
    from paramiko.message import Message

    raw: Any = transport
    message = Message()
    message.add_byte(cMSG_GLOBAL_REQUEST)
    message.add_string("keepalive@openssh.com")
    message.add_boolean(True)
    previous = raw.completion_event
    raw.completion_event = event  # paramiko sets it on MSG_REQUEST_SUCCESS/FAILURE
    if send_now(transport, message):
        return True
    raw.completion_event = previous
    return False


def send_signal(channel: paramiko.Channel, name: str, wait: float = 0.0) -> bool:
    """RFC 4254 §6.9 "signal" request (paramiko has no API for it); best effort, waits at
    most `wait` s for a rekey to end. False when it could not be sent (the channel is closed,
    or a rekey is under way)."""
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    raw: Any = channel
    if channel.closed or not raw.active:
        return False
    message = Message()
    message.add_byte(cMSG_CHANNEL_REQUEST)
    message.add_int(raw.remote_chanid)
    message.add_string("signal")
    message.add_boolean(False)
    message.add_string(name)
    return send_now(channel.get_transport(), message, wait)
