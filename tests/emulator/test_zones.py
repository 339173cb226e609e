"""Zones in the emulator: a zone given pools of its own (the others keep sharing theirs), and
the same queued resource and node ids in two zones at once, each with VMs of its own."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.emulator.helpers import (
    QrState,
    boot_recorder,
    boots,
    create,
    delete,
    new_project,
    qr_request,
    unique,
    wait_state,
)
from tests.support import wait_for
from tpuctl.emulator.client.testing import EmulatorProcess

pytestmark = pytest.mark.emulator


def unique_zone() -> str:
    """A zone no other test uses, so its pools are this test's alone."""
    return f"us-zone{random.randrange(10**6, 10**7)}-a"


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Any:
    return emulator.tpu_client()


def test_a_zone_with_pools_of_its_own_queues_while_the_others_share_theirs(
    client: Any, emulator: EmulatorProcess
) -> None:
    empty, other = unique_zone(), unique_zone()
    project = new_project()
    shared_before = emulator.admin.capacity()["v4"]
    pools = emulator.admin.capacity({"v4": 0}, zone=empty)
    assert pools["v4"] == {"total": 0, "used": 0, "free": 0}
    # The shared pools and every other zone are as they were.
    assert emulator.admin.capacity()["v4"]["total"] == shared_before["total"]
    assert emulator.admin.capacity(zone=other)["v4"]["total"] == shared_before["total"]

    waiting_parent = f"projects/{project}/locations/{empty}"
    waiting = create(client, waiting_parent, unique("w"), qr_request(waiting_parent))
    waiting_name = waiting.result(timeout=30).name
    served_parent = f"projects/{project}/locations/{other}"
    served = create(client, served_parent, unique("s"), qr_request(served_parent))
    served_name = served.result(timeout=30).name
    wait_state(client, served_name, QrState.ACTIVE)
    assert client.get_queued_resource(name=waiting_name).state.state == (
        QrState.WAITING_FOR_RESOURCES
    )
    # Chips given to the empty zone admit its waiting request; the shared pool never saw it.
    emulator.admin.capacity({"v4": 4}, zone=empty)
    wait_state(client, waiting_name, QrState.ACTIVE)
    assert emulator.admin.capacity(zone=empty)["v4"] == {"total": 4, "used": 4, "free": 0}
    delete(client, waiting_name)
    assert emulator.admin.capacity(zone=empty)["v4"]["used"] == 0
    delete(client, served_name)
    events = [e for e in emulator.admin.events() if e["kind"] == "capacity"]
    assert f"{empty}: v4=0" in [e["detail"] for e in events]


def test_the_same_names_in_two_zones_are_two_queued_resources_with_vms_of_their_own(
    client: Any, tmp_path: Path
) -> None:
    project = new_project()
    first, second = unique_zone(), unique_zone()
    qr_id, node_id = unique("same"), unique("node")
    names = []
    for zone in (first, second):
        parent = f"projects/{project}/locations/{zone}"
        request = qr_request(parent, node_id=node_id, startup_script=boot_recorder(tmp_path))
        names.append(create(client, parent, qr_id, request).result(timeout=30).name)
    nodes = []
    for name in names:
        queued = wait_state(client, name, QrState.ACTIVE)
        assert queued.name.endswith(f"/queuedResources/{qr_id}")
        parent = name.split("/queuedResources/")[0]
        nodes.append(client.get_node(name=f"{parent}/nodes/{node_id}"))
        assert [qr.name for qr in client.list_queued_resources(parent=parent)] == [name]
    addresses = [node.network_endpoints[0].ip_address for node in nodes]
    assert addresses[0] != addresses[1]
    # Each booted on VMs of its own: the second one's are kept under the id and its zone.
    # (ACTIVE comes as the VMs boot, not once their startup scripts have run.)
    for key in (node_id, f"{node_id}.{second}"):
        wait_for(lambda key=key: boots(tmp_path, key) == [1], what=f"{key} to boot once")
    # Within one zone the node id stays taken.
    parent = f"projects/{project}/locations/{first}"
    with pytest.raises(Exception, match="node"):
        create(client, parent, unique("dup"), qr_request(parent, node_id=node_id))
    for name in names:
        delete(client, name)
