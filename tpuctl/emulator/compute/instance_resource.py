"""An instance as a resource: the request checked and turned into a record (plan_instance: a 400
for what Compute Engine would refuse for a TPU VM), and the record shown: as instances.get shows
it (instance_json) and as its VM's metadata server shows it (platform_metadata, instance_state,
identity).

No threads and no worker plane here: instances.py and disruptions.py run an instance's life,
and push what the metadata server shows to its VM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from tpuctl.emulator.compute import catalog
from tpuctl.emulator.compute.errors import bad_field, invalid
from tpuctl.emulator.compute.links import check_name, link, parse_ref
from tpuctl.emulator.compute.store import InstanceRecord, Store, fingerprint
from tpuctl.emulator.control.clock import rfc3339
from tpuctl.emulator.vms.metadata import project_number

MAX_WAIT_WINDOW = 7200.0  # requestValidForDuration's ceiling (two hours)
MAX_FLEX_RUN = 7 * 24 * 3600.0  # flex-start VMs run at most seven days


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


def metadata_items(body: dict[str, Any], prefix: str) -> dict[str, str]:
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
        items=metadata_items(body, prefix),
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


# ------------------------------------------------------- what the VM's metadata server shows
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
