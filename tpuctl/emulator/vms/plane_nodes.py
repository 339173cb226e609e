"""A node of the worker plane and its worker VMs: identity, metadata, keys and servers.

Also what a session or process on a VM inherits. workers.py (the WorkerPlane) runs them.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tpuctl.emulator.vms import firewall, vm
from tpuctl.emulator.vms import metadata as metadata_server
from tpuctl.emulator.vms.access import Access
from tpuctl.topology import AcceleratorError, parse_accelerator

if TYPE_CHECKING:
    import asyncssh

    from tpuctl.emulator.vms.sshd_asyncssh import AsyncSshEndpoint
    from tpuctl.emulator.vms.sshd_openssh import OpenSshEndpoint


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
    # network_config.enable_external_ips: without them, a firewall (firewall.py) admits SSH
    # only from IAP's range and from the emulator's own workers.
    external_ips: bool = True
    chips_per_vm: int = 0  # TPU chips on each VM; 0: as accelerator_type says


@dataclass(frozen=True)
class InstanceIdentity(NodeIdentity):
    """A Compute Engine instance: one VM (workers=1) whose metadata server is Compute Engine's
    (metadata.instance_tree), its attributes the instance's metadata items as they are."""

    instance_name: str = ""
    instance_id: str = ""
    machine_type: str = ""
    automatic_restart: bool = True
    on_host_maintenance: str = "TERMINATE"


@dataclass(frozen=True)
class WorkerInfo:
    worker: int
    ip: str
    host_key: str  # the public host key line, "ssh-ed25519 AAAA..."


class HostPlane(Protocol):
    """What a worker VM needs from the worker plane that runs it (workers.WorkerPlane), as a
    Protocol so that this module does not import workers.py, which imports it."""

    @property
    def state_dir(self) -> Path: ...

    @property
    def instance_id(self) -> str: ...

    @property
    def speed(self) -> float: ...

    @property
    def ssh_port(self) -> int: ...

    @property
    def metadata_port(self) -> int: ...

    def is_worker_ip(self, address: str) -> bool: ...


def identity_chips(identity: NodeIdentity) -> int:
    """TPU chips on each VM of the node (its /dev/accel* devices)."""
    return identity.chips_per_vm or chips_per_vm(identity.accelerator_type)


def chips_per_vm(accelerator_type: str) -> int:
    try:
        return parse_accelerator(accelerator_type).chips_per_vm
    except AcceleratorError:
        return 4  # an unknown type still gets devices; 4 is the common TPU VM shape


class PlaneWorker:
    """One emulated TPU VM (implements sshd_asyncssh.SessionHost)."""

    def __init__(self, plane: HostPlane, node: PlaneNode, index: int, ip: str) -> None:
        self.plane = plane
        self.node = node
        self.index = index
        self.ip = ip
        self.vm_root = plane.state_dir / "vms" / node.identity.node_id / str(index)
        self.host_key: asyncssh.SSHKey | None = None
        self.host_key_line = ""
        self.endpoint: AsyncSshEndpoint | OpenSshEndpoint | None = None
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
            # google-auth reads the metadata host from the first and pings the second: both
            # are this VM's own metadata server, never the link-local address.
            "GCE_METADATA_HOST": f"{self.ip}:{self.plane.metadata_port}",
            "GCE_METADATA_IP": f"{self.ip}:{self.plane.metadata_port}",
            "TPUCTL_VM_ROOT": str(self.vm_root),
            # Emulated intervals are real ones ÷ this: a script that waits for a time the
            # metadata server gives (termination-time) scales its own margins by it.
            "TPUCTL_EMULATOR_SPEED": f"{self.plane.speed:g}",
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

    # sshd_asyncssh.SessionHost
    def authorized_keys(self, user: str) -> asyncssh.SSHAuthorizedKeys | None:
        return self.node.authorized_keys(user)

    def session_env(self, user: str) -> tuple[Path, dict[str, str]]:
        home = self.vm_root / "home" / user
        home.mkdir(parents=True, exist_ok=True)
        return home, self.process_env(user, home)

    @property
    def firewalled(self) -> bool:
        return not self.node.identity.external_ips

    def admits(self, source: str) -> bool:
        """No external IP: SSH only from IAP's range or from a worker (the same VPC)."""
        if not self.firewalled or firewall.from_iap(source):
            return True
        return self.plane.is_worker_ip(source)

    def metadata_tree(self) -> metadata_server.MetadataTree:
        version, node = self.node.version, self.node
        cached = self._tree
        if cached is not None and cached[0] == version:
            return cached[1]
        identity = node.identity
        if isinstance(identity, InstanceIdentity):
            tree = metadata_server.instance_tree(
                metadata_server.InstanceView(
                    name=identity.instance_name,
                    instance_id=identity.instance_id,
                    project=identity.project,
                    zone=identity.zone,
                    machine_type=identity.machine_type,
                    ip=self.ip,
                    preemptible=identity.preemptible,
                    automatic_restart=identity.automatic_restart,
                    on_host_maintenance=identity.on_host_maintenance,
                ),
                node.metadata,
                node.instance_state,
            )
            self._tree = (version, tree)
            return tree
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
        tree = metadata_server.metadata_tree(view, node.metadata, node.scheduling)
        self._tree = (version, tree)
        return tree

    # -- its servers (on the worker plane's loop) ----------------------------------------
    # The sshd_* modules import asyncssh, an optional dependency: they are imported when a
    # server starts, so this module imports without it.
    async def serve_metadata(self) -> None:
        self.metadata_listener = await metadata_server.serve_metadata(
            self.ip, self.plane.metadata_port, self.metadata_tree
        )

    async def serve_asyncssh(
        self, options: asyncssh.SSHServerConnectionOptions, reaper: vm.ChildReaper
    ) -> None:
        from tpuctl.emulator.vms import sshd_asyncssh

        assert self.host_key is not None
        endpoint = sshd_asyncssh.AsyncSshEndpoint(
            self,
            ip=self.ip,
            port=self.plane.ssh_port,
            host_key=self.host_key,
            options=options,
            reaper=reaper,
        )
        await endpoint.start()
        self.endpoint = endpoint

    async def serve_openssh(self, shim_home: Path) -> None:
        from tpuctl.emulator.vms import sshd_openssh

        assert self.host_key is not None
        endpoint = sshd_openssh.OpenSshEndpoint(
            ip=self.ip,
            port=self.plane.ssh_port,
            host_key=self.host_key,
            workdir=self.sshd_dir,
            session_env=self.marker_env(),
            shim_home=shim_home,
            homes=self.vm_root / "home",
        )
        endpoint.write_authorized_keys(self.node.keys)
        self.endpoint = endpoint
        await endpoint.start()

    def refresh_authorized_keys(self) -> None:
        """OpenSSH reads keys from files: rewrite them from the node's `ssh-keys` (asyncssh
        asks the node at each login instead)."""
        from tpuctl.emulator.vms import sshd_openssh

        if isinstance(self.endpoint, sshd_openssh.OpenSshEndpoint):
            self.endpoint.write_authorized_keys(self.node.keys)

    async def close_servers(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.close()
            self.endpoint = None
        if self.metadata_listener is not None:
            self.metadata_listener.close()
            self.metadata_listener = None


class PlaneNode:
    """A node's workers, metadata and keys; `lock` serializes its lifecycle operations."""

    def __init__(
        self,
        identity: NodeIdentity,
        metadata: Mapping[str, str],
        coordinator: str | None,
        access: Access | None = None,
    ) -> None:
        self.access = access or Access()
        self.identity = identity
        self.coordinator = coordinator
        self.workers: list[PlaneWorker] = []
        self.lock = threading.Lock()  # serializes lifecycle operations on this node
        self.version = 0
        self.metadata: dict[str, str] = {}
        self.instance_state: dict[str, str] = {}  # metadata.instance_tree's `state`
        # instance/scheduling/ beyond `preemptible` (termination-time), replaced, never mutated.
        self.scheduling: dict[str, str] = {}
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
        from tpuctl.emulator.vms import sshd

        # Replace, never mutate: the loop thread reads these without the node lock.
        self.keys = sshd.parse_ssh_keys(metadata.get("ssh-keys", ""))
        self._key_cache = {}
        self.metadata = dict(metadata)
        self.version += 1

    def set_instance_state(self, state: Mapping[str, str]) -> None:
        self.instance_state = dict(state)  # replaced, never mutated (read off the lock)
        self.version += 1

    def authorized_keys(self, user: str) -> asyncssh.SSHAuthorizedKeys | None:
        """The keys `user` may log in with: with OS Login on (the node's metadata, else its
        project's), only the unexpired keys the OS Login API holds for that POSIX user; else
        the node's `ssh-keys` metadata."""
        from tpuctl.emulator.vms import sshd

        if self.access.os_login(self.identity.project, self.metadata):
            imported = self.access.oslogin_keys(user)
            return sshd.authorized_keys(imported) if imported else None
        cache = self._key_cache
        if user not in cache:
            lines = self.keys.get(user)
            if not lines:
                return None
            cache[user] = sshd.authorized_keys(lines)
        return cache[user]
