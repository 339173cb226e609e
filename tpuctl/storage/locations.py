"""A storage location opened by its URL: a local directory (`~` expanded, `file://` accepted)
or a Cloud Storage prefix (`gs://bucket/prefix`, its client imported only then)."""

from __future__ import annotations

from pathlib import Path

from tpuctl.errors import UsageError, quoted
from tpuctl.storage.storage import LocalStorage, Storage


def open_location(url: str) -> Storage:
    """A `Storage` for a local path (`~` expanded, `file://` accepted) or `gs://bucket/prefix`."""
    text = url.strip()
    if not text:
        raise UsageError("an empty path is not a checkpoint location")
    if text.startswith("gs://"):
        bucket, _, prefix = text[len("gs://") :].partition("/")
        if not bucket:
            raise UsageError(f"{quoted(url)} names no bucket", hint="write gs://BUCKET/PATH")
        from tpuctl.storage.gcs import GcsStorage

        return GcsStorage(bucket, prefix.strip("/"))
    if "://" in text and not text.startswith("file://"):
        scheme = text.split("://", 1)[0]
        raise UsageError(
            f"{scheme}:// locations are not supported", hint="use a local path or gs://BUCKET/PATH"
        )
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStorage(Path(text).expanduser())
