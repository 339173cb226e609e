"""The worker contract's paths: checkpoint_root per framework, the record dir, the done marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.spec.load import load_spec_text
from tpuctl.spec.model import Spec
from tpuctl.storage.checkpoints import is_done
from tpuctl.worker import checkpoint_root, done_marker, record_dir


def make_spec(*, framework: str = "custom", directory: str | None, run: str | None = None) -> Spec:
    lines = [
        "apiVersion: tpuctl/v1",
        "name: demo",
        "tpu: {accelerator: v4-8, runtime: tpu-ubuntu2204-base}",
        "job:",
        "  command: python3 train.py",
        f"  framework: {framework}",
    ]
    if run:
        lines.append(f"  run_name: {run}")
    if directory is not None:
        lines += ["checkpoint:", f"  dir: {directory}"]
    return load_spec_text("\n".join(lines) + "\n").spec


@pytest.mark.parametrize(
    ("framework", "expected"),
    [
        ("maxtext", "gs://b/out/exp1/checkpoints"),
        ("pax", "gs://b/out/checkpoints"),
        ("orbax", "gs://b/out"),
        ("custom", "gs://b/out"),
    ],
)
def test_checkpoint_root_per_framework(framework: str, expected: str) -> None:
    spec = make_spec(framework=framework, directory="gs://b/out/", run="exp1")
    assert checkpoint_root(spec) == expected
    assert record_dir(spec) == "gs://b/out/tpuctl/exp1"
    assert done_marker(spec) == "gs://b/out/tpuctl/exp1/DONE"


def test_run_name_defaults_to_the_spec_name() -> None:
    spec = make_spec(framework="maxtext", directory="/data/ckpt")
    assert spec.run_name == "demo"
    assert checkpoint_root(spec) == "/data/ckpt/demo/checkpoints"
    assert record_dir(spec) == "/data/ckpt/tpuctl/demo"


def test_no_checkpoint_dir_means_no_paths() -> None:
    spec = make_spec(directory=None)
    assert checkpoint_root(spec) is None
    assert record_dir(spec) is None
    assert done_marker(spec) is None
    assert is_done(spec) is False


def test_is_done_local(tmp_path: Path) -> None:
    spec = make_spec(directory=str(tmp_path / "ckpt"), run="r1")
    assert not is_done(spec)  # not even the directory exists yet
    marker = tmp_path / "ckpt" / "tpuctl" / "r1" / "DONE"
    marker.parent.mkdir(parents=True)
    assert not is_done(spec)
    marker.write_text("finished\n")
    assert is_done(spec)


def test_is_done_on_cloud_storage(gcs_bucket: str) -> None:
    from tpuctl.storage.locations import open_location

    spec = make_spec(directory=f"gs://{gcs_bucket}/jobs", run="r2")
    assert not is_done(spec)
    marker = done_marker(spec)
    assert marker == f"gs://{gcs_bucket}/jobs/tpuctl/r2/DONE"
    open_location(f"gs://{gcs_bucket}/jobs/tpuctl/r2").write_text("DONE", "ok", exclusive=True)
    assert is_done(spec)
    assert not is_done(make_spec(directory="gs://tpuctl-no-such-bucket/jobs"))
