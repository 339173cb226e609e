"""The one Compute Engine REST call tpuctl makes, on a port of its own: GET
`/compute/v1/projects/{project}`, whose `commonInstanceMetadata` says whether the project turns
OS Login on. Announced as TPUCTL_COMPUTE_ENDPOINT; read from tpuctl.emulator.vms.access."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tpuctl.emulator.vms.access import Access

LISTEN_HOST = "127.0.0.1"
_PROJECT = re.compile(r"^/compute/v1/projects/([a-z][a-z0-9:.-]*[a-z0-9])/?(\?.*)?$")


class ComputeServer:
    """A tiny HTTP server (one thread) for the project resource."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    def start(self) -> None:
        access = self.access

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                match = _PROJECT.match(self.path)
                if match is None:
                    self._reply(404, {"error": {"code": 404, "message": "not found"}})
                    return
                project = match.group(1)
                items = [
                    {"key": key, "value": value}
                    for key, value in sorted(access.project_metadata(project).items())
                ]
                body: dict[str, Any] = {
                    "kind": "compute#project",
                    "name": project,
                    "commonInstanceMetadata": {"kind": "compute#metadata", "items": items},
                }
                self._reply(200, body)

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
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="compute",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
