"""Multi-host TPU slices on the Compute Engine fake, through the unmodified google-cloud-compute
client: a workload policy with the accelerator topology, an instance template, a MIG in bulk
mode; the slice is ACTIVE once every host runs, each host knows its worker number and the
slice's workers; flex-start waits for capacity and ends at its run duration; deleting a MIG that
waits cancels it."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions

from tests.emulator.compute_helpers import (
    Compute,
    group_body,
    login,
    message,
    policy_body,
    region,
    ssh,
    template_body,
    unique_zone,
)
from tests.emulator.helpers import ZONE, new_project, wait_until

METADATA = (
    "curl -s -H Metadata-Flavor:Google "
    "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/"
)

# Its clients are google-cloud-compute's: tests/order.py keeps it on few processes.
pytestmark = pytest.mark.compute_library


class Slice:
    """A workload policy, a template and a bulk MIG in one zone of one project."""

    def __init__(self, compute: Compute, zone: str, name: str) -> None:
        self.compute = compute
        self.zone = zone
        self.region = region(zone)
        self.name = name
        self.groups = compute.client("InstanceGroupManagersClient")

    def create(
        self, machine: str, topology: str, hosts: int, **template: Any
    ) -> tuple[str, str, Any]:
        compute, project = self.compute, self.compute.project
        policies = compute.client("ResourcePoliciesClient")
        compute.wait(
            policies.insert(
                project=project,
                region=self.region,
                resource_policy_resource=message(
                    "ResourcePolicy", policy_body(f"{self.name}-wp", topology)
                ),
            )
        )
        templates = compute.client("RegionInstanceTemplatesClient")
        compute.wait(
            templates.insert(
                project=project,
                region=self.region,
                instance_template_resource=message(
                    "InstanceTemplate", template_body(f"{self.name}-tmpl", machine, **template)
                ),
            )
        )
        template_link = (
            f"projects/{project}/regions/{self.region}/instanceTemplates/{self.name}-tmpl"
        )
        policy_link = f"projects/{project}/regions/{self.region}/resourcePolicies/{self.name}-wp"
        insert = self.groups.insert(
            project=project,
            zone=self.zone,
            instance_group_manager_resource=message(
                "InstanceGroupManager", group_body(self.name, template_link, policy_link, hosts)
            ),
        )
        return template_link, policy_link, insert

    def get(self) -> Any:
        return self.groups.get(
            project=self.compute.project, zone=self.zone, instance_group_manager=self.name
        )

    def topology_state(self) -> str:
        [applied] = self.get().status.applied_accelerator_topologies
        return str(applied.state)

    def managed(self) -> list[Any]:
        return list(
            self.groups.list_managed_instances(
                project=self.compute.project, zone=self.zone, instance_group_manager=self.name
            )
        )

    def delete(self) -> Any:
        return self.groups.delete(
            project=self.compute.project, zone=self.zone, instance_group_manager=self.name
        )


def test_v5p_slice_is_active_with_every_worker_numbered_as_its_endpoints(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    who = login()
    mig = Slice(compute, ZONE, "v5p-16")
    _template, _policy, insert = mig.create("ct5p-hightpu-4t", "2x2x2", 2, metadata=who.metadata)
    compute.wait(insert)
    wait_until(lambda: mig.topology_state() == "ACTIVE", "the slice to be ACTIVE", 60)
    group = mig.get()
    assert group.target_size_policy.mode == "BULK"
    assert group.status.applied_accelerator_topologies[0].accelerator_topology == "2x2x2"
    managed = mig.managed()
    assert [m.instance_status for m in managed] == ["RUNNING", "RUNNING"]

    seen: dict[int, tuple[str, list[str], str]] = {}
    for entry in managed:
        vm = compute.get(ZONE, entry.name)
        answer = ssh(
            vm.network_interfaces[0].network_i_p,
            emulator.ssh_port,
            compute.host_key(ZONE, entry.name),
            who,
            f"{METADATA}agent-worker-number; echo; {METADATA}worker-network-endpoints; echo; "
            f"{METADATA}accelerator-type; echo; cat $TPUCTL_VM_ROOT/etc/hosts",
        )
        worker, endpoints, accelerator, *hosts = answer.splitlines()
        seen[int(worker)] = (entry.name, endpoints.split(","), accelerator)
        # The peers' names resolve (the VPC's DNS, in the emulator a hosts file on the disk).
        names = {line.split()[1]: line.split()[0] for line in hosts}
        assert names[entry.name] == vm.network_interfaces[0].network_i_p
    assert sorted(seen) == [0, 1]
    endpoints = seen[0][1]
    assert all(info[1] == endpoints for info in seen.values())
    assert [seen[index][0] for index in (0, 1)] == endpoints  # worker n is endpoint n
    assert {info[2] for info in seen.values()} == {"v5p-16"}

    compute.wait(mig.delete())
    for entry in managed:
        compute.gone(ZONE, entry.name)
    with pytest.raises(exceptions.NotFound):
        mig.get()


def test_flex_start_slice_waits_for_capacity_then_runs_its_duration(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"v6e": 4}, zone=zone)
    mig = Slice(compute, zone, "flex-v6e-8")
    _template, _policy, insert = mig.create(
        "ct6e-standard-4t",
        "2x4",
        2,
        model="FLEX_START",
        instanceTerminationAction="DELETE",
        maxRunDuration={"seconds": "300"},
    )
    compute.wait(insert)

    def waiting() -> Any:
        group = mig.get()
        return group if group.status.bulk_instance_operation.in_progress else None

    wait_until(waiting, "the bulk creation to wait")
    wait_until(
        lambda: mig.get().status.bulk_instance_operation.last_progress_check.error,
        "the bulk creation to say why it waits",
    )
    check = mig.get().status.bulk_instance_operation.last_progress_check
    assert check.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    assert mig.topology_state() == "ACTIVATING"
    names = [m.name for m in mig.managed()]
    assert [compute.status(zone, name) for name in names] == ["PENDING", "PENDING"]

    emulator.admin.compute_capacity({"v6e": 8}, zone=zone)
    wait_until(lambda: mig.topology_state() == "ACTIVE", "the slice to be ACTIVE", 60)
    stamps = {
        compute.get(zone, name).resource_status.scheduling.termination_timestamp for name in names
    }
    assert all(stamps)
    # At the end of maxRunDuration Compute Engine deletes the hosts (DELETE).
    for name in names:
        compute.gone(zone, name, timeout=90)
    assert emulator.admin.compute_capacity(zone=zone)["v6e"]["used"] == 0
    assert mig.get().target_size == 0
    compute.wait(mig.delete())


def test_deleting_a_waiting_mig_cancels_its_request(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"v5p": 0}, zone=zone)
    mig = Slice(compute, zone, "waiting")
    _template, _policy, insert = mig.create(
        "ct5p-hightpu-4t", "2x2x4", 4, model="FLEX_START", maxRunDuration={"seconds": "3600"}
    )
    compute.wait(insert)
    wait_until(lambda: len(mig.managed()) == 4, "the managed instances")
    names = [m.name for m in mig.managed()]
    assert {m.current_action for m in mig.managed()} == {"CREATING"}
    compute.wait(mig.delete())
    with pytest.raises(exceptions.NotFound):
        mig.get()
    for name in names:
        compute.gone(zone, name)
    emulator.admin.compute_capacity({"v5p": 64}, zone=zone)  # nothing is left to take it
    assert emulator.admin.compute_capacity(zone=zone)["v5p"]["used"] == 0
    status = emulator.admin.compute_status()
    assert not [i for i in status["instances"] if i["instance"].endswith(tuple(names))]


def test_tpu7x_slice_on_a_regional_mig(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    name = "ironwood"
    project = compute.project
    where = region(zone)
    policies = compute.client("ResourcePoliciesClient")
    compute.wait(
        policies.insert(
            project=project,
            region=where,
            resource_policy_resource=message("ResourcePolicy", policy_body("wp", "2x2x2")),
        )
    )
    templates = compute.client("InstanceTemplatesClient")  # a global template this time
    compute.wait(
        templates.insert(
            project=project,
            instance_template_resource=message(
                "InstanceTemplate", template_body("tmpl", "tpu7x-standard-4t", model="SPOT")
            ),
        )
    )
    body = group_body(
        name,
        f"projects/{project}/global/instanceTemplates/tmpl",
        f"projects/{project}/regions/{where}/resourcePolicies/wp",
        2,
    )
    body["distributionPolicy"] = {
        "zones": [{"zone": f"zones/{zone}"}],
        "targetShape": "ANY_SINGLE_ZONE",
    }
    groups = compute.client("RegionInstanceGroupManagersClient")
    compute.wait(
        groups.insert(
            project=project,
            region=where,
            instance_group_manager_resource=message("InstanceGroupManager", body),
        )
    )

    def active() -> Any:
        group = groups.get(project=project, region=where, instance_group_manager=name)
        states = [t.state for t in group.status.applied_accelerator_topologies]
        return group if states == ["ACTIVE"] else None

    wait_until(active, "the TPU7x slice to be ACTIVE", 60)
    managed = list(
        groups.list_managed_instances(project=project, region=where, instance_group_manager=name)
    )
    vm = compute.get(zone, managed[0].name)
    items = {item.key: item.value for item in vm.metadata.items}
    assert items["accelerator-type"] == "tpu7x-16"
    assert "HOST_BOUNDS: '1,1,2'" in items["tpu-env"]
    assert items["created-by"].endswith(f"/regions/{where}/instanceGroupManagers/{name}")

    # A spot host preempted: the slice is no longer whole.
    emulator.admin.compute_preempt(f"projects/{project}/zones/{zone}/instances/{managed[0].name}")
    compute.wait_status(zone, managed[0].name, "TERMINATED")
    group = groups.get(project=project, region=where, instance_group_manager=name)
    assert group.status.applied_accelerator_topologies[0].state == "INCOMPLETE"

    with pytest.raises(exceptions.BadRequest, match="already being used"):
        templates.delete(project=project, instance_template="tmpl")
    compute.wait(groups.delete(project=project, region=where, instance_group_manager=name))
    compute.wait(templates.delete(project=project, instance_template="tmpl"))
    compute.wait(policies.delete(project=project, region=where, resource_policy="wp"))


def test_a_mig_without_a_topology_makes_independent_single_host_vms(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    templates = compute.client("InstanceTemplatesClient")
    compute.wait(
        templates.insert(
            project=compute.project,
            instance_template_resource=message(
                "InstanceTemplate", template_body("single", "ct6e-standard-1t")
            ),
        )
    )
    body = {
        "name": "serving",
        "instanceTemplate": f"projects/{compute.project}/global/instanceTemplates/single",
        "targetSize": 2,
    }
    groups = compute.client("InstanceGroupManagersClient")
    compute.wait(
        groups.insert(
            project=compute.project,
            zone=zone,
            instance_group_manager_resource=message("InstanceGroupManager", body),
        )
    )

    def running() -> list[Any] | None:
        managed = list(
            groups.list_managed_instances(
                project=compute.project, zone=zone, instance_group_manager="serving"
            )
        )
        statuses = [entry.instance_status for entry in managed]
        return managed if statuses == ["RUNNING", "RUNNING"] else None

    for entry in wait_until(running, "both VMs to run", 60):
        items = {i.key: i.value for i in compute.get(zone, entry.name).metadata.items}
        assert (items["agent-worker-number"], items["worker-network-endpoints"]) == (
            "0",
            entry.name,
        )
    assert (
        "applied_accelerator_topologies"
        not in groups.get(
            project=compute.project, zone=zone, instance_group_manager="serving"
        ).status
    )
    compute.wait(
        groups.delete(project=compute.project, zone=zone, instance_group_manager="serving")
    )
