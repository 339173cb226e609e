"""The flows: the work behind each action on a queued resource that takes emulated time.

Each flow is a function of the Runtime, run in its own thread by `Runtime.spawn`; the state
changes it makes are rows of transitions.py. Create runs create → await_capacity → provision;
reset, maintenance and repair all come down to `restart`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta

import grpc
from google.protobuf import empty_pb2
from google.rpc import status_pb2

from tpuctl.emulator.control.protos import (
    copy_message,
    json_timestamp,
    merge_json,
    node_extras,
    node_proto,
    qr_extras,
    qr_proto,
)
from tpuctl.emulator.control.records import (
    PREEMPTIBLE_TIERS,
    Extras,
    Health,
    Initiator,
    NodeRecord,
    NodeState,
    OperationRecord,
    QrState,
    QueuedResourceRecord,
)
from tpuctl.emulator.control.runtime import Runtime
from tpuctl.emulator.vms.metadata import COORDINATOR_PORT

log = logging.getLogger("tpuctl.emulator")
# Reservation states in which it holds no capacity any more.
RESERVATION_OVER = ("EXPIRED", "FAILED", "DEPROVISIONING")


# ---------------------------------------------------------------------------------- create
def create(rt: Runtime, qr: QueuedResourceRecord, epoch: int, operation: OperationRecord) -> None:
    with qr.flow_lock:
        if not rt.sleep(qr, epoch, rt.config.delays.creating):
            rt.operations.abandon(operation)
            return
        with rt.lock:
            if not rt.alive(qr, epoch):
                rt.operations.abandon(operation)
                return
            rt.set_qr_state(qr, QrState.WAITING_FOR_RESOURCES)
            rt.operations.finish(operation, qr_proto(qr), extras=qr_extras(qr))
        if await_capacity(rt, qr, epoch):
            provision(rt, qr, epoch)


def await_capacity(rt: Runtime, qr: QueuedResourceRecord, epoch: int) -> bool:
    """Until the QR holds its chips (True), is superseded, or fails at valid_until (False)."""
    plan = qr.plan
    dwell_end = rt.clock.monotonic() + rt.clock.scaled(rt.config.delays.waiting)
    with rt.cond:
        while True:
            if not rt.alive(qr, epoch):
                return False
            now = rt.clock.monotonic()
            pools, key, zone = rt.pool_of(qr)
            if plan.valid_until is not None and now >= plan.valid_until:
                fail(
                    rt,
                    qr,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"The queued resource could not be provisioned before its valid_until "
                    f"time: {plan.chips} {plan.accelerator.generation} chips were not "
                    f"available in {plan.zone} ({pools.free(key, zone)} free)",
                )
                return False
            ready_at = max(dwell_end, plan.valid_after)
            opens_at = _reservation_opens(rt, qr) if plan.tier == "reservation-bound" else now
            if opens_at is None:
                return False  # the reservation is gone or over: the QR failed
            ready_at = max(ready_at, opens_at)
            timeout: float | None = None
            if now >= ready_at:
                if pools.try_allocate(qr.name, key, plan.chips, zone):
                    rt.events.emit("capacity.allocate", qr=qr.name, detail=f"{key}={plan.chips}")
                    return True
            elif ready_at != float("inf"):
                timeout = ready_at - now
            if plan.valid_until is not None:
                left = plan.valid_until - now
                timeout = left if timeout is None else min(timeout, left)
            rt.cond.wait(timeout)


def _reservation_opens(rt: Runtime, qr: QueuedResourceRecord) -> float | None:
    """When the reservation of a reservation-bound QR lets it in (a monotonic instant, 0 when
    open already; its pool sized to the reservation now); None when the reservation is gone,
    expired or over, and the QR FAILED. Under the lock."""
    name = qr.plan.reservation
    record = rt.reservations.get(name)
    wall = rt.clock.wall()
    problem = ""
    if record is None:
        problem = f'the reservation "{name}" no longer exists'
    elif record.state in RESERVATION_OVER or (
        record.end_time is not None and record.end_time <= wall
    ):
        problem = f'the reservation "{name}" is over ({record.state})'
    if record is None or problem:
        fail(rt, qr, grpc.StatusCode.FAILED_PRECONDITION, f"Cannot provision: {problem}")
        return None
    rt.reserved.set_total(name, record.chips)
    if record.state != "ACTIVE":
        return float("inf")  # APPROVED or PROVISIONING: wait for it (an update wakes us)
    if record.start_time is not None and record.start_time > wall:
        return rt.clock.monotonic_at(record.start_time)
    return 0.0  # open already


def provision(rt: Runtime, qr: QueuedResourceRecord, epoch: int) -> None:
    started = rt.clock.monotonic()
    with rt.lock:
        if not rt.alive(qr, epoch):
            return
        rt.set_qr_state(qr, QrState.PROVISIONING)
        _start_run(rt, qr)
        nodes = _make_nodes(rt, qr)
    try:
        _plane_create(rt, nodes[0], None)
        coordinator = None
        if len(nodes) > 1 and nodes[0].workers:
            coordinator = f"{nodes[0].workers[0].ip}:{COORDINATOR_PORT}"
        rt.parallel(lambda node: _plane_create(rt, node, coordinator), nodes[1:])
    except Exception as error:
        log.exception("creating the VMs of %s failed", qr.name)
        with rt.lock:
            if rt.alive(qr, epoch):
                fail(rt, qr, grpc.StatusCode.INTERNAL, f"creating the VMs failed: {error}")
        return
    remaining = rt.clock.scaled(rt.config.delays.provisioning) - (rt.clock.monotonic() - started)
    if not rt.sleep(qr, epoch, remaining, scaled=True):
        return
    if not _boot(rt, qr, epoch, nodes):
        return
    with rt.lock:
        if not rt.alive(qr, epoch):
            return
        for node in nodes:
            rt.set_node_state(node, NodeState.READY, Health.HEALTHY)
        rt.set_qr_state(qr, QrState.ACTIVE)


def fail(rt: Runtime, qr: QueuedResourceRecord, code: grpc.StatusCode, message: str) -> None:
    """The QR FAILED with `code`: its error is set and its capacity released. Under the lock."""
    qr.error = status_pb2.Status(code=code.value[0], message=message)
    rt.release(qr)
    rt.set_qr_state(qr, QrState.FAILED)
    rt.events.emit("qr.failed", qr=qr.name, detail=message)


def _make_nodes(rt: Runtime, qr: QueuedResourceRecord) -> list[NodeRecord]:
    plan = qr.plan
    nodes = []
    now = rt.clock.wall()
    for index, planned in enumerate(plan.nodes):
        node = NodeRecord(
            name=qr.node_names[index],
            node_id=_plane_key(rt, planned.node_id, plan.zone, plan.project),
            parent=plan.parent,
            qr_name=qr.name,
            slice_index=index,
            num_slices=len(plan.nodes),
            template=copy_message(planned.template),
            accelerator=plan.accelerator,
            preemptible=plan.tier in PREEMPTIBLE_TIERS,
            tier=plan.tier,
            numeric_id=random.getrandbits(62),
            create_time=now,
            extras=_node_extras(qr.extras, planned.spec_index),
            termination_time=qr.termination_time,
        )
        rt.nodes[node.name] = node
        rt.events.emit("node.state", qr=qr.name, node=node.name, detail="CREATING")
        nodes.append(node)
    return nodes


def _plane_key(rt: Runtime, node_id: str, zone: str, project: str) -> str:
    """The key of a node's VMs in the worker plane (and their folder under vms/): its node id,
    or, while another zone or project holds VMs under that id, the id qualified with the zone
    (then the project). Node ids are unique only within a zone, the plane's keys everywhere.
    Under the lock."""
    taken = {node.node_id for node in rt.nodes.values()}
    for key in (node_id, f"{node_id}.{zone}", f"{node_id}.{zone}.{project}"):
        if key not in taken:
            return key
    raise RuntimeError(f"no worker-plane key left for node {node_id}")  # same zone and project


def _plane_create(rt: Runtime, node: NodeRecord, coordinator: str | None) -> None:
    with rt.lock:
        version = node.metadata_version
        metadata = node.metadata
    identity = rt.identity(
        node_id=node.node_id,
        node_name=node.name,
        project=node.parent.split("/")[1],
        zone=node.parent.split("/")[3],
        accelerator_type=node.accelerator.accelerator_type,
        workers=node.accelerator.vms,
        slice_index=node.slice_index,
        num_slices=node.num_slices,
        preemptible=node.preemptible,
        autocheckpoint=bool(node.template.autocheckpoint_enabled),
        topology=node.accelerator.topology,
        external_ips=bool(node.template.network_config.enable_external_ips),
    )
    workers = list(rt.plane.create_node(identity, metadata, coordinator=coordinator))
    with rt.lock:
        scheduling = scheduling_metadata(node)
    if scheduling:
        rt.plane.set_scheduling(node.node_id, scheduling)
    with rt.lock:
        node.workers = sorted(workers, key=lambda w: w.worker)
        node.in_plane = True
        stale = node.metadata_version != version
        metadata = node.metadata
    if stale:  # UpdateNode changed the metadata while the VMs were being created
        rt.plane.set_metadata(node.node_id, metadata)
    rt.events.emit("node.vms", qr=node.qr_name, node=node.name, detail=f"{len(workers)} workers")


def _node_extras(extras: Extras, spec_index: int) -> Extras:
    """The REST-only fields of the node template of node_spec `spec_index`."""
    specs = extras.get("tpu", {}).get("nodeSpec", [])
    if spec_index < len(specs):
        node: Extras = merge_json({}, specs[spec_index].get("node", {}))
        return node
    return {}


def scheduling_metadata(node: NodeRecord) -> dict[str, str]:
    """What the node's metadata servers serve under instance/scheduling/ beyond `preemptible`:
    `termination-time` (RFC 3339) when the service will take the node back."""
    if node.termination_time is None:
        return {}
    return {"termination-time": json_timestamp(node.termination_time)}


# ------------------------------------------------------------------ the end of a run
def _start_run(rt: Runtime, qr: QueuedResourceRecord) -> None:
    """Provisioning starts: fix the end of the run duration (real time: the duration ÷ the
    speed, from now) and watch for the end. Under the lock."""
    plan = qr.plan
    if plan.max_run_duration is not None:
        seconds = rt.clock.scaled(plan.max_run_duration)
        qr.run_end = rt.clock.wall() + timedelta(seconds=seconds)
    qr.termination_time = termination_time(rt, qr)
    if qr.termination_time is not None or plan.tier == "reservation-bound":
        rt.spawn(run_out, qr)


def termination_time(rt: Runtime, qr: QueuedResourceRecord) -> datetime | None:
    """When the service takes the QR's nodes back: the end of its run duration, or of its
    reservation's window for a reservation-bound QR, whichever comes first. Under the lock."""
    ends = [qr.run_end] if qr.run_end is not None else []
    if qr.plan.tier == "reservation-bound":
        record = rt.reservations.get(qr.plan.reservation)
        if record is None or record.state in RESERVATION_OVER:
            ends.append(rt.clock.wall())  # removed or ended by its owner: now
        elif record.end_time is not None:
            ends.append(record.end_time)
    return min(ends) if ends else None


def run_out(rt: Runtime, qr: QueuedResourceRecord) -> None:
    """Wait for the QR's termination time (it may move: a reservation's window can change),
    then take its nodes back: QR SUSPENDING (initiator SERVICE), nodes DELETING, every VM shut
    down and deleted, QR SUSPENDED. Ends early once the QR is no longer PROVISIONING/ACTIVE."""
    with rt.cond:
        while True:
            if rt.closing or rt.qrs.get(qr.name) is not qr:
                return
            if qr.state not in (QrState.PROVISIONING, QrState.ACTIVE):
                return
            end = qr.termination_time
            left = None if end is None else rt.clock.monotonic_at(end) - rt.clock.monotonic()
            if left is not None and left <= 0:
                _end_run(rt, qr)
                return
            rt.cond.wait(left)


def _end_run(rt: Runtime, qr: QueuedResourceRecord) -> None:
    """The service takes the nodes back now. Under the lock."""
    rt.supersede(qr)
    rt.set_qr_state(qr, QrState.SUSPENDING, Initiator.SERVICE)
    why = "run duration" if qr.termination_time == qr.run_end else "reservation ended"
    rt.events.emit("run.end", qr=qr.name, detail=why)
    nodes = rt.qr_nodes(qr)
    for node in nodes:
        rt.set_node_state(node, NodeState.DELETING)
    rt.spawn(take_back, qr, nodes)


def take_back(rt: Runtime, qr: QueuedResourceRecord, nodes: list[NodeRecord]) -> None:
    """Shut every VM down as a deleted VM is (SIGTERM, the shutdown timeout, then SIGKILL),
    delete the nodes, then the QR is SUSPENDED by the service and its chips released."""
    rt.parallel(lambda node: _plane_stop(rt, node, 0.0), nodes)
    with qr.flow_lock:
        rt.parallel(lambda node: _plane_delete(rt, node), nodes)
        rt.plain_sleep(rt.clock.scaled(rt.config.delays.deleting))
        with rt.lock:
            for node in nodes:
                if rt.nodes.get(node.name) is node:
                    del rt.nodes[node.name]
                    rt.events.emit("node.deleted", qr=qr.name, node=node.name)
            if rt.qrs.get(qr.name) is qr and qr.state == QrState.SUSPENDING:
                rt.set_qr_state(qr, QrState.SUSPENDED, Initiator.SERVICE)
                rt.release(qr)


def retime(rt: Runtime, qr: QueuedResourceRecord) -> list[tuple[str, dict[str, str]]]:
    """Recompute a running QR's termination time (its reservation changed): the nodes whose
    metadata must change, as (plane key, scheduling metadata). Under the lock."""
    if qr.state not in (QrState.PROVISIONING, QrState.ACTIVE):
        return []
    end = termination_time(rt, qr)
    if end == qr.termination_time:
        return []
    qr.termination_time = end
    changed = []
    for node in rt.qr_nodes(qr):
        node.termination_time = end
        if node.in_plane:
            changed.append((node.node_id, scheduling_metadata(node)))
    rt.events.emit("run.retime", qr=qr.name, detail=json_timestamp(end) if end else "none")
    rt.cond.notify_all()
    return changed


# ---------------------------------------------------------------------------------- delete
def delete(
    rt: Runtime, qr: QueuedResourceRecord, operation: OperationRecord, doomed: list[str]
) -> None:
    rt.parallel(lambda node_id: rt.plane.stop_node(node_id, None), doomed)
    with qr.flow_lock:
        with rt.lock:
            nodes = rt.qr_nodes(qr)
        rt.parallel(lambda node: _plane_delete(rt, node), nodes)
        rt.plain_sleep(rt.clock.scaled(rt.config.delays.deleting))
        with rt.lock:
            for node in nodes:
                rt.nodes.pop(node.name, None)
                rt.events.emit("node.deleted", qr=qr.name, node=node.name)
            rt.release(qr)
            rt.qrs.pop(qr.name, None)
            rt.events.emit("qr.deleted", qr=qr.name)
            rt.operations.finish(operation, empty_pb2.Empty())


def delete_node(
    rt: Runtime, node: NodeRecord, qr: QueuedResourceRecord | None, operation: OperationRecord
) -> None:
    """Delete one node; with `qr` (it was PROVISIONING or ACTIVE) the QR loses its resources:
    its other nodes stop and it is SUSPENDED by the user (state_initiator USER)."""
    if node.in_plane:
        rt.plane.stop_node(node.node_id, None)
    lock = qr.flow_lock if qr is not None else threading.Lock()
    with lock:
        _plane_delete(rt, node)
        rt.plain_sleep(rt.clock.scaled(rt.config.delays.deleting))
        with rt.lock:
            rt.nodes.pop(node.name, None)
            rt.events.emit("node.deleted", qr=node.qr_name, node=node.name)
            others = rt.qr_nodes(qr)
        if qr is not None:
            rt.parallel(lambda other: _plane_stop(rt, other, None), others)
            with rt.lock:
                for other in others:
                    # A sibling being deleted too (another DeleteNode, or the QR) stays
                    # DELETING: no node leaves DELETING (transitions.NODE_TRANSITIONS).
                    if other.state != NodeState.DELETING:
                        rt.set_node_state(other, NodeState.STOPPED)
            rt.plain_sleep(rt.clock.scaled(rt.config.delays.suspending))
            with rt.lock:
                if qr.state == QrState.SUSPENDING:
                    rt.set_qr_state(qr, QrState.SUSPENDED, Initiator.USER)
                    rt.release(qr)
        with rt.lock:
            rt.operations.finish(operation, empty_pb2.Empty())


# -------------------------------------------------------------------------- stop, start
def stop(
    rt: Runtime, qr: QueuedResourceRecord, epoch: int, node: NodeRecord, operation: OperationRecord
) -> None:
    """StopNode: the node's VMs shut down as a stopped VM does (SIGTERM, the shutdown
    timeout, SIGKILL; disks kept), then STOPPED. The QR keeps its chips."""
    try:
        with qr.flow_lock:
            if not rt.sleep(qr, epoch, 0.0):
                return
            _plane_stop(rt, node, 0.0)
            if not rt.sleep(qr, epoch, rt.config.delays.stopping):
                return
            with rt.lock:
                if not rt.alive(qr, epoch) or node.state != NodeState.STOPPING:
                    return
                rt.set_node_state(node, NodeState.STOPPED, Health.HEALTH_UNSPECIFIED)
                rt.operations.finish(operation, node_proto(node), extras=node_extras(node))
    finally:
        rt.operations.abandon(operation)


def start(
    rt: Runtime, qr: QueuedResourceRecord, epoch: int, node: NodeRecord, operation: OperationRecord
) -> None:
    """StartNode: after the start delay the node's VMs boot (its startup script runs), READY."""
    try:
        with qr.flow_lock:
            if not rt.sleep(qr, epoch, rt.config.delays.starting):
                return
            if not _boot(rt, qr, epoch, [node]):
                return
            with rt.lock:
                if not rt.alive(qr, epoch) or node.state != NodeState.STARTING:
                    return
                rt.set_node_state(node, NodeState.READY, Health.HEALTHY)
                rt.operations.finish(operation, node_proto(node), extras=node_extras(node))
    finally:
        rt.operations.abandon(operation)


# ------------------------------------------------------------ reset, maintenance, repair
def reset(rt: Runtime, qr: QueuedResourceRecord, epoch: int, operation: OperationRecord) -> None:
    try:
        with qr.flow_lock:
            if not restart(rt, qr, epoch, delay=rt.config.delays.reset, why="reset", grace=None):
                return
            with rt.lock:
                rt.operations.finish(operation, qr_proto(qr), extras=qr_extras(qr))
    finally:
        with rt.lock:
            rt.operations.abandon(operation)


def restart(
    rt: Runtime,
    qr: QueuedResourceRecord,
    epoch: int,
    *,
    delay: float,
    why: str,
    grace: float | None,
    down: Iterable[NodeRecord] = (),
) -> bool:
    """Stop every VM of the QR (with `grace`), wait `delay`, boot all; False if superseded.

    The nodes in `down` keep the state their fault gave them (REPAIRING, or READY and
    UNHEALTHY_MAINTENANCE) instead of RESTARTING."""
    with rt.lock:
        if not rt.alive(qr, epoch):
            return False
        nodes = rt.qr_nodes(qr)
        keep = {node.name for node in down}
        for node in nodes:
            if node.name not in keep:
                rt.set_node_state(node, NodeState.RESTARTING)
    rt.parallel(lambda node: _plane_stop(rt, node, grace), nodes)
    if not rt.sleep(qr, epoch, delay):
        return False
    if not _boot(rt, qr, epoch, nodes):
        return False
    with rt.lock:
        if not rt.alive(qr, epoch):
            return False
        for node in nodes:
            node.maintenance = None
            rt.set_node_state(node, NodeState.READY, Health.HEALTHY)
        rt.events.emit("qr.restarted", qr=qr.name, detail=why)
    return True


def maintenance(rt: Runtime, qr: QueuedResourceRecord, epoch: int, node: NodeRecord) -> None:
    with qr.flow_lock:
        grace = rt.clock.scaled(rt.config.grace) if node.template.autocheckpoint_enabled else None
        detail = (
            "no autocheckpoint: kill"
            if grace is None
            else f"SIGTERM to the TPU program, grace {grace:.3g}s"
        )
        rt.events.emit("maintenance.stop", qr=qr.name, node=node.name, detail=detail)
        if restart(
            rt,
            qr,
            epoch,
            delay=rt.config.delays.reboot,
            why="maintenance",
            grace=grace,
            down=[node],
        ):
            rt.events.emit("maintenance.end", qr=qr.name, node=node.name)


def repair(rt: Runtime, qr: QueuedResourceRecord, epoch: int, failed: NodeRecord) -> None:
    with qr.flow_lock:
        with rt.lock:
            if not rt.alive(qr, epoch):
                return
            nodes = rt.qr_nodes(qr)
        rt.parallel(lambda node: _plane_stop(rt, node, None), nodes)
        if failed.in_plane:
            rt.plane.replace_disk(failed.node_id)
        rt.events.emit("slice.replaced", qr=qr.name, node=failed.name, detail="fresh disk")
        if restart(
            rt, qr, epoch, delay=rt.config.delays.repair, why="repair", grace=None, down=[failed]
        ):
            rt.events.emit("slice.repaired", qr=qr.name, node=failed.name)


# --------------------------------------------------------------------------------- preempt
def preempt(rt: Runtime, qr: QueuedResourceRecord, doomed: list[str]) -> None:
    """Kill the VMs of a SUSPENDING QR, nodes PREEMPTED, then the QR SUSPENDED by the service."""
    rt.parallel(lambda node_id: rt.plane.stop_node(node_id, None), doomed)
    with qr.flow_lock:
        with rt.lock:
            if qr.state != QrState.SUSPENDING:
                return
            nodes = rt.qr_nodes(qr)
        rt.parallel(lambda node: _plane_stop(rt, node, None), nodes)
        with rt.lock:
            for node in nodes:
                if node.state != NodeState.DELETING:
                    rt.set_node_state(node, NodeState.PREEMPTED)
        rt.plain_sleep(rt.clock.scaled(rt.config.delays.suspending))
        with rt.lock:
            if qr.state == QrState.SUSPENDING:
                rt.set_qr_state(qr, QrState.SUSPENDED, Initiator.SERVICE)
                rt.release(qr)


# -------------------------------------------------------------------------- worker plane
def _plane_stop(rt: Runtime, node: NodeRecord, grace: float | None) -> None:
    """A hard stop (`grace` None), or a maintenance one: the TPU program gets SIGTERM and up to
    `grace` to let go of the chips, then the VM shuts down gracefully."""
    if node.in_plane:
        shutdown = rt.clock.scaled(rt.config.shutdown) if grace is not None else 0.0
        rt.plane.stop_node(node.node_id, grace, shutdown)


def _plane_delete(rt: Runtime, node: NodeRecord) -> None:
    with rt.lock:
        present = node.in_plane
        node.in_plane = False
    if present:
        rt.plane.delete_node(node.node_id)


def _boot(rt: Runtime, qr: QueuedResourceRecord, epoch: int, nodes: list[NodeRecord]) -> bool:
    """Boot every VM of `nodes` (runs their startup scripts); False if superseded first."""
    with rt.lock:
        if not rt.alive(qr, epoch):
            return False

    def boot(node: NodeRecord) -> None:
        if node.in_plane:
            rt.plane.boot(node.node_id)
            rt.events.emit("node.boot", qr=qr.name, node=node.name)

    rt.parallel(boot, nodes)
    return True
