"""Shared pytest options and fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # grpc is imported only by sessions that use the emulator
    from tpuctl.emulator.testing import EmulatorProcess

# The session emulator: 20x faster than Cloud TPU, a 60 s autocheckpoint grace (3 s real).
EMULATOR_SPEED = "20"
EMULATOR_GRACE = "60s"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite golden files under tests/golden/ from the current output.",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """One `tpuctl emulator start` subprocess for the session (127.0.0.1, port 0, --speed 20).

    Yields an object with `.host`, `.ssh_port`, `.state_dir`, `.admin` (AdminClient),
    `.environment()` and `.tpu_client()` (the real TpuClient on an insecure channel).
    Tests that change global state (capacity, API faults) must restore it.
    """
    from tpuctl.emulator.testing import EmulatorProcess

    state_dir: Path = tmp_path_factory.mktemp("emulator") / "state"
    process = EmulatorProcess(state_dir, "--speed", EMULATOR_SPEED, "--grace", EMULATOR_GRACE)
    process.start()
    try:
        yield process
    finally:
        process.stop()
