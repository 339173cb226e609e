"""Helpers for resume tests: the fake-gcs-server handle and checkpoint-layout writers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.cloud.storage import Client


@dataclass(frozen=True)
class FakeGcs:
    """A running fake-gcs-server; `url` is what STORAGE_EMULATOR_HOST should hold."""

    url: str
    log: Path

    def client(self) -> Client:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )


# ------------------------------------------------------------------------------ layouts


class LocalLayout:
    """Writes a checkpoint layout on disk; `mtime` sets a folder's or file's time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        root.mkdir(parents=True, exist_ok=True)

    def put(self, path: str, text: str = "x", mtime: float | None = None) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        if mtime is not None:
            os.utime(target, (mtime, mtime))
            os.utime(target.parent, (mtime, mtime))

    def folder(self, path: str, mtime: float | None = None) -> None:
        target = self.root / path
        target.mkdir(parents=True, exist_ok=True)
        if mtime is not None:
            os.utime(target, (mtime, mtime))


class GcsLayout:
    """Writes the same layouts as objects through the official client (no folders on GCS)."""

    def __init__(self, client: Client, bucket: str, prefix: str) -> None:
        self.bucket = client.bucket(bucket)
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"

    def put(self, path: str, text: str = "x", mtime: float | None = None) -> None:
        name = f"{self.prefix}/{path}" if self.prefix else path
        self.bucket.blob(name).upload_from_string(text)

    def folder(self, path: str, mtime: float | None = None) -> None:
        self.put(f"{path}/placeholder")


def metadata_json(init_ns: int | None, commit_ns: int | None) -> str:
    data: dict[str, Any] = {
        "item_handlers": {"default": "StandardCheckpointHandler"},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": init_ns,
        "commit_timestamp_nsecs": commit_ns,
        "custom_metadata": {},
    }
    return json.dumps(data)
