"""Queued resources and nodes (v2alpha1 protos) → the typed objects tpuctl prints and compares.

Pure: no API calls. The shapes here are the documented JSON of status and list
(docs/output.md); a contract test pins their keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar

from tpuctl.cloud.zones import ZoneError, zones_error, zones_exit_code
from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.worker import JOB_LABEL, MANAGED_BY_LABEL, MANAGER, SPEC_HASH_LABEL

UNSET_ENUMS = frozenset({"STATE_UNSPECIFIED", "STATE_INITIATOR_UNSPECIFIED", "HEALTH_UNSPECIFIED"})


def source_of(queued_resource: Any) -> str:
    """Where a queued resource's slices are: "tpu" (Cloud TPU) or "compute" (Compute Engine)."""
    from tpuctl.cloud.rest import SOURCE_ATTRIBUTE

    return str(getattr(queued_resource, SOURCE_ATTRIBUTE, "tpu"))


@dataclass(frozen=True)
class Template:
    """What a queued resource asks for, read back from its first node spec."""

    accelerator: str
    runtime: str
    slices: int
    tier: str
    reservation: str | None
    labels: dict[str, str]
    node_ids: list[str]


def short_name(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def enum_name(value: Any) -> str | None:
    """A proto enum's name, or None for the *_UNSPECIFIED zero value."""
    name = getattr(value, "name", None)
    if name is None or name in UNSET_ENUMS:
        return None
    return str(name)


def state_name(queued_resource: Any) -> str:
    return str(getattr(queued_resource.state.state, "name", "STATE_UNSPECIFIED"))


def timestamp(value: Any) -> datetime | None:
    """A proto-plus timestamp (DatetimeWithNanoseconds) as an aware datetime; None when unset."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.timestamp() <= 0:
            return None
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    seconds = getattr(value, "seconds", 0)
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc)


# provisioningModel (read over REST) → tpuctl's tier; STANDARD leaves it to the tier fields.
_MODEL_TIERS = {
    "FLEX_START": "flex-start",
    "RESERVATION_BOUND": "reservation-bound",
    "SPOT": "spot",
}


def tier_of(queued_resource: Any) -> str:
    """spot | reserved | guaranteed | best-effort | flex-start | reservation-bound |
    on-demand (no tier field set). Over gRPC a flex-start or reservation-bound queued
    resource reads as on-demand: only REST carries its provisioning model."""
    from tpuctl.cloud.rest import rest_field

    model = rest_field(queued_resource, "provisioningModel")
    if model in _MODEL_TIERS:
        return _MODEL_TIERS[model]
    message = type(queued_resource).pb(queued_resource)
    which = message.WhichOneof("tier")
    if which == "spot":
        return "spot"
    if which == "best_effort":
        return "best-effort"
    if which == "guaranteed":
        return "reserved" if queued_resource.guaranteed.reserved else "guaranteed"
    return "on-demand"


def template_of(queued_resource: Any) -> Template:
    specs = list(queued_resource.tpu.node_spec)
    if not specs:
        return Template("", "", 0, tier_of(queued_resource), None, {}, [])
    node_ids: list[str] = []
    slices = 0
    for node_spec in specs:
        params = node_spec.multi_node_params
        if params.node_count > 0:
            prefix = params.node_id_prefix or short_name(queued_resource.name)
            node_ids.extend(f"{prefix}-{index}" for index in range(params.node_count))
            slices += params.node_count
        else:
            node_ids.append(node_spec.node_id)
            slices += 1
    node = specs[0].node
    accelerator = node.accelerator_type
    if not accelerator and node.accelerator_config.topology:
        config_type = getattr(node.accelerator_config.type_, "name", "")
        accelerator = f"{config_type.lower()}:{node.accelerator_config.topology}"
    return Template(
        accelerator=accelerator,
        runtime=node.runtime_version,
        slices=slices,
        tier=tier_of(queued_resource),
        reservation=queued_resource.reservation_name or None,
        labels=dict(node.labels),
        node_ids=node_ids,
    )


def termination_time(queued_resource: Any) -> datetime | None:
    """When the service takes the queued resource's nodes back (a flex-start run's end, a
    reservation window's), read over REST; None when it has none or was read over gRPC."""
    from tpuctl.clock import parse_rfc3339

    text = rest_field_of(queued_resource, "runDuration", "terminationTime")
    return parse_rfc3339(text) if isinstance(text, str) else None


def rest_field_of(message: Any, *path: str) -> Any:
    from tpuctl.cloud.rest import rest_field

    return rest_field(message, *path)


def failure_of(queued_resource: Any) -> dict[str, Any] | None:
    state = queued_resource.state
    message = type(state).pb(state)
    if message.WhichOneof("state_data") != "failed_data" and state_name(queued_resource) != (
        "FAILED"
    ):
        return None
    error = message.failed_data.error
    if not error.message and not error.code:
        return {"code": None, "message": "no reason given by the service"}
    return {"code": error.code or None, "message": error.message or None}


def state_since(
    queued_resource: Any, nodes: list[Any], now: datetime
) -> tuple[datetime | None, str]:
    """When the current state began, as well as the API lets us know, and how we know.

    v2alpha1 state data carries no timestamps. Queueing states began at create_time; once
    nodes exist, provisioning began no earlier than the first node's create_time, and ACTIVE
    no earlier than the last one's. Otherwise all we know is create_time.
    """
    created = timestamp(queued_resource.create_time)
    state = state_name(queued_resource)
    node_times = sorted(t for t in (timestamp(n.create_time) for n in nodes) if t is not None)
    if state in ("PROVISIONING",) and node_times:
        return node_times[0], "first_node_create_time"
    if state == "ACTIVE" and node_times:
        return node_times[-1], "last_node_create_time"
    return created, "create_time"


@dataclass(frozen=True)
class WorkerAddress:
    worker: int
    internal_ip: str | None
    external_ip: str | None


@dataclass(frozen=True)
class NodeSummary:
    """One slice's node; a node not created yet has `state` None and no workers."""

    name: str
    state: str | None = None
    health: str | None = None
    health_description: str | None = None
    accelerator: str | None = None
    workers: list[WorkerAddress] = field(default_factory=list)


@dataclass
class QueuedResourceStatus(Result):
    """The `status` object (docs/output.md): one stable shape, embedded by create and wait."""

    KIND: ClassVar[str] = "QueuedResource"
    name: str
    resource: str
    project: str
    zone: str
    state: str
    state_initiator: str | None
    state_since: datetime | None
    state_since_source: str
    in_state_seconds: float | None
    create_time: datetime | None
    failure: dict[str, Any] | None
    tier: str
    reservation: str | None
    accelerator: str
    runtime: str
    slices: int
    managed_by_tpuctl: bool
    job: str | None
    spec_hash: str | None
    nodes: list[NodeSummary]
    # Every worker's job (`status --jobs`, read over SSH by tpuctl.jobs); None otherwise.
    jobs: list[Any] | None = None
    api: str = "tpu"  # where its slices are: tpu (Cloud TPU) or compute (Compute Engine)


@dataclass(frozen=True)
class QueuedResourceEntry:
    """One row of `tpuctl list`."""

    name: str
    state: str
    state_initiator: str | None
    accelerator: str
    slices: int
    tier: str
    create_time: datetime | None
    managed_by_tpuctl: bool
    job: str | None
    zone: str | None = None
    api: str = "tpu"  # tpu (Cloud TPU) or compute (Compute Engine)


@dataclass
class QueuedResourceList(Result):
    """`tpuctl list`: `zone` is the one zone listed (None with several, see `zones`); a zone
    that could not be listed is in `zone_errors` and the command exits with its code."""

    KIND: ClassVar[str] = "QueuedResourceList"
    project: str
    zone: str | None
    all: bool
    queued_resources: list[QueuedResourceEntry]
    zones: list[str] = field(default_factory=list)
    zone_errors: list[ZoneError] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return zones_exit_code(self.zone_errors)

    def exit_error(self) -> TpuctlError | None:
        return zones_error(self.zone_errors, len(self.zones))


def worker_of(index: int, endpoint: Any) -> WorkerAddress:
    external = endpoint.access_config.external_ip if endpoint.access_config else ""
    return WorkerAddress(index, endpoint.ip_address or None, external or None)


def node_summary(node_id: str, node: Any | None) -> NodeSummary:
    if node is None:
        return NodeSummary(name=node_id)
    return NodeSummary(
        name=short_name(node.name) or node_id,
        state=enum_name(node.state),
        health=enum_name(node.health),
        health_description=node.health_description or None,
        accelerator=node.accelerator_type or None,
        workers=[worker_of(i, ep) for i, ep in enumerate(node.network_endpoints)],
    )


def queued_resource_summary(
    queued_resource: Any,
    *,
    project: str,
    zone: str,
    nodes: dict[str, Any | None] | None = None,
    now: datetime | None = None,
) -> QueuedResourceStatus:
    """The `status` object of a queued resource and its nodes (by node id)."""
    moment = now or datetime.now(timezone.utc)
    template = template_of(queued_resource)
    node_map = nodes or {}
    present = [node for node in node_map.values() if node is not None]
    since, since_source = state_since(queued_resource, present, moment)
    labels = template.labels
    # max(0): the service's clock may run a little ahead of ours.
    in_state = round(max(0.0, (moment - since).total_seconds()), 1) if since else None
    return QueuedResourceStatus(
        name=short_name(queued_resource.name),
        resource=queued_resource.name,
        project=project,
        zone=zone,
        state=state_name(queued_resource),
        state_initiator=enum_name(queued_resource.state.state_initiator),
        state_since=since,
        state_since_source=since_source,
        in_state_seconds=in_state,
        create_time=timestamp(queued_resource.create_time),
        failure=failure_of(queued_resource),
        tier=template.tier,
        reservation=template.reservation,
        accelerator=template.accelerator,
        runtime=template.runtime,
        slices=template.slices,
        managed_by_tpuctl=labels.get(MANAGED_BY_LABEL) == MANAGER,
        job=labels.get(JOB_LABEL),
        spec_hash=labels.get(SPEC_HASH_LABEL),
        nodes=[node_summary(node_id, node_map.get(node_id)) for node_id in template.node_ids],
        api=source_of(queued_resource),
    )


def list_entry(queued_resource: Any, zone: str | None = None) -> QueuedResourceEntry:
    """One row of `tpuctl list`."""
    template = template_of(queued_resource)
    return QueuedResourceEntry(
        name=short_name(queued_resource.name),
        state=state_name(queued_resource),
        state_initiator=enum_name(queued_resource.state.state_initiator),
        accelerator=template.accelerator,
        slices=template.slices,
        tier=template.tier,
        create_time=timestamp(queued_resource.create_time),
        managed_by_tpuctl=template.labels.get(MANAGED_BY_LABEL) == MANAGER,
        job=template.labels.get(JOB_LABEL),
        zone=zone,
        api=source_of(queued_resource),
    )


def is_managed(queued_resource: Any) -> bool:
    return template_of(queued_resource).labels.get(MANAGED_BY_LABEL) == MANAGER


def differences(existing: Any, wanted: Any) -> list[dict[str, Any]]:
    """Fields where an existing queued resource differs from the one a spec asks for."""
    have, want = template_of(existing), template_of(wanted)
    pairs: list[tuple[str, Any, Any]] = [
        ("accelerator", have.accelerator, want.accelerator),
        ("runtime", have.runtime, want.runtime),
        ("tier", have.tier, want.tier),
        ("slices", have.slices, want.slices),
        ("reservation", have.reservation, want.reservation),
        ("spec_hash", have.labels.get(SPEC_HASH_LABEL), want.labels.get(SPEC_HASH_LABEL)),
    ]
    return [
        {"field": field, "existing": old, "spec": new} for field, old, new in pairs if old != new
    ]


def format_differences(diffs: list[dict[str, Any]]) -> str:
    return "; ".join(f"{d['field']}: {d['existing']} → {d['spec']}" for d in diffs)
