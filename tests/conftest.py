"""Shared pytest options and fixtures for the whole suite.

Every test runs in a clean environment (tests.support.AMBIENT unset) that never reaches beyond
this machine: NO_GCE_CHECK keeps google-auth off the metadata server's link-local address, and
GCE_METADATA_HOST points any stray metadata request at a closed loopback port. A test that uses
the session emulator is marked `emulator` automatically, so `pytest -m "not emulator"` is the
pure unit run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from tests.fake_gcs import fake_gcs, gcs_bucket  # noqa: F401  (fixtures for every folder)
from tests.harness import Project, project_in
from tests.order import DURATIONS, load_durations, spread_slow_tests
from tests.support import AMBIENT, OFFLINE
from tpuctl.cli.main import fewer_collections, no_last_collection

# Each test process collects and imports the whole suite, and runs the CLI in process: with
# the CLI's garbage-collector setting (a youngest generation of 10,000) as tpuctl runs.
fewer_collections()


def pin_python3() -> None:
    """`python3` on PATH as the interpreter itself when it is a version manager's shim.

    The emulated VMs run their trainers as `python3 …` with this machine's PATH. A shim
    (pyenv's is a bash script that runs about ten more) costs about 0.1 s of CPU a launch, ten
    times the interpreter's own start, and the suite launches hundreds. The interpreter is the
    one the shim picks, so no trainer changes. Test processes and the emulators inherit PATH."""
    found = shutil.which("python3")
    if found is None:
        return
    with open(found, "rb") as head:
        if head.read(4) == b"\x7fELF":
            return
    picked = subprocess.run(
        [found, "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not picked or not os.path.isabs(picked):
        return
    pinned = tempfile.mkdtemp(prefix="tpuctl-test-python3-")
    atexit.register(shutil.rmtree, pinned, True)
    os.symlink(picked, os.path.join(pinned, "python3"))
    os.environ["PATH"] = pinned + os.pathsep + os.environ.get("PATH", "")


pin_python3()

if TYPE_CHECKING:  # grpc is imported only by sessions that use the emulator
    from tpuctl.emulator.client.testing import EmulatorProcess

# Property tests share the machine with emulators and SSH servers: an example that takes long
# under load is no failure (their deadline is for code that is slow everywhere).
settings.register_profile(
    "tpuctl", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("tpuctl")

# The session emulator: 20x faster than Cloud TPU, a 60 s autocheckpoint grace (3 s real).
EMULATOR_SPEED = "20"
EMULATOR_GRACE = "60s"
# Fixtures that start (or stand on) the session emulator: a test using one is an emulator test.
EMULATOR_FIXTURES = frozenset({"emulator", "project", "qr", "tpuctl", "make_job_qr", "make_job"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite golden files under tests/golden/ from the current output.",
    )


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """By its end a test process holds everything its tests imported and made, and the
    interpreter's last garbage collection walked all of it as the process exited (py-spy
    found them there): twelve at once held the end of a parallel run for about 6 s. Freeze
    it, as tpuctl's commands do."""
    no_last_collection()


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle and -m/-k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if EMULATOR_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.emulator)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        items[:] = spread_slow_tests(
            items,
            workers,
            load_durations(DURATIONS),
            together=lambda item: item.get_closest_marker("compute_library") is not None,
        )


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)


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
    from tpuctl.emulator.client.testing import EmulatorProcess

    state_dir: Path = tmp_path_factory.mktemp("emulator") / "state"
    process = EmulatorProcess(state_dir, "--speed", EMULATOR_SPEED, "--grace", EMULATOR_GRACE)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def project(
    emulator: EmulatorProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Project]:
    """This test's own project in the session emulator (tests/harness.py), its environment
    set for in-process library calls too; whatever it leaves is deleted afterwards."""
    with project_in(emulator, tmp_path) as made:
        for name, value in made.env.items():
            monkeypatch.setenv(name, value)
        yield made
