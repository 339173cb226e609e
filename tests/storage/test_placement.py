"""Where the checkpoint bucket is, read from a real fake-gcs-server (every bucket it makes is
in US-CENTRAL1), as create and up warn before buying capacity."""

from __future__ import annotations

from tpuctl.jobs.provision import placement_warnings
from tpuctl.spec.load import load_spec_text
from tpuctl.storage.placement import bucket_placement


def _spec(directory: str) -> str:
    return (
        "apiVersion: tpuctl/v1\nname: demo\n"
        "tpu: {accelerator: v4-8, runtime: tpu-ubuntu2204-base}\n"
        f"checkpoint: {{dir: '{directory}'}}\n"
    )


def test_a_bucket_in_another_region_is_warned_about_before_create(gcs_bucket: str) -> None:
    spec = load_spec_text(_spec(f"gs://{gcs_bucket}/runs"), environ={}).spec
    [warning] = placement_warnings(spec, "us-central2-b")
    assert warning.startswith(f"checkpoint bucket gs://{gcs_bucket} is in US-CENTRAL1 (region)")
    assert placement_warnings(spec, "us-central1-f") == []


def test_an_unreadable_bucket_is_a_warning(gcs_bucket: str) -> None:
    spec = load_spec_text(_spec("gs://no-such-bucket-here/runs"), environ={}).spec
    [warning] = placement_warnings(spec, "us-central1-f")
    assert warning.startswith("could not read the location of gs://no-such-bucket-here: ")
    assert "does not exist" in warning


def test_local_checkpoints_have_no_bucket_to_check() -> None:
    assert bucket_placement("/mnt/ckpt", "us-central2-b") is None
    spec = load_spec_text(_spec("/mnt/ckpt"), environ={}).spec
    assert placement_warnings(spec, "us-central2-b") == []
