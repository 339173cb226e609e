"""Run `tpuctl emulator start` in a subprocess for tests, drills and benchmarks."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from tpuctl.emulator.client.admin import AdminClient
from tpuctl.emulator.client.gcloud import REST_EXPORT, gcloud_settings

STARTUP_TIMEOUT = 60.0


class EmulatorProcess:
    """`with EmulatorProcess(state_dir, "--speed", "20") as emu:` → `.host`, `.ssh_port`,
    `.rest_endpoint`, `.state_dir`, `.admin`, `.tpu_client()`, `.gcloud_environment()`;
    leaves no process behind on exit."""

    def __init__(self, state_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.args = list(args)
        self.env = env
        self.host = ""
        self.ssh_port = 0
        self.compute_endpoint = ""
        self.rest_endpoint = ""  # the Cloud TPU REST API: http://127.0.0.1:PORT/
        self.process: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}.log"

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.host)
        return self._admin

    def environment(self) -> dict[str, str]:
        """Variables a client process needs to use this emulator."""
        return {
            "TPU_EMULATOR_HOST": self.host,
            "TPUCTL_SSH_PORT": str(self.ssh_port),
            "TPUCTL_COMPUTE_ENDPOINT": self.compute_endpoint,
            REST_EXPORT: self.rest_endpoint,
        }

    def gcloud_environment(self, config_dir: Path, project: str) -> dict[str, str]:
        """Variables that point the real gcloud at this emulator (REST, no credentials), with
        its configuration in `config_dir`, so that nothing touches the user's own."""
        return gcloud_settings(self.rest_endpoint, self.compute_endpoint, project) | {
            "CLOUDSDK_CONFIG": str(config_dir),
        }

    def tpu_client(self) -> Any:
        """The unmodified google-cloud-tpu v2alpha1 client on an insecure channel."""
        import grpc
        from google.cloud import tpu_v2alpha1
        from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(self.host)
        return tpu_v2alpha1.TpuClient(transport=TpuGrpcTransport(channel=channel))

    def compute_client(self, service: str = "InstancesClient") -> Any:
        """An unmodified google-cloud-compute client (`InstancesClient`,
        `InstanceGroupManagersClient`, …) over REST to this emulator's Compute Engine fake."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1

        return getattr(compute_v1, service)(
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=self.compute_endpoint),
            transport="rest",
        )

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "tpuctl", "emulator", "start", "--port", "0",
            "--state-dir", str(self.state_dir), *self.args,
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(self.env or {})},
            start_new_session=True,  # so a stuck emulator can be killed with its whole group
        )
        log.close()
        try:
            values = _read_exports(self.process, STARTUP_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.host = values["TPU_EMULATOR_HOST"]
        self.ssh_port = int(values["TPUCTL_SSH_PORT"])
        self.compute_endpoint = values["TPUCTL_COMPUTE_ENDPOINT"]
        self.rest_endpoint = values[REST_EXPORT]

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group; the exit code (None if killed)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        process = self.process
        if process is None:
            return None
        code: int | None = None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = process.returncode
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything left in its session
        if process.poll() is None:
            process.wait(5)
        if process.stdout is not None:
            process.stdout.close()
        return code

    def __enter__(self) -> EmulatorProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


# What `tpuctl emulator start` prints first (after them come gcloud's other settings).
EXPORTS = ("TPU_EMULATOR_HOST", "TPUCTL_SSH_PORT", "TPUCTL_COMPUTE_ENDPOINT", REST_EXPORT)


def _read_exports(process: subprocess.Popen[bytes], timeout: float) -> dict[str, str]:
    """The `NAME=value` lines `tpuctl emulator start` prints once it serves."""
    stdout: IO[bytes] | None = process.stdout
    assert stdout is not None
    values: dict[str, str] = {}
    buffer = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while not all(name in values for name in EXPORTS):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the emulator did not print its address in time")
            if not selector.select(left):
                continue
            chunk = os.read(stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the emulator exited with {process.wait()} before serving")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                name, _, value = line.decode().strip().partition("=")
                values[name] = value
    return values
