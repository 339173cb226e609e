"""The emulator's Cloud TPU REST API (v2alpha1 and v2), driven over HTTP: the same state as the
gRPC API, Google's JSON errors with the HTTP status of each gRPC code, paging, partial
responses, update masks, long-running operations, and the fields only REST carries."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.emulator.discovery import problems
from tests.emulator.helpers import (
    NodeState,
    QrState,
    boot_recorder,
    boots,
    create,
    new_project,
    parent_of,
    qr_request,
    rest,
    rest_qr,
    unique,
    wait_state,
    wait_until,
)
from tpuctl.emulator.client.testing import EmulatorProcess

pytestmark = pytest.mark.emulator

LATER = {"queueingPolicy": {"validAfterDuration": "36000s"}}  # waits, never provisions


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Any:
    return emulator.tpu_client()


@pytest.fixture
def parent() -> str:
    return parent_of(new_project())


def _done(endpoint: str, operation: dict[str, Any], version: str = "v2alpha1") -> dict[str, Any]:
    """Poll a long-running operation over REST until it is done."""

    def probe() -> dict[str, Any] | None:
        status, body = rest(endpoint, "GET", operation["name"], version=version)
        assert status == 200, body
        return body if body.get("done") else None

    result: dict[str, Any] = wait_until(probe, f"{operation['name']} to be done")
    return result


def _gone(client: Any, name: str) -> None:
    def probe() -> bool:
        try:
            client.get_queued_resource(name=name)
        except exceptions.NotFound:
            return True
        return False

    wait_until(probe, f"{name} to be deleted")


def _assert_error(answer: tuple[int, Any], http: int, status: str, *words: str) -> None:
    code, body = answer
    assert code == http, body
    error = body["error"]
    assert error["code"] == http and error["status"] == status
    for word in words:
        assert word in error["message"]


# ------------------------------------------------------------------------- same state
def test_a_qr_made_over_rest_is_seen_over_grpc_with_what_its_proto_has(
    emulator: EmulatorProcess, client: Any, parent: str
) -> None:
    endpoint, qr_id, node_id = emulator.rest_endpoint, unique("rq"), unique("n")
    key = "projects/k/locations/us-central2/keyRings/r/cryptoKeys/k"
    body = rest_qr(
        parent,
        node_id,
        provisioningModel="STANDARD",
        node={
            "labels": {"team": "ml"},
            "bootDiskConfig": {
                "diskSizeGb": "200",
                "sourceImage": "projects/p/global/images/custom",
                "customerEncryptionKey": {"kmsKeyName": key},
            },
            "dataDisks": [
                {"sourceDisk": f"projects/p/zones/z/disks/{node_id}-data", "mode": "READ_ONLY"},
                {"sourceDisk": "projects/p/zones/z/disks/scratch", "workerIds": ["0"]},
            ],
            "shieldedInstanceConfig": {"enableSecureBoot": True},
        },
    )
    status, operation = rest(
        endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id
    )
    assert status == 200, operation
    name = f"{parent}/queuedResources/{qr_id}"
    assert operation["name"].startswith(f"{parent}/operations/")
    assert operation["metadata"]["@type"] == (
        "type.googleapis.com/google.cloud.tpu.v2alpha1.OperationMetadata"
    )
    assert operation["metadata"]["target"] == name and operation["metadata"]["verb"] == "create"
    done = _done(endpoint, operation)
    response = done["response"]
    assert response["@type"] == "type.googleapis.com/google.cloud.tpu.v2alpha1.QueuedResource"
    assert response["provisioningModel"] == "STANDARD"
    assert problems("v2alpha1", "Operation", done) == []

    # gRPC sees the same QR, with what its messages have (the disk's encryption, not its size).
    seen = wait_state(client, name, QrState.ACTIVE)
    node = seen.tpu.node_spec[0].node
    assert node.boot_disk_config.customer_encryption_key.kms_key_name == key
    assert node.shielded_instance_config.enable_secure_boot is True
    assert [d.source_disk.rsplit("/", 1)[1] for d in node.data_disks] == [
        f"{node_id}-data",
        "scratch",
    ]
    assert node.data_disks[0].mode == cloud_tpu.AttachedDisk.DiskMode.READ_ONLY
    grpc_node = client.get_node(name=f"{parent}/nodes/{node_id}")
    assert grpc_node.state == NodeState.READY and dict(grpc_node.labels) == {"team": "ml"}

    # REST answers everything it was sent, and every answer fits the discovery schemas.
    status, qr_json = rest(endpoint, "GET", name)
    assert status == 200
    sent = qr_json["tpu"]["nodeSpec"][0]["node"]
    assert sent["bootDiskConfig"] == body["tpu"]["nodeSpec"][0]["node"]["bootDiskConfig"]
    assert sent["dataDisks"][1] == {
        "sourceDisk": "projects/p/zones/z/disks/scratch",
        "workerIds": ["0"],
    }
    assert qr_json["state"] == {"state": "ACTIVE", "activeData": {}}
    assert problems("v2alpha1", "QueuedResource", qr_json) == []
    status, node_json = rest(endpoint, "GET", f"{parent}/nodes/{node_id}")
    assert node_json["bootDiskConfig"]["diskSizeGb"] == "200"
    assert node_json["id"] == str(grpc_node.id)  # int64 as a string
    assert problems("v2alpha1", "Node", node_json) == []
    # v2 has no diskSizeGb, sourceImage or workerIds: its view leaves them out.
    status, v2_node = rest(endpoint, "GET", f"{parent}/nodes/{node_id}", version="v2")
    assert status == 200 and problems("v2", "Node", v2_node) == []
    assert v2_node["bootDiskConfig"] == {"customerEncryptionKey": {"kmsKeyName": key}}
    assert "workerIds" not in v2_node["dataDisks"][1]

    status, deleted = rest(endpoint, "DELETE", name, force=True)
    assert status == 200
    assert _done(endpoint, deleted)["response"] == {
        "@type": "type.googleapis.com/google.protobuf.Empty"
    }
    _gone(client, name)


def test_a_qr_made_over_grpc_is_seen_over_rest(
    emulator: EmulatorProcess, client: Any, parent: str
) -> None:
    endpoint, qr_id = emulator.rest_endpoint, unique("gq")
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    request = qr_request(parent, tier="spot", queueing_policy=later, labels={"via": "grpc"})
    name = create(client, parent, qr_id, request).result(timeout=30).name
    status, listed = rest(endpoint, "GET", f"{parent}/queuedResources")
    assert status == 200
    [qr_json] = listed["queuedResources"]
    assert qr_json["name"] == name and qr_json["spot"] == {}
    assert qr_json["queueingPolicy"] == {"validAfterDuration": "36000s"}
    assert qr_json["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert qr_json["tpu"]["nodeSpec"][0]["node"]["labels"] == {"via": "grpc"}
    assert "provisioningModel" not in qr_json  # the gRPC client cannot send it
    assert problems("v2alpha1", "ListQueuedResourcesResponse", listed) == []
    status, v2 = rest(endpoint, "GET", name, version="v2")
    assert status == 200 and v2["spot"] == {} and problems("v2", "QueuedResource", v2) == []
    client.delete_queued_resource(request={"name": name, "force": True})
    _gone(client, name)


# ---------------------------------------------------------------------------- errors
def test_errors_are_googles_json_errors_with_the_http_status_of_the_grpc_code(
    emulator: EmulatorProcess, client: Any, parent: str
) -> None:
    endpoint = emulator.rest_endpoint
    missing = f"{parent}/queuedResources/nope"
    _assert_error(rest(endpoint, "GET", missing), 404, "NOT_FOUND", missing)
    with pytest.raises(exceptions.NotFound) as grpc_error:
        client.get_queued_resource(name=missing)
    assert rest(endpoint, "GET", missing)[1]["error"]["message"] == grpc_error.value.message
    _assert_error(rest(endpoint, "GET", f"{parent}/nodes/nope", version="v2"), 404, "NOT_FOUND")

    qr_id = unique("err")
    body = rest_qr(parent, unique("n"), **LATER)
    assert (
        rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)[0] == 200
    )
    again = rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)
    _assert_error(again, 409, "ALREADY_EXISTS", qr_id)
    name = f"{parent}/queuedResources/{qr_id}"
    # A reset needs an ACTIVE QR: FAILED_PRECONDITION is HTTP 400.
    _assert_error(rest(endpoint, "POST", f"{name}:reset", {}), 400, "FAILED_PRECONDITION")

    # An unknown field names itself, as Google's front end does, with a BadRequest detail.
    bogus = rest_qr(parent, unique("n"), bogus=1)
    code, answer = rest(endpoint, "POST", f"{parent}/queuedResources", bogus, queuedResourceId="x")
    assert code == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "bogus"' in answer["error"]["message"]
    [detail] = answer["error"]["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert detail["fieldViolations"][0]["field"] == "queued_resource.bogus"
    model = rest_qr(parent, unique("n"), provisioningModel="CHEAP")
    _assert_error(
        rest(endpoint, "POST", f"{parent}/queuedResources", model, queuedResourceId="x"),
        400,
        "INVALID_ARGUMENT",
        "provisioning_model",
    )
    _assert_error(
        rest(endpoint, "GET", f"{parent}/queuedResources", bogus=1), 400, "INVALID_ARGUMENT"
    )
    _assert_error(rest(endpoint, "GET", f"{parent}/widgets"), 404, "NOT_FOUND")

    # Injected API faults reach REST as they reach gRPC.
    emulator.admin.api_fault(create_exhausted=1)
    exhausted = rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId="y")
    _assert_error(exhausted, 429, "RESOURCE_EXHAUSTED")
    emulator.admin.api_fault(code="UNAVAILABLE", count=1)
    try:
        _assert_error(rest(endpoint, "GET", name), 503, "UNAVAILABLE")
    finally:
        emulator.admin.api_fault(code="UNAVAILABLE", count=0, create_exhausted=0)
    assert rest(endpoint, "DELETE", name, force=True)[0] == 200


# ------------------------------------------------------------------ paging and fields
def test_paging_and_partial_responses(emulator: EmulatorProcess, parent: str) -> None:
    endpoint = emulator.rest_endpoint
    names = []
    for index in range(3):
        body = rest_qr(parent, unique("p"), **LATER)
        qr_id = f"page-{index}"
        assert (
            rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)[0]
            == 200
        )
        names.append(f"{parent}/queuedResources/{qr_id}")
    collection = f"{parent}/queuedResources"
    status, first = rest(endpoint, "GET", collection, pageSize=2)
    assert status == 200 and [q["name"] for q in first["queuedResources"]] == names[:2]
    status, second = rest(endpoint, "GET", collection, pageSize=2, pageToken=first["nextPageToken"])
    assert [q["name"] for q in second["queuedResources"]] == names[2:]
    assert "nextPageToken" not in second
    _assert_error(rest(endpoint, "GET", collection, pageToken="zz"), 400, "INVALID_ARGUMENT")
    _assert_error(rest(endpoint, "GET", collection, pageSize="many"), 400, "INVALID_ARGUMENT")

    # `fields` selects, in Google's partial-response syntax.
    status, slim = rest(endpoint, "GET", collection, fields="queuedResources(name),nextPageToken")
    assert slim == {"queuedResources": [{"name": n} for n in names]}
    status, one = rest(endpoint, "GET", names[0], fields="name,state/state")
    assert one["name"] == names[0] and list(one) == ["name", "state"]
    assert list(one["state"]) == ["state"]  # no createTime, tpu, state data

    status, operations = rest(endpoint, "GET", f"{parent}/operations", pageSize=2)
    assert len(operations["operations"]) == 2 and operations["nextPageToken"]
    assert problems("v2alpha1", "ListOperationsResponse", operations) == []
    for name in names:
        assert rest(endpoint, "DELETE", name)[0] == 200  # no nodes: no force needed


# ------------------------------------------------------------------- a live node
@pytest.fixture(scope="module")
def live(emulator: EmulatorProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ACTIVE v5litepod-1 QR made over REST, whose startup script records each boot."""
    records = tmp_path_factory.mktemp("rest-boots")
    parent = parent_of(new_project())
    node_id, qr_id = unique("live"), unique("lq")
    body = rest_qr(
        parent,
        node_id,
        node={
            "acceleratorType": "v5litepod-1",
            "metadata": {"startup-script": boot_recorder(records)},
        },
    )
    endpoint = emulator.rest_endpoint
    assert (
        rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)[0] == 200
    )
    client = emulator.tpu_client()
    name = f"{parent}/queuedResources/{qr_id}"
    wait_state(client, name, QrState.ACTIVE)
    node = f"{parent}/nodes/{node_id}"
    yield type("Live", (), {"parent": parent, "node": node, "node_id": node_id, "records": records})
    client.delete_queued_resource(request={"name": name, "force": True})


def test_update_mask_patches_only_what_it_names(
    emulator: EmulatorProcess, client: Any, live: Any
) -> None:
    endpoint = emulator.rest_endpoint
    change = {"labels": {"stage": "two"}, "description": "not in the mask"}
    status, operation = rest(endpoint, "PATCH", live.node, change, updateMask="labels")
    assert status == 200, operation
    assert _done(endpoint, operation)["response"]["labels"] == {"stage": "two"}
    node = client.get_node(name=live.node)
    assert dict(node.labels) == {"stage": "two"} and node.description == ""
    bad = rest(endpoint, "PATCH", live.node, change, updateMask="acceleratorType")
    _assert_error(bad, 400, "INVALID_ARGUMENT", "accelerator_type")
    _assert_error(rest(endpoint, "PATCH", live.node, change), 400, "INVALID_ARGUMENT", "mask")


def test_guest_attributes_and_maintenance_over_rest(
    emulator: EmulatorProcess, client: Any, live: Any
) -> None:
    endpoint = emulator.rest_endpoint
    status, attributes = rest(endpoint, "POST", f"{live.node}:getGuestAttributes", {})
    assert status == 200 and problems("v2alpha1", "GetGuestAttributesResponse", attributes) == []
    grpc_attributes = client.get_guest_attributes(request={"name": live.node})
    [items] = [a["queryValue"]["items"] for a in attributes["guestAttributes"]]
    assert {(i.get("namespace", ""), i["key"], i["value"]) for i in items} == {
        (i.namespace, i.key, i.value) for i in grpc_attributes.guest_attributes[0].query_value.items
    }
    # simulateMaintenanceEvent is the alpha's alone.
    _assert_error(
        rest(endpoint, "POST", f"{live.node}:simulateMaintenanceEvent", {}, version="v2"),
        404,
        "NOT_FOUND",
    )
    before = len(boots(live.records, live.node_id))
    status, operation = rest(endpoint, "POST", f"{live.node}:simulateMaintenanceEvent", {})
    assert status == 200
    assert _done(endpoint, operation)["response"]["health"] == "UNHEALTHY_MAINTENANCE"
    wait_until(lambda: len(boots(live.records, live.node_id)) > before, "the reboot")
    wait_until(
        lambda: client.get_node(name=live.node).health == cloud_tpu.Node.Health.HEALTHY,
        "the node healthy again",
    )


def test_stop_and_start_a_node(emulator: EmulatorProcess, client: Any, live: Any) -> None:
    endpoint = emulator.rest_endpoint
    # ACTIVE comes as the VM boots: wait for its startup script to record the boot first.
    before = wait_until(lambda: boots(live.records, live.node_id), "the boot recorded")
    status, operation = rest(endpoint, "POST", f"{live.node}:stop", {})
    assert status == 200 and operation["metadata"]["verb"] == "stop"
    assert _done(endpoint, operation)["response"]["state"] == "STOPPED"
    assert client.get_node(name=live.node).state == NodeState.STOPPED
    # Stopped, it cannot be stopped again nor restarted by a reset; it can be started.
    _assert_error(rest(endpoint, "POST", f"{live.node}:stop", {}), 400, "FAILED_PRECONDITION")
    status, operation = rest(endpoint, "POST", f"{live.node}:start", {}, version="v2")
    assert status == 200
    started = _done(endpoint, operation, "v2")
    assert started["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert started["metadata"]["apiVersion"] == "v2"
    assert started["response"]["state"] == "READY"
    # The VM booted again, on the disk it had (the boot count on its disk goes on).
    wait_until(lambda: len(boots(live.records, live.node_id)) > len(before), "the boot")
    # Relative to the last boot seen: an earlier test of this module may have rebooted it.
    assert boots(live.records, live.node_id)[-1] == before[-1] + 1


# ------------------------------------------------------------------------------- v2
def test_v2_is_the_same_state_seen_through_its_own_schema(
    emulator: EmulatorProcess, client: Any, parent: str
) -> None:
    endpoint, qr_id = emulator.rest_endpoint, unique("v2")
    body = rest_qr(parent, "unused", **LATER)
    spec = body["tpu"]["nodeSpec"][0]
    del spec["nodeId"]
    spec["multisliceParams"] = {"nodeCount": 2, "nodeIdPrefix": qr_id}
    status, operation = rest(
        endpoint, "POST", f"{parent}/queuedResources", body, version="v2", queuedResourceId=qr_id
    )
    assert status == 200, operation
    assert (
        operation["metadata"]["@type"]
        == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    )
    name = f"{parent}/queuedResources/{qr_id}"
    params = client.get_queued_resource(name=name).tpu.node_spec[0].multi_node_params
    assert (params.node_count, params.node_id_prefix) == (2, qr_id)
    v2 = rest(endpoint, "GET", name, version="v2")[1]
    assert v2["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": qr_id}
    alpha = rest(endpoint, "GET", name)[1]
    assert alpha["tpu"]["nodeSpec"][0]["multiNodeParams"]["nodeCount"] == 2
    # What only the alpha has is an unknown name to v2.
    for field in ({"runDuration": {"maxRunDuration": "3600s"}}, {"provisioningModel": "SPOT"}):
        refused = rest(
            endpoint, "POST", f"{parent}/queuedResources", {**body, **field}, version="v2",
            queuedResourceId=unique("x"),
        )  # fmt: skip
        _assert_error(refused, 400, "INVALID_ARGUMENT", "Unknown name")
    _assert_error(rest(endpoint, "GET", f"{parent}/reservations", version="v2"), 404, "NOT_FOUND")
    assert rest(endpoint, "DELETE", name, version="v2")[0] == 200


def test_locations_and_catalog(emulator: EmulatorProcess) -> None:
    endpoint, project = emulator.rest_endpoint, new_project()
    parent = parent_of(project)
    status, locations = rest(endpoint, "GET", f"projects/{project}/locations")
    assert status == 200 and parent in [loc["name"] for loc in locations["locations"]]
    assert problems("v2alpha1", "ListLocationsResponse", locations) == []
    assert rest(endpoint, "GET", parent, version="v2")[1]["locationId"] == parent.rsplit("/", 1)[1]
    status, types = rest(endpoint, "GET", f"{parent}/acceleratorTypes", pageSize=3)
    assert len(types["acceleratorTypes"]) == 3 and types["nextPageToken"]
    assert problems("v2alpha1", "ListAcceleratorTypesResponse", types) == []
    status, one = rest(endpoint, "GET", f"{parent}/acceleratorTypes/v6e-8", version="v2")
    assert one["acceleratorConfigs"] == [{"type": "V6E", "topology": "2x4"}]
    status, versions = rest(endpoint, "GET", f"{parent}/runtimeVersions")
    assert "v2-alpha-tpuv6e" in [v["version"] for v in versions["runtimeVersions"]]
    reservation = f"{parent}/reservations/{unique('r')}"
    emulator.admin.reservation(reservation, chips=16, generation="v5e", end="+1h")
    status, reservations = rest(endpoint, "GET", f"{parent}/reservations")
    [listed] = reservations["reservations"]
    assert listed["name"] == reservation and listed["standard"]["size"] == 16
    assert "endTime" in listed["standard"]["interval"]
    assert problems("v2alpha1", "ListReservationsResponse", reservations) == []
    emulator.admin.reservation(reservation, remove=True)


# ------------------------------------------------------ REST-only rules on a create
@pytest.mark.parametrize(
    ("fields", "http", "status", "words"),
    [
        ({"provisioningModel": "FLEX_START"}, 400, "INVALID_ARGUMENT", "max_run_duration"),
        (
            {"provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "604801s"}},
            400,
            "INVALID_ARGUMENT",
            "7 days",
        ),
        (
            {"provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "599s"}},
            400,
            "INVALID_ARGUMENT",
            "10 minutes",
        ),
        (
            {"provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "1h"}},
            400,
            "INVALID_ARGUMENT",
            "max_run_duration",
        ),
        (
            {
                "provisioningModel": "FLEX_START",
                "runDuration": {"maxRunDuration": "3600s"},
                "spot": {},
            },
            400,
            "INVALID_ARGUMENT",
            "spot",
        ),
        (
            {
                "provisioningModel": "FLEX_START",
                "runDuration": {"maxRunDuration": "3600s"},
                "node": {"acceleratorType": "v4-8"},
            },
            400,
            "INVALID_ARGUMENT",
            "v5e and v6e",
        ),
        ({"provisioningModel": "RESERVATION_BOUND"}, 400, "INVALID_ARGUMENT", "reservation_name"),
        (
            {
                "provisioningModel": "RESERVATION_BOUND",
                "reservationName": "projects/p/locations/z/reservations/-",
            },
            400,
            "INVALID_ARGUMENT",
            "one reservation",
        ),
        (
            {
                "provisioningModel": "RESERVATION_BOUND",
                "reservationName": "projects/p/locations/z/reservations/none",
            },
            404,
            "NOT_FOUND",
            "reservations/none",
        ),
        ({"provisioningModel": "SPOT", "guaranteed": {}}, 400, "INVALID_ARGUMENT", "guaranteed"),
        ({"node": {"bootDiskConfig": {"diskSizeGb": "big"}}}, 400, "INVALID_ARGUMENT", "int64"),
        ({"node": {"dataDisks": [{"workerIds": "0"}]}}, 400, "INVALID_ARGUMENT", "worker_ids"),
    ],
)
def test_rest_only_fields_are_checked_as_the_service_does(  # noqa: PLR0917 - parametrized
    emulator: EmulatorProcess,
    parent: str,
    fields: dict[str, Any],
    http: int,
    status: str,
    words: str,
) -> None:
    node = fields.pop("node", {})
    body = rest_qr(parent, unique("n"), node=node, **fields)
    answer = rest(
        emulator.rest_endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId="r"
    )
    _assert_error(answer, http, status, words)


def test_gclouds_spot_body_is_spot(emulator: EmulatorProcess, client: Any, parent: str) -> None:
    """gcloud alpha sends provisioningModel STANDARD with `--spot`'s `spot: {}`: that is spot."""
    endpoint, qr_id = emulator.rest_endpoint, unique("sp")
    body = rest_qr(parent, unique("n"), provisioningModel="STANDARD", spot={}, **LATER)
    assert (
        rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)[0] == 200
    )
    status = emulator.admin.status()
    [mine] = [q for q in status["queued_resources"] if q["name"].endswith(f"/{qr_id}")]
    assert mine["tier"] == "spot"
    assert rest(endpoint, "DELETE", f"{parent}/queuedResources/{qr_id}")[0] == 200


# ------------------------------------------------------------------- flex-start end
FLEX_SCRIPT = """#!/bin/bash
md() {{ curl -s -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }}
echo "$TPUCTL_EMULATOR_SPEED" > "{record}/speed"
md instance/scheduling/termination-time > "{record}/reading"
mv "{record}/reading" "{record}/termination-time"
nohup setsid bash -c \\
  'trap "echo term > {record}/signal; exit 0" TERM; while :; do sleep 0.1; done' >/dev/null 2>&1 &
"""


def _rfc3339(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_flex_start_waits_for_its_pool_then_is_taken_back_at_its_termination_time(
    emulator: EmulatorProcess, client: Any, parent: str, tmp_path: Path
) -> None:
    endpoint, admin = emulator.rest_endpoint, emulator.admin
    node_id, qr_id = unique("flex"), unique("fq")
    name, node = f"{parent}/queuedResources/{qr_id}", f"{parent}/nodes/{node_id}"
    body = rest_qr(
        parent,
        node_id,
        provisioningModel="FLEX_START",
        runDuration={"maxRunDuration": "600s"},  # 30 s at the session emulator's speed 20
        node={
            "acceleratorType": "v5litepod-1",
            "metadata": {"startup-script": FLEX_SCRIPT.format(record=tmp_path)},
        },
    )
    admin.capacity({"v5e": 0}, flex_start=True)
    try:
        assert (
            rest(endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)[0]
            == 200
        )
        wait_state(client, name, QrState.WAITING_FOR_RESOURCES)
        # Held queued by its own empty pool while the standard v5e pool has room (2 s real is
        # 40 emulated seconds, eighty times the least wait).
        time.sleep(2)
        assert client.get_queued_resource(name=name).state.state == QrState.WAITING_FOR_RESOURCES
        assert admin.capacity()["v5e"]["free"] > 0
    finally:
        admin.capacity({"v5e": 16384}, flex_start=True)
    wait_state(client, name, QrState.ACTIVE)
    qr_json = rest(endpoint, "GET", name)[1]
    end = qr_json["runDuration"]["terminationTime"]
    node_json = rest(endpoint, "GET", node)[1]
    assert node_json["schedulingConfig"]["terminationTimestamp"] == end
    # The end is the start of provisioning plus the run duration, ÷ the speed (real time).
    provisioning = [e for e in admin.events() if e["qr"] == name and e["detail"] == "PROVISIONING"]
    started = _rfc3339(provisioning[0]["timestamp"])
    assert abs((_rfc3339(end) - started).total_seconds() - 600 / 20) < 1.0
    recorded = tmp_path / "termination-time"  # written last, whole (mv)
    wait_until(recorded.exists, "the startup script")
    assert recorded.read_text() == end  # what the metadata server serves
    assert (tmp_path / "speed").read_text().strip() == "20"

    # At the end the nodes are deleted (their VMs shut down as deleted VMs are) and the QR is
    # SUSPENDED by the service; the flex-start pool gets its chips back.
    suspended = wait_state(client, name, QrState.SUSPENDED, timeout=120)
    assert suspended.state.state_initiator == cloud_tpu.QueuedResourceState.StateInitiator.SERVICE
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=node)
    assert (tmp_path / "signal").read_text().strip() == "term"
    assert [e for e in admin.events() if e["qr"] == name and e["kind"] == "run.end"]
    assert admin.capacity(flex_start=True)["v5e"]["used"] == 0
    still = rest(endpoint, "GET", name)[1]
    assert still["runDuration"]["terminationTime"] == end
    assert rest(endpoint, "DELETE", name)[0] == 200
    _gone(client, name)
