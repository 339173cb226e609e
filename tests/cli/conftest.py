"""Fixtures for CLI tests: spec files, the CLI in-process (CliRunner) and as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuctl.cli.main import _wants_json, run

REPO = Path(__file__).resolve().parents[2]

VALID_SPEC = """\
apiVersion: tpuctl/v1
name: demo
tpu:
  accelerator: v4-16
  runtime: tpu-ubuntu2204-base
  slices: 2
capacity:
  tier: spot
job:
  command: python3 train.py
  parallelism:
    ici: {fsdp: 8}
    dcn: {data: 2}
"""

# Environment that would change what tpuctl prints; cleared so tests see only what they set.
AMBIENT_VARIABLES = (
    "TPUCTL_FORMAT",
    "TPUCTL_PROJECT",
    "TPUCTL_ZONE",
    "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_COMPUTE_ZONE",
    "TPU_EMULATOR_HOST",
    "NO_COLOR",
)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str


WriteSpec = Callable[..., Path]
InvokeCli = Callable[..., Outcome]
SpawnCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AMBIENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def write_spec(tmp_path: Path) -> WriteSpec:
    """Write spec text to tmp_path/<name> and return the path."""

    def write(text: str = VALID_SPEC, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def cli() -> InvokeCli:
    """Run tpuctl in-process through CliRunner's isolation and main.run's error boundary."""

    def invoke(args: list[str], env: Mapping[str, str | None] | None = None) -> Outcome:
        runner = CliRunner()
        with runner.isolation(env=env) as streams:
            code = run(list(args), as_json=_wants_json(list(args)), debug="--debug" in args)
            sys.stdout.flush()  # the isolated streams are buffered text wrappers
            sys.stderr.flush()
            out, err = streams[0], streams[1]
            return Outcome(code, out.getvalue().decode(), err.getvalue().decode())

    return invoke


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in AMBIENT_VARIABLES}
    environ["PYTHONPATH"] = str(REPO)  # the checkout under test, even without the editable install
    environ.update(extra or {})
    return environ


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[SpawnCli]:
    """Run `python -m tpuctl ARGS` as a real process in tmp_path."""

    def spawn_cli(
        args: list[str], env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuctl", *args],
            cwd=tmp_path,
            env=child_environment(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    yield spawn_cli
