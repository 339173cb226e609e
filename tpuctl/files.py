"""Local files written safely: whole or not at all (a temporary file renamed into place), and
read-modify-write cycles kept apart between processes by an flock on a lock file beside them.

The one implementation for every local file tpuctl rewrites: checkpoint-side records on a local
disk (tpuctl.storage) and tpuctl's known hosts (tpuctl.fanout.known_hosts).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def lock_path(path: Path) -> Path:
    """The lock file that guards `path`: `.NAME.lock` beside it. A lock on `path` itself
    would not do: it is replaced by rename, and the next process would lock the new file."""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path: Path, *, mode: int = 0o600) -> Iterator[None]:
    """Hold an exclusive flock on `path`'s lock file (created with `mode`) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_atomic(
    path: Path, data: str | bytes, *, mode: int = 0o644, exclusive: bool = False
) -> bool:
    """Write `path` whole: a reader sees the old file or the new one, never half of one; a
    crash leaves no partial file. The data and then the directory entry are fsynced.

    `mode` is set exactly (not through the umask). With `exclusive` the file is created only
    if there is none yet (a hard link, which fails where a rename would replace): False when
    one was already there. Otherwise it replaces the file and returns True.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
        else:
            os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _sync_directory(path.parent)
    return True


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
