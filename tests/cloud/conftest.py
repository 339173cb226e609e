"""Fixtures for lifecycle tests against the emulator (the `project` harness is suite-wide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def no_v4_capacity(emulator: Any) -> Iterator[Callable[[], None]]:
    """Set the v4 pool to 0 chips (QRs queue in WAITING_FOR_RESOURCES); restored afterwards.

    The fixture value restores capacity early (for tests that release the queue themselves).
    """
    admin = emulator.admin
    before = admin.capacity()["v4"]["total"]
    admin.capacity({"v4": 0})

    def restore() -> None:
        admin.capacity({"v4": before})

    try:
        yield restore
    finally:
        restore()


@pytest.fixture
def read_until() -> Callable[[Any, str, list[str]], bool]:
    """read(stream, needle, lines): read lines (blocking) until one contains `needle`."""

    def read(stream: Any, needle: str, lines: list[str]) -> bool:
        for line in stream:
            lines.append(line)
            if needle in line:
                return True
        return False

    return read
