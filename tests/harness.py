"""The one harness for tests that drive tpuctl against the session emulator.

A `Project` is one test's private project in the emulator (so `list` sees only its queued
resources), with its own HOME (~/.ssh) and user: tpuctl in-process (`project.cli(...)`, or just
`project(...)`) or as a real process (`spawn`), spec files, the API, queued resources made
ACTIVE, and the paths of their emulated VMs.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import Outcome, child_environment, invoke, python_with_default_sigint, wait_for

ZONE = "us-central2-b"
USER = "tester"
EMULATOR_SPEED = 20.0  # tests/conftest.py starts the session emulator at this speed


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


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
    spec_path: Path | None = None

    def vm_root(self, slice_index: int, worker: int) -> Path:
        return self.state_dir / "vms" / self.node_ids[slice_index] / str(worker)

    def home(self, slice_index: int, worker: int, user: str = USER) -> Path:
        return self.vm_root(slice_index, worker) / "home" / user

    def log(self, slice_index: int, worker: int, run: str, boot: int | None = None) -> str:
        """A run's job log on one VM (current.log, or one boot's), "" when there is none."""
        name = "current.log" if boot is None else f"boot-{boot}.log"
        path = self.vm_root(slice_index, worker) / "var/log/tpuctl" / run / name
        return path.read_text(errors="replace") if path.exists() else ""

    def labels(self) -> list[str]:
        return [f"{s}/{w}" for s in range(len(self.node_ids)) for w in range(self.workers_per_node)]


class Project:
    """One test's project in the session emulator; see the module docstring."""

    def __init__(self, emulator: Any, tmp_path: Path, name: str | None = None) -> None:
        self.emulator = emulator
        self.tmp_path = tmp_path
        self.name = name or unique("project")
        self.home = tmp_path / "home"
        self.home.mkdir(exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return {
            **self.emulator.environment(),
            "TPUCTL_PROJECT": self.name,
            "TPUCTL_ZONE": ZONE,
            "TPUCTL_API_RETRY_SECONDS": "20",
            "HOME": str(self.home),
            "USER": USER,
        }

    # -------------------------------------------------------------------------------- tpuctl

    def cli(self, *args: str, env: Mapping[str, str] | None = None) -> Outcome:
        """tpuctl in-process, through main.run's error boundary (exit codes, JSON errors)."""
        return invoke(args, {**self.env, **(env or {})})

    __call__ = cli

    def child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a child process using this emulator and project."""
        return child_environment({**self.env, **(extra or {})})

    def spawn(self, *args: str, **popen: Any) -> subprocess.Popen[str]:
        """`python -m tpuctl ARGS` as a real process (for real signals), SIGINT as at a
        terminal; stdout and stderr are pipes unless given."""
        options: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        options.update(popen)
        return subprocess.Popen(
            python_with_default_sigint("-m", "tpuctl", *args),
            cwd=self.tmp_path,
            env=self.child_env(),
            text=True,
            **options,
        )

    # -------------------------------------------------------------------------------- specs

    def spec(self, name: str | None = None, *, extra: str = "", tier: str = "spot") -> Path:
        """A minimal v4-8 spec in this project (`extra` is appended YAML)."""
        qr = name or unique("job")
        path = self.tmp_path / f"{qr}.yaml"
        path.write_text(
            f"apiVersion: tpuctl/v1\nname: {qr}\n"
            "tpu:\n  accelerator: v4-8\n  runtime: tpu-ubuntu2204-base\n"
            f"capacity:\n  tier: {tier}\n{extra}",
            encoding="utf-8",
        )
        return path

    def write_spec(self, document: dict[str, Any]) -> Path:
        """A spec from a dict (apiVersion, project and zone filled in); named after it."""
        full = {"apiVersion": "tpuctl/v1", "project": self.name, "zone": ZONE, **document}
        path = self.tmp_path / f"{full['name']}.yaml"
        path.write_text(yaml.safe_dump(full, allow_unicode=True), encoding="utf-8")
        return path

    # -------------------------------------------------------------------------------- the API

    def api(self) -> Any:
        from tpuctl.cloud.client import connect
        from tpuctl.cloud.resolve import Location

        return connect(Location(self.name, ZONE), environ=self.env)

    def qr_names(self) -> list[str]:
        listed = self.cli("list", "--all", "--format", "json")
        assert listed.exit_code == 0, listed.stderr
        return [entry["name"] for entry in listed.json()["queued_resources"]]

    def qr_exists(self, name: str) -> bool:
        return self.api().find_queued_resource(name) is not None

    def create_from_spec(self, spec_path: Path) -> QR:
        """Create the spec's queued resource through tpuctl's library and wait until ACTIVE."""
        from tpuctl.cloud import lifecycle
        from tpuctl.cloud.describe import template_of
        from tpuctl.jobs.provision import create_request
        from tpuctl.spec.load import load_spec
        from tpuctl.topology import parse_accelerator

        spec = load_spec(spec_path, environ=self.env).spec
        api = self.api()
        lifecycle.create(api, create_request(spec, api.location))
        self.wait_active(spec.name)
        node_ids = template_of(api.get_queued_resource(spec.name)).node_ids
        vms = parse_accelerator(spec.tpu.accelerator).vms
        return QR(spec.name, self.name, node_ids, vms, Path(self.emulator.state_dir), spec_path)

    def create_qr(self, *, accelerator: str = "v4-16", slices: int = 2) -> QR:
        """A bare queued resource (no startup script) through the client, waited ACTIVE."""
        spec = self.write_spec(
            {
                "name": unique("fan"),
                "tpu": {"accelerator": accelerator, "runtime": "tpu-ubuntu2204-base"}
                | ({"slices": slices} if slices > 1 else {}),
            }
        )
        return self.create_from_spec(spec)

    def wait_active(self, name: str, timeout: float = 60.0) -> None:
        api = self.api()

        def active() -> bool:
            state = api.get_queued_resource(name).state.state.name
            assert state not in ("FAILED", "SUSPENDED"), f"{name} is {state}"
            return bool(state == "ACTIVE")

        wait_for(active, timeout, f"{name} ACTIVE")

    def fleet(self, name: str, **settings: Any) -> Any:
        """The Fleet of every worker of `name`, as tpuctl's commands prepare it."""
        from tpuctl.fanout.operations import SshSettings
        from tpuctl.jobs.fleet import prepare_fleet

        defaults = {
            "user": USER,
            "ssh_port": self.emulator.ssh_port,
            "key_path": self.home / ".ssh" / "google_compute_engine",
        }
        return prepare_fleet(self.api(), name, SshSettings(**{**defaults, **settings}))

    def delete_everything(self) -> None:
        """Best effort at the end of a test: ask to delete every queued resource left."""
        with contextlib.suppress(Exception):
            api = self.api()
            for queued_resource in api.list_queued_resources():
                with contextlib.suppress(Exception):
                    api.client.delete_queued_resource(
                        request={"name": queued_resource.name, "force": True}
                    )


@contextlib.contextmanager
def project_in(emulator: Any, tmp_path: Path, name: str | None = None) -> Iterator[Project]:
    made = Project(emulator, tmp_path, name)
    try:
        yield made
    finally:
        made.delete_everything()
