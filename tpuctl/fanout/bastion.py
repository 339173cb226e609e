"""The bastion route: workers reached through a jump host's `direct-tcpip` channels (ProxyJump),
the jump host's spelling and its own host-key check."""

from __future__ import annotations

import contextlib
import errno
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.fanout.handshake import SetupError, close_transport, handshake, new_transport
from tpuctl.fanout.imports import load_paramiko
from tpuctl.fanout.known_hosts import (
    Checking,
    KnownHostsFile,
    fingerprint,
    forget_command,
    same_key,
)
from tpuctl.fanout.targets import WorkerTarget

if TYPE_CHECKING:
    import paramiko

_HOST = re.compile(r"^[A-Za-z0-9_.:%-]{1,253}$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
Warn = Callable[[str], None]


class ChannelStream:
    """A bastion's `direct-tcpip` channel as one worker connection's socket.

    paramiko's Channel.send checks that the channel is open, then sends outside its lock; a
    worker connection closing on one thread (EOF, then CLOSE) while its transport thread sends
    on another can put data after the CLOSE. The bastion answers that protocol error by
    dropping its whole connection, every other worker's channel with it. Here sending and
    closing take turns, and nothing is sent once the channel is shut.
    """

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._shut = False

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._shut:
                raise OSError(errno.EPIPE, "the channel is closed")
            return self.channel.send(data)

    def recv(self, size: int) -> bytes:
        return self.channel.recv(size)

    def settimeout(self, timeout: float | None) -> None:
        self.channel.settimeout(timeout)

    def getpeername(self) -> Any:
        return self.channel.getpeername()

    @property
    def _closed(self) -> bool:  # paramiko's Transport.stop_thread reads it
        return bool(self.channel.closed)

    def shutdown(self, how: int) -> None:
        with self._lock:
            self._shut = True
            self.channel.shutdown(how)

    def close(self) -> None:
        with self._lock:
            self._shut = True
            self.channel.close()


@dataclass(frozen=True)
class JumpHost:
    """`--proxy-jump [USER@]HOST[:PORT]`; no user: the one tpuctl logs in to workers as."""

    host: str
    port: int = 22
    user: str | None = None

    @property
    def alias(self) -> str:
        """The name known_hosts files hold it under: `host`, or `[host]:port`."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.alias}"


def parse_jump(text: str) -> JumpHost:
    """`[USER@]HOST[:PORT]` (an IPv6 address in brackets: `[::1]:2222`). UsageError."""
    value = text.strip()
    user, at, rest = value.rpartition("@")
    bad = UsageError(
        f"--proxy-jump {text!r}: not [USER@]HOST[:PORT]",
        hint="e.g. --proxy-jump bastion.example.com or --proxy-jump me@10.0.0.2:2222",
    )
    if "," in value or (at and not _USER.match(user)):
        raise bad
    port_text = ""
    if rest.startswith("["):
        host, closing, after = rest[1:].partition("]")
        if not closing or (after and not after.startswith(":")):
            raise bad
        port_text = after[1:]
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host = rest
    if not host or host.startswith("-") or not _HOST.match(host):
        raise bad
    port = 22
    if port_text or rest.endswith(":"):
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise bad
        port = int(port_text)
    return JumpHost(host, port, user or None)


class Bastion:
    """One SSH connection to a bastion, opened when the first worker needs it and shared by
    every worker's `direct-tcpip` channel; closed when the last `hold()` ends.

    Its host key is checked as OpenSSH would, against ~/.ssh/known_hosts and tpuctl's own
    known hosts, under --strict-host-key-checking: `accept-new` pins a key seen for the first
    time in tpuctl's file, `yes` refuses it, `no` checks nothing. It is logged in to with
    tpuctl's key, then the keys of a running ssh-agent.
    """

    def __init__(
        self,
        jump: JumpHost,
        *,
        user: str,
        pkey: Any,
        checking: Checking,
        pins_path: Path,
        known_hosts: Path,
        connect_timeout: float,
        keepalive: float,
        warn: Warn | None = None,
    ) -> None:
        self.jump = jump
        self.user = jump.user or user
        self.pkey = pkey
        self.checking = checking
        self.pins_path = pins_path
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._warn = warn or (lambda _message: None)
        # Read now, so a pins file that may not be trusted stops the command before it starts.
        self._pinned = KnownHostsFile(pins_path).read().get(jump.alias, [])
        self._lock = threading.Lock()
        self._transport: paramiko.Transport | None = None
        self._failed: SetupError | None = None
        self._holders = 0

    @property
    def name(self) -> str:
        return f"{self.user}@{self.jump.alias}"

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                last = self._holders == 0
                transport = self._transport if last else None
                if last:
                    self._transport, self._failed = None, None
            if transport is not None:
                close_transport(transport)

    def close(self) -> None:
        with self._lock:
            transport, self._transport = self._transport, None
        if transport is not None:
            close_transport(transport)

    def open(self, target: WorkerTarget, timeout: float) -> ChannelStream:
        load_paramiko()
        import paramiko

        transport = self._connected(timeout)
        where = f"{target.address}:{target.port}"
        try:
            channel = transport.open_channel(
                "direct-tcpip", (target.address, target.port), ("127.0.0.1", 0), timeout=timeout
            )
            return ChannelStream(channel)
        except paramiko.ChannelException as error:
            reason = error.text or f"code {error.code}"
            raise SetupError(
                "unreachable",
                f"the bastion {self.name} could not connect to {where}: {reason}",
                retryable=True,
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as error:
            # paramiko says "Timeout opening channel." when the bastion's connect hangs (a
            # firewall dropping it), and raises the same way when the bastion went away.
            raise SetupError(
                "unreachable",
                f"through the bastion {self.name}, {where} did not answer: {error}",
                retryable=True,
            ) from None

    def failure(self, stream: Any, wait: float) -> SetupError | None:
        return None

    # -- the bastion's own connection ------------------------------------------------------
    def _connected(self, timeout: float) -> paramiko.Transport:
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if self._transport is not None and self._transport.is_active():
                return self._transport
            try:
                self._transport = self._connect(min(timeout, self.connect_timeout))
            except SetupError as error:
                # Every worker would fail the same way: said once, not retried per worker.
                self._failed = SetupError(error.kind, str(error), hint=error.hint)
                raise self._failed from None
            return self._transport

    def _connect(self, timeout: float) -> paramiko.Transport:
        load_paramiko()
        import paramiko

        prefix = f"bastion {self.name}"
        try:
            sock = socket.create_connection((self.jump.host, self.jump.port), timeout=timeout)
        except OSError as error:
            raise SetupError("unreachable", f"{prefix}: cannot connect: {error}") from None
        transport = new_transport(sock)
        try:
            checking = self.checking != "no"
            known = self._known_keys() if checking else []
            handshake(
                transport,
                timeout,
                known=[(algorithm, blob) for algorithm, blob, _ in known],
                check=self._check(known) if checking else None,
                who=prefix,
            )
            self._log_in(transport)
            transport.set_keepalive(max(1, int(self.keepalive)))
        except SetupError:
            close_transport(transport)
            raise
        except paramiko.AuthenticationException as error:
            close_transport(transport)
            raise SetupError(
                "unreachable",
                f"{prefix}: authentication as {self.user} failed ({error})",
                hint="the bastion must accept tpuctl's key (~/.ssh/google_compute_engine) or a "
                "key in your ssh-agent; name its user with --proxy-jump USER@HOST",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as error:
            close_transport(transport)
            raise SetupError("unreachable", f"{prefix}: SSH set-up failed: {error}") from None
        except BaseException:
            close_transport(transport)
            raise
        return transport

    def _log_in(self, transport: paramiko.Transport) -> None:
        load_paramiko()
        import paramiko

        keys: list[Any] = [self.pkey]
        with contextlib.suppress(Exception):
            keys.extend(paramiko.Agent().get_keys())
        error: Exception | None = None
        for key in keys:
            try:
                transport.auth_publickey(self.user, key)
                return
            except paramiko.AuthenticationException as refused:
                error = refused
        raise error or paramiko.AuthenticationException("no key to offer")

    def _known_keys(self) -> list[tuple[str, str, Path]]:
        """The bastion's keys (algorithm, blob, the file that holds it) in ~/.ssh/known_hosts
        (hashed names too) and tpuctl's file."""
        load_paramiko()
        import paramiko

        keys: list[tuple[str, str, Path]] = []
        if self.known_hosts.is_file():
            host_keys = paramiko.HostKeys()
            with contextlib.suppress(OSError, paramiko.SSHException, ValueError):
                host_keys.load(str(self.known_hosts))
            entry = host_keys.lookup(self.jump.alias)
            if entry is not None:
                keys += [
                    (key.get_name(), key.get_base64(), self.known_hosts) for key in entry.values()
                ]
        return keys + [(pin.algorithm, pin.blob, self.pins_path) for pin in self._pinned]

    def _check(self, known: list[tuple[str, str, Path]]) -> Callable[[str, str], None]:
        def check(algorithm: str, blob: str) -> None:
            self._verify((algorithm, blob), known)

        return check

    def _verify(self, presented: tuple[str, str], known: list[tuple[str, str, Path]]) -> None:
        shown = f"{presented[0]} {fingerprint(presented[1])}"
        alias = self.jump.alias
        if any(same_key((algorithm, blob), presented) for algorithm, blob, _ in known):
            return
        if known:
            # Name the files that hold a key for it, and only those.
            holders = list(dict.fromkeys(path for _, _, path in known))
            fix = " and ".join(forget_command(alias, path) for path in holders)
            where = " and ".join(str(path) for path in holders)
            raise SetupError(
                "hostkey-mismatch",
                f"HOST KEY CHANGED for bastion {alias}: it presented {shown}, which is not the "
                f"key {where} holds for it; not connecting",
                hint=f"if the change is expected, forget the old key: {fix}",
            )
        if self.checking != "accept-new":
            raise SetupError(
                "hostkey-unknown",
                f"bastion {alias} has an unknown host key ({shown}): it is in neither "
                f"{self.known_hosts} nor {self.pins_path}, and --strict-host-key-checking yes "
                "trusts no new host",
                hint="connect once with `ssh` to add it to your known hosts, or run with "
                "--strict-host-key-checking accept-new",
            )
        line = f"{alias} {presented[0]} {presented[1]} bastion, trusted on first use"
        try:
            KnownHostsFile(self.pins_path).write({alias: line})
            where = f"pinned it in {self.pins_path}"
        except OSError as error:
            where = f"could not pin it in {self.pins_path} ({error.strerror or error})"
        self._warn(f"bastion {alias}: trusted its host key {shown} on first use and {where}")
