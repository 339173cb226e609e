"""The Cloud TPU REST API (v2alpha1 and v2, the face gcloud talks to) on a port of its own,
over the same control plane as the gRPC API: a queued resource made here is seen there, and the
reverse. Announced as CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU (`http://127.0.0.1:PORT/`).

TpuRestApi routes a request to its handler, which calls the control plane; TpuRestServer serves
it over HTTP/1.1. Long-running operations, paging, `updateMask` and the `fields` system parameter
as the API takes them; the call's parts (the parsed request, the answer's JSON, Google's error
body, the RequestLog the admin service reads) in rest_call.py, the messages' JSON in rest_json.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import grpc
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import field_mask_pb2

from tpuctl.emulator.api import rest_json
from tpuctl.emulator.api.http_thread import serve_in_thread, stop_serving
from tpuctl.emulator.api.rest_call import (
    Call,
    Method,
    RequestLog,
    check_query,
    error_json,
    listing_json,
    message_json,
    no_such_url,
    operation_json,
    request_body,
    unimplemented,
)
from tpuctl.emulator.control.clock import rfc3339
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.records import Extras
from tpuctl.emulator.control.state import CloudTpu
from tpuctl.emulator.control.status import ApiError, invalid

log = logging.getLogger("tpuctl.emulator")

LISTEN_HOST = "127.0.0.1"
MAX_BODY_BYTES = 8 * 1024 * 1024
_PATH = re.compile(r"^/(v2alpha1|v2)/(projects/[^:]+?)(?::([A-Za-z]+))?$")


class TpuRestApi:
    """The routes and handlers; `handle` answers one request as (HTTP status, JSON)."""

    def __init__(
        self,
        cloud: CloudTpu,
        check: Callable[[str, Any], None],
        events: EventLog,
        requests: RequestLog,
    ) -> None:
        self._cloud = cloud
        self._check = check  # the injected API faults (service.ApiFaults.check)
        self._events = events
        self.requests = requests
        self._routes = self._build_routes()

    # ------------------------------------------------------------------------ dispatch
    def handle(
        self, http_method: str, target: str, body: bytes
    ) -> tuple[int, dict[str, Any], bool]:
        """(status, JSON, pretty) for one request."""
        url = urlsplit(target)
        query_lists = parse_qs(url.query, keep_blank_values=True)
        query = {key: values[-1] for key, values in query_lists.items()}
        pretty = query.get("prettyPrint", "true").lower() != "false"
        path = unquote(url.path)
        call: Call | None = None
        method: Method | None = None
        status, answer = 200, {}
        try:
            call, method = self._route(http_method, path, query, body)
            check_query(call, method)
            self._check(method.rpc, SimpleNamespace(parent=call.name, name=call.name))
            answer = method.handler(call)
            if query.get("fields"):
                answer = rest_json.select(answer, rest_json.parse_fields(query["fields"]))
        except ApiError as error:
            status, answer = error_json(error)
        except Exception as error:
            log.exception("REST %s %s failed", http_method, path)
            status, answer = error_json(
                ApiError(grpc.StatusCode.INTERNAL, f"emulator error: {error}")
            )
        if call is not None and method is not None and method.mutates:
            self._record(call, method, status)
        return status, answer, pretty

    def _route(
        self, http_method: str, path: str, query: dict[str, str], raw: bytes
    ) -> tuple[Call, Method]:
        match = _PATH.match(path)
        if match is None:
            raise no_such_url(path)
        version, name, verb = match.group(1), match.group(2).rstrip("/"), match.group(3) or ""
        parts = name.split("/")
        if len(parts) == 3 and parts[2] == "locations":
            key: tuple[str, ...] = ("locations", verb, http_method)
            name = "/".join(parts[:2])
        elif len(parts) == 4 and parts[2] == "locations":
            key = ("location", verb, http_method)
        elif len(parts) == 5 and parts[2] == "locations":
            key = ("collection", parts[4], verb, http_method)
            name = "/".join(parts[:4])
        elif len(parts) == 6 and parts[2] == "locations":
            key = ("item", parts[4], verb, http_method)
        else:
            raise no_such_url(path)
        method = self._routes.get(key)
        if method is None or (version == "v2" and method.alpha_only):
            raise no_such_url(path)
        body: Any = None
        if http_method in ("POST", "PATCH"):
            try:
                body = json.loads(raw.decode("utf-8")) if raw.strip() else {}
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise invalid(f"Invalid JSON payload received. {error}") from None
        return Call(version, http_method, name, query, body, path), method

    def _record(self, call: Call, method: Method, status: int) -> None:
        resource = call.name
        if method.creates:
            collection = method.api.split(".")[-2]
            resource = f"{call.name}/{collection}/{call.query.get(method.creates, '')}"
        entry = {
            "time": rfc3339(datetime.now(timezone.utc)),
            "api": method.api,
            "version": call.version,
            "method": call.http_method,
            "path": call.path,
            "query": dict(call.query),
            "resource": resource,
            "body": call.body,
            "status": status,
        }
        self.requests.record(entry)
        self._events.emit(
            "rest.request", detail=f"{call.http_method} {call.path} {status} ({method.api})"
        )

    # ------------------------------------------------------------------------- routes
    def _build_routes(self) -> dict[tuple[str, ...], Method]:
        qr = "tpu.projects.locations.queuedResources"
        nodes = "tpu.projects.locations.nodes"
        ops = "tpu.projects.locations.operations"
        paging = frozenset({"pageSize", "pageToken"})
        catalog = paging | {"filter", "orderBy"}
        return {
            ("locations", "", "GET"): Method(
                self.list_locations,
                "tpu.projects.locations.list",
                paging | {"filter", "extraLocationTypes"},
                "ListLocations",
            ),
            ("location", "", "GET"): Method(
                self.get_location, "tpu.projects.locations.get", rpc="GetLocation"
            ),
            ("location", "generateServiceIdentity", "POST"): Method(
                unimplemented, "tpu.projects.locations.generateServiceIdentity"
            ),
            # queued resources
            ("collection", "queuedResources", "", "GET"): Method(
                self.list_queued_resources, f"{qr}.list", paging, "ListQueuedResources"
            ),
            ("collection", "queuedResources", "", "POST"): Method(
                self.create_queued_resource,
                f"{qr}.create",
                frozenset({"queuedResourceId", "requestId"}),
                "CreateQueuedResource",
                mutates=True,
                creates="queuedResourceId",
            ),
            ("item", "queuedResources", "", "GET"): Method(
                self.get_queued_resource, f"{qr}.get", rpc="GetQueuedResource"
            ),
            ("item", "queuedResources", "", "DELETE"): Method(
                self.delete_queued_resource,
                f"{qr}.delete",
                frozenset({"force", "requestId"}),
                "DeleteQueuedResource",
                mutates=True,
            ),
            ("item", "queuedResources", "reset", "POST"): Method(
                self.reset_queued_resource, f"{qr}.reset", rpc="ResetQueuedResource", mutates=True
            ),
            ("item", "queuedResources", "getMaintenanceInfo", "GET"): Method(
                unimplemented, f"{qr}.getMaintenanceInfo", alpha_only=True
            ),
            ("item", "queuedResources", "performMaintenanceQueuedResource", "POST"): Method(
                unimplemented, f"{qr}.performMaintenanceQueuedResource", alpha_only=True
            ),
            # nodes
            ("collection", "nodes", "", "GET"): Method(
                self.list_nodes, f"{nodes}.list", paging, "ListNodes"
            ),
            ("collection", "nodes", "", "POST"): Method(
                unimplemented, f"{nodes}.create", frozenset({"nodeId", "requestId"})
            ),
            ("item", "nodes", "", "GET"): Method(self.get_node, f"{nodes}.get", rpc="GetNode"),
            ("item", "nodes", "", "DELETE"): Method(
                self.delete_node,
                f"{nodes}.delete",
                frozenset({"requestId"}),
                "DeleteNode",
                mutates=True,
            ),
            ("item", "nodes", "", "PATCH"): Method(
                self.patch_node,
                f"{nodes}.patch",
                frozenset({"updateMask"}),
                "UpdateNode",
                mutates=True,
            ),
            ("item", "nodes", "getGuestAttributes", "POST"): Method(
                self.get_guest_attributes, f"{nodes}.getGuestAttributes", rpc="GetGuestAttributes"
            ),
            ("item", "nodes", "simulateMaintenanceEvent", "POST"): Method(
                self.simulate_maintenance_event,
                f"{nodes}.simulateMaintenanceEvent",
                rpc="SimulateMaintenanceEvent",
                mutates=True,
                alpha_only=True,
            ),
            ("item", "nodes", "start", "POST"): Method(
                self.start_node, f"{nodes}.start", rpc="StartNode", mutates=True
            ),
            ("item", "nodes", "stop", "POST"): Method(
                self.stop_node, f"{nodes}.stop", rpc="StopNode", mutates=True
            ),
            ("item", "nodes", "performMaintenance", "POST"): Method(
                unimplemented, f"{nodes}.performMaintenance", alpha_only=True
            ),
            # operations
            ("collection", "operations", "", "GET"): Method(
                self.list_operations,
                f"{ops}.list",
                paging | {"filter", "returnPartialSuccess"},
                "ListOperations",
            ),
            ("item", "operations", "", "GET"): Method(
                self.get_operation, f"{ops}.get", rpc="GetOperation"
            ),
            ("item", "operations", "", "DELETE"): Method(
                self.delete_operation, f"{ops}.delete", rpc="DeleteOperation", mutates=True
            ),
            ("item", "operations", "cancel", "POST"): Method(
                self.cancel_operation, f"{ops}.cancel", rpc="CancelOperation", mutates=True
            ),
            # catalog
            ("collection", "acceleratorTypes", "", "GET"): Method(
                self.list_accelerator_types,
                "tpu.projects.locations.acceleratorTypes.list",
                catalog,
                "ListAcceleratorTypes",
            ),
            ("item", "acceleratorTypes", "", "GET"): Method(
                self.get_accelerator_type,
                "tpu.projects.locations.acceleratorTypes.get",
                rpc="GetAcceleratorType",
            ),
            ("collection", "runtimeVersions", "", "GET"): Method(
                self.list_runtime_versions,
                "tpu.projects.locations.runtimeVersions.list",
                catalog,
                "ListRuntimeVersions",
            ),
            ("item", "runtimeVersions", "", "GET"): Method(
                self.get_runtime_version,
                "tpu.projects.locations.runtimeVersions.get",
                rpc="GetRuntimeVersion",
            ),
            ("collection", "reservations", "", "GET"): Method(
                self.list_reservations,
                "tpu.projects.locations.reservations.list",
                paging,
                "ListReservations",
                alpha_only=True,
            ),
        }

    # -------------------------------------------------------------- queued resources
    def create_queued_resource(self, call: Call) -> dict[str, Any]:
        message = cloud_tpu.QueuedResource.pb()()
        extras = rest_json.parse_request(call.body, message, call.version, "queued_resource")
        request = cloud_tpu.CreateQueuedResourceRequest(
            parent=call.name,
            queued_resource_id=call.query.get("queuedResourceId", ""),
            request_id=call.query.get("requestId", ""),
            queued_resource=cloud_tpu.QueuedResource.wrap(message),
        )
        operation = self._cloud.create_queued_resource(request, extras)
        return self._operation(operation, call.version)

    def get_queued_resource(self, call: Call) -> dict[str, Any]:
        message, extras = self._cloud.queued_resource_document(call.name)
        return message_json(message, extras, call.version)

    def list_queued_resources(self, call: Call) -> dict[str, Any]:
        page, token = self._cloud.list_queued_resource_documents(
            call.name, call.integer("pageSize"), call.query.get("pageToken", "")
        )
        return listing_json("queuedResources", page, token, call.version)

    def delete_queued_resource(self, call: Call) -> dict[str, Any]:
        operation = self._cloud.delete_queued_resource(
            call.name, call.boolean("force"), call.query.get("requestId", "")
        )
        return self._operation(operation, call.version)

    def reset_queued_resource(self, call: Call) -> dict[str, Any]:
        request_body(call, cloud_tpu.ResetQueuedResourceRequest)
        return self._operation(self._cloud.reset_queued_resource(call.name), call.version)

    # ----------------------------------------------------------------------- nodes
    def get_node(self, call: Call) -> dict[str, Any]:
        message, extras = self._cloud.node_document(call.name)
        return message_json(message, extras, call.version)

    def list_nodes(self, call: Call) -> dict[str, Any]:
        page, token = self._cloud.list_node_documents(
            call.name, call.integer("pageSize"), call.query.get("pageToken", "")
        )
        return listing_json("nodes", page, token, call.version)

    def delete_node(self, call: Call) -> dict[str, Any]:
        operation = self._cloud.delete_node(call.name, call.query.get("requestId", ""))
        return self._operation(operation, call.version)

    def patch_node(self, call: Call) -> dict[str, Any]:
        message = cloud_tpu.Node.pb()()
        rest_json.parse_request(call.body, message, call.version, "node")
        mask = field_mask_pb2.FieldMask()
        text = call.query.get("updateMask", "")
        try:
            mask.FromJsonString(text)  # camelCase paths, comma-separated
        except ValueError as error:
            raise invalid(f"Invalid value at 'update_mask' ({text!r}): {error}") from None
        message.name = call.name
        request = cloud_tpu.UpdateNodeRequest(node=cloud_tpu.Node.wrap(message), update_mask=mask)
        return self._operation(self._cloud.update_node(request), call.version)

    def get_guest_attributes(self, call: Call) -> dict[str, Any]:
        request = request_body(call, cloud_tpu.GetGuestAttributesRequest)
        response = self._cloud.get_guest_attributes(
            call.name, request.query_path, list(request.worker_ids)
        )
        return message_json(cloud_tpu.GetGuestAttributesResponse.pb(response), {}, call.version)

    def simulate_maintenance_event(self, call: Call) -> dict[str, Any]:
        request = request_body(call, cloud_tpu.SimulateMaintenanceEventRequest)
        operation = self._cloud.simulate_maintenance_event(call.name, list(request.worker_ids))
        return self._operation(operation, call.version)

    def start_node(self, call: Call) -> dict[str, Any]:
        request_body(call, cloud_tpu.StartNodeRequest)
        return self._operation(self._cloud.start_node(call.name), call.version)

    def stop_node(self, call: Call) -> dict[str, Any]:
        request_body(call, cloud_tpu.StopNodeRequest)
        return self._operation(self._cloud.stop_node(call.name), call.version)

    # ------------------------------------------------------------------- operations
    def get_operation(self, call: Call) -> dict[str, Any]:
        operation, extras = self._cloud.operation_document(call.name)
        return operation_json(operation, extras, call.version)

    def list_operations(self, call: Call) -> dict[str, Any]:
        page, token = self._cloud.list_operation_documents(
            call.name, call.integer("pageSize"), call.query.get("pageToken", "")
        )
        result: dict[str, Any] = {}
        if page:
            result["operations"] = [operation_json(op, ex, call.version) for op, ex in page]
        if token:
            result["nextPageToken"] = token
        return result

    def delete_operation(self, call: Call) -> dict[str, Any]:
        self._cloud.delete_operation(call.name)
        return {}

    def cancel_operation(self, call: Call) -> dict[str, Any]:
        self._cloud.cancel_operation(call.name)
        return {}

    def _operation(self, operation: operations_pb2.Operation, version: str) -> dict[str, Any]:
        """The operation a call started, as JSON (with its response's REST-only fields when
        it is already done)."""
        extras: Extras = {}
        if operation.done:
            with contextlib.suppress(ApiError):  # deleted since: answer what the call gave
                operation, extras = self._cloud.operation_document(operation.name)
        return operation_json(operation, extras, version)

    # ------------------------------------------------------- locations and catalog
    def list_locations(self, call: Call) -> dict[str, Any]:
        response = self._cloud.list_locations(
            call.name,
            call.query.get("filter", ""),
            call.integer("pageSize"),
            call.query.get("pageToken", ""),
        )
        return message_json(response, {}, call.version)

    def get_location(self, call: Call) -> dict[str, Any]:
        return message_json(self._cloud.get_location(call.name), {}, call.version)

    def list_accelerator_types(self, call: Call) -> dict[str, Any]:
        response = self._cloud.list_accelerator_types(
            call.name,
            call.query.get("filter", ""),
            call.integer("pageSize"),
            call.query.get("pageToken", ""),
        )
        return message_json(cloud_tpu.ListAcceleratorTypesResponse.pb(response), {}, call.version)

    def get_accelerator_type(self, call: Call) -> dict[str, Any]:
        response = self._cloud.get_accelerator_type(call.name)
        return message_json(cloud_tpu.AcceleratorType.pb(response), {}, call.version)

    def list_runtime_versions(self, call: Call) -> dict[str, Any]:
        response = self._cloud.list_runtime_versions(
            call.name,
            call.query.get("filter", ""),
            call.integer("pageSize"),
            call.query.get("pageToken", ""),
        )
        return message_json(cloud_tpu.ListRuntimeVersionsResponse.pb(response), {}, call.version)

    def get_runtime_version(self, call: Call) -> dict[str, Any]:
        response = self._cloud.get_runtime_version(call.name)
        return message_json(cloud_tpu.RuntimeVersion.pb(response), {}, call.version)

    def list_reservations(self, call: Call) -> dict[str, Any]:
        response = self._cloud.list_reservations(
            call.name, call.integer("pageSize"), call.query.get("pageToken", "")
        )
        return message_json(cloud_tpu.ListReservationsResponse.pb(response), {}, call.version)


# ------------------------------------------------------------------------------ server
class TpuRestServer:
    """A threaded HTTP/1.1 server (keep-alive) on 127.0.0.1 for TpuRestApi."""

    def __init__(self, api: TpuRestApi, port: int = 0) -> None:
        self.api = api
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    def start(self) -> None:
        api = self.api

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "ESF"  # what Google's API front ends call themselves
            sys_version = ""

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._reply(413, {"error": {"code": 413, "message": "body too large"}}, True)
                    self.close_connection = True
                    return
                raw = self.rfile.read(length) if length else b""
                status, answer, pretty = api.handle(self.command, self.path, raw)
                self._reply(status, answer, pretty)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

            def _reply(self, status: int, body: dict[str, Any], pretty: bool) -> None:
                text = json.dumps(body, indent=2 if pretty else None)
                data = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer((LISTEN_HOST, self._port), Handler)
        server.daemon_threads = True
        self._server = server
        self.endpoint = f"http://{LISTEN_HOST}:{server.server_address[1]}/"
        self._thread = serve_in_thread(server, "tpu-rest")

    def close(self) -> None:
        if self._server is not None:
            stop_serving(self._server, self._thread)
            self._server = None
