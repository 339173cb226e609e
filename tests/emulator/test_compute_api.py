"""The Compute Engine fake's REST surface: bodies checked against the discovery document
(unknown fields, enum values, types), Google's JSON errors with their HTTP codes, idempotent
inserts by requestId, and every resource it answers with fitting the document's schemas."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from google.api_core import exceptions

from tests.emulator.compute_helpers import (
    Compute,
    group_body,
    instance_body,
    message,
    policy_body,
    region,
    template_body,
    unique_zone,
)
from tests.emulator.helpers import ZONE, new_project, wait_until
from tpuctl.emulator.compute import discovery


def call(
    emulator: Any, verb: str, path: str, body: Any = None, query: str = ""
) -> tuple[int, dict[str, Any]]:
    url = f"{emulator.compute_endpoint}/compute/v1/{path}" + (f"?{query}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=verb)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# ------------------------------------------------------------------------ the checker, pure
def test_the_checker_finds_unknown_fields_bad_enums_and_wrong_types() -> None:
    body = instance_body("a", ZONE)
    assert discovery.problems("Instance", body) == []
    body["scheduling"]["provisioningModle"] = "SPOT"
    body["scheduling"]["instanceTerminationAction"] = "ERASE"
    body["scheduling"]["maxRunDuration"] = {"seconds": "ten"}
    body["labels"] = {"team": 7}
    body["canIpForward"] = "yes"
    found = {str(problem) for problem in discovery.problems("Instance", body)}
    assert found == {
        "scheduling.provisioningModle: unknown field (did you mean 'provisioningModel'?)",
        "scheduling.instanceTerminationAction: 'ERASE' is not one of DELETE, "
        "INSTANCE_TERMINATION_ACTION_UNSPECIFIED, STOP",
        "scheduling.maxRunDuration.seconds: expected a int64 (a string of digits), not 'ten'",
        "labels.team: expected a string, not a number",
        "canIpForward: expected true or false, not a string",
    }


def test_output_only_fields_are_problems_only_when_asked() -> None:
    body = {**instance_body("a", ZONE), "status": "RUNNING", "id": "123"}
    assert discovery.problems("Instance", body) == []
    assert {p.path for p in discovery.problems("Instance", body, output_only=False)} == {
        "status",
        "id",
    }


def test_the_fields_a_tpu_slice_needs_are_in_v1() -> None:
    assert "FLEX_START" in discovery.enum_values("Scheduling", "provisioningModel")
    assert "BULK" in discovery.enum_values("InstanceGroupManagerTargetSizePolicy", "mode")
    assert "ACTIVE" in discovery.enum_values(
        "InstanceGroupManagerStatusAcceleratorTopology", "state"
    )
    assert "PENDING" in discovery.enum_values("Instance", "status")
    assert discovery.method("instances", "insert").request == "Instance"


# ------------------------------------------------------------------------- over the wire
def test_unknown_fields_bad_enums_and_unknown_parameters_are_400(emulator: Any) -> None:
    project = new_project()
    path = f"projects/{project}/zones/{ZONE}/instances"
    body = instance_body("typo", ZONE)
    body["scheduling"]["spto"] = True
    status, error = call(emulator, "POST", path, body)
    assert status == 400
    assert error["error"]["status"] == "INVALID_ARGUMENT"
    assert error["error"]["message"].startswith(
        "Invalid JSON payload received. Unknown name \"spto\" at 'resource.scheduling'"
    )
    assert error["error"]["errors"][0]["reason"] == "invalid"

    body = instance_body("enum", ZONE, model="CHEAP")
    status, error = call(emulator, "POST", path, body)
    assert (status, error["error"]["code"]) == (400, 400)
    assert "resource.scheduling.provisioningModel" in error["error"]["message"]

    status, error = call(emulator, "POST", path, instance_body("q", ZONE), "requestID=x")
    assert status == 400 and 'Unknown name "requestID"' in error["error"]["message"]
    status, error = call(emulator, "POST", path, instance_body("q", ZONE), "requestId=not-a-uuid")
    assert status == 400 and "must be a valid UUID" in error["error"]["message"]

    body = instance_body("live", ZONE)
    del body["scheduling"]["onHostMaintenance"]
    status, error = call(emulator, "POST", path, body)
    assert status == 400 and "onHostMaintenance" in error["error"]["message"]
    status, error = call(emulator, "GET", f"{path}/nobody")
    assert (status, error["error"]["errors"][0]["reason"]) == (404, "notFound")
    assert error["error"]["message"] == (
        f"The resource 'projects/{project}/zones/{ZONE}/instances/nobody' was not found"
    )


def test_every_mutating_call_retried_with_its_request_id_answers_its_first_operation(
    emulator: Any,
) -> None:
    """What a client's retry after a lost answer sends: the same call and requestId, once
    while the first one's operation runs and once after. Each answers the first operation, and
    none changes anything again (a second delete is no 404, a second insert no 409)."""
    project = new_project()
    zones = f"projects/{project}/zones/{ZONE}"

    def twice(verb: str, path: str, body: Any = None, query: str = "") -> dict[str, Any]:
        ask = "&".join(part for part in (query, f"requestId={uuid.uuid4()}") if part)
        first = call(emulator, verb, path, body, ask)
        again = call(emulator, verb, path, body, ask)
        assert (first[0], again[0]) == (200, 200), (path, first, again)
        assert again[1]["name"] == first[1]["name"], path
        return first[1]

    def status() -> str:
        return str(call(emulator, "GET", f"{zones}/instances/vm")[1].get("status", "gone"))

    def reaches(wanted: str) -> None:
        wait_until(lambda: status() == wanted, f"the VM {wanted}", timeout=60)

    twice("POST", f"{zones}/instances", instance_body("vm", ZONE))
    reaches("RUNNING")
    assert [vm["name"] for vm in call(emulator, "GET", f"{zones}/instances")[1]["items"]] == ["vm"]
    twice("POST", f"{zones}/instances/vm/simulateMaintenanceEvent")
    reaches("RUNNING")
    twice("POST", f"{zones}/instances/vm/stop")
    reaches("TERMINATED")
    twice("POST", f"{zones}/instances/vm/start")
    reaches("RUNNING")
    # Without the replay, the second would be refused: the first changed the fingerprint.
    fingerprint = call(emulator, "GET", f"{zones}/instances/vm")[1]["metadata"]["fingerprint"]
    items = [{"key": "team", "value": "tpu"}]
    metadata = {"fingerprint": fingerprint, "items": items}
    twice("POST", f"{zones}/instances/vm/setMetadata", metadata)
    twice("DELETE", f"{zones}/instances/vm")
    reaches("gone")

    templates = f"projects/{project}/global/instanceTemplates"
    twice("POST", templates, template_body("t", "ct6e-standard-1t"))
    twice("DELETE", f"{templates}/t")
    assert call(emulator, "GET", f"{templates}/t")[0] == 404
    policies = f"projects/{project}/regions/{region(ZONE)}/resourcePolicies"
    twice("POST", policies, policy_body("p", "2x2"))
    twice("DELETE", f"{policies}/p")
    assert call(emulator, "GET", f"{policies}/p")[0] == 404


@pytest.mark.compute_library
def test_a_retried_insert_returns_the_same_operation_and_makes_one_vm(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    request_id = str(uuid.uuid4())
    body = instance_body("once", ZONE, "ct6e-standard-1t")
    first = compute.insert_instance(ZONE, body, request_id=request_id)
    again = compute.insert_instance(ZONE, body, request_id=request_id)
    assert again.name == first.name
    compute.wait(first)
    later = compute.insert_instance(ZONE, body, request_id=request_id)  # after it is done
    assert later.name == first.name
    assert [vm.name for vm in compute.instances.list(project=compute.project, zone=ZONE)] == [
        "once"
    ]
    with pytest.raises(exceptions.Conflict, match="already exists"):
        compute.insert_instance(ZONE, body)  # a new request for a name in use

    vm = compute.get(ZONE, "once")
    stale = message("Metadata", {"fingerprint": "stale", "items": []})
    with pytest.raises(exceptions.PreconditionFailed):
        compute.instances.set_metadata(
            project=compute.project, zone=ZONE, instance="once", metadata_resource=stale
        )
    fresh = message(
        "Metadata",
        {"fingerprint": vm.metadata.fingerprint, "items": [{"key": "team", "value": "tpu"}]},
    )
    compute.wait(
        compute.instances.set_metadata(
            project=compute.project, zone=ZONE, instance="once", metadata_resource=fresh
        )
    )
    items = {item.key: item.value for item in compute.get(ZONE, "once").metadata.items}
    assert items["team"] == "tpu" and items["agent-worker-number"] == "0"
    compute.wait(compute.instances.delete(project=compute.project, zone=ZONE, instance="once"))


def test_a_mig_of_a_tpu_topology_needs_bulk_mode_and_the_topology_s_hosts(emulator: Any) -> None:
    project = new_project()
    zone = unique_zone()
    where = region(zone)
    assert call(emulator, "POST", f"projects/{project}/regions/{where}/resourcePolicies",
                policy_body("wp", "2x2x2"))[0] == 200  # fmt: skip
    assert call(emulator, "POST", f"projects/{project}/global/instanceTemplates",
                template_body("t", "ct5p-hightpu-4t"))[0] == 200  # fmt: skip
    body = group_body(
        "g",
        "global/instanceTemplates/t",
        f"projects/{project}/regions/{where}/resourcePolicies/wp",
        2,
    )
    path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
    status, error = call(
        emulator, "POST", path, {**body, "targetSizePolicy": {"mode": "INDIVIDUAL"}}
    )
    assert status == 400
    assert error["error"]["message"] == (
        "MIGs with TPU accelerator topology require BULK mode in target size policy"
    )
    status, error = call(emulator, "POST", path, {**body, "targetSize": 3})
    assert status == 400 and "has 2 hosts" in error["error"]["message"]
    bad_template = template_body("u", "ct5p-hightpu-4t")
    bad_template["properties"]["machineType"] = f"zones/{zone}/machineTypes/ct5p-hightpu-4t"
    status, error = call(
        emulator, "POST", f"projects/{project}/global/instanceTemplates", bad_template
    )
    assert status == 400 and "machine type name" in error["error"]["message"]


def test_every_resource_the_fake_shows_fits_the_discovery_document(emulator: Any) -> None:
    project = new_project()
    zone = unique_zone()
    where = region(zone)
    for path, body in (
        (f"projects/{project}/regions/{where}/resourcePolicies", policy_body("wp", "2x4")),
        (f"projects/{project}/regions/{where}/instanceTemplates",
         template_body("t", "ct6e-standard-4t", model="SPOT")),
        (f"projects/{project}/zones/{zone}/instanceGroupManagers",
         group_body("g", f"regions/{where}/instanceTemplates/t",
                    f"projects/{project}/regions/{where}/resourcePolicies/wp", 2)),
    ):  # fmt: skip
        status, operation = call(emulator, "POST", path, body)
        assert status == 200, operation
        assert discovery.problems("Operation", operation) == []
    group_path = f"projects/{project}/zones/{zone}/instanceGroupManagers/g"

    def ready() -> Any:
        group = call(emulator, "GET", group_path)[1]
        states = [t["state"] for t in group["status"].get("appliedAcceleratorTopologies", [])]
        return group if states == ["ACTIVE"] else None

    group = wait_until(ready, "the slice to be ACTIVE", 60)
    managed = call(emulator, "POST", f"{group_path}/listManagedInstances")[1]
    instance = call(emulator, "GET", managed["managedInstances"][0]["instance"].split("/v1/")[1])[1]
    regional = f"projects/{project}/regions/{where}"
    shown = {
        "InstanceGroupManager": group,
        "InstanceGroupManagersListManagedInstancesResponse": managed,
        "Instance": instance,
        "InstanceTemplate": call(emulator, "GET", f"{regional}/instanceTemplates/t")[1],
        "ResourcePolicy": call(emulator, "GET", f"{regional}/resourcePolicies/wp")[1],
        "OperationList": call(emulator, "GET", f"projects/{project}/zones/{zone}/operations")[1],
        "FirewallList": call(emulator, "GET", f"projects/{project}/global/firewalls")[1],
        "InstanceAggregatedList": call(emulator, "GET", f"projects/{project}/aggregated/instances")[
            1
        ],
    }
    for schema, body in shown.items():
        assert discovery.problems(schema, body) == [], schema
    assert instance["scheduling"]["provisioningModel"] == "SPOT"
    assert call(emulator, "DELETE", group_path)[0] == 200


def test_doctor_s_reads_work_against_the_fake(emulator: Any) -> None:
    from google.auth.credentials import AnonymousCredentials

    from tpuctl.cloud.compute_rest import firewall_rules, project_metadata, ssh_path

    project = new_project()
    env = {"TPUCTL_COMPUTE_ENDPOINT": emulator.compute_endpoint}
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    emulator.admin.project_metadata(project, {"enable-oslogin": "TRUE"})
    assert project_metadata(project, credentials, environ=env) == {"enable-oslogin": "TRUE"}
    rules = firewall_rules(project, credentials, environ=env)
    assert ssh_path(rules, "default", [], None).rules == (
        "default-allow-internal",
        "default-allow-ssh",
    )
