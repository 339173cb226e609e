"""The GCE metadata server of one emulated TPU VM: the values it serves and a tiny HTTP server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union
from urllib.parse import parse_qs, unquote, urlsplit

# A metadata tree: directories are dicts, leaves are strings.
MetadataTree = dict[str, Union[str, "MetadataTree"]]

_MAX_HEADER_BYTES = 64 * 1024
_FORBIDDEN_BODY = (
    "Your client does not have permission to get URL from this server. "
    "Missing Metadata-Flavor:Google header.\n"
)

COORDINATOR_PORT = 8080  # the port in MEGASCALE_COORDINATOR_ADDRESS


@dataclass(frozen=True)
class WorkerView:
    """What the metadata server of one worker knows about itself and its slice."""

    node_id: str
    node_name: str
    project: str
    zone: str
    accelerator_type: str
    topology: str
    preemptible: bool
    worker: int
    worker_ips: tuple[str, ...]
    slice_index: int
    num_slices: int
    coordinator: str | None


def project_number(project: str) -> str:
    """A stable 12-digit project number derived from the project id (real ones are opaque)."""
    digest = int(hashlib.sha256(project.encode()).hexdigest(), 16)
    return str(100_000_000_000 + digest % 900_000_000_000)


def instance_name(node_name: str, worker: int) -> str:
    """A TPU VM's instance (and host) name, like t1v-n-<8 hex>-w-<worker>: what the node's
    `hostname` guest attribute publishes and `gcloud compute start-iap-tunnel` takes."""
    tag = hashlib.sha256(node_name.encode()).hexdigest()[:8]
    return f"t1v-n-{tag}-w-{worker}"


def hostname(view: WorkerView) -> str:
    return instance_name(view.node_name, view.worker)


def tpu_env(view: WorkerView) -> str:
    """The `tpu-env` attribute: one `KEY: 'value'` line per setting."""
    values: list[tuple[str, str]] = [
        ("ACCELERATOR_TYPE", view.accelerator_type),
        ("CONSUMER_PROJECT_ID", view.project),
        ("CONSUMER_PROJECT_NUMBER", project_number(view.project)),
        ("NODE_ID", view.node_id),
        ("PREEMPTIBLE", "true" if view.preemptible else "false"),
        ("TOPOLOGY", view.topology),
        ("WORKER_ID", str(view.worker)),
        ("ZONE", view.zone),
    ]
    if view.coordinator is not None:
        values += [
            ("MEGASCALE_COORDINATOR_ADDRESS", view.coordinator),
            ("MEGASCALE_NUM_SLICES", str(view.num_slices)),
            ("MEGASCALE_SLICE_ID", str(view.slice_index)),
        ]
    return "".join(f"{key}: '{value}'\n" for key, value in values)


def worker_attributes(view: WorkerView, metadata: Mapping[str, str]) -> dict[str, str]:
    """instance/attributes/: the node's metadata plus what the TPU service adds per worker."""
    attributes = {"enable-oslogin": "FALSE", **metadata}  # the one a user may set
    attributes.update(
        {
            "agent-worker-number": str(view.worker),
            "accelerator-type": view.accelerator_type,
            "tpu-env": tpu_env(view),
            # The third ':' field is what JAX reads; the first entry is the coordinator.
            "worker-network-endpoints": ",".join(
                f"{index}:unknown:{ip}" for index, ip in enumerate(view.worker_ips)
            ),
        }
    )
    return attributes


def metadata_tree(
    view: WorkerView, metadata: Mapping[str, str], scheduling: Mapping[str, str] | None = None
) -> MetadataTree:
    """Everything under /computeMetadata/v1/ for one worker; `scheduling`: what
    instance/scheduling/ serves besides `preemptible` (`termination-time`: when the service
    takes the VM back, RFC 3339)."""
    name = hostname(view)
    number = project_number(view.project)
    instance_id = str(
        int(hashlib.sha256(f"{view.node_name}/{view.worker}".encode()).hexdigest()[:15], 16)
    )
    return {
        "instance": {
            "attributes": dict(worker_attributes(view, metadata)),
            "hostname": f"{name}.{view.zone}.c.{view.project}.internal",
            "id": instance_id,
            "name": name,
            "zone": f"projects/{number}/zones/{view.zone}",
            "network-interfaces": {"0": {"ip": view.worker_ips[view.worker]}},
            "scheduling": {
                **(scheduling or {}), "preemptible": "TRUE" if view.preemptible else "FALSE",
            },
        },
        "project": {"project-id": view.project, "numeric-project-id": number, "attributes": {}},
    }  # fmt: skip


@dataclass(frozen=True)
class InstanceView:
    """What the metadata server of one Compute Engine instance knows about itself."""

    name: str
    instance_id: str
    project: str
    zone: str
    machine_type: str
    ip: str
    preemptible: bool
    automatic_restart: bool
    on_host_maintenance: str


# The instance state Compute Engine's metadata server reports beside the attributes, set by the
# control plane as it changes: `preempted`, `maintenance-event`, `upcoming-maintenance` (JSON,
# only while one is announced) and `scheduling/termination-timestamp`.
INSTANCE_STATE_DEFAULTS = {"preempted": "FALSE", "maintenance-event": "NONE"}


def instance_tree(
    view: InstanceView, metadata: Mapping[str, str], state: Mapping[str, str]
) -> MetadataTree:
    """Everything under /computeMetadata/v1/ for a Compute Engine instance: its attributes are
    its metadata items as they are (the platform's own keys among them), no TPU API defaults."""
    number = project_number(view.project)
    values = {**INSTANCE_STATE_DEFAULTS, **state}
    scheduling: MetadataTree = {
        "automatic-restart": "TRUE" if view.automatic_restart else "FALSE",
        "on-host-maintenance": view.on_host_maintenance,
        "preemptible": "TRUE" if view.preemptible else "FALSE",
    }
    instance: MetadataTree = {
        "attributes": dict(metadata),
        "hostname": f"{view.name}.{view.zone}.c.{view.project}.internal",
        "id": view.instance_id,
        "name": view.name,
        "zone": f"projects/{number}/zones/{view.zone}",
        "machine-type": f"projects/{number}/machineTypes/{view.machine_type}",
        "network-interfaces": {"0": {"ip": view.ip}},
        "scheduling": scheduling,
    }
    for key, value in values.items():
        parent, _, leaf = key.rpartition("/")
        target = instance
        for part in filter(None, parent.split("/")):
            child = target.setdefault(part, {})
            assert isinstance(child, dict)
            target = child
        target[leaf] = value
    return {
        "instance": instance,
        "project": {"project-id": view.project, "numeric-project-id": number, "attributes": {}},
    }


def _resolve(tree: MetadataTree, path: str, query: Mapping[str, Sequence[str]]) -> str | None:
    """The body for `path` below /computeMetadata/v1/, or None when it does not exist."""
    node: str | MetadataTree = tree
    for part in [unquote(p) for p in path.split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, str):
        return node
    if query.get("recursive", ["false"])[0].lower() == "true":
        return json.dumps(node, sort_keys=True)
    return "".join(f"{key}/\n" if isinstance(value, dict) else f"{key}\n"
                   for key, value in sorted(node.items()))  # fmt: skip


def respond(
    method: str, target: str, headers: Mapping[str, str], tree: MetadataTree
) -> tuple[int, str]:
    """(status, body) for one request, with GCE's rules on the Metadata-Flavor header."""
    if headers.get("metadata-flavor", "").lower() != "google" or "x-forwarded-for" in headers:
        return 403, _FORBIDDEN_BODY
    if method not in ("GET", "HEAD"):
        return 405, "Method not allowed\n"
    url = urlsplit(target)
    query = parse_qs(url.query)
    if url.path in ("", "/"):
        return 200, "computeMetadata/\n"
    if url.path.rstrip("/") == "/computeMetadata":
        return 200, "v1/\n"
    prefix = "/computeMetadata/v1"
    if not url.path.startswith(prefix):
        return 404, "Not Found\n"
    body = _resolve(tree, url.path[len(prefix) :], query)
    if body is None:
        return 404, "Not Found\n"
    return 200, body


_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
}


class MetadataProtocol(asyncio.Protocol):
    """HTTP/1.1 (keep-alive, GET/HEAD only) over one connection; the tree is read per request."""

    def __init__(self, tree: Callable[[], MetadataTree]) -> None:
        self._tree = tree
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None and b"\r\n\r\n" in self._buffer:
            head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
            self._handle(head)
        if len(self._buffer) > _MAX_HEADER_BYTES and self._transport is not None:
            self._send(400, "request header too large\n", keep_alive=False, head_only=False)

    def _handle(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3:
            self._send(400, "bad request line\n", keep_alive=False, head_only=False)
            return
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or "0")
        self._buffer = self._buffer[length:]  # metadata requests carry no body worth reading
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        status, body = respond(method, target, headers, self._tree())
        self._send(status, body, keep_alive=keep_alive, head_only=method == "HEAD")

    def _send(self, status: int, body: str, *, keep_alive: bool, head_only: bool) -> None:
        assert self._transport is not None
        payload = body.encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            "Metadata-Flavor: Google\r\n"
            "Content-Type: application/text\r\n"
            "Server: Metadata Server for VM\r\n"
            f"Content-Length: {len(payload)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        self._transport.write(head.encode() + (b"" if head_only else payload))
        if not keep_alive:
            self._transport.close()
            self._transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve_metadata(ip: str, port: int, tree: Callable[[], MetadataTree]) -> asyncio.Server:
    """Listen on ip:port; `tree` is called per request so metadata updates show at once."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: MetadataProtocol(tree), ip, port, reuse_address=True)
