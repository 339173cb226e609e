"""What the control plane needs from the worker plane (emulator/workers.py), as a Protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class WorkerInfoLike(Protocol):
    """One TPU VM of a node: its index, loopback address and SSH host key."""

    @property
    def worker(self) -> int: ...

    @property
    def ip(self) -> str: ...

    @property
    def host_key(self) -> str: ...  # "ssh-ed25519 AAAA..."


class WorkerPlaneAPI(Protocol):
    """The worker plane's contract; every method may block and is called off the RPC threads."""

    @property
    def ssh_port(self) -> int: ...

    def start(self) -> None: ...

    def create_node(
        self, identity: Any, metadata: dict[str, str], *, coordinator: str | None
    ) -> Sequence[WorkerInfoLike]: ...

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None: ...

    def set_instance_state(self, node_id: str, state: dict[str, str]) -> None: ...

    def set_hosts(self, node_id: str, text: str) -> None: ...

    def set_scheduling(self, node_id: str, scheduling: dict[str, str]) -> None:
        """What the workers' metadata servers serve under instance/scheduling/ besides
        `preemptible` (e.g. `termination-time`); replaces what was set before."""
        ...

    def boot(self, node_id: str) -> None: ...

    def stop_node(self, node_id: str, grace: float | None, shutdown: float = 0.0) -> None: ...

    def delete_node(self, node_id: str) -> None: ...

    def replace_disk(self, node_id: str) -> None: ...

    def set_ssh_fault(self, node_id: str, worker: int, mode: str | None) -> None: ...

    def rotate_host_key(self, node_id: str, worker: int) -> WorkerInfoLike: ...

    def close(self) -> None: ...
