"""Fixtures for CLI tests: spec files, the CLI in-process (CliRunner) and as a real process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.support import Outcome, child_environment, invoke

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

WriteSpec = Callable[..., Path]
InvokeCli = Callable[..., Outcome]
SpawnCli = Callable[..., "subprocess.CompletedProcess[str]"]


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

    def invoke_cli(args: list[str], env: Mapping[str, str | None] | None = None) -> Outcome:
        return invoke(args, env)

    return invoke_cli


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
