"""The in-process SSH server of one emulated worker (asyncssh), with its hang and refuse faults,
the firewall of a worker without an external IP (firewall.py), and TCP forwarding from the
worker's own address (a bastion, `ssh -J`).

Sessions (sshd_asyncssh_session.py) run real processes; a thousand workers share one event
loop and cost no threads."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol, cast

import asyncssh
from asyncssh.forward import SSHForwarder

from tpuctl.emulator.vms import firewall, vm
from tpuctl.emulator.vms.sshd import valid_user
from tpuctl.emulator.vms.sshd_asyncssh_session import WorkerSession


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

    @property
    def firewalled(self) -> bool:
        """Whether SSH is admitted only from some sources (a node with no external IP)."""
        ...

    def admits(self, source: str) -> bool:
        """Whether the firewall lets a connection from `source` reach this worker's SSH."""
        ...


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

    def session_requested(self) -> WorkerSession:
        assert self._conn is not None
        return WorkerSession(self._endpoint, self._conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        # Local port forwarding (TensorBoard tunnels, `ssh -J`), allowed by a default sshd.
        # It leaves from this worker's own address, as it would leave this VM, so another
        # worker's firewall sees a neighbour in the VPC.
        forwarding = _forward_from(self._endpoint.ip, dest_host, dest_port)
        return cast("Awaitable[asyncssh.SSHTCPSession[bytes]]", forwarding)


async def _forward_from(source: str, dest_host: str, dest_port: int) -> SSHForwarder:
    """asyncssh's forward_connection, connecting from `source` when the destination is on
    loopback (where every emulated worker is)."""
    local = None
    try:
        if ipaddress.ip_address(dest_host).is_loopback:
            local = (source, 0)
    except ValueError:
        pass  # a host name: the kernel picks the source
    loop = asyncio.get_running_loop()
    try:
        _, peer = await loop.create_connection(SSHForwarder, dest_host, dest_port, local_addr=local)
    except OSError as error:
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(error)) from None
    return SSHForwarder(peer)


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
        self.sessions: set[WorkerSession] = set()
        self.silent: set[asyncio.BaseTransport] = set()
        self._dropping: set[asyncio.Task[object]] = set()

    @property
    def hung(self) -> bool:
        return self.fault == "hang"

    async def start(self) -> None:
        if self.host.firewalled:
            # Connections the firewall refuses never reach asyncssh: see firewall.py.
            sock = firewall.listener(self.ip, self.port, self.host.admits, self._drop)
            self._acceptor = await asyncssh.listen(
                sock=sock,
                options=self._options,
                config=None,
                server_host_keys=[self._host_key],
                server_factory=lambda: _WorkerServer(self),
            )
            return
        self._acceptor = await asyncssh.listen(
            self.ip,
            self.port,
            options=self._options,
            config=None,
            server_host_keys=[self._host_key],
            server_factory=lambda: _WorkerServer(self),
            reuse_address=True,
        )

    def _drop(self, connection: socket.socket) -> None:
        """A connection the firewall refused: held open and silent until the client leaves."""
        connection.setblocking(False)
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            loop.connect_accepted_socket(lambda: _SilentProtocol(self), connection)
        )
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

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

    async def set_host_key(self, host_key: asyncssh.SSHKey) -> None:
        """Serve a new host key from the next connection on (open ones keep theirs)."""
        self._host_key = host_key
        if self._acceptor is not None:
            self._acceptor.update(server_host_keys=[host_key])

    def drop_connections(self) -> None:
        """The VM went down: every TCP connection to it is gone."""
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()

    async def close(self) -> None:
        await self._stop_listening()
        self.drop_connections()
