"""Helpers for fan-out tests: QRs in the emulator, tpuctl in-process, waiting."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import Outcome, child_environment, invoke

ZONE = "us-central2-b"
USER = "tester"


def by_label(outcome: Outcome) -> dict[str, dict[str, Any]]:
    """A fan-out command's --format json result, per worker label ("slice/worker")."""
    return {f"{w['slice']}/{w['worker']}": w for w in outcome.json()["workers"]}


@dataclass
class QR:
    """A queued resource in the emulator, ACTIVE, with its nodes' ids in slice order."""

    name: str
    project: str
    node_ids: list[str]
    workers_per_node: int
    state_dir: Path

    def vm_root(self, slice_index: int, worker: int) -> Path:
        return self.state_dir / "vms" / self.node_ids[slice_index] / str(worker)

    def home(self, slice_index: int, worker: int, user: str = USER) -> Path:
        return self.vm_root(slice_index, worker) / "home" / user

    def labels(self) -> list[str]:
        return [f"{s}/{w}" for s in range(len(self.node_ids)) for w in range(self.workers_per_node)]


def create_qr(
    emulator: Any, *, accelerator: str = "v4-16", slices: int = 2, project: str | None = None
) -> QR:
    from google.cloud.tpu_v2alpha1.types import cloud_tpu

    project = project or f"fanout-{uuid.uuid4().hex[:8]}"
    name = f"fan-{uuid.uuid4().hex[:6]}"
    parent = f"projects/{project}/locations/{ZONE}"
    node: dict[str, Any] = {
        "accelerator_type": accelerator,
        "runtime_version": "tpu-ubuntu2204-base",
        "network_config": {"enable_external_ips": True},
    }
    spec: dict[str, Any] = {"parent": parent, "node": node}
    if slices > 1:
        spec["multi_node_params"] = {"node_count": slices, "node_id_prefix": name}
        node_ids = [f"{name}-{i}" for i in range(slices)]
    else:
        spec["node_id"] = name
        node_ids = [name]
    client = emulator.tpu_client()
    client.create_queued_resource(
        request={
            "parent": parent,
            "queued_resource_id": name,
            "queued_resource": cloud_tpu.QueuedResource({"tpu": {"node_spec": [spec]}}),
        }
    )
    deadline = time.monotonic() + 60
    while True:
        qr = client.get_queued_resource(name=f"{parent}/queuedResources/{name}")
        state = qr.state.state.name
        if state == "ACTIVE":
            break
        assert state not in ("FAILED", "SUSPENDED"), state
        assert time.monotonic() < deadline, f"{name} not ACTIVE: {state}"
        time.sleep(0.1)
    from tpuctl.topology import parse_accelerator

    vms = parse_accelerator(accelerator).vms
    return QR(name, project, node_ids, vms, Path(emulator.state_dir))


def delete_qr(emulator: Any, qr: QR) -> None:
    client = emulator.tpu_client()
    name = f"projects/{qr.project}/locations/{ZONE}/queuedResources/{qr.name}"
    client.delete_queued_resource(request={"name": name, "force": True})


@dataclass
class Tpuctl:
    """tpuctl in-process against the emulator, with its own HOME and project."""

    emulator: Any
    home: Path
    project: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "TPU_EMULATOR_HOST": self.emulator.host,
            "TPUCTL_SSH_PORT": str(self.emulator.ssh_port),
            "TPUCTL_PROJECT": self.project,
            "TPUCTL_ZONE": ZONE,
            "HOME": str(self.home),
            "USER": USER,
            "TPUCTL_API_RETRY_SECONDS": "20",
        }

    def __call__(self, *args: str, env: Mapping[str, str] | None = None) -> Outcome:
        return invoke(args, {**self.env, **(env or {})})

    def child_env(self) -> dict[str, str]:
        return child_environment(self.env)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
