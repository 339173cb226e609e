"""Shared helpers for emulator tests: request builders, waits, boot records."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.support import wait_for

ZONE = "us-central2-b"
QrState = cloud_tpu.QueuedResourceState.State
NodeState = cloud_tpu.Node.State


def new_project() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def parent_of(project: str) -> str:
    return f"projects/{project}/locations/{ZONE}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def boot_recorder(record_dir: Path) -> str:
    """A startup script recording each boot: one line per boot on the VM's own disk
    ($HOME/boots) and a copy of that count in record_dir/<node>-<worker> (append)."""
    return f"""#!/bin/bash
md() {{ curl -s -H 'Metadata-Flavor: Google' \\
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/$1"; }}
node=$(md tpu-env | sed -n "s/^NODE_ID: '\\(.*\\)'$/\\1/p")
worker=$(md agent-worker-number)
echo boot >> "$HOME/boots"
wc -l < "$HOME/boots" | tr -d ' ' >> "{record_dir}/$node-$worker"
"""


def boots(record_dir: Path, node_id: str, worker: int = 0) -> list[int]:
    """Disk boot counts seen at each boot of one worker, e.g. [1, 2] or [1, 2, 1]."""
    path = record_dir / f"{node_id}-{worker}"
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split()]


def qr_request(
    parent: str,
    *,
    accelerator_type: str = "v4-8",
    node_id: str | None = None,
    node_count: int = 0,
    prefix: str = "",
    tier: str = "",
    startup_script: str | None = None,
    autocheckpoint: bool = False,
    queueing_policy: dict[str, Any] | None = None,
    **node_fields: Any,
) -> cloud_tpu.QueuedResource:
    node: dict[str, Any] = {
        "accelerator_type": accelerator_type,
        "runtime_version": "tpu-ubuntu2204-base",
        "network_config": {"enable_external_ips": True},
        "autocheckpoint_enabled": autocheckpoint,
        **node_fields,
    }
    if startup_script is not None:
        node.setdefault("metadata", {})["startup-script"] = startup_script
    spec: dict[str, Any] = {"parent": parent, "node": node}
    if node_count:
        spec["multi_node_params"] = {"node_count": node_count, "node_id_prefix": prefix}
    else:
        spec["node_id"] = node_id or unique("node")
    body: dict[str, Any] = {"tpu": {"node_spec": [spec]}}
    if tier:
        body[tier] = {}
    if queueing_policy:
        body["queueing_policy"] = queueing_policy
    return cloud_tpu.QueuedResource(body)


def wait_until(
    probe: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.05
) -> Any:
    """tests.support.wait_for with the arguments in this folder's order."""
    return wait_for(probe, timeout, what, interval)


def wait_state(client: Any, name: str, state: int, timeout: float = 30.0) -> Any:
    seen: list[str] = []

    def probe() -> Any:
        qr = client.get_queued_resource(name=name)
        current = QrState(qr.state.state).name
        if not seen or seen[-1] != current:
            seen.append(current)
        if qr.state.state == QrState.FAILED and state != QrState.FAILED:
            raise AssertionError(f"{name} FAILED: {qr.state.failed_data.error}")
        return qr if qr.state.state == state else None

    try:
        return wait_until(probe, f"{name} to be {QrState(state).name}", timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}; states seen: {seen}") from None


def create(client: Any, parent: str, qr_id: str, qr: cloud_tpu.QueuedResource, **kw: Any) -> Any:
    request = {"parent": parent, "queued_resource_id": qr_id, "queued_resource": qr, **kw}
    return client.create_queued_resource(request=request)


def delete(client: Any, name: str, force: bool = True, wait: bool = True) -> Any:
    """Delete and (optionally) wait until it is gone. Returns the raw operation proto."""
    from google.api_core import exceptions

    op = client.delete_queued_resource(request={"name": name, "force": force})
    if wait:

        def gone() -> bool:
            try:
                client.get_queued_resource(name=name)
            except exceptions.NotFound:
                return True
            return False

        wait_until(gone, f"{name} to be deleted")
    return op.operation


def rest(
    endpoint: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    version: str = "v2alpha1",
    **query: Any,
) -> tuple[int, Any]:
    """One call to the emulator's Cloud TPU REST API: (HTTP status, its JSON)."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    params = {key: str(value).lower() if isinstance(value, bool) else str(value)
              for key, value in query.items()}  # fmt: skip
    url = f"{endpoint}{version}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def rest_qr(parent: str, node_id: str, **fields: Any) -> dict[str, Any]:
    """A QueuedResource request body, as REST takes it: one node (fields of `node` merged
    over a v5litepod-4) plus the QR's `fields`."""
    node = {
        "acceleratorType": "v5litepod-4",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "networkConfig": {"enableExternalIps": True},
        **fields.pop("node", {}),
    }
    return {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": node_id, "node": node}]}, **fields}
