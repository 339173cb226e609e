"""Spec → the Compute Engine requests that make its TPU slice (pure: no I/O, no clock).

On Compute Engine a TPU VM is an instance of a TPU machine type. One host is one
`instances.insert`; a multi-host slice is a workload policy naming the accelerator topology
(`resourcePolicies.insert`, regional), an instance template (`instanceTemplates.insert`,
global) and a managed instance group in bulk mode over `hosts` VMs of it
(`instanceGroupManagers.insert`, zonal), sent in that order. Bodies are the REST JSON of the
compute v1 discovery document (camelCase). The spec's rules for `tpu.api: compute` (which
accelerators, tiers and fields exist there) are judged at load time (tpuctl.spec.build).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tpuctl import topology
from tpuctl.render.request import node_labels, node_metadata
from tpuctl.spec.model import CLOUD_PLATFORM_SCOPE, Spec

# A bare `tpu.runtime` is an image family of this project (TPU-optimised Ubuntu images).
IMAGE_PROJECT = "ubuntu-os-accelerator-images"
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
# The OAuth scope a TPU VM's service account gets when the spec names none (as Cloud TPU's).
DEFAULT_SCOPES = (CLOUD_PLATFORM_SCOPE,)
# How long a stop or delete waits for the job's own shutdown (Scheduling.gracefulShutdown):
# the five minutes Cloud TPU's Autocheckpoint gives a save before maintenance.
GRACEFUL_SHUTDOWN = timedelta(minutes=5)
# capacity.tier → Scheduling.provisioningModel (best-effort has none: refused at load time).
PROVISIONING_MODELS = {
    "spot": "SPOT",
    "on-demand": "STANDARD",
    "reserved": "STANDARD",
    "flex-start": "FLEX_START",
    "reservation-bound": "RESERVATION_BOUND",
}
# What happens to a VM at the end of its run or at a preemption: a flex-start or
# reservation-bound VM is deleted when its time ends; a preempted spot VM is stopped, so its
# preemption stays visible (a TPU Spot VM cannot be started again: it is deleted and made anew).
TERMINATION_ACTIONS = {
    "spot": "STOP",
    "flex-start": "DELETE",
    "reservation-bound": "DELETE",
}
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


@dataclass(frozen=True)
class ComputeNames:
    """The resources of one run: its instance (one host) or its policy, template and group."""

    instance: str
    policy: str
    template: str
    group: str


@dataclass(frozen=True)
class ComputeRequest:
    """One call: `resource.method` in `scope` with `body`."""

    # "instances" | "resourcePolicies" | "instanceTemplates" | "instanceGroupManagers" |
    # "regionInstanceGroupManagers"
    resource: str
    method: str  # "insert"
    # {"project": P, "zone": Z} or {"project": P, "region": R}; {"project": P}: global
    scope: dict[str, str]
    body: dict[str, Any]  # REST JSON (camelCase) as compute.v1 discovery defines it

    def as_dict(self) -> dict[str, Any]:
        """As `tpuctl render` prints it."""
        return {
            "method": f"{self.resource}.{self.method}",
            "scope": dict(self.scope),
            "body": self.body,
        }


@dataclass(frozen=True)
class ComputePlan:
    """Everything `create` sends for a `tpu.api: compute` spec, and what it makes."""

    requests: tuple[ComputeRequest, ...]  # in the order they must be sent
    hosts: int  # VMs in the slice
    machine_type: str
    single_host: bool
    names: ComputeNames
    topology: str = ""  # the slice's chip topology, e.g. 2x2x2
    accelerator: str = ""  # the accelerator type, e.g. tpu7x-16


def compute_names(run_name: str) -> ComputeNames:
    """The names of a run's resources: the instance (or group) is the run's own name."""
    return ComputeNames(
        instance=run_name, policy=f"{run_name}-wp", template=f"{run_name}-tpl", group=run_name
    )


def region_of(zone: str) -> str:
    """`us-central2-b` → `us-central2`."""
    return zone.rsplit("-", 1)[0]


def compute_accelerator(spec: Spec) -> topology.Accelerator:
    """The slice a compute spec asks for (accelerator, or type + topology)."""
    tpu = spec.tpu
    if tpu.type and tpu.topology:
        return topology.from_type_topology(tpu.type, tpu.topology, api="compute")
    return topology.parse_accelerator(tpu.accelerator, api="compute")


def source_image(runtime: str) -> str:
    """`tpu.runtime` → the boot disk's sourceImage: a bare name is an image family of
    IMAGE_PROJECT; a path (projects/…/global/images/…, family/… included) is kept."""
    if "/" in runtime:
        return runtime
    return f"projects/{IMAGE_PROJECT}/global/images/family/{runtime}"


def render_compute(
    spec: Spec, *, project: str, zone: str, run_name: str, startup_script: str | None
) -> ComputePlan:
    """The requests `create` sends for a `tpu.api: compute` spec, in order.

    `startup_script`: the script the VMs run at boot; None renders tpuctl's for the spec."""
    accelerator = compute_accelerator(spec)
    machine = topology.compute_machine_type(accelerator)
    names = compute_names(run_name)
    properties = _vm_properties(spec, project=project, zone=zone, startup_script=startup_script)
    if accelerator.vms == 1:
        body = {
            "name": names.instance,
            "machineType": f"zones/{zone}/machineTypes/{machine}",
            **properties,
        }
        window = _request_valid_for(spec)
        if window is not None:
            body["params"] = {"requestValidForDuration": window}
        request = ComputeRequest("instances", "insert", {"project": project, "zone": zone}, body)
        return ComputePlan(
            (request,), 1, machine, True, names, accelerator.topology, accelerator.accelerator_type
        )
    region = region_of(zone)
    policy = ComputeRequest(
        "resourcePolicies",
        "insert",
        {"project": project, "region": region},
        {
            "name": names.policy,
            "workloadPolicy": {
                "type": "HIGH_THROUGHPUT",
                "acceleratorTopology": accelerator.topology,
            },
        },
    )
    # A template's machineType is a bare name (Compute Engine refuses a URL there).
    template = ComputeRequest(
        "instanceTemplates",
        "insert",
        {"project": project},
        {"name": names.template, "properties": {"machineType": machine, **properties}},
    )
    group = ComputeRequest(
        "instanceGroupManagers",
        "insert",
        {"project": project, "zone": zone},
        {
            "name": names.group,
            "baseInstanceName": names.group,
            "instanceTemplate": f"projects/{project}/global/instanceTemplates/{names.template}",
            "targetSize": accelerator.vms,
            "targetSizePolicy": {"mode": "BULK"},
            "resourcePolicies": {
                "workloadPolicy": f"projects/{project}/regions/{region}/resourcePolicies/"
                f"{names.policy}"
            },
            # The group never replaces a failed VM on its own: tpuctl decides (a new VM has
            # a new disk, and the slice's other hosts must restart with it).
            "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        },
    )
    return ComputePlan(
        (policy, template, group),
        accelerator.vms,
        machine,
        False,
        names,
        accelerator.topology,
        accelerator.accelerator_type,
    )


def _vm_properties(
    spec: Spec, *, project: str, zone: str, startup_script: str | None
) -> dict[str, Any]:
    """What every VM of the slice is made with: the fields an Instance and an instance
    template's properties share."""
    tpu = spec.tpu
    metadata = node_metadata(spec, startup_script)
    # Guest attributes carry the VM's SSH host key, which tpuctl pins before connecting.
    metadata[GUEST_ATTRIBUTES_KEY] = "TRUE"
    properties: dict[str, Any] = {
        "disks": _disks(spec, project=project, zone=zone),
        "networkInterfaces": [_network_interface(spec, zone)],
        "scheduling": _scheduling(spec),
        "labels": node_labels(spec),
        "metadata": {"items": [{"key": key, "value": value} for key, value in metadata.items()]},
        "serviceAccounts": [
            {
                "email": tpu.service_account or "default",
                "scopes": list(tpu.scopes or DEFAULT_SCOPES),
            }
        ],
    }
    if tpu.tags:
        properties["tags"] = {"items": list(tpu.tags)}
    if tpu.description:
        properties["description"] = tpu.description
    if tpu.secure_boot:
        properties["shieldedInstanceConfig"] = {"enableSecureBoot": True}
    affinity = _reservation_affinity(spec, project)
    if affinity is not None:
        properties["reservationAffinity"] = affinity
    return properties


def _disks(spec: Spec, *, project: str, zone: str) -> list[dict[str, Any]]:
    disk = spec.tpu.boot_disk
    image = disk.image if disk is not None and disk.image else spec.tpu.runtime
    initialize: dict[str, Any] = {"sourceImage": source_image(image)}
    boot: dict[str, Any] = {"boot": True, "autoDelete": True, "initializeParams": initialize}
    if disk is not None:
        if disk.size_gb is not None:
            initialize["diskSizeGb"] = str(disk.size_gb)  # int64: a string in JSON
        if disk.confidential_compute:
            initialize["enableConfidentialCompute"] = True
        if disk.kms_key:
            boot["diskEncryptionKey"] = {"kmsKeyName": disk.kms_key}
    disks = [boot]
    for data_disk in spec.tpu.data_disks:
        source = data_disk.source
        if not source.startswith("projects/"):
            source = f"projects/{project}/zones/{zone}/disks/{source}"
        attached: dict[str, Any] = {"boot": False, "autoDelete": False, "source": source}
        if data_disk.mode is not None:
            attached["mode"] = data_disk.mode.replace("-", "_").upper()
        disks.append(attached)
    return disks


def _network_interface(spec: Spec, zone: str) -> dict[str, Any]:
    tpu = spec.tpu
    interface: dict[str, Any] = {}
    if tpu.network or not tpu.subnetwork:
        network = tpu.network or "default"
        interface["network"] = network if "/" in network else f"global/networks/{network}"
    if tpu.subnetwork:
        subnetwork = tpu.subnetwork
        if "/" not in subnetwork:
            subnetwork = f"regions/{region_of(zone)}/subnetworks/{subnetwork}"
        interface["subnetwork"] = subnetwork
    if tpu.external_ips:
        interface["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    return interface


def _scheduling(spec: Spec) -> dict[str, Any]:
    tier = spec.capacity.tier
    scheduling: dict[str, Any] = {
        # TPU VMs cannot live-migrate: maintenance stops them (and boots them again).
        "onHostMaintenance": "TERMINATE",
        "provisioningModel": PROVISIONING_MODELS[tier],
    }
    action = TERMINATION_ACTIONS.get(tier)
    if action is not None:
        scheduling["instanceTerminationAction"] = action
    if spec.capacity.max_run_duration is not None:
        scheduling["maxRunDuration"] = _duration(spec.capacity.max_run_duration)
    if tier != "spot":
        # A stop or delete first gives the job its SIGTERM and this long to save. Spot VMs
        # are left out: a preemption gives them its own 30 s, whatever this says.
        scheduling["gracefulShutdown"] = {
            "enabled": True,
            "maxDuration": _duration(GRACEFUL_SHUTDOWN),
        }
    return scheduling


def _reservation_affinity(spec: Spec, project: str) -> dict[str, Any] | None:
    """The reservation the VMs draw from (reserved, reservation-bound), by name."""
    reservation = spec.capacity.reservation
    if reservation is None:
        return None
    return {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": RESERVATION_KEY,
        "values": [compute_reservation(reservation, project)],
    }


def compute_reservation(reservation: str, project: str) -> str:
    """A spec's reservation → Compute Engine's name for it: NAME for one of `project`,
    projects/OTHER/reservations/NAME for a shared one (a Cloud TPU style
    projects/P/locations/Z/reservations/NAME is read as that)."""
    parts = reservation.split("/")
    if len(parts) == 1:
        return reservation
    owner, name = parts[1], parts[-1]
    return name if owner == project else f"projects/{owner}/reservations/{name}"


def _request_valid_for(spec: Spec) -> dict[str, str] | None:
    """flex-start's queueing window on one instance (params.requestValidForDuration)."""
    until = spec.capacity.valid_until
    if spec.capacity.tier != "flex-start" or not isinstance(until, timedelta):
        return None
    return _duration(until)


def _duration(duration: timedelta) -> dict[str, str]:
    return {"seconds": str(int(duration.total_seconds()))}
