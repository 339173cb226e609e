"""How Compute Engine's instances and MIGs read as queued resources and nodes
(tpuctl.cloud.compute_slices, pure): every state of the table in docs/compute-engine-runs.md,
workers in worker order, the run's end."""

from __future__ import annotations

from typing import Any

import pytest

from tpuctl.cloud import describe
from tpuctl.cloud.compute_slices import (
    ComputeSlice,
    group_state,
    instance_state,
    run_ended_by,
    slice_node,
    slice_queued_resource,
)

NAME = "projects/p/locations/us-east5-a/queuedResources/run"


def vm(status: str, *, worker: int = 0, started: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": f"run-{worker}",
        "status": status,
        "machineType": "zones/us-east5-a/machineTypes/ct5p-hightpu-4t",
        "metadata": {"items": [{"key": "agent-worker-number", "value": str(worker)}]},
        "networkInterfaces": [{"networkIP": f"10.0.0.{worker + 2}"}],
        "scheduling": {"provisioningModel": "SPOT"},
        "labels": {"managed-by": "tpuctl"},
        **extra,
    }
    if started:
        body["lastStartTimestamp"] = "2030-01-01T00:00:00Z"
    return body


def group(topology_state: str, *, in_progress: bool = False, size: int = 2) -> dict[str, Any]:
    return {
        "name": "run",
        "targetSize": size,
        "creationTimestamp": "2030-01-01T00:00:00Z",
        "status": {
            "bulkInstanceOperation": {"inProgress": in_progress},
            "appliedAcceleratorTopologies": [
                {"acceleratorTopology": "2x2x2", "state": topology_state}
            ],
        },
    }


TEMPLATE = {
    "properties": {
        "machineType": "ct5p-hightpu-4t",
        "scheduling": {
            "provisioningModel": "FLEX_START",
            "maxRunDuration": {"seconds": "3600"},
            "instanceTerminationAction": "DELETE",
        },
    }
}


@pytest.mark.parametrize(
    ("instance", "state", "initiator"),
    [
        (vm("PENDING", started=False), "WAITING_FOR_RESOURCES", None),
        (vm("PROVISIONING", started=False), "WAITING_FOR_RESOURCES", None),
        (vm("STAGING", started=False), "PROVISIONING", None),
        (vm("RUNNING"), "ACTIVE", None),
        (vm("STOPPING", statusMessage="Instance was preempted."), "SUSPENDING", "SERVICE"),
        (vm("TERMINATED", statusMessage="Instance was preempted."), "SUSPENDED", "SERVICE"),
        (vm("TERMINATED", scheduling={"automaticRestart": True}), "ACTIVE", None),
        (vm("TERMINATED"), "SUSPENDED", "USER"),
        (
            vm("TERMINATED", scheduling={"maxRunDuration": {"seconds": "600"}}),
            "SUSPENDED",
            "SERVICE",
        ),
    ],
)
def test_an_instance_s_state(instance: dict[str, Any], state: str, initiator: str | None) -> None:
    assert instance_state(instance) == (state, initiator)


def test_a_group_s_states() -> None:
    both = [vm("RUNNING"), vm("RUNNING", worker=1)]
    waiting = ComputeSlice("run", [], group("ACTIVATING", in_progress=True), TEMPLATE)
    assert group_state(waiting) == ("WAITING_FOR_RESOURCES", None)
    assert group_state(ComputeSlice("run", both, group("ACTIVATING"), TEMPLATE))[0] == (
        "PROVISIONING"
    )
    assert group_state(ComputeSlice("run", both, group("ACTIVE"), TEMPLATE)) == ("ACTIVE", None)
    assert group_state(ComputeSlice("run", both, group("DEACTIVATING"), TEMPLATE))[0] == "DELETING"
    # A host between its maintenance and its reboot: INCOMPLETE for a moment, still ours.
    back = [vm("RUNNING"), vm("STAGING", worker=1, scheduling={"automaticRestart": True})]
    assert group_state(ComputeSlice("run", back, group("INCOMPLETE"), TEMPLATE)) == ("ACTIVE", None)
    preempted = [vm("RUNNING"), vm("TERMINATED", worker=1, statusMessage="preempted")]
    assert group_state(ComputeSlice("run", preempted, group("INCOMPLETE"), TEMPLATE)) == (
        "SUSPENDED",
        "SERVICE",
    )


def test_a_group_whose_vms_ran_out_of_time_has_ended_its_run() -> None:
    # Both VMs deleted at their maxRunDuration: the group lowered its target size to 0.
    ended = ComputeSlice("run", [], group("INCOMPLETE", size=0), TEMPLATE)
    assert ended.hosts == 2  # from the topology, not the lowered target size
    assert run_ended_by(ended) == "2030-01-01T01:00:00Z"
    queued = slice_queued_resource(NAME, ended)
    assert describe.termination_time(queued) is not None
    assert describe.state_name(queued) == "SUSPENDED"
    assert describe.tier_of(queued) == "flex-start"
    assert describe.source_of(queued) == "compute"


def test_workers_are_in_worker_order_and_the_node_says_maintenance() -> None:
    upcoming = {"resourceStatus": {"upcomingMaintenance": {"maintenanceStatus": "PENDING"}}}
    hosts = [vm("RUNNING", worker=0), vm("RUNNING", worker=1, **upcoming)]
    node = slice_node(NAME.replace("queuedResources", "nodes"), NAME, ComputeSlice("run", hosts))
    assert [e.ip_address for e in node.network_endpoints] == ["10.0.0.2", "10.0.0.3"]
    assert describe.enum_name(node.state) == "READY"
    assert node.upcoming_maintenance.maintenance_status.name == "PENDING"
    ongoing = {"resourceStatus": {"upcomingMaintenance": {"maintenanceStatus": "ONGOING"}}}
    down = [vm("RUNNING"), vm("TERMINATED", worker=1, **ongoing)]
    node = slice_node("n", NAME, ComputeSlice("run", down))
    assert describe.enum_name(node.health) == "UNHEALTHY_MAINTENANCE"
    assert describe.enum_name(node.state) == "RESTARTING"


def test_a_single_host_spot_vm_reads_with_its_tier_and_labels() -> None:
    queued = slice_queued_resource(NAME, ComputeSlice("run", [vm("RUNNING")]))
    summary = describe.queued_resource_summary(queued, project="p", zone="us-east5-a")
    assert (summary.state, summary.tier, summary.accelerator) == ("ACTIVE", "spot", "v5p-8")
    assert summary.managed_by_tpuctl and summary.api == "compute"


def test_only_tpu_machine_types_are_slices() -> None:
    from tpuctl.cloud.compute_slices import is_tpu_machine

    assert is_tpu_machine("zones/z/machineTypes/ct6e-standard-8t")
    assert is_tpu_machine("tpu7x-standard-4t")
    assert not is_tpu_machine("zones/z/machineTypes/n2-standard-8")
