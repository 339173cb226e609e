"""Fixtures for the startup-script job tests: QRs created from specs in the session emulator,
the fleet of their workers (real SSH), and a shared checkpoint dir per test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.resume.conftest import fake_gcs, gcs_bucket  # noqa: F401  (fixtures, reused)
from tests.support import AMBIENT, wait_for
from tpuctl.fanout import jobs
from tpuctl.fanout.operations import Fleet, SshSettings, prepare_fleet
from tpuctl.spec.load import load_spec
from tpuctl.spec.model import Spec

ZONE = "us-central2-b"
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
def make_job_qr(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., JobQR]]:
    """make(job={...}, accelerator=..., slices=..., checkpoint={...}) → an ACTIVE JobQR.

    checkpoint.dir defaults to a fresh directory under tmp_path, which every emulated worker
    shares the way real ones share a bucket; `checkpoint={"dir": None}` leaves it out."""
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    monkeypatch.setenv("TPUCTL_API_RETRY_SECONDS", "20")
    created: list[JobQR] = []

    def make(
        job: dict[str, Any],
        *,
        accelerator: str = "v4-8",
        slices: int = 1,
        checkpoint: dict[str, Any] | None = None,
    ) -> JobQR:
        from tpuctl.cloud import lifecycle
        from tpuctl.cloud.client import connect
        from tpuctl.cloud.resolve import Location

        project = f"jobs-{uuid.uuid4().hex[:8]}"
        name = f"job-{uuid.uuid4().hex[:6]}"
        checkpoint_dir = tmp_path / f"ckpt-{name}"
        document: dict[str, Any] = {
            "apiVersion": "tpuctl/v1",
            "name": name,
            "project": project,
            "zone": ZONE,
            "tpu": {"accelerator": accelerator, "runtime": "tpu-ubuntu2204-base", "slices": slices},
            "checkpoint": {
                key: value
                for key, value in {"dir": str(checkpoint_dir), **(checkpoint or {})}.items()
                if value is not None
            },
            "job": job,
        }
        spec_path = tmp_path / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
        spec = load_spec(spec_path).spec
        api = connect(Location(project, ZONE))
        plan = lifecycle.plan_create(spec, project=project, zone=ZONE)
        lifecycle.create(api, plan)
        qr = api.get_queued_resource(name)
        wait_for(
            lambda: api.get_queued_resource(name).state.state.name == "ACTIVE",
            30,
            f"{name} ACTIVE",
        )
        settings = SshSettings(
            user=SSH_USER, ssh_port=emulator.ssh_port, key_path=tmp_path / "ssh" / "key"
        )
        fleet = prepare_fleet(api, name, settings)
        from tpuctl.cloud.describe import template_of

        made = JobQR(
            spec=spec,
            spec_path=spec_path,
            api=api,
            fleet=fleet,
            state_dir=Path(emulator.state_dir),
            checkpoint_dir=checkpoint_dir,
            project=project,
            node_ids=template_of(qr).node_ids,
        )
        created.append(made)
        return made

    yield make
    for qr in created:
        # Best effort: the session emulator goes away at the end anyway.
        with contextlib.suppress(Exception):
            qr.api.client.delete_queued_resource(
                request={"name": qr.api.qr_name(qr.name), "force": True}
            )
