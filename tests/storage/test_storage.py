"""tpuctl.storage.storage: the same operations on a local directory and on fake-gcs-server."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.storage.helpers import FakeGcs
from tpuctl.errors import AuthError, NotFoundError, TpuctlError, UsageError
from tpuctl.storage.gcs import GcsStorage
from tpuctl.storage.locations import open_location
from tpuctl.storage.storage import LocalStorage, Storage
from tpuctl.worker import join_location as join_url


@pytest.fixture(params=["local", "gcs"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_location(str(tmp_path / "root"))
    bucket = request.getfixturevalue("gcs_bucket")
    return open_location(f"gs://{bucket}/some/prefix")


def test_write_read_list_stat_delete(location: Storage) -> None:
    assert not location.exists("a.txt")
    assert location.stat("a.txt") is None
    assert location.write_text("a.txt", "héllo\n") is True
    assert location.write_text("sub/dir/b.txt", "b") is True  # parents appear as needed
    assert location.read_text("a.txt") == "héllo\n"
    assert location.write_text("a.txt", "replaced") is True
    assert location.read_text("a.txt") == "replaced"
    assert location.exists() and location.is_dir()
    assert location.exists("sub") and location.is_dir("sub") and not location.is_dir("a.txt")

    entries = location.list()
    assert [(entry.name, entry.is_dir) for entry in entries] == [("a.txt", False), ("sub", True)]
    stat = location.stat("a.txt")
    assert stat is not None and stat.size == len("replaced") and stat.modified is not None
    assert abs(stat.modified - datetime.now(timezone.utc)) < timedelta(minutes=5)
    assert location.newest_modified("sub") is not None

    location.delete("a.txt")
    location.delete("a.txt")  # gone already: not an error
    assert not location.exists("a.txt")
    location.delete("sub", recursive=True)
    assert not location.exists("sub/dir/b.txt")
    with pytest.raises(NotFoundError):
        location.read_text("a.txt")
    with pytest.raises(NotFoundError):
        location.list("sub")


def test_find_names_every_file_so_called_at_any_depth(location: Storage) -> None:
    for path in ("a/tpuctl/one/run.json", "a/b/c/tpuctl/two/run.json", "run.json",
                 "a/tpuctl/one/journal/x.json", "a/not-run.json", "a/run.json.tmp"):  # fmt: skip
        location.write_text(path, "{}")
    assert location.find("run.json") == [
        "a/b/c/tpuctl/two/run.json", "a/tpuctl/one/run.json", "run.json",
    ]  # fmt: skip
    assert location.find("run.json", "a/b") == ["a/b/c/tpuctl/two/run.json"]
    assert location.find("run.json", "nowhere") == []
    # A sibling whose name starts like the prefix is not under it.
    sibling = open_location(location.url + "-other")
    sibling.write_text("tpuctl/three/run.json", "{}")
    assert location.find("run.json", "a/tpuctl") == ["a/tpuctl/one/run.json"]
    assert "tpuctl/three/run.json" not in location.find("run.json")


def test_exclusive_create_happens_once(location: Storage) -> None:
    assert location.write_text("record/DONE", "first", exclusive=True) is True
    assert location.write_text("record/DONE", "second", exclusive=True) is False
    assert location.read_text("record/DONE") == "first"


def test_exclusive_create_races_have_one_winner(location: Storage) -> None:
    # Same location object per thread would share a client; open one each, as processes would.
    results: list[bool] = []
    lock = threading.Lock()

    def create(index: int) -> None:
        created = open_location(location.url).write_text("DONE", str(index), exclusive=True)
        with lock:
            results.append(created)

    threads = [threading.Thread(target=create, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 5 + [True]


def test_paths_cannot_leave_the_location(location: Storage) -> None:
    with pytest.raises(UsageError):
        location.read_text("../outside")


def test_child_url_and_join() -> None:
    assert join_url("gs://b/p/", "tpuctl", "run", "DONE") == "gs://b/p/tpuctl/run/DONE"
    assert join_url("gs://b", "x") == "gs://b/x"
    assert join_url("/data/ckpt", "/run/", "checkpoints") == "/data/ckpt/run/checkpoints"
    assert join_url("/", "x") == "/x"
    assert join_url("~/ckpt", "run") == "~/ckpt/run"
    assert open_location("gs://b/p").child_url("12", "commit_success.txt") == (
        "gs://b/p/12/commit_success.txt"
    )


def test_open_location_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    local = open_location("~/ckpt")
    assert isinstance(local, LocalStorage) and local.root == tmp_path / "ckpt"
    assert isinstance(open_location(f"file://{tmp_path}"), LocalStorage)
    gcs = open_location("gs://bucket/a/b/")
    assert isinstance(gcs, GcsStorage) and gcs.bucket_name == "bucket" and gcs.prefix == "a/b"
    assert gcs.url == "gs://bucket/a/b"
    for bad in ("", "gs://", "s3://bucket/x"):
        with pytest.raises(UsageError):
            open_location(bad)


def test_missing_bucket_is_not_found(gcs_bucket: str) -> None:
    missing = open_location("gs://tpuctl-no-such-bucket/x")
    with pytest.raises(NotFoundError):
        missing.list()
    with pytest.raises(NotFoundError):
        missing.read_text("y")


def test_emulator_host_without_scheme_is_accepted(
    fake_gcs: FakeGcs, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url.removeprefix("http://"))
    location = open_location(f"gs://{gcs_bucket}/p")
    assert location.write_text("x", "1")
    assert location.read_text("x") == "1"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_local_permission_denied_is_an_auth_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        with pytest.raises(AuthError):
            open_location(str(locked)).list()
    finally:
        locked.chmod(0o755)


def test_gcs_errors_map_to_tpuctl_errors() -> None:
    # fake-gcs-server grants everything, so a 403 and a credentials failure cannot happen
    # against it; the mapping is checked with the exceptions the client raises.
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    from tpuctl.storage.gcs import _gcs_errors

    cases: list[tuple[Exception, type[TpuctlError]]] = [
        (api.Forbidden("denied"), AuthError),
        (api.Unauthorized("who"), AuthError),
        (auth.DefaultCredentialsError("no ADC"), AuthError),
        (api.NotFound("gone"), NotFoundError),
        (api.ServiceUnavailable("busy"), TpuctlError),
        (ConnectionRefusedError("refused"), TpuctlError),
    ]
    for raised, expected in cases:
        with pytest.raises(expected) as caught, _gcs_errors("gs://b/p"):
            raise raised
        assert "gs://b/p" in caught.value.message
