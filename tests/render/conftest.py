"""Fixtures for the render tests: a fake metadata server and a way to run a startup script."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import wait_for
from tpuctl.spec.model import CheckpointSpec, JobSpec, Spec, TpuSpec

# What a multislice v4-16 worker (slice 1, worker 1) sees; the shape follows Cloud TPU's.
MULTISLICE_ATTRIBUTES = {
    "agent-worker-number": "1",
    "tpu-env": (
        "ACCELERATOR_TYPE: 'v4-16'\n"
        "CONSUMER_PROJECT_ID: 'my-project'\n"
        "NODE_ID: 'demo-1'\n"
        "WORKER_ID: '1'\n"
        "ZONE: 'us-central2-b'\n"
        "MEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
        "MEGASCALE_NUM_SLICES: '2'\n"
        "MEGASCALE_SLICE_ID: '1'\n"
    ),
    "worker-network-endpoints": "unknown:unknown:10.0.1.2,unknown:unknown:10.0.1.3",
}


INSTANCE_PREFIX = "/computeMetadata/v1/instance/"


@dataclass
class MetadataServer:
    """A GCE-style metadata server on 127.0.0.1 serving instance attributes."""

    attributes: dict[str, str] = field(default_factory=lambda: dict(MULTISLICE_ATTRIBUTES))
    host: str = ""
    # Other instance keys (`preempted`, `maintenance-event`, `scheduling/…`), by their path
    # under computeMetadata/v1/instance/.
    instance: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def _reap_trainers() -> Iterator[list[int]]:
    """Kill any process group a test left running (a failed assertion mid-run)."""
    groups: list[int] = []
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


@pytest.fixture
def metadata_server() -> Iterator[MetadataServer]:
    server_state = MetadataServer()
    prefix = "/computeMetadata/v1/instance/attributes/"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            key = self.path[len(prefix) :] if self.path.startswith(prefix) else None
            value = server_state.attributes.get(key) if key else None
            if key is None and self.path.startswith(INSTANCE_PREFIX):
                value = server_state.instance.get(self.path[len(INSTANCE_PREFIX) :])
            # The real server refuses requests without the header.
            if self.headers.get("Metadata-Flavor") != "Google" or value is None:
                self.send_error(404 if value is None else 403)
                return
            body = value.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.host = f"127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()


@dataclass
class Worker:
    """One emulated worker: its VM root and the paths the startup script writes."""

    root: Path
    run_name: str
    metadata_host: str
    environment: dict[str, str] = field(default_factory=dict)  # over the defaults below

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/tpuctl" / self.run_name

    @property
    def log_dir(self) -> Path:
        return self.root / "var/log/tpuctl" / self.run_name

    def status(self) -> dict[str, str]:
        text = (self.state_dir / "status").read_text()
        return dict(line.split("=", 1) for line in text.splitlines())

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TPUCTL_VM_ROOT": str(self.root),
            "GCE_METADATA_HOST": self.metadata_host,
            "TPUCTL_HEARTBEAT_SECONDS": "0.2",
            **self.environment,
        }

    def run(self, script: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run the startup script the way the guest agent does: as a process it waits for."""
        path = self.root.parent / f"startup-{self.root.name}.sh"
        path.write_text(script, encoding="utf-8")
        return subprocess.run(
            ["bash", str(path)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def current_status(self) -> dict[str, str]:
        """The status file, or {} while it is missing or half written."""
        try:
            return self.status()
        except (FileNotFoundError, ValueError):
            return {}

    def wait_for_state(self, *states: str, timeout: float = 15) -> dict[str, str]:
        def reached() -> dict[str, str] | None:
            status = self.current_status()
            return status if status.get("state") in states else None

        try:
            return wait_for(reached, timeout, f"state {states}")
        except AssertionError as error:
            raise AssertionError(f"{error}; last status {self.current_status()}") from None


@pytest.fixture
def make_worker(tmp_path: Path, metadata_server: MetadataServer) -> Callable[[str], Worker]:
    def make(run_name: str, name: str = "vm") -> Worker:
        root = tmp_path / name
        root.mkdir()
        return Worker(root=root, run_name=run_name, metadata_host=metadata_server.host)

    return make


def _job_spec(
    command: str,
    *,
    name: str = "demo",
    slices: int = 2,
    env: dict[str, str] | None = None,
    setup: tuple[str, ...] = (),
    framework: str = "custom",
    checkpoint_dir: str | None = None,
    autocheckpoint: bool = False,
    workdir: str = "~/job",
) -> Spec:
    return Spec(
        name=name,
        tpu=TpuSpec(accelerator="v4-16", runtime="tpu-ubuntu2204-base", slices=slices),
        checkpoint=CheckpointSpec(dir=checkpoint_dir, autocheckpoint=autocheckpoint),
        job=JobSpec(
            command=command,
            framework=framework,  # type: ignore[arg-type]
            run_name=name,
            env=env or {},
            setup=setup,
            workdir=workdir,
        ),
    )


@pytest.fixture
def job_spec() -> Callable[..., Spec]:
    """Build a spec with a job directly (no YAML), for startup-script tests."""
    return _job_spec


def install_python_tools(bin_dir: Path, tools: dict[str, str]) -> Path:
    """Write each tool (name → Python source) into `bin_dir` as an executable stand-in."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n{body}")
        tool.chmod(0o755)
    return bin_dir
