"""The emulator's worker plane: every TPU VM of every slice, with SSH, metadata and processes.

Each worker is a loopback address (127.a.b.c) with a real SSH server and a GCE-style metadata
server, and a VM root directory under the state dir standing in for its boot disk. Worker
processes are real processes of the emulator's own OS user (there is no user switching: the
login name only picks the home directory and $USER); they carry marker variables in their
environment so that stop/kill finds them however they detached.

All asyncio work runs on one loop in one thread; the public methods are synchronous and
thread-safe, for the control plane's threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import socket
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.emulator.vms import firewall, vm
from tpuctl.emulator.vms.access import Access
from tpuctl.emulator.vms.plane_nodes import (
    InstanceIdentity,
    NodeIdentity,
    PlaneNode,
    PlaneWorker,
    WorkerInfo,
    identity_chips,
)
from tpuctl.errors import NotFoundError

if TYPE_CHECKING:
    import subprocess

    import asyncssh

# NodeIdentity and WorkerInfo live in plane_nodes.py; tests and scripts/bench import them here.
__all__ = [
    "FAULT_MODES",
    "SSH_SERVERS",
    "InstanceIdentity",
    "NodeIdentity",
    "WorkerInfo",
    "WorkerPlane",
]

T = TypeVar("T")

SSH_SERVERS = ("asyncssh", "openssh")
FAULT_MODES = (None, "hang", "refuse")
_BIND_ATTEMPTS = 8


class WorkerPlane:
    """Every worker VM of the emulator; see the module docstring."""

    def __init__(
        self,
        state_dir: Path,
        *,
        ssh_port: int = 0,
        speed: float = 1.0,
        ssh_server: str = "asyncssh",
        access: Access | None = None,
    ) -> None:
        if ssh_server not in SSH_SERVERS:
            raise ValueError(f"ssh_server must be one of {', '.join(SSH_SERVERS)}")
        self.state_dir = Path(state_dir).absolute()
        # Real processes run at real speed; kept for symmetry with the control plane's clock.
        self.speed = speed
        self.ssh_server = ssh_server
        self.access = access or Access()  # OS Login and project metadata: who may log in
        self.instance_id = uuid.uuid4().hex
        self._requested_ssh_port = ssh_port
        # Second octet chosen per instance, so two emulators (or test runs) rarely share IPs;
        # never 0, so never 127.0.0.1, and never the emulated IAP range's (firewall.py).
        octets = [octet for octet in range(16, 240) if octet != firewall.RESERVED_OCTET]
        self._octet = random.SystemRandom().choice(octets)
        self._next_host = 1  # host 0 (127.a.0.1) holds the port reservations
        self._lock = threading.Lock()
        self._nodes: dict[str, PlaneNode] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._reaper: vm.ChildReaper | None = None
        self._options: asyncssh.SSHServerConnectionOptions | None = None  # lazy import
        self._reservations: list[socket.socket] = []
        self._ssh_port = 0
        self._metadata_port = 0
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("WorkerPlane already started")
        vm.raise_nofile_limit()
        (self.state_dir / "vms").mkdir(parents=True, exist_ok=True)
        reserve_ip = self._ip_for(0)
        # Bound, never listening: keeps each port ours on a private address while every
        # worker binds the same port on its own address.
        for requested in (self._requested_ssh_port, 0):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((reserve_ip, requested))
            self._reservations.append(sock)
        self._ssh_port = self._reservations[0].getsockname()[1]
        self._metadata_port = self._reservations[1].getsockname()[1]
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="tpuctl-worker-plane", daemon=True)
        self._thread.start()
        ready.wait()
        self._reaper = vm.ChildReaper(loop)
        self._options = self._call(self._make_options())
        if self.ssh_server == "openssh":
            from tpuctl.emulator.vms import sshd_openssh

            sshd_openssh.write_shim_home(self.shim_home)

    async def _make_options(self) -> asyncssh.SSHServerConnectionOptions:
        from tpuctl.emulator.vms import sshd_asyncssh

        return await sshd_asyncssh.server_options()

    @property
    def shim_home(self) -> Path:
        """HOME of OpenSSH sessions: dot files that move to the worker's own home."""
        return self.state_dir / "sshd" / "shim-home"

    @property
    def ssh_port(self) -> int:
        return self._ssh_port

    @property
    def metadata_port(self) -> int:
        return self._metadata_port

    def close(self) -> None:
        """Kill every process of this emulator instance and stop every listener."""
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            return
        with self._lock:
            nodes = list(self._nodes.values())
            self._nodes.clear()
        try:
            self._call(self._close_nodes(nodes))
            vm.stop_processes(self.instance_id, lambda marker: True, None)
            assert self._reaper is not None
            self._call(self._reaper.settle(2.0))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            if self._reaper is not None:
                self._reaper.reap_remaining()
            if not self._loop.is_running():
                self._loop.close()
            for sock in self._reservations:
                sock.close()

    async def _close_nodes(self, nodes: list[PlaneNode]) -> None:
        for node in nodes:
            for worker in node.workers:
                await worker.close_servers()

    # -- nodes ---------------------------------------------------------------------------
    def create_node(
        self, identity: NodeIdentity, metadata: dict[str, str], *, coordinator: str | None
    ) -> list[WorkerInfo]:
        """Create every worker of a node with a fresh disk; SSH and metadata answer at once."""
        self._require_started()
        if identity.workers < 1:
            raise ValueError(f"node {identity.node_id} needs at least one worker")
        node = PlaneNode(identity, metadata, coordinator, self.access)
        with self._lock:
            if identity.node_id in self._nodes:
                raise ValueError(f"emulated node {identity.node_id} already exists")
            self._nodes[identity.node_id] = node
        from tpuctl.emulator.vms import sshd

        try:
            with node.lock:
                chips = identity_chips(identity)
                for index in range(identity.workers):
                    worker = PlaneWorker(self, node, index, self._allocate_ip())
                    worker.host_key, worker.host_key_line = sshd.generate_host_key()
                    vm.remove_tree(worker.vm_root)  # a node id reused after delete
                    vm.create_vm_root(worker.vm_root, chips)
                    node.workers.append(worker)
                self._call(self._start_workers(node))
                node.version += 1  # IPs are final: rebuild metadata trees
        except BaseException:
            with self._lock:
                self._nodes.pop(identity.node_id, None)
            self._call(self._close_nodes([node]))
            vm.remove_tree(self.state_dir / "vms" / identity.node_id)
            vm.remove_tree(self.state_dir / "sshd" / identity.node_id)
            raise
        return [WorkerInfo(w.index, w.ip, w.host_key_line) for w in node.workers]

    async def _start_workers(self, node: PlaneNode) -> None:
        if self.ssh_server == "openssh":
            # sshd processes start slowly: bring them up side by side.
            for worker in node.workers:
                await worker.serve_metadata()
            await asyncio.gather(*(w.serve_openssh(self.shim_home) for w in node.workers))
            return
        assert self._reaper is not None and self._options is not None
        for worker in node.workers:
            for attempt in range(_BIND_ATTEMPTS):
                try:
                    await worker.serve_metadata()
                    await worker.serve_asyncssh(self._options, self._reaper)
                    break
                except OSError as exc:
                    from tpuctl.emulator.vms import sshd

                    await worker.close_servers()
                    if not sshd.is_address_in_use(exc) or attempt == _BIND_ATTEMPTS - 1:
                        raise
                    worker.ip = self._allocate_ip()  # another emulator holds this address

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None:
        """Replace the node's metadata; new ssh-keys and values apply to the next request."""
        with self._locked(node_id) as node:
            node.set_metadata(metadata)
            for worker in node.workers:
                worker.refresh_authorized_keys()

    def set_instance_state(self, node_id: str, state: dict[str, str]) -> None:
        """A Compute Engine instance's state as its metadata server reports it (preempted,
        maintenance-event, upcoming-maintenance, the termination timestamp)."""
        with self._locked(node_id) as node:
            node.set_instance_state(state)

    def set_hosts(self, node_id: str, text: str) -> None:
        """Write `etc/hosts` on every worker's disk: the names its VPC's internal DNS would
        resolve, which the emulator has no DNS server for (`$TPUCTL_VM_ROOT/etc/hosts`)."""
        with self._locked(node_id) as node:
            for worker in node.workers:
                path = worker.vm_root / "etc" / "hosts"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)

    def set_scheduling(self, node_id: str, scheduling: dict[str, str]) -> None:
        """Replace what the workers serve under instance/scheduling/ besides `preemptible`."""
        with self._locked(node_id) as node:
            node.scheduling = dict(scheduling)
            node.version += 1

    def boot(self, node_id: str) -> None:
        """One boot of every worker: count it and start the startup script, as the guest agent."""
        with self._locked(node_id) as node:
            script = node.metadata.get("startup-script", "")
            started: list[subprocess.Popen[bytes]] = []
            for worker in node.workers:
                count = vm.bump_boot_count(worker.vm_root)
                if not script.strip():
                    continue
                home = worker.vm_root / "root"
                home.mkdir(parents=True, exist_ok=True)
                env = worker.process_env("root", home)
                started.append(vm.start_startup_script(worker.vm_root, count, script, env))
            if started:
                self._call(self._watch_children(started))

    async def _watch_children(self, procs: list[subprocess.Popen[bytes]]) -> None:
        assert self._reaper is not None
        for proc in procs:
            self._reaper.watch(proc)

    def stop_node(self, node_id: str, grace: float | None, shutdown: float = 0.0) -> None:
        """Stop every process of the node (vm.stop_processes): with a `grace`, SIGTERM to the
        TPU program (what holds the devices) first, then a graceful shutdown of up to
        `shutdown` seconds; without one, SIGKILL now.

        The VM went down, so SSH connections to it are dropped as well.
        """
        with self._locked(node_id) as node:
            self._kill(node, grace, shutdown)
            self._call(self._drop_connections(node))

    def _kill(self, node: PlaneNode, grace: float | None, shutdown: float = 0.0) -> None:
        prefix = node.identity.node_id

        def select(marker: str) -> bool:
            return marker.rpartition("/")[0] == prefix

        roots = [worker.vm_root for worker in node.workers]
        vm.stop_processes(self.instance_id, select, grace, vm_roots=roots, shutdown=shutdown)

    async def _drop_connections(self, node: PlaneNode) -> None:
        for worker in node.workers:
            if worker.endpoint is not None:
                worker.endpoint.drop_connections()
        assert self._reaper is not None
        await self._reaper.settle(0.5)

    def delete_node(self, node_id: str) -> None:
        """Kill everything, close the node's listeners and remove its disks."""
        with self._locked(node_id) as node:
            self._kill(node, None)
            with self._lock:
                self._nodes.pop(node_id, None)
            node.deleted = True
            self._call(self._close_nodes([node]))
            vm.remove_tree(self.state_dir / "vms" / node_id)
            vm.remove_tree(self.state_dir / "sshd" / node_id)

    def replace_disk(self, node_id: str) -> None:
        """A repaired VM: processes killed, fresh empty VM roots; IPs and host keys stay."""
        with self._locked(node_id) as node:
            self._kill(node, None)
            self._call(self._drop_connections(node))
            chips = identity_chips(node.identity)
            for worker in node.workers:
                vm.remove_tree(worker.vm_root)
                vm.create_vm_root(worker.vm_root, chips)
                worker.refresh_authorized_keys()

    def set_ssh_fault(self, node_id: str, worker: int, mode: str | None) -> None:
        """Fault "hang": connections accepted but never answered; "refuse": nothing listens."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {FAULT_MODES}, not {mode!r}")
        with self._locked(node_id):
            endpoint = self._worker(node_id, worker).endpoint
            if endpoint is not None:
                self._call(endpoint.set_fault(mode))

    def rotate_host_key(self, node_id: str, worker: int) -> WorkerInfo:
        """A new host key for one worker's SSH server, as a rebuilt VM has; connections
        already open keep the old one. The worker as the control plane publishes it."""
        from tpuctl.emulator.vms import sshd

        with self._locked(node_id):
            target = self._worker(node_id, worker)
            target.host_key, target.host_key_line = sshd.generate_host_key()
            if target.endpoint is not None:
                self._call(target.endpoint.set_host_key(target.host_key))
            return WorkerInfo(target.index, target.ip, target.host_key_line)

    def worker_processes(self, node_id: str, worker: int) -> list[int]:
        """Live pids of one worker (whatever session or daemon started them)."""
        marker = self._worker(node_id, worker).marker
        return sorted(
            pid for pid, found in vm.scan_processes(self.instance_id).items() if found == marker
        )

    def vm_root(self, node_id: str, worker: int) -> Path:
        return self._worker(node_id, worker).vm_root

    # -- helpers -------------------------------------------------------------------------
    def _ip_for(self, host: int) -> str:
        # 254 hosts per third octet (.1-.254), moving to the next second octet when full.
        octet2 = self._octet + host // (256 * 254)
        if self._octet < firewall.RESERVED_OCTET <= octet2:
            octet2 += 1  # 127.235.x.x holds the emulated IAP range
        if octet2 > 254:
            raise RuntimeError("the emulator ran out of loopback addresses")
        rest = host % (256 * 254)
        return f"127.{octet2}.{rest // 254}.{rest % 254 + 1}"

    def _allocate_ip(self) -> str:
        with self._lock:
            host = self._next_host
            self._next_host += 1
        return self._ip_for(host)

    def is_worker_ip(self, address: str) -> bool:
        """Whether `address` is one of this emulator's workers (the firewall's "same VPC")."""
        with self._lock:
            nodes = list(self._nodes.values())
        return any(worker.ip == address for node in nodes for worker in node.workers)

    def _require_started(self) -> None:
        if self._loop is None:
            raise RuntimeError("WorkerPlane.start() has not been called")
        if self._closed:
            raise RuntimeError("WorkerPlane is closed")

    def _node(self, node_id: str) -> PlaneNode:
        self._require_started()
        with self._lock:
            node = self._nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"emulated node {node_id!r} does not exist", resource=node_id)
        return node

    @contextlib.contextmanager
    def _locked(self, node_id: str) -> Iterator[PlaneNode]:
        """The node, held against other lifecycle operations; NotFoundError once deleted."""
        node = self._node(node_id)
        with node.lock:
            if node.deleted:
                raise NotFoundError(f"emulated node {node_id!r} does not exist", resource=node_id)
            yield node

    def _worker(self, node_id: str, worker: int) -> PlaneWorker:
        node = self._node(node_id)
        if not 0 <= worker < len(node.workers):
            raise NotFoundError(
                f"emulated node {node_id!r} has no worker {worker}", resource=node_id
            )
        return node.workers[worker]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        assert loop is not None
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("WorkerPlane methods must not be called from its own loop")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()
