"""scripts/ci-example.sh runs against the emulator: success path and the deadline path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import Project

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci-example.sh"


def ci(project: Project, spec: Path) -> subprocess.CompletedProcess[str]:
    env = {**project.child_env(), "TPUCTL": f"{sys.executable} -m tpuctl"}
    return subprocess.run(
        ["bash", str(SCRIPT), str(spec)],
        cwd=project.tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ci_example_succeeds_and_cleans_up(project: Project) -> None:
    spec = project.spec()
    done = ci(project, spec)
    assert done.returncode == 0, done.stderr
    assert "ACTIVE with 1 worker(s)" in done.stderr
    assert done.stderr.rstrip().endswith("ok")
    assert project.qr_names() == []


def test_ci_example_reports_a_queue_deadline_with_exit_4(
    project: Project, no_v4_capacity: Any
) -> None:
    spec = project.spec(extra="deadlines:\n  queue: 1s\n")
    done = ci(project, spec)
    assert done.returncode == 4, done.stderr
    assert "no capacity within the deadline" in done.stderr
    assert project.qr_names() == []
