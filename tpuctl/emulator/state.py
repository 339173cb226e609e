"""The emulated Cloud TPU service: queued resources, nodes, operations, their state machine,
capacity pools and faults. Thread-safe; service.py maps it onto gRPC.

Concurrency model: one lock (`_lock`) guards every record. Work that takes time (delays, the
worker plane) runs in a "flow" thread per action; flows on one queued resource are serialised by
its `flow_lock`, and an action that supersedes the running one (delete, preempt, reset,
maintenance, slice failure) bumps the QR's `epoch` so the old flow stops at its next step.
Delete and preempt kill the VMs at once, before waiting for the flow lock, so they never wait
out a maintenance grace.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

from tpuctl.emulator.capacity import CapacityPools
from tpuctl.emulator.clock import Clock, rfc3339
from tpuctl.emulator.config import EmulatorConfig
from tpuctl.emulator.events import EventLog
from tpuctl.emulator.metadata import COORDINATOR_PORT
from tpuctl.emulator.names import parent_matches, parse_child, parse_parent
from tpuctl.emulator.plane import WorkerInfoLike, WorkerPlaneAPI
from tpuctl.emulator.status import ApiError, already_exists, invalid, not_found, precondition
from tpuctl.emulator.validation import CreatePlan, validate_create
from tpuctl.topology import Accelerator

log = logging.getLogger("tpuctl.emulator")

QrState = cloud_tpu.QueuedResourceState.State
Initiator = cloud_tpu.QueuedResourceState.StateInitiator
NodeState = cloud_tpu.Node.State
Health = cloud_tpu.Node.Health
Maintenance = cloud_tpu.UpcomingMaintenance

TPU_RUNTIME_PORT = 8470  # NetworkEndpoint.port on Cloud TPU
DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000
UPDATABLE_NODE_FIELDS = ("metadata", "labels", "tags", "description")
# A QR in these states may be deleted without force even when it still has nodes.
DELETABLE_WITHOUT_FORCE = (QrState.ACCEPTED, QrState.FAILED, QrState.SUSPENDED)
PREEMPTIBLE_TIERS = ("spot", "best-effort")
_STATE_DATA = {
    QrState.CREATING: "creating_data",
    QrState.ACCEPTED: "accepted_data",
    QrState.PROVISIONING: "provisioning_data",
    QrState.DELETING: "deleting_data",
    QrState.ACTIVE: "active_data",
    QrState.SUSPENDING: "suspending_data",
    QrState.SUSPENDED: "suspended_data",
}

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class OperationRecord:
    name: str
    target: str
    verb: str
    create_time: datetime
    end_time: datetime | None = None
    done: bool = False
    response: Message | None = None
    error: status_pb2.Status | None = None
    cancel_requested: bool = False
    status_detail: str = ""

    def to_proto(self) -> operations_pb2.Operation:
        metadata = cloud_tpu.OperationMetadata(
            create_time=self.create_time,
            target=self.target,
            verb=self.verb,
            status_detail=self.status_detail,
            cancel_requested=self.cancel_requested,
            api_version="v2alpha1",
        )
        if self.end_time is not None:
            metadata.end_time = self.end_time
        operation = operations_pb2.Operation(name=self.name, done=self.done)
        operation.metadata.Pack(cloud_tpu.OperationMetadata.pb(metadata))
        if self.done and self.error is not None:
            operation.error.CopyFrom(self.error)
        elif self.done and self.response is not None:
            operation.response.Pack(self.response)
        return operation


@dataclass
class NodeRecord:
    name: str
    node_id: str
    parent: str
    qr_name: str
    slice_index: int
    num_slices: int
    template: cloud_tpu.Node  # as sent; metadata, labels, tags, description updated in place
    accelerator: Accelerator
    preemptible: bool
    tier: str
    numeric_id: int
    create_time: datetime
    state: int = NodeState.CREATING
    health: int = Health.HEALTH_UNSPECIFIED
    workers: list[WorkerInfoLike] = field(default_factory=list)
    in_plane: bool = False  # the worker plane holds its VMs
    metadata_version: int = 0
    maintenance: cloud_tpu.UpcomingMaintenance | None = None

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.template.metadata)


@dataclass
class QueuedResourceRecord:
    plan: CreatePlan
    spec: cloud_tpu.QueuedResource  # as sent, with name and create_time set
    node_names: list[str]
    create_time: datetime
    state: int = QrState.CREATING
    initiator: int = Initiator.STATE_INITIATOR_UNSPECIFIED
    error: status_pb2.Status | None = None
    epoch: int = 0
    delete_operation: str | None = None
    flow_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.plan.name


def _copy(message: T) -> T:
    kind: Any = type(message)
    return kind.deserialize(kind.serialize(message))  # type: ignore[no-any-return]


def _page(items: list[T], page_size: int, page_token: str) -> tuple[list[T], str]:
    if page_size < 0:
        raise invalid("page_size must not be negative")
    try:
        start = int(page_token) if page_token else 0
    except ValueError:
        raise invalid(f'Invalid page_token "{page_token}"') from None
    if start < 0 or start > len(items):
        raise invalid(f'Invalid page_token "{page_token}"')
    size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


class CloudTpu:
    """Everything behind the Tpu and Operations services, plus the admin faults."""

    def __init__(
        self,
        config: EmulatorConfig,
        plane: WorkerPlaneAPI,
        events: EventLog,
        clock: Clock,
        identity_factory: Callable[..., Any],
    ) -> None:
        self.config = config
        self._plane = plane
        self._events = events
        self._clock = clock
        self._identity = identity_factory
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pools = CapacityPools(config.capacity)
        self._qrs: dict[str, QueuedResourceRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._operations: dict[str, OperationRecord] = {}
        self._requests: dict[tuple[str, str], str] = {}  # (verb, request_id) -> operation
        self._threads: set[threading.Thread] = set()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tpu-plane")
        self._closing = False
        self._op_counter = itertools.count(1)

    # ----------------------------------------------------------------- queued resources
    def create_queued_resource(
        self, request: cloud_tpu.CreateQueuedResourceRequest
    ) -> operations_pb2.Operation:
        with self._lock:
            replay = self._replay("create", request.request_id)
            if replay is not None:
                return replay
            plan = validate_create(request, self._clock)
            if plan.name in self._qrs:
                raise already_exists("queuedResource", plan.name)
            for node in plan.nodes:
                if self._node_id_taken(node.node_id):
                    raise already_exists("node", f"{plan.parent}/nodes/{node.node_id}")
            now = self._clock.wall()
            spec = _copy(request.queued_resource)
            spec.name = plan.name
            spec.create_time = now
            record = QueuedResourceRecord(
                plan=plan,
                spec=spec,
                node_names=[f"{plan.parent}/nodes/{node.node_id}" for node in plan.nodes],
                create_time=now,
            )
            self._qrs[plan.name] = record
            operation = self._new_operation(plan.parent, plan.name, "create", request.request_id)
            self._events.emit(
                "qr.create",
                qr=plan.name,
                detail=f"{len(plan.nodes)} x {plan.accelerator.accelerator_type} {plan.tier}",
            )
            self._events.emit("qr.state", qr=plan.name, detail="CREATING")
            self._spawn(self._create_flow, record, record.epoch, operation)
            return operation.to_proto()

    def get_queued_resource(self, name: str) -> cloud_tpu.QueuedResource:
        with self._lock:
            return self._qr_proto(self._qr(name))

    def list_queued_resources(
        self, parent: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListQueuedResourcesResponse:
        parse_parent(parent)
        with self._lock:
            records = sorted(
                (r for r in self._qrs.values() if parent_matches(parent, r.plan.parent)),
                key=lambda r: r.name,
            )
            page, token = _page(records, page_size, page_token)
            return cloud_tpu.ListQueuedResourcesResponse(
                queued_resources=[self._qr_proto(r) for r in page], next_page_token=token
            )

    def delete_queued_resource(
        self, name: str, force: bool, request_id: str
    ) -> operations_pb2.Operation:
        with self._lock:
            replay = self._replay("delete", request_id)
            if replay is not None:
                return replay
            qr = self._qr(name)
            if qr.state == QrState.DELETING and qr.delete_operation:
                return self._operations[qr.delete_operation].to_proto()
            nodes = self._qr_nodes(qr)
            if nodes and not force and qr.state not in DELETABLE_WITHOUT_FORCE:
                raise precondition(
                    f'Queued resource "{name}" has {len(nodes)} node(s) in state '
                    f"{QrState(qr.state).name}; delete them first or set force=true"
                )
            parent = qr.plan.parent
            operation = self._new_operation(parent, name, "delete", request_id)
            qr.delete_operation = operation.name
            self._supersede(qr)
            self._set_qr_state(qr, QrState.DELETING)
            for node in nodes:
                self._set_node_state(node, NodeState.DELETING)
            doomed = [node.node_id for node in nodes if node.in_plane]
            self._spawn(self._delete_flow, qr, operation, doomed)
            return operation.to_proto()

    def reset_queued_resource(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            qr = self._qr(name)
            if qr.state != QrState.ACTIVE:
                raise precondition(
                    f'Queued resource "{name}" is {QrState(qr.state).name}; only an ACTIVE '
                    "queued resource can be reset"
                )
            operation = self._new_operation(qr.plan.parent, name, "reset", "")
            epoch = self._supersede(qr)
            self._events.emit("qr.reset", qr=name)
            self._spawn(self._reset_flow, qr, epoch, operation)
            return operation.to_proto()

    # ----------------------------------------------------------------------------- nodes
    def get_node(self, name: str) -> cloud_tpu.Node:
        with self._lock:
            return self._node_proto(self._node(name))

    def list_nodes(
        self, parent: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListNodesResponse:
        parse_parent(parent)
        with self._lock:
            records = sorted(
                (n for n in self._nodes.values() if parent_matches(parent, n.parent)),
                key=lambda n: n.name,
            )
            page, token = _page(records, page_size, page_token)
            return cloud_tpu.ListNodesResponse(
                nodes=[self._node_proto(n) for n in page], next_page_token=token
            )

    def update_node(self, request: cloud_tpu.UpdateNodeRequest) -> operations_pb2.Operation:
        paths = list(request.update_mask.paths) if "update_mask" in request else []
        if not paths:
            raise invalid("update_mask is required")
        unknown = [p for p in paths if p not in UPDATABLE_NODE_FIELDS]
        if unknown:
            raise invalid(
                f"update_mask field(s) {', '.join(unknown)} cannot be updated; updatable: "
                + ", ".join(UPDATABLE_NODE_FIELDS)
            )
        with self._lock:
            node = self._node(request.node.name)
            if node.state == NodeState.DELETING:
                raise precondition(f'Node "{node.name}" is being deleted')
            sent = request.node
            if "metadata" in paths:
                node.template.metadata.clear()
                node.template.metadata.update(dict(sent.metadata))
                node.metadata_version += 1
            if "labels" in paths:
                node.template.labels.clear()
                node.template.labels.update(dict(sent.labels))
            if "tags" in paths:
                del node.template.tags[:]
                node.template.tags.extend(list(sent.tags))
            if "description" in paths:
                node.template.description = sent.description
            operation = self._new_operation(node.parent, node.name, "update", "")
            push = node.in_plane and "metadata" in paths
            metadata = node.metadata
            self._events.emit("node.update", node=node.name, detail=",".join(paths))
        if push:
            self._plane.set_metadata(node.node_id, metadata)
        with self._lock:
            self._finish(operation, self._node_proto(node))
            return operation.to_proto()

    def delete_node(self, name: str, request_id: str) -> operations_pb2.Operation:
        with self._lock:
            replay = self._replay("delete-node", request_id)
            if replay is not None:
                return replay
            node = self._node(name)
            if node.state == NodeState.DELETING:
                raise precondition(f'Node "{name}" is already being deleted')
            qr = self._qrs.get(node.qr_name)
            operation = self._new_operation(node.parent, name, "delete", request_id)
            self._set_node_state(node, NodeState.DELETING)
            suspend = qr is not None and qr.state in (QrState.PROVISIONING, QrState.ACTIVE)
            if qr is not None and suspend:
                self._supersede(qr)
                self._set_qr_state(qr, QrState.SUSPENDING, Initiator.USER)
            self._spawn(self._delete_node_flow, node, qr if suspend else None, operation)
            return operation.to_proto()

    def get_guest_attributes(
        self, name: str, query_path: str, worker_ids: list[str]
    ) -> cloud_tpu.GetGuestAttributesResponse:
        with self._lock:
            node = self._node(name)
            workers = list(node.workers)
            count = node.accelerator.vms
        selected = self._worker_indexes(worker_ids, count, allow_all=True)
        by_index = {w.worker: w for w in workers}
        namespace, _, key = query_path.strip("/").partition("/")
        result = []
        for index in selected:
            items = []
            worker = by_index.get(index)
            if worker is not None and worker.host_key:
                algorithm, _, blob = worker.host_key.partition(" ")
                blob = blob.split(" ")[0]
                matches = namespace in ("", "hostkeys") and key in ("", algorithm)
                if matches:
                    items.append(
                        cloud_tpu.GuestAttributesEntry(
                            namespace="hostkeys", key=algorithm, value=blob
                        )
                    )
            result.append(
                cloud_tpu.GuestAttributes(
                    query_path=query_path,
                    query_value=cloud_tpu.GuestAttributesValue(items=items),
                )
            )
        return cloud_tpu.GetGuestAttributesResponse(guest_attributes=result)

    def simulate_maintenance_event(
        self, name: str, worker_ids: list[str]
    ) -> operations_pb2.Operation:
        with self._lock:
            node = self._node(name)
            workers = self._worker_indexes(worker_ids, node.accelerator.vms, allow_all=False)
            worker = workers[0] if workers else 0
            operation = self._new_operation(node.parent, name, "simulateMaintenanceEvent", "")
            self._start_maintenance(node, worker, "simulated")
            self._finish(operation, self._node_proto(node))
            return operation.to_proto()

    # ------------------------------------------------------------------------ operations
    def get_operation(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            return self._operation(name).to_proto()

    def list_operations(
        self, name: str, page_size: int, page_token: str
    ) -> operations_pb2.ListOperationsResponse:
        parse_parent(name)
        with self._lock:
            records = [
                op
                for op in self._operations.values()
                if parent_matches(name, op.name.rsplit("/operations/", 1)[0])
            ]
            page, token = _page(records, page_size, page_token)
            return operations_pb2.ListOperationsResponse(
                operations=[op.to_proto() for op in page], next_page_token=token
            )

    def delete_operation(self, name: str) -> None:
        with self._lock:
            self._operation(name)
            del self._operations[name]

    def cancel_operation(self, name: str) -> None:
        # Like Cloud TPU, cancellation is best effort: the flag is recorded, the work goes on.
        with self._lock:
            self._operation(name).cancel_requested = True

    # ----------------------------------------------------------------- admin (faults)
    def preempt(self, name: str) -> dict[str, Any]:
        """Spot preemption: kill at once, nodes PREEMPTED, QR SUSPENDING → SUSPENDED."""
        with self._lock:
            qr = self._qr(self.resolve_qr(name))
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
            self._preempt_locked(qr, "admin")
            return {"queued_resource": qr.name, "state": "SUSPENDING"}

    def fail_slice(self, name: str, slice_index: int) -> dict[str, Any]:
        """Hardware failure of one slice: replace it (fresh disk), restart the others."""
        with self._lock:
            qr = self._qr(self.resolve_qr(name))
            if qr.state != QrState.ACTIVE:
                raise precondition(
                    f'Queued resource "{qr.name}" is {QrState(qr.state).name}, not ACTIVE'
                )
            nodes = self._qr_nodes(qr)
            if not 0 <= slice_index < len(nodes):
                raise invalid(f"slice {slice_index} is out of range 0-{len(nodes) - 1}")
            failed = nodes[slice_index]
            epoch = self._supersede(qr)
            self._events.emit("slice.fail", qr=qr.name, node=failed.name, detail="hardware")
            for node in nodes:
                self._set_node_state(
                    node, NodeState.REPAIRING if node is failed else NodeState.RESTARTING
                )
            failed.health = Health.HEALTH_UNSPECIFIED
            self._spawn(self._repair_flow, qr, epoch, failed)
            return {"queued_resource": qr.name, "node": failed.name}

    def schedule_maintenance(self, name: str, worker: int, after: float) -> dict[str, Any]:
        """Maintenance on `worker` of node `name` in `after` emulated seconds (0 = now)."""
        with self._lock:
            node = self._node(self.resolve_node(name))
            self._worker_indexes([str(worker)], node.accelerator.vms, allow_all=False)
            if after <= 0:
                self._start_maintenance(node, worker, "admin")
                return {"node": node.name, "worker": worker, "at": rfc3339(self._clock.wall())}
            delay = self._clock.scaled(after)
            start = self._clock.wall() + timedelta(seconds=delay)
            node.maintenance = cloud_tpu.UpcomingMaintenance(
                type_=Maintenance.MaintenanceType.SCHEDULED,
                maintenance_status=Maintenance.MaintenanceStatus.PENDING,
                can_reschedule=False,
                window_start_time=rfc3339(start),
                window_end_time=rfc3339(start + timedelta(seconds=self._clock.scaled(3600))),
            )
            self._events.emit(
                "maintenance.scheduled", qr=node.qr_name, node=node.name, worker=worker,
                detail=rfc3339(start),
            )  # fmt: skip
            self._spawn(self._scheduled_maintenance, node, worker, delay)
            return {"node": node.name, "worker": worker, "at": rfc3339(start)}

    def set_ssh_fault(self, name: str, worker: int, mode: str | None) -> dict[str, Any]:
        if mode not in (None, "hang", "refuse"):
            raise invalid(f"ssh fault mode must be hang, refuse or none, not {mode!r}")
        with self._lock:
            node = self._node(self.resolve_node(name))
            self._worker_indexes([str(worker)], node.accelerator.vms, allow_all=False)
            if not node.in_plane:
                raise precondition(f'Node "{node.name}" has no VMs yet')
        self._plane.set_ssh_fault(node.node_id, worker, mode)
        self._events.emit(
            "ssh.fault", qr=node.qr_name, node=node.name, worker=worker, detail=mode or "none"
        )
        return {"node": node.name, "worker": worker, "mode": mode or "none"}

    def set_capacity(self, changes: dict[str, int]) -> dict[str, Any]:
        """Change pool sizes; shrinking below use reclaims spot/best-effort QRs, newest first."""
        with self._lock:
            for generation, chips in changes.items():
                if generation not in self.config.capacity or chips < 0:
                    raise invalid(f"bad capacity {generation}={chips}")
                self._pools.set_total(generation, chips)
                self._events.emit("capacity", detail=f"{generation}={chips}")
                self._reclaim(generation)
            self._cond.notify_all()
            return self._pools.snapshot()

    def capacity(self) -> dict[str, Any]:
        with self._lock:
            return self._pools.snapshot()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "speed": self._clock.speed,
                "capacity": self._pools.snapshot(),
                "queued_resources": [
                    {
                        "name": qr.name,
                        "state": QrState(qr.state).name,
                        "tier": qr.plan.tier,
                        "accelerator_type": qr.plan.accelerator.accelerator_type,
                        "nodes": len(qr.node_names),
                    }
                    for qr in sorted(self._qrs.values(), key=lambda r: r.name)
                ],
                "nodes": len(self._nodes),
                "workers": sum(len(node.workers) for node in self._nodes.values()),
                "operations": len(self._operations),
            }

    def resolve_qr(self, name: str) -> str:
        """A full QR name, or a bare id when it names exactly one QR."""
        return self._resolve(name, self._qrs, "queuedResources")

    def resolve_node(self, name: str) -> str:
        return self._resolve(name, self._nodes, "nodes")

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = self._clock.monotonic() + 5.0  # then the worker plane kills what is left
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - self._clock.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ============================================================================ flows
    def _create_flow(
        self, qr: QueuedResourceRecord, epoch: int, operation: OperationRecord
    ) -> None:
        with qr.flow_lock:
            if not self._sleep(qr, epoch, self.config.delays.creating):
                self._abandon(operation)
                return
            with self._lock:
                if not self._alive(qr, epoch):
                    self._abandon(operation)
                    return
                self._set_qr_state(qr, QrState.WAITING_FOR_RESOURCES)
                self._finish(operation, self._qr_proto(qr))
            if self._await_capacity(qr, epoch):
                self._provision(qr, epoch)

    def _await_capacity(self, qr: QueuedResourceRecord, epoch: int) -> bool:
        plan = qr.plan
        dwell_end = self._clock.monotonic() + self._clock.scaled(self.config.delays.waiting)
        with self._cond:
            while True:
                if not self._alive(qr, epoch):
                    return False
                now = self._clock.monotonic()
                if plan.valid_until is not None and now >= plan.valid_until:
                    self._fail(
                        qr,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"The queued resource could not be provisioned before its valid_until "
                        f"time: {plan.chips} {plan.accelerator.generation} chips were not "
                        f"available in {plan.zone} "
                        f"({self._pools.free(plan.accelerator.generation)} free)",
                    )
                    return False
                ready_at = max(dwell_end, plan.valid_after)
                timeout: float | None = None
                if now >= ready_at:
                    generation = plan.accelerator.generation
                    if self._pools.try_allocate(qr.name, generation, plan.chips):
                        self._events.emit(
                            "capacity.allocate", qr=qr.name, detail=f"{generation}={plan.chips}"
                        )
                        return True
                else:
                    timeout = ready_at - now
                if plan.valid_until is not None:
                    left = plan.valid_until - now
                    timeout = left if timeout is None else min(timeout, left)
                self._cond.wait(timeout)

    def _provision(self, qr: QueuedResourceRecord, epoch: int) -> None:
        started = self._clock.monotonic()
        with self._lock:
            if not self._alive(qr, epoch):
                return
            self._set_qr_state(qr, QrState.PROVISIONING)
            nodes = self._make_nodes(qr)
        try:
            self._plane_create(nodes[0], None)
            coordinator = None
            if len(nodes) > 1 and nodes[0].workers:
                coordinator = f"{nodes[0].workers[0].ip}:{COORDINATOR_PORT}"
            self._parallel(lambda node: self._plane_create(node, coordinator), nodes[1:])
        except Exception as error:
            log.exception("creating the VMs of %s failed", qr.name)
            with self._lock:
                if self._alive(qr, epoch):
                    self._fail(qr, grpc.StatusCode.INTERNAL, f"creating the VMs failed: {error}")
            return
        remaining = self._clock.scaled(self.config.delays.provisioning) - (
            self._clock.monotonic() - started
        )
        if not self._sleep(qr, epoch, remaining, scaled=True):
            return
        if not self._boot(qr, epoch, nodes):
            return
        with self._lock:
            if not self._alive(qr, epoch):
                return
            for node in nodes:
                self._set_node_state(node, NodeState.READY, Health.HEALTHY)
            self._set_qr_state(qr, QrState.ACTIVE)

    def _delete_flow(
        self, qr: QueuedResourceRecord, operation: OperationRecord, doomed: list[str]
    ) -> None:
        self._parallel(lambda node_id: self._plane.stop_node(node_id, None), doomed)
        with qr.flow_lock:
            with self._lock:
                nodes = self._qr_nodes(qr)
            self._parallel(self._plane_delete, nodes)
            self._plain_sleep(self._clock.scaled(self.config.delays.deleting))
            with self._lock:
                for node in nodes:
                    self._nodes.pop(node.name, None)
                    self._events.emit("node.deleted", qr=qr.name, node=node.name)
                self._release(qr)
                self._qrs.pop(qr.name, None)
                self._events.emit("qr.deleted", qr=qr.name)
                self._finish(operation, empty_pb2.Empty())

    def _delete_node_flow(
        self, node: NodeRecord, qr: QueuedResourceRecord | None, operation: OperationRecord
    ) -> None:
        if node.in_plane:
            self._plane.stop_node(node.node_id, None)
        lock = qr.flow_lock if qr is not None else threading.Lock()
        with lock:
            self._plane_delete(node)
            self._plain_sleep(self._clock.scaled(self.config.delays.deleting))
            with self._lock:
                self._nodes.pop(node.name, None)
                self._events.emit("node.deleted", qr=node.qr_name, node=node.name)
                others = [n for n in self._qr_nodes(qr)] if qr is not None else []
            if qr is not None:
                # The QR loses its resources: the user suspended it (state_initiator USER).
                self._parallel(lambda n: self._plane_stop(n, None), others)
                with self._lock:
                    for other in others:
                        self._set_node_state(other, NodeState.STOPPED)
                self._plain_sleep(self._clock.scaled(self.config.delays.suspending))
                with self._lock:
                    if qr.state == QrState.SUSPENDING:
                        self._set_qr_state(qr, QrState.SUSPENDED, Initiator.USER)
                        self._release(qr)
            with self._lock:
                self._finish(operation, empty_pb2.Empty())

    def _reset_flow(self, qr: QueuedResourceRecord, epoch: int, operation: OperationRecord) -> None:
        try:
            with qr.flow_lock:
                if not self._restart(
                    qr, epoch, delay=self.config.delays.reset, why="reset", grace=None
                ):
                    return
                with self._lock:
                    self._finish(operation, self._qr_proto(qr))
        finally:
            with self._lock:
                self._abandon(operation)

    def _restart(
        self,
        qr: QueuedResourceRecord,
        epoch: int,
        *,
        delay: float,
        why: str,
        grace: float | None,
        down: Iterable[NodeRecord] = (),
    ) -> bool:
        """Stop every VM of the QR (with `grace`), wait `delay`, boot all; False if superseded."""
        with self._lock:
            if not self._alive(qr, epoch):
                return False
            nodes = self._qr_nodes(qr)
            keep = {node.name for node in down}
            for node in nodes:
                if node.name not in keep:
                    self._set_node_state(node, NodeState.RESTARTING)
        self._parallel(lambda node: self._plane_stop(node, grace), nodes)
        if not self._sleep(qr, epoch, delay):
            return False
        if not self._boot(qr, epoch, nodes):
            return False
        with self._lock:
            if not self._alive(qr, epoch):
                return False
            for node in nodes:
                node.maintenance = None
                self._set_node_state(node, NodeState.READY, Health.HEALTHY)
            self._events.emit("qr.restarted", qr=qr.name, detail=why)
        return True

    def _maintenance_flow(self, qr: QueuedResourceRecord, epoch: int, node: NodeRecord) -> None:
        with qr.flow_lock:
            grace = (
                self._clock.scaled(self.config.grace)
                if node.template.autocheckpoint_enabled
                else None
            )
            detail = "no autocheckpoint: kill" if grace is None else f"SIGTERM, grace {grace:.3g}s"
            self._events.emit("maintenance.stop", qr=qr.name, node=node.name, detail=detail)
            if self._restart(
                qr,
                epoch,
                delay=self.config.delays.reboot,
                why="maintenance",
                grace=grace,
                down=[node],
            ):
                self._events.emit("maintenance.end", qr=qr.name, node=node.name)

    def _repair_flow(self, qr: QueuedResourceRecord, epoch: int, failed: NodeRecord) -> None:
        with qr.flow_lock:
            with self._lock:
                if not self._alive(qr, epoch):
                    return
                nodes = self._qr_nodes(qr)
            self._parallel(lambda node: self._plane_stop(node, None), nodes)
            if failed.in_plane:
                self._plane.replace_disk(failed.node_id)
            self._events.emit("slice.replaced", qr=qr.name, node=failed.name, detail="fresh disk")
            if self._restart(
                qr, epoch, delay=self.config.delays.repair, why="repair", grace=None, down=[failed]
            ):
                self._events.emit("slice.repaired", qr=qr.name, node=failed.name)

    def _preempt_flow(self, qr: QueuedResourceRecord, doomed: list[str]) -> None:
        self._parallel(lambda node_id: self._plane.stop_node(node_id, None), doomed)
        with qr.flow_lock:
            with self._lock:
                if qr.state != QrState.SUSPENDING:
                    return
                nodes = self._qr_nodes(qr)
            self._parallel(lambda node: self._plane_stop(node, None), nodes)
            with self._lock:
                for node in nodes:
                    if node.state != NodeState.DELETING:
                        self._set_node_state(node, NodeState.PREEMPTED)
            self._plain_sleep(self._clock.scaled(self.config.delays.suspending))
            with self._lock:
                if qr.state == QrState.SUSPENDING:
                    self._set_qr_state(qr, QrState.SUSPENDED, Initiator.SERVICE)
                    self._release(qr)

    def _scheduled_maintenance(self, node: NodeRecord, worker: int, delay: float) -> None:
        self._plain_sleep(delay)
        with self._lock:
            if self._closing:
                return
            current = self._nodes.get(node.name)
            if current is not node or node.state != NodeState.READY:
                self._events.emit(
                    "maintenance.skipped", qr=node.qr_name, node=node.name, worker=worker,
                    detail=f"node is {NodeState(node.state).name}" if current else "node is gone",
                )  # fmt: skip
                return
            try:
                self._start_maintenance(node, worker, "scheduled")
            except ApiError as error:
                self._events.emit("maintenance.skipped", node=node.name, detail=error.message)

    # ==================================================================== flow helpers
    def _start_maintenance(self, node: NodeRecord, worker: int, why: str) -> None:
        qr = self._qrs.get(node.qr_name)
        if qr is None or qr.state != QrState.ACTIVE or node.state != NodeState.READY:
            raise precondition(
                f'Node "{node.name}" is {NodeState(node.state).name}; maintenance needs a READY '
                "node of an ACTIVE queued resource"
            )
        epoch = self._supersede(qr)
        node.health = Health.UNHEALTHY_MAINTENANCE
        node.maintenance = cloud_tpu.UpcomingMaintenance(
            type_=(
                Maintenance.MaintenanceType.SCHEDULED
                if why == "scheduled"
                else Maintenance.MaintenanceType.UNSCHEDULED
            ),
            maintenance_status=Maintenance.MaintenanceStatus.ONGOING,
            window_start_time=rfc3339(self._clock.wall()),
        )
        self._events.emit(
            "maintenance.start", qr=qr.name, node=node.name, worker=worker, detail=why
        )
        self._events.emit("node.health", qr=qr.name, node=node.name, detail="UNHEALTHY_MAINTENANCE")
        self._spawn(self._maintenance_flow, qr, epoch, node)

    def _preempt_locked(self, qr: QueuedResourceRecord, why: str) -> None:
        self._supersede(qr)
        self._set_qr_state(qr, QrState.SUSPENDING, Initiator.SERVICE)
        self._events.emit("preempt", qr=qr.name, detail=why)
        doomed = [node.node_id for node in self._qr_nodes(qr) if node.in_plane]
        self._spawn(self._preempt_flow, qr, doomed)

    def _reclaim(self, generation: str) -> None:
        """After a pool shrinks, preempt spot/best-effort holders (newest first) until it fits."""
        if self._pools.free(generation) >= 0:
            return
        victims = sorted(
            (
                qr
                for qr in self._qrs.values()
                if qr.plan.accelerator.generation == generation
                and qr.plan.tier in PREEMPTIBLE_TIERS
                and self._pools.holds(qr.name)
                and qr.state in (QrState.PROVISIONING, QrState.ACTIVE)
            ),
            key=lambda qr: qr.create_time,
            reverse=True,
        )
        for qr in victims:
            if self._pools.free(generation) >= 0:
                break
            self._preempt_locked(qr, "capacity reclaimed")
            self._release(qr)

    def _make_nodes(self, qr: QueuedResourceRecord) -> list[NodeRecord]:
        plan = qr.plan
        nodes = []
        now = self._clock.wall()
        for index, planned in enumerate(plan.nodes):
            node = NodeRecord(
                name=qr.node_names[index],
                node_id=planned.node_id,
                parent=plan.parent,
                qr_name=qr.name,
                slice_index=index,
                num_slices=len(plan.nodes),
                template=_copy(planned.template),
                accelerator=plan.accelerator,
                preemptible=plan.tier in PREEMPTIBLE_TIERS,
                tier=plan.tier,
                numeric_id=random.getrandbits(62),
                create_time=now,
            )
            self._nodes[node.name] = node
            self._events.emit("node.state", qr=qr.name, node=node.name, detail="CREATING")
            nodes.append(node)
        return nodes

    def _plane_create(self, node: NodeRecord, coordinator: str | None) -> None:
        with self._lock:
            version = node.metadata_version
            metadata = node.metadata
        identity = self._identity(
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
        )
        workers = list(self._plane.create_node(identity, metadata, coordinator=coordinator))
        with self._lock:
            node.workers = sorted(workers, key=lambda w: w.worker)
            node.in_plane = True
            stale = node.metadata_version != version
            metadata = node.metadata
        if stale:
            self._plane.set_metadata(node.node_id, metadata)
        self._events.emit(
            "node.vms", qr=node.qr_name, node=node.name, detail=f"{len(workers)} workers"
        )

    def _plane_stop(self, node: NodeRecord, grace: float | None) -> None:
        if node.in_plane:
            self._plane.stop_node(node.node_id, grace)

    def _plane_delete(self, node: NodeRecord) -> None:
        with self._lock:
            present = node.in_plane
            node.in_plane = False
        if present:
            self._plane.delete_node(node.node_id)

    def _boot(self, qr: QueuedResourceRecord, epoch: int, nodes: list[NodeRecord]) -> bool:
        with self._lock:
            if not self._alive(qr, epoch):
                return False

        def boot(node: NodeRecord) -> None:
            if node.in_plane:
                self._plane.boot(node.node_id)
                self._events.emit("node.boot", qr=qr.name, node=node.name)

        self._parallel(boot, nodes)
        return True

    def _parallel(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._pool.map(fn, items))

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except Exception:
                if not self._closing:  # at shutdown the worker plane goes away under flows
                    log.exception("emulator flow %s failed", target.__name__)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"flow-{target.__name__}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _alive(self, qr: QueuedResourceRecord, epoch: int) -> bool:
        return not self._closing and qr.epoch == epoch and self._qrs.get(qr.name) is qr

    def _supersede(self, qr: QueuedResourceRecord) -> int:
        qr.epoch += 1
        self._cond.notify_all()
        return qr.epoch

    def _sleep(
        self, qr: QueuedResourceRecord, epoch: int, seconds: float, *, scaled: bool = False
    ) -> bool:
        """Wait `seconds` (emulated, unless `scaled`); False as soon as the flow is superseded."""
        wait = seconds if scaled else self._clock.scaled(seconds)
        end = self._clock.monotonic() + wait
        with self._cond:
            while True:
                if not self._alive(qr, epoch):
                    return False
                left = end - self._clock.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)

    def _plain_sleep(self, seconds: float) -> None:
        end = self._clock.monotonic() + seconds
        with self._cond:
            while not self._closing:
                left = end - self._clock.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    # ================================================================ record helpers
    def _qr(self, name: str) -> QueuedResourceRecord:
        parse_child(name, "queuedResources")
        record = self._qrs.get(name)
        if record is None:
            raise not_found("queuedResource", name)
        return record

    def _node(self, name: str) -> NodeRecord:
        parse_child(name, "nodes")
        record = self._nodes.get(name)
        if record is None:
            raise not_found("node", name)
        return record

    def _operation(self, name: str) -> OperationRecord:
        parse_child(name, "operations")
        record = self._operations.get(name)
        if record is None:
            raise not_found("operation", name)
        return record

    def _qr_nodes(self, qr: QueuedResourceRecord | None) -> list[NodeRecord]:
        if qr is None:
            return []
        return [self._nodes[name] for name in qr.node_names if name in self._nodes]

    def _node_id_taken(self, node_id: str) -> bool:
        # Worker-plane keys are bare node ids, so they are unique across projects and zones here.
        if any(node.node_id == node_id for node in self._nodes.values()):
            return True
        return any(
            planned.node_id == node_id
            for qr in self._qrs.values()
            for planned in qr.plan.nodes
            if qr.state != QrState.FAILED
        )

    def _resolve(self, name: str, table: dict[str, Any], collection: str) -> str:
        if "/" in name:
            return name
        matches = [key for key in table if key.endswith(f"/{collection}/{name}")]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise not_found(collection.rstrip("s"), name)
        raise invalid(f"{name!r} is ambiguous: {', '.join(sorted(matches))}")

    def _worker_indexes(self, worker_ids: list[str], count: int, *, allow_all: bool) -> list[int]:
        if not worker_ids:
            return list(range(count)) if allow_all else []
        result = []
        for text in worker_ids:
            if not text.strip().isdigit() or int(text) >= count:
                raise invalid(f'Invalid worker id "{text}": the node has workers 0-{count - 1}')
            result.append(int(text))
        return result

    def _replay(self, verb: str, request_id: str) -> operations_pb2.Operation | None:
        if not request_id:
            return None
        name = self._requests.get((verb, request_id))
        if name is None or name not in self._operations:
            return None
        return self._operations[name].to_proto()

    def _new_operation(
        self, parent: str, target: str, verb: str, request_id: str
    ) -> OperationRecord:
        suffix = f"operation-{int(self._clock.wall().timestamp() * 1000)}-{uuid.uuid4().hex[:12]}"
        record = OperationRecord(
            name=f"{parent}/operations/{suffix}",
            target=target,
            verb=verb,
            create_time=self._clock.wall(),
        )
        self._operations[record.name] = record
        if request_id:
            key_verb = "delete-node" if verb == "delete" and "/nodes/" in target else verb
            self._requests[(key_verb, request_id)] = record.name
        return record

    def _finish(
        self,
        operation: OperationRecord,
        response: Any = None,
        error: status_pb2.Status | None = None,
    ) -> None:
        if operation.done:
            return
        if response is not None and not isinstance(response, Message):
            response = type(response).pb(response)
        operation.response = response
        operation.error = error
        operation.done = True
        operation.end_time = self._clock.wall()

    def _abandon(self, operation: OperationRecord) -> None:
        with self._lock:
            if not operation.done:
                self._finish(
                    operation,
                    error=status_pb2.Status(
                        code=grpc.StatusCode.ABORTED.value[0],
                        message="The operation was interrupted by a later change to the resource",
                    ),
                )

    def _release(self, qr: QueuedResourceRecord) -> None:
        if self._pools.release(qr.name):
            self._events.emit("capacity.release", qr=qr.name)
            self._cond.notify_all()

    def _fail(self, qr: QueuedResourceRecord, code: grpc.StatusCode, message: str) -> None:
        qr.error = status_pb2.Status(code=code.value[0], message=message)
        self._release(qr)
        self._set_qr_state(qr, QrState.FAILED)
        self._events.emit("qr.failed", qr=qr.name, detail=message)

    def _set_qr_state(self, qr: QueuedResourceRecord, state: int, initiator: int = 0) -> None:
        qr.state = state
        qr.initiator = initiator
        self._events.emit("qr.state", qr=qr.name, detail=QrState(state).name)
        self._cond.notify_all()

    def _set_node_state(self, node: NodeRecord, state: int, health: int | None = None) -> None:
        changed = node.state != state
        node.state = state
        if health is not None:
            node.health = health
        if changed:
            self._events.emit(
                "node.state", qr=node.qr_name, node=node.name, detail=NodeState(state).name
            )

    # ==================================================================== rendering
    def _qr_proto(self, qr: QueuedResourceRecord) -> cloud_tpu.QueuedResource:
        result = _copy(qr.spec)
        state = cloud_tpu.QueuedResourceState(state=qr.state, state_initiator=qr.initiator)
        if qr.state == QrState.FAILED:
            state.failed_data = cloud_tpu.QueuedResourceState.FailedData(error=qr.error)
        elif qr.state in _STATE_DATA:
            getattr(cloud_tpu.QueuedResourceState.pb(state), _STATE_DATA[qr.state]).SetInParent()
        result.state = state
        return result

    def _node_proto(self, node: NodeRecord) -> cloud_tpu.Node:
        result = _copy(node.template)
        result.name = node.name
        result.state = NodeState(node.state)
        result.health = Health(node.health)
        result.create_time = node.create_time
        result.queued_resource = node.qr_name
        result.multislice_node = node.num_slices > 1
        result.id = node.numeric_id
        result.api_version = cloud_tpu.Node.ApiVersion(cloud_tpu.Node.ApiVersion.V2_ALPHA1)
        accelerator = node.accelerator
        result.accelerator_type = accelerator.accelerator_type
        result.accelerator_config = cloud_tpu.AcceleratorConfig(
            type_=getattr(cloud_tpu.AcceleratorConfig.Type, accelerator.family.config_type),
            topology=accelerator.topology,
        )
        network = result.network_config
        if not network.network:
            network.network = f"projects/{node.parent.split('/')[1]}/global/networks/default"
        if not network.subnetwork:
            region = node.parent.split("/")[3].rsplit("-", 1)[0]
            network.subnetwork = (
                f"projects/{node.parent.split('/')[1]}/regions/{region}/subnetworks/default"
            )
        result.network_config = network
        external = bool(node.template.network_config.enable_external_ips)
        endpoints = []
        for worker in node.workers:
            endpoint = cloud_tpu.NetworkEndpoint(ip_address=worker.ip, port=TPU_RUNTIME_PORT)
            if external:
                endpoint.access_config = cloud_tpu.AccessConfig(external_ip=worker.ip)
            endpoints.append(endpoint)
        result.network_endpoints = endpoints
        result.scheduling_config = cloud_tpu.SchedulingConfig(
            preemptible=node.tier == "best-effort",
            spot=node.tier == "spot",
            reserved=node.tier == "guaranteed",
        )
        if node.maintenance is not None:
            result.upcoming_maintenance = node.maintenance
        return result
