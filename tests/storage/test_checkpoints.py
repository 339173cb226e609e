"""inspect_checkpoints on hand-made Orbax layouts, on a local disk and on a real fake-gcs-server."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.storage.helpers import FakeGcs, GcsLayout, LocalLayout, metadata_json
from tpuctl.errors import NotFoundError
from tpuctl.storage.checkpoints import inspect_checkpoints

Layout = LocalLayout | GcsLayout
SECOND = 1_000_000_000


@pytest.fixture(params=["local", "gcs"])
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> Layout:
    if request.param == "local":
        return LocalLayout(tmp_path / "run" / "checkpoints")
    fake = request.getfixturevalue("fake_gcs")
    bucket = request.getfixturevalue("gcs_bucket")
    return GcsLayout(fake.client(), bucket, "run/checkpoints")


def committed_step(layout: Layout, name: str, init_ns: int, commit_ns: int) -> None:
    layout.put(f"{name}/default/array.zarr", "data")
    layout.put(f"{name}/_CHECKPOINT_METADATA", metadata_json(init_ns, commit_ns))
    layout.put(f"{name}/commit_success.txt", "Checkpoint commit was successful")


def test_complete_steps_durations_names_and_ignored_entries(layout: Layout) -> None:
    base = time.time_ns() - 7200 * SECOND  # two hours ago: every tmp folder below is newer
    committed_step(layout, "10", base, base + 2_500_000_000)
    committed_step(layout, "20", base + 600 * SECOND, base + 600 * SECOND + 1_250_000_000)
    layout.put("metadata/descriptor.json", "{}")  # Orbax's own non-step folder
    layout.put("final.json", "{}")
    layout.put("notes_x/readme", "not a step")
    layout.put("7", "a file named like a step is not a step folder")
    layout.put("30.orbax-checkpoint-tmp/default/array.zarr", "partial")  # in progress
    layout.put("15.orbax-checkpoint-tmp-3/default/array.zarr", "partial")  # counter form

    report = inspect_checkpoints(layout.url)

    assert [folder.name for folder in report.steps] == ["10", "20"]
    assert report.latest_step == 20
    assert report.complete_steps == (10, 20)
    assert report.unfinished_steps == ()
    ten, twenty = report.steps
    assert ten.save_seconds == pytest.approx(2.5)
    assert twenty.save_seconds == pytest.approx(1.25)
    assert ten.complete and ten.has_commit_file and ten.notes == ()
    # The commit time is the metadata's, not the object's.
    assert twenty.committed_at == datetime.fromtimestamp(
        (base + 600 * SECOND + 1_250_000_000) / 1e9, tz=timezone.utc
    )
    assert twenty.started_at is not None and twenty.started_at < twenty.committed_at
    assert report.latest_committed_at == twenty.committed_at
    assert sorted(report.ignored) == ["7", "final.json", "metadata", "notes_x"]
    tmp = {folder.name: folder for folder in report.tmp_folders}
    assert set(tmp) == {"15.orbax-checkpoint-tmp-3", "30.orbax-checkpoint-tmp"}
    assert tmp["15.orbax-checkpoint-tmp-3"].step == 15
    assert tmp["15.orbax-checkpoint-tmp-3"].stale  # at or below the latest step: left over
    assert not tmp["30.orbax-checkpoint-tmp"].stale  # newer than the last commit: a save running
    assert tmp["30.orbax-checkpoint-tmp"].modified_at is not None
    assert [folder.name for folder in report.stale_tmp_folders] == ["15.orbax-checkpoint-tmp-3"]
    json.dumps(report.to_dict())  # JSON-friendly as it is


def test_tmp_folder_older_than_the_newest_commit_is_stale(layout: Layout) -> None:
    future = time.time_ns() + 3600 * SECOND  # a commit newer than anything written below
    layout.put("25.orbax-checkpoint-tmp-1700000000/default/array.zarr", "partial")  # timestamp
    committed_step(layout, "20", future - SECOND, future)
    report = inspect_checkpoints(layout.url)
    assert report.latest_step == 20
    (folder,) = report.tmp_folders
    assert folder.step == 25 and folder.stale


def test_prefixed_and_zero_padded_step_names(layout: Layout) -> None:
    now = time.time_ns()
    committed_step(layout, "checkpoint_000100", now, now + SECOND)
    committed_step(layout, "checkpoint_000200", now, now + SECOND)
    committed_step(layout, "my_run_5", now, now + SECOND)
    layout.put("checkpoint_000300.orbax-checkpoint-tmp-1/x", "partial")
    report = inspect_checkpoints(layout.url)
    assert [(folder.step, folder.prefix) for folder in report.steps] == [
        (5, "my_run"),
        (100, "checkpoint"),
        (200, "checkpoint"),
    ]
    assert report.latest_step == 200
    assert [(folder.step, folder.name) for folder in report.tmp_folders] == [
        (300, "checkpoint_000300.orbax-checkpoint-tmp-1")
    ]


def test_latest_age_is_measured_from_now(layout: Layout) -> None:
    commit = time.time_ns() - 90 * SECOND
    committed_step(layout, "3", commit - SECOND, commit)
    now = datetime.fromtimestamp(commit / 1e9, tz=timezone.utc) + timedelta(seconds=90)
    report = inspect_checkpoints(layout.url, now=now)
    assert report.inspected_at == now
    assert report.latest_age_seconds == pytest.approx(90, abs=0.01)
    assert report.to_dict()["latest_age_seconds"] == pytest.approx(90, abs=0.01)


def test_unreadable_metadata_is_noted(layout: Layout) -> None:
    layout.put("4/_CHECKPOINT_METADATA", "{half a json")
    layout.put("4/commit_success.txt", "ok")
    (folder,) = inspect_checkpoints(layout.url).steps
    assert folder.complete and folder.save_seconds is None
    assert folder.notes == ("unreadable _CHECKPOINT_METADATA",)
    assert folder.committed_at is not None  # from the commit file's own time


# ------------------------------------------------------------------------------ local only


def test_local_folder_without_commit_file_is_complete_but_noted(tmp_path: Path) -> None:
    layout = LocalLayout(tmp_path / "ckpt")
    now = time.time_ns()
    committed_step(layout, "10", now, now + SECOND)
    layout.put("20/default/array.zarr", "saved by Orbax before 0.12.3")
    report = inspect_checkpoints(layout.url)
    assert report.latest_step == 20
    twenty = report.steps[-1]
    assert twenty.complete and not twenty.has_commit_file
    assert twenty.notes == ("no commit_success.txt (saved before Orbax 0.12.3?)",)
    assert twenty.committed_at is not None  # the folder's own time
    assert report.unfinished_steps == ()


def test_local_tmp_folder_mtime_decides_staleness(tmp_path: Path) -> None:
    layout = LocalLayout(tmp_path / "ckpt")
    commit = time.time_ns()
    committed_step(layout, "20", commit - SECOND, commit)
    layout.folder("25.orbax-checkpoint-tmp-1700000000", mtime=commit / 1e9 - 600)
    layout.folder("30.orbax-checkpoint-tmp", mtime=commit / 1e9 + 60)
    stale = {folder.name: folder.stale for folder in inspect_checkpoints(layout.url).tmp_folders}
    assert stale == {"25.orbax-checkpoint-tmp-1700000000": True, "30.orbax-checkpoint-tmp": False}


def test_empty_and_missing_local_directories(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    report = inspect_checkpoints(str(tmp_path / "empty"))
    assert report.steps == () and report.latest_step is None and report.tmp_folders == ()
    assert report.storage == "local"
    with pytest.raises(NotFoundError, match="does not exist"):
        inspect_checkpoints(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotFoundError, match="not a checkpoint directory"):
        inspect_checkpoints(str(tmp_path / "file"))


def test_empty_local_step_folder_is_noted(tmp_path: Path) -> None:
    layout = LocalLayout(tmp_path / "ckpt")
    layout.folder("5")
    (folder,) = inspect_checkpoints(layout.url).steps
    assert "empty folder" in folder.notes


# ------------------------------------------------------------------------------ Cloud Storage only


def test_gcs_folder_without_commit_file_is_an_unfinished_save(
    fake_gcs: FakeGcs, gcs_bucket: str
) -> None:
    layout = GcsLayout(fake_gcs.client(), gcs_bucket, "ckpt")
    now = time.time_ns()
    committed_step(layout, "10", now, now + SECOND)
    layout.put("20/default/array.zarr", "written straight into the step folder")
    layout.put("20/_CHECKPOINT_METADATA", metadata_json(now + 2 * SECOND, None))
    report = inspect_checkpoints(layout.url)
    assert report.storage == "gcs"
    assert report.latest_step == 10
    assert report.unfinished_steps == (20,)
    twenty = report.steps[-1]
    assert not twenty.complete and twenty.save_seconds is None and twenty.committed_at is None
    assert twenty.started_at is not None
    assert "save in progress or abandoned" in twenty.notes[0]


def test_gcs_bucket_root_folder_placeholder_and_missing(fake_gcs: FakeGcs, gcs_bucket: str) -> None:
    empty = inspect_checkpoints(f"gs://{gcs_bucket}")
    assert empty.steps == () and empty.latest_step is None
    bucket = fake_gcs.client().bucket(gcs_bucket)
    bucket.blob("ckpt/").upload_from_string("")  # a "folder" the console would create
    assert inspect_checkpoints(f"gs://{gcs_bucket}/ckpt/").steps == ()
    committed_step(GcsLayout(fake_gcs.client(), gcs_bucket, ""), "8", 1, 2)
    assert inspect_checkpoints(f"gs://{gcs_bucket}").latest_step == 8
    with pytest.raises(NotFoundError, match="does not exist"):
        inspect_checkpoints(f"gs://{gcs_bucket}/no/such/prefix")
    with pytest.raises(NotFoundError):
        inspect_checkpoints("gs://no-such-bucket-tpuctl/ckpt")
