"""Cloud Storage as a `Storage`: google-cloud-storage, imported only when a gs:// path opens."""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuctl.errors import AuthError, NotFoundError, TpuctlError
from tpuctl.storage.storage import Entry, Paths, Storage, StorageKind, relative_path

if TYPE_CHECKING:
    from google.cloud.storage import Bucket, Client

# The project placeholder sent to an emulator, which ignores it; a real project is never needed
# for reading and writing objects.
EMULATOR_PROJECT = "tpuctl-emulator"


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


def bucket_metadata(name: str) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(location, location type, data locations of a configurable dual-region) of a bucket;
    needs storage.buckets.get on it."""
    where = f"gs://{name}"
    client = storage_client()
    with _gcs_errors(where):
        bucket = client.get_bucket(name)
    placement = getattr(bucket, "data_locations", None) or ()
    return bucket.location, bucket.location_type, tuple(str(place) for place in placement)


# What a job's checkpoints need of their bucket: write, read back, list steps, drop old ones.
CHECKPOINT_PERMISSIONS = (
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
)


def missing_permissions(
    name: str,
    credentials: Any,
    *,
    project: str | None = None,
    permissions: tuple[str, ...] = CHECKPOINT_PERMISSIONS,
) -> list[str]:
    """The `permissions` on bucket `name` that `credentials` do not hold (testIamPermissions,
    which answers for the caller: pass the VMs' service account's credentials). With
    STORAGE_EMULATOR_HOST the emulator is asked, anonymously."""
    from google.cloud import storage

    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    client = (
        storage_client()
        if emulator
        else storage.Client(project=project or EMULATOR_PROJECT, credentials=credentials)
    )
    where = f"gs://{name}"
    with _gcs_errors(where):
        granted = set(client.bucket(name).test_iam_permissions(list(permissions)))
    return [permission for permission in permissions if permission not in granted]


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
        return "/".join(part for part in (self.prefix, relative_path(path)) if part)

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

    def find(self, name: str, path: str = "") -> Paths:
        prefix = self._dir_prefix(path)
        own = f"{self.prefix}/" if self.prefix else ""
        found: Paths = []
        with _gcs_errors(self.child_url(path)):
            # No delimiter: every object under the prefix, in one listing; the glob lets the
            # service send only the names that end so (checkpoints hold many objects).
            for blob in self.client.list_blobs(
                self.bucket_name, prefix=prefix or None, match_glob=f"**{name}"
            ):
                if posixpath.basename(blob.name) == name and blob.name.startswith(own):
                    found.append(blob.name[len(own) :])
        return sorted(found)

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

    def read_versioned(self, path: str) -> tuple[str, str] | None:
        from google.api_core import exceptions as api

        name = self._name(path)
        with _gcs_errors(self.child_url(path)):
            blob = self.bucket.get_blob(name)
            if blob is None:
                return None
            try:
                data: bytes = blob.download_as_bytes(if_generation_match=blob.generation)
            except (api.PreconditionFailed, api.NotFound):  # replaced or gone meanwhile
                return self.read_versioned(path)
        return data.decode("utf-8"), str(blob.generation)

    def replace_if(self, path: str, version: str, text: str) -> bool:
        from google.api_core import exceptions as api

        blob = self.bucket.blob(self._name(path))
        with _gcs_errors(self.child_url(path)):
            try:
                blob.upload_from_string(
                    text.encode("utf-8"),
                    content_type="text/plain; charset=utf-8",
                    if_generation_match=int(version),
                )
            except (api.PreconditionFailed, api.NotFound):
                return False
        return True

    def delete_if(self, path: str, version: str) -> bool:
        from google.api_core import exceptions as api

        blob = self.bucket.blob(self._name(path))
        with _gcs_errors(self.child_url(path)):
            try:
                blob.delete(if_generation_match=int(version))
            except (api.PreconditionFailed, api.NotFound):
                return False
        return True

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
