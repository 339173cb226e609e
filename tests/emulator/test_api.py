"""The emulator's Tpu and Operations services, driven by the unmodified google-cloud-tpu client."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, field_mask_pb2

from tests.emulator.helpers import (
    NodeState,
    QrState,
    create,
    delete,
    new_project,
    parent_of,
    qr_request,
    unique,
    wait_state,
    wait_until,
)
from tpuctl.emulator.client.testing import EmulatorProcess

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Any:
    return emulator.tpu_client()


@pytest.fixture
def parent() -> str:
    return parent_of(new_project())


def test_create_single_node_reaches_active_with_the_node_as_sent(client: Any, parent: str) -> None:
    qr_id = unique("qr")
    request = qr_request(
        parent,
        node_id="solo",
        labels={"team": "ml"},
        tags=["tpu"],
        metadata={"startup-script": "true", "extra": "1"},
        autocheckpoint=True,
    )
    operation = create(client, parent, qr_id, request)
    assert operation.metadata.verb == "create"
    assert operation.metadata.target == f"{parent}/queuedResources/{qr_id}"
    created = operation.result(timeout=30)
    assert created.name == f"{parent}/queuedResources/{qr_id}"
    assert created.state.state in (QrState.WAITING_FOR_RESOURCES, QrState.PROVISIONING)
    assert operation.metadata.end_time

    active = wait_state(client, created.name, QrState.ACTIVE)
    assert active.tpu.node_spec[0].node_id == "solo"
    assert "active_data" in active.state
    node = client.get_node(name=f"{parent}/nodes/solo")
    assert node.state == NodeState.READY
    assert node.health == cloud_tpu.Node.Health.HEALTHY
    assert node.queued_resource == created.name
    assert node.multislice_node is False
    assert node.autocheckpoint_enabled is True
    assert dict(node.labels) == {"team": "ml"}
    assert list(node.tags) == ["tpu"]
    assert node.metadata["extra"] == "1"
    assert node.runtime_version == "tpu-ubuntu2204-base"
    assert node.accelerator_type == "v4-8"
    assert node.accelerator_config.type_ == cloud_tpu.AcceleratorConfig.Type.V4
    assert node.accelerator_config.topology == "2x2x1"
    assert node.create_time.year >= 2024
    assert len(node.network_endpoints) == 1
    endpoint = node.network_endpoints[0]
    assert endpoint.ip_address.startswith("127.")
    assert endpoint.access_config.external_ip == endpoint.ip_address
    delete(client, created.name)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{parent}/nodes/solo")


def test_accelerator_config_and_multislice_nodes(client: Any, parent: str) -> None:
    qr_id = unique("ms")
    request = qr_request(parent, accelerator_type="", node_count=3, prefix=qr_id)
    request.tpu.node_spec[0].node.accelerator_config = cloud_tpu.AcceleratorConfig(
        type_=cloud_tpu.AcceleratorConfig.Type.V4, topology="2x2x2"
    )
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    nodes = list(client.list_nodes(parent=parent))
    assert [n.name.rsplit("/", 1)[1] for n in nodes] == [f"{qr_id}-{i}" for i in range(3)]
    for node in nodes:
        assert node.multislice_node is True
        assert node.accelerator_type == "v4-16"
        assert len(node.network_endpoints) == 2
        assert node.state == NodeState.READY
    ips = [e.ip_address for n in nodes for e in n.network_endpoints]
    assert len(set(ips)) == 6

    page = client.list_nodes(request={"parent": parent, "page_size": 2})
    first = next(iter(page.pages))
    assert len(first.nodes) == 2 and first.next_page_token
    delete(client, name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.tpu.node_spec[0].__setattr__("node_id", ""), "node_id or multi_node_params"),
        (
            lambda r: r.tpu.__setattr__(
                "node_spec",
                [
                    {
                        "parent": r.tpu.node_spec[0].parent,
                        "node": r.tpu.node_spec[0].node,
                        "multi_node_params": {"node_count": 1, "node_id_prefix": "x"},
                    }
                ],
            ),
            "greater than 1",
        ),
        (lambda r: r.tpu.node_spec[0].node.__setattr__("accelerator_type", "v4-7"), "v4"),
        (lambda r: r.tpu.node_spec[0].node.__setattr__("accelerator_type", "tpu9-8"), "unknown"),
        (lambda r: r.tpu.node_spec[0].node.__setattr__("accelerator_type", ""), "accelerator"),
        (lambda r: r.tpu.node_spec[0].node.__setattr__("runtime_version", ""), "runtime_version"),
        (lambda r: r.tpu.node_spec[0].__setattr__("parent", "projects/x/locations/y"), "parent"),
        (lambda r: r.tpu.node_spec[0].__setattr__("node_id", "Bad_Name"), "node id"),
    ],
)
def test_invalid_create_requests(client: Any, parent: str, change: Any, message: str) -> None:
    request = qr_request(parent)
    change(request)
    with pytest.raises(exceptions.InvalidArgument, match=message):
        create(client, parent, unique("bad"), request)


def test_multislice_needs_v4_or_newer(client: Any, parent: str) -> None:
    request = qr_request(parent, accelerator_type="v3-8", node_count=2, prefix="old")
    with pytest.raises(exceptions.InvalidArgument, match="Multislice"):
        create(client, parent, unique("v3"), request)
    request = qr_request(parent, accelerator_type="v5litepod-16", node_count=2, prefix="new")
    name = create(client, parent, unique("v5e"), request).result(timeout=30).name
    delete(client, name)


def test_bad_ids_and_parents(client: Any, parent: str) -> None:
    with pytest.raises(exceptions.InvalidArgument, match="queued_resource_id"):
        create(client, parent, "bad/id", qr_request(parent))
    with pytest.raises(exceptions.InvalidArgument, match="parent"):
        create(client, "projects/p", unique("x"), qr_request(parent))


def test_already_exists_and_request_id_idempotency(client: Any, parent: str) -> None:
    qr_id = unique("idem")
    request = qr_request(parent, node_id=unique("n"))
    first = create(client, parent, qr_id, request, request_id="req-" + qr_id)
    again = create(client, parent, qr_id, request, request_id="req-" + qr_id)
    assert again.operation.name == first.operation.name
    with pytest.raises(exceptions.AlreadyExists):
        create(client, parent, qr_id, request)
    other = qr_request(parent, node_id=request.tpu.node_spec[0].node_id)
    with pytest.raises(exceptions.AlreadyExists, match="node"):
        create(client, parent, unique("dup-node"), other)
    name = first.result(timeout=30).name
    assert len([q for q in client.list_queued_resources(parent=parent)]) == 1

    # The raw operations: a delete ends with google.protobuf.Empty, which the v2alpha1 client
    # (declaring QueuedResource) cannot unwrap from an operation already done when it answers,
    # as the replay is once the first delete has finished.
    delete_request = cloud_tpu.DeleteQueuedResourceRequest(
        name=name, force=True, request_id="del-" + qr_id
    )
    one = client.transport.delete_queued_resource(delete_request)
    two = client.transport.delete_queued_resource(delete_request)
    assert one.name == two.name


def test_not_found(client: Any, parent: str) -> None:
    missing = f"{parent}/queuedResources/nope"
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=missing)
    with pytest.raises(exceptions.NotFound):
        client.delete_queued_resource(name=missing)
    with pytest.raises(exceptions.NotFound):
        client.reset_queued_resource(name=missing)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{parent}/nodes/nope")
    with pytest.raises(exceptions.NotFound):
        client.get_operation(request={"name": f"{parent}/operations/nope"})
    with pytest.raises(exceptions.InvalidArgument):
        client.get_queued_resource(name="queuedResources/nope")


def test_list_paging(client: Any, parent: str) -> None:
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    names = [
        create(client, parent, f"page-{i}", qr_request(parent, queueing_policy=later))
        .result(timeout=30)
        .name
        for i in range(5)
    ]
    pager = client.list_queued_resources(request={"parent": parent, "page_size": 2})
    pages = list(pager.pages)
    assert [len(p.queued_resources) for p in pages] == [2, 2, 1]
    assert [q.name for p in pages for q in p.queued_resources] == sorted(names)
    assert pages[-1].next_page_token == ""
    everything = [q.name for q in client.list_queued_resources(parent="projects/-/locations/-")]
    assert set(names) <= set(everything)
    with pytest.raises(exceptions.InvalidArgument):
        client.list_queued_resources(request={"parent": parent, "page_token": "bogus"})
    for name in names:  # WAITING_FOR_RESOURCES and no nodes: no force needed
        assert client.get_queued_resource(name=name).state.state == QrState.WAITING_FOR_RESOURCES
        delete(client, name, force=False)


def test_delete_needs_force_when_nodes_exist(client: Any, parent: str) -> None:
    name = create(client, parent, unique("del"), qr_request(parent)).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    with pytest.raises(exceptions.FailedPrecondition, match="force"):
        client.delete_queued_resource(request={"name": name, "force": False})
    raw = delete(client, name, force=True)
    operation = wait_until(
        lambda: (op := client.get_operation(request={"name": raw.name})).done and op,
        "delete operation to finish",
    )
    # Like Cloud TPU, the delete LRO carries google.protobuf.Empty.
    assert operation.response.Is(empty_pb2.Empty.DESCRIPTOR)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)


def test_reset_restarts_vms_keeping_the_disk(
    client: Any, parent: str, tmp_path: Any, boot_script: Any
) -> None:
    node_id = unique("reset")
    name = (
        create(
            client,
            parent,
            unique("qr"),
            qr_request(parent, node_id=node_id, startup_script=boot_script),
        )
        .result(timeout=30)
        .name
    )
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    waiting = create(client, parent, unique("w"), qr_request(parent, queueing_policy=later))
    with pytest.raises(exceptions.FailedPrecondition, match="ACTIVE"):
        client.reset_queued_resource(name=waiting.result(timeout=30).name)
    delete(client, waiting.result().name, force=False)
    wait_state(client, name, QrState.ACTIVE)
    wait_until(lambda: boot_records(node_id) == [1], "first boot")
    operation = client.reset_queued_resource(name=name)
    assert operation.result(timeout=30).name == name
    wait_until(lambda: boot_records(node_id) == [1, 2], "second boot on the same disk")
    assert client.get_node(name=f"{parent}/nodes/{node_id}").state == NodeState.READY
    delete(client, name)


def boot_records(node_id: str, worker: int = 0) -> list[int]:
    from tests.emulator.helpers import boots

    assert BOOT_DIR is not None
    return boots(BOOT_DIR, node_id, worker)


BOOT_DIR = None


@pytest.fixture(scope="module")
def boot_script(tmp_path_factory: pytest.TempPathFactory) -> str:
    global BOOT_DIR  # noqa: PLW0603 - shared by boot_records in this module
    from tests.emulator.helpers import boot_recorder

    BOOT_DIR = tmp_path_factory.mktemp("boots")
    return boot_recorder(BOOT_DIR)


def test_update_node_metadata(client: Any, parent: str) -> None:
    node_id = unique("upd")
    name = (
        create(client, parent, unique("qr"), qr_request(parent, node_id=node_id))
        .result(timeout=30)
        .name
    )
    wait_state(client, name, QrState.ACTIVE)
    node_name = f"{parent}/nodes/{node_id}"
    node = client.get_node(name=node_name)
    node.metadata["ssh-keys"] = "alice:ssh-ed25519 AAAAC3Nz alice"
    updated = client.update_node(
        node=node, update_mask=field_mask_pb2.FieldMask(paths=["metadata"])
    ).result(timeout=30)
    assert updated.metadata["ssh-keys"].startswith("alice:")
    assert client.get_node(name=node_name).metadata["ssh-keys"].startswith("alice:")
    with pytest.raises(exceptions.InvalidArgument, match="accelerator_type"):
        client.update_node(
            node=node, update_mask=field_mask_pb2.FieldMask(paths=["accelerator_type"])
        )
    with pytest.raises(exceptions.InvalidArgument, match="update_mask"):
        client.update_node(node=node, update_mask=field_mask_pb2.FieldMask(paths=[]))
    delete(client, name)


def test_guest_attributes_publish_the_served_host_keys(
    client: Any, parent: str, emulator: EmulatorProcess
) -> None:
    import asyncio

    import asyncssh

    qr_id = unique("ga")
    request = qr_request(parent, accelerator_type="v4-16", node_count=2, prefix=qr_id)
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    node_name = f"{parent}/nodes/{qr_id}-1"
    node = client.get_node(name=node_name)
    response = client.get_guest_attributes(request={"name": node_name, "query_path": "hostkeys/"})
    assert len(response.guest_attributes) == 2
    for endpoint, attributes in zip(node.network_endpoints, response.guest_attributes, strict=True):
        (item,) = attributes.query_value.items
        assert (item.namespace, item.key) == ("hostkeys", "ssh-ed25519")
        served = asyncio.run(asyncssh.get_server_host_key(endpoint.ip_address, emulator.ssh_port))
        assert served is not None
        assert served.export_public_key("openssh").decode().split()[1] == item.value
    one = client.get_guest_attributes(
        request={"name": node_name, "query_path": "hostkeys/ssh-ed25519", "worker_ids": ["1"]}
    )
    assert len(one.guest_attributes) == 1
    assert one.guest_attributes[0].query_value.items[0].value == item.value
    other = client.get_guest_attributes(request={"name": node_name, "query_path": "other/"})
    assert all(not g.query_value.items for g in other.guest_attributes)
    with pytest.raises(exceptions.InvalidArgument, match="worker"):
        client.get_guest_attributes(request={"name": node_name, "worker_ids": ["7"]})
    delete(client, name)


def test_operations_service(client: Any, parent: str) -> None:
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    operation = create(client, parent, unique("ops"), qr_request(parent, queueing_policy=later))
    name = operation.operation.name
    assert name.startswith(f"{parent}/operations/")
    qr = operation.result(timeout=30)
    got = client.get_operation(request={"name": name})
    assert got.done
    metadata = cloud_tpu.OperationMetadata.deserialize(got.metadata.value)
    assert metadata.verb == "create" and metadata.target == qr.name
    assert metadata.api_version == "v2alpha1"
    assert metadata.create_time <= metadata.end_time
    listed = client.list_operations(request={"name": parent})
    assert name in [op.name for op in listed.operations]
    client.cancel_operation(request={"name": name})
    got = client.get_operation(request={"name": name})
    assert cloud_tpu.OperationMetadata.deserialize(got.metadata.value).cancel_requested
    client.delete_operation(request={"name": name})
    with pytest.raises(exceptions.NotFound):
        client.get_operation(request={"name": name})
    assert isinstance(got, operations_pb2.Operation)
    delete(client, qr.name, force=False)
