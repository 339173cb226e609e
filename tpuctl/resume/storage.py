"""One small interface over a checkpoint location: a local directory or `gs://bucket/prefix`.

Paths given to a `Storage` are relative to its root and use `/` (`"12/commit_success.txt"`);
`""` is the root itself. Cloud Storage has no directories, only object names: a "directory" is
a prefix that some object starts with, so it has no time of its own and an empty one does not
exist. google-cloud-storage is imported only when a `gs://` location is opened.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tpuctl.errors import AuthError, NotFoundError, TpuctlError, UsageError

if TYPE_CHECKING:
    from google.cloud.storage import Bucket, Client

StorageKind = Literal["local", "gcs"]

# The project placeholder sent to an emulator, which ignores it; a real project is never needed
# for reading and writing objects.
EMULATOR_PROJECT = "tpuctl-emulator"


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
        return join_url(self.url, *parts)

    @abstractmethod
    def list(self, path: str = "") -> list[Entry]:
        """The children of a directory, sorted by name. NotFoundError if it does not exist."""

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

    @abstractmethod
    def newest_modified(self, path: str = "") -> datetime | None:
        """The newest modification time of anything under a directory (None if it is empty)."""


def open_location(url: str) -> Storage:
    """A `Storage` for a local path (`~` expanded, `file://` accepted) or `gs://bucket/prefix`."""
    text = url.strip()
    if not text:
        raise UsageError("an empty path is not a checkpoint location")
    if text.startswith("gs://"):
        bucket, _, prefix = text[len("gs://") :].partition("/")
        if not bucket:
            raise UsageError(f"{url!r} names no bucket", hint="write gs://BUCKET/PATH")
        return GcsStorage(bucket, prefix.strip("/"))
    if "://" in text and not text.startswith("file://"):
        scheme = text.split("://", 1)[0]
        raise UsageError(
            f"{scheme}:// locations are not supported", hint="use a local path or gs://BUCKET/PATH"
        )
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStorage(Path(text).expanduser())


def join_url(base: str, *parts: str) -> str:
    """`base/part/…` for a local path or a gs:// URL, without doubled or trailing slashes."""
    pieces = [part.strip("/") for part in parts if part.strip("/")]
    if not pieces:
        return base
    stripped = base.rstrip("/")
    if not stripped:  # the base was "/" itself
        stripped = "" if base.startswith("/") else base
    return "/".join([stripped, *pieces])


def _relative(path: str) -> str:
    """A normalised relative path; `..` could step outside the location, so it is refused."""
    clean = posixpath.normpath(path.strip("/")) if path.strip("/") else ""
    if clean == ".":
        return ""
    if clean == ".." or clean.startswith("../"):
        raise UsageError(f"path {path!r} leaves the checkpoint location")
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
        relative = _relative(path)
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
        target = self._path(path)
        with self._errors(path):
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from other users
                with os.fdopen(handle, "w", encoding="utf-8") as stream:
                    stream.write(text)
                    stream.flush()
                    os.fsync(stream.fileno())
                if not exclusive:
                    os.replace(temporary, target)
                    return True
                try:
                    os.link(temporary, target)  # fails if the target exists, unlike rename
                except FileExistsError:
                    return False
                return True
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)

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


# --------------------------------------------------------------------------------------------
# Cloud Storage.


def storage_client() -> Client:
    """A google-cloud-storage client: the emulator at STORAGE_EMULATOR_HOST, else ADC.

    With an emulator, credentials are anonymous and the project a placeholder, so nothing ever
    asks Google for a token.
    """
    try:
        from google.cloud import storage
    except ImportError as exc:  # pragma: no cover - a runtime dependency
        raise TpuctlError(
            "gs:// locations need google-cloud-storage", hint="pip install google-cloud-storage"
        ) from exc
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        endpoint = emulator if "://" in emulator else f"http://{emulator}"
        return storage.Client(
            project=EMULATOR_PROJECT,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint},
        )
    with _gcs_errors("gs://"):
        return storage.Client()


@contextlib.contextmanager
def _gcs_errors(where: str) -> Iterator[None]:
    """google-cloud-storage and google-auth exceptions → tpuctl errors naming the location."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    try:
        yield
    except api.NotFound as exc:
        raise NotFoundError(f"{where} does not exist: {_reason(exc)}", path=where) from None
    except (api.Forbidden, api.Unauthorized) as exc:
        raise AuthError(
            f"no permission for {where}: {_reason(exc)}",
            hint="check the account's roles on the bucket (roles/storage.objectAdmin)",
            path=where,
        ) from None
    except (auth.DefaultCredentialsError, auth.RefreshError) as exc:
        raise AuthError(
            f"no usable Google credentials for {where}: {exc}",
            hint="run 'gcloud auth application-default login' or set "
            "GOOGLE_APPLICATION_CREDENTIALS",
            path=where,
        ) from None
    except api.GoogleAPICallError as exc:
        raise TpuctlError(f"Cloud Storage error for {where}: {_reason(exc)}", path=where) from None
    except OSError as exc:  # requests' connection errors are OSErrors
        raise TpuctlError(f"cannot reach Cloud Storage for {where}: {exc}", path=where) from None


def _reason(exc: Any) -> str:
    return str(getattr(exc, "message", None) or exc)


class GcsStorage(Storage):
    kind: StorageKind = "gcs"

    def __init__(self, bucket: str, prefix: str, client: Client | None = None) -> None:
        self.bucket_name = bucket
        self.prefix = prefix
        self.url = f"gs://{bucket}/{prefix}" if prefix else f"gs://{bucket}"
        self._client = client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = storage_client()
        return self._client

    @property
    def bucket(self) -> Bucket:
        return self.client.bucket(self.bucket_name)

    def _name(self, path: str) -> str:
        """The object name (no trailing slash) of a path under the location."""
        return "/".join(part for part in (self.prefix, _relative(path)) if part)

    def _dir_prefix(self, path: str) -> str:
        name = self._name(path)
        return f"{name}/" if name else ""

    def list(self, path: str = "") -> list[Entry]:
        prefix = self._dir_prefix(path)
        where = self.child_url(path)
        entries: dict[str, Entry] = {}
        with _gcs_errors(where):
            pages = self.client.list_blobs(self.bucket_name, prefix=prefix, delimiter="/")
            for blob in pages:
                name = blob.name[len(prefix) :]
                if not name:  # a "folder" placeholder object, as the console creates
                    continue
                entries[name] = Entry(name, False, blob.updated, blob.size)
            for sub in pages.prefixes:
                name = sub[len(prefix) :].rstrip("/")
                entries[name] = Entry(name, True)
        if not entries and prefix and not self._placeholder_exists(prefix, where):
            raise NotFoundError(f"{where} does not exist", path=where)
        return [entries[name] for name in sorted(entries)]

    def _placeholder_exists(self, prefix: str, where: str) -> bool:
        with _gcs_errors(where):
            return bool(self.bucket.blob(prefix).exists())

    def exists(self, path: str = "") -> bool:
        return self.stat(path) is not None or self.is_dir(path)

    def is_dir(self, path: str = "") -> bool:
        prefix = self._dir_prefix(path)
        where = self.child_url(path)
        with _gcs_errors(where):
            blobs = list(self.client.list_blobs(self.bucket_name, prefix=prefix, max_results=1))
        # With no prefix this is the bucket, which exists: list_blobs raised NotFound otherwise.
        return bool(blobs) or not prefix

    def stat(self, path: str) -> Entry | None:
        name = self._name(path)
        if not name:
            return None
        with _gcs_errors(self.child_url(path)):
            blob = self.bucket.get_blob(name)  # None for a missing object (or bucket)
        if blob is None:
            return None
        return Entry(posixpath.basename(name), False, blob.updated, blob.size)

    def read_text(self, path: str) -> str:
        where = self.child_url(path)
        with _gcs_errors(where):
            data: bytes = self.bucket.blob(self._name(path)).download_as_bytes()
        return data.decode("utf-8")

    def write_text(self, path: str, text: str, *, exclusive: bool = False) -> bool:
        from google.api_core import exceptions as api

        blob = self.bucket.blob(self._name(path))
        with _gcs_errors(self.child_url(path)):
            try:
                blob.upload_from_string(
                    text.encode("utf-8"),
                    content_type="text/plain; charset=utf-8",
                    if_generation_match=0 if exclusive else None,
                )
            except api.PreconditionFailed:  # someone created it first
                return False
        return True

    def delete(self, path: str, *, recursive: bool = False) -> None:
        where = self.child_url(path)
        with _gcs_errors(where):
            if recursive:
                prefix = self._dir_prefix(path)
                for blob in self.client.list_blobs(self.bucket_name, prefix=prefix):
                    self._delete_blob(blob.name)
            name = self._name(path)
            if name:
                self._delete_blob(name)

    def _delete_blob(self, name: str) -> None:
        from google.api_core import exceptions as api

        with contextlib.suppress(api.NotFound):
            self.bucket.blob(name).delete()

    def newest_modified(self, path: str = "") -> datetime | None:
        prefix = self._dir_prefix(path)
        newest: datetime | None = None
        with _gcs_errors(self.child_url(path)):
            for blob in self.client.list_blobs(self.bucket_name, prefix=prefix):
                updated: datetime | None = blob.updated
                if updated is not None and (newest is None or updated > newest):
                    newest = updated
        return newest
