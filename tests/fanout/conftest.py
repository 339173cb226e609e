"""Fixtures for fan-out tests: a multislice QR in the shared emulator, tpuctl in-process, and
a private HOME (~/.ssh) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fanout.helpers import QR, USER, Tpuctl, create_qr, delete_qr
from tests.support import AMBIENT


@pytest.fixture(scope="module")
def qr(emulator: Any) -> Iterator[QR]:
    """Two v4-16 slices: 4 workers, shared by a test module (tests restore any fault)."""
    created = create_qr(emulator)
    yield created
    delete_qr(emulator, created)


@pytest.fixture
def tpuctl(emulator: Any, qr: QR, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tpuctl:
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USER", USER)
    return Tpuctl(emulator, home, qr.project)
