"""Reservation-bound and flex-start queued resources in an in-process emulator (a fake worker
plane, 50x speed): the reservation's window admits and ends them, its end moves their
termination time and their workers' metadata, and flex-start's pool is its own."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.emulator.fake_plane import FakeIdentity, FakeWorkerPlane
from tests.emulator.helpers import QrState, new_project, parent_of, rest, rest_qr, unique
from tests.emulator.helpers import wait_state as wait_grpc_state
from tpuctl.emulator.api.server import Emulator
from tpuctl.emulator.client.admin import AdminClient
from tpuctl.emulator.control.config import EmulatorConfig

pytestmark = pytest.mark.emulator

SPEED = 50.0
Initiator = cloud_tpu.QueuedResourceState.StateInitiator


@dataclass
class Cloud:
    emulator: Emulator
    plane: FakeWorkerPlane
    admin: AdminClient
    client: Any
    parent: str

    def create(self, **fields: Any) -> tuple[str, str]:
        """A single-node QR made over REST with `fields`: (its name, its node's name)."""
        node_id, qr_id = unique("n"), unique("q")
        body = rest_qr(self.parent, node_id, **fields)
        status, answer = rest(
            self.emulator.rest_endpoint,
            "POST",
            f"{self.parent}/queuedResources",
            body,
            queuedResourceId=qr_id,
        )
        assert status == 200, answer
        return f"{self.parent}/queuedResources/{qr_id}", f"{self.parent}/nodes/{node_id}"

    def wait(self, name: str, state: int) -> Any:
        return wait_grpc_state(self.client, name, state)

    def get(self, name: str) -> dict[str, Any]:
        status, answer = rest(self.emulator.rest_endpoint, "GET", name)
        assert status == 200, answer
        return answer

    def scheduling(self, node: str) -> dict[str, str]:
        """What the node's workers serve under instance/scheduling/ (the fake plane's copy)."""
        node_id = node.rsplit("/", 1)[1]
        return dict(self.plane.nodes[node_id].scheduling)


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    import grpc
    from google.cloud import tpu_v2alpha1
    from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport

    plane = FakeWorkerPlane()
    emulator = Emulator(EmulatorConfig(speed=SPEED), plane=plane, identity_factory=FakeIdentity)
    emulator.start()
    channel = grpc.insecure_channel(emulator.host)
    admin = AdminClient(emulator.host)
    try:
        client = tpu_v2alpha1.TpuClient(transport=TpuGrpcTransport(channel=channel))
        yield Cloud(emulator, plane, admin, client, parent_of(new_project()))
    finally:
        admin.close()
        channel.close()
        emulator.close()


def _when(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_reservation_bound_waits_for_the_window_and_ends_with_it(cloud: Cloud) -> None:
    reservation = f"{cloud.parent}/reservations/{unique('cal')}"
    # Its window opens in 100 emulated seconds (2 s real) and ends in two hours.
    [made] = cloud.admin.reservation(
        reservation, chips=4, generation="v5e", start="+100s", end="+2h"
    )
    fields = {"provisioningModel": "RESERVATION_BOUND", "reservationName": reservation}
    name, node = cloud.create(**fields)
    cloud.wait(name, QrState.WAITING_FOR_RESOURCES)
    opens = _when(made["start_time"])
    cloud.wait(name, QrState.ACTIVE)
    assert datetime.datetime.now(datetime.timezone.utc) >= opens
    # It holds the reservation's chips, and ends with the reservation's window.
    [listed] = cloud.client.list_reservations(request={"parent": cloud.parent}).reservations
    assert listed.standard.usage.total == 4
    end = cloud.get(name)["runDuration"]["terminationTime"]
    assert _when(end) == _when(made["end_time"])
    assert cloud.get(node)["schedulingConfig"]["terminationTimestamp"] == end
    assert cloud.scheduling(node) == {"termination-time": end}
    # A second one does not fit (4 chips, all held).
    second, _ = cloud.create(**fields)
    cloud.wait(second, QrState.WAITING_FOR_RESOURCES)

    # Ending the reservation now takes the nodes back; the second one fails: the window is over.
    cloud.admin.update_reservation(reservation, end="now")
    suspended = cloud.wait(name, QrState.SUSPENDED)
    assert suspended.state.state_initiator == Initiator.SERVICE
    with pytest.raises(exceptions.NotFound):
        cloud.client.get_node(name=node)
    failed = cloud.wait(second, QrState.FAILED)
    assert "is over" in failed.state.failed_data.error.message
    [listed] = cloud.client.list_reservations(request={"parent": cloud.parent}).reservations
    assert listed.state == cloud_tpu.Reservation.State.EXPIRED


def test_a_moved_window_end_moves_the_termination_time(cloud: Cloud) -> None:
    reservation = f"{cloud.parent}/reservations/{unique('cal')}"
    cloud.admin.reservation(reservation, chips=4, generation="v5e")  # open ended
    name, node = cloud.create(provisioningModel="RESERVATION_BOUND", reservationName=reservation)
    cloud.wait(name, QrState.ACTIVE)
    assert "runDuration" not in cloud.get(name) and cloud.scheduling(node) == {}
    cloud.admin.update_reservation(reservation, end="+3h")
    end = cloud.get(name)["runDuration"]["terminationTime"]
    assert cloud.scheduling(node) == {"termination-time": end}
    cloud.admin.update_reservation(reservation, end=None)  # open ended again
    assert "runDuration" not in cloud.get(name) and cloud.scheduling(node) == {}
    assert cloud.client.get_queued_resource(name=name).state.state == QrState.ACTIVE


def test_a_reservation_removed_under_a_waiting_qr_fails_it(cloud: Cloud) -> None:
    reservation = f"{cloud.parent}/reservations/{unique('cal')}"
    cloud.admin.reservation(reservation, chips=4, generation="v5e", start="+10h")
    name, _ = cloud.create(provisioningModel="RESERVATION_BOUND", reservationName=reservation)
    cloud.wait(name, QrState.WAITING_FOR_RESOURCES)
    cloud.admin.reservation(reservation, remove=True)
    failed = cloud.wait(name, QrState.FAILED)
    assert "no longer exists" in failed.state.failed_data.error.message
    # And a reservation of another generation is refused at once.
    other = f"{cloud.parent}/reservations/{unique('v4')}"
    cloud.admin.reservation(other, chips=8, generation="v4")
    body = rest_qr(cloud.parent, unique("n"), provisioningModel="RESERVATION_BOUND")
    body["reservationName"] = other
    status, answer = rest(
        cloud.emulator.rest_endpoint,
        "POST",
        f"{cloud.parent}/queuedResources",
        body,
        queuedResourceId=unique("q"),
    )
    assert status == 400 and "v4 chips, not v5e" in answer["error"]["message"]


def test_flex_start_pool_is_its_own_and_its_run_ends(cloud: Cloud) -> None:
    cloud.admin.capacity({"v5e": 0})  # the standard pool is empty: flex-start does not mind
    name, node = cloud.create(
        provisioningModel="FLEX_START", runDuration={"maxRunDuration": "600s"}
    )
    cloud.wait(name, QrState.ACTIVE)
    assert cloud.admin.capacity(flex_start=True)["v5e"]["used"] == 4
    end = cloud.get(name)["runDuration"]["terminationTime"]
    assert cloud.scheduling(node) == {"termination-time": end}
    node_id = node.rsplit("/", 1)[1]
    cloud.wait(name, QrState.SUSPENDED)  # 600 s ÷ 50: 12 s real
    assert node_id in cloud.plane.deleted
    assert cloud.plane.nodes.get(node_id) is None
    assert cloud.admin.capacity(flex_start=True)["v5e"]["used"] == 0
    events = [e["kind"] for e in cloud.admin.events() if e["qr"] == name]
    assert events.index("run.end") < events.index("capacity.release")
