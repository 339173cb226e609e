"""Compute Engine's TPU slices read as the v2alpha1 queued resources and nodes the rest of
tpuctl reads (pure: JSON in, protos out). A slice is a lone instance, or a MIG and its
instances, in camelCase JSON as google-cloud-compute's messages serialise:

- instance PENDING or PROVISIONING before it ever ran, a MIG's bulk creation waiting:
  WAITING_FOR_RESOURCES; instance STAGING before it ever ran, topology ACTIVATING:
  PROVISIONING;
- instance RUNNING, topology ACTIVE (or REACTIVATING, a host back from maintenance), a
  started instance down with automaticRestart (host maintenance; its node not READY): ACTIVE;
- an instance preempted (its statusMessage), a MIG host lost: SUSPENDING / SUSPENDED (SERVICE);
- the insert's operation failed (no capacity) and the VM is gone: FAILED, with its error;
- a MIG being deleted (DEACTIVATING), an instance being deleted: DELETING.

One node per slice, named like the queued resource; its workers ordered by each instance's
`agent-worker-number` metadata (never the MIG's list order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

API = "compute"
WORKER_NUMBER = "agent-worker-number"
# Set (to "SERVICE") on an instance's JSON once its zone's operations say the service stopped
# it (host maintenance): Compute Engine's instance itself does not say.
STOPPED_BY = "_tpuctl_stopped_by"
# One TPU VM's chips per machine type (docs/compute-engine.md) and how its accelerator type
# counts them: v5p and TPU7x name TensorCores (2 a chip), v6e chips.
MACHINE_CHIPS = {
    "ct5p-hightpu-4t": ("v5p", 4, 2),
    "ct6e-standard-1t": ("v6e", 1, 1),
    "ct6e-standard-4t": ("v6e", 4, 1),
    "ct6e-standard-8t": ("v6e", 8, 1),
    "tpu7x-standard-4t": ("tpu7x", 4, 2),
}


def short(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def is_tpu_machine(machine_type: str) -> bool:
    """A TPU VM's machine type (`ct5p-…`, `ct6e-…`, `tpu7x-…`), not a VM of another kind."""
    return short(machine_type).startswith(("ct", "tpu"))


def accelerator_of(machine_type: str, hosts: int) -> str:
    """`ct6e-standard-4t` × 2 hosts → `v6e-8`; `ct5p-hightpu-4t` × 2 → `v5p-16`; "" unknown."""
    known = MACHINE_CHIPS.get(short(machine_type))
    if known is None:
        return ""
    generation, chips, per_chip = known
    return f"{generation}-{chips * max(1, hosts) * per_chip}"


def _scheduling(properties: Mapping[str, Any]) -> dict[str, Any]:
    return dict(properties.get("scheduling") or {})


def metadata_items(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    return {
        str(item.get("key")): str(item.get("value", ""))
        for item in (metadata or {}).get("items") or []
    }


def synthesize_queued_resource(
    name: str,
    *,
    state: str,
    accelerator: str,
    properties: Mapping[str, Any],
    initiator: str | None = None,
    failure: tuple[int, str] | None = None,
    create_time: str | None = None,
    termination: str | None = None,
) -> Any:
    """A v2alpha1 QueuedResource for a Compute Engine slice: one node spec (node id = the
    queued resource's), the instance's (or template's) labels, its provisioning model as the
    tier; REST-only fields (provisioningModel, runDuration.terminationTime) kept beside it as
    tpuctl.cloud.rest keeps them."""
    from google.cloud import tpu_v2alpha1 as tpu

    from tpuctl.cloud.rest import _REST_FIELDS, SOURCE_ATTRIBUTE

    node_id = short(name)
    parent = name.split("/queuedResources/", maxsplit=1)[0]
    scheduling = _scheduling(properties)
    node = tpu.Node(
        accelerator_type=accelerator,
        runtime_version="",
        labels=dict(properties.get("labels") or {}),
    )
    queued_resource = tpu.QueuedResource(
        name=name,
        tpu=tpu.QueuedResource.Tpu(
            node_spec=[tpu.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=node_id, node=node)]
        ),
    )
    queued_resource.state.state = getattr(tpu.QueuedResourceState.State, state)
    if initiator:
        queued_resource.state.state_initiator = getattr(
            tpu.QueuedResourceState.StateInitiator, initiator
        )
    if failure is not None:
        queued_resource.state.failed_data.error.code = failure[0]
        queued_resource.state.failed_data.error.message = failure[1]
    if create_time:
        from tpuctl.clock import parse_rfc3339

        moment = parse_rfc3339(create_time)
        if moment is not None:
            queued_resource.create_time = moment
    model = str(scheduling.get("provisioningModel") or "STANDARD")
    if model == "SPOT" or scheduling.get("preemptible"):
        queued_resource.spot = tpu.QueuedResource.Spot()
    affinity = properties.get("reservationAffinity") or {}
    values = affinity.get("values") or []
    if values:
        queued_resource.reservation_name = str(values[0])
    extra: dict[str, Any] = {"provisioningModel": model}
    if termination:
        extra["runDuration"] = {"terminationTime": termination}
    setattr(queued_resource, _REST_FIELDS, extra)
    setattr(queued_resource, SOURCE_ATTRIBUTE, API)
    return queued_resource


@dataclass
class ComputeSlice:
    """One slice as Compute Engine shows it: a lone instance, or a MIG and its instances
    (camelCase JSON), in worker order."""

    name: str
    instances: list[dict[str, Any]] = field(default_factory=list)
    group: dict[str, Any] | None = None
    template: dict[str, Any] | None = None

    @property
    def properties(self) -> dict[str, Any]:
        if self.group is None:
            return self.instances[0] if self.instances else {}
        return dict((self.template or {}).get("properties") or {})

    @property
    def identity(self) -> str:
        """The id of its instance or MIG (a name can be taken again)."""
        source = self.group if self.group is not None else self.properties
        return str(source.get("id") or source.get("selfLink") or self.name)

    @property
    def hosts(self) -> int:
        """VMs in the slice: its topology's chips over a VM's (a MIG lowers its targetSize
        when a VM's run ends with DELETE), else the target size."""
        if self.group is None:
            return 1
        applied = (self.group.get("status") or {}).get("appliedAcceleratorTopologies") or [{}]
        topology = str(applied[0].get("acceleratorTopology", ""))
        known = MACHINE_CHIPS.get(self.machine_type)
        if topology and known is not None:
            chips = 1
            for size in topology.split("x"):
                chips *= int(size) if size.isdigit() else 1
            return max(1, chips // known[1])
        return int(self.group.get("targetSize", 0))

    @property
    def machine_type(self) -> str:
        return short(str(self.properties.get("machineType", "")))

    @property
    def create_time(self) -> str | None:
        source = self.group if self.group is not None else self.properties
        value = source.get("creationTimestamp")
        return str(value) if value else None


def _preempted(instance: Mapping[str, Any]) -> bool:
    return "preempt" in str(instance.get("statusMessage", "")).lower()


def _maintenance(instance: Mapping[str, Any]) -> str | None:
    upcoming = (instance.get("resourceStatus") or {}).get("upcomingMaintenance") or {}
    return str(upcoming.get("maintenanceStatus") or "PENDING") if upcoming else None


def _coming_back(instance: Mapping[str, Any]) -> bool:
    """A started instance, not preempted, that restarts by itself (host maintenance)."""
    if _preempted(instance) or not instance.get("lastStartTimestamp"):
        return False
    if _maintenance(instance) == "ONGOING":
        return True
    return bool(_scheduling(instance).get("automaticRestart"))


def termination_of(slice_: ComputeSlice) -> str | None:
    """When the platform takes the slice back (its VMs' terminationTimestamp, set while a
    maxRunDuration runs)."""
    for instance in slice_.instances:
        scheduling = (instance.get("resourceStatus") or {}).get("scheduling") or {}
        if scheduling.get("terminationTimestamp"):
            return str(scheduling["terminationTimestamp"])
    return None


def run_ended_by(slice_: ComputeSlice) -> str | None:
    """For a MIG whose VMs' maxRunDuration deleted them (flex-start's DELETE action: they
    left the group, none preempted), a time its run had surely ended by: the group's creation
    plus the maxRunDuration (the run started no earlier). None otherwise."""
    if slice_.group is None or len(slice_.instances) >= slice_.hosts:
        return None
    if any(map(_preempted, slice_.instances)):
        return None
    scheduling = _scheduling(slice_.properties)
    seconds = str((scheduling.get("maxRunDuration") or {}).get("seconds", ""))
    created = slice_.create_time
    if scheduling.get("instanceTerminationAction") != "DELETE" or not seconds.isdigit():
        return None
    from datetime import timedelta

    from tpuctl.clock import parse_rfc3339, rfc3339

    start = parse_rfc3339(created) if created else None
    return rfc3339(start + timedelta(seconds=int(seconds))) if start else None


def instance_state(instance: Mapping[str, Any]) -> tuple[str, str | None]:
    """The queued-resource state (and initiator) of a single-host slice's instance."""
    status = str(instance.get("status", ""))
    started = bool(instance.get("lastStartTimestamp"))
    if status == "RUNNING":
        return "ACTIVE", None
    if _preempted(instance):
        return ("SUSPENDED" if status == "TERMINATED" else "SUSPENDING"), "SERVICE"
    if _coming_back(instance):
        return "ACTIVE", None
    if not started and status in ("PENDING", "PROVISIONING"):
        return "WAITING_FOR_RESOURCES", None
    if not started and status == "STAGING":
        return "PROVISIONING", None
    if status in ("STOPPING", "SUSPENDING"):
        return "SUSPENDING", _stop_initiator(instance)
    if status in ("TERMINATED", "SUSPENDED", "STOPPED"):
        return "SUSPENDED", _stop_initiator(instance)
    return "PROVISIONING", None


def _stop_initiator(instance: Mapping[str, Any]) -> str:
    """The service stopped it (host maintenance, its run's maxRunDuration), else a user."""
    if instance.get(STOPPED_BY) or _scheduling(instance).get("maxRunDuration"):
        return "SERVICE"
    return "USER"


def stop_cause(instance: Mapping[str, Any]) -> str | None:
    """What is known to have stopped an instance: "preempted", "service", else None."""
    if _preempted(instance):
        return "preempted"
    return "service" if instance.get(STOPPED_BY) else None


def group_state(slice_: ComputeSlice) -> tuple[str, str | None]:
    """The queued-resource state (and initiator) of a MIG slice."""
    assert slice_.group is not None
    status = slice_.group.get("status") or {}
    topologies = status.get("appliedAcceleratorTopologies") or [{}]
    topology = str(topologies[0].get("state", ""))
    if topology == "DEACTIVATING":
        return "DELETING", None
    if (status.get("bulkInstanceOperation") or {}).get("inProgress"):
        started = any(i.get("status") in ("STAGING", "RUNNING") for i in slice_.instances)
        return ("PROVISIONING" if started else "WAITING_FOR_RESOURCES"), None
    if topology in ("ACTIVE", "REACTIVATING"):
        return "ACTIVE", None
    if topology == "INCOMPLETE":
        lost = len(slice_.instances) < slice_.hosts or any(map(_preempted, slice_.instances))
        if not lost and all(
            i.get("status") == "RUNNING" or _coming_back(i) for i in slice_.instances
        ):
            return "ACTIVE", None
        states = [instance_state(i) for i in slice_.instances]
        going = any(state == "SUSPENDING" for state, _ in states)
        initiator = next((who for _, who in states if who), "SERVICE")
        return ("SUSPENDING" if going else "SUSPENDED"), initiator
    return "PROVISIONING", None


def slice_queued_resource(
    name: str, slice_: ComputeSlice, *, deleting: bool = False, termination: str | None = None
) -> Any:
    """The queued resource of a slice Compute Engine holds (`deleting`: asked to go;
    `termination`: its end as seen before, when its VMs no longer say it)."""
    if deleting:
        state, initiator = "DELETING", None
    elif slice_.group is None:
        state, initiator = instance_state(slice_.instances[0])
    else:
        state, initiator = group_state(slice_)
    return synthesize_queued_resource(
        name,
        state=state,
        initiator=initiator,
        accelerator=accelerator_of(slice_.machine_type, slice_.hosts),
        properties=slice_.properties,
        create_time=slice_.create_time,
        termination=termination_of(slice_) or termination or run_ended_by(slice_),
    )


def failed_queued_resource(name: str, operation: Mapping[str, Any]) -> Any:
    """The FAILED queued resource of an insert whose operation ended in an error (its VM gone)."""
    errors = (operation.get("error") or {}).get("errors") or [{}]
    message = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors)
    code = int(operation.get("httpErrorStatusCode") or 0)
    return synthesize_queued_resource(
        name,
        state="FAILED",
        accelerator="",
        properties={},
        failure=(code, message.strip(": ")),
        create_time=operation.get("insertTime"),
    )


def worker_number(instance: Mapping[str, Any], fallback: int) -> int:
    value = metadata_items(instance.get("metadata")).get(WORKER_NUMBER, "")
    return int(value) if value.isdigit() else fallback


def node_state(slice_: ComputeSlice) -> tuple[str, str]:
    """(Node.State, Node.Health) of the slice's one node."""
    statuses = [str(i.get("status", "")) for i in slice_.instances]
    if any(_maintenance(i) == "ONGOING" for i in slice_.instances):
        state = "READY" if all(s == "RUNNING" for s in statuses) else "RESTARTING"
        return state, "UNHEALTHY_MAINTENANCE"
    if statuses and all(s == "RUNNING" for s in statuses) and len(statuses) >= slice_.hosts:
        return "READY", "HEALTHY"
    if any(map(_preempted, slice_.instances)):
        return "PREEMPTED", "HEALTH_UNSPECIFIED"
    if any(s in ("STOPPING", "SUSPENDING") for s in statuses):
        return "STOPPING", "HEALTH_UNSPECIFIED"
    if any(s in ("TERMINATED", "STOPPED", "SUSPENDED") for s in statuses):
        return "STOPPED", "HEALTH_UNSPECIFIED"
    if any(i.get("lastStartTimestamp") for i in slice_.instances):
        return "RESTARTING", "HEALTH_UNSPECIFIED"  # booting again on its disk
    return "CREATING", "HEALTH_UNSPECIFIED"


def slice_node(node_name: str, queued_resource: str, slice_: ComputeSlice) -> Any:
    """The v2alpha1 Node of a slice: workers in `agent-worker-number` order."""
    from google.cloud import tpu_v2alpha1 as tpu

    state, health = node_state(slice_)
    endpoints = []
    for instance in slice_.instances:
        nic = (instance.get("networkInterfaces") or [{}])[0]
        access = (nic.get("accessConfigs") or [{}])[0]
        endpoint = tpu.NetworkEndpoint(ip_address=str(nic.get("networkIP", "")), port=8470)
        if access.get("natIP"):
            endpoint.access_config = tpu.AccessConfig(external_ip=str(access["natIP"]))
        endpoints.append(endpoint)
    first = slice_.instances[0] if slice_.instances else {}
    node = tpu.Node(
        name=node_name,
        accelerator_type=accelerator_of(slice_.machine_type, slice_.hosts),
        state=getattr(tpu.Node.State, state),
        health=getattr(tpu.Node.Health, health),
        network_endpoints=endpoints,
        metadata=metadata_items(first.get("metadata")),
        labels=dict(first.get("labels") or slice_.properties.get("labels") or {}),
        queued_resource=queued_resource,
    )
    upcoming = next(
        (
            (i.get("resourceStatus") or {}).get("upcomingMaintenance")
            for i in slice_.instances
            if _maintenance(i) == "PENDING"
        ),
        None,
    )
    if upcoming:
        node.upcoming_maintenance = tpu.UpcomingMaintenance(
            maintenance_status=tpu.UpcomingMaintenance.MaintenanceStatus.PENDING,
            can_reschedule=bool(upcoming.get("canReschedule", False)),
        )
    created = slice_.create_time
    if created:
        from tpuctl.clock import parse_rfc3339

        moment = parse_rfc3339(created)
        if moment is not None:
            node.create_time = moment
    return node
