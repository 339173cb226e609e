"""Spec → v2alpha1 CreateQueuedResourceRequest, and its JSON form (pure: no I/O, no clock)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from tpuctl import topology
from tpuctl.errors import SpecError
from tpuctl.spec.model import Spec, TimeBound
from tpuctl.worker import (
    JOB_LABEL,
    MANAGED_BY_LABEL,
    MANAGER,
    RECORD_METADATA_KEY,
    RUN_LABEL,
    SPEC_HASH_LABEL,
    label_value,
    record_dir,
)

if TYPE_CHECKING:
    from google.cloud.tpu_v2alpha1 import CreateQueuedResourceRequest

STARTUP_SCRIPT_KEY = "startup-script"


def render_request(
    spec: Spec,
    *,
    project: str,
    zone: str,
    request_id: str | None = None,
    now: datetime | None = None,
) -> CreateQueuedResourceRequest:
    """The request `tpuctl create` sends for `spec`.

    `now` is needed only when the spec bounds both ends of the queueing window and one of them
    is relative: the API takes a single constraint or an absolute `valid_interval`, so (like
    gcloud) the relative end is turned into a time.
    """
    from google.cloud import tpu_v2alpha1 as tpu

    parent = f"projects/{project}/locations/{zone}"
    node_spec = tpu.QueuedResource.Tpu.NodeSpec(parent=parent, node=_node(spec))
    if spec.tpu.slices > 1:
        node_spec.multi_node_params = tpu.QueuedResource.Tpu.NodeSpec.MultiNodeParams(
            node_count=spec.tpu.slices, node_id_prefix=spec.name
        )
    else:
        node_spec.node_id = spec.name

    queued_resource = tpu.QueuedResource(tpu=tpu.QueuedResource.Tpu(node_spec=[node_spec]))
    tier = spec.capacity.tier
    if tier == "spot":
        queued_resource.spot = tpu.QueuedResource.Spot()
    elif tier == "reserved":
        queued_resource.guaranteed = tpu.QueuedResource.Guaranteed(reserved=True)
    elif tier == "best-effort":
        queued_resource.best_effort = tpu.QueuedResource.BestEffort()
    # on-demand: no tier field at all, which is how the API spells it.
    if spec.capacity.reservation:
        queued_resource.reservation_name = reservation_name(
            spec.capacity.reservation, project=project, zone=zone
        )
    policy = _queueing_policy(spec, now)
    if policy is not None:
        queued_resource.queueing_policy = policy

    request = tpu.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id=spec.name, queued_resource=queued_resource
    )
    if request_id:
        request.request_id = request_id
    return request


def reservation_name(name: str, *, project: str, zone: str) -> str:
    """A bare reservation name → `projects/P/locations/Z/reservations/NAME`; full names kept."""
    if name.startswith("projects/"):
        return name
    return f"projects/{project}/locations/{zone}/reservations/{name}"


def tpuctl_labels(spec: Spec) -> dict[str, str]:
    """The labels tpuctl adds to every node, so `tpuctl list` can find and match its own QRs."""
    from tpuctl.spec.load import spec_fingerprint

    labels = {
        MANAGED_BY_LABEL: MANAGER,
        JOB_LABEL: label_value(spec.name),
        SPEC_HASH_LABEL: spec_fingerprint(spec),
    }
    if spec.job is not None:
        labels[RUN_LABEL] = label_value(spec.run_name)
    return labels


def node_labels(spec: Spec) -> dict[str, str]:
    """The user's labels plus tpuctl's; tpuctl's win, since tools read them back."""
    return {**spec.tpu.labels, **tpuctl_labels(spec)}


def node_metadata(spec: Spec, startup_script: str | None = None) -> dict[str, str]:
    """The user's metadata plus the rendered startup script when the spec has a job, unless the
    spec brings a startup script of its own (tpu.metadata), which then replaces tpuctl's; and
    for a job with checkpoint.dir, where its run's record lives (tpuctl's key wins)."""
    metadata = dict(spec.tpu.metadata)
    record = record_dir(spec) if spec.job is not None else None
    if record is not None:
        metadata[RECORD_METADATA_KEY] = record
    if spec.job is None or spec.own_startup_script:
        return metadata
    if startup_script is None:
        from tpuctl.render.startup import render_startup_script

        startup_script = render_startup_script(spec)
    metadata[STARTUP_SCRIPT_KEY] = startup_script
    return metadata


def request_as_dict(request: CreateQueuedResourceRequest) -> dict[str, Any]:
    """JSON-ready dict with the proto field names (snake_case), as the Cloud TPU docs show it."""
    from google.protobuf import json_format

    message = type(request).pb(request)
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    # proto3 drops `false`; the external-IP choice is spelled out so a reader never has to know
    # the default (gcloud always sends it too).
    for node_spec in data.get("queued_resource", {}).get("tpu", {}).get("node_spec", []):
        node = node_spec.setdefault("node", {})
        network_config = node.setdefault("network_config", {})
        network_config.setdefault("enable_external_ips", False)
        # proto-plus renames the proto field `type` to `type_` (a Python builtin); the API's
        # name is `type`.
        accelerator_config = node.get("accelerator_config")
        if accelerator_config is not None and "type_" in accelerator_config:
            accelerator_config["type"] = accelerator_config.pop("type_")
    return data


def request_as_json(request: CreateQueuedResourceRequest) -> str:
    """`request_as_dict` as stable JSON (sorted keys, indent 2, trailing newline)."""
    return json.dumps(request_as_dict(request), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _node(spec: Spec) -> Any:
    from google.cloud import tpu_v2alpha1 as tpu

    tpu_spec = spec.tpu
    node = tpu.Node(runtime_version=tpu_spec.runtime)
    if tpu_spec.type and tpu_spec.topology:
        accelerator = topology.from_type_topology(tpu_spec.type, tpu_spec.topology)
        node.accelerator_config = tpu.AcceleratorConfig(
            type_=getattr(tpu.AcceleratorConfig.Type, accelerator.family.config_type),
            topology=accelerator.topology,
        )
    else:
        node.accelerator_type = tpu_spec.accelerator
    network_config = tpu.NetworkConfig(enable_external_ips=tpu_spec.external_ips)
    if tpu_spec.network:
        network_config.network = tpu_spec.network
    if tpu_spec.subnetwork:
        network_config.subnetwork = tpu_spec.subnetwork
    node.network_config = network_config
    if tpu_spec.service_account or tpu_spec.scopes:
        node.service_account = tpu.ServiceAccount(
            email=tpu_spec.service_account or "", scope=list(tpu_spec.scopes)
        )
    if tpu_spec.tags:
        node.tags = list(tpu_spec.tags)
    node.labels = node_labels(spec)
    metadata = node_metadata(spec)
    if metadata:
        node.metadata = metadata
    if spec.checkpoint.autocheckpoint:
        node.autocheckpoint_enabled = True
    if tpu_spec.description:
        node.description = tpu_spec.description
    return node


def _queueing_policy(spec: Spec, now: datetime | None) -> Any:
    from google.cloud import tpu_v2alpha1 as tpu

    after, until = spec.capacity.valid_after, spec.capacity.valid_until
    if after is None and until is None:
        return None
    policy = tpu.QueuedResource.QueueingPolicy()
    if after is not None and until is not None:
        # The five constraints are one proto oneof: both ends together must be an interval.
        from google.type import interval_pb2

        start, end = _absolute(after, now, "valid_after"), _absolute(until, now, "valid_until")
        interval = interval_pb2.Interval()
        interval.start_time.FromDatetime(start)
        interval.end_time.FromDatetime(end)
        policy.valid_interval = interval
    elif until is not None:
        if isinstance(until, timedelta):
            policy.valid_until_duration = until
        else:
            policy.valid_until_time = _utc(until)
    elif after is not None:
        if isinstance(after, timedelta):
            policy.valid_after_duration = after
        else:
            policy.valid_after_time = _utc(after)
    return policy


def _absolute(bound: TimeBound, now: datetime | None, field: str) -> datetime:
    if isinstance(bound, datetime):
        return _utc(bound)
    if now is None:
        raise SpecError(
            "capacity.valid_after and capacity.valid_until together need absolute times "
            "(the API takes them as one interval)",
            path=f"capacity.{field}",
            hint="give RFC 3339 times for both, or only one of the two bounds",
        )
    return _utc(now) + bound


def _utc(moment: datetime) -> datetime:
    # A naive time in a spec means UTC; protobuf's FromDatetime would read it that way too.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)
