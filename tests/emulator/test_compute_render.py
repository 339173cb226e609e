"""What `tpuctl render` makes of a `tpu.api: compute` spec, sent as it is to the emulator's
Compute Engine fake with the unmodified google-cloud-compute client: the one-host VM runs with
the startup script, and the multi-host slice's topology becomes ACTIVE."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.emulator.compute_helpers import Compute, message, unique_zone
from tests.emulator.helpers import new_project, wait_until
from tpuctl.render.compute import ComputePlan, ComputeRequest, render_compute
from tpuctl.spec.load import load_spec_text

# Its clients are google-cloud-compute's: tests/order.py keeps it on few processes.
pytestmark = pytest.mark.compute_library

SCRIPT = "#!/bin/bash\necho started > /tmp/started\n"
# resource → (client, the insert's body keyword, the message type)
CLIENTS = {
    "instances": ("InstancesClient", "instance_resource", "Instance"),
    "resourcePolicies": ("ResourcePoliciesClient", "resource_policy_resource", "ResourcePolicy"),
    "instanceTemplates": (
        "InstanceTemplatesClient",
        "instance_template_resource",
        "InstanceTemplate",
    ),
    "instanceGroupManagers": (
        "InstanceGroupManagersClient",
        "instance_group_manager_resource",
        "InstanceGroupManager",
    ),
}


def rendered(tpu: str, capacity: str, project: str, zone: str) -> ComputePlan:
    spec = load_spec_text(
        f"apiVersion: tpuctl/v1\nname: r{uuid.uuid4().hex[:8]}\ntpu:\n  api: compute\n{tpu}"
        "  runtime: ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e\n"
        f"capacity:\n{capacity}job:\n  command: python3 train.py\n"
    ).spec
    return render_compute(
        spec, project=project, zone=zone, run_name=spec.name, startup_script=SCRIPT
    )


def send(compute: Compute, request: ComputeRequest) -> None:
    """One rendered request through its client, waited for."""
    service, keyword, kind = CLIENTS[request.resource]
    client = compute.client(service)
    operation = client.insert(**request.scope, **{keyword: message(kind, request.body)})
    compute.wait(operation)


def test_a_rendered_single_host_vm_runs(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    plan = rendered("  accelerator: v6e-8\n", "  tier: spot\n", compute.project, zone)
    for request in plan.requests:
        send(compute, request)
    vm = compute.wait_status(zone, plan.names.instance, "RUNNING")
    assert vm.machine_type.endswith("/ct6e-standard-8t")
    assert vm.scheduling.provisioning_model == "SPOT"
    items = {item.key: item.value for item in vm.metadata.items}
    assert items["startup-script"] == SCRIPT
    assert items["accelerator-type"] == "v6e-8"  # the platform's key, from the machine type
    assert compute.host_key(zone, plan.names.instance)  # guest attributes are on
    compute.wait(compute.instances.delete(project=compute.project, zone=zone, instance=vm.name))


def test_a_rendered_multi_host_slice_becomes_active(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    plan = rendered(
        "  type: tpu7x\n  topology: 2x2x2\n", "  tier: on-demand\n", compute.project, zone
    )
    for request in plan.requests:
        send(compute, request)
    groups = compute.client("InstanceGroupManagersClient")

    def group() -> Any:
        return groups.get(
            project=compute.project, zone=zone, instance_group_manager=plan.names.group
        )

    def active() -> Any:
        applied = group().status.applied_accelerator_topologies
        return applied if [each.state for each in applied] == ["ACTIVE"] else None

    [topology] = wait_until(active, "the TPU7x slice to be ACTIVE", 60)
    assert topology.accelerator_topology == "2x2x2"
    assert group().target_size == plan.hosts == 2
    managed = list(
        groups.list_managed_instances(
            project=compute.project, zone=zone, instance_group_manager=plan.names.group
        )
    )
    assert [entry.instance_status for entry in managed] == ["RUNNING", "RUNNING"]
    vm = compute.get(zone, managed[0].name)
    assert vm.machine_type.endswith("/tpu7x-standard-4t")
    items = {item.key: item.value for item in vm.metadata.items}
    assert items["startup-script"] == SCRIPT
    assert items["accelerator-type"] == "tpu7x-16"
    compute.wait(
        groups.delete(project=compute.project, zone=zone, instance_group_manager=plan.names.group)
    )
