"""The zone claim beside the checkpoints: made, read, changed and withdrawn; never for a spec
whose job is not held back by it."""

from __future__ import annotations

from pathlib import Path

from tpuctl.spec.load import load_spec_text
from tpuctl.spec.model import Spec
from tpuctl.storage.zone_claim import claim_zone, claimed_zone


def spec(directory: Path, policy: str) -> Spec:
    text = f"""apiVersion: tpuctl/v1
name: demo
tpu: {{accelerator: v4-8, runtime: tpu-ubuntu2204-base}}
capacity: {{zones: [us-central2-b, us-central1-a], zone_policy: {policy}}}
checkpoint: {{dir: {directory}}}
job: {{command: python3 train.py}}
"""
    return load_spec_text(text, environ={}).spec


def test_a_claim_is_made_read_changed_and_withdrawn(tmp_path: Path) -> None:
    racing = spec(tmp_path, "first-active")
    assert claimed_zone(racing) is None
    assert claim_zone(racing, "us-central1-a")
    assert (tmp_path / "tpuctl/demo/ZONE").read_text() == "us-central1-a\n"
    assert claimed_zone(racing) == "us-central1-a"
    assert claim_zone(racing, "us-central2-b") and claimed_zone(racing) == "us-central2-b"
    assert claim_zone(racing, None) and claimed_zone(racing) is None
    assert claim_zone(racing, None)  # withdrawing twice is fine


def test_a_sequential_spec_has_no_claim_to_make(tmp_path: Path) -> None:
    sequential = spec(tmp_path, "sequential")
    assert not claim_zone(sequential, "us-central2-b")
    assert claimed_zone(sequential) is None
    assert not (tmp_path / "tpuctl").exists()
