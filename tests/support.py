"""What the test folders share: a clean environment, tpuctl in-process or as a child, waiting."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner

from tpuctl.cli.main import run

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# Environment that would change what tpuctl, the emulator or a trainer does: cleared for tests,
# which set only what they mean to.
AMBIENT = (
    "TPUCTL_FORMAT",
    "TPUCTL_PROJECT",
    "TPUCTL_ZONE",
    "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_COMPUTE_ZONE",
    "TPU_EMULATOR_HOST",
    "TPUCTL_SSH_PORT",
    "TPUCTL_API_RETRY_SECONDS",
    "TPUCTL_CHECKPOINT_DIR",
    "TPUCTL_DONE_MARKER",
    "TPUCTL_RUN_NAME",
    "TPUCTL_WORKER_ID",
    "TPUCTL_SLICE_ID",
    "TPUCTL_NUM_SLICES",
    "TPUCTL_WORKERS_PER_SLICE",
    "TPUCTL_PROCESS_ID",
    "TPUCTL_NUM_PROCESSES",
    "MEGASCALE_SLICE_ID",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "GCE_METADATA_HOST",
    "STORAGE_EMULATOR_HOST",
    "TPUCTL_SERVICE_USAGE_ENDPOINT",
    "TPUCTL_CLOUD_QUOTAS_ENDPOINT",
    "TPUCTL_RESOURCE_MANAGER_ENDPOINT",
    "TPUCTL_IAM_ENDPOINT",
    "NO_COLOR",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "CLOUDSDK_ACTIVE_CONFIG_NAME",
)
# Set for every test and every child: nothing may reach beyond this machine. google-auth with
# no credentials would probe the GCE metadata server at its link-local address; NO_GCE_CHECK
# stops that, and the metadata host points at a loopback port nothing listens on (discard).
OFFLINE = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


@dataclass(frozen=True)
class Outcome:
    """What a tpuctl invocation left: its exit code and what it wrote to each stream."""

    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def invoke(args: Sequence[str], env: Mapping[str, str | None] | None = None) -> Outcome:
    """tpuctl in-process, through main.run's error boundary (exit codes, JSON errors), with
    `env` set (None unsets) for the call only."""
    argv = list(args)
    runner = CliRunner()
    with runner.isolation(env=env) as streams:
        try:
            code = run(argv)
        except SystemExit as done:
            code = int(done.code or 0)
        sys.stdout.flush()  # the isolated streams are buffered text wrappers
        sys.stderr.flush()
        return Outcome(code, streams[0].getvalue().decode(), streams[1].getvalue().decode())


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a tpuctl child process: this one without AMBIENT, the checkout under
    test on PYTHONPATH (even without the editable install), then `extra`."""
    environ = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(OFFLINE)
    environ.update(extra or {})
    return environ


# A runner started as a background job (`.ci/run &`) has SIGINT ignored, and its children
# inherit that; Python installs its Ctrl-C handler only over the default disposition, so such a
# child would never see the test's SIGINT. Reset it, then exec: the default survives exec.
_RESET_AND_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def python_with_default_sigint(*args: str) -> list[str]:
    """argv for `python ARGS` whose SIGINT behaves as at a terminal, however tests were run."""
    return [sys.executable, "-c", _RESET_AND_EXEC, *args]


# The longest pause between two polls of a wait that has lasted over a second. A state that
# lasts less than that can pass unseen: wait for the emulator's event of it instead
# (EmulatorProcess.admin.wait_for_event).
LONG_WAIT_INTERVAL = 0.2


def wait_for(
    predicate: Callable[[], T], timeout: float = 20.0, what: str = "it", interval: float = 0.05
) -> T:
    """Poll until `predicate` returns something true, and return that; fail after `timeout`.
    Every `interval` for the first second, then less often, up to every LONG_WAIT_INTERVAL:
    the suite's long waits (a run through a preemption) poll a journal (a spec load and a
    read, about 1.5 ms) or the emulator, and at 20 a second that was 3% of a core for each
    test process waiting, most of their own CPU while they waited."""
    start = time.monotonic()
    deadline = start + timeout
    pause = interval
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
        if time.monotonic() - start > 1.0:
            pause = min(max(interval, LONG_WAIT_INTERVAL), pause * 1.5)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_for_bytes(path: Path, timeout: float = 20.0, what: str = "it") -> bytes:
    """Wait until the file at `path` has something in it, and return its bytes. Waiting for it
    to exist is not enough: a shell's `>` or Python's open() creates it empty, and the write
    comes after (a test read such a file in between, and found nothing)."""

    def read() -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b""

    return wait_for(read, timeout, what)
