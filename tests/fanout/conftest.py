"""Fixtures for fan-out tests: a multislice QR in the shared emulator for each test module,
and tpuctl in-process in that QR's project with a private HOME (~/.ssh) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import QR, Project, project_in


@pytest.fixture(scope="module")
def qr(emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QR]:
    """Two v4-16 slices: 4 workers, shared by a test module (tests restore any fault)."""
    with project_in(emulator, tmp_path_factory.mktemp("fanout")) as owner:
        yield owner.create_qr(accelerator="v4-16", slices=2)


@pytest.fixture
def tpuctl(
    emulator: Any, qr: QR, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Project]:
    """tpuctl in the module QR's project, with this test's own HOME."""
    project = Project(emulator, tmp_path, qr.project)
    for name, value in project.env.items():
        monkeypatch.setenv(name, value)
    yield project
