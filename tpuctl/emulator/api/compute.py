"""The Compute Engine REST face of the emulator, announced as TPUCTL_COMPUTE_ENDPOINT: the
methods of compute v1 the fake serves (tpuctl.emulator.compute), routed by the paths of
Compute Engine's discovery document, with every body checked against its schema and every
error in Google's JSON error format. The unmodified google-cloud-compute client (REST) talks
to it with `api_endpoint="http://127.0.0.1:PORT"`.

`projects.get` (whose `commonInstanceMetadata` says whether the project turns OS Login on) is
read from tpuctl.emulator.vms.access, and answers before the rest of the emulator is up.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tpuctl.emulator.api.http_thread import serve_in_thread, stop_serving
from tpuctl.emulator.compute.errors import ComputeApiError
from tpuctl.emulator.vms.access import Access

if TYPE_CHECKING:
    import re

    from tpuctl.emulator.compute.discovery import Method
    from tpuctl.emulator.compute.engine import ComputeEngine

log = logging.getLogger("tpuctl.emulator")

LISTEN_HOST = "127.0.0.1"
PREFIX = "/compute/v1/"
MAX_BODY = 4 * 1024 * 1024

Handler = Callable[["ComputeEngine", dict[str, str], dict[str, str], Any], dict[str, Any]]


def _scope(params: dict[str, str]) -> tuple[str, str]:
    if "zone" in params:
        return ("zones", params["zone"])
    if "region" in params:
        return ("regions", params["region"])
    return ("global", "")


def _graceful(query: dict[str, str]) -> bool:
    return query.get("noGracefulShutdown", "false").lower() != "true"


def _rid(query: dict[str, str]) -> str:
    from tpuctl.emulator.compute.links import check_request_id

    return check_request_id(query.get("requestId", ""))


def _size(query: dict[str, str]) -> int:
    try:
        return int(query.get("size", ""))
    except ValueError:
        raise ComputeApiError(400, "required", "Required field 'size' not specified") from None


def _template_region(p: dict[str, str]) -> str | None:
    return p.get("region")


# (resource, method) of the discovery document → what answers it.
ROUTES: dict[tuple[str, str], Handler] = {
    ("instances", "insert"): lambda e, p, q, b: e.insert_instance(
        p["project"], p["zone"], b, _no_source(q)
    ),
    ("instances", "get"): lambda e, p, q, b: e.get_instance(p["project"], p["zone"], p["instance"]),
    ("instances", "list"): lambda e, p, q, b: e.list_instances(p["project"], p["zone"], q),
    ("instances", "aggregatedList"): lambda e, p, q, b: e.aggregated_instances(p["project"], q),
    ("instances", "delete"): lambda e, p, q, b: e.delete_instance(
        p["project"], p["zone"], p["instance"], _rid(q), _graceful(q)
    ),
    ("instances", "stop"): lambda e, p, q, b: e.stop_instance(
        p["project"], p["zone"], p["instance"], _rid(q), _graceful(q)
    ),
    ("instances", "start"): lambda e, p, q, b: e.start_instance(
        p["project"], p["zone"], p["instance"], _rid(q)
    ),
    ("instances", "setMetadata"): lambda e, p, q, b: e.set_metadata(
        p["project"], p["zone"], p["instance"], b, _rid(q)
    ),
    ("instances", "simulateMaintenanceEvent"): lambda e, p, q, b: e.simulate_maintenance(
        p["project"], p["zone"], p["instance"], _rid(q)
    ),
    ("instances", "getGuestAttributes"): lambda e, p, q, b: e.guest_attributes(
        p["project"], p["zone"], p["instance"], q
    ),
    **{
        (resource, verb): handler
        for resource in ("instanceTemplates", "regionInstanceTemplates")
        for verb, handler in {
            "insert": lambda e, p, q, b: e.insert_template(
                p["project"], _template_region(p), b, _rid(q)
            ),
            "get": lambda e, p, q, b: e.get_template(
                p["project"], _template_region(p), p["instanceTemplate"]
            ),
            "list": lambda e, p, q, b: e.list_templates(p["project"], _template_region(p), q),
            "delete": lambda e, p, q, b: e.delete_template(
                p["project"], _template_region(p), p["instanceTemplate"], _rid(q)
            ),
        }.items()
    },
    ("resourcePolicies", "insert"): lambda e, p, q, b: e.insert_policy(
        p["project"], p["region"], b, _rid(q)
    ),
    ("resourcePolicies", "get"): lambda e, p, q, b: e.get_policy(
        p["project"], p["region"], p["resourcePolicy"]
    ),
    ("resourcePolicies", "list"): lambda e, p, q, b: e.list_policies(p["project"], p["region"], q),
    ("resourcePolicies", "delete"): lambda e, p, q, b: e.delete_policy(
        p["project"], p["region"], p["resourcePolicy"], _rid(q)
    ),
    **{
        (resource, verb): handler
        for resource in ("instanceGroupManagers", "regionInstanceGroupManagers")
        for verb, handler in {
            "insert": lambda e, p, q, b: e.insert_group(p["project"], _scope(p), b, _rid(q)),
            "get": lambda e, p, q, b: e.get_group(
                p["project"], _scope(p), p["instanceGroupManager"]
            ),
            "list": lambda e, p, q, b: e.list_groups(p["project"], _scope(p), q),
            "delete": lambda e, p, q, b: e.delete_group(
                p["project"], _scope(p), p["instanceGroupManager"], _rid(q), _graceful(q)
            ),
            "listManagedInstances": lambda e, p, q, b: e.managed_instances(
                p["project"], _scope(p), p["instanceGroupManager"]
            ),
            "resize": lambda e, p, q, b: e.resize_group(
                p["project"], _scope(p), p["instanceGroupManager"], _size(q), _rid(q)
            ),
        }.items()
    },
    **{
        (resource, verb): handler
        for resource in ("zoneOperations", "regionOperations", "globalOperations")
        for verb, handler in {
            "get": lambda e, p, q, b: e.get_operation(p["project"], _scope(p), p["operation"]),
            "wait": lambda e, p, q, b: e.wait_operation(p["project"], _scope(p), p["operation"]),
            "list": lambda e, p, q, b: e.list_operations(p["project"], _scope(p), q),
            "delete": lambda e, p, q, b: e.delete_operation(
                p["project"], _scope(p), p["operation"]
            ),
        }.items()
    },
    ("firewalls", "list"): lambda e, p, q, b: e.list_firewalls(p["project"], q),
    ("firewalls", "get"): lambda e, p, q, b: e.get_firewall(p["project"], p["firewall"]),
}


def _no_source(query: dict[str, str]) -> str:
    if query.get("sourceInstanceTemplate") or query.get("sourceMachineImage"):
        raise ComputeApiError(
            400,
            "invalid",
            "The emulator creates instances from their own properties only: "
            "sourceInstanceTemplate and sourceMachineImage are not supported",
        )
    return _rid(query)


class Router:
    """The routes above, their paths and query parameters read from the discovery document."""

    def __init__(self) -> None:
        from tpuctl.emulator.compute import discovery

        self.globals = discovery.global_parameters()
        self.routes: list[tuple[Method, re.Pattern[str], Handler]] = []
        for (resource, verb), handler in ROUTES.items():
            method = discovery.method(resource, verb)
            self.routes.append((method, method.pattern(), handler))
        # A fixed path wins over a parameter (…/instances/aggregated vs …/instances/{name}).
        self.routes.sort(key=lambda route: route[0].path.count("{"))

    def match(self, verb: str, path: str) -> tuple[Method, dict[str, str], Handler] | None:
        allowed = False
        for method, pattern, handler in self.routes:
            found = pattern.match(path)
            if found is None:
                continue
            if method.http_method == verb:
                return method, found.groupdict(), handler
            allowed = True
        if allowed:
            raise ComputeApiError(405, "methodNotAllowed", f"{verb} is not allowed on {path}")
        return None


def _check_body(method: Method, body: Any) -> None:
    from tpuctl.emulator.compute import discovery

    if method.request is None:
        return
    if not isinstance(body, dict):
        raise ComputeApiError(400, "parseError", "Invalid JSON payload received.")
    found = discovery.problems(method.request, body, root="resource")
    if not found:
        return
    first = found[0]
    parent, _, leaf = first.path.rpartition(".")
    if first.message.startswith("unknown field"):
        raise ComputeApiError(
            400,
            "invalid",
            f"Invalid JSON payload received. Unknown name \"{leaf}\" at '{parent}': Cannot find "
            f"field.{first.message[len('unknown field') :]}",
        )
    raise ComputeApiError(
        400, "invalid", f"Invalid value for field '{first.path}': {first.message}"
    )


class ComputeServer:
    """A threading HTTP server: projects.get always; the rest once `engine` is set."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.engine: ComputeEngine | None = None
        self._router: Router | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""
        self.unavailable = "The emulator is starting"

    def attach(self, engine: ComputeEngine) -> None:
        """Serve the fake from now on (the discovery document is read here, once). Without
        google-api-python-client, every request but projects.get says what to install."""
        from tpuctl.emulator.compute.discovery import DiscoveryMissing

        try:
            self._router = Router()
        except DiscoveryMissing as error:
            self.unavailable = str(error)
            engine.close()
            return
        self.engine = engine

    def handle(self, verb: str, target: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one request."""
        url = urlsplit(target)
        try:
            if not url.path.startswith(PREFIX):
                raise ComputeApiError(404, "notFound", f"No such path: {url.path}")
            path = url.path[len(PREFIX) :].rstrip("/")
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            parts = path.split("/")
            if verb == "GET" and len(parts) == 2 and parts[0] == "projects":
                return 200, self._project(parts[1])
            engine, router = self.engine, self._router
            if engine is None or router is None:
                raise ComputeApiError(503, "backendError", self.unavailable)
            matched = router.match(verb, path)
            if matched is None:
                raise ComputeApiError(404, "notFound", f"No such method: {verb} {url.path}")
            method, params, handler = matched
            unknown = set(query) - method.query - router.globals
            if unknown:
                name = sorted(unknown)[0]
                raise ComputeApiError(
                    400,
                    "invalid",
                    f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query '
                    f"parameter. Field '{name}' could not be found in request message.",
                )
            body: Any = None
            if method.request is not None:
                try:
                    body = json.loads(raw.decode("utf-8") or "null")
                except (UnicodeDecodeError, ValueError):
                    raise ComputeApiError(
                        400, "parseError", "Invalid JSON payload received."
                    ) from None
                _check_body(method, body)
            return 200, handler(engine, params, query, body)
        except ComputeApiError as error:
            return error.status, error.body()
        except Exception as error:
            log.exception("compute request %s %s failed", verb, target)
            return 500, ComputeApiError(500, "backendError", f"emulator error: {error}").body()

    def _project(self, project: str) -> dict[str, Any]:
        items = [
            {"key": key, "value": value}
            for key, value in sorted(self.access.project_metadata(project).items())
        ]
        return {
            "kind": "compute#project",
            "name": project,
            "commonInstanceMetadata": {"kind": "compute#metadata", "items": items},
        }

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._reply(413, ComputeApiError(413, "tooLarge", "body too large").body())
                    return
                raw = self.rfile.read(length) if length else b""
                status, body = server.handle(self.command, self.path, raw)
                self._reply(status, body)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((LISTEN_HOST, 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.endpoint = f"http://{LISTEN_HOST}:{port}"
        self._thread = serve_in_thread(self._server, "compute")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self._server is not None:
            stop_serving(self._server, self._thread)
            self._server = None
