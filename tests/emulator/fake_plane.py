"""An in-memory worker plane for control-plane tests: records calls, runs no process."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FakeIdentity:
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
    external_ips: bool = True


@dataclass(frozen=True)
class FakeWorker:
    worker: int
    ip: str
    host_key: str


@dataclass
class FakeNode:
    identity: FakeIdentity
    metadata: dict[str, str]
    coordinator: str | None
    workers: list[FakeWorker]
    boots: int = 0
    stops: list[float | None] = field(default_factory=list)
    disks: int = 1
    ssh_faults: dict[int, str | None] = field(default_factory=dict)
    instance_state: dict[str, str] = field(default_factory=dict)
    hosts: str = ""
    scheduling: dict[str, str] = field(default_factory=dict)


class FakeWorkerPlane:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nodes: dict[str, FakeNode] = {}
        self.deleted: list[str] = []
        self._ips = itertools.count(2)
        self.closed = False

    @property
    def ssh_port(self) -> int:
        return 2222

    def start(self) -> None:
        pass

    def create_node(
        self, identity: Any, metadata: dict[str, str], *, coordinator: str | None
    ) -> list[FakeWorker]:
        with self._lock:
            workers = []
            for index in range(identity.workers):
                n = next(self._ips)
                workers.append(
                    FakeWorker(index, f"127.1.{n // 250}.{n % 250}", f"ssh-ed25519 KEY{n}")
                )
            self.nodes[identity.node_id] = FakeNode(identity, dict(metadata), coordinator, workers)
            return workers

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None:
        with self._lock:
            self.nodes[node_id].metadata = dict(metadata)

    def set_instance_state(self, node_id: str, state: dict[str, str]) -> None:
        with self._lock:
            self.nodes[node_id].instance_state = dict(state)

    def set_hosts(self, node_id: str, text: str) -> None:
        with self._lock:
            self.nodes[node_id].hosts = text

    def set_scheduling(self, node_id: str, scheduling: dict[str, str]) -> None:
        with self._lock:
            self.nodes[node_id].scheduling = dict(scheduling)

    def boot(self, node_id: str) -> None:
        with self._lock:
            self.nodes[node_id].boots += 1

    def stop_node(self, node_id: str, grace: float | None, shutdown: float = 0.0) -> None:
        with self._lock:
            if node_id in self.nodes:
                self.nodes[node_id].stops.append(grace)

    def delete_node(self, node_id: str) -> None:
        with self._lock:
            self.nodes.pop(node_id)
            self.deleted.append(node_id)

    def replace_disk(self, node_id: str) -> None:
        with self._lock:
            self.nodes[node_id].disks += 1

    def set_ssh_fault(self, node_id: str, worker: int, mode: str | None) -> None:
        with self._lock:
            self.nodes[node_id].ssh_faults[worker] = mode

    def rotate_host_key(self, node_id: str, worker: int) -> FakeWorker:
        with self._lock:
            node = self.nodes[node_id]
            old = node.workers[worker]
            node.workers[worker] = FakeWorker(worker, old.ip, f"ssh-ed25519 KEY{next(self._ips)}")
            return node.workers[worker]

    def close(self) -> None:
        self.closed = True
