"""Instances: a request turned into a record, the record shown as Compute Engine shows it, and
the flows of its life: waiting for capacity, provisioning, boot, stop, start, delete, spot
preemption, host maintenance and the end of its run duration.

Every flow runs in its own thread (Store.spawn) under the instance's flow_lock, and gives up at
its next step once superseded (Store.alive). The worker plane is called off the store's lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from tpuctl.emulator.compute import catalog
from tpuctl.emulator.compute.errors import (
    ComputeApiError,
    bad_field,
    interrupted,
    invalid,
    stockout,
)
from tpuctl.emulator.compute.links import check_name, link, parse_ref
from tpuctl.emulator.compute.store import (
    InstanceRecord,
    OperationRecord,
    Store,
    fingerprint,
)
from tpuctl.emulator.control.clock import rfc3339
from tpuctl.emulator.vms.metadata import project_number

log = logging.getLogger("tpuctl.emulator")

# Compute Engine's preemption notice: an ACPI soft off, then the VM is off 30 s later.
PREEMPTION_NOTICE = 30.0
# A flex-start VM waits for capacity (PENDING) only with a window of at least this much.
PENDING_MIN_WINDOW = 90.0
MAX_WAIT_WINDOW = 7200.0  # requestValidForDuration's ceiling (two hours)
MAX_FLEX_RUN = 7 * 24 * 3600.0  # flex-start VMs run at most seven days
MAINTENANCE_WINDOW = 3600.0  # how long an announced maintenance window lasts (emulated)


class ComputePlane(Protocol):
    """What the fake needs of the worker plane (tpuctl.emulator.vms.workers.WorkerPlane)."""

    def create_node(
        self, identity: Any, metadata: dict[str, str], *, coordinator: str | None
    ) -> Sequence[Any]: ...

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None: ...

    def set_instance_state(self, node_id: str, state: dict[str, str]) -> None: ...

    def set_hosts(self, node_id: str, text: str) -> None: ...

    def boot(self, node_id: str) -> None: ...

    def stop_node(self, node_id: str, grace: float | None, shutdown: float = 0.0) -> None: ...

    def delete_node(self, node_id: str) -> None: ...


@dataclass
class Context:
    store: Store
    plane: ComputePlane
    # Told when an instance of a MIG changes state (groups.py keeps the MIG's status).
    member_changed: Callable[[InstanceRecord], None] | None = None


# ------------------------------------------------------------------------- the request
def _duration(value: Any) -> float:
    """A Duration {seconds, nanos} in seconds."""
    if not isinstance(value, dict):
        return 0.0
    return float(int(value.get("seconds", 0) or 0)) + int(value.get("nanos", 0) or 0) / 1e9


def _timestamp(value: str, field: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise bad_field(field, value, "Must be an RFC 3339 timestamp.") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _scheduling(body: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The scheduling block, checked for a TPU VM, with Compute Engine's defaults filled in."""
    sent = dict(body.get("scheduling") or {})
    model = sent.get("provisioningModel") or ("SPOT" if sent.get("preemptible") else "STANDARD")
    if sent.get("onHostMaintenance") != "TERMINATE":
        raise bad_field(
            f"{prefix}.scheduling.onHostMaintenance",
            sent.get("onHostMaintenance", ""),
            "Instances with TPUs do not support live migration: set onHostMaintenance to "
            "TERMINATE.",
        )
    run = sent.get("maxRunDuration")
    if run is not None and sent.get("terminationTime"):
        raise invalid(
            f"Invalid value for field '{prefix}.scheduling': maxRunDuration and terminationTime "
            "cannot both be set."
        )
    if model == "FLEX_START":
        if run is None:
            raise invalid(
                f"Invalid value for field '{prefix}.scheduling.maxRunDuration': ''. A "
                "FLEX_START instance needs a maxRunDuration."
            )
        if _duration(run) > MAX_FLEX_RUN:
            raise bad_field(
                f"{prefix}.scheduling.maxRunDuration", _duration(run),
                "A FLEX_START instance runs at most 7 days.",
            )  # fmt: skip
    if run is not None and _duration(run) <= 0:
        raise bad_field(f"{prefix}.scheduling.maxRunDuration", _duration(run), "Must be positive.")
    if model == "SPOT" and sent.get("automaticRestart"):
        raise invalid(
            f"Invalid value for field '{prefix}.scheduling.automaticRestart': 'true'. Spot "
            "instances cannot be restarted automatically."
        )
    action = sent.get("instanceTerminationAction") or (
        "DELETE" if model == "FLEX_START" else "STOP"
    )
    if action == "INSTANCE_TERMINATION_ACTION_UNSPECIFIED":
        action = "STOP"
    sent.update(
        provisioningModel=model,
        instanceTerminationAction=action,
        automaticRestart=bool(sent.get("automaticRestart", model == "STANDARD")),
        preemptible=bool(sent.get("preemptible", False)),
    )
    return sent


def _reservation(body: dict[str, Any], model: str, prefix: str) -> None:
    affinity = body.get("reservationAffinity") or {}
    kind = affinity.get("consumeReservationType")
    if model == "RESERVATION_BOUND" and kind != "SPECIFIC_RESERVATION":
        raise bad_field(
            f"{prefix}.reservationAffinity.consumeReservationType", kind or "",
            "A RESERVATION_BOUND instance consumes a specific reservation "
            "(SPECIFIC_RESERVATION, with the reservation in key and values).",
        )  # fmt: skip
    if kind == "SPECIFIC_RESERVATION" and not affinity.get("values"):
        raise bad_field(
            f"{prefix}.reservationAffinity.values", "",
            "SPECIFIC_RESERVATION names the reservation in values.",
        )  # fmt: skip


def _metadata_items(body: dict[str, Any], prefix: str) -> dict[str, str]:
    items: dict[str, str] = {}
    for index, item in enumerate((body.get("metadata") or {}).get("items") or []):
        key = item.get("key")
        if not isinstance(key, str) or not key:
            raise bad_field(f"{prefix}.metadata.items[{index}].key", key or "", "Required.")
        if key in items:
            raise invalid(f"Duplicate metadata key '{key}' in '{prefix}.metadata.items'.")
        items[key] = str(item.get("value", ""))
    return items


def plan_instance(
    store: Store,
    project: str,
    zone: str,
    body: dict[str, Any],
    *,
    machine_name: str | None = None,
    prefix: str = "resource",
) -> InstanceRecord:
    """The record of an instance `body` asks for; a 400 for what Compute Engine would refuse
    for a TPU VM. `machine_name` is the template's bare machine type for a MIG's instances."""
    name = check_name(body.get("name"), f"{prefix}.name")
    if machine_name is None:
        ref = parse_ref(body.get("machineType"), f"{prefix}.machineType", "machineTypes")
        if ref.scope != ("zones", zone):
            raise bad_field(
                f"{prefix}.machineType", body.get("machineType"),
                f"The machine type must be in the instance's zone {zone}.",
            )  # fmt: skip
        machine_name = ref.name
    machine = catalog.machine_type(machine_name, f"{prefix}.machineType")
    scheduling = _scheduling(body, prefix)
    model = scheduling["provisioningModel"]
    _reservation(body, model, prefix)
    disks = body.get("disks") or []
    if not any(isinstance(disk, dict) and disk.get("boot") for disk in disks):
        raise invalid(f"Invalid value for field '{prefix}.disks': ''. A boot disk is required.")
    for index, policy in enumerate(body.get("resourcePolicies") or []):
        ref = parse_ref(policy, f"{prefix}.resourcePolicies[{index}]", "resourcePolicies")
        found = store.policies.get(
            link(ref.project or project, ref.scope[0], ref.scope[1], "resourcePolicies", ref.name)
        )
        if found is not None and "workloadPolicy" in found.body:
            raise invalid(
                "Resource policy must have one of [VmMaintenancePolicy, GroupPlacementPolicy, "
                "InstanceSchedulePolicy]; a workload policy applies to a managed instance group."
            )
    window = None
    params = body.get("params") or {}
    if "requestValidForDuration" in params:
        window = _duration(params["requestValidForDuration"])
        if model != "FLEX_START":
            raise bad_field(
                f"{prefix}.params.requestValidForDuration", window,
                "Only a FLEX_START instance waits for capacity.",
            )  # fmt: skip
        if not 0 < window <= MAX_WAIT_WINDOW:
            raise bad_field(
                f"{prefix}.params.requestValidForDuration", window,
                "Must be more than 0 and at most 7200 seconds.",
            )  # fmt: skip
    termination_time = None
    if scheduling.get("terminationTime"):
        termination_time = _timestamp(
            scheduling["terminationTime"], f"{prefix}.scheduling.terminationTime"
        )
        if termination_time <= store.clock.wall():
            raise bad_field(
                f"{prefix}.scheduling.terminationTime", scheduling["terminationTime"],
                "Must be in the future.",
            )  # fmt: skip
    stored = {**body, "scheduling": scheduling}
    stored.pop("params", None)  # input only
    nics = body.get("networkInterfaces") or [{}]
    return InstanceRecord(
        project=project,
        zone=zone,
        name=name,
        body=stored,
        machine=machine,
        slice=catalog.single_host(machine),
        created=store.clock.wall(),
        model=model,
        action=scheduling["instanceTerminationAction"],
        run_duration=_duration(scheduling["maxRunDuration"])
        if "maxRunDuration" in scheduling
        else None,
        termination_time=termination_time,
        wait_window=window,
        items=_metadata_items(body, prefix),
        external=any(nic.get("accessConfigs") for nic in nics),
    )


# ---------------------------------------------------------------------- the resource
def instance_json(instance: InstanceRecord) -> dict[str, Any]:
    """The instance as instances.get shows it."""
    body: dict[str, Any] = json.loads(json.dumps(instance.body))
    project, zone = instance.project, instance.zone
    body.update(
        kind="compute#instance",
        id=instance.id,
        name=instance.name,
        creationTimestamp=rfc3339(instance.created),
        zone=link(project, "zones", zone),
        machineType=link(project, "zones", zone, "machineTypes", instance.machine.name),
        status=instance.status,
        selfLink=instance.link,
        cpuPlatform="Unknown CPU Platform",
        startRestricted=False,
        deletionProtection=bool(body.get("deletionProtection", False)),
        canIpForward=bool(body.get("canIpForward", False)),
        fingerprint=fingerprint((instance.id, instance.status, instance.metadata_version)),
        labels=body.get("labels") or {},
        labelFingerprint=fingerprint(sorted((body.get("labels") or {}).items())),
        guestAccelerators=[
            {
                "acceleratorType": link(
                    project, "zones", zone, "acceleratorTypes", instance.machine.accelerator
                ),
                "acceleratorCount": instance.machine.chips,
            }
        ],
        metadata={
            "kind": "compute#metadata",
            "fingerprint": instance.metadata_fingerprint,
            "items": [{"key": key, "value": value} for key, value in instance.metadata.items()],
        },
    )
    if instance.status_message:
        body["statusMessage"] = instance.status_message
    body["networkInterfaces"] = _nics(instance)
    body["disks"] = _disks(instance)
    status: dict[str, Any] = {}
    if instance.termination_timestamp is not None:
        status["scheduling"] = {"terminationTimestamp": rfc3339(instance.termination_timestamp)}
    if instance.upcoming is not None:
        status["upcomingMaintenance"] = dict(instance.upcoming)
    if status:
        body["resourceStatus"] = status
    if instance.last_start is not None:
        body["lastStartTimestamp"] = rfc3339(instance.last_start)
    if instance.last_stop is not None:
        body["lastStopTimestamp"] = rfc3339(instance.last_stop)
    return body


def _nics(instance: InstanceRecord) -> list[dict[str, Any]]:
    nics = []
    for index, sent in enumerate(instance.body.get("networkInterfaces") or [{}]):
        nic = dict(sent)
        network = nic.get("network") or "global/networks/default"
        if not str(network).startswith("https://"):
            network = link(instance.project, "global", "networks", str(network).rsplit("/", 1)[-1])
        nic.update(
            kind="compute#networkInterface",
            name=f"nic{index}",
            network=network,
            fingerprint=fingerprint((instance.id, index)),
            stackType=nic.get("stackType", "IPV4_ONLY"),
        )
        if instance.ip:
            nic["networkIP"] = instance.ip
        configs = []
        for config in nic.get("accessConfigs") or []:
            shown = {"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", **config}
            shown.setdefault("name", "External NAT")
            shown.setdefault("networkTier", "PREMIUM")
            if instance.ip:  # one loopback address per VM stands for both of them
                shown["natIP"] = instance.ip
            configs.append(shown)
        if configs:
            nic["accessConfigs"] = configs
        nics.append(nic)
    return nics


def _disks(instance: InstanceRecord) -> list[dict[str, Any]]:
    disks = []
    for index, sent in enumerate(instance.body.get("disks") or []):
        disk = dict(sent)
        device = disk.get("deviceName") or (instance.name if disk.get("boot") else f"disk-{index}")
        disk.pop("initializeParams", None)  # input only: the disk it made is `source`
        disk.update(
            kind="compute#attachedDisk",
            index=index,
            deviceName=device,
            type=disk.get("type", "PERSISTENT"),
            mode=disk.get("mode", "READ_WRITE"),
            autoDelete=bool(disk.get("autoDelete", True)),
            source=disk.get("source")
            or link(instance.project, "zones", instance.zone, "disks", device),
        )
        disks.append(disk)
    return disks


# ------------------------------------------------------------- platform metadata, plane
def platform_metadata(
    instance: InstanceRecord, endpoints: Sequence[str], extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The metadata items Compute Engine adds to a TPU VM (seen on instances of TPU machine
    types): its accelerator type, its worker number in the slice, the slice's workers (the
    instances' names in worker order) and `tpu-env`."""
    shape = instance.slice
    chips_per_host = _dims(instance.machine.host_topology)
    host_bounds = ",".join(
        str(max(1, whole // part))
        for whole, part in zip(_dims(shape.topology), chips_per_host, strict=True)
    )
    env = [
        ("TPU_WORKER_ID", str(instance.worker)),
        ("CONSUMER_PROJECT_ID", instance.project),
        ("CONSUMER_PROJECT_NUMBER", project_number(instance.project)),
        ("ZONE", instance.zone),
        ("NODE_ID", "0"),
        ("TPU_ACCELERATOR_TYPE", shape.accelerator_type),
        ("TOPOLOGY", shape.topology),
        ("WRAP", "false,false,false"),
        ("ALT", "false"),
        ("HOST_BOUNDS", host_bounds),
        ("CHIPS_PER_HOST_BOUNDS", ",".join(str(dim) for dim in chips_per_host)),
    ]
    return {
        "accelerator-type": shape.accelerator_type,
        "agent-worker-number": str(instance.worker),
        "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in env),
        "worker-network-endpoints": ",".join(endpoints),
        **(extra or {}),
    }


def _dims(topology: str) -> list[int]:
    dims = [int(part) for part in topology.split("x")]
    return [*dims, 1, 1, 1][:3]


def instance_state(instance: InstanceRecord) -> dict[str, str]:
    """What the instance's metadata server reports beside the attributes."""
    state = {
        "preempted": "TRUE" if instance.preempted else "FALSE",
        "maintenance-event": instance.maintenance_event,
    }
    if instance.upcoming is not None:
        state["upcoming-maintenance"] = json.dumps(
            {_snake(key): value for key, value in instance.upcoming.items()}, sort_keys=True
        )
    if instance.termination_timestamp is not None:
        state["scheduling/termination-timestamp"] = rfc3339(instance.termination_timestamp)
    return state


def _snake(key: str) -> str:
    return "".join(f"_{char.lower()}" if char.isupper() else char for char in key)


def identity(instance: InstanceRecord) -> Any:
    from tpuctl.emulator.vms.plane_nodes import InstanceIdentity

    scheduling = instance.body["scheduling"]
    return InstanceIdentity(
        node_id=instance.plane_key,
        node_name=instance.link,
        project=instance.project,
        zone=instance.zone,
        accelerator_type=instance.slice.accelerator_type,
        workers=1,
        slice_index=0,
        num_slices=1,
        preemptible=instance.preemptible,
        autocheckpoint=False,
        topology=instance.slice.topology,
        external_ips=instance.external,
        chips_per_vm=instance.machine.chips,
        instance_name=instance.name,
        instance_id=instance.id,
        machine_type=instance.machine.name,
        automatic_restart=bool(scheduling.get("automaticRestart")),
        on_host_maintenance=str(scheduling.get("onHostMaintenance", "TERMINATE")),
    )


def push_state(ctx: Context, instance: InstanceRecord) -> None:
    """Tell the instance's metadata server what changed (off the lock)."""
    from tpuctl.errors import NotFoundError

    with ctx.store.lock:
        if not instance.in_plane:
            return
        state = instance_state(instance)
    with contextlib.suppress(NotFoundError):  # deleted meanwhile
        ctx.plane.set_instance_state(instance.plane_key, state)


def push_metadata(ctx: Context, instance: InstanceRecord) -> None:
    from tpuctl.errors import NotFoundError

    with ctx.store.lock:
        if not instance.in_plane:
            return
        metadata = instance.metadata
    with contextlib.suppress(NotFoundError):
        ctx.plane.set_metadata(instance.plane_key, metadata)


# ------------------------------------------------------------------------------ capacity
def chips(instances: Iterable[InstanceRecord]) -> int:
    return sum(instance.machine.chips for instance in instances)


def try_allocate(store: Store, instances: Sequence[InstanceRecord]) -> bool:
    """Hold capacity for all of `instances` at once, or for none. Under the lock."""
    first = instances[0]
    generation, zone = first.machine.generation, first.zone
    needed = sum(
        instance.machine.chips for instance in instances if not store.pools.holds(instance.link)
    )
    if needed > store.pools.free(generation, zone):
        return False
    for instance in instances:
        store.pools.try_allocate(instance.link, generation, instance.machine.chips, zone)
    store.events.emit("compute.capacity.allocate", detail=f"{generation}={needed} in {zone}")
    return True


def release(store: Store, instance: InstanceRecord) -> None:
    if store.pools.release(instance.link):
        store.events.emit("compute.capacity.release", node=instance.link)
        store.cond.notify_all()


def set_status(store: Store, instance: InstanceRecord, status: str, message: str = "") -> None:
    """Under the lock."""
    if instance.status != status:
        instance.status = status
        store.events.emit("compute.instance.status", node=instance.link, detail=status)
    instance.status_message = message
    store.cond.notify_all()


def forget(store: Store, instance: InstanceRecord) -> None:
    """The instance is deleted: its record goes, its capacity is released. Under the lock."""
    instance.gone = True
    instance.epoch += 1
    release(store, instance)
    if store.instances.get(instance.key) is instance:
        del store.instances[instance.key]
    store.events.emit("compute.instance.deleted", node=instance.link)
    store.cond.notify_all()


# ------------------------------------------------------------------------------- flows
def create(ctx: Context, instance: InstanceRecord, epoch: int, operation: OperationRecord) -> None:
    """instances.insert: capacity (a flex-start VM waits for it, PENDING), then bring it up."""
    store = ctx.store
    with instance.flow_lock:
        ran = _acquire(store, instance, epoch, operation) and bring_up(
            ctx, [instance], lambda: store.alive(instance, epoch)
        )
        with store.lock:  # (an operation that ended keeps its first outcome)
            store.finish(operation, None if ran else interrupted(instance.link))


def _acquire(
    store: Store, instance: InstanceRecord, epoch: int, operation: OperationRecord
) -> bool:
    waits = instance.model == "FLEX_START" and (instance.wait_window or 0) >= PENDING_MIN_WINDOW
    with store.cond:
        if not store.alive(instance, epoch):
            return False
        if waits:
            set_status(store, instance, "PENDING")
            deadline = store.clock.monotonic() + store.clock.scaled(instance.wait_window or 0)
        else:
            deadline = store.clock.monotonic()
        while True:
            if not store.alive(instance, epoch):
                return False
            if try_allocate(store, [instance]):
                return True
            left = deadline - store.clock.monotonic()
            if left <= 0:
                # No capacity (in the window): the insert fails and the VM is deleted.
                store.finish(operation, stockout(link(instance.project, "zones", instance.zone)))
                forget(store, instance)
                return False
            store.cond.wait(left)


def bring_up(
    ctx: Context,
    instances: Sequence[InstanceRecord],
    alive: Callable[[], bool],
    *,
    extra: Callable[[InstanceRecord], dict[str, str]] | None = None,
) -> bool:
    """PROVISIONING → STAGING (the VMs made, their metadata set) → boot → RUNNING, for
    `instances` together (a slice: each knows the others' names). False when `alive()` turned
    False on the way (the caller was superseded)."""
    from tpuctl.errors import NotFoundError

    store = ctx.store
    delays = store.config.delays
    if not _step(store, instances, "PROVISIONING", alive):
        return False
    if not _pause(store, delays.creating, alive):
        return False
    started = store.clock.monotonic()
    if not _step(store, instances, "STAGING", alive):
        return False
    _create_vms(ctx, [instance for instance in instances if not instance.in_plane], alive)
    try:
        if not _describe_slice(ctx, instances, alive, extra):
            return False
        rest = store.clock.scaled(delays.provisioning) - (store.clock.monotonic() - started)
        if not _pause(store, rest, alive, real=True):
            return False
        for instance in instances:
            with store.lock:
                if not alive():
                    return False
            ctx.plane.boot(instance.plane_key)
            store.events.emit("compute.instance.boot", node=instance.link)
    except NotFoundError:
        return False  # deleted meanwhile
    with store.lock:
        if not alive():
            return False
        now = store.clock.wall()
        for instance in instances:
            set_status(store, instance, "RUNNING")
            instance.last_start = now
            _arm_run_end(ctx, instance)
    for instance in instances:
        push_state(ctx, instance)
    return True


def _step(
    store: Store, instances: Sequence[InstanceRecord], status: str, alive: Callable[[], bool]
) -> bool:
    with store.lock:
        if not alive():
            return False
        for instance in instances:
            set_status(store, instance, status)
        return True


def _describe_slice(
    ctx: Context,
    instances: Sequence[InstanceRecord],
    alive: Callable[[], bool],
    extra: Callable[[InstanceRecord], dict[str, str]] | None,
) -> bool:
    """Give each VM the platform's metadata (its worker number, the slice's workers) and the
    names of its peers, before it boots. A VM coming back (start, maintenance) keeps what it
    knew of its slice."""
    with ctx.store.lock:
        if not alive():
            return False
        new = [instance for instance in instances if not instance.platform]
        ordered = sorted(new, key=lambda item: item.worker)
        endpoints = [instance.name for instance in ordered]
        hosts = "".join(f"{instance.ip} {instance.name}\n" for instance in ordered)
        for instance in new:
            instance.platform = platform_metadata(
                instance, endpoints, extra(instance) if extra else None
            )
    for instance in instances:
        push_metadata(ctx, instance)
        push_state(ctx, instance)
    for instance in new:
        ctx.plane.set_hosts(instance.plane_key, hosts)
    return True


def _pause(store: Store, seconds: float, alive: Callable[[], bool], *, real: bool = False) -> bool:
    wait = seconds if real else store.clock.scaled(seconds)
    end = store.clock.monotonic() + wait
    with store.cond:
        while True:
            if store.closing or not alive():
                return False
            left = end - store.clock.monotonic()
            if left <= 0:
                return True
            store.cond.wait(left)


def _create_vms(
    ctx: Context, instances: Sequence[InstanceRecord], alive: Callable[[], bool]
) -> None:
    for instance in instances:
        with ctx.store.lock:
            if not alive():
                return
            metadata = instance.metadata
        [worker] = list(ctx.plane.create_node(identity(instance), metadata, coordinator=None))
        with ctx.store.lock:
            orphan = instance.gone or not alive()
            if not orphan:
                instance.ip = worker.ip
                instance.host_key = worker.host_key
                instance.in_plane = True
        if orphan:  # deleted while its VM was being made
            ctx.plane.delete_node(instance.plane_key)
            return
        ctx.store.events.emit("compute.instance.vm", node=instance.link, detail=worker.ip)


def _arm_run_end(ctx: Context, instance: InstanceRecord) -> None:
    """Set the termination timestamp (when a time limit applies) and its timer. Under the lock.
    A timestamp already set (the VM came back from maintenance) is kept."""
    store = ctx.store
    if instance.termination_timestamp is None:
        if instance.termination_time is not None:
            instance.termination_timestamp = instance.termination_time
        elif instance.run_duration is not None:
            instance.termination_timestamp = store.clock.wall() + timedelta(
                seconds=store.clock.scaled(instance.run_duration)
            )
    if instance.termination_timestamp is None:
        return
    epoch = instance.epoch
    store.spawn(_run_end_timer, ctx, instance, epoch, instance.termination_timestamp)


def _run_end_timer(ctx: Context, instance: InstanceRecord, epoch: int, at: datetime) -> None:
    store = ctx.store
    with store.cond:
        while store.alive(instance, epoch):
            left = (at - store.clock.wall()).total_seconds()
            if left <= 0:
                break
            store.cond.wait(min(left, 1.0))
        if not store.alive(instance, epoch) or instance.status != "RUNNING":
            return
        store.events.emit("compute.instance.run-ended", node=instance.link, detail=instance.action)
        epoch = store.supersede(instance)
        set_status(store, instance, "STOPPING")
    terminate(ctx, instance, epoch, delete=instance.action == "DELETE", why="run duration")


def terminate(
    ctx: Context,
    instance: InstanceRecord,
    epoch: int,
    *,
    delete: bool,
    why: str,
    graceful: bool = True,
    notice: float | None = None,
    operation: OperationRecord | None = None,
) -> None:
    """Shut the VM down (an ACPI soft off: SIGTERM to everything, then `notice` — the OS's
    stop timeout unless given — before the power goes), then TERMINATED, or deleted."""
    store = ctx.store
    with instance.flow_lock:
        with store.lock:
            if instance.gone:
                if operation is not None:
                    store.finish(operation)
                return
            present = instance.in_plane
        if present:
            wait = store.config.shutdown if notice is None else notice
            shutdown = store.clock.scaled(wait) if graceful else 0.0
            ctx.plane.stop_node(instance.plane_key, 0.0 if graceful else None, shutdown)
        if delete:
            if present:
                ctx.plane.delete_node(instance.plane_key)
            _pause(store, store.config.delays.deleting, lambda: True)
        with store.lock:
            if delete:
                instance.in_plane = False
                forget(store, instance)
            elif instance.epoch == epoch:
                release(store, instance)
                instance.termination_timestamp = None
                instance.last_stop = store.clock.wall()
                set_status(store, instance, "TERMINATED", instance.status_message)
            store.events.emit("compute.instance.terminated", node=instance.link, detail=why)
            if operation is not None:
                store.finish(operation)
        if not delete:
            push_state(ctx, instance)
        notify_groups(ctx, instance)


def start(ctx: Context, instance: InstanceRecord, epoch: int, operation: OperationRecord) -> None:
    """instances.start of a TERMINATED VM: capacity again, then it boots (the startup script
    runs again) with its disk as it was."""
    store = ctx.store
    with instance.flow_lock:
        with store.lock:
            if not store.alive(instance, epoch):
                store.finish(operation, interrupted(instance.link))
                return
            if not try_allocate(store, [instance]):
                set_status(store, instance, "TERMINATED")
                store.finish(operation, stockout(link(instance.project, "zones", instance.zone)))
                return
            instance.preempted = False
        ran = bring_up(ctx, [instance], lambda: store.alive(instance, epoch))
        with store.lock:
            store.finish(operation, None if ran else interrupted(instance.link))
        notify_groups(ctx, instance)


# -------------------------------------------------------------------- faults, maintenance
def check_preemptible(instance: InstanceRecord) -> None:
    """A 400 unless `instance` is a spot VM that runs (or is being made)."""
    if instance.model != "SPOT":
        raise ComputeApiError(
            400, "invalid", f"'{instance.link}' is {instance.model}; only SPOT VMs are preempted"
        )
    if instance.status not in ("PROVISIONING", "STAGING", "RUNNING"):
        raise ComputeApiError(
            400, "resourceNotReady", f"'{instance.link}' is {instance.status}, not running"
        )


def preempt(ctx: Context, instance: InstanceRecord) -> None:
    """Spot preemption (under the lock): `preempted` TRUE at once, the soft-off notice, then
    TERMINATED (or deleted, with instanceTerminationAction DELETE)."""
    store = ctx.store
    check_preemptible(instance)
    epoch = store.supersede(instance)
    instance.preempted = True
    set_status(store, instance, "STOPPING", "Instance was preempted.")
    store.system_event(instance, "compute.instances.preempted", "Instance was preempted.")
    store.events.emit("compute.preempt", node=instance.link, detail=instance.action)

    def flow() -> None:
        push_state(ctx, instance)
        terminate(
            ctx,
            instance,
            epoch,
            delete=instance.action == "DELETE",
            why="preempted",
            notice=PREEMPTION_NOTICE,
        )

    store.spawn(flow)


def announce_maintenance(ctx: Context, instance: InstanceRecord, after: float) -> datetime:
    """Scheduled host maintenance `after` emulated seconds from now (under the lock): it shows
    in resourceStatus.upcomingMaintenance and the metadata server at once, and starts then."""
    store = ctx.store
    if instance.status != "RUNNING":
        raise ComputeApiError(
            400, "resourceNotReady", f"'{instance.link}' is {instance.status}, not RUNNING"
        )
    start_at = store.clock.wall() + timedelta(seconds=store.clock.scaled(after))
    instance.upcoming = {
        "type": "SCHEDULED",
        "maintenanceStatus": "PENDING",
        "canReschedule": False,
        "windowStartTime": rfc3339(start_at),
        "latestWindowStartTime": rfc3339(start_at),
        "windowEndTime": rfc3339(
            start_at + timedelta(seconds=store.clock.scaled(MAINTENANCE_WINDOW))
        ),
    }
    store.events.emit("compute.maintenance.scheduled", node=instance.link, detail=rfc3339(start_at))

    def timer() -> None:
        push_state(ctx, instance)
        with store.cond:
            while not store.closing and not instance.gone:
                left = (start_at - store.clock.wall()).total_seconds()
                if left <= 0:
                    break
                store.cond.wait(min(left, 1.0))
            if store.closing or instance.gone or instance.status != "RUNNING":
                store.events.emit("compute.maintenance.skipped", node=instance.link)
                return
            begin_maintenance(ctx, instance, "scheduled")

    store.spawn(timer)
    return start_at


def begin_maintenance(ctx: Context, instance: InstanceRecord, why: str) -> None:
    """Host maintenance now (under the lock): an instance that terminates on host maintenance
    is shut down (SIGTERM, the OS's stop timeout), the host maintained, and it boots again
    (automaticRestart) with its disk: its startup script runs again."""
    store = ctx.store
    epoch = store.supersede(instance)
    instance.upcoming = {
        **(instance.upcoming or {"type": "UNSCHEDULED", "canReschedule": False}),
        "maintenanceStatus": "ONGOING",
    }
    instance.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
    set_status(store, instance, "STOPPING")
    store.system_event(
        instance, "compute.instances.terminateOnHostMaintenance", "Instance terminated during "
        "Compute Engine maintenance."
    )  # fmt: skip
    store.events.emit("compute.maintenance.start", node=instance.link, detail=why)
    store.spawn(_maintenance, ctx, instance, epoch)


def _maintenance(ctx: Context, instance: InstanceRecord, epoch: int) -> None:
    store = ctx.store
    push_state(ctx, instance)
    with instance.flow_lock:
        if instance.in_plane:
            ctx.plane.stop_node(instance.plane_key, 0.0, store.clock.scaled(store.config.shutdown))
        with store.lock:
            if not store.alive(instance, epoch):
                return
            set_status(store, instance, "TERMINATED")
        notify_groups(ctx, instance)
        if not _pause(store, store.config.delays.reboot, lambda: store.alive(instance, epoch)):
            return
        with store.lock:
            restart = bool(instance.body["scheduling"].get("automaticRestart"))
            instance.upcoming = None
            instance.maintenance_event = "NONE"
            if not restart:
                release(store, instance)
                instance.termination_timestamp = None
        if restart:
            bring_up(ctx, [instance], lambda: store.alive(instance, epoch))
        push_state(ctx, instance)
        store.events.emit("compute.maintenance.end", node=instance.link)
    notify_groups(ctx, instance)


def notify_groups(ctx: Context, instance: InstanceRecord) -> None:
    """Tell the managing MIG (if any) that one of its instances changed state."""
    if instance.group is not None and ctx.member_changed is not None:
        ctx.member_changed(instance)
