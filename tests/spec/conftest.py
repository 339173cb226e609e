"""Fixtures for the spec tests: write a spec into tmp_path and load it, or catch its error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.errors import ExitCode, SpecError
from tpuctl.spec.load import LoadedSpec, load_spec

# The smallest valid spec; tests append sections to it.
MINIMAL = """\
apiVersion: tpuctl/v1
name: demo
tpu:
  accelerator: v4-16
  runtime: tpu-ubuntu2204-base
"""


@pytest.fixture
def minimal() -> str:
    return MINIMAL


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def load(write_spec: Callable[..., Path]) -> Callable[..., LoadedSpec]:
    def run(text: str, **kwargs: Any) -> LoadedSpec:
        return load_spec(write_spec(text), **kwargs)

    return run


@pytest.fixture
def spec_error(write_spec: Callable[..., Path]) -> Callable[..., SpecError]:
    """Load text that must fail; returns the SpecError after checking its exit code."""

    def run(text: str, **kwargs: Any) -> SpecError:
        path = write_spec(text)
        with pytest.raises(SpecError) as info:
            load_spec(path, **kwargs)
        error = info.value
        assert error.exit_code == ExitCode.USAGE
        assert int(error.exit_code) == 2
        assert error.location is not None
        return error

    return run
