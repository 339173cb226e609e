"""Scale: 64 slices × v4-128 (16 VMs each) = 1,024 workers in one emulator.

How long it takes is scripts/bench/emulator.py's to measure (target: within a minute)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.emulator.helpers import (
    QrState,
    create,
    delete,
    new_project,
    parent_of,
    qr_request,
    rest,
    wait_state,
)
from tpuctl.emulator.client.testing import EmulatorProcess

# It measures no time (scripts/bench/emulator.py does): it runs beside the other tests.
pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def test_1024_workers_reach_active(emulator: EmulatorProcess) -> None:
    client: Any = emulator.tpu_client()
    parent = parent_of(new_project())
    request = qr_request(
        parent, accelerator_type="v4-128", node_count=64, prefix="big", startup_script="true"
    )
    name = create(client, parent, "big", request).result(timeout=60).name
    wait_state(client, name, QrState.ACTIVE, timeout=180)
    nodes = list(client.list_nodes(parent=parent))
    assert len(nodes) == 64
    assert sum(len(node.network_endpoints) for node in nodes) == 1024
    ips = {e.ip_address for node in nodes for e in node.network_endpoints}
    assert len(ips) == 1024
    assert emulator.admin.status()["workers"] >= 1024
    # The REST face lists the same 64 nodes and 1,024 workers.
    status, listed = rest(emulator.rest_endpoint, "GET", f"{parent}/nodes", pageSize=100)
    assert status == 200 and len(listed["nodes"]) == 64
    endpoints = {e["ipAddress"] for node in listed["nodes"] for e in node["networkEndpoints"]}
    assert endpoints == ips
    delete(client, name, wait=True)
