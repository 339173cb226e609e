"""scripts/ci-example.sh runs against the emulator: success path and the deadline path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.emulator

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci-example.sh"
Cloud = Any  # tests/cloud/conftest.py


def ci(cloud: Cloud, spec: Path) -> subprocess.CompletedProcess[str]:
    env = {**cloud.child_env(), "TPUCTL": f"{sys.executable} -m tpuctl"}
    return subprocess.run(
        ["bash", str(SCRIPT), str(spec)],
        cwd=cloud.tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ci_example_succeeds_and_cleans_up(cloud: Cloud) -> None:
    spec = cloud.spec()
    done = ci(cloud, spec)
    assert done.returncode == 0, done.stderr
    assert "ACTIVE with 1 worker(s)" in done.stderr
    assert done.stderr.rstrip().endswith("ok")
    assert cloud.qr_names() == []


def test_ci_example_reports_a_queue_deadline_with_exit_4(cloud: Cloud, no_v4_capacity: Any) -> None:
    spec = cloud.spec(extra="deadlines:\n  queue: 1s\n")
    done = ci(cloud, spec)
    assert done.returncode == 4, done.stderr
    assert "no capacity within the deadline" in done.stderr
    assert cloud.qr_names() == []
