"""The startup script's done marker in the shared checkpoint dir, and job.target_step."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.render.conftest import install_python_tools
from tpuctl.errors import SpecError
from tpuctl.render.startup import render_startup_script
from tpuctl.spec.model import Spec

# A stand-in for `gcloud storage` over a local directory: gs://BUCKET/NAME is <root>/BUCKET/NAME.
# It implements what the startup script uses: `ls -- URL` (with `*` wildcards) and `cp - URL`.
FAKE_GCLOUD = r"""
import glob, os, sys
root = os.environ["FAKE_GCS_ROOT"]
args = [a for a in sys.argv[1:] if a != "--"]
with open(os.path.join(root, "calls"), "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\n")
def local(url):
    assert url.startswith("gs://"), url
    return os.path.join(root, url[len("gs://"):])
if os.environ.get("FAKE_GCS_DENY"):
    print("ERROR: (gcloud.storage.ls) [svc@p.iam] does not have permission to access b "
          "(AccessDeniedException: 403)", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["storage", "ls"]:
    found = sorted(glob.glob(local(args[2])))
    for path in found:
        print("gs://" + os.path.relpath(path, root))
    if not found:  # what gcloud says when there is simply nothing there
        print("ERROR: (gcloud.storage.ls) One or more URLs matched no objects.", file=sys.stderr)
    sys.exit(0 if found else 1)
if args[:3] == ["storage", "cp", "-"]:
    target = local(args[3])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as out:
        out.write(sys.stdin.read())
    sys.exit(0)
sys.exit(2)
"""


def _with_target(spec: Spec, target_step: int | None) -> Spec:
    assert spec.job is not None
    return replace(spec, job=replace(spec.job, target_step=target_step))


def _make_steps(root: Path, *names: str, commit: bool = True) -> None:
    for name in names:
        folder = root / name
        folder.mkdir(parents=True)
        if commit:
            (folder / "commit_success.txt").write_text("ok")


@pytest.fixture
def fake_gcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "gcs"
    root.mkdir()
    bin_dir = install_python_tools(tmp_path / "fake-bin", {"gcloud": FAKE_GCLOUD})
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GCS_ROOT", str(root))
    return root


def test_shared_marker_stops_a_relaunch_on_a_new_disk(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], tmp_path: Path
) -> None:
    shared = tmp_path / "shared-ckpt"
    spec = job_spec('echo run >>"$HOME/runs"', checkpoint_dir=str(shared))
    first = make_worker("demo", "vm-a")
    first.run(render_startup_script(spec))
    env_marker = shared / "tpuctl/demo/DONE"
    assert first.wait_for_state("exited")["exit_code"] == "0"
    assert env_marker.parent.is_dir() and not env_marker.exists()
    env_marker.write_text("finished\n")
    # A repaired worker: a fresh disk, but the same shared checkpoint dir.
    second = make_worker("demo", "vm-b")
    result = second.run(render_startup_script(spec))
    assert result.returncode == 0
    assert f"done marker {env_marker} exists" in result.stderr
    assert second.status()["state"] == "done"
    assert not (second.root / "home/tpuctl/runs").exists()


@pytest.mark.parametrize(
    ("framework", "subdir"),
    [("orbax", ""), ("maxtext", "demo/checkpoints"), ("pax", "checkpoints")],
)
def test_target_step_reached_writes_the_marker(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    tmp_path: Path,
    framework: str,
    subdir: str,
) -> None:
    shared = tmp_path / "ckpt"
    root = shared / subdir if subdir else shared
    # A committed step 20 (zero-padded, with a prefix) and a save of step 30 still in progress.
    command = (
        f'mkdir -p "{root}/ckpt_00020" "{root}/30.orbax-checkpoint-tmp-1" "{root}/metadata"; '
        'echo "$TPUCTL_TARGET_STEP $TPUCTL_AUTOCHECKPOINT" >"$HOME/env"'
    )
    spec = job_spec(command, checkpoint_dir=str(shared), framework=framework, autocheckpoint=True)
    if framework != "orbax":  # presets append flags; let `bash -c` ignore them
        spec = replace(spec, job=replace(spec.job, command=f"f() {{ {command}; }}; f"))
    worker = make_worker("demo")
    worker.run(render_startup_script(_with_target(spec, 20)))
    status = worker.wait_for_state("done", "exited")
    assert status["state"] == "done", (worker.log_dir / "boot-1.log").read_text()
    marker = shared / "tpuctl/demo/DONE"
    assert marker.read_text().startswith("committed step 20 >= target_step 20")
    assert (worker.root / "home/tpuctl/env").read_text() == "20 1\n"
    assert "done marker" in worker.run(render_startup_script(spec)).stderr


def test_target_step_not_reached_leaves_the_job_relaunchable(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], tmp_path: Path
) -> None:
    shared = tmp_path / "ckpt"
    _make_steps(shared, "10")
    _make_steps(shared, "25.orbax-checkpoint-tmp")  # a tmp folder is no committed step
    spec = _with_target(job_spec('echo run >>"$HOME/runs"', checkpoint_dir=str(shared)), 25)
    worker = make_worker("demo")
    script = render_startup_script(spec)
    worker.run(script)
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert not (shared / "tpuctl/demo/DONE").exists()
    assert (
        "latest committed step 10 is below target_step 25"
        in (worker.log_dir / "boot-1.log").read_text()
    )
    worker.run(script)
    worker.wait_for_state("exited")
    assert (worker.root / "home/tpuctl/runs").read_text() == "run\nrun\n"


def test_gcs_marker_and_target_step_use_gcloud_storage(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], fake_gcs: Path
) -> None:
    bucket = fake_gcs / "bucket/runs"
    _make_steps(bucket, "5", "7")
    _make_steps(bucket, "9", commit=False)  # on Cloud Storage, no commit file: unfinished
    spec = _with_target(job_spec("true", checkpoint_dir="gs://bucket/runs"), 7)
    worker = make_worker("demo")
    script = render_startup_script(spec)
    worker.run(script)
    status = worker.wait_for_state("done", "exited")
    assert status["state"] == "done", (worker.log_dir / "boot-1.log").read_text()
    marker = bucket / "tpuctl/demo/DONE"
    assert marker.read_text().startswith("committed step 7 >= target_step 7")
    calls = (fake_gcs / "calls").read_text().splitlines()
    assert "storage ls -- gs://bucket/runs/tpuctl/demo/DONE" in calls
    assert "storage ls -- gs://bucket/runs/*/commit_success.txt" in calls
    assert "storage cp - gs://bucket/runs/tpuctl/demo/DONE" in calls
    result = worker.run(script)
    assert "done marker gs://bucket/runs/tpuctl/demo/DONE exists" in result.stderr
    assert worker.status()["state"] == "done" and worker.status()["boot"] == "2"


def test_gcs_target_step_below_does_not_mark(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], fake_gcs: Path
) -> None:
    _make_steps(fake_gcs / "bucket/runs", "5")
    _make_steps(fake_gcs / "bucket/runs", "9", commit=False)
    spec = _with_target(job_spec("true", checkpoint_dir="gs://bucket/runs"), 9)
    worker = make_worker("demo")
    worker.run(render_startup_script(spec))
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert not (fake_gcs / "bucket/runs/tpuctl/demo/DONE").exists()


def test_a_done_marker_that_cannot_be_read_is_a_setup_failure_not_a_relaunch(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    fake_gcs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = job_spec('echo ran >>"$HOME/runs"', checkpoint_dir="gs://bucket/runs")
    worker = make_worker("demo")
    monkeypatch.setenv("FAKE_GCS_DENY", "1")
    monkeypatch.setenv("TPUCTL_LOOKUP_RETRY_SECONDS", "0")
    result = worker.run(render_startup_script(spec))
    status = worker.status()
    assert status["state"] == "setup-failed", result.stderr
    assert "cannot tell whether the job is done" in status["reason"]
    assert "AccessDeniedException" in status["reason"]
    assert not (worker.root / "home/tpuctl/runs").exists()  # the job was never launched
    tries = (
        (fake_gcs / "calls").read_text().count("storage ls -- gs://bucket/runs/tpuctl/demo/DONE")
    )
    assert tries == 4  # tried again before giving up


def test_without_gcloud_or_gsutil_a_gs_marker_is_a_setup_failure(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    for tool in ("bash", "curl", "flock", "date", "mkdir", "mv", "cat", "ln", "sleep", "id"):
        found = shutil.which(tool)
        if found:
            (empty / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("TPUCTL_LOOKUP_RETRY_SECONDS", "0")
    worker = make_worker("demo")
    worker.run(render_startup_script(job_spec("true", checkpoint_dir="gs://bucket/runs")))
    status = worker.status()
    assert status["state"] == "setup-failed"
    assert "neither gcloud nor gsutil is installed" in status["reason"]


def test_target_step_without_a_checkpoint_dir_is_a_spec_error(
    job_spec: Callable[..., Any],
) -> None:
    with pytest.raises(SpecError) as caught:
        render_startup_script(_with_target(job_spec("true"), 10))
    assert caught.value.path == "job.target_step"


def test_a_rerun_by_tpuctl_is_the_same_boot(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tpuctl's rerun is not a new boot, and does not launch a job that already ran in this
    boot (a job with side effects would run twice); a restart does, and a new boot does."""
    spec = job_spec('echo "$TPUCTL_BOOT" >>"$HOME/boots"')
    worker = make_worker("demo")
    script = render_startup_script(spec)
    monkeypatch.setenv("TPUCTL_STARTUP_RERUN", "1")  # with no boot yet, it still counts one
    worker.run(script)
    assert worker.wait_for_state("exited")["boot"] == "1"
    result = worker.run(script)
    assert "rerun in boot 1 of run demo" in result.stderr
    assert "launched in this boot already and ended; not launching it again" in result.stderr
    assert worker.wait_for_state("exited")["boot"] == "1"
    monkeypatch.setenv("TPUCTL_STARTUP_RESTART", "1")
    worker.run(script)
    assert worker.wait_for_state("exited")["boot"] == "1"
    monkeypatch.delenv("TPUCTL_STARTUP_RESTART")
    monkeypatch.delenv("TPUCTL_STARTUP_RERUN")
    worker.run(script)
    assert worker.wait_for_state("exited")["boot"] == "2"
    assert (worker.root / "home/tpuctl/boots").read_text() == "1\n1\n2\n"
    assert (worker.log_dir / "boot-1.log").read_text().count("trainer started") == 2
