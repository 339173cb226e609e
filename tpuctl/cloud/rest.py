"""The Cloud TPU API's REST face (v2alpha1 JSON over HTTP, google-auth's AuthorizedSession),
behind the same methods as google-cloud-tpu's gRPC TpuClient, for what that client lacks.

`RestTpuClient` answers the queued-resource, node and operation calls TpuApi makes, with the
generated client's keywords (`name=`, `parent=`, `request=`, `retry=`, `timeout=`), so TpuApi
applies one retry policy, one call budget and one error mapping whichever transport it uses:
the service's JSON errors become the same google.api_core exceptions gRPC raises (by their
`status`, not the HTTP code: ALREADY_EXISTS and ABORTED are both 409), a connection refused
is UNAVAILABLE and a read timeout DEADLINE_EXCEEDED. What it reads comes back as the v2alpha1
proto-plus messages, with every field the message lacks (a queued resource's
provisioningModel and runDuration, a node's bootDiskConfig.diskSizeGb, …) kept as JSON in
`rest_fields(message)`.

The endpoint: CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU (gcloud's own override, which `tpuctl
emulator env` exports), else https://tpu.googleapis.com/.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"
TPU_API = "https://tpu.googleapis.com/"
VERSION = "v2alpha1"
# The attribute of a message read over REST that holds the JSON its type lacks.
_REST_FIELDS = "_tpuctl_rest_fields"
# The attribute a queued resource synthesized from Compute Engine (tpuctl.cloud.compute_slices)
# carries with the API it came from ("compute"); one read from the Cloud TPU API has none.
SOURCE_ATTRIBUTE = "_tpuctl_source"
PAGE_SIZE = 500


def endpoint(environ: Mapping[str, str] | None = None) -> str:
    """The REST API's base URL, ending in `/`."""
    env = os.environ if environ is None else environ
    base = env.get(ENDPOINT_ENV, "").strip() or TPU_API
    if "://" not in base:
        base = f"http://{base}"
    return base.rstrip("/") + "/"


def rest_fields(message: Any) -> dict[str, Any]:
    """What the REST API answered beyond `message`'s fields (camelCase JSON, at the same
    place in the object); empty for a message read over gRPC."""
    found = getattr(message, _REST_FIELDS, None)
    return found if isinstance(found, dict) else {}


def rest_field(message: Any, *path: str) -> Any:
    """One REST-only value (`rest_field(qr, "runDuration", "terminationTime")`), or None."""
    value: Any = rest_fields(message)
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


class RestOperation:
    """A long-running operation read over REST, as google.api_core's Operation is used:
    `done(retry=)` polls it, `result(timeout=)` raises its error or answers its response."""

    def __init__(self, client: RestTpuClient, data: dict[str, Any], result_type: Any) -> None:
        self._client = client
        self._data = data
        self._result_type = result_type

    @property
    def name(self) -> str:
        return str(self._data.get("name", ""))

    @property
    def operation(self) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(name=self.name, done=bool(self._data.get("done")))

    def done(self, retry: Any = None, timeout: Any = None) -> bool:
        if not self._data.get("done"):
            self._data = self._client.get_operation(name=self.name, retry=retry, timeout=timeout)
        return bool(self._data.get("done"))

    def result(self, timeout: float | None = None) -> Any:
        if not self._data.get("done"):
            raise TimeoutError(f"{self.name} is still running")
        error = self._data.get("error")
        if error:
            raise _api_error(int(error.get("code", 2)), str(error.get("message", "")), None)
        response = self._data.get("response") or {}
        if self._result_type is None or not response:
            return None
        body = {key: value for key, value in response.items() if key != "@type"}
        return _parse(self._result_type, body)


class RestTpuClient:
    """See the module doc. `session` is an AuthorizedSession (or any requests.Session)."""

    def __init__(self, session: Any, base: str) -> None:
        self.session = session
        self.base = base

    @classmethod
    def connect(cls, credentials: Any, environ: Mapping[str, str] | None = None) -> RestTpuClient:
        from google.auth.transport.requests import AuthorizedSession

        session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
        return cls(session, endpoint(environ))

    # ----------------------------------------------------------------- queued resources

    def get_queued_resource(self, name: str, retry: Any = None, timeout: Any = None) -> Any:
        from google.cloud import tpu_v2alpha1 as tpu

        data = self._call("GET", name, retry=retry, timeout=timeout)
        return _parse(tpu.QueuedResource, data)

    def list_queued_resources(self, parent: str, retry: Any = None, timeout: Any = None) -> Any:
        from google.cloud import tpu_v2alpha1 as tpu

        items = self._pages(f"{parent}/queuedResources", "queuedResources", retry, timeout)
        return [_parse(tpu.QueuedResource, item) for item in items]

    def create_queued_resource(
        self, request: Any, retry: Any = None, timeout: Any = None
    ) -> RestOperation:
        """`request`: tpuctl's rendered request (its `rest_body()`, every field included) or
        a CreateQueuedResourceRequest message."""
        from google.cloud import tpu_v2alpha1 as tpu

        grpc = getattr(request, "grpc", request)
        if hasattr(request, "rest_body"):
            body = request.rest_body()
        else:
            body = _message_json(grpc.queued_resource)
        params = {"queuedResourceId": grpc.queued_resource_id}
        if grpc.request_id:
            params["requestId"] = grpc.request_id
        data = self._call(
            "POST",
            f"{grpc.parent}/queuedResources",
            params=params,
            body=body,
            retry=retry,
            timeout=timeout,
        )
        return RestOperation(self, data, tpu.QueuedResource)

    def delete_queued_resource(
        self, request: Any, retry: Any = None, timeout: Any = None
    ) -> RestOperation:
        params: dict[str, str] = {}
        if request.force:
            params["force"] = "true"
        if request.request_id:
            params["requestId"] = request.request_id
        data = self._call("DELETE", request.name, params=params, retry=retry, timeout=timeout)
        return RestOperation(self, data, None)

    def reset_queued_resource(
        self, name: str, retry: Any = None, timeout: Any = None
    ) -> RestOperation:
        from google.cloud import tpu_v2alpha1 as tpu

        data = self._call("POST", f"{name}:reset", body={}, retry=retry, timeout=timeout)
        return RestOperation(self, data, tpu.QueuedResource)

    # --------------------------------------------------------------------------- nodes

    def get_node(self, name: str, retry: Any = None, timeout: Any = None) -> Any:
        from google.cloud import tpu_v2alpha1 as tpu

        return _parse(tpu.Node, self._call("GET", name, retry=retry, timeout=timeout))

    def list_nodes(self, parent: str, retry: Any = None, timeout: Any = None) -> Any:
        from google.cloud import tpu_v2alpha1 as tpu

        items = self._pages(f"{parent}/nodes", "nodes", retry, timeout)
        return [_parse(tpu.Node, item) for item in items]

    # ---------------------------------------------------------------------- operations

    def get_operation(self, name: str, retry: Any = None, timeout: Any = None) -> dict[str, Any]:
        return self._call("GET", name, retry=retry, timeout=timeout)

    # --------------------------------------------------------------------------- calls

    def _pages(self, path: str, key: str, retry: Any, timeout: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"pageSize": str(PAGE_SIZE)}
            if token:
                params["pageToken"] = token
            data = self._call("GET", path, params=params, retry=retry, timeout=timeout)
            items.extend(data.get(key) or [])
            token = str(data.get("nextPageToken") or "")
            if not token:
                return items

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        retry: Any = None,
        timeout: Any = None,
    ) -> dict[str, Any]:
        """One call as the generated client makes it: each attempt within `timeout` (a
        number, or a CallBudget-like decorator setting `timeout=`), attempts per `retry`."""
        url = f"{self.base}{VERSION}/{quote(path, safe='/:-_.~')}"

        def attempt(timeout: float | None = None) -> dict[str, Any]:
            return self._send(method, url, params, body, timeout)

        call: Callable[..., dict[str, Any]] = attempt
        if callable(timeout):
            call = timeout(call)
        elif timeout is not None:
            seconds = float(timeout)

            def call(timeout: float | None = seconds) -> dict[str, Any]:
                return attempt(timeout=timeout)

        if retry is not None:
            call = retry(call)
        return call()

    def _send(
        self,
        method: str,
        url: str,
        params: dict[str, str] | None,
        body: Any,
        timeout: float | None,
    ) -> dict[str, Any]:
        import requests
        from google.api_core import exceptions

        try:
            response = self.session.request(method, url, params=params, json=body, timeout=timeout)
        except requests.exceptions.Timeout as error:
            raise exceptions.DeadlineExceeded(f"{method} {url}: {error}") from None  # type: ignore[no-untyped-call]
        except requests.exceptions.RequestException as error:
            raise exceptions.ServiceUnavailable(f"{method} {url}: {error}") from None  # type: ignore[no-untyped-call]
        if response.status_code >= 400:
            raise _http_error(response)
        if not response.content:
            return {}
        data: dict[str, Any] = response.json()
        return data


# The HTTP status the REST face answers for each gRPC code, when the error has no `status`.
_HTTP_TO_GRPC = {
    400: 3,  # INVALID_ARGUMENT
    401: 16,  # UNAUTHENTICATED
    403: 7,  # PERMISSION_DENIED
    404: 5,  # NOT_FOUND
    409: 10,  # ABORTED
    412: 9,  # FAILED_PRECONDITION
    429: 8,  # RESOURCE_EXHAUSTED
    499: 1,  # CANCELLED
    500: 13,  # INTERNAL
    501: 12,  # UNIMPLEMENTED
    503: 14,  # UNAVAILABLE
    504: 4,  # DEADLINE_EXCEEDED
}


def _http_error(response: Any) -> Exception:
    """The google.api_core exception gRPC raises for the same error (by its `status` name)."""
    import grpc

    message = response.text[:300] or response.reason or "no reason given"
    code = _HTTP_TO_GRPC.get(response.status_code, 2)
    try:
        error = response.json()["error"]
        message = str(error.get("message") or message)
        status = error.get("status")
        if status in grpc.StatusCode.__members__:
            code = grpc.StatusCode[status].value[0]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return _api_error(code, message, response)


def _api_error(code: int, message: str, response: Any) -> Exception:
    from google.api_core import exceptions

    error: Exception = exceptions.from_grpc_status(code, message, response=response)  # type: ignore[no-untyped-call]
    return error


def _message_json(message: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    data: dict[str, Any] = json_format.MessageToDict(type(message).pb(message))
    return data


def _parse(message_type: Any, data: dict[str, Any]) -> Any:
    """`data` as a proto-plus `message_type`, what the message lacks kept beside it."""
    from google.protobuf import json_format

    pb = message_type.pb()()
    json_format.ParseDict(data, pb, ignore_unknown_fields=True)
    message = message_type.wrap(pb)
    extra = _unknown(data, pb.DESCRIPTOR)
    if extra:
        setattr(message, _REST_FIELDS, extra)
    return message


def _unknown(data: Any, descriptor: Any) -> dict[str, Any]:
    """The keys of `data` (and of its nested objects) that `descriptor` has no field for."""
    if not isinstance(data, dict):
        return {}
    found: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name.get(key)
        if field is None:
            found[key] = value
            continue
        kind = field.message_type
        if kind is None or kind.GetOptions().map_entry:
            continue
        if isinstance(value, list):
            nested = [_unknown(item, kind) for item in value]
            if any(nested):
                found[key] = nested
        else:
            inner = _unknown(value, kind)
            if inner:
                found[key] = inner
    return found
