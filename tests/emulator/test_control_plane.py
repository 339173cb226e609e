"""Control-plane details checked in-process against a recording worker plane (no processes):
what the state machine asks of the worker plane, and pure parsing."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.protobuf import timestamp_pb2

from tests.emulator.fake_plane import FakeIdentity, FakeWorkerPlane
from tests.emulator.helpers import (
    NodeState,
    QrState,
    create,
    delete,
    parent_of,
    qr_request,
    unique,
    wait_state,
    wait_until,
)
from tpuctl.emulator.api.server import Emulator
from tpuctl.emulator.client.admin import AdminClient
from tpuctl.emulator.client.testing import EmulatorProcess
from tpuctl.emulator.control.config import (
    EmulatorConfig,
    parse_capacity,
    parse_delays,
    parse_duration,
)

# It starts emulators of its own (servers, worker VMs): an emulator test.
pytestmark = pytest.mark.emulator

SPEED = 50.0
GRACE = 100.0


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[Emulator, FakeWorkerPlane, Any]]:
    plane = FakeWorkerPlane()
    config = EmulatorConfig(speed=SPEED, grace=GRACE)
    emulator = Emulator(config, plane=plane, identity_factory=FakeIdentity)
    emulator.start()
    handle = EmulatorProcess.__new__(EmulatorProcess)
    handle.host = emulator.host
    try:
        yield emulator, plane, handle.tpu_client()
    finally:
        emulator.close()
    assert plane.closed


def test_parsers() -> None:
    assert parse_capacity("v4=64, v5e=256") == {"v4": 64, "v5e": 256}
    with pytest.raises(ValueError, match="v9"):
        parse_capacity("v9=1")
    assert parse_duration("300s") == 300 and parse_duration("5m") == 300
    assert parse_duration("+30s") == 30 and parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        parse_duration("soon")
    assert parse_delays(["creating=2", "provisioning=1m"]).provisioning == 60
    with pytest.raises(ValueError, match="bogus"):
        parse_delays(["bogus=1"])


def test_identity_and_coordinator_for_each_slice(fake: Any) -> None:
    _, plane, client = fake
    parent = parent_of("cp")
    qr_id = unique("ms")
    request = qr_request(
        parent, accelerator_type="v5litepod-16", node_count=3, prefix=qr_id, tier="spot"
    )
    name = create(client, parent, qr_id, request).result(timeout=10).name
    wait_state(client, name, QrState.ACTIVE)
    nodes = [plane.nodes[f"{qr_id}-{i}"] for i in range(3)]
    coordinator = f"{nodes[0].workers[0].ip}:8080"
    assert [n.coordinator for n in nodes] == [None, coordinator, coordinator]
    identity = nodes[2].identity
    assert (identity.slice_index, identity.num_slices, identity.workers) == (2, 3, 4)
    assert identity.preemptible and identity.topology == "4x4"
    assert identity.node_name == f"{parent}/nodes/{qr_id}-2"
    assert all(n.boots == 1 for n in nodes)
    delete(client, name)
    assert {f"{qr_id}-{i}" for i in range(3)} <= set(plane.deleted)


def test_maintenance_grace_is_scaled_and_only_with_autocheckpoint(fake: Any) -> None:
    _, plane, client = fake
    parent = parent_of("cp")
    for autocheckpoint, expected in ((True, GRACE / SPEED), (False, None)):
        node_id = unique("m")
        request = qr_request(parent, node_id=node_id, autocheckpoint=autocheckpoint)
        name = create(client, parent, unique("qr"), request).result(timeout=10).name
        wait_state(client, name, QrState.ACTIVE)
        client.simulate_maintenance_event(request={"name": f"{parent}/nodes/{node_id}"}).result()
        wait_until(lambda n=node_id: plane.nodes[n].boots == 2, "reboot")
        assert plane.nodes[node_id].stops[0] == expected
        delete(client, name)


def test_metadata_updates_reach_the_plane(fake: Any) -> None:
    _, plane, client = fake
    parent = parent_of("cp")
    node_id = unique("md")
    name = create(client, parent, unique("qr"), qr_request(parent, node_id=node_id)).result().name
    wait_state(client, name, QrState.ACTIVE)
    node = client.get_node(name=f"{parent}/nodes/{node_id}")
    node.metadata["ssh-keys"] = "bob:ssh-ed25519 AAAA bob"
    client.update_node(node=node, update_mask={"paths": ["metadata", "labels"]}).result()
    assert plane.nodes[node_id].metadata["ssh-keys"] == "bob:ssh-ed25519 AAAA bob"
    delete(client, name)


def test_deleting_a_node_suspends_its_queued_resource(fake: Any) -> None:
    _, _, client = fake
    parent = parent_of("cp")
    qr_id = unique("nd")
    request = qr_request(parent, accelerator_type="v4-8", node_count=2, prefix=qr_id)
    name = create(client, parent, qr_id, request).result().name
    wait_state(client, name, QrState.ACTIVE)
    client.delete_node(name=f"{parent}/nodes/{qr_id}-0")
    suspended = wait_state(client, name, QrState.SUSPENDED)
    assert suspended.state.state_initiator == cloud_tpu.QueuedResourceState.StateInitiator.USER
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{parent}/nodes/{qr_id}-0")
    assert client.get_node(name=f"{parent}/nodes/{qr_id}-1").state == NodeState.STOPPED
    delete(client, name, force=False)


def test_queueing_windows(fake: Any) -> None:
    emulator, _, client = fake
    parent = parent_of("cp")
    past = timestamp_pb2.Timestamp()
    past.FromDatetime(datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
    for policy in ({"valid_until_time": past}, {"valid_until_duration": {"seconds": 0}}):
        with pytest.raises(exceptions.InvalidArgument, match="valid_until"):
            create(client, parent, unique("p"), qr_request(parent, queueing_policy=policy))
    now = datetime.datetime.now(datetime.timezone.utc)
    far = {"valid_after_time": now + datetime.timedelta(hours=10)}
    held = create(client, parent, unique("held"), qr_request(parent, queueing_policy=far))
    held_name = held.result(timeout=5).name
    soon = now + datetime.timedelta(seconds=25)
    request = qr_request(parent, queueing_policy={"valid_after_time": soon})  # 0.5 s real
    qr_id = unique("after")
    create(client, parent, qr_id, request)
    name = f"{parent}/queuedResources/{qr_id}"
    wait_state(client, name, QrState.WAITING_FOR_RESOURCES, timeout=5)
    wait_state(client, name, QrState.ACTIVE, timeout=5)
    # Capacity was there all along: what holds a QR is its own valid_after, still 10 h away.
    assert client.get_queued_resource(name=held_name).state.state == QrState.WAITING_FOR_RESOURCES
    delete(client, held_name, force=False)
    delete(client, name)
    with AdminClient(emulator.host) as admin:
        assert admin.status()["queued_resources"] == [] or all(
            q["name"] != name for q in admin.status()["queued_resources"]
        )


def test_best_effort_and_guaranteed_tiers(fake: Any) -> None:
    emulator, _, client = fake
    parent = parent_of("cp")
    for tier, field in (("best_effort", "preemptible"), ("guaranteed", "reserved")):
        node_id = unique("t")
        request = qr_request(parent, node_id=node_id, tier=tier)
        name = create(client, parent, unique("qr"), request).result().name
        wait_state(client, name, QrState.ACTIVE)
        node = client.get_node(name=f"{parent}/nodes/{node_id}")
        assert getattr(node.scheduling_config, field) is True
        with AdminClient(emulator.host) as admin:
            if tier == "best_effort":
                admin.preempt(name)
                wait_state(client, name, QrState.SUSPENDED)
        delete(client, name)
