"""Fixtures for the startup-script job tests: QRs created from specs in the session emulator,
the fleet of their workers (real SSH), and a shared checkpoint dir per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Project
from tests.support import wait_for
from tpuctl.fanout.operations import Fleet
from tpuctl.jobs import control as jobs
from tpuctl.spec.load import load_spec
from tpuctl.spec.model import Spec

SSH_USER = "tester"


@dataclass
class JobQR:
    """An ACTIVE queued resource made from `spec`, with the fleet of all its workers."""

    spec: Spec
    spec_path: Path
    api: Any  # tpuctl.cloud.client.TpuApi
    fleet: Fleet
    state_dir: Path
    checkpoint_dir: Path
    project: str
    node_ids: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def run_name(self) -> str:
        assert self.spec.job is not None
        return self.spec.job.run_name

    def vm_root(self, slice_index: int, worker: int) -> Path:
        return self.state_dir / "vms" / self.node_ids[slice_index] / str(worker)

    def job_home(self, slice_index: int, worker: int) -> Path:
        return self.vm_root(slice_index, worker) / "home" / "tpuctl"

    def boot_log(self, slice_index: int, worker: int, boot: int) -> str:
        path = self.vm_root(slice_index, worker) / "var/log/tpuctl" / self.run_name
        try:
            return (path / f"boot-{boot}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def labels(self) -> list[tuple[int, int]]:
        return [(s, w) for s in range(len(self.node_ids)) for w in range(self.workers)]

    @property
    def workers(self) -> int:
        return len(self.fleet.targets) // len(self.node_ids)

    def statuses(self) -> list[jobs.WorkerJobStatus]:
        return jobs.job_status(self.fleet, self.spec)

    def wait_states(
        self, *states: str, boot: int | None = None, timeout: float = 30.0
    ) -> list[jobs.WorkerJobStatus]:
        """Every worker in one of `states` (and at `boot`, when given)."""

        def reached() -> list[jobs.WorkerJobStatus] | None:
            found = self.statuses()
            ok = all(s.state in states and (boot is None or s.boot == boot) for s in found)
            return found if ok else None

        try:
            result: list[jobs.WorkerJobStatus] = wait_for(reached, timeout, f"{states}")
        except AssertionError:
            raise AssertionError(
                f"not all workers reached {states} (boot {boot}): "
                f"{[(s.label, s.state, s.boot, s.reason) for s in self.statuses()]}\n"
                f"boot log 0/0: {self.boot_log(0, 0, boot or 1)}"
            ) from None
        return result


@pytest.fixture
def make_job_qr(project: Project) -> Callable[..., JobQR]:
    """make(job={...}, accelerator=..., slices=..., checkpoint={...}) → an ACTIVE JobQR.

    checkpoint.dir defaults to a fresh directory under the test's tmp_path, which every
    emulated worker shares the way real ones share a bucket; `checkpoint={"dir": None}` leaves
    it out."""

    def make(
        job: dict[str, Any],
        *,
        accelerator: str = "v4-8",
        slices: int = 1,
        checkpoint: dict[str, Any] | None = None,
    ) -> JobQR:
        name = f"job-{uuid.uuid4().hex[:6]}"
        checkpoint_dir = project.tmp_path / f"ckpt-{name}"
        spec_path = project.write_spec(
            {
                "name": name,
                "tpu": {
                    "accelerator": accelerator,
                    "runtime": "tpu-ubuntu2204-base",
                    "slices": slices,
                },
                "checkpoint": {
                    key: value
                    for key, value in {"dir": str(checkpoint_dir), **(checkpoint or {})}.items()
                    if value is not None
                },
                "job": job,
            }
        )
        qr = project.create_from_spec(spec_path)
        fleet = project.fleet(name, user=SSH_USER, key_path=project.tmp_path / "ssh" / "key")
        return JobQR(
            spec=load_spec(spec_path).spec,
            spec_path=spec_path,
            api=project.api(),
            fleet=fleet,
            state_dir=qr.state_dir,
            checkpoint_dir=checkpoint_dir,
            project=project.name,
            node_ids=qr.node_ids,
        )

    return make
