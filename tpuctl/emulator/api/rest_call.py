"""One call to the Cloud TPU REST API, apart from the routes and handlers in rest.py that answer
it: the request as parsed (Call, checked against SYSTEM_PARAMETERS and the route's Method), the
answer's JSON (a message, a page of a listing, a long-running operation, or Google's error body
with the HTTP status of the gRPC code), and the RequestLog of the calls that change something.
The messages' own JSON (v2alpha1 and v2, REST-only fields) is rest_json.py's.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import json_format
from google.protobuf.message import Message

from tpuctl.emulator.api import rest_json
from tpuctl.emulator.control.records import Extras
from tpuctl.emulator.control.status import ApiError, invalid

REQUEST_LOG_SIZE = 2000
# google.rpc.Code → HTTP status, as Google's API front ends map them.
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}
# Query parameters every method takes (the discovery documents' "parameters").
SYSTEM_PARAMETERS = frozenset(
    {
        "$.xgafv",
        "access_token",
        "alt",
        "callback",
        "fields",
        "key",
        "oauth_token",
        "prettyPrint",
        "quotaUser",
        "uploadType",
        "upload_protocol",
    }
)
_EMPTY = "type.googleapis.com/google.protobuf.Empty"


@dataclass
class Call:
    """One request, parsed: `name` is the resource (or parent) the path names."""

    version: str
    http_method: str
    name: str
    query: dict[str, str]
    body: Any
    path: str

    def integer(self, key: str) -> int:
        text = self.query.get(key, "")
        if not text:
            return 0
        if not re.fullmatch(r"-?\d+", text):
            field_name = rest_json.snake_case(key)
            raise invalid(f"Invalid value at '{field_name}' (TYPE_INT32), \"{text}\"")
        return int(text)

    def boolean(self, key: str) -> bool:
        text = self.query.get(key, "false").lower()
        if text not in ("true", "false", "1", "0"):
            field_name = rest_json.snake_case(key)
            raise invalid(f"Invalid value at '{field_name}' (TYPE_BOOL), \"{text}\"")
        return text in ("true", "1")


Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class Method:
    """A REST method: its handler, its discovery id, its own query parameters, and the gRPC
    method name under which the injected API faults count it."""

    handler: Handler
    api: str
    params: frozenset[str] = frozenset()
    rpc: str = ""
    mutates: bool = False
    creates: str = ""  # the query parameter naming the resource a create makes
    alpha_only: bool = False  # v2 has no such method


def check_query(call: Call, method: Method) -> None:
    """Refuses a query parameter neither the system's nor the method's, and any alt but json."""
    for key in call.query:
        if key not in SYSTEM_PARAMETERS and key not in method.params:
            raise invalid(
                f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query '
                f"parameter. Field '{key}' could not be found in request message."
            )
    alt = call.query.get("alt", "json")
    if alt != "json":
        raise invalid(f"The emulator answers alt=json only, not alt={alt}")


@dataclass
class RequestLog:
    """The last requests that change something (POST, PATCH, DELETE), bodies included."""

    limit: int = REQUEST_LOG_SIZE
    _entries: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries.append(entry)
            while len(self._entries) > self.limit:
                self._entries.popleft()

    def find(self, resource: str | None = None) -> list[dict[str, Any]]:
        """Oldest first; with `resource`, the requests on that resource name only."""
        with self._lock:
            return [e for e in self._entries if resource is None or e["resource"] == resource]


def unimplemented(call: Call) -> dict[str, Any]:
    raise ApiError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{call.http_method} {call.path} is not implemented by the emulator",
    )


def no_such_url(path: str) -> ApiError:
    return ApiError(
        grpc.StatusCode.NOT_FOUND, f"The requested URL {path} was not found on this server."
    )


def request_body(call: Call, kind: Any) -> Any:
    """A custom method's request body (its `name` is the path's)."""
    message = kind.pb()()
    rest_json.parse_request(dict(call.body or {}), message, call.version, "")
    return kind.wrap(message)


def message_json(message: Any, extras: Extras, version: str) -> dict[str, Any]:
    pb = message if isinstance(message, Message) else type(message).pb(message)
    return rest_json.render(pb, extras, version)


def listing_json(
    key: str, page: list[tuple[Any, Extras]], token: str, version: str
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if page:
        result[key] = [message_json(message, extras, version) for message, extras in page]
    if token:
        result["nextPageToken"] = token
    return result


_RESPONSE_TYPES: dict[str, Any] = {
    "google.cloud.tpu.v2alpha1.QueuedResource": cloud_tpu.QueuedResource,
    "google.cloud.tpu.v2alpha1.Node": cloud_tpu.Node,
}


def operation_json(
    operation: operations_pb2.Operation, extras: Mapping[str, Any], version: str
) -> dict[str, Any]:
    """A long-running operation as the REST API answers it: `{name, metadata{@type, …}, done,
    response{@type, …}}` or `error{code, message}`, the types of `version`."""
    result: dict[str, Any] = {"name": operation.name}
    if operation.HasField("metadata"):
        metadata = cloud_tpu.OperationMetadata.pb()()
        operation.metadata.Unpack(metadata)
        fields = json_format.MessageToDict(metadata)
        fields["apiVersion"] = version
        result["metadata"] = {"@type": rest_json.type_url(version, "OperationMetadata"), **fields}
    if operation.done:
        result["done"] = True
    if operation.HasField("error"):
        result["error"] = json_format.MessageToDict(operation.error)
    elif operation.HasField("response"):
        full_name = operation.response.TypeName()
        kind = _RESPONSE_TYPES.get(full_name)
        if kind is None:
            result["response"] = {"@type": _EMPTY}
        else:
            message = kind.pb()()
            operation.response.Unpack(message)
            short = full_name.rsplit(".", 1)[1]
            rendered = rest_json.render(message, dict(extras), version)
            result["response"] = {"@type": rest_json.type_url(version, short), **rendered}
    return result


def error_json(error: ApiError) -> tuple[int, dict[str, Any]]:
    """Google's JSON error: `{"error": {"code": HTTP, "message", "status", "details"?}}`."""
    status = HTTP_STATUS.get(error.code, 500)
    body: dict[str, Any] = {"code": status, "message": error.message, "status": error.code.name}
    violation = getattr(error, "field_violation", None)
    if violation is not None:
        body["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": violation, "description": error.message}],
            }
        ]
    return status, {"error": body}
