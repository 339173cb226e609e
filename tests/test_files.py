"""tpuctl.files: the one atomic write and the one lock that local storage and tpuctl's known
hosts share."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tpuctl.files import lock_path, locked, write_atomic


def test_a_file_is_written_whole_with_exactly_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "record.json"
    previous = os.umask(0o077)  # the mode is not left to the umask
    try:
        assert write_atomic(path, "first\n", mode=0o644)
    finally:
        os.umask(previous)
    assert path.read_text() == "first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert write_atomic(path, b"second\n", mode=0o600)
    assert path.read_bytes() == b"second\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_exclusive_creates_only_once(tmp_path: Path) -> None:
    path = tmp_path / "claim"
    assert write_atomic(path, "mine", exclusive=True)
    assert not write_atomic(path, "theirs", exclusive=True)
    assert path.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claim"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pins"
    write_atomic(path, "old")

    def refuse(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins"]


def test_read_modify_write_cycles_under_the_lock_lose_no_update(tmp_path: Path) -> None:
    """Each writer opens the lock file itself (as separate processes do): flock excludes them
    one from another, so every increment survives."""
    path = tmp_path / "counter"
    write_atomic(path, "0")
    rounds, writers = 25, 4

    def increment() -> None:
        for _ in range(rounds):
            with locked(path):
                write_atomic(path, str(int(path.read_text()) + 1))

    threads = [threading.Thread(target=increment) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert path.read_text() == str(rounds * writers)
    assert lock_path(path).exists() and lock_path(path).name == ".counter.lock"
