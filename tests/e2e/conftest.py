"""Fixtures for end-to-end drills: the shared emulator, a private HOME, specs for the toy
trainer with a checkpoint dir under tmp_path (emulated workers share the host's disk, so an
absolute path is shared storage), `tpuctl up` as a real process, tpuctl in-process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ZONE, Project
from tests.support import AMBIENT, Outcome, invoke, wait_for

REPO = Path(__file__).resolve().parents[2]
TOY_TRAIN = REPO / "scripts" / "toy_train.py"
# `tpuctl up` flags that make the babysitter react within a second on the sped-up emulator.
FAST_UP = ("--poll", "0.5", "--job-check-every", "1", "--settle", "1")


@dataclass
class Job:
    """One spec for the toy trainer and everything a test needs to look at its run."""

    project: Project
    name: str
    spec: Path
    checkpoint_dir: Path
    steps: int
    trainer_args: list[str]
    slices: int
    up_process: subprocess.Popen[str] | None = None
    up_log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)  # for every tpuctl it runs
    api: str = "tpu"  # the spec's tpu.api

    # -------------------------------------------------------------- tpuctl

    @property
    def env(self) -> dict[str, str]:
        return {**self.project.env, **self.environ}

    @property
    def state_dir(self) -> Path:
        return Path(self.project.emulator.state_dir)

    def cli(self, *args: str) -> Outcome:
        """tpuctl in-process through main.run's error boundary."""
        return self.project.cli(*args, env=self.environ)

    def cli_env(self, env: Mapping[str, str], *args: str) -> Outcome:
        return invoke(args, dict(env))

    def child_env(self) -> dict[str, str]:
        return self.project.child_env(self.environ)

    def start_up(self, *extra: str) -> subprocess.Popen[str]:
        """`tpuctl up SPEC` as a real process (stdout and stderr to one log file)."""
        self.up_log = self.spec.with_suffix(".up.log")
        sink = self.up_log.open("w")
        self.up_process = subprocess.Popen(
            [sys.executable, "-m", "tpuctl", "up", str(self.spec), *FAST_UP, *extra],
            env=self.child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        sink.close()
        wait_for(self.qr_exists, timeout=30, what=f"tpuctl up to create {self.name}")
        return self.up_process

    def wait_running(self, timeout: float = 60.0) -> None:
        """Until `tpuctl up` has seen the job running (so it knows the boot to compare with)."""
        assert self.up_log is not None
        log = self.up_log
        wait_for(lambda: "the job is running" in log.read_text(), timeout, "the job to run")

    def wait_up(self, timeout: float = 120.0) -> tuple[int, str]:
        assert self.up_process is not None and self.up_log is not None
        try:
            code = self.up_process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.up_process.kill()
            self.up_process.wait()
            raise AssertionError(f"tpuctl up still running:\n{self.up_log.read_text()}") from None
        return code, self.up_log.read_text()

    # -------------------------------------------------------------- what the run left

    def complete_steps(self) -> list[int]:
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(
            int(p.name)
            for p in self.checkpoint_dir.iterdir()
            if p.name.isdigit() and (p / "commit_success.txt").is_file()
        )

    def journal(self) -> list[Any]:
        from tpuctl.spec.load import load_spec
        from tpuctl.storage.journal import Journal

        return list(Journal(load_spec(str(self.spec)).spec).entries())

    def journal_kinds(self) -> list[str]:
        return [entry.kind for entry in self.journal()]

    def node_ids(self) -> list[str]:
        if self.slices == 1:
            return [self.name]
        return [f"{self.name}-{index}" for index in range(self.slices)]

    def vm_root(self, slice_index: int, worker: int) -> Path:
        return self.state_dir / "vms" / self.node_ids()[slice_index] / str(worker)

    def log(self, slice_index: int, worker: int, boot: int | None = None) -> str:
        name = "current.log" if boot is None else f"boot-{boot}.log"
        path = self.vm_root(slice_index, worker) / "var/log/tpuctl" / self.name / name
        return path.read_text(errors="replace") if path.exists() else ""

    def qr_exists(self) -> bool:
        if self.api == "compute":
            from tpuctl.cloud.client import connect
            from tpuctl.cloud.resolve import Location

            api = connect(Location(self.project.name, ZONE), environ=self.env, api="compute")
            return api.find_queued_resource(self.name) is not None
        return self.project.qr_exists(self.name)

    def uninterrupted_final(self, tmp_path: Path) -> bytes:
        """final.json of the same trainer run start to end on this machine, never disturbed."""
        directory = tmp_path / f"reference-{self.name}"
        environ = {k: v for k, v in os.environ.items() if k not in AMBIENT}
        environ.update({"TPUCTL_WORKER_ID": "0"})
        subprocess.run(
            [sys.executable, str(TOY_TRAIN), *self.trainer_args, "--step-seconds", "0",
             "--checkpoint-dir", str(directory)],
            env=environ, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        return (directory / "final.json").read_bytes()


@pytest.fixture
def make_job(project: Project) -> Iterator[Callable[..., Job]]:
    """make_job(steps=…, autocheckpoint=…, …) → a Job with its spec written under tmp_path."""
    tmp_path = project.tmp_path
    made: list[Job] = []

    def make(
        *,
        steps: int = 120,
        step_seconds: float = 0.05,
        checkpoint_every: int = 10,
        autocheckpoint: bool = True,
        slices: int = 2,
        accelerator: str = "v4-16",
        extra_args: str = "",
        max_preemptions: int = 3,
        max_failures: int = 0,
        conventionless: bool = False,
        elsewhere: bool = True,
        api: str = "tpu",
        runtime: str = "tpu-ubuntu2204-base",
        tier: str = "spot",
    ) -> Job:
        """`conventionless`: the trainer prints nothing, writes no done marker and keeps its
        checkpoints where its own --checkpoint-dir says: `elsewhere` than the spec's
        checkpoint.dir, or (elsewhere=False) the same place, named in the command."""
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        checkpoint_dir = tmp_path / f"ckpt-{name}"
        trainer = [
            "--steps", str(steps), "--checkpoint-every", str(checkpoint_every), "--seed", "7",
        ]  # fmt: skip
        trainer += extra_args.split()
        words = ["python3", "toy_train.py", *trainer, "--step-seconds", str(step_seconds)]
        checkpoints = checkpoint_dir
        if conventionless:
            checkpoints = tmp_path / f"own-{name}" if elsewhere else checkpoint_dir
            words += ["--quiet", "--done-marker", "''", "--checkpoint-dir", str(checkpoints)]
        command = " ".join(words)
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(
            f"""apiVersion: tpuctl/v1
name: {name}
tpu:
  api: {api}
  accelerator: {accelerator}
  runtime: {runtime}
  slices: {slices}
capacity:
  tier: {tier}
checkpoint:
  dir: {checkpoint_dir}
  autocheckpoint: {str(autocheckpoint).lower()}
job:
  framework: orbax
  code: {TOY_TRAIN}
  command: {command}
recovery:
  max_preemptions: {max_preemptions}
  max_failures: {max_failures}
""",
            encoding="utf-8",
        )
        job = Job(
            project=project,
            name=name,
            spec=spec,
            checkpoint_dir=checkpoints,
            steps=steps,
            trainer_args=trainer,
            slices=slices,
            api=api,
        )
        made.append(job)
        return job

    yield make
    for job in made:
        if job.up_process is not None and job.up_process.poll() is None:
            job.up_process.kill()
            job.up_process.wait()
        # Whatever is left is deleted with the project.
