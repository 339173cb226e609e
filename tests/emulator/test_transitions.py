"""The state-transition tables (tpuctl/emulator/control/transitions.py): the setters refuse
every change no row lists, each row names code that exists, and driving every flow and fault
through in-process emulators makes exactly the changes the tables list: none outside them, and
every row reached by some flow."""

from __future__ import annotations

import datetime
import json
import logging
import re
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.cloud import tpu_v2alpha1
from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport
from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.emulator.fake_plane import FakeIdentity, FakeWorkerPlane
from tests.emulator.helpers import create, new_project, parent_of, qr_request, unique
from tpuctl.emulator.api.server import Emulator
from tpuctl.emulator.client.admin import AdminClient
from tpuctl.emulator.control import faults, flows, transitions
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.config import Delays, EmulatorConfig
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.records import (
    Health,
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
)
from tpuctl.emulator.control.state import CloudTpu
from tpuctl.emulator.control.transitions import (
    NODE_TRANSITIONS,
    QR_TRANSITIONS,
    IllegalTransition,
    Transition,
)
from tpuctl.emulator.control.validation import CreatePlan
from tpuctl.topology import parse_accelerator

# It starts emulators of its own (servers, worker VMs): an emulator test.
pytestmark = pytest.mark.emulator

SPEED = 50.0
FOREVER = 3600.0  # emulated seconds: 72 s real at SPEED, longer than any wait here
TIMEOUT = 30.0

Pair = tuple[int, int]


def _pairs(rows: tuple[Transition, ...]) -> set[Pair]:
    return {(row.source, row.target) for row in rows}


def _qr_names(pairs: set[Pair]) -> list[str]:
    return sorted(f"{QrState(a).name} -> {QrState(b).name}" for a, b in pairs)


def _node_names(pairs: set[Pair]) -> list[str]:
    return sorted(f"{NodeState(a).name} -> {NodeState(b).name}" for a, b in pairs)


# ------------------------------------------------------------------------------ the tables
def test_rows_are_unique_and_deleting_is_final() -> None:
    for rows in (QR_TRANSITIONS, NODE_TRANSITIONS):
        assert len(_pairs(rows)) == len(rows)
    assert not [row for row in QR_TRANSITIONS if row.source == QrState.DELETING]
    assert not [row for row in NODE_TRANSITIONS if row.source == NodeState.DELETING]
    for final in (QrState.FAILED, QrState.SUSPENDED):
        assert {row.target for row in QR_TRANSITIONS if row.source == final} == {QrState.DELETING}


def test_each_row_names_code_that_exists() -> None:
    modules: dict[str, Any] = {"flows": flows, "faults": faults, "state": CloudTpu}
    for row in (*QR_TRANSITIONS, *NODE_TRANSITIONS):
        named = re.findall(r"\b(flows|faults|state)\.([a-z_]+)", row.why)
        assert named, f"{row} names no code"
        for module, function in named:
            assert callable(getattr(modules[module], function, None)), f"{module}.{function}"


# ----------------------------------------------------------------------------- the setters
def _qr_record(state: int) -> QueuedResourceRecord:
    plan = CreatePlan(
        parent="projects/p/locations/z",
        project="p",
        zone="z",
        qr_id="qr",
        accelerator=parse_accelerator("v4-8"),
        nodes=(),
        tier="spot",
        valid_until=None,
        valid_after=0.0,
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    record = QueuedResourceRecord(
        plan=plan, spec=cloud_tpu.QueuedResource(), node_names=[], create_time=now
    )
    record.state = state
    return record


def _node_record(state: int) -> NodeRecord:
    return NodeRecord(
        name="projects/p/locations/z/nodes/n",
        node_id="n",
        parent="projects/p/locations/z",
        qr_name="projects/p/locations/z/queuedResources/qr",
        slice_index=0,
        num_slices=1,
        template=cloud_tpu.Node(),
        accelerator=parse_accelerator("v4-8"),
        preemptible=True,
        tier="spot",
        numeric_id=1,
        create_time=datetime.datetime.now(datetime.timezone.utc),
        state=state,
    )


def test_qr_setter_applies_each_row_and_refuses_everything_else() -> None:
    legal = _pairs(QR_TRANSITIONS)
    for source in QrState:
        for target in QrState:
            events = EventLog(Clock())
            qr = _qr_record(source)
            if (source, target) in legal:
                transitions.set_qr_state(qr, target, events)
                assert qr.state == target
                assert [(e.kind, e.detail) for e in events.since()] == [
                    ("qr.state", QrState(target).name)
                ]
                continue
            with pytest.raises(IllegalTransition, match=QrState(target).name):
                transitions.set_qr_state(qr, target, events)
            assert qr.state == source, "an illegal change must leave the record as it was"
            assert events.since() == []


def test_node_setter_applies_each_row_and_refuses_everything_else() -> None:
    legal = _pairs(NODE_TRANSITIONS)
    for source in NodeState:
        for target in NodeState:
            events = EventLog(Clock())
            node = _node_record(source)
            if source == target or (source, target) in legal:
                transitions.set_node_state(node, target, events)
                assert node.state == target
                expected = [] if source == target else [("node.state", NodeState(target).name)]
                assert [(e.kind, e.detail) for e in events.since()] == expected
                continue
            with pytest.raises(IllegalTransition, match=NodeState(target).name):
                transitions.set_node_state(node, target, events, health=Health.HEALTHY)
            assert node.state == source, "an illegal change must leave the record as it was"
            assert node.health == Health.HEALTH_UNSPECIFIED
            assert events.since() == []


def test_a_node_staying_in_its_state_may_change_health_silently() -> None:
    events = EventLog(Clock())
    node = _node_record(NodeState.READY)
    transitions.set_node_state(node, NodeState.READY, events, Health.HEALTHY)
    assert node.health == Health.HEALTHY
    assert events.since() == []


# ------------------------------------------------------------------ the flows, for real
class _FailingPlane(FakeWorkerPlane):
    """A worker plane that cannot create VMs: provisioning fails."""

    def create_node(
        self, identity: Any, metadata: dict[str, str], *, coordinator: str | None
    ) -> list[Any]:
        raise RuntimeError("no VMs today")


@dataclass
class Cloud:
    """One in-process emulator, driven through its real gRPC API and admin service."""

    client: Any
    admin: AdminClient
    parent: str
    flow_errors: list[str]  # what failed flows logged: an IllegalTransition shows up here
    rest: str  # the REST API's endpoint

    def create(self, **request: Any) -> str:
        """Create a QR (qr_request's arguments); its nodes are `node(qr, 0)`, `node(qr, 1)`…"""
        qr_id = unique("qr")
        if request.get("node_count"):
            request["prefix"] = qr_id
        else:
            request["node_id"] = f"{qr_id}-0"
        create(self.client, self.parent, qr_id, qr_request(self.parent, **request))
        return f"{self.parent}/queuedResources/{qr_id}"

    def node(self, qr: str, index: int) -> str:
        return f"{self.parent}/nodes/{qr.rsplit('/', 1)[1]}-{index}"

    def wait(self, kind: str, detail: str, *, qr: str = "", node: str = "", since: int = 0) -> None:
        """Until the event log holds `kind` with `detail` for `qr` or `node` from event `since`
        on (no polling: the admin Events call long-polls)."""

        def matches(event: dict[str, Any]) -> bool:
            subject = event["node"] if node else event["qr"]
            return event["kind"] == kind and event["detail"] == detail and subject == (node or qr)

        try:
            self.admin.wait_for_event(matches, since=since, timeout=TIMEOUT)
        except TimeoutError:
            raise AssertionError(
                f"no {kind} {detail} event for {node or qr}; flow errors: {self.flow_errors}"
            ) from None

    def wait_qr(self, qr: str, state: str) -> None:
        self.wait("qr.state", state, qr=qr)

    def wait_node(self, node: str, state: str, since: int = 0) -> None:
        self.wait("node.state", state, node=node, since=since)

    def mark(self) -> int:
        """The number of the next event, for waits on what happens from now on."""
        return len(self.events())

    def events(self) -> list[dict[str, Any]]:
        return self.admin.events(0)

    def create_rest(self, fields: dict[str, Any]) -> str:
        """Create a single-node v4-8 QR through the REST API with `fields` (REST-only ones
        included); its node is `node(qr, 0)`."""
        qr_id = unique("qr")
        body = {
            **fields,
            "tpu": {
                "nodeSpec": [
                    {
                        "parent": self.parent,
                        "nodeId": f"{qr_id}-0",
                        "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-vm-v4-base"},
                    }
                ]
            },
        }
        url = f"{self.rest}v2alpha1/{self.parent}/queuedResources?queuedResourceId={qr_id}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            assert response.status == 200
        return f"{self.parent}/queuedResources/{qr_id}"

    def delete(self, qr: str, *, force: bool = True, gone: bool = True) -> None:
        self.client.delete_queued_resource(request={"name": qr, "force": force})
        if gone:
            self.wait("qr.deleted", "", qr=qr)


@contextmanager
def _cloud(
    delays: Delays | None = None,
    plane: FakeWorkerPlane | None = None,
    capacity: dict[str, int] | None = None,
) -> Iterator[Cloud]:
    config = EmulatorConfig(speed=SPEED, delays=delays or Delays())
    if capacity:
        config.capacity.update(capacity)
    errors = _FlowErrors()
    logger = logging.getLogger("tpuctl.emulator")
    logger.addHandler(errors)
    emulator = Emulator(config, plane=plane or FakeWorkerPlane(), identity_factory=FakeIdentity)
    emulator.start()
    channel = grpc.insecure_channel(emulator.host)
    admin = AdminClient(emulator.host)
    try:
        client = tpu_v2alpha1.TpuClient(transport=TpuGrpcTransport(channel=channel))
        yield Cloud(
            client, admin, parent_of(new_project()), errors.messages, emulator.rest_endpoint
        )
    finally:
        admin.close()
        channel.close()
        emulator.close()
        logger.removeHandler(errors)


class _FlowErrors(logging.Handler):
    """Collects what the emulator logs at ERROR: flows run in threads that log and go on."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.messages.append(f"{record.getMessage()}: {error!r}")


def _normal(cloud: Cloud) -> None:
    # Spot: CREATING → … → ACTIVE, preempted, SUSPENDED, deleted without force.
    spot = cloud.create(tier="spot")
    cloud.wait_qr(spot, "ACTIVE")
    cloud.admin.preempt(spot)
    cloud.wait_qr(spot, "SUSPENDED")
    cloud.delete(spot, force=False)
    # Two slices: reset, slice failure, maintenance, then a deleted node suspends the QR.
    pair = cloud.create(node_count=2)
    cloud.wait_qr(pair, "ACTIVE")
    cloud.client.reset_queued_resource(name=pair).result(timeout=TIMEOUT)
    cloud.admin.fail_slice(pair, 0)
    cloud.wait("slice.repaired", "", qr=pair)
    cloud.client.simulate_maintenance_event(request={"name": cloud.node(pair, 1)})
    cloud.wait("maintenance.end", "", qr=pair)
    cloud.client.delete_node(name=cloud.node(pair, 0))
    cloud.wait_qr(pair, "SUSPENDED")
    cloud.delete(pair, force=False)
    # Deleted while ACTIVE, and while waiting for a start time hours away.
    active = cloud.create()
    cloud.wait_qr(active, "ACTIVE")
    cloud.delete(active)
    later = cloud.create(queueing_policy={"valid_after_duration": datetime.timedelta(hours=10)})
    cloud.wait_qr(later, "WAITING_FOR_RESOURCES")
    cloud.delete(later, force=False)


def _stuck_creating(cloud: Cloud) -> None:
    qr = cloud.create()
    cloud.wait_qr(qr, "CREATING")
    cloud.delete(qr)


def _stuck_provisioning(cloud: Cloud) -> None:
    # The suspending delay is FOREVER too: flows that reach it are left to the emulator's close.
    preempted = cloud.create(tier="spot")
    cloud.wait_qr(preempted, "PROVISIONING")
    cloud.admin.preempt(preempted)
    cloud.wait_node(cloud.node(preempted, 0), "PREEMPTED")
    cloud.delete(preempted, gone=False)  # from SUSPENDING
    pair = cloud.create(node_count=2)
    cloud.wait_qr(pair, "PROVISIONING")
    cloud.client.delete_node(name=cloud.node(pair, 0))
    cloud.wait_node(cloud.node(pair, 1), "STOPPED")
    deleted = cloud.create()
    cloud.wait_qr(deleted, "PROVISIONING")
    cloud.delete(deleted)


def _failing(cloud: Cloud) -> None:
    broken = cloud.create()
    cloud.wait_qr(broken, "FAILED")  # from PROVISIONING: the plane could not create the VMs
    cloud.delete(broken, force=False)
    policy = {"valid_until_duration": datetime.timedelta(seconds=2)}
    late = cloud.create(accelerator_type="v2-8", queueing_policy=policy)
    cloud.wait_qr(late, "FAILED")  # from WAITING_FOR_RESOURCES: the v2 pool is empty
    cloud.delete(late, force=False)


def _faults_during_restarts(cloud: Cloud) -> None:
    # Resets and repairs take FOREVER, so each fault lands while the previous one runs.
    first = cloud.create(tier="spot", node_count=2)
    cloud.wait_qr(first, "ACTIVE")
    cloud.client.reset_queued_resource(name=first)
    cloud.wait_node(cloud.node(first, 1), "RESTARTING")
    cloud.admin.fail_slice(first, 0)  # slice 0: RESTARTING → REPAIRING
    cloud.admin.fail_slice(first, 1)  # slice 1 likewise; slice 0 REPAIRING → RESTARTING
    cloud.admin.preempt(first)  # both PREEMPTED, from RESTARTING and from REPAIRING
    cloud.wait_node(cloud.node(first, 0), "PREEMPTED")
    cloud.wait_node(cloud.node(first, 1), "PREEMPTED")
    cloud.wait_qr(first, "SUSPENDED")
    cloud.delete(first, force=False)
    for deleted, stopped in ((1, 0), (0, 1)):
        qr = cloud.create(node_count=2)
        cloud.wait_qr(qr, "ACTIVE")
        cloud.admin.fail_slice(qr, 0)  # slice 0 REPAIRING, slice 1 RESTARTING
        cloud.client.delete_node(name=cloud.node(qr, deleted))
        cloud.wait_node(cloud.node(qr, stopped), "STOPPED")
        cloud.wait_qr(qr, "SUSPENDED")
        cloud.delete(qr, force=False)


def _stop_and_start(cloud: Cloud) -> None:
    pair = cloud.create(tier="spot", node_count=2)
    cloud.wait_qr(pair, "ACTIVE")
    first = cloud.node(pair, 0)
    cloud.client.stop_node(request={"name": first})
    cloud.wait_node(first, "STOPPED")
    since = cloud.mark()
    cloud.client.start_node(request={"name": first})
    cloud.wait_node(first, "READY", since)
    since = cloud.mark()
    cloud.client.stop_node(request={"name": first})
    cloud.wait_node(first, "STOPPED", since)
    cloud.admin.preempt(pair)  # a stopped node is PREEMPTED with its QR
    cloud.wait_node(first, "PREEMPTED")
    cloud.wait_qr(pair, "SUSPENDED")
    cloud.delete(pair, force=False)
    # A reservation-bound QR whose reservation ends: its nodes are taken back.
    reservation = f"{cloud.parent}/reservations/{unique('r')}"
    cloud.admin.reservation(reservation, chips=4, generation="v4")
    bound = cloud.create_rest(
        {"provisioningModel": "RESERVATION_BOUND", "reservationName": reservation}
    )
    cloud.wait_qr(bound, "ACTIVE")
    cloud.admin.update_reservation(reservation, end="now")
    cloud.wait_qr(bound, "SUSPENDED")
    cloud.delete(bound, force=False)


def _stuck_stopping(cloud: Cloud) -> None:
    spot = cloud.create(tier="spot", node_count=2)
    cloud.wait_qr(spot, "ACTIVE")
    cloud.client.stop_node(request={"name": cloud.node(spot, 0)})
    cloud.wait_node(cloud.node(spot, 0), "STOPPING")
    cloud.admin.preempt(spot)
    cloud.wait_node(cloud.node(spot, 0), "PREEMPTED")
    cloud.wait_qr(spot, "SUSPENDED")
    cloud.delete(spot, force=False)
    single = cloud.create()
    cloud.wait_qr(single, "ACTIVE")
    cloud.client.stop_node(request={"name": cloud.node(single, 0)})
    cloud.wait_node(cloud.node(single, 0), "STOPPING")
    cloud.delete(single)


def _stuck_starting(cloud: Cloud) -> None:
    for then in ("preempt", "delete a sibling", "delete the QR"):
        qr = cloud.create(tier="spot", node_count=2)
        cloud.wait_qr(qr, "ACTIVE")
        first = cloud.node(qr, 0)
        cloud.client.stop_node(request={"name": first})
        cloud.wait_node(first, "STOPPED")
        cloud.client.start_node(request={"name": first})
        cloud.wait_node(first, "STARTING")
        if then == "preempt":
            cloud.admin.preempt(qr)
            cloud.wait_node(first, "PREEMPTED")
        elif then == "delete a sibling":
            since = cloud.mark()
            cloud.client.delete_node(name=cloud.node(qr, 1))
            cloud.wait_node(first, "STOPPED", since)
        if then != "delete the QR":
            cloud.wait_qr(qr, "SUSPENDED")
        cloud.delete(qr)


@pytest.fixture(scope="module")
def observed() -> tuple[set[Pair], set[Pair]]:
    """Every (from, to) state change the emulators' event logs show, for QRs and for nodes."""
    runs: list[tuple[Callable[[Cloud], None], dict[str, Any]]] = [
        (_normal, {}),
        (_stuck_creating, {"delays": Delays(creating=FOREVER)}),
        (_stuck_provisioning, {"delays": Delays(provisioning=FOREVER, suspending=FOREVER)}),
        (_failing, {"plane": _FailingPlane(), "capacity": {"v2": 0}}),
        (_faults_during_restarts, {"delays": Delays(reset=FOREVER, repair=FOREVER)}),
        (_stop_and_start, {}),
        (_stuck_stopping, {"delays": Delays(stopping=FOREVER)}),
        (_stuck_starting, {"delays": Delays(starting=FOREVER)}),
    ]
    qr_pairs: set[Pair] = set()
    node_pairs: set[Pair] = set()
    for scenario, options in runs:
        with _cloud(**options) as cloud:
            scenario(cloud)
            log = cloud.events()
        # A flow that raised (an IllegalTransition, say) must not go unnoticed.
        assert [e for e in cloud.flow_errors if e.startswith("emulator flow")] == []
        qr_pairs |= _changes(log, "qr.state", "qr", QrState)
        node_pairs |= _changes(log, "node.state", "node", NodeState)
    return qr_pairs, node_pairs


def _changes(log: list[dict[str, Any]], kind: str, subject: str, states: Any) -> set[Pair]:
    """Consecutive states of each QR or node in the event log, as (from, to) pairs."""
    last: dict[str, int] = {}
    pairs: set[Pair] = set()
    for event in log:
        if event["kind"] != kind:
            continue
        state = int(states[event["detail"]])
        previous = last.get(event[subject])
        if previous is not None:
            pairs.add((previous, state))
        last[event[subject]] = state
    return pairs


def test_the_flows_change_qr_states_exactly_as_the_table_lists(
    observed: tuple[set[Pair], set[Pair]],
) -> None:
    seen, table = observed[0], _pairs(QR_TRANSITIONS)
    assert _qr_names(seen - table) == [], "changes the flows made that no row lists"
    assert _qr_names(table - seen) == [], "rows no flow reached"


def test_the_flows_change_node_states_exactly_as_the_table_lists(
    observed: tuple[set[Pair], set[Pair]],
) -> None:
    seen, table = observed[1], _pairs(NODE_TRANSITIONS)
    assert _node_names(seen - table) == [], "changes the flows made that no row lists"
    assert _node_names(table - seen) == [], "rows no flow reached"
