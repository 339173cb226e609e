"""The faults the admin service and SimulateMaintenanceEvent start, and their preconditions.

Spot preemption, capacity reclaim, hardware failure of a slice, maintenance (now or
scheduled), SSH faults, host keys missing from guest attributes or changed. Each checks its
precondition and changes what must change at once, under the lock, then leaves the slow part
to a flow (flows.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tpuctl.emulator.control import flows
from tpuctl.emulator.control.clock import rfc3339
from tpuctl.emulator.control.names import worker_indexes
from tpuctl.emulator.control.records import (
    PREEMPTIBLE_TIERS,
    Health,
    Initiator,
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
)
from tpuctl.emulator.control.runtime import Runtime
from tpuctl.emulator.control.status import ApiError, invalid, precondition

Maintenance = cloud_tpu.UpcomingMaintenance
SSH_FAULT_MODES = (None, "hang", "refuse")
HOSTKEY_FAULT_MODES = ("missing", "rotate", "none")


# Node states of a stopped (or stopping, or starting) node: reset, repair and maintenance,
# which restart every VM of the QR, wait until none is in one.
STOPPED_STATES = (NodeState.STOPPING, NodeState.STOPPED, NodeState.STARTING)


def require_running(rt: Runtime, qr: QueuedResourceRecord, action: str) -> None:
    """FAILED_PRECONDITION while a node of the QR is stopped, stopping or starting. Under the
    lock."""
    stopped = [node.name for node in rt.qr_nodes(qr) if node.state in STOPPED_STATES]
    if stopped:
        raise precondition(
            f"Cannot {action} {qr.name}: node(s) {', '.join(stopped)} stopped or stopping; "
            "start them first"
        )


# ------------------------------------------------------------------------------ preemption
def preempt(rt: Runtime, name: str) -> dict[str, Any]:
    """Spot preemption: kill at once, nodes PREEMPTED, QR SUSPENDING → SUSPENDED."""
    with rt.lock:
        qr = rt.qr(rt.resolve_qr(name))
        if qr.plan.tier not in PREEMPTIBLE_TIERS:
            raise precondition(
                f'Queued resource "{qr.name}" is {qr.plan.tier}; only spot and best-effort '
                "capacity is preempted"
            )
        if qr.state not in (QrState.PROVISIONING, QrState.ACTIVE):
            raise precondition(
                f'Queued resource "{qr.name}" is {QrState(qr.state).name}; only '
                "PROVISIONING or ACTIVE resources can be preempted"
            )
        begin_preemption(rt, qr, "admin")
        return {"queued_resource": qr.name, "state": "SUSPENDING"}


def begin_preemption(rt: Runtime, qr: QueuedResourceRecord, why: str) -> None:
    """QR SUSPENDING (by the service) now; flows.preempt does the rest. Under the lock."""
    rt.supersede(qr)
    rt.set_qr_state(qr, QrState.SUSPENDING, Initiator.SERVICE)
    rt.events.emit("preempt", qr=qr.name, detail=why)
    doomed = [node.node_id for node in rt.qr_nodes(qr) if node.in_plane]
    rt.spawn(flows.preempt, qr, doomed)


def set_capacity(
    rt: Runtime, changes: dict[str, int], zone: str | None = None, *, flex_start: bool = False
) -> dict[str, Any]:
    """Change pool sizes (with `zone`, that zone's own pools, which it then draws from alone);
    shrinking below use reclaims spot/best-effort QRs of that pool, newest first. With
    `flex_start`, flex-start's own pools: shrinking them takes nothing back (a flex-start run
    keeps its nodes until its run duration ends)."""
    pools = rt.flex_pools if flex_start else rt.pools
    with rt.lock:
        for generation, chips in changes.items():
            if generation not in rt.config.capacity or chips < 0:
                raise invalid(f"bad capacity {generation}={chips}")
            pools.set_total(generation, chips, zone)
            where = f"{zone}: " if zone else ""
            pool = "flex-start " if flex_start else ""
            rt.events.emit("capacity", detail=f"{pool}{where}{generation}={chips}")
            if not flex_start:
                _reclaim(rt, generation, zone)
        rt.cond.notify_all()
        return pools.snapshot(zone)


def _reclaim(rt: Runtime, generation: str, zone: str | None) -> None:
    """After a pool shrinks, preempt spot/best-effort holders (newest first) until it fits."""
    if rt.pools.free(generation, zone) >= 0:
        return
    victims = sorted(
        (
            qr
            for qr in rt.qrs.values()
            if qr.plan.accelerator.generation == generation
            and qr.plan.tier in PREEMPTIBLE_TIERS
            and rt.pools.holds_from(qr.name, generation, zone)
            and qr.state in (QrState.PROVISIONING, QrState.ACTIVE)
        ),
        key=lambda qr: qr.create_time,
        reverse=True,
    )
    for qr in victims:
        if rt.pools.free(generation, zone) >= 0:
            break
        begin_preemption(rt, qr, "capacity reclaimed")
        rt.release(qr)


# ------------------------------------------------------------------------ slice failure
def fail_slice(rt: Runtime, name: str, slice_index: int) -> dict[str, Any]:
    """Hardware failure of one slice: replace it (fresh disk), restart the others."""
    with rt.lock:
        qr = rt.qr(rt.resolve_qr(name))
        if qr.state != QrState.ACTIVE:
            raise precondition(
                f'Queued resource "{qr.name}" is {QrState(qr.state).name}, not ACTIVE'
            )
        nodes = rt.qr_nodes(qr)
        if not 0 <= slice_index < len(nodes):
            raise invalid(f"slice {slice_index} is out of range 0-{len(nodes) - 1}")
        require_running(rt, qr, "fail a slice of")
        failed = nodes[slice_index]
        epoch = rt.supersede(qr)
        rt.events.emit("slice.fail", qr=qr.name, node=failed.name, detail="hardware")
        for node in nodes:
            rt.set_node_state(node, NodeState.REPAIRING if node is failed else NodeState.RESTARTING)
        failed.health = Health.HEALTH_UNSPECIFIED
        rt.spawn(flows.repair, qr, epoch, failed)
        return {"queued_resource": qr.name, "node": failed.name}


# --------------------------------------------------------------------------- maintenance
def start_maintenance(rt: Runtime, node: NodeRecord, worker: int, why: str) -> None:
    """Maintenance on a READY node of an ACTIVE QR, now; flows.maintenance reboots it."""
    qr = rt.qrs.get(node.qr_name)
    if qr is None or qr.state != QrState.ACTIVE or node.state != NodeState.READY:
        raise precondition(
            f'Node "{node.name}" is {NodeState(node.state).name}; maintenance needs a READY '
            "node of an ACTIVE queued resource"
        )
    require_running(rt, qr, "start maintenance on")
    epoch = rt.supersede(qr)
    node.health = Health.UNHEALTHY_MAINTENANCE
    node.maintenance = cloud_tpu.UpcomingMaintenance(
        type_=(
            Maintenance.MaintenanceType.SCHEDULED
            if why == "scheduled"
            else Maintenance.MaintenanceType.UNSCHEDULED
        ),
        maintenance_status=Maintenance.MaintenanceStatus.ONGOING,
        window_start_time=rfc3339(rt.clock.wall()),
    )
    rt.events.emit("maintenance.start", qr=qr.name, node=node.name, worker=worker, detail=why)
    rt.events.emit("node.health", qr=qr.name, node=node.name, detail="UNHEALTHY_MAINTENANCE")
    rt.spawn(flows.maintenance, qr, epoch, node)


def schedule_maintenance(rt: Runtime, name: str, worker: int, after: float) -> dict[str, Any]:
    """Maintenance on `worker` of node `name` in `after` emulated seconds (0 = now)."""
    with rt.lock:
        node = rt.node(rt.resolve_node(name))
        worker_indexes([str(worker)], node.accelerator.vms, allow_all=False)
        if after <= 0:
            start_maintenance(rt, node, worker, "admin")
            return {"node": node.name, "worker": worker, "at": rfc3339(rt.clock.wall())}
        delay = rt.clock.scaled(after)
        start = rt.clock.wall() + timedelta(seconds=delay)
        node.maintenance = cloud_tpu.UpcomingMaintenance(
            type_=Maintenance.MaintenanceType.SCHEDULED,
            maintenance_status=Maintenance.MaintenanceStatus.PENDING,
            can_reschedule=False,
            window_start_time=rfc3339(start),
            window_end_time=rfc3339(start + timedelta(seconds=rt.clock.scaled(3600))),
        )
        rt.events.emit(
            "maintenance.scheduled", qr=node.qr_name, node=node.name, worker=worker,
            detail=rfc3339(start),
        )  # fmt: skip
        rt.spawn(_scheduled_maintenance, node, worker, delay)
        return {"node": node.name, "worker": worker, "at": rfc3339(start)}


def _scheduled_maintenance(rt: Runtime, node: NodeRecord, worker: int, delay: float) -> None:
    """The timer of a scheduled maintenance: start it then, if the node is still READY."""
    rt.plain_sleep(delay)
    with rt.lock:
        if rt.closing:
            return
        current = rt.nodes.get(node.name)
        if current is not node or node.state != NodeState.READY:
            rt.events.emit(
                "maintenance.skipped", qr=node.qr_name, node=node.name, worker=worker,
                detail=f"node is {NodeState(node.state).name}" if current else "node is gone",
            )  # fmt: skip
            return
        try:
            start_maintenance(rt, node, worker, "scheduled")
        except ApiError as error:
            rt.events.emit("maintenance.skipped", node=node.name, detail=error.message)


# ------------------------------------------------------------------------------------ SSH
def _worker_node(rt: Runtime, name: str, worker: int) -> NodeRecord:
    """The node `name`, checked to have VMs and a worker `worker`. Under the lock."""
    node = rt.node(rt.resolve_node(name))
    worker_indexes([str(worker)], node.accelerator.vms, allow_all=False)
    if not node.in_plane:
        raise precondition(f'Node "{node.name}" has no VMs yet')
    return node


def set_ssh_fault(rt: Runtime, name: str, worker: int, mode: str | None) -> dict[str, Any]:
    if mode not in SSH_FAULT_MODES:
        raise invalid(f"ssh fault mode must be hang, refuse or none, not {mode!r}")
    with rt.lock:
        node = _worker_node(rt, name, worker)
    rt.plane.set_ssh_fault(node.node_id, worker, mode)
    rt.events.emit(
        "ssh.fault", qr=node.qr_name, node=node.name, worker=worker, detail=mode or "none"
    )
    return {"node": node.name, "worker": worker, "mode": mode or "none"}


def set_hostkey_fault(rt: Runtime, name: str, worker: int, mode: str) -> dict[str, Any]:
    """What a worker's guest attributes say of its host key, and which key it has.

    `missing`: it publishes none (as when the guest agent cannot write guest attributes: the
    `compute.disableGuestAttributesAccess` policy, or a VM older than host key publishing);
    `rotate`: its SSH server gets a new host key, as a rebuilt VM does, published unless
    `missing` holds; `none`: its current key is published again.
    """
    if mode not in HOSTKEY_FAULT_MODES:
        raise invalid(f"host key fault mode must be missing, rotate or none, not {mode!r}")
    with rt.lock:
        node = _worker_node(rt, name, worker)
        if mode == "missing":
            node.unpublished_host_keys.add(worker)
        elif mode == "none":
            node.unpublished_host_keys.discard(worker)
    if mode == "rotate":
        info = rt.plane.rotate_host_key(node.node_id, worker)
        with rt.lock:
            node.workers = [info if w.worker == worker else w for w in node.workers]
    published = worker not in node.unpublished_host_keys
    rt.events.emit(
        "hostkey.fault", qr=node.qr_name, node=node.name, worker=worker,
        detail=f"{mode} (published: {'yes' if published else 'no'})",
    )  # fmt: skip
    return {"node": node.name, "worker": worker, "mode": mode, "published": published}
