"""Records → the API's messages: QueuedResource, Node and the long-running Operation, and
the REST-only fields of each (records.Extras)."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, TypeVar

from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import timestamp_pb2

from tpuctl.emulator.control.records import (
    Extras,
    Health,
    NodeRecord,
    NodeState,
    OperationRecord,
    QrState,
    QueuedResourceRecord,
)

TPU_RUNTIME_PORT = 8470  # NetworkEndpoint.port on Cloud TPU
HOSTNAME_KEY = "hostname"  # the guest attribute naming a worker's VM instance (for IAP)
# The QueuedResourceState oneof member each state sets (FAILED carries its error instead).
_STATE_DATA = {
    QrState.CREATING: "creating_data",
    QrState.ACCEPTED: "accepted_data",
    QrState.PROVISIONING: "provisioning_data",
    QrState.DELETING: "deleting_data",
    QrState.ACTIVE: "active_data",
    QrState.SUSPENDING: "suspending_data",
    QrState.SUSPENDED: "suspended_data",
}

T = TypeVar("T")


def copy_message(message: T) -> T:
    """A deep copy of a proto-plus message, so records never share state with callers."""
    kind: Any = type(message)
    return kind.deserialize(kind.serialize(message))  # type: ignore[no-any-return]


def operation_proto(operation: OperationRecord) -> operations_pb2.Operation:
    metadata = cloud_tpu.OperationMetadata(
        create_time=operation.create_time,
        target=operation.target,
        verb=operation.verb,
        status_detail=operation.status_detail,
        cancel_requested=operation.cancel_requested,
        api_version="v2alpha1",
    )
    if operation.end_time is not None:
        metadata.end_time = operation.end_time
    result = operations_pb2.Operation(name=operation.name, done=operation.done)
    result.metadata.Pack(cloud_tpu.OperationMetadata.pb(metadata))
    if operation.done and operation.error is not None:
        result.error.CopyFrom(operation.error)
    elif operation.done and operation.response is not None:
        result.response.Pack(operation.response)
    return result


def qr_proto(qr: QueuedResourceRecord) -> cloud_tpu.QueuedResource:
    result = copy_message(qr.spec)
    state = cloud_tpu.QueuedResourceState(state=qr.state, state_initiator=qr.initiator)
    if qr.state == QrState.FAILED:
        state.failed_data = cloud_tpu.QueuedResourceState.FailedData(error=qr.error)
    elif qr.state in _STATE_DATA:
        getattr(cloud_tpu.QueuedResourceState.pb(state), _STATE_DATA[qr.state]).SetInParent()
    result.state = state
    return result


def node_proto(node: NodeRecord) -> cloud_tpu.Node:
    result = copy_message(node.template)
    result.name = node.name
    result.state = NodeState(node.state)
    result.health = Health(node.health)
    result.create_time = node.create_time
    result.queued_resource = node.qr_name
    result.multislice_node = node.num_slices > 1
    result.id = node.numeric_id
    result.api_version = cloud_tpu.Node.ApiVersion(cloud_tpu.Node.ApiVersion.V2_ALPHA1)
    accelerator = node.accelerator
    result.accelerator_type = accelerator.accelerator_type
    result.accelerator_config = cloud_tpu.AcceleratorConfig(
        type_=getattr(cloud_tpu.AcceleratorConfig.Type, accelerator.family.config_type),
        topology=accelerator.topology,
    )
    result.network_config = _network_config(node, result.network_config)
    external = bool(node.template.network_config.enable_external_ips)
    endpoints = []
    for worker in node.workers:
        endpoint = cloud_tpu.NetworkEndpoint(ip_address=worker.ip, port=TPU_RUNTIME_PORT)
        if external:
            endpoint.access_config = cloud_tpu.AccessConfig(external_ip=worker.ip)
        endpoints.append(endpoint)
    result.network_endpoints = endpoints
    result.scheduling_config = cloud_tpu.SchedulingConfig(
        preemptible=node.tier == "best-effort",
        spot=node.tier == "spot",
        reserved=node.tier in ("guaranteed", "reservation-bound"),
    )
    if node.maintenance is not None:
        result.upcoming_maintenance = node.maintenance
    return result


def _network_config(node: NodeRecord, network: cloud_tpu.NetworkConfig) -> cloud_tpu.NetworkConfig:
    """The network as sent, with the default network and subnetwork filled in as GCE does."""
    project = node.parent.split("/")[1]
    if not network.network:
        network.network = f"projects/{project}/global/networks/default"
    if not network.subnetwork:
        region = node.parent.split("/")[3].rsplit("-", 1)[0]
        network.subnetwork = f"projects/{project}/regions/{region}/subnetworks/default"
    return network


def guest_attributes(
    query_path: str,
    host_keys: list[str | None],
    hostnames: list[str | None] | None = None,
) -> cloud_tpu.GetGuestAttributesResponse:
    """The guest attributes of the selected workers, in order: `hostkeys/<algorithm>` (None
    stands for a worker with no host key yet) and `hostname`, the VM's instance name that
    `gcloud compute start-iap-tunnel` takes (None: not published). A query path selects a
    namespace and key.

    Cloud TPU's namespace for `hostname` is not documented (gcloud looks for the key in a full
    listing, whatever its namespace): the emulator publishes it with none, in a full listing
    or for the query path `hostname`.
    """
    namespace, _, key = query_path.strip("/").partition("/")
    result = []
    for index, host_key in enumerate(host_keys):
        items = []
        if host_key:
            algorithm, _, blob = host_key.partition(" ")
            blob = blob.split(" ")[0]
            if namespace in ("", "hostkeys") and key in ("", algorithm):
                items.append(
                    cloud_tpu.GuestAttributesEntry(namespace="hostkeys", key=algorithm, value=blob)
                )
        hostname = hostnames[index] if hostnames is not None else None
        if hostname and namespace in ("", HOSTNAME_KEY) and not key:
            items.append(cloud_tpu.GuestAttributesEntry(key=HOSTNAME_KEY, value=hostname))
        result.append(
            cloud_tpu.GuestAttributes(
                query_path=query_path,
                query_value=cloud_tpu.GuestAttributesValue(items=items),
            )
        )
    return cloud_tpu.GetGuestAttributesResponse(guest_attributes=result)


def json_timestamp(moment: datetime) -> str:
    """A timestamp as proto3 JSON writes one (RFC 3339, UTC, Z)."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    text: str = stamp.ToJsonString()
    return text


def merge_json(base: Any, overlay: Any) -> Any:
    """`overlay` laid over `base` (records.Extras): objects merge key by key, lists element
    by element, anything else is replaced. Neither argument is changed."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge_json(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(overlay, list):
        merged_list = [merge_json(item, extra) for item, extra in zip(base, overlay, strict=False)]
        return merged_list + list(base[len(overlay) :])
    return copy.deepcopy(overlay)


def qr_extras(qr: QueuedResourceRecord) -> Extras:
    """The QR's REST-only fields: as sent, plus runDuration.terminationTime once set."""
    extras: Extras = merge_json({}, qr.extras)
    if qr.termination_time is not None:
        run = extras.setdefault("runDuration", {})
        run["terminationTime"] = json_timestamp(qr.termination_time)
    return extras


def node_extras(node: NodeRecord) -> Extras:
    """The node's REST-only fields: its template's, plus schedulingConfig.terminationTimestamp
    when the service will take it back."""
    extras: Extras = merge_json({}, node.extras)
    if node.termination_time is not None:
        scheduling = extras.setdefault("schedulingConfig", {})
        scheduling["terminationTimestamp"] = json_timestamp(node.termination_time)
    return extras
