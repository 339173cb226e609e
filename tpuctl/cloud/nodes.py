"""A queued resource's nodes through the API: in slice order, the host keys their workers
publish (guest attributes), their `ssh-keys` metadata, and whether they are settled."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpuctl.cloud.client import TpuApi, api_errors, make_retry
from tpuctl.cloud.describe import enum_name, short_name, state_name, template_of
from tpuctl.cloud.oslogin import node_setting
from tpuctl.errors import AuthError, NotFoundError, TpuctlError

HOSTKEY_NAMESPACE = "hostkeys/"
HOSTNAME = "hostname"  # the guest attribute holding a worker's VM instance name
SSH_KEYS = "ssh-keys"
PUBLISH_ATTEMPTS = 6
PUBLISH_TIMEOUT = 120.0
# (algorithm, base64 blob), e.g. ("ssh-ed25519", "AAAA…")
HostKey = tuple[str, str]


@dataclass(frozen=True)
class ResolvedNodes:
    """The QR's nodes in slice order (node protos), as read once for a fan-out."""

    queued_resource: str
    nodes: tuple[Any, ...]

    @property
    def node_ids(self) -> list[str]:
        return [short_name(node.name) for node in self.nodes]


def resolve_nodes(api: TpuApi, queued_resource_id: str) -> ResolvedNodes:
    """The QR's nodes, in slice order: its node ids (or `<prefix>-0..n-1`), else a node list
    filtered by `queued_resource`. Raises when the QR has no nodes (not provisioned yet)."""
    queued_resource = api.get_queued_resource(queued_resource_id)
    state = state_name(queued_resource)
    nodes: list[Any] = []
    for node_id in template_of(queued_resource).node_ids:
        node = api.get_node(api.location.node_name(node_id))
        if node is not None:
            nodes.append(node)
    if not nodes:
        owned = [n for n in api.list_nodes() if n.queued_resource == queued_resource.name]
        nodes = sorted(owned, key=lambda n: _node_order(short_name(n.name)))
    if not nodes:
        raise NotFoundError(
            f"queued resource {queued_resource_id} has no nodes (state {state})",
            hint="wait until it is ACTIVE: tpuctl wait " + queued_resource_id,
            resource=queued_resource.name,
        )
    return ResolvedNodes(queued_resource.name, tuple(nodes))


def _node_order(node_id: str) -> tuple[str, int]:
    prefix, _, index = node_id.rpartition("-")
    return (prefix, int(index)) if index.isdigit() else (node_id, -1)


def host_keys(api: TpuApi, node_ids: Sequence[str]) -> dict[tuple[str, int], list[HostKey]]:
    """The host keys each worker of each node published in guest attributes (`hostkeys/`),
    by (node id, worker index); a worker that published none is absent or has []."""
    keys: dict[tuple[str, int], list[HostKey]] = {}
    for node_id in dict.fromkeys(node_ids):
        name = api.location.node_name(node_id)
        # No worker_ids: every worker, in worker order (a GuestAttributes carries no index).
        with api_errors("get guest attributes of", name):
            response = api.client.get_guest_attributes(
                request={"name": name, "query_path": HOSTKEY_NAMESPACE},
                retry=make_retry(total_seconds=api.retry_total, reads=True),
                timeout=api.timeout,
            )
        for worker, attributes in enumerate(response.guest_attributes):
            items = attributes.query_value.items if attributes.query_value else []
            keys[(node_id, worker)] = [
                (item.key, item.value.split()[0])
                for item in items
                if item.namespace.strip("/") == "hostkeys" and item.value.strip()
            ]
    return keys


def instance_names(api: TpuApi, node_ids: Sequence[str]) -> dict[tuple[str, int], str]:
    """Each worker's VM instance name, by (node id, worker index): the `hostname` guest
    attribute, which `gcloud compute start-iap-tunnel` takes. Read as gcloud reads it (tpu_vm
    ssh.py): every guest attribute of the node, the first item whose key is `hostname`,
    whatever its namespace. A worker that publishes none is absent."""
    names: dict[tuple[str, int], str] = {}
    for node_id in dict.fromkeys(node_ids):
        name = api.location.node_name(node_id)
        with api_errors("get guest attributes of", name):
            response = api.client.get_guest_attributes(
                request={"name": name},
                retry=make_retry(total_seconds=api.retry_total, reads=True),
                timeout=api.timeout,
            )
        for worker, attributes in enumerate(response.guest_attributes):
            items = attributes.query_value.items if attributes.query_value else []
            found = next((item.value.strip() for item in items if item.key == HOSTNAME), "")
            if found:
                names[(node_id, worker)] = found
    return names


def node_disruption(api: TpuApi, node_ids: Sequence[str]) -> str | None:
    """Why the nodes are not settled, or None: a node missing, not READY (restarting,
    repairing, preempted…), unhealthy for maintenance, or with maintenance announced. An exit
    the job made then is part of a disruption (resume), not the job's own ending."""
    for node_id in dict.fromkeys(node_ids):
        node = api.get_node(api.location.node_name(node_id))
        if node is None:
            return f"node {node_id} is gone"
        state = enum_name(node.state)
        if state != "READY":
            return f"node {node_id} is {state or 'in an unknown state'}"
        if enum_name(node.health) == "UNHEALTHY_MAINTENANCE":
            return f"node {node_id} is under maintenance"
        if _maintenance_announced(node):
            return f"node {node_id} has maintenance announced"
    return None


def _maintenance_announced(node: Any) -> bool:
    upcoming = getattr(node, "upcoming_maintenance", None)
    if not upcoming:
        return False
    message = type(upcoming).pb(upcoming)
    return bool(message.ByteSize())


def nodes_settled(api: TpuApi, node_ids: Sequence[str]) -> bool:
    """Every node READY, healthy and with no maintenance announced."""
    return node_disruption(api, node_ids) is None


def simulate_maintenance(api: TpuApi, node_name: str, worker: int) -> None:
    """SimulateMaintenanceEvent on one worker of a node, through the real v2alpha1 API."""
    from google.cloud import tpu_v2alpha1

    request = tpu_v2alpha1.SimulateMaintenanceEventRequest(name=node_name, worker_ids=[str(worker)])
    with api_errors("simulate maintenance on", node_name):
        api.client.simulate_maintenance_event(request=request, timeout=api.timeout)


# ------------------------------------------------------------------------ ssh-keys metadata


def has_ssh_key(ssh_keys: str, user: str, blob: str) -> bool:
    """Whether `ssh-keys` metadata already holds `user:<algorithm> <blob> …`."""
    for raw in ssh_keys.splitlines():
        owner, sep, rest = raw.strip().partition(":")
        words = rest.split()
        if sep and owner == user and len(words) >= 2 and words[1] == blob:
            return True
    return False


def add_ssh_key(api: TpuApi, node_name: str, user: str, algorithm: str, blob: str) -> bool:
    """Add `user:<algorithm> <blob> user` to the node's `ssh-keys` metadata when absent, the
    way gcloud does (UpdateNode with update_mask=metadata, waiting for the operation). A
    concurrent update (ABORTED or 409) is retried from a fresh read. True if it was added.

    Called once OS Login was found off (tpuctl.cloud.oslogin); a node that turns it on by
    itself all the same ignores metadata keys: that is an AuthError.
    """
    from google.api_core import exceptions as api_exceptions

    line = f"{user}:{algorithm} {blob} {user}"
    for attempt in range(PUBLISH_ATTEMPTS):
        node = api.get_node(node_name)
        if node is None:
            raise TpuctlError(f"node {node_name} disappeared while publishing the SSH key")
        if node_setting(node.metadata):
            raise AuthError(
                f"node {short_name(node_name)} turns OS Login on (enable-oslogin: TRUE in its "
                "metadata), unlike the queued resource's first node, so it ignores the key "
                "published in its ssh-keys metadata",
                hint="give every node the same enable-oslogin (the spec's tpu.metadata), or "
                "set it once in the project's metadata",
                resource=node_name,
            )
        existing = str(dict(node.metadata).get(SSH_KEYS, ""))
        if has_ssh_key(existing, user, blob):
            return False
        metadata = dict(node.metadata)
        lines = [item for item in existing.splitlines() if item.strip()]
        metadata[SSH_KEYS] = "\n".join([*lines, line])
        request = {
            "node": {"name": node_name, "metadata": metadata},
            "update_mask": {"paths": ["metadata"]},
        }
        try:
            with api_errors("update metadata of", node_name):
                try:
                    operation = api.client.update_node(
                        request=request,
                        retry=make_retry(total_seconds=api.retry_total, reads=False),
                        timeout=api.timeout,
                    )
                    operation.result(timeout=PUBLISH_TIMEOUT)
                except (api_exceptions.Aborted, api_exceptions.Conflict):
                    raise _ConcurrentUpdate from None
        except _ConcurrentUpdate:
            time.sleep(min(0.2 * 2**attempt, 3.0))
            continue
        return True
    raise TpuctlError(
        f"could not add the SSH key to {node_name}: its metadata kept changing underneath",
        hint="retry in a minute",
        resource=node_name,
    )


class _ConcurrentUpdate(Exception):
    pass
