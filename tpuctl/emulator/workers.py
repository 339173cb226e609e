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
import os
import random
import socket
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.emulator import metadata as metadata_server
from tpuctl.emulator import vm
from tpuctl.errors import NotFoundError
from tpuctl.topology import AcceleratorError, parse_accelerator

if TYPE_CHECKING:
    import subprocess

    import asyncssh

    from tpuctl.emulator import sshd

T = TypeVar("T")

SSH_SERVERS = ("asyncssh", "openssh")
FAULT_MODES = (None, "hang", "refuse")
_BIND_ATTEMPTS = 8


@dataclass(frozen=True)
class NodeIdentity:
    """Who a node is: what its workers' metadata servers report."""

    node_id: str
    node_name: str
    project: str
    zone: str
    accelerator_type: str
    workers: int
    slice_index: int
    num_slices: int
    preemptible: bool
    autocheckpoint: bool
    topology: str


@dataclass(frozen=True)
class WorkerInfo:
    worker: int
    ip: str
    host_key: str  # the public host key line, "ssh-ed25519 AAAA..."


def _chips_per_vm(accelerator_type: str) -> int:
    try:
        return parse_accelerator(accelerator_type).chips_per_vm
    except AcceleratorError:
        return 4  # an unknown type still gets devices; 4 is the common TPU VM shape


class _Worker:
    """One emulated TPU VM (implements sshd.SessionHost)."""

    def __init__(self, plane: WorkerPlane, node: _Node, index: int, ip: str) -> None:
        self.plane = plane
        self.node = node
        self.index = index
        self.ip = ip
        self.vm_root = plane.state_dir / "vms" / node.identity.node_id / str(index)
        self.host_key: asyncssh.SSHKey | None = None
        self.host_key_line = ""
        self.endpoint: sshd.Endpoint | None = None
        self.metadata_listener: asyncio.Server | None = None
        self._tree: tuple[int, metadata_server.MetadataTree] | None = None

    @property
    def marker(self) -> str:
        return f"{self.node.identity.node_id}/{self.index}"

    @property
    def sshd_dir(self) -> Path:
        return self.plane.state_dir / "sshd" / self.node.identity.node_id / str(self.index)

    def marker_env(self) -> dict[str, str]:
        """What every process on this VM inherits beyond the login basics."""
        return {
            "GCE_METADATA_HOST": f"{self.ip}:{self.plane.metadata_port}",
            "TPUCTL_VM_ROOT": str(self.vm_root),
            vm.EMULATOR_MARKER: self.plane.instance_id,
            vm.WORKER_MARKER: self.marker,
        }

    def process_env(self, user: str, home: Path) -> dict[str, str]:
        return {
            "HOME": str(home),
            "USER": user,
            "LOGNAME": user,
            "SHELL": vm.BASH,
            "PATH": os.environ.get("PATH", vm.DEFAULT_PATH),
            "LANG": "C.UTF-8",
            **self.marker_env(),
        }

    # sshd.SessionHost
    def authorized_keys(self, user: str) -> asyncssh.SSHAuthorizedKeys | None:
        return self.node.authorized_keys(user)

    def session_env(self, user: str) -> tuple[Path, dict[str, str]]:
        home = self.vm_root / "home" / user
        home.mkdir(parents=True, exist_ok=True)
        return home, self.process_env(user, home)

    def metadata_tree(self) -> metadata_server.MetadataTree:
        version, node = self.node.version, self.node
        cached = self._tree
        if cached is not None and cached[0] == version:
            return cached[1]
        identity = node.identity
        view = metadata_server.WorkerView(
            node_id=identity.node_id,
            node_name=identity.node_name,
            project=identity.project,
            zone=identity.zone,
            accelerator_type=identity.accelerator_type,
            topology=identity.topology,
            preemptible=identity.preemptible,
            worker=self.index,
            worker_ips=tuple(worker.ip for worker in node.workers),
            slice_index=identity.slice_index,
            num_slices=identity.num_slices,
            coordinator=node.coordinator_address(),
        )
        tree = metadata_server.metadata_tree(view, node.metadata)
        self._tree = (version, tree)
        return tree


class _Node:
    def __init__(
        self, identity: NodeIdentity, metadata: Mapping[str, str], coordinator: str | None
    ) -> None:
        self.identity = identity
        self.coordinator = coordinator
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()  # serializes lifecycle operations on this node
        self.version = 0
        self.metadata: dict[str, str] = {}
        self.keys: dict[str, list[str]] = {}
        self._key_cache: dict[str, asyncssh.SSHAuthorizedKeys] = {}
        self.deleted = False
        self.set_metadata(metadata)

    def coordinator_address(self) -> str | None:
        """MEGASCALE_COORDINATOR_ADDRESS: given for slices ≥ 1; slice 0 is the coordinator."""
        if self.coordinator is not None or self.identity.num_slices <= 1 or not self.workers:
            return self.coordinator
        return f"{self.workers[0].ip}:{metadata_server.COORDINATOR_PORT}"

    def set_metadata(self, metadata: Mapping[str, str]) -> None:
        from tpuctl.emulator import sshd

        # Replace, never mutate: the loop thread reads these without the node lock.
        self.keys = sshd.parse_ssh_keys(metadata.get("ssh-keys", ""))
        self._key_cache = {}
        self.metadata = dict(metadata)
        self.version += 1

    def authorized_keys(self, user: str) -> asyncssh.SSHAuthorizedKeys | None:
        from tpuctl.emulator import sshd

        cache = self._key_cache
        if user not in cache:
            lines = self.keys.get(user)
            if not lines:
                return None
            cache[user] = sshd.authorized_keys(lines)
        return cache[user]


class WorkerPlane:
    """Every worker VM of the emulator; see the module docstring."""

    def __init__(
        self,
        state_dir: Path,
        *,
        ssh_port: int = 0,
        speed: float = 1.0,
        ssh_server: str = "asyncssh",
    ) -> None:
        if ssh_server not in SSH_SERVERS:
            raise ValueError(f"ssh_server must be one of {', '.join(SSH_SERVERS)}")
        self.state_dir = Path(state_dir).absolute()
        # Real processes run at real speed; kept for symmetry with the control plane's clock.
        self.speed = speed
        self.ssh_server = ssh_server
        self.instance_id = uuid.uuid4().hex
        self._requested_ssh_port = ssh_port
        # Second octet chosen per instance, so two emulators (or test runs) rarely share IPs;
        # never 0, so never 127.0.0.1.
        self._octet = random.SystemRandom().randint(16, 239)
        self._next_host = 1  # host 0 (127.a.0.1) holds the port reservations
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
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
            from tpuctl.emulator import sshd

            sshd.write_shim_home(self._shim_home)

    async def _make_options(self) -> asyncssh.SSHServerConnectionOptions:
        from tpuctl.emulator import sshd

        return await sshd.server_options()

    @property
    def _shim_home(self) -> Path:
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

    async def _close_nodes(self, nodes: list[_Node]) -> None:
        for node in nodes:
            for worker in node.workers:
                await self._close_worker(worker)

    async def _close_worker(self, worker: _Worker) -> None:
        if worker.endpoint is not None:
            await worker.endpoint.close()
            worker.endpoint = None
        if worker.metadata_listener is not None:
            worker.metadata_listener.close()
            worker.metadata_listener = None

    # -- nodes ---------------------------------------------------------------------------
    def create_node(
        self, identity: NodeIdentity, metadata: dict[str, str], *, coordinator: str | None
    ) -> list[WorkerInfo]:
        """Create every worker of a node with a fresh disk; SSH and metadata answer at once."""
        self._require_started()
        if identity.workers < 1:
            raise ValueError(f"node {identity.node_id} needs at least one worker")
        node = _Node(identity, metadata, coordinator)
        with self._lock:
            if identity.node_id in self._nodes:
                raise ValueError(f"emulated node {identity.node_id} already exists")
            self._nodes[identity.node_id] = node
        from tpuctl.emulator import sshd

        try:
            with node.lock:
                chips = _chips_per_vm(identity.accelerator_type)
                for index in range(identity.workers):
                    worker = _Worker(self, node, index, self._allocate_ip())
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

    async def _start_workers(self, node: _Node) -> None:
        if self.ssh_server == "openssh":
            # sshd processes start slowly: bring them up side by side.
            for worker in node.workers:
                await self._bind_metadata(worker)
            await asyncio.gather(*(self._start_openssh(worker) for worker in node.workers))
            return
        for worker in node.workers:
            for attempt in range(_BIND_ATTEMPTS):
                try:
                    await self._bind_metadata(worker)
                    await self._start_asyncssh(worker)
                    break
                except OSError as exc:
                    from tpuctl.emulator import sshd

                    await self._close_worker(worker)
                    if not sshd.is_address_in_use(exc) or attempt == _BIND_ATTEMPTS - 1:
                        raise
                    worker.ip = self._allocate_ip()  # another emulator holds this address

    async def _bind_metadata(self, worker: _Worker) -> None:
        worker.metadata_listener = await metadata_server.serve_metadata(
            worker.ip, self.metadata_port, worker.metadata_tree
        )

    async def _start_asyncssh(self, worker: _Worker) -> None:
        from tpuctl.emulator import sshd

        assert self._reaper is not None and self._options is not None
        assert worker.host_key is not None
        endpoint = sshd.AsyncSshEndpoint(
            worker,
            ip=worker.ip,
            port=self.ssh_port,
            host_key=worker.host_key,
            options=self._options,
            reaper=self._reaper,
        )
        await endpoint.start()
        worker.endpoint = endpoint

    async def _start_openssh(self, worker: _Worker) -> None:
        from tpuctl.emulator import sshd

        assert worker.host_key is not None
        endpoint = sshd.OpenSshEndpoint(
            ip=worker.ip,
            port=self.ssh_port,
            host_key=worker.host_key,
            workdir=worker.sshd_dir,
            session_env=worker.marker_env(),
            shim_home=self._shim_home,
            homes=worker.vm_root / "home",
        )
        endpoint.write_authorized_keys(worker.node.keys)
        worker.endpoint = endpoint
        await endpoint.start()

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None:
        """Replace the node's metadata; new ssh-keys and values apply to the next request."""
        from tpuctl.emulator import sshd

        with self._locked(node_id) as node:
            node.set_metadata(metadata)
            for worker in node.workers:
                if isinstance(worker.endpoint, sshd.OpenSshEndpoint):
                    worker.endpoint.write_authorized_keys(node.keys)

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

    def stop_node(self, node_id: str, grace: float | None) -> None:
        """SIGTERM every process of the node, SIGKILL what is left after `grace` (None: now).

        The VM went down, so SSH connections to it are dropped as well.
        """
        with self._locked(node_id) as node:
            self._kill(node, grace)
            self._call(self._drop_connections(node))

    def _kill(self, node: _Node, grace: float | None) -> None:
        prefix = node.identity.node_id

        def select(marker: str) -> bool:
            return marker.rpartition("/")[0] == prefix

        vm.stop_processes(self.instance_id, select, grace)

    async def _drop_connections(self, node: _Node) -> None:
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
        from tpuctl.emulator import sshd

        with self._locked(node_id) as node:
            self._kill(node, None)
            self._call(self._drop_connections(node))
            chips = _chips_per_vm(node.identity.accelerator_type)
            for worker in node.workers:
                vm.remove_tree(worker.vm_root)
                vm.create_vm_root(worker.vm_root, chips)
                if isinstance(worker.endpoint, sshd.OpenSshEndpoint):
                    worker.endpoint.write_authorized_keys(node.keys)

    def set_ssh_fault(self, node_id: str, worker: int, mode: str | None) -> None:
        """Fault "hang": connections accepted but never answered; "refuse": nothing listens."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {FAULT_MODES}, not {mode!r}")
        with self._locked(node_id):
            endpoint = self._worker(node_id, worker).endpoint
            if endpoint is not None:
                self._call(endpoint.set_fault(mode))

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
        if octet2 > 254:
            raise RuntimeError("the emulator ran out of loopback addresses")
        rest = host % (256 * 254)
        return f"127.{octet2}.{rest // 254}.{rest % 254 + 1}"

    def _allocate_ip(self) -> str:
        with self._lock:
            host = self._next_host
            self._next_host += 1
        return self._ip_for(host)

    def _require_started(self) -> None:
        if self._loop is None:
            raise RuntimeError("WorkerPlane.start() has not been called")
        if self._closed:
            raise RuntimeError("WorkerPlane is closed")

    def _node(self, node_id: str) -> _Node:
        self._require_started()
        with self._lock:
            node = self._nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"emulated node {node_id!r} does not exist", resource=node_id)
        return node

    @contextlib.contextmanager
    def _locked(self, node_id: str) -> Iterator[_Node]:
        """The node, held against other lifecycle operations; NotFoundError once deleted."""
        node = self._node(node_id)
        with node.lock:
            if node.deleted:
                raise NotFoundError(f"emulated node {node_id!r} does not exist", resource=node_id)
            yield node

    def _worker(self, node_id: str, worker: int) -> _Worker:
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
