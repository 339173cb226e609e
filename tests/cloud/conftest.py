"""Fixtures for lifecycle tests against the emulator: the shared emulator, the CLI, specs."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    AMBIENT,
    Outcome,
    child_environment,
    invoke,
    python_with_default_sigint,
)

ZONE = "us-central2-b"


@dataclass
class EmulatorHandle:
    host: str
    admin: Any  # tpuctl.emulator.admin.AdminClient
    speed: float


@pytest.fixture(scope="session")
def tpu_emulator(request: pytest.FixtureRequest) -> Iterator[EmulatorHandle]:
    """The session's shared `emulator` fixture (tests/conftest.py); a private one only if the
    suite has none, so these tests also run alone."""
    try:
        shared = request.getfixturevalue("emulator")
    except pytest.FixtureLookupError:
        shared = None
    if shared is not None:
        admin = shared.admin
        yield EmulatorHandle(shared.host, admin, float(admin.status().get("speed", 1.0)))
        return
    from tpuctl.emulator.admin import AdminClient
    from tpuctl.emulator.config import EmulatorConfig
    from tpuctl.emulator.server import Emulator

    with Emulator(EmulatorConfig(speed=10.0)) as own, AdminClient(own.host) as admin:
        yield EmulatorHandle(own.host, admin, 10.0)


@dataclass
class Cloud:
    """One test's slice of the emulator: its own project, so lists see only its QRs."""

    emulator: EmulatorHandle
    project: str
    tmp_path: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "TPU_EMULATOR_HOST": self.emulator.host,
            "TPUCTL_PROJECT": self.project,
            "TPUCTL_ZONE": ZONE,
            "TPUCTL_API_RETRY_SECONDS": "20",
        }

    def cli(self, *args: str, env: Mapping[str, str] | None = None) -> Outcome:
        """tpuctl in-process, through main.run's error boundary (exit codes, JSON errors)."""
        return invoke(args, {**self.env, **(env or {})})

    def child_env(self) -> dict[str, str]:
        """The environment for a child process using this emulator and project."""
        return child_environment(self.env)

    def spawn(self, *args: str, **popen: Any) -> subprocess.Popen[str]:
        """`python -m tpuctl ARGS` as a real process (for real signals)."""
        return subprocess.Popen(
            python_with_default_sigint("-m", "tpuctl", *args),
            cwd=self.tmp_path,
            env=child_environment(self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )

    def spec(self, name: str | None = None, *, extra: str = "", tier: str = "spot") -> Path:
        qr = name or unique("job")
        path = self.tmp_path / f"{qr}.yaml"
        path.write_text(
            f"apiVersion: tpuctl/v1\nname: {qr}\n"
            "tpu:\n  accelerator: v4-8\n  runtime: tpu-ubuntu2204-base\n"
            f"capacity:\n  tier: {tier}\n{extra}",
            encoding="utf-8",
        )
        return path

    def qr_names(self) -> list[str]:
        listed = self.cli("list", "--all", "--format", "json")
        assert listed.exit_code == 0, listed.stderr
        return [entry["name"] for entry in listed.json()["queued_resources"]]

    def api(self) -> Any:
        from tpuctl.cloud.client import connect
        from tpuctl.cloud.resolve import Location

        return connect(Location(self.project, ZONE), environ=self.env)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cloud(
    tpu_emulator: EmulatorHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cloud]:
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    handle = Cloud(tpu_emulator, unique("lifecycle"), tmp_path)
    yield handle
    # Leave nothing behind in the shared emulator.
    for name in handle.qr_names():
        handle.cli("delete", name, "--force", "--yes", "--async", "--ignore-missing")


@pytest.fixture
def no_v4_capacity(tpu_emulator: EmulatorHandle) -> Iterator[Callable[[], None]]:
    """Set the v4 pool to 0 chips (QRs queue in WAITING_FOR_RESOURCES); restored afterwards.

    The fixture value restores capacity early (for tests that release the queue themselves).
    """
    admin = tpu_emulator.admin
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
