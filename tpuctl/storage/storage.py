"""One small interface over a checkpoint location: a local directory or `gs://bucket/prefix`.

Paths given to a `Storage` are relative to its root and use `/` (`"12/commit_success.txt"`);
`""` is the root itself. Cloud Storage has no directories, only object names: a "directory" is
a prefix that some object starts with, so it has no time of its own and an empty one does not
exist. Cloud Storage lives in tpuctl.storage.gcs, imported only when a `gs://` location opens
(tpuctl.storage.locations).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from tpuctl.errors import AuthError, NotFoundError, TpuctlError, UsageError, quoted
from tpuctl.files import locked, write_atomic
from tpuctl.worker import join_location

StorageKind = Literal["local", "gcs"]
Paths = list[str]  # (a class with a `list` method cannot say list[str] in its body)


@dataclass(frozen=True)
class Entry:
    """One child of a directory. `modified` is UTC; None for a Cloud Storage prefix."""

    name: str
    is_dir: bool
    modified: datetime | None = None
    size: int | None = None


class Storage(ABC):
    """A checkpoint location. Every method raises tpuctl errors, never a backend's own."""

    kind: StorageKind
    url: str

    def child_url(self, *parts: str) -> str:
        """The URL (or local path) of a path under this location."""
        return join_location(self.url, *parts)

    @abstractmethod
    def list(self, path: str = "") -> list[Entry]:
        """The children of a directory, sorted by name. NotFoundError if it does not exist."""

    @abstractmethod
    def find(self, name: str, path: str = "") -> Paths:
        """Every file called `name` at any depth under a directory, as paths relative to this
        location, sorted; [] when the directory does not exist. One listing on Cloud Storage
        (by prefix, without a delimiter, the name matched by the service)."""

    @abstractmethod
    def exists(self, path: str = "") -> bool:
        """Whether a file or a (non-empty, on Cloud Storage) directory is there."""

    @abstractmethod
    def is_dir(self, path: str = "") -> bool: ...

    @abstractmethod
    def stat(self, path: str) -> Entry | None:
        """The file at `path`, or None if there is none."""

    @abstractmethod
    def read_text(self, path: str) -> str:
        """A file's text (UTF-8). NotFoundError if it does not exist."""

    @abstractmethod
    def write_text(self, path: str, text: str, *, exclusive: bool = False) -> bool:
        """Write a file whole, never leaving half of it for a reader; parents are created.

        With `exclusive`, the file is created only if it does not exist yet (atomically: a
        hard link on a local disk, `ifGenerationMatch=0` on Cloud Storage); returns False when
        it was already there. Otherwise it replaces the file and returns True.
        """

    @abstractmethod
    def delete(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, or with `recursive` a directory and everything under it.

        Removing what is not there is not an error.
        """

    # Compare-and-swap on one small file (a lease): `version` names one write of it.

    @abstractmethod
    def read_versioned(self, path: str) -> tuple[str, str] | None:
        """(text, version) of a file, or None when there is none."""

    @abstractmethod
    def replace_if(self, path: str, version: str, text: str) -> bool:
        """Replace the file with `text` only if it is still at `version`; False otherwise."""

    @abstractmethod
    def delete_if(self, path: str, version: str) -> bool:
        """Remove the file only if it is still at `version`; False otherwise."""

    @abstractmethod
    def newest_modified(self, path: str = "") -> datetime | None:
        """The newest modification time of anything under a directory (None if it is empty)."""


def relative_path(path: str) -> str:
    """A normalised relative path; `..` could step outside the location, so it is refused."""
    clean = posixpath.normpath(path.strip("/")) if path.strip("/") else ""
    if clean == ".":
        return ""
    if clean == ".." or clean.startswith("../"):
        raise UsageError(f"path {quoted(path)} leaves the checkpoint location")
    return clean


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)


# --------------------------------------------------------------------------------------------
# A local directory.


class LocalStorage(Storage):
    kind: StorageKind = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def _path(self, path: str) -> Path:
        relative = relative_path(path)
        return self.root / relative if relative else self.root

    @contextlib.contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        where = str(self._path(path))
        try:
            yield
        except FileNotFoundError:
            raise NotFoundError(f"{where} does not exist", path=where) from None
        except NotADirectoryError:
            raise NotFoundError(f"{where} is not a directory", path=where) from None
        except IsADirectoryError:
            raise UsageError(f"{where} is a directory, not a file", path=where) from None
        except PermissionError as exc:
            raise AuthError(
                f"permission denied: {exc.filename or where}",
                hint="check the permissions of the directory",
                path=where,
            ) from None
        except OSError as exc:
            raise TpuctlError(f"{where}: {exc.strerror or exc}", path=where) from None

    def list(self, path: str = "") -> list[Entry]:
        entries: list[Entry] = []
        with self._errors(path), os.scandir(self._path(path)) as scan:
            for item in scan:
                try:
                    info = item.stat()
                except FileNotFoundError:  # removed while we looked (Orbax pruning)
                    continue
                is_dir = item.is_dir()
                entries.append(
                    Entry(item.name, is_dir, _utc(info.st_mtime), None if is_dir else info.st_size)
                )
        return sorted(entries, key=lambda entry: entry.name)

    def find(self, name: str, path: str = "") -> Paths:
        found: Paths = []
        top = self._path(path)
        for directory, subdirectories, files in os.walk(top):
            subdirectories.sort()
            if name in files:
                relative = Path(directory, name).relative_to(self.root)
                found.append(relative.as_posix())
        return sorted(found)

    def exists(self, path: str = "") -> bool:
        with self._errors(path):
            return self._path(path).exists()

    def is_dir(self, path: str = "") -> bool:
        with self._errors(path):
            return self._path(path).is_dir()

    def stat(self, path: str) -> Entry | None:
        target = self._path(path)
        try:
            info = target.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if target.is_dir():
            return None
        return Entry(target.name, False, _utc(info.st_mtime), info.st_size)

    def read_text(self, path: str) -> str:
        with self._errors(path):
            return self._path(path).read_text(encoding="utf-8")

    def write_text(self, path: str, text: str, *, exclusive: bool = False) -> bool:
        with self._errors(path):
            # 0644: mkstemp's 0600 would hide it from other users.
            return write_atomic(self._path(path), text, mode=0o644, exclusive=exclusive)

    def delete(self, path: str, *, recursive: bool = False) -> None:
        target = self._path(path)
        with self._errors(path):
            if target.is_dir() and not target.is_symlink():
                if recursive:
                    shutil.rmtree(target, ignore_errors=False)
                else:
                    target.rmdir()
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()

    def _version(self, target: Path) -> str | None:
        try:
            info = target.stat()
        except FileNotFoundError:
            return None
        return f"{info.st_ino}-{info.st_mtime_ns}-{info.st_size}"

    @contextlib.contextmanager
    def _swap_lock(self, target: Path) -> Iterator[None]:
        """Compare-and-swaps on one file exclude one another (an flock beside it)."""
        with locked(target, mode=0o644):
            yield

    def read_versioned(self, path: str) -> tuple[str, str] | None:
        target = self._path(path)
        with self._errors(path), self._swap_lock(target):
            version = self._version(target)
            if version is None:
                return None
            return target.read_text(encoding="utf-8"), version

    def replace_if(self, path: str, version: str, text: str) -> bool:
        target = self._path(path)
        with self._errors(path), self._swap_lock(target):
            if self._version(target) != version:
                return False
            return self.write_text(path, text)

    def delete_if(self, path: str, version: str) -> bool:
        target = self._path(path)
        with self._errors(path), self._swap_lock(target):
            if self._version(target) != version:
                return False
            target.unlink()
            return True

    def newest_modified(self, path: str = "") -> datetime | None:
        newest: float | None = None
        with self._errors(path):
            for directory, _, files in os.walk(self._path(path)):
                for name in [".", *files]:
                    try:
                        mtime = os.stat(os.path.join(directory, name)).st_mtime
                    except FileNotFoundError:
                        continue
                    newest = mtime if newest is None else max(newest, mtime)
        return None if newest is None else _utc(newest)
