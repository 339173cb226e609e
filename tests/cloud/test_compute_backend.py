"""The Compute Engine backend (tpuctl.cloud.compute) against the emulator's Compute Engine
fake, through the unmodified google-cloud-compute client: a TPU VM and a bulk MIG made by
tpuctl's lifecycle, read back as queued resources and nodes, their workers in worker order,
their host keys from guest attributes, SSH through tpuctl's fan-out, deleted with every part.
The request bodies are written here as a client renders them (tests/emulator/compute_helpers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.emulator.compute_helpers import (
    Compute,
    group_body,
    instance_body,
    message,
    policy_body,
    region,
    template_body,
)
from tests.harness import ZONE, Project
from tests.support import wait_for
from tpuctl.cloud import lifecycle, nodes, queries
from tpuctl.cloud.compute_ops import ComputeCreate, request_ids
from tpuctl.cloud.compute_slices import accelerator_of
from tpuctl.cloud.watcher import WatchPolicy

# Its clients are google-cloud-compute's: tests/order.py keeps it on few processes.
pytestmark = pytest.mark.compute_library

LABELS = {"managed-by": "tpuctl", "tpuctl-job": "x", "tpuctl-spec": "abc"}


@dataclass(frozen=True)
class Sent:
    resource: str
    method: str
    scope: dict[str, str]
    body: dict[str, Any]


def compute_api(project: Project) -> Any:
    from tpuctl.cloud.client import connect
    from tpuctl.cloud.resolve import Location

    return connect(Location(project.name, ZONE), environ=project.env, api="compute")


def single_host(project: Project, name: str, *, model: str = "STANDARD") -> ComputeCreate:
    body = instance_body(name, ZONE, "ct6e-standard-4t", model=model, external=False)
    body["labels"] = dict(LABELS)
    body["metadata"]["items"].append({"key": "enable-guest-attributes", "value": "TRUE"})
    scope = {"project": project.name, "zone": ZONE}
    return ComputeCreate(
        parent=f"projects/{project.name}/locations/{ZONE}",
        queued_resource_id=name,
        request_id=lifecycle.new_request_id(),
        requests=(Sent("instances", "insert", scope, body),),
        hosts=1,
        machine_type="ct6e-standard-4t",
        single_host=True,
    )


def multi_host(project: Project, name: str) -> ComputeCreate:
    where = region(ZONE)
    template = template_body(
        f"{name}-tpl", "ct5p-hightpu-4t", metadata={"enable-guest-attributes": "TRUE"}
    )
    template["properties"]["labels"] = dict(LABELS)
    template_link = f"projects/{project.name}/global/instanceTemplates/{name}-tpl"
    policy_link = f"projects/{project.name}/regions/{where}/resourcePolicies/{name}-wp"
    group = group_body(name, template_link, policy_link, 2)
    group["baseInstanceName"] = name
    return ComputeCreate(
        parent=f"projects/{project.name}/locations/{ZONE}",
        queued_resource_id=name,
        request_id=lifecycle.new_request_id(),
        requests=(
            Sent(
                "resourcePolicies",
                "insert",
                {"project": project.name, "region": where},
                policy_body(f"{name}-wp", "2x2x2"),
            ),
            Sent("instanceTemplates", "insert", {"project": project.name}, template),
            Sent("instanceGroupManagers", "insert", {"project": project.name, "zone": ZONE}, group),
        ),
        hosts=2,
        machine_type="ct5p-hightpu-4t",
        single_host=False,
    )


def unique_zone() -> str:
    """A zone of its own, with capacity pools of its own once a test sizes them (a zone name
    a spec takes: letters, then the region's number)."""
    import random
    import string

    letters = "".join(random.choices(string.ascii_lowercase, k=8))
    return f"zz-{letters}1-a"


def until_active() -> lifecycle.WaitOptions:
    return lifecycle.WaitOptions(policy=WatchPolicy(until="ACTIVE", overall_timeout=120))


def test_accelerator_and_request_ids_are_derived_not_drawn() -> None:
    assert accelerator_of("ct6e-standard-4t", 1) == "v6e-4"
    assert accelerator_of("zones/z/machineTypes/ct5p-hightpu-4t", 2) == "v5p-16"
    assert accelerator_of("tpu7x-standard-4t", 2) == "tpu7x-16"
    first = request_ids("6d0f6f5e-8b1a-4b7e-9f52-3c2d1e0f9a8b", 3)
    assert first == request_ids("6d0f6f5e-8b1a-4b7e-9f52-3c2d1e0f9a8b", 3)
    assert len(set(first)) == 3


def test_single_host_create_wait_status_ssh_delete(project: Project) -> None:
    name = "ce-one"
    api = compute_api(project)
    request = single_host(project, name)
    created = lifecycle.create_and_wait(api, request, until_active())
    assert created.action == "created"
    assert created.wait is not None and created.wait.state == "ACTIVE"
    # Again from the same request: accepted as ours, nothing sent twice.
    again = lifecycle.create(api, single_host(project, name))
    assert again.action == "exists"

    summary = queries.status(api, name)
    assert summary.state == "ACTIVE"
    assert summary.accelerator == "v6e-4" and summary.managed_by_tpuctl
    (node,) = summary.nodes
    assert node.state == "READY" and len(node.workers) == 1
    vm = Compute(project.emulator, project.name).get(ZONE, name)
    assert node.workers[0].internal_ip == vm.network_interfaces[0].network_i_p
    keys = nodes.host_keys(api, [name])
    assert keys[(name, 0)] and keys[(name, 0)][0][0] == "ssh-ed25519"

    fleet = _fleet(project, api, name)
    assert [t.label for t in fleet.targets] == ["0/0"]

    deleted = lifecycle.delete(api, name, force=True, timeout=120)
    assert deleted.action == "deleted"
    assert api.find_queued_resource(name) is None


def test_multi_host_slice_is_one_node_with_workers_in_worker_order(project: Project) -> None:
    name = "ce-mig"
    api = compute_api(project)
    # An earlier attempt got as far as the workload policy: taken as made, not an error.
    compute = Compute(project.emulator, project.name)
    first = multi_host(project, name).requests[0]
    compute.wait(
        compute.client("ResourcePoliciesClient").insert(
            project=project.name,
            region=region(ZONE),
            resource_policy_resource=message("ResourcePolicy", first.body),
        )
    )
    created = lifecycle.create_and_wait(api, multi_host(project, name), until_active())
    assert created.action == "created"
    assert created.wait is not None and created.wait.state == "ACTIVE"
    assert lifecycle.create(api, multi_host(project, name)).action == "exists"
    summary = queries.status(api, name)
    assert summary.accelerator == "v5p-16" and summary.slices == 1
    (node,) = summary.nodes
    assert node.state == "READY" and len(node.workers) == 2

    groups = compute.client("InstanceGroupManagersClient")
    managed = groups.list_managed_instances(
        project=project.name, zone=ZONE, instance_group_manager=name
    )
    by_worker: dict[int, str] = {}
    for entry in managed:
        vm = compute.get(ZONE, entry.name)
        items = {item.key: item.value for item in vm.metadata.items}
        by_worker[int(items["agent-worker-number"])] = vm.network_interfaces[0].network_i_p
    assert [w.internal_ip for w in node.workers] == [by_worker[0], by_worker[1]]

    deleted = lifecycle.delete(api, name, force=True, timeout=120)
    assert deleted.action == "deleted"
    templates = compute.client("InstanceTemplatesClient")
    policies = compute.client("ResourcePoliciesClient")
    assert [t.name for t in templates.list(project=project.name)] == []
    assert [p.name for p in policies.list(project=project.name, region=region(ZONE))] == []


def test_spot_preemption_suspends_it(project: Project) -> None:
    name = "ce-spot"
    api = compute_api(project)
    lifecycle.create_and_wait(api, single_host(project, name, model="SPOT"), until_active())
    project.emulator.admin.compute_preempt(f"projects/{project.name}/zones/{ZONE}/instances/{name}")

    def suspended() -> bool:
        return queries.observe(api, name).state == "SUSPENDED"

    wait_for(suspended, 60, f"{name} SUSPENDED")
    seen = queries.observe(api, name)
    assert seen.initiator == "SERVICE"
    lifecycle.delete(api, name, force=True, timeout=120)


def _fleet(project: Project, api: Any, name: str) -> Any:
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.jobs.fleet import prepare_fleet

    settings = SshSettings(
        user="tester",
        ssh_port=project.emulator.ssh_port,
        key_path=project.home / ".ssh" / "google_compute_engine",
    )
    return prepare_fleet(api, name, settings)


def compute_spec(project: Project, name: str, accelerator: str, tier: str, **extra: Any) -> Any:
    """A `tpu.api: compute` spec in this project (`extra`: more sections, or their overrides)."""
    return project.write_spec(
        {
            "name": name,
            "tpu": {
                "api": "compute",
                "accelerator": accelerator,
                "runtime": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
            },
            "capacity": {"tier": tier},
            **extra,
        }
    )


def test_cli_create_wait_status_ssh_delete_of_a_compute_spec(project: Project) -> None:
    spec = str(compute_spec(project, "ce-cli", "v6e-4", "spot"))
    created = project.cli("create", spec, "--wait", "--no-preflight", "--format", "json")
    assert created.exit_code == 0, created.stderr
    assert created.json()["wait"]["state"] == "ACTIVE"
    vm = Compute(project.emulator, project.name).get(ZONE, "ce-cli")
    assert vm.status == "RUNNING" and vm.scheduling.provisioning_model == "SPOT"

    status = project.cli("status", spec, "--format", "json")
    assert status.exit_code == 0, status.stderr
    (node,) = status.json()["nodes"]
    assert node["state"] == "READY"
    assert node["workers"][0]["internal_ip"] == vm.network_interfaces[0].network_i_p

    ran = project.cli("ssh", spec, "--format", "json", "--", "echo hello from $(hostname)")
    assert ran.exit_code == 0, ran.stderr
    (worker,) = ran.json()["workers"]
    assert worker["exit_code"] == 0 and "hello from" in worker["stdout_tail"]

    deleted = project.cli("delete", spec, "--yes", "--format", "json")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.json()["action"] == "deleted"
    assert project.cli("status", spec).exit_code == 5


def test_list_gc_and_runs_see_a_compute_slice_beside_a_queued_resource(project: Project) -> None:
    tpu_spec = project.spec("tpu-side")
    assert project.cli("create", str(tpu_spec), "--wait", "--no-preflight").exit_code == 0
    compute = compute_spec(project, "ce-side", "v6e-4", "on-demand", job={"command": "sleep 600"})
    made = project.cli("create", str(compute), "--wait", "--no-preflight")
    assert made.exit_code == 0, made.stderr

    listed = project.cli("list", "--all-zones", "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    rows = {row["name"]: row for row in listed.json()["queued_resources"]}
    assert rows["tpu-side"]["api"] == "tpu" and rows["ce-side"]["api"] == "compute"
    assert rows["ce-side"]["state"] == "ACTIVE" and rows["ce-side"]["accelerator"] == "v6e-4"
    table = project.cli("list")
    assert "compute" in table.stdout and "ce-side" in table.stdout, table.stdout
    # A name alone finds it on whichever API holds it.
    status = project.cli("status", "ce-side", "--format", "json")
    assert status.exit_code == 0 and status.json()["api"] == "compute", status.stderr

    collected = project.cli("gc", "--dry-run", "--format", "json")
    assert collected.exit_code == 0, collected.stderr
    verdicts = {row["name"]: row for row in collected.json()["queued_resources"]}
    assert verdicts["tpu-side"]["verdict"] == "delete"  # ACTIVE, no job
    assert verdicts["ce-side"]["verdict"] == "keep", verdicts  # its job is running
    assert Compute(project.emulator, project.name).status(ZONE, "ce-side") == "RUNNING"

    runs = project.cli("runs", "--project", project.name, "--format", "json")
    assert runs.exit_code == 0, runs.stderr
    assert "ce-side" in runs.stdout, runs.stdout
    gone = project.cli("delete", "ce-side", "--yes")
    assert gone.exit_code == 0, gone.stderr
    assert project.api().find_queued_resource("tpu-side") is not None


def test_no_capacity_refuses_the_create_and_leaves_nothing(project: Project) -> None:
    zone = unique_zone()
    project.emulator.admin.compute_capacity({"v6e": 0}, zone=zone)
    spec = str(compute_spec(project, "ce-none", "v6e-4", "on-demand", zone=zone))
    refused = project.cli("create", spec, "--wait", "--no-preflight")
    assert refused.exit_code != 0
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in refused.stderr
    assert "nothing was created" in refused.stderr, refused.stderr
    assert project.cli("status", spec).exit_code == 5


def test_a_flex_start_vm_queued_past_its_deadline_is_deleted(project: Project) -> None:
    zone = unique_zone()
    project.emulator.admin.compute_capacity({"v6e": 0}, zone=zone)
    spec = str(
        compute_spec(
            project,
            "ce-queued",
            "v6e-4",
            "flex-start",
            zone=zone,
            capacity={"tier": "flex-start", "max_run_duration": "1h", "valid_until": "1h"},
        )
    )
    given_up = project.cli(
        "create", spec, "--wait", "--no-preflight", "--queue-timeout", "2s", "--format", "json"
    )
    assert given_up.exit_code == 4, given_up.stderr
    error = given_up.json()["error"]
    assert error["state"] == "WAITING_FOR_RESOURCES" and error["deleted"] is True
    compute = Compute(project.emulator, project.name)
    assert [i.name for i in compute.instances.list(project=project.name, zone=zone)] == []


def test_a_flex_start_vm_whose_window_passes_is_failed_until_deleted(project: Project) -> None:
    zone = unique_zone()
    project.emulator.admin.compute_capacity({"v6e": 0}, zone=zone)
    capacity = {"tier": "flex-start", "max_run_duration": "1h", "valid_until": "90s"}
    spec = str(
        compute_spec(project, "ce-late", "v6e-4", "flex-start", zone=zone, capacity=capacity)
    )
    failed = project.cli("create", spec, "--wait", "--no-preflight")
    assert failed.exit_code == 6, failed.stderr
    assert "FAILED" in failed.stderr and "ZONE_RESOURCE_POOL_EXHAUSTED" in failed.stderr
    status = project.cli("status", spec, "--format", "json")
    assert status.json()["state"] == "FAILED"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in status.json()["failure"]["message"]
    deleted = project.cli("delete", spec, "--yes")
    assert deleted.exit_code == 0, deleted.stderr
    assert project.cli("status", spec).exit_code == 5


def test_host_maintenance_of_a_vm_that_restarts_keeps_it_active(project: Project) -> None:
    name = "ce-maint"
    api = compute_api(project)
    request = single_host(project, name)
    request.requests[0].body["scheduling"]["automaticRestart"] = True
    lifecycle.create_and_wait(api, request, until_active())
    target = f"projects/{project.name}/zones/{ZONE}/instances/{name}"
    project.emulator.admin.compute_maintenance(target, at=60)  # announced: 3 s from now
    wait_for(lambda: nodes.node_disruption(api, [name]) is not None, 20, "the announcement")
    assert nodes.node_disruption(api, [name]) == f"node {name} has maintenance announced"
    seen: set[str] = set()
    disruptions: set[str] = set()

    def ended() -> bool:
        return any(
            event["kind"] == "compute.maintenance.end" and event.get("node", "").endswith(target)
            for event in project.emulator.admin.events()
        )

    def back() -> bool:
        seen.add(queries.observe(api, name).state)
        disruption = nodes.node_disruption(api, [name])
        if disruption:
            disruptions.add(disruption)
        return disruption is None and ended()

    wait_for(back, 60, "the VM back from its maintenance")
    # Down and up again on its disk, the slice ACTIVE throughout (as a Cloud TPU node's
    # maintenance), its node not READY while it was down (which states a poll catches
    # depends on the machine's load; tests/cloud/test_compute_slices.py maps each one).
    assert seen == {"ACTIVE"}, seen
    # The VM really went down and came back on its disk meanwhile (the fake's own record).
    events = project.emulator.admin.events()
    start = next(
        i for i, e in enumerate(events)
        if e["kind"] == "compute.maintenance.start" and e.get("node", "").endswith(target)
    )  # fmt: skip
    statuses = [
        e["detail"] for e in events[start:]
        if e["kind"] == "compute.instance.status" and e.get("node", "").endswith(target)
    ]  # fmt: skip
    assert statuses[-1] == "RUNNING" and set(statuses) - {"RUNNING"}, statuses
    assert disruptions <= {
        f"node {name} has maintenance announced",
        f"node {name} is RESTARTING",
        f"node {name} is STOPPING",
        f"node {name} is STOPPED",
    }, disruptions
    lifecycle.delete(api, name, force=True, timeout=120)


def test_a_vm_maintenance_stopped_for_good_was_stopped_by_the_service(project: Project) -> None:
    name = "ce-gone"
    api = compute_api(project)
    # A spot VM: Compute Engine does not restart it (a standard one comes back on its disk).
    lifecycle.create_and_wait(api, single_host(project, name, model="SPOT"), until_active())
    project.emulator.admin.compute_maintenance(
        f"projects/{project.name}/zones/{ZONE}/instances/{name}"
    )
    # It stays TERMINATED, and only the zone's terminateOnHostMaintenance operation says who
    # stopped it (not a preemption: no statusMessage of one).
    wait_for(lambda: queries.observe(api, name).state == "SUSPENDED", 60, f"{name} SUSPENDED")
    assert queries.observe(api, name).initiator == "SERVICE"
    lifecycle.delete(api, name, force=True, timeout=120)
