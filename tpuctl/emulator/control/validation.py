"""CreateQueuedResource request checks, with the status codes and messages the service uses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.names import NODE_ID, QR_ID, parse_parent
from tpuctl.emulator.control.status import invalid
from tpuctl.topology import MAX_SLICES, Accelerator, AcceleratorError, from_type_topology
from tpuctl.topology import parse_accelerator as parse_accelerator_type

TIERS = {"spot": "spot", "guaranteed": "guaranteed", "best_effort": "best-effort"}
# QueuedResource.provisioningModel (REST only: the gRPC client has no such field).
PROVISIONING_MODELS = ("STANDARD", "SPOT", "RESERVATION_BOUND", "FLEX_START")
# Flex-start is offered for these generations only (Cloud TPU's flex-start page).
FLEX_START_GENERATIONS = ("v5e", "v6e")
# runDuration.maxRunDuration: up to 7 days (documented); at least 10 minutes (as Compute
# Engine's flex-start VMs; not documented for Cloud TPU).
MIN_RUN_DURATION = 600.0
MAX_RUN_DURATION = 7 * 86400.0
_PROTO_DURATION = re.compile(r"^(\d+)(\.\d{1,9})?s$")


@dataclass(frozen=True)
class PlannedNode:
    node_id: str
    template: cloud_tpu.Node  # the node as sent in its node_spec
    spec_index: int = 0  # which node_spec it comes from


@dataclass(frozen=True)
class CreatePlan:
    """A validated create: what to store, how much capacity it needs, when it may start."""

    parent: str
    project: str
    zone: str
    qr_id: str
    accelerator: Accelerator
    nodes: tuple[PlannedNode, ...]
    tier: str  # "on-demand" | "spot" | "guaranteed" | "best-effort" | "flex-start" | …
    valid_until: float | None  # monotonic deadline, None = wait for ever
    valid_after: float  # monotonic instant before which it is not provisioned
    # "reservation-bound" too. The REST-only provisioning fields, when sent:
    provisioning_model: str = ""  # one of PROVISIONING_MODELS
    max_run_duration: float | None = None  # emulated seconds from provisioning to the end
    reservation: str = ""  # queued_resource.reservation_name

    @property
    def name(self) -> str:
        return f"{self.parent}/queuedResources/{self.qr_id}"

    @property
    def chips(self) -> int:
        return self.accelerator.chips * len(self.nodes)


def node_accelerator(node: cloud_tpu.Node, where: str) -> Accelerator:
    """The accelerator a node template asks for (accelerator_type or accelerator_config)."""
    has_config = cloud_tpu.Node.pb(node).HasField("accelerator_config")
    try:
        from_config = None
        if has_config:
            config = node.accelerator_config
            type_name = cloud_tpu.AcceleratorConfig.Type(config.type_).name
            if config.type_ == 0:
                raise invalid(f"{where}.accelerator_config.type is required")
            if not config.topology:
                raise invalid(f"{where}.accelerator_config.topology is required")
            from_config = from_type_topology(type_name, config.topology)
        from_type = parse_accelerator_type(node.accelerator_type) if node.accelerator_type else None
    except AcceleratorError as error:
        raise invalid(f"{where}: {error}") from None
    if from_type is None and from_config is None:
        raise invalid(f"{where}: accelerator_type or accelerator_config is required")
    if from_type and from_config and from_type.accelerator_type != from_config.accelerator_type:
        raise invalid(
            f"{where}: accelerator_type {node.accelerator_type!r} does not match "
            f"accelerator_config ({from_config.accelerator_type})"
        )
    result = from_config or from_type
    assert result is not None
    return result


def validate_create(
    request: cloud_tpu.CreateQueuedResourceRequest,
    clock: Clock,
    extras: Mapping[str, Any] | None = None,
) -> CreatePlan:
    """Check a create the way the service does; ApiError(INVALID_ARGUMENT) on the first problem.

    `extras`: the fields only the REST API carries (provisioningModel, runDuration, …) as
    their JSON, already checked against their types."""
    project, zone = parse_parent(request.parent)
    qr_id = request.queued_resource_id
    if not qr_id:
        raise invalid("queued_resource_id is required")
    if not QR_ID.match(qr_id) or len(qr_id) > 63:
        raise invalid(f'Invalid queued_resource_id "{qr_id}": use at most 63 of [A-Za-z0-9_.~+%-]')
    qr = request.queued_resource
    qr_pb = cloud_tpu.QueuedResource.pb(qr)
    if qr_pb.WhichOneof("resource") != "tpu" or not qr.tpu.node_spec:
        raise invalid("queued_resource.tpu.node_spec is required")
    nodes: list[PlannedNode] = []
    accelerator: Accelerator | None = None
    for index, spec in enumerate(qr.tpu.node_spec):
        where = f"tpu.node_spec[{index}]"
        spec_nodes, spec_accelerator = _plan_spec(spec, where, request.parent, qr_id, index)
        if accelerator and spec_accelerator.accelerator_type != accelerator.accelerator_type:
            raise invalid(f"{where}: every node of a queued resource must have the same type")
        accelerator = spec_accelerator
        nodes.extend(spec_nodes)
    assert accelerator is not None
    if len(nodes) > 1 and not accelerator.supports_multislice:
        raise invalid(
            f"Multislice is not supported for accelerator type {accelerator.accelerator_type}: "
            "it needs TPU v4 or newer"
        )
    if len(nodes) > MAX_SLICES:
        raise invalid(f"at most {MAX_SLICES} nodes per queued resource, not {len(nodes)}")
    if len({node.node_id for node in nodes}) != len(nodes):
        raise invalid("node ids must be unique within a queued resource")
    model, tier, max_run = _provisioning(qr, extras or {}, accelerator)
    valid_until, valid_after = _queueing_window(qr, clock)
    return CreatePlan(
        parent=request.parent,
        project=project,
        zone=zone,
        qr_id=qr_id,
        accelerator=accelerator,
        nodes=tuple(nodes),
        tier=tier,
        valid_until=valid_until,
        valid_after=valid_after,
        provisioning_model=model,
        max_run_duration=max_run,
        reservation=qr.reservation_name,
    )


def proto_duration(text: str, where: str) -> float:
    """A proto3 JSON duration (`"3600s"`, `"1.5s"`) → seconds; INVALID_ARGUMENT otherwise."""
    match = _PROTO_DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise invalid(f'Invalid value at \'{where}\' ("{text}"): a duration like "3600s"')
    return float(match.group(1) + (match.group(2) or ""))


def _provisioning(
    qr: cloud_tpu.QueuedResource, extras: Mapping[str, Any], accelerator: Accelerator
) -> tuple[str, str, float | None]:
    """(provisioning model, tier, max run duration): the tier fields and the REST-only
    provisioningModel must agree. gcloud alpha sends provisioningModel STANDARD with `--spot`
    (and SPOT with `spot: {}` for `--provisioning-model=spot`): STANDARD defers to the tier."""
    field = cloud_tpu.QueuedResource.pb(qr).WhichOneof("tier") or ""
    model = str(extras.get("provisioningModel") or "")
    if model == "PROVISIONING_MODEL_UNSPECIFIED":
        model = ""
    run = extras.get("runDuration") or {}
    text = run.get("maxRunDuration") if isinstance(run, Mapping) else None
    max_run = (
        proto_duration(text, "queued_resource.run_duration.max_run_duration") if text else None
    )
    allowed = {
        "FLEX_START": ("",),
        "RESERVATION_BOUND": ("", "guaranteed"),
        "SPOT": ("", "spot"),
    }.get(model)
    if allowed is not None and field not in allowed:
        raise invalid(
            f"provisioning_model {model} cannot be combined with the {field} tier; "
            "leave the tier unset"
        )
    if model == "FLEX_START":
        if max_run is None:
            raise invalid(
                "provisioning_model FLEX_START requires run_duration.max_run_duration "
                "(at most 7 days)"
            )
        if accelerator.generation not in FLEX_START_GENERATIONS:
            raise invalid(
                f"provisioning_model FLEX_START is not offered for {accelerator.generation} "
                f"({accelerator.accelerator_type}); flex-start serves "
                + " and ".join(FLEX_START_GENERATIONS)
            )
        if qr.reservation_name:
            raise invalid("provisioning_model FLEX_START does not consume a reservation")
    if model == "RESERVATION_BOUND":
        name = qr.reservation_name
        if not name or name.endswith("/reservations/-"):
            raise invalid(
                "provisioning_model RESERVATION_BOUND requires reservation_name naming one "
                "reservation (projects/P/locations/Z/reservations/R)"
            )
    if max_run is not None and not MIN_RUN_DURATION <= max_run <= MAX_RUN_DURATION:
        raise invalid(
            f"run_duration.max_run_duration must be between 10 minutes and 7 days, not {text}"
        )
    tier = {"FLEX_START": "flex-start", "RESERVATION_BOUND": "reservation-bound"}.get(model)
    if tier is None:
        tier = "spot" if model == "SPOT" else TIERS.get(field, "on-demand")
    if not model:
        model = "SPOT" if tier == "spot" else "STANDARD"
    return model, tier, max_run


def _plan_spec(
    spec: cloud_tpu.QueuedResource.Tpu.NodeSpec, where: str, parent: str, qr_id: str, index: int
) -> tuple[list[PlannedNode], Accelerator]:
    if spec.parent != parent:
        raise invalid(f'{where}.parent "{spec.parent}" must be the request parent "{parent}"')
    if "node" not in spec:
        raise invalid(f"{where}.node is required")
    has_multi = cloud_tpu.QueuedResource.Tpu.NodeSpec.pb(spec).HasField("multi_node_params")
    if has_multi and spec.node_id:
        raise invalid(f"{where}: node_id and multi_node_params are mutually exclusive")
    if has_multi:
        params = spec.multi_node_params
        if params.node_count <= 1:
            raise invalid(
                f"{where}.multi_node_params.node_count must be greater than 1, "
                f"not {params.node_count}"
            )
        prefix = params.node_id_prefix or qr_id
        node_ids = [f"{prefix}-{index}" for index in range(params.node_count)]
    elif spec.node_id:
        node_ids = [spec.node_id]
    else:
        raise invalid(f"{where}: node_id or multi_node_params is required")
    for node_id in node_ids:
        if not NODE_ID.match(node_id):
            raise invalid(
                f'Invalid node id "{node_id}": use lowercase letters, digits and hyphens, '
                "starting with a letter, at most 63 characters"
            )
    template = spec.node
    accelerator = node_accelerator(template, f"{where}.node")
    if not template.runtime_version:
        raise invalid(f"{where}.node.runtime_version is required")
    return [PlannedNode(node_id, template, index) for node_id in node_ids], accelerator


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _queueing_window(qr: cloud_tpu.QueuedResource, clock: Clock) -> tuple[float | None, float]:
    """(deadline, start) as monotonic instants, every interval divided by the speed."""
    now = clock.monotonic()
    if "queueing_policy" not in qr:
        return None, now
    policy_pb = cloud_tpu.QueuedResource.QueueingPolicy.pb(qr.queueing_policy)
    which = policy_pb.WhichOneof("start_timing_constraints")
    policy = qr.queueing_policy
    if which == "valid_until_duration":
        seconds = _seconds(policy.valid_until_duration)
        if seconds <= 0:
            raise invalid("queueing_policy.valid_until_duration must be positive")
        return now + clock.scaled(seconds), now
    if which == "valid_until_time":
        deadline = clock.deadline_for_time(policy.valid_until_time)
        if deadline <= now:
            raise invalid("queueing_policy.valid_until_time is in the past")
        return deadline, now
    if which == "valid_after_duration":
        seconds = _seconds(policy.valid_after_duration)
        if seconds < 0:
            raise invalid("queueing_policy.valid_after_duration must not be negative")
        return None, now + clock.scaled(seconds)
    if which == "valid_after_time":
        return None, max(now, clock.deadline_for_time(policy.valid_after_time))
    if which == "valid_interval":
        interval = policy_pb.valid_interval
        start = (
            clock.deadline_for_time(interval.start_time.ToDatetime(tzinfo=clock.wall().tzinfo))
            if interval.HasField("start_time")
            else now
        )
        end = (
            clock.deadline_for_time(interval.end_time.ToDatetime(tzinfo=clock.wall().tzinfo))
            if interval.HasField("end_time")
            else None
        )
        if end is not None and end <= max(now, start):
            raise invalid("queueing_policy.valid_interval ends before it starts or in the past")
        return end, max(now, start)
    return None, now
