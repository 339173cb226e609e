"""Which workers a fan-out reaches: gcloud-style selectors over the nodes' workers and addresses."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tpuctl.errors import TpuctlError, UsageError, quoted

SSH_PORT_ENV = "TPUCTL_SSH_PORT"
DEFAULT_SSH_PORT = 22


@dataclass(frozen=True)
class WorkerTarget:
    """One TPU VM: `slice/worker`, its node, the address tpuctl connects to, its host keys.

    `host_keys` are "algorithm base64" pairs from the node's guest attributes (empty when
    none were published or checking is off). `node_uid` is the node's unique numeric id
    (Node.id), which names the worker's pinned host key (0 when unknown). `has_external_ip`
    says whether the node gave the worker one (else only IAP or a host in its VPC gets in);
    `instance` is its VM's instance name (the `hostname` guest attribute), for IAP tunnels.
    """

    slice_index: int
    node_id: str
    worker: int
    address: str
    port: int = DEFAULT_SSH_PORT
    host_keys: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    node_uid: int = field(default=0, compare=False)
    has_external_ip: bool = field(default=True, compare=False)
    instance: str = field(default="", compare=False)

    @property
    def label(self) -> str:
        return f"{self.slice_index}/{self.worker}"

    def with_host_keys(self, keys: Sequence[tuple[str, str]]) -> WorkerTarget:
        return replace(self, host_keys=tuple(keys))


# ---------------------------------------------------------------------------------- selectors


def parse_selector(text: str, *, what: str = "worker") -> frozenset[int] | None:
    """gcloud's syntax: `all` (None), `3`, `1,4,6`, `0-7`, or a mix (`0,2-3`).

    Raises UsageError naming the bad part.
    """
    value = text.strip().lower()
    if value in ("all", "*"):
        return None
    chosen: set[int] = set()
    for raw in value.split(","):
        part = raw.strip()
        low, dash, high = part.partition("-")
        try:
            if dash:
                first, last = int(low), int(high)
                if first > last:
                    raise ValueError
                chosen.update(range(first, last + 1))
            else:
                chosen.add(int(part))
        except ValueError:
            raise UsageError(
                f"bad --{what} value {quoted(text)}: {quoted(part)} is not an index or a range",
                hint=f"use all, 0, 1,3 or 0-7 (--{what})",
            ) from None
    if any(index < 0 for index in chosen):
        raise UsageError(f"bad --{what} value {quoted(text)}: indexes start at 0")
    return frozenset(chosen)


def select(
    targets: Sequence[WorkerTarget], *, nodes: str = "all", workers: str = "all"
) -> list[WorkerTarget]:
    """The targets whose slice index (or node id) and worker index match the selectors."""
    node_ids = {target.node_id for target in targets}
    named = {part.strip() for part in nodes.split(",")} & node_ids
    node_set = None if named else parse_selector(nodes, what="node")
    worker_set = parse_selector(workers, what="worker")
    slices = sorted({target.slice_index for target in targets})
    if node_set is not None and not named:
        missing = sorted(node_set - set(slices))
        if missing:
            raise UsageError(
                f"--node {nodes}: no slice {', '.join(map(str, missing))} "
                f"(this queued resource has slices {_span(slices)})"
            )
    chosen = [
        target
        for target in targets
        if (
            target.node_id in named if named else node_set is None or target.slice_index in node_set
        )
        and (worker_set is None or target.worker in worker_set)
    ]
    if worker_set is not None:
        present = {target.worker for target in chosen}
        missing = sorted(worker_set - present)
        if missing:
            have = sorted({target.worker for target in targets})
            raise UsageError(
                f"--worker {workers}: no worker {', '.join(map(str, missing))} "
                f"(the selected slices have workers {_span(have)})"
            )
    return chosen


def _span(values: Sequence[int]) -> str:
    if not values:
        return "none"
    if list(values) == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])
    return ",".join(map(str, values))


def ssh_port(flag: int | None, environ: Mapping[str, str] | None = None) -> int:
    """`--ssh-port` > TPUCTL_SSH_PORT > 22."""
    if flag:
        return flag
    env = os.environ if environ is None else environ
    raw = env.get(SSH_PORT_ENV, "").strip()
    if raw:
        try:
            port = int(raw)
        except ValueError:
            raise UsageError(f"{SSH_PORT_ENV}={quoted(raw)} is not a port number") from None
        if 0 < port < 65536:
            return port
        raise UsageError(f"{SSH_PORT_ENV}={quoted(raw)} is not a port number")
    return DEFAULT_SSH_PORT


# ------------------------------------------------------------------------------ addresses


def worker_targets(
    nodes: Sequence[Any], *, port: int, internal_ip: bool = False
) -> list[WorkerTarget]:
    """Every worker of every node (v2alpha1 Node protos, in slice order), slice by slice:
    external IP, or the internal one when asked (or when the node has no external IP)."""
    targets: list[WorkerTarget] = []
    for slice_index, node in enumerate(nodes):
        node_id = str(node.name).rsplit("/", 1)[-1]
        node_uid = int(getattr(node, "id", 0) or 0)
        for worker, endpoint in enumerate(node.network_endpoints):
            external = endpoint.access_config.external_ip if endpoint.access_config else ""
            address = endpoint.ip_address if internal_ip or not external else external
            if not address:
                raise TpuctlError(
                    f"worker {slice_index}/{worker} of node {node_id} has no IP address yet",
                    hint="wait until the queued resource is ACTIVE",
                    resource=node.name,
                )
            targets.append(
                WorkerTarget(
                    slice_index,
                    node_id,
                    worker,
                    address,
                    port,
                    node_uid=node_uid,
                    has_external_ip=bool(external),
                )
            )
    return targets
