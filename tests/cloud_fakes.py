"""Local stand-ins for the Google APIs `tpuctl doctor` asks besides the TPU API, each on
127.0.0.1 and spoken to by the real client library: Service Usage and Cloud Quotas as gRPC
servers (the libraries' own message types), Cloud Storage's bucket and testIamPermissions
calls, Compute Engine's project and firewalls, and the testIamPermissions of Resource Manager
(projects) and IAM (service accounts) as HTTP JSON servers (fake-gcs-server answers no
testIamPermissions; the emulator's Compute server no firewalls)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc


class Refusal(Exception):
    """Raised by a fake's handler: the call fails with this gRPC code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@contextmanager
def grpc_fake(
    service: str, methods: dict[str, tuple[Any, Any, Callable[[Any], Any]]]
) -> Iterator[str]:
    """A gRPC server for `service` with proto-plus `(request type, response type, handler)`
    per method; yields its `127.0.0.1:PORT`."""

    def unary(request_type: Any, response_type: Any, fn: Callable[[Any], Any]) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return fn(request)
            except Refusal as refusal:
                context.abort(refusal.code, refusal.message)

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=request_type.deserialize,
            response_serializer=response_type.serialize,
        )

    handlers = {name: unary(*spec) for name, spec in methods.items()}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@dataclass
class ServiceUsageFake:
    """GetService answers `state` for every service, with the project number 123456789012;
    `refuse` makes it fail with that code instead."""

    state: str = "ENABLED"
    refuse: grpc.StatusCode | None = None
    asked: list[str] = field(default_factory=list)

    def get_service(self, request: Any) -> Any:
        from google.cloud import service_usage_v1

        self.asked.append(request.name)
        if self.refuse is not None:
            raise Refusal(self.refuse, "Permission denied to get service")
        return service_usage_v1.Service(
            name="projects/123456789012/services/" + request.name.rsplit("/", 1)[-1],
            parent="projects/123456789012",
            state=getattr(service_usage_v1.State, self.state),
        )


@contextmanager
def service_usage_server(fake: ServiceUsageFake) -> Iterator[str]:
    from google.cloud import service_usage_v1

    method = (service_usage_v1.GetServiceRequest, service_usage_v1.Service, fake.get_service)
    with grpc_fake("google.api.serviceusage.v1.ServiceUsage", {"GetService": method}) as host:
        yield host


@dataclass
class QuotaFake:
    """ListQuotaInfos: one QuotaInfo per `limits` entry, metric → {zone or "": value}."""

    limits: dict[str, dict[str, int]] = field(default_factory=dict)
    refuse: grpc.StatusCode | None = None

    def list_quota_infos(self, request: Any) -> Any:
        from google.cloud import cloudquotas_v1

        if self.refuse is not None:
            raise Refusal(self.refuse, "Permission 'cloudquotas.quotas.get' denied")
        infos = []
        for metric, values in self.limits.items():
            quota_id = metric.rsplit("/", 1)[-1]
            infos.append(
                cloudquotas_v1.QuotaInfo(
                    name=f"{request.parent}/quotaInfos/{quota_id}",
                    quota_id=quota_id,
                    metric=metric,
                    service="tpu.googleapis.com",
                    dimensions=["zone"],
                    metric_unit="1/{project}/{zone}",
                    dimensions_infos=[
                        cloudquotas_v1.DimensionsInfo(
                            dimensions={"zone": zone} if zone else {},
                            details=cloudquotas_v1.QuotaDetails(value=value),
                            applicable_locations=[zone] if zone else ["global"],
                        )
                        for zone, value in values.items()
                    ],
                )
            )
        return cloudquotas_v1.ListQuotaInfosResponse(quota_infos=infos)


@contextmanager
def quota_server(fake: QuotaFake) -> Iterator[str]:
    from google.cloud import cloudquotas_v1 as quotas

    method = (quotas.ListQuotaInfosRequest, quotas.ListQuotaInfosResponse, fake.list_quota_infos)
    with grpc_fake("google.api.cloudquotas.v1.CloudQuotas", {"ListQuotaInfos": method}) as host:
        yield host


Route = Callable[[re.Match[str], dict[str, list[str]]], tuple[int, dict[str, Any]]]
# A POST handler gets the request's JSON body instead of the query.
PostRoute = Callable[[re.Match[str], dict[str, Any]], tuple[int, dict[str, Any]]]


@contextmanager
def http_fake(
    routes: dict[str, Route], post_routes: dict[str, PostRoute] | None = None
) -> Iterator[str]:
    """An HTTP JSON server: GET paths matched against `routes`, POST paths against
    `post_routes` (regex → handler giving the status and body); yields
    `http://127.0.0.1:PORT`."""
    compiled = [(re.compile(pattern), handler) for pattern, handler in routes.items()]
    posts = [(re.compile(pattern), handler) for pattern, handler in (post_routes or {}).items()]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            for pattern, handler in compiled:
                match = pattern.fullmatch(parts.path)
                if match is not None:
                    status, body = handler(match, parse_qs(parts.query))
                    break
            else:
                status, body = 404, {"error": {"code": 404, "message": "Not Found"}}
            self._answer(status, body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            path = urlsplit(self.path).path
            for pattern, handler in posts:
                match = pattern.fullmatch(path)
                if match is not None:
                    status, body = handler(match, request)
                    break
            else:
                status, body = 404, {"error": {"code": 404, "message": "Not Found"}}
            self._answer(status, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class GcsFake:
    """Buckets by name: their location and the permissions testIamPermissions grants."""

    buckets: dict[str, tuple[str, set[str]]] = field(default_factory=dict)

    def bucket(self, match: re.Match[str], _query: dict[str, list[str]]) -> tuple[int, Any]:
        name = match.group(1)
        if name not in self.buckets:
            return 404, {"error": {"code": 404, "message": "The bucket does not exist"}}
        location = self.buckets[name][0]
        return 200, {
            "kind": "storage#bucket",
            "id": name,
            "name": name,
            "location": location,
            "locationType": "region",
        }

    def test_permissions(self, match: re.Match[str], query: dict[str, list[str]]) -> Any:
        name = match.group(1)
        if name not in self.buckets:
            return 404, {"error": {"code": 404, "message": "The bucket does not exist"}}
        granted = self.buckets[name][1]
        asked = query.get("permissions", [])
        return 200, {
            "kind": "storage#testIamPermissionsResponse",
            "permissions": [permission for permission in asked if permission in granted],
        }


@contextmanager
def gcs_server(fake: GcsFake) -> Iterator[str]:
    routes: dict[str, Route] = {
        r"/storage/v1/b/([^/]+)": fake.bucket,
        r"/storage/v1/b/([^/]+)/iam/testPermissions": fake.test_permissions,
    }
    with http_fake(routes) as url:
        yield url


@dataclass
class ComputeFake:
    """A project's common instance metadata and firewall rules; the machine types of each
    zone, the image families of each project, the reservations of each zone (their status)."""

    metadata: dict[str, str] = field(default_factory=dict)
    firewalls: list[dict[str, Any]] = field(default_factory=list)
    machine_types: dict[str, set[str]] = field(default_factory=dict)
    families: dict[str, set[str]] = field(default_factory=dict)
    reservations: dict[str, dict[str, str]] = field(default_factory=dict)

    def machine_type(self, match: re.Match[str], _query: dict[str, list[str]]) -> Any:
        project, zone, name = match.groups()
        if name in self.machine_types.get(zone, set()):
            return 200, {"name": name, "zone": zone}
        return _missing(f"projects/{project}/zones/{zone}/machineTypes/{name}")

    def family(self, match: re.Match[str], _query: dict[str, list[str]]) -> Any:
        project, family = match.groups()
        if family in self.families.get(project, set()):
            return 200, {"name": f"{family}-v20260101", "family": family, "status": "READY"}
        return _missing(f"projects/{project}/global/images/family/{family}")

    def reservation(self, match: re.Match[str], _query: dict[str, list[str]]) -> Any:
        project, zone, name = match.groups()
        status = self.reservations.get(zone, {}).get(name)
        if status is not None:
            return 200, {"name": name, "zone": zone, "status": status}
        return _missing(f"projects/{project}/zones/{zone}/reservations/{name}")

    def project(self, match: re.Match[str], _query: dict[str, list[str]]) -> tuple[int, Any]:
        items = [{"key": key, "value": value} for key, value in self.metadata.items()]
        return 200, {"name": match.group(1), "commonInstanceMetadata": {"items": items}}

    def firewall_list(self, _match: re.Match[str], _query: dict[str, list[str]]) -> Any:
        return 200, {"kind": "compute#firewallList", "items": self.firewalls}


def _missing(resource: str) -> tuple[int, Any]:
    """Compute Engine's 404 for a resource that does not exist."""
    message = f"The resource '{resource}' was not found"
    return 404, {"error": {"code": 404, "message": message, "errors": [{"reason": "notFound"}]}}


@contextmanager
def compute_server(fake: ComputeFake) -> Iterator[str]:
    routes: dict[str, Route] = {
        r"/compute/v1/projects/([^/]+)": fake.project,
        r"/compute/v1/projects/([^/]+)/global/firewalls": fake.firewall_list,
        r"/compute/v1/projects/([^/]+)/zones/([^/]+)/machineTypes/([^/]+)": fake.machine_type,
        r"/compute/v1/projects/([^/]+)/global/images/family/([^/]+)": fake.family,
        r"/compute/v1/projects/([^/]+)/zones/([^/]+)/reservations/([^/]+)": fake.reservation,
    }
    with http_fake(routes) as url:
        yield url


@dataclass
class IamFake:
    """testIamPermissions of projects (Resource Manager) and service accounts (IAM): the
    permissions granted on each resource, by project id or account email; every ask kept."""

    projects: dict[str, set[str]] = field(default_factory=dict)
    accounts: dict[str, set[str]] = field(default_factory=dict)
    asked: list[tuple[str, list[str]]] = field(default_factory=list)

    def _answer(self, resource: str, granted: set[str] | None, body: dict[str, Any]) -> Any:
        asked = [str(permission) for permission in body.get("permissions") or []]
        self.asked.append((resource, asked))
        if granted is None:
            return 403, {"error": {"code": 403, "message": f"no access to {resource}"}}
        return 200, {"permissions": [p for p in asked if p in granted]}

    def project(self, match: re.Match[str], body: dict[str, Any]) -> Any:
        name = match.group(1)
        return self._answer(f"projects/{name}", self.projects.get(name), body)

    def account(self, match: re.Match[str], body: dict[str, Any]) -> Any:
        email = match.group(1)
        return self._answer(f"serviceAccounts/{email}", self.accounts.get(email), body)


@contextmanager
def iam_server(fake: IamFake) -> Iterator[str]:
    """Both APIs on one server (each has its own endpoint variable: point both at it)."""
    posts: dict[str, PostRoute] = {
        r"/v1/projects/([^/:]+):testIamPermissions": fake.project,
        r"/v1/projects/-/serviceAccounts/([^/:]+):testIamPermissions": fake.account,
    }
    with http_fake({}, posts) as url:
        yield url
