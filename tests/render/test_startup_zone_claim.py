"""The startup script's zone gate (zone_policy first-active): the job is launched only on the
workers of the zone claimed beside the checkpoints; anywhere else, and while nothing is claimed
or the claim cannot be read, nothing is launched."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.render.conftest import install_python_tools
from tpuctl.render.startup import render_startup_script, render_values
from tpuctl.spec.model import CapacitySpec, Spec

OWN_ZONE = "us-central2-b"  # the zone in the fake metadata server's tpu-env
ZONES = ("us-central1-a", OWN_ZONE)

# `gcloud storage` over a local directory (gs://B/N is <root>/B/N): `cat URL`, and `ls URL`
# finding nothing (the done marker is not there); FAKE_GCS_DENY_CAT makes `cat` a permission
# error.
FAKE_GCLOUD = r"""
import os, sys
root = os.environ["FAKE_GCS_ROOT"]
args = [a for a in sys.argv[1:] if a != "--"]
missing = "ERROR: (gcloud.storage.{}) The following URLs matched no objects or files:"
if args[:2] == ["storage", "ls"]:
    print(missing.format("ls"), file=sys.stderr)
    sys.exit(1)
assert args[:2] == ["storage", "cat"], args
if os.environ.get("FAKE_GCS_DENY_CAT"):
    print("ERROR: (gcloud.storage.cat) does not have permission (403)", file=sys.stderr)
    sys.exit(1)
path = os.path.join(root, args[2][len("gs://"):])
if not os.path.exists(path):
    print(missing.format("cat"), file=sys.stderr)
    sys.exit(1)
sys.stdout.write(open(path).read())
"""


def racing(spec: Spec) -> Spec:
    return replace(spec, capacity=CapacitySpec(zones=ZONES, zone_policy="first-active"))


def test_only_a_first_active_spec_has_the_gate(job_spec: Callable[..., Spec]) -> None:
    spec = job_spec("true", checkpoint_dir="gs://bucket/runs")
    assert "ZONE_CLAIM_SPEC=''" in render_values(spec)
    sequential = replace(spec, capacity=CapacitySpec(zones=ZONES))
    assert "ZONE_CLAIM_SPEC=''" in render_values(sequential)
    assert "ZONE_CLAIM_SPEC='gs://bucket/runs/tpuctl/demo/ZONE'" in render_values(racing(spec))


def test_the_job_runs_only_in_the_claimed_zone(
    make_worker: Callable[..., Any], job_spec: Callable[..., Spec], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    spec = racing(job_spec('echo ran >>"$HOME/runs"', checkpoint_dir=str(shared)))
    script = render_startup_script(spec)
    claim = shared / "tpuctl/demo/ZONE"
    worker = make_worker("demo")
    runs = worker.root / "home/tpuctl/runs"

    result = worker.run(script)  # nothing claimed yet: the first boot of a racing zone
    assert result.returncode == 0
    status = worker.status()
    assert status["state"] == "waiting-for-zone" and "no zone yet" in status["reason"]
    claim.write_text("us-central1-a\n")  # another zone won
    worker.run(script)
    status = worker.status()
    assert status["state"] == "waiting-for-zone", status
    assert status["reason"] == (
        f"the run is claimed for us-central1-a, not {OWN_ZONE}: launching nothing"
    )
    assert not runs.exists()

    claim.write_text(f"{OWN_ZONE}\n")  # this zone was chosen: tpuctl runs the script again
    worker.run(script)
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert runs.read_text() == "ran\n"


@pytest.fixture
def fake_gcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "gcs"
    root.mkdir()
    bin_dir = install_python_tools(tmp_path / "fake-bin", {"gcloud": FAKE_GCLOUD})
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GCS_ROOT", str(root))
    monkeypatch.setenv("TPUCTL_LOOKUP_RETRY_SECONDS", "0")
    return root


def test_a_claim_in_cloud_storage_and_one_that_cannot_be_read(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Spec],
    fake_gcs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = racing(job_spec('echo ran >>"$HOME/runs"', checkpoint_dir="gs://bucket/runs"))
    script = render_startup_script(spec)
    claim = fake_gcs / "bucket/runs/tpuctl/demo/ZONE"
    claim.parent.mkdir(parents=True)
    denied = make_worker("demo", "vm-denied")
    monkeypatch.setenv("FAKE_GCS_DENY_CAT", "1")
    denied.run(script)
    status = denied.status()
    assert status["state"] == "setup-failed"
    assert "cannot tell which zone the run is claimed for" in status["reason"]
    assert "403" in status["reason"]
    assert not (denied.root / "home/tpuctl/runs").exists()

    monkeypatch.delenv("FAKE_GCS_DENY_CAT")
    worker = make_worker("demo", "vm-claimed")
    worker.run(script)
    assert worker.status()["state"] == "waiting-for-zone"
    claim.write_text(f"{OWN_ZONE}\n")
    worker.run(script)
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert (worker.root / "home/tpuctl/runs").read_text() == "ran\n"
