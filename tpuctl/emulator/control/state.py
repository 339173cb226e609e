"""The emulated Cloud TPU service, CloudTpu: one method per RPC and per admin fault.

Thread-safe; service.py and admin_service.py map it onto gRPC.

Where the rest lives: records.py (the records), transitions.py (which state changes are legal,
and why), runtime.py (the lock, lookups and flow threads), flows.py (create, provision, delete,
reset, maintenance, repair, preemption), faults.py (the admin faults), protos.py (records →
messages), operations.py (long-running operations).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from google.cloud.location import locations_pb2
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2

from tpuctl.emulator.control import catalog, faults, flows
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.config import EmulatorConfig
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.names import (
    parent_matches,
    parse_parent,
    parse_project,
    worker_indexes,
)
from tpuctl.emulator.control.plane import WorkerPlaneAPI
from tpuctl.emulator.control.protos import (
    copy_message,
    guest_attributes,
    node_extras,
    node_proto,
    operation_proto,
    qr_extras,
    qr_proto,
)
from tpuctl.emulator.control.records import (
    Extras,
    Health,
    Initiator,
    NodeState,
    QrState,
    QueuedResourceRecord,
)
from tpuctl.emulator.control.runtime import Runtime
from tpuctl.emulator.control.status import already_exists, invalid, not_found, precondition
from tpuctl.emulator.control.validation import validate_create
from tpuctl.emulator.vms.metadata import instance_name

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000
UPDATABLE_NODE_FIELDS = ("metadata", "labels", "tags", "description")
# A QR in these states may be deleted without force even when it still has nodes.
DELETABLE_WITHOUT_FORCE = (QrState.ACCEPTED, QrState.FAILED, QrState.SUSPENDED)

T = TypeVar("T")
M = TypeVar("M")


def copy_json(value: Extras) -> Extras:
    copied: Extras = json.loads(json.dumps(value))
    return copied


# A message and its REST-only fields (records.Extras): what the REST face renders.
Document = tuple[M, Extras]


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


def _location(project: str, zone: str) -> locations_pb2.Location:
    return locations_pb2.Location(name=f"projects/{project}/locations/{zone}", location_id=zone)


# Metadata that turns guest attributes off: the guest agent then publishes no host keys.
GUEST_ATTRIBUTES = "enable-guest-attributes"


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
        self._rt = Runtime(config, plane, events, clock, identity_factory)
        self.reservations = self._rt.reservations
        # A project's common instance metadata (the server's Access sets this).
        self.project_metadata: Callable[[str], dict[str, str]] = lambda _project: {}

    # ----------------------------------------------------------------- queued resources
    def create_queued_resource(
        self, request: cloud_tpu.CreateQueuedResourceRequest, extras: Extras | None = None
    ) -> operations_pb2.Operation:
        """`extras`: the REST-only fields of request.queued_resource (records.Extras)."""
        rt = self._rt
        with rt.lock:
            replay = rt.operations.replay("create", request.request_id)
            if replay is not None:
                return replay
            plan = validate_create(request, rt.clock, extras)
            if plan.tier == "reservation-bound":
                self._check_reservation(plan.reservation, plan.accelerator.generation)
            if plan.name in rt.qrs:
                raise already_exists("queuedResource", plan.name)
            for node in plan.nodes:
                if self._node_id_taken(plan.parent, node.node_id):
                    raise already_exists("node", f"{plan.parent}/nodes/{node.node_id}")
            now = rt.clock.wall()
            spec = copy_message(request.queued_resource)
            spec.name = plan.name
            spec.create_time = now
            record = QueuedResourceRecord(
                plan=plan,
                spec=spec,
                node_names=[f"{plan.parent}/nodes/{node.node_id}" for node in plan.nodes],
                create_time=now,
                extras=copy_json(extras or {}),
            )
            rt.qrs[plan.name] = record
            operation = rt.operations.start(plan.parent, plan.name, "create", request.request_id)
            rt.events.emit(
                "qr.create",
                qr=plan.name,
                detail=f"{len(plan.nodes)} x {plan.accelerator.accelerator_type} {plan.tier}",
            )
            rt.events.emit("qr.state", qr=plan.name, detail="CREATING")
            rt.spawn(flows.create, record, record.epoch, operation)
            return operation_proto(operation)

    def get_queued_resource(self, name: str) -> cloud_tpu.QueuedResource:
        return self.queued_resource_document(name)[0]

    def queued_resource_document(self, name: str) -> Document[cloud_tpu.QueuedResource]:
        with self._rt.lock:
            record = self._rt.qr(name)
            return qr_proto(record), qr_extras(record)

    def list_queued_resources(
        self, parent: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListQueuedResourcesResponse:
        page, token = self.list_queued_resource_documents(parent, page_size, page_token)
        return cloud_tpu.ListQueuedResourcesResponse(
            queued_resources=[message for message, _ in page], next_page_token=token
        )

    def list_queued_resource_documents(
        self, parent: str, page_size: int, page_token: str
    ) -> tuple[list[Document[cloud_tpu.QueuedResource]], str]:
        parse_parent(parent)
        with self._rt.lock:
            records = sorted(
                (r for r in self._rt.qrs.values() if parent_matches(parent, r.plan.parent)),
                key=lambda r: r.name,
            )
            page, token = _page(records, page_size, page_token)
            return [(qr_proto(r), qr_extras(r)) for r in page], token

    def delete_queued_resource(
        self, name: str, force: bool, request_id: str
    ) -> operations_pb2.Operation:
        rt = self._rt
        with rt.lock:
            replay = rt.operations.replay("delete", request_id)
            if replay is not None:
                return replay
            qr = rt.qr(name)
            if qr.state == QrState.DELETING and qr.delete_operation:
                return operation_proto(rt.operations.records[qr.delete_operation])
            nodes = rt.qr_nodes(qr)
            if nodes and not force and qr.state not in DELETABLE_WITHOUT_FORCE:
                raise precondition(
                    f'Queued resource "{name}" has {len(nodes)} node(s) in state '
                    f"{QrState(qr.state).name}; delete them first or set force=true"
                )
            operation = rt.operations.start(qr.plan.parent, name, "delete", request_id)
            qr.delete_operation = operation.name
            rt.supersede(qr)
            rt.set_qr_state(qr, QrState.DELETING)
            for node in nodes:
                rt.set_node_state(node, NodeState.DELETING)
            doomed = [node.node_id for node in nodes if node.in_plane]
            rt.spawn(flows.delete, qr, operation, doomed)
            return operation_proto(operation)

    def reset_queued_resource(self, name: str) -> operations_pb2.Operation:
        rt = self._rt
        with rt.lock:
            qr = rt.qr(name)
            if qr.state != QrState.ACTIVE:
                raise precondition(
                    f'Queued resource "{name}" is {QrState(qr.state).name}; only an ACTIVE '
                    "queued resource can be reset"
                )
            faults.require_running(rt, qr, "reset")
            operation = rt.operations.start(qr.plan.parent, name, "reset", "")
            epoch = rt.supersede(qr)
            rt.events.emit("qr.reset", qr=name)
            rt.spawn(flows.reset, qr, epoch, operation)
            return operation_proto(operation)

    # ----------------------------------------------------------------------------- nodes
    def get_node(self, name: str) -> cloud_tpu.Node:
        return self.node_document(name)[0]

    def node_document(self, name: str) -> Document[cloud_tpu.Node]:
        with self._rt.lock:
            record = self._rt.node(name)
            return node_proto(record), node_extras(record)

    def list_nodes(
        self, parent: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListNodesResponse:
        page, token = self.list_node_documents(parent, page_size, page_token)
        return cloud_tpu.ListNodesResponse(
            nodes=[message for message, _ in page], next_page_token=token
        )

    def list_node_documents(
        self, parent: str, page_size: int, page_token: str
    ) -> tuple[list[Document[cloud_tpu.Node]], str]:
        parse_parent(parent)
        with self._rt.lock:
            records = sorted(
                (n for n in self._rt.nodes.values() if parent_matches(parent, n.parent)),
                key=lambda n: n.name,
            )
            page, token = _page(records, page_size, page_token)
            return [(node_proto(n), node_extras(n)) for n in page], token

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
        rt = self._rt
        with rt.lock:
            node = rt.node(request.node.name)
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
            operation = rt.operations.start(node.parent, node.name, "update", "")
            push = node.in_plane and "metadata" in paths
            metadata = node.metadata
            rt.events.emit("node.update", node=node.name, detail=",".join(paths))
        if push:
            rt.plane.set_metadata(node.node_id, metadata)
        with rt.lock:
            rt.operations.finish(operation, node_proto(node), extras=node_extras(node))
            return operation_proto(operation)

    def delete_node(self, name: str, request_id: str) -> operations_pb2.Operation:
        rt = self._rt
        with rt.lock:
            replay = rt.operations.replay("delete-node", request_id)
            if replay is not None:
                return replay
            node = rt.node(name)
            if node.state == NodeState.DELETING:
                raise precondition(f'Node "{name}" is already being deleted')
            qr = rt.qrs.get(node.qr_name)
            operation = rt.operations.start(node.parent, name, "delete", request_id)
            rt.set_node_state(node, NodeState.DELETING)
            suspend = qr is not None and qr.state in (QrState.PROVISIONING, QrState.ACTIVE)
            if qr is not None and suspend:
                rt.supersede(qr)
                rt.set_qr_state(qr, QrState.SUSPENDING, Initiator.USER)
            rt.spawn(flows.delete_node, node, qr if suspend else None, operation)
            return operation_proto(operation)

    def stop_node(self, name: str) -> operations_pb2.Operation:
        """Stop a READY, healthy node of an ACTIVE QR: its VMs shut down (disks kept), the node
        STOPPING → STOPPED; the QR stays ACTIVE and keeps its chips."""
        rt = self._rt
        with rt.lock:
            node = rt.node(name)
            qr = rt.qrs.get(node.qr_name)
            if qr is None or qr.state != QrState.ACTIVE or node.state != NodeState.READY:
                raise precondition(
                    f'Node "{name}" is {NodeState(node.state).name}; only a READY node of an '
                    "ACTIVE queued resource can be stopped"
                )
            if node.health != Health.HEALTHY:
                raise precondition(f'Node "{name}" is under maintenance; stop it afterwards')
            operation = rt.operations.start(node.parent, name, "stop", "")
            rt.set_node_state(node, NodeState.STOPPING)
            rt.spawn(flows.stop, qr, qr.epoch, node, operation)
            return operation_proto(operation)

    def start_node(self, name: str) -> operations_pb2.Operation:
        """Start a STOPPED node: STARTING, its VMs boot (the startup script runs), READY."""
        rt = self._rt
        with rt.lock:
            node = rt.node(name)
            qr = rt.qrs.get(node.qr_name)
            if qr is None or qr.state != QrState.ACTIVE or node.state != NodeState.STOPPED:
                raise precondition(
                    f'Node "{name}" is {NodeState(node.state).name}; only a STOPPED node of an '
                    "ACTIVE queued resource can be started"
                )
            operation = rt.operations.start(node.parent, name, "start", "")
            rt.set_node_state(node, NodeState.STARTING)
            rt.spawn(flows.start, qr, qr.epoch, node, operation)
            return operation_proto(operation)

    def get_guest_attributes(
        self, name: str, query_path: str, worker_ids: list[str]
    ) -> cloud_tpu.GetGuestAttributesResponse:
        with self._rt.lock:
            node = self._rt.node(name)
            workers = list(node.workers)
            count = node.accelerator.vms
            unpublished = set(node.unpublished_host_keys)
            setting = node.metadata.get(GUEST_ATTRIBUTES)
            node_name = node.name
        if setting is None:  # the node's own value wins, as for every metadata key
            project = name.split("/")[1]
            setting = self.project_metadata(project).get(GUEST_ATTRIBUTES)
        disabled = (setting or "").strip().upper() in ("FALSE", "0", "NO")
        if disabled:
            unpublished = set(range(count))  # the guest agent may write no guest attributes
        selected = worker_indexes(worker_ids, count, allow_all=True)
        host_keys = {w.worker: w.host_key for w in workers if w.worker not in unpublished}
        # The instance name IAP tunnels take (a missing host key leaves it published).
        hostnames = [None if disabled else instance_name(node_name, index) for index in selected]
        return guest_attributes(query_path, [host_keys.get(index) for index in selected], hostnames)

    def simulate_maintenance_event(
        self, name: str, worker_ids: list[str]
    ) -> operations_pb2.Operation:
        rt = self._rt
        with rt.lock:
            node = rt.node(name)
            workers = worker_indexes(worker_ids, node.accelerator.vms, allow_all=False)
            worker = workers[0] if workers else 0
            operation = rt.operations.start(node.parent, name, "simulateMaintenanceEvent", "")
            faults.start_maintenance(rt, node, worker, "simulated")
            rt.operations.finish(operation, node_proto(node), extras=node_extras(node))
            return operation_proto(operation)

    # ------------------------------------------------------------------------- locations
    def list_locations(
        self, name: str, filter_text: str, page_size: int, page_token: str
    ) -> locations_pb2.ListLocationsResponse:
        """The zones of `config.zones`, the same for every project."""
        project = parse_project(name)
        if filter_text:
            raise invalid("filter is not supported by the emulator's ListLocations")
        page, token = _page(list(self.config.zones), page_size, page_token)
        return locations_pb2.ListLocationsResponse(
            locations=[_location(project, zone) for zone in page], next_page_token=token
        )

    def get_location(self, name: str) -> locations_pb2.Location:
        project, zone = parse_parent(name)
        if zone not in self.config.zones:
            raise not_found("location", name)
        return _location(project, zone)

    # ------------------------------------------- accelerator types, runtimes, reservations
    def list_accelerator_types(
        self, parent: str, filter_text: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListAcceleratorTypesResponse:
        if filter_text:
            raise invalid("filter is not supported by the emulator's ListAcceleratorTypes")
        page, token = _page(catalog.accelerator_types(parent), page_size, page_token)
        return cloud_tpu.ListAcceleratorTypesResponse(accelerator_types=page, next_page_token=token)

    def get_accelerator_type(self, name: str) -> cloud_tpu.AcceleratorType:
        return catalog.accelerator_type(name)

    def list_runtime_versions(
        self, parent: str, filter_text: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListRuntimeVersionsResponse:
        if filter_text:
            raise invalid("filter is not supported by the emulator's ListRuntimeVersions")
        page, token = _page(catalog.runtime_version_list(parent), page_size, page_token)
        return cloud_tpu.ListRuntimeVersionsResponse(runtime_versions=page, next_page_token=token)

    def get_runtime_version(self, name: str) -> cloud_tpu.RuntimeVersion:
        return catalog.runtime_version(name)

    def list_reservations(
        self, parent: str, page_size: int, page_token: str
    ) -> cloud_tpu.ListReservationsResponse:
        with self._rt.lock:
            usage = {name: self._rt.reserved.used(name) for name in self._rt.reserved.keys()}  # noqa: SIM118
        page, token = _page(self.reservations.listed(parent, usage), page_size, page_token)
        return cloud_tpu.ListReservationsResponse(reservations=page, next_page_token=token)

    def put_reservation(
        self,
        name: str,
        *,
        chips: int | None = None,
        generation: str | None = None,
        state: str | None = None,
        start_time: object = catalog.UNCHANGED,
        end_time: object = catalog.UNCHANGED,
    ) -> list[dict[str, object]]:
        """Make a reservation (`chips` given) or change one: its state or window. A window
        that ends takes back the nodes of the reservation-bound QRs in it (their termination
        time follows the window's end). Answers every reservation."""
        rt = self._rt
        with rt.lock:
            rt.reservations.put_or_update(
                name, chips=chips, generation=generation, state=state,
                start_time=start_time, end_time=end_time,
            )  # fmt: skip
            pushes = self._retime_bound(name)
        for node_id, scheduling in pushes:
            rt.plane.set_scheduling(node_id, scheduling)
        rt.events.emit("reservation", detail=name)
        return rt.reservations.snapshot()

    def remove_reservation(self, name: str) -> list[dict[str, object]]:
        """Remove a reservation: the QRs bound to it lose their nodes now."""
        rt = self._rt
        with rt.lock:
            if not rt.reservations.remove(name):
                raise not_found("reservation", name)
            pushes = self._retime_bound(name)
        for node_id, scheduling in pushes:
            rt.plane.set_scheduling(node_id, scheduling)
        rt.events.emit("reservation", detail=f"{name} removed")
        return rt.reservations.snapshot()

    def _retime_bound(self, reservation: str) -> list[tuple[str, dict[str, str]]]:
        """After a reservation changed: recompute the termination times of the QRs bound to it
        and wake the flows waiting on it. Under the lock."""
        rt = self._rt
        pushes = []
        for qr in rt.qrs.values():
            if qr.plan.tier == "reservation-bound" and qr.plan.reservation == reservation:
                pushes.extend(flows.retime(rt, qr))
        rt.cond.notify_all()
        return pushes

    def _check_reservation(self, name: str, generation: str) -> None:
        """A reservation-bound create names a reservation that exists, of its generation."""
        record = self._rt.reservations.get(name)
        if record is None:
            raise not_found("reservation", name)
        if record.generation != generation:
            raise invalid(f'Reservation "{name}" holds {record.generation} chips, not {generation}')

    # ------------------------------------------------------------------------ operations
    def get_operation(self, name: str) -> operations_pb2.Operation:
        return self.operation_document(name)[0]

    def operation_document(self, name: str) -> Document[operations_pb2.Operation]:
        """The operation, and its response's REST-only fields."""
        with self._rt.lock:
            record = self._rt.operations.get(name)
            return operation_proto(record), dict(record.response_extras)

    def list_operations(
        self, name: str, page_size: int, page_token: str
    ) -> operations_pb2.ListOperationsResponse:
        page, token = self.list_operation_documents(name, page_size, page_token)
        return operations_pb2.ListOperationsResponse(
            operations=[message for message, _ in page], next_page_token=token
        )

    def list_operation_documents(
        self, name: str, page_size: int, page_token: str
    ) -> tuple[list[Document[operations_pb2.Operation]], str]:
        parse_parent(name)
        with self._rt.lock:
            records = [
                op
                for op in self._rt.operations.records.values()
                if parent_matches(name, op.name.rsplit("/operations/", 1)[0])
            ]
            page, token = _page(records, page_size, page_token)
            return [(operation_proto(op), dict(op.response_extras)) for op in page], token

    def delete_operation(self, name: str) -> None:
        with self._rt.lock:
            self._rt.operations.get(name)
            del self._rt.operations.records[name]

    def cancel_operation(self, name: str) -> None:
        # Like Cloud TPU, cancellation is best effort: the flag is recorded, the work goes on.
        with self._rt.lock:
            self._rt.operations.get(name).cancel_requested = True

    # ----------------------------------------------------------------- admin (faults.py)
    def preempt(self, name: str) -> dict[str, Any]:
        return faults.preempt(self._rt, name)

    def fail_slice(self, name: str, slice_index: int) -> dict[str, Any]:
        return faults.fail_slice(self._rt, name, slice_index)

    def schedule_maintenance(self, name: str, worker: int, after: float) -> dict[str, Any]:
        return faults.schedule_maintenance(self._rt, name, worker, after)

    def set_ssh_fault(self, name: str, worker: int, mode: str | None) -> dict[str, Any]:
        return faults.set_ssh_fault(self._rt, name, worker, mode)

    def set_hostkey_fault(self, name: str, worker: int, mode: str) -> dict[str, Any]:
        return faults.set_hostkey_fault(self._rt, name, worker, mode)

    def set_capacity(
        self, changes: dict[str, int], zone: str | None = None, *, flex_start: bool = False
    ) -> dict[str, Any]:
        """Resize pools: the standard ones, or with `flex_start` flex-start's own."""
        return faults.set_capacity(self._rt, changes, zone, flex_start=flex_start)

    def capacity(self, zone: str | None = None, *, flex_start: bool = False) -> dict[str, Any]:
        with self._rt.lock:
            pools = self._rt.flex_pools if flex_start else self._rt.pools
            return pools.snapshot(zone)

    def status(self) -> dict[str, Any]:
        rt = self._rt
        with rt.lock:
            return {
                "speed": rt.clock.speed,
                "capacity": rt.pools.snapshot(),
                "flex_start": {"capacity": rt.flex_pools.snapshot()},
                "queued_resources": [
                    {
                        "name": qr.name,
                        "state": QrState(qr.state).name,
                        "tier": qr.plan.tier,
                        "accelerator_type": qr.plan.accelerator.accelerator_type,
                        "nodes": len(qr.node_names),
                    }
                    for qr in sorted(rt.qrs.values(), key=lambda r: r.name)
                ],
                "nodes": len(rt.nodes),
                "workers": sum(len(node.workers) for node in rt.nodes.values()),
                "operations": len(rt.operations.records),
            }

    def resolve_qr(self, name: str) -> str:
        """A full QR name, or a bare id when it names exactly one QR."""
        with self._rt.lock:
            return self._rt.resolve_qr(name)

    def resolve_node(self, name: str) -> str:
        with self._rt.lock:
            return self._rt.resolve_node(name)

    def close(self) -> None:
        self._rt.close()

    # ---------------------------------------------------------------------------- helpers
    def _node_id_taken(self, parent: str, node_id: str) -> bool:
        # Node ids are unique within a zone, as on Cloud TPU; the worker plane keys the VMs of
        # a node id reused elsewhere apart (flows._plane_key).
        if f"{parent}/nodes/{node_id}" in self._rt.nodes:
            return True
        return any(
            planned.node_id == node_id
            for qr in self._rt.qrs.values()
            if qr.plan.parent == parent
            for planned in qr.plan.nodes
            if qr.state != QrState.FAILED
        )
