"""gRPC handlers for google.cloud.tpu.v2alpha1.Tpu and google.longrunning.Operations, using the
installed client's own message types for (de)serialisation, plus injected API faults."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from google.cloud.location import locations_pb2
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2

from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.state import CloudTpu
from tpuctl.emulator.control.status import ApiError

log = logging.getLogger("tpuctl.emulator")

TPU_SERVICE = "google.cloud.tpu.v2alpha1.Tpu"
OPERATIONS_SERVICE = "google.longrunning.Operations"
LOCATIONS_SERVICE = "google.cloud.location.Locations"


class ApiFaults:
    """The next N API calls fail with a code; the next M creates hit RESOURCE_EXHAUSTED."""

    def __init__(self, events: EventLog) -> None:
        self._lock = threading.Lock()
        self._events = events
        self._code = grpc.StatusCode.UNAVAILABLE
        self._count = 0
        self._create_exhausted = 0

    def set(
        self, code: grpc.StatusCode | None, count: int | None, create_exhausted: int | None
    ) -> dict[str, Any]:
        with self._lock:
            if code is not None:
                self._code = code
            if count is not None:
                self._count = max(0, count)
            if create_exhausted is not None:
                self._create_exhausted = max(0, create_exhausted)
            return self._snapshot()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        return {
            "code": self._code.name,
            "count": self._count,
            "create_exhausted": self._create_exhausted,
        }

    def check(self, method: str, request: Any) -> None:
        """Raise the injected error for this call, if any is pending."""
        with self._lock:
            error = None
            if method == "CreateQueuedResource" and self._create_exhausted > 0:
                self._create_exhausted -= 1
                parent = getattr(request, "parent", "")
                error = ApiError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Quota exhausted or insufficient capacity for the request in {parent}; "
                    "try again later",
                )
            elif self._count > 0:
                self._count -= 1
                error = ApiError(self._code, f"The service is currently {self._code.name}.")
        if error is not None:
            self._events.emit("api.fault", detail=f"{method}: {error.code.name}")
            raise error


Handler = Callable[[Any], Any]


class TpuServicer:
    """Builds the generic handlers; every handler maps ApiError to a gRPC status."""

    def __init__(self, cloud: CloudTpu, faults: ApiFaults) -> None:
        self._cloud = cloud
        self._faults = faults

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        cloud = self._cloud
        tpu = {
            "CreateQueuedResource": (
                cloud_tpu.CreateQueuedResourceRequest,
                cloud.create_queued_resource,
                None,
            ),
            "GetQueuedResource": (
                cloud_tpu.GetQueuedResourceRequest,
                lambda r: cloud.get_queued_resource(r.name),
                cloud_tpu.QueuedResource,
            ),
            "ListQueuedResources": (
                cloud_tpu.ListQueuedResourcesRequest,
                lambda r: cloud.list_queued_resources(r.parent, r.page_size, r.page_token),
                cloud_tpu.ListQueuedResourcesResponse,
            ),
            "DeleteQueuedResource": (
                cloud_tpu.DeleteQueuedResourceRequest,
                lambda r: cloud.delete_queued_resource(r.name, r.force, r.request_id),
                None,
            ),
            "ResetQueuedResource": (
                cloud_tpu.ResetQueuedResourceRequest,
                lambda r: cloud.reset_queued_resource(r.name),
                None,
            ),
            "GetNode": (cloud_tpu.GetNodeRequest, lambda r: cloud.get_node(r.name), cloud_tpu.Node),
            "ListNodes": (
                cloud_tpu.ListNodesRequest,
                lambda r: cloud.list_nodes(r.parent, r.page_size, r.page_token),
                cloud_tpu.ListNodesResponse,
            ),
            "UpdateNode": (cloud_tpu.UpdateNodeRequest, cloud.update_node, None),
            "DeleteNode": (
                cloud_tpu.DeleteNodeRequest,
                lambda r: cloud.delete_node(r.name, r.request_id),
                None,
            ),
            "StopNode": (
                cloud_tpu.StopNodeRequest,
                lambda r: cloud.stop_node(r.name),
                None,
            ),
            "StartNode": (
                cloud_tpu.StartNodeRequest,
                lambda r: cloud.start_node(r.name),
                None,
            ),
            "GetGuestAttributes": (
                cloud_tpu.GetGuestAttributesRequest,
                lambda r: cloud.get_guest_attributes(r.name, r.query_path, list(r.worker_ids)),
                cloud_tpu.GetGuestAttributesResponse,
            ),
            "SimulateMaintenanceEvent": (
                cloud_tpu.SimulateMaintenanceEventRequest,
                lambda r: cloud.simulate_maintenance_event(r.name, list(r.worker_ids)),
                None,
            ),
            "ListAcceleratorTypes": (
                cloud_tpu.ListAcceleratorTypesRequest,
                lambda r: cloud.list_accelerator_types(
                    r.parent, r.filter, r.page_size, r.page_token
                ),
                cloud_tpu.ListAcceleratorTypesResponse,
            ),
            "GetAcceleratorType": (
                cloud_tpu.GetAcceleratorTypeRequest,
                lambda r: cloud.get_accelerator_type(r.name),
                cloud_tpu.AcceleratorType,
            ),
            "ListRuntimeVersions": (
                cloud_tpu.ListRuntimeVersionsRequest,
                lambda r: cloud.list_runtime_versions(
                    r.parent, r.filter, r.page_size, r.page_token
                ),
                cloud_tpu.ListRuntimeVersionsResponse,
            ),
            "GetRuntimeVersion": (
                cloud_tpu.GetRuntimeVersionRequest,
                lambda r: cloud.get_runtime_version(r.name),
                cloud_tpu.RuntimeVersion,
            ),
            "ListReservations": (
                cloud_tpu.ListReservationsRequest,
                lambda r: cloud.list_reservations(r.parent, r.page_size, r.page_token),
                cloud_tpu.ListReservationsResponse,
            ),
        }
        tpu_handlers = {
            method: self._proto_plus(method, request_type, fn, response_type)
            for method, (request_type, fn, response_type) in tpu.items()
        }
        operations = {
            "GetOperation": (
                operations_pb2.GetOperationRequest,
                lambda r: cloud.get_operation(r.name),
            ),
            "ListOperations": (
                operations_pb2.ListOperationsRequest,
                lambda r: cloud.list_operations(r.name, r.page_size, r.page_token),
            ),
            "DeleteOperation": (
                operations_pb2.DeleteOperationRequest,
                lambda r: _empty(cloud.delete_operation, r.name),
            ),
            "CancelOperation": (
                operations_pb2.CancelOperationRequest,
                lambda r: _empty(cloud.cancel_operation, r.name),
            ),
        }
        locations = {
            "ListLocations": (
                locations_pb2.ListLocationsRequest,
                lambda r: cloud.list_locations(r.name, r.filter, r.page_size, r.page_token),
            ),
            "GetLocation": (
                locations_pb2.GetLocationRequest,
                lambda r: cloud.get_location(r.name),
            ),
        }
        return [
            grpc.method_handlers_generic_handler(TPU_SERVICE, tpu_handlers),
            grpc.method_handlers_generic_handler(
                OPERATIONS_SERVICE, self._plain_handlers(operations)
            ),
            grpc.method_handlers_generic_handler(
                LOCATIONS_SERVICE, self._plain_handlers(locations)
            ),
        ]

    def _plain_handlers(
        self, methods: dict[str, tuple[Any, Handler]]
    ) -> dict[str, grpc.RpcMethodHandler]:
        """Handlers of services whose messages are plain protobufs (not proto-plus)."""
        return {
            method: self._unary(method, request_type.FromString, fn, _serialize_pb)
            for method, (request_type, fn) in methods.items()
        }

    def _proto_plus(
        self, method: str, request_type: Any, fn: Handler, response_type: Any
    ) -> grpc.RpcMethodHandler:
        # Methods returning an LRO answer with operations_pb2.Operation (a plain protobuf).
        serialize = response_type.serialize if response_type is not None else _serialize_pb
        return self._unary(method, request_type.deserialize, fn, serialize)

    def _unary(
        self,
        method: str,
        deserialize: Callable[[bytes], Any],
        fn: Handler,
        serialize: Callable[[Any], bytes],
    ) -> grpc.RpcMethodHandler:
        return unary_handler(method, self._faults.check, deserialize, fn, serialize)


def _serialize_pb(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _empty(action: Callable[[str], None], name: str) -> empty_pb2.Empty:
    action(name)
    return empty_pb2.Empty()


def unary_handler(
    method: str,
    check: Callable[[str, Any], None],
    deserialize: Callable[[bytes], Any],
    fn: Callable[[Any], Any],
    serialize: Callable[[Any], bytes],
) -> grpc.RpcMethodHandler:
    """One unary RPC: the fault injector's `check` first, then `fn`; an ApiError is the
    status it names, anything else INTERNAL (logged)."""

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            check(method, request)
            return fn(request)
        except ApiError as error:
            context.abort(error.code, error.message)
        except Exception as error:
            log.exception("%s failed", method)
            context.abort(grpc.StatusCode.INTERNAL, f"emulator error: {error}")

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=deserialize, response_serializer=serialize
    )
