"""Spec → v2alpha1 CreateQueuedResourceRequest, and its JSON form (pure: no I/O, no clock).

google-cloud-tpu's messages lack some of the API's fields (flex-start and reservation-bound's
provisioningModel and runDuration, the boot disk's size and image): those are kept beside the
message (`QueuedResourceRequest.rest_only`), printed with it, and make the create go over the
REST API, which carries them (tpuctl.cloud.rest).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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
# The API's provisioningModel of the tiers that have one only REST carries.
PROVISIONING_MODELS = {"flex-start": "FLEX_START", "reservation-bound": "RESERVATION_BOUND"}
# Map fields: their keys are the user's, never field names.
_MAP_FIELDS = frozenset({"labels", "metadata"})


@dataclass(frozen=True)
class QueuedResourceRequest:
    """A create request: the v2alpha1 message (every field google-cloud-tpu has) and the
    fields only the REST API carries, as `render` prints them (proto field names, at their
    place in the QueuedResource). Reads of the message's fields go to the message."""

    grpc: CreateQueuedResourceRequest
    rest_only: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        if name in ("grpc", "rest_only"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.grpc, name)

    @property
    def needs_rest(self) -> bool:
        """It carries fields the gRPC client cannot send."""
        return bool(self.rest_only)

    def rest_body(self) -> dict[str, Any]:
        """The QueuedResource as the REST API takes it: what `render` prints, in the API's
        JSON names (camelCase)."""
        body: dict[str, Any] = camel_case(request_as_dict(self)["queued_resource"])
        return body


def render_request(
    spec: Spec,
    *,
    project: str,
    zone: str,
    request_id: str | None = None,
    now: datetime | None = None,
) -> QueuedResourceRequest:
    """The request `tpuctl create` sends for `spec`.

    `now` is needed only when the spec bounds both ends of the queueing window and one of them
    is relative: the API takes a single constraint or an absolute `valid_interval`, so (like
    gcloud) the relative end is turned into a time.
    """
    from google.cloud import tpu_v2alpha1 as tpu

    if spec.tpu.api == "compute":
        # The Cloud TPU API cannot make it: tpuctl.render.compute renders its requests.
        raise SpecError(
            "this spec's slices are made by Compute Engine (tpu.api: compute), not by a "
            "Cloud TPU queued resource",
            path="tpu.api",
            hint="use tpuctl render to see its Compute Engine requests",
        )
    parent = f"projects/{project}/locations/{zone}"
    node_spec = tpu.QueuedResource.Tpu.NodeSpec(parent=parent, node=_node(spec, project, zone))
    if spec.tpu.slices > 1:
        node_spec.multi_node_params = tpu.QueuedResource.Tpu.NodeSpec.MultiNodeParams(
            node_count=spec.tpu.slices, node_id_prefix=spec.name
        )
        if spec.tpu.workload_type:
            node_spec.multi_node_params.workload_type = getattr(
                tpu.QueuedResource.Tpu.NodeSpec.MultiNodeParams.WorkloadType,
                _enum(spec.tpu.workload_type),
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
    # on-demand: no tier field at all, which is how the API spells it. flex-start and
    # reservation-bound have no tier field either: their provisioning model says it.
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
    return QueuedResourceRequest(request, rest_only_fields(spec))


def rest_only_fields(spec: Spec) -> dict[str, Any]:
    """What of `spec` only the REST API carries, as `request_as_dict` prints it (merged into
    the queued resource)."""
    fields: dict[str, Any] = {}
    model = PROVISIONING_MODELS.get(spec.capacity.tier)
    if model is not None:
        fields["provisioning_model"] = model
    if spec.capacity.max_run_duration is not None:
        seconds = int(spec.capacity.max_run_duration.total_seconds())
        fields["run_duration"] = {"max_run_duration": f"{seconds}s"}
    disk: dict[str, Any] = {}
    boot_disk = spec.tpu.boot_disk
    if boot_disk is not None and boot_disk.size_gb is not None:
        disk["disk_size_gb"] = str(boot_disk.size_gb)  # int64: a string in proto3 JSON
    if boot_disk is not None and boot_disk.image is not None:
        disk["source_image"] = boot_disk.image
    if disk:
        fields["tpu"] = {"node_spec": [{"node": {"boot_disk_config": disk}}]}
    return fields


def _enum(value: str) -> str:
    """`availability-optimized` → `AVAILABILITY_OPTIMIZED`."""
    return value.replace("-", "_").upper()


def data_disk_source(source: str, *, project: str, zone: str) -> str:
    """A bare disk name → `projects/P/zones/Z/disks/NAME` (gcloud's --data-disk wants the
    whole path); full names kept."""
    if source.startswith("projects/"):
        return source
    return f"projects/{project}/zones/{zone}/disks/{source}"


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


def request_as_dict(request: QueuedResourceRequest | CreateQueuedResourceRequest) -> dict[str, Any]:
    """JSON-ready dict with the proto field names (snake_case), as the Cloud TPU docs show it,
    the fields only REST carries included."""
    from google.protobuf import json_format

    grpc: Any = getattr(request, "grpc", request)
    message = type(grpc).pb(grpc)
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
    rest_only = getattr(request, "rest_only", None)
    if rest_only:
        data["queued_resource"] = _merged(data.get("queued_resource", {}), rest_only)
    return data


def _merged(base: Any, extra: Any) -> Any:
    """`extra` laid over `base`: objects key by key, lists item by item."""
    if isinstance(base, Mapping) and isinstance(extra, Mapping):
        merged = dict(base)
        for key, value in extra.items():
            merged[key] = _merged(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(extra, list):
        return [
            _merged(base[i], extra[i]) if i < len(extra) else base[i] for i in range(len(base))
        ] + extra[len(base) :]
    return extra


def camel_case(value: Any) -> Any:
    """Proto field names → the API's JSON names (`node_spec` → `nodeSpec`), every level down
    except the keys of maps (labels, metadata), which are the user's."""
    if isinstance(value, Mapping):
        return {
            _camel(key): dict(item)
            if key in _MAP_FIELDS and isinstance(item, Mapping)
            else camel_case(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [camel_case(item) for item in value]
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def request_as_json(request: QueuedResourceRequest | CreateQueuedResourceRequest) -> str:
    """`request_as_dict` as stable JSON (sorted keys, indent 2, trailing newline)."""
    return json.dumps(request_as_dict(request), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _node(spec: Spec, project: str, zone: str) -> Any:
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
    _disks(node, spec, project, zone)
    if tpu_spec.secure_boot:
        node.shielded_instance_config = tpu.ShieldedInstanceConfig(enable_secure_boot=True)
    return node


def _disks(node: Any, spec: Spec, project: str, zone: str) -> None:
    """The boot disk's encryption (its size and image are REST's: rest_only_fields) and the
    data disks."""
    from google.cloud import tpu_v2alpha1 as tpu

    boot_disk = spec.tpu.boot_disk
    if boot_disk is not None and (boot_disk.kms_key or boot_disk.confidential_compute):
        config = tpu.BootDiskConfig(enable_confidential_compute=boot_disk.confidential_compute)
        if boot_disk.kms_key:
            config.customer_encryption_key = tpu.CustomerEncryptionKey(
                kms_key_name=boot_disk.kms_key
            )
        node.boot_disk_config = config
    for disk in spec.tpu.data_disks:
        attached = tpu.AttachedDisk(
            source_disk=data_disk_source(disk.source, project=project, zone=zone)
        )
        if disk.mode is not None:
            attached.mode = getattr(tpu.AttachedDisk.DiskMode, _enum(disk.mode))
        node.data_disks.append(attached)


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
