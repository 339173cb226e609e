"""Instance templates, workload policies and managed instance groups in bulk mode: a multi-host
TPU slice on Compute Engine.

A bulk MIG of a TPU template with a workload policy's accelerator topology waits until the
capacity for every host is there, then makes them all at once. Its managed instances exist (by
name) from the start; the instances themselves, for a flex-start template, exist too, PENDING
(other templates: only once capacity is there). Worker numbers go to the instances in an order
unrelated to their names, so a client reads each instance's number rather than counting the list.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

from tpuctl.emulator.compute import catalog
from tpuctl.emulator.compute.errors import (
    ComputeApiError,
    OperationError,
    bad_field,
    in_use,
    invalid,
)
from tpuctl.emulator.compute.instance_resource import plan_instance
from tpuctl.emulator.compute.instances import (
    Context,
    bring_up,
    forget,
    set_status,
    terminate,
)
from tpuctl.emulator.compute.instances import try_allocate as allocate
from tpuctl.emulator.compute.links import link, parse_ref, region_of
from tpuctl.emulator.compute.store import (
    GroupRecord,
    InstanceRecord,
    OperationRecord,
    PolicyRecord,
    Scope,
    Store,
    TemplateRecord,
    fingerprint,
)
from tpuctl.emulator.control.clock import rfc3339

WAITING_CODE = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
_SUFFIX = string.ascii_lowercase + string.digits


# ---------------------------------------------------------------------------- templates
def template_json(template: TemplateRecord) -> dict[str, Any]:
    body = dict(template.body)
    body.update(
        kind="compute#instanceTemplate",
        id=template.id,
        name=template.name,
        creationTimestamp=rfc3339(template.created),
        selfLink=template.link,
    )
    if template.region is not None:
        body["region"] = link(template.project, "regions", template.region)
    return body


def check_template(template_body: dict[str, Any]) -> None:
    """What a template must say for a TPU VM; the rest is checked when a MIG uses it."""
    properties = template_body.get("properties")
    if not isinstance(properties, dict):
        raise invalid("Invalid value for field 'resource.properties': ''. Required.")
    machine = properties.get("machineType", "")
    if "/" in str(machine):
        # Compute Engine's own documentation: a URL here is an INTERNAL_ERROR.
        raise bad_field(
            "resource.properties.machineType", machine,
            "An instance template takes a machine type name, not a URL.",
        )  # fmt: skip
    catalog.machine_type(str(machine), "resource.properties.machineType")


# ----------------------------------------------------------------------------- policies
def policy_json(policy: PolicyRecord) -> dict[str, Any]:
    body = dict(policy.body)
    body.update(
        kind="compute#resourcePolicy",
        id=policy.id,
        name=policy.name,
        creationTimestamp=rfc3339(policy.created),
        selfLink=policy.link,
        region=link(policy.project, "regions", policy.region),
        status="READY",
    )
    return body


def check_policy(body: dict[str, Any]) -> None:
    workload = body.get("workloadPolicy")
    if workload is None:
        return
    if not workload.get("type"):
        raise invalid("Invalid value for field 'resource.workloadPolicy.type': ''. Required.")
    if workload.get("acceleratorTopology") and workload.get("type") != "HIGH_THROUGHPUT":
        raise bad_field(
            "resource.workloadPolicy.acceleratorTopology", workload["acceleratorTopology"],
            "An accelerator topology needs a HIGH_THROUGHPUT workload policy.",
        )  # fmt: skip
    if workload.get("acceleratorTopology") and workload.get("maxTopologyDistance"):
        raise invalid(
            "Invalid value for field 'resource.workloadPolicy': acceleratorTopology and "
            "maxTopologyDistance cannot both be set."
        )


# ---------------------------------------------------------------------------------- MIGs
def plan_group(
    store: Store, project: str, scope: Scope, body: dict[str, Any], zones: Sequence[str]
) -> GroupRecord:
    """The record of a MIG `body` asks for (under the lock); a 400 for what Compute Engine
    refuses of a TPU MIG."""
    from tpuctl.emulator.compute.links import check_name

    name = check_name(body.get("name"))
    kind, where = scope
    region = where if kind == "regions" else region_of(where)
    template = _template(store, project, body.get("instanceTemplate"))
    if template.region is not None and template.region != region:
        raise bad_field(
            "resource.instanceTemplate", body.get("instanceTemplate"),
            f"A regional template must be in the group's region {region}.",
        )  # fmt: skip
    properties = template.body["properties"]
    machine = catalog.machine_type(properties["machineType"], "resource.instanceTemplate")
    policy = _workload_policy(store, project, region, body)
    topology = (
        (policy.body.get("workloadPolicy") or {}).get("acceleratorTopology") if policy else None
    )
    mode = (body.get("targetSizePolicy") or {}).get("mode")
    shape = catalog.single_host(machine)
    if topology:
        shape = catalog.slice_of(machine, topology, "resource.resourcePolicies.workloadPolicy")
        if mode != "BULK":
            raise invalid(
                "MIGs with TPU accelerator topology require BULK mode in target size policy"
            )
    size = body.get("targetSize", 0)
    if not isinstance(size, int) or size < 0:
        raise bad_field("resource.targetSize", size, "Must be a non-negative integer.")
    if topology and size not in (0, shape.hosts):
        raise bad_field(
            "resource.targetSize", size,
            f"The accelerator topology {shape.topology} of {machine.name} VMs has "
            f"{shape.hosts} hosts: the target size is {shape.hosts} (or 0).",
        )  # fmt: skip
    zone = where if kind == "zones" else _group_zone(body, region, zones)
    group = GroupRecord(
        project=project,
        scope=scope,
        name=name,
        body=body,
        created=store.clock.wall(),
        template=template,
        machine=machine,
        slice=shape,
        topology=shape.topology if topology else None,
        zone=zone,
        target_size=size,
    )
    # Every instance is checked now, as the service checks the template when it is used.
    plan_instance(
        store, project, zone, {**properties, "name": f"{_base(group)}-aaaa"},
        machine_name=machine.name, prefix="resource.instanceTemplate.properties",
    )  # fmt: skip
    return group


def _template(store: Store, project: str, value: Any) -> TemplateRecord:
    ref = parse_ref(value, "resource.instanceTemplate", "instanceTemplates")
    kind, where = ref.scope
    key = (
        link(ref.project or project, "global", "instanceTemplates", ref.name)
        if kind == "global"
        else link(ref.project or project, kind, where, "instanceTemplates", ref.name)
    )
    found = store.templates.get(key)
    if found is None:
        raise bad_field(
            "resource.instanceTemplate", value,
            "The referenced instanceTemplate resource cannot be found.",
        )  # fmt: skip
    return found


def _workload_policy(
    store: Store, project: str, region: str, body: dict[str, Any]
) -> PolicyRecord | None:
    value = (body.get("resourcePolicies") or {}).get("workloadPolicy")
    if not value:
        return None
    field = "resource.resourcePolicies.workloadPolicy"
    ref = parse_ref(value, field, "resourcePolicies")
    if ref.scope != ("regions", region):
        raise bad_field(field, value, f"The workload policy must be in the region {region}.")
    policy = store.policies.get(
        link(ref.project or project, "regions", region, "resourcePolicies", ref.name)
    )
    if policy is None:
        raise bad_field(field, value, "The referenced resourcePolicy resource cannot be found.")
    if "workloadPolicy" not in policy.body:
        raise bad_field(field, value, "The resource policy is not a workload policy.")
    return policy


def _group_zone(body: dict[str, Any], region: str, zones: Sequence[str]) -> str:
    distribution = body.get("distributionPolicy") or {}
    shape = distribution.get("targetShape")
    if shape not in (None, "ANY_SINGLE_ZONE"):
        raise bad_field(
            "resource.distributionPolicy.targetShape", shape,
            "A regional MIG in bulk mode puts all its instances in one zone: ANY_SINGLE_ZONE.",
        )  # fmt: skip
    for entry in distribution.get("zones") or []:
        zone = str(entry.get("zone", "")).rstrip("/").rsplit("/", 1)[-1]
        if zone:
            if region_of(zone) != region:
                raise bad_field(
                    "resource.distributionPolicy.zones", zone, f"Not a zone of {region}."
                )
            return zone  # the first zone listed is the one the fake uses
    in_region = [zone for zone in zones if region_of(zone) == region]
    return in_region[0] if in_region else f"{region}-a"


def _base(group: GroupRecord) -> str:
    return str(group.body.get("baseInstanceName") or group.name)


def member_names(group: GroupRecord, taken: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < group.target_size:
        name = f"{_base(group)}-{''.join(random.choices(_SUFFIX, k=4))}"
        if name not in taken and name not in names:
            names.append(name)
    return names


def member_record(store: Store, group: GroupRecord, name: str) -> InstanceRecord:
    properties = group.template.body["properties"]
    instance = plan_instance(
        store, group.project, group.zone, {**properties, "name": name},
        machine_name=group.machine.name, prefix="resource.instanceTemplate.properties",
    )  # fmt: skip
    instance.slice = group.slice
    instance.group = group.link
    return instance


def group_extra(group: GroupRecord) -> dict[str, str]:
    """The metadata a MIG adds to its instances."""
    return {"created-by": group.link, "instance-template": group.template.link}


def bulk_create(ctx: Context, group: GroupRecord, epoch: int) -> None:
    """Wait for the capacity of every host, then make them all (a slice), then READY."""
    store = ctx.store

    def alive() -> bool:
        return not store.closing and not group.deleting and group.epoch == epoch

    with store.cond:
        if not alive():
            return
        if group.target_size == 0:
            group.state = "READY"
            return
        group.state = "WAITING"
        taken = {name for (p, z, name) in store.instances if (p, z) == (group.project, group.zone)}
        group.members = member_names(group, taken)
        flex = (
            group.template.body["properties"].get("scheduling", {}).get("provisioningModel")
            == "FLEX_START"
        )
        instances = [member_record(store, group, name) for name in group.members]
        order = list(range(len(instances)))
        random.shuffle(order)  # worker numbers unrelated to names or list order
        for instance, worker in zip(instances, order, strict=True):
            # Without an accelerator topology each VM is a single-host slice of its own.
            instance.worker = worker if group.topology else 0
            if flex:  # a flex-start request's VMs exist while they wait
                instance.status = "PENDING"
                store.instances[instance.key] = instance
        store.events.emit("compute.group.waiting", node=group.link, detail=str(len(instances)))
        while not allocate(store, instances):
            if not alive():
                return
            group.progress_error = OperationError(
                WAITING_CODE,
                f"Waiting for capacity for {len(instances)} {group.machine.name} VMs in "
                f"{group.zone} ({store.pools.free(group.machine.generation, group.zone)} "
                f"{group.machine.generation} chips free).",
                503,
            )
            group.progress_time = store.clock.wall()
            store.cond.wait(1.0)
        group.progress_error = None
        group.progress_time = store.clock.wall()
        group.state = "CREATING"
        for instance in instances:
            store.instances[instance.key] = instance
        store.events.emit("compute.group.creating", node=group.link)
    extra = group_extra(group)
    slices = [instances] if group.topology else [[instance] for instance in instances]
    if all([bring_up(ctx, hosts, alive, extra=lambda _instance: extra) for hosts in slices]):
        with store.lock:
            group.state = "READY"
            store.events.emit("compute.group.ready", node=group.link, detail=group.topology or "")
            store.cond.notify_all()


def delete_members(
    ctx: Context, group: GroupRecord, graceful: bool, operation: OperationRecord | None
) -> None:
    """Cancel a bulk creation still waiting, delete every instance of the group."""
    store = ctx.store
    with store.lock:
        members = [
            store.instances[(group.project, group.zone, name)]
            for name in group.members
            if (group.project, group.zone, name) in store.instances
        ]
        epochs = [store.supersede(instance) for instance in members]
    for instance, epoch in zip(members, epochs, strict=True):
        if instance.status == "PENDING" or not instance.in_plane:
            with store.lock:
                forget(store, instance)
            continue
        with store.lock:
            set_status(store, instance, "STOPPING")
        terminate(ctx, instance, epoch, delete=True, why="group deleted", graceful=graceful)
    with store.lock:
        group.members = []
        if operation is not None:
            store.finish(operation)


def member_changed(ctx: Context, instance: InstanceRecord) -> None:
    """An instance of a MIG ended its run (deleted) or was deleted: the group no longer counts
    it (the fake never recreates a managed instance)."""
    store = ctx.store
    with store.lock:
        if not instance.gone:
            return
        for group in store.groups.values():
            if group.link == instance.group and instance.name in group.members:
                group.members.remove(instance.name)
                group.target_size = max(0, group.target_size - 1)
                store.events.emit(
                    "compute.group.member-gone", node=group.link, detail=instance.name
                )


# ------------------------------------------------------------------------- showing a MIG
def members(store: Store, group: GroupRecord) -> list[tuple[str, InstanceRecord | None]]:
    return [
        (name, store.instances.get((group.project, group.zone, name))) for name in group.members
    ]


def _action(group: GroupRecord, instance: InstanceRecord | None) -> str:
    if group.deleting:
        return "DELETING"
    if instance is None or instance.status in ("PENDING", "PROVISIONING", "STAGING"):
        return "CREATING" if group.state != "READY" else "NONE"
    if instance.status == "STOPPING":
        return "STOPPING"
    return "NONE"


def topology_state(store: Store, group: GroupRecord) -> str:
    """appliedAcceleratorTopologies[].state: ACTIVATING until every host runs, ACTIVE while
    they all do, REACTIVATING while one comes back from maintenance, INCOMPLETE once a host is
    lost (preempted, stopped, run ended), DEACTIVATING while the group is deleted."""
    if group.deleting:
        return "DEACTIVATING"
    found = members(store, group)
    if group.state != "READY":
        return "ACTIVATING"
    statuses = [instance.status if instance else "" for _name, instance in found]
    if len(statuses) == group.slice.hosts and all(status == "RUNNING" for status in statuses):
        return "ACTIVE"
    coming_back = all(
        instance is not None
        and (
            instance.status == "RUNNING"
            or (instance.upcoming or {}).get("maintenanceStatus") == "ONGOING"
        )
        for _name, instance in found
    )
    return "REACTIVATING" if coming_back and len(found) == group.slice.hosts else "INCOMPLETE"


def group_json(store: Store, group: GroupRecord) -> dict[str, Any]:
    body = {key: value for key, value in group.body.items() if key != "status"}
    kind, where = group.scope
    found = members(store, group)
    actions: dict[str, int] = dict.fromkeys(
        ("abandoning", "creating", "creatingWithoutRetries", "deleting", "none", "recreating",
         "refreshing", "restarting", "resuming", "starting", "stopping", "suspending",
         "verifying"), 0,
    )  # fmt: skip
    statuses: dict[str, int] = {}
    for _name, instance in found:
        action = _action(group, instance)
        actions[action.lower()] = actions.get(action.lower(), 0) + 1
        key = _camel(instance.status) if instance is not None else "nonExistent"
        statuses[key] = statuses.get(key, 0) + 1
    in_progress = group.state in ("WAITING", "CREATING") and not group.deleting
    bulk: dict[str, Any] = {"inProgress": in_progress}
    if group.progress_time is not None:
        check: dict[str, Any] = {"timestamp": rfc3339(group.progress_time)}
        if group.progress_error is not None:
            check["error"] = {
                "errors": [
                    {"code": group.progress_error.code, "message": group.progress_error.message}
                ]
            }
        bulk["lastProgressCheck"] = check
    status: dict[str, Any] = {
        "isStable": not in_progress and actions["none"] == len(found) and not group.deleting,
        "bulkInstanceOperation": bulk,
        "currentInstanceStatuses": statuses,
    }
    if group.topology:
        status["appliedAcceleratorTopologies"] = [
            {"acceleratorTopology": group.topology, "state": topology_state(store, group)}
        ]
    body.update(
        kind="compute#instanceGroupManager",
        id=group.id,
        name=group.name,
        creationTimestamp=rfc3339(group.created),
        selfLink=group.link,
        instanceTemplate=group.template.link,
        baseInstanceName=_base(group),
        targetSize=group.target_size,
        instanceGroup=link(group.project, kind, where, "instanceGroups", group.name),
        fingerprint=fingerprint((group.id, group.target_size)),
        currentActions=actions,
        status=status,
        listManagedInstancesResults=body.get("listManagedInstancesResults", "PAGELESS"),
    )
    if kind == "zones":
        body["zone"] = link(group.project, "zones", where)
    else:
        body["region"] = link(group.project, "regions", where)
        body["distributionPolicy"] = {
            "targetShape": "ANY_SINGLE_ZONE",
            "zones": [{"zone": link(group.project, "zones", group.zone)}],
        }
    return body


def managed_instances(store: Store, group: GroupRecord) -> list[dict[str, Any]]:
    listed = []
    for name, instance in members(store, group):
        entry: dict[str, Any] = {
            "instance": link(group.project, "zones", group.zone, "instances", name),
            "name": name,
            "currentAction": _action(group, instance),
            "targetStatus": "RUNNING",
        }
        if instance is not None:
            entry["id"] = instance.id
            entry["instanceStatus"] = instance.status
            if instance.termination_timestamp is not None:
                entry["scheduling"] = {
                    "terminationTimestamp": rfc3339(instance.termination_timestamp)
                }
        listed.append(entry)
    return listed


def _camel(status: str) -> str:
    head, *rest = status.lower().split("_")
    return head + "".join(part.title() for part in rest)


def check_unused(store: Store, target: str, what: str) -> None:
    """A template or policy still used by a MIG cannot be deleted."""
    for group in store.groups.values():
        if what == "template":
            uses = group.template.link == target
        else:
            value = (group.body.get("resourcePolicies") or {}).get("workloadPolicy")
            ref = parse_ref(value, "workloadPolicy", "resourcePolicies") if value else None
            uses = ref is not None and target == link(
                ref.project or group.project, *ref.scope, "resourcePolicies", ref.name
            )
        if uses:
            raise in_use(target, group.link)


def resize_check(group: GroupRecord, size: int) -> None:
    if group.topology and size not in (0, group.slice.hosts):
        raise ComputeApiError(
            400,
            "invalid",
            f"Invalid value for field 'size': '{size}'. A MIG with the accelerator topology "
            f"{group.topology} has {group.slice.hosts} hosts: resize it to {group.slice.hosts} "
            "or 0.",
        )
