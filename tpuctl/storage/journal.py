"""The job's shared log: what happened to a run, kept beside its checkpoints for any machine.

Entries live under `tpuctl.worker.journal_dir(spec)` (`<checkpoint.dir>/tpuctl/<run>/journal/`),
one small JSON object each, named `<utc ns, 20 digits>-<hostname>-<seq>.json` so that a name
sort is a time sort. Objects are only ever created, never appended to: that works the same on
Cloud Storage (no appends) and on a local or shared directory, and two writers never clash
(each creation is exclusive). This is what lets `tpuctl up` keep no local state, and `status`
or `report` on any machine see the same history. Without checkpoint.dir there is nowhere shared
to write, so the journal is disabled: `append` does nothing and `entries` is empty.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import Enum
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from tpuctl.clock import from_nanoseconds, rfc3339
from tpuctl.errors import NotFoundError, UsageError, quoted
from tpuctl.worker import journal_dir

if TYPE_CHECKING:
    from tpuctl.spec.model import Spec
    from tpuctl.storage.storage import Storage

FORMAT_VERSION = 1
_KIND = re.compile(r"[a-z][a-z0-9_.-]{0,63}\Z")
_NAME = re.compile(r"(?P<ns>[0-9]{20})-(?P<host>[A-Za-z0-9.-]+)-(?P<seq>[0-9]+)\.json\Z")
_HOST_CHARS = re.compile(r"[^A-Za-z0-9.-]+")
# Per process: with the timestamp and the host, this makes every name unique (and exclusive
# creation catches the rest).
_SEQUENCE = itertools.count()
_SEQUENCE_LOCK = threading.Lock()


@dataclass(frozen=True)
class JournalEntry:
    """One thing that happened: when (UTC), what (`kind`, e.g. "qr.created"), and its facts."""

    timestamp: datetime
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    name: str = ""  # the object's name in the journal directory

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": _rfc3339(self.timestamp),
            "kind": self.kind,
            "host": self.host,
            "fields": self.fields,
        }


class Journal:
    """The journal of one spec's run; `enabled` is False without checkpoint.dir."""

    def __init__(
        self,
        spec: Spec | None,
        *,
        storage: Storage | None = None,
        hostname: str | None = None,
        url: str | None = None,
    ) -> None:
        # `url`: a journal kept elsewhere than beside the checkpoints (a run without
        # checkpoint.dir keeps its own in this user's state directory), or found without its
        # spec (tpuctl runs).
        self.url: str | None = url or (journal_dir(spec) if spec is not None else None)
        self._storage = storage
        self.host = _clean_host(hostname if hostname is not None else socket.gethostname())

    @property
    def enabled(self) -> bool:
        return self.url is not None

    @property
    def storage(self) -> Storage:
        """The journal directory (opened on first use; Cloud Storage needs its client)."""
        if self._storage is None:
            if self.url is None:
                raise UsageError(
                    "the journal needs checkpoint.dir in the spec",
                    hint="set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
                )
            from tpuctl.storage.locations import open_location

            self._storage = open_location(self.url)
        return self._storage

    def append(self, kind: str, **fields: Any) -> JournalEntry:
        """Record one entry now; returns it (not written when the journal is disabled)."""
        if not _KIND.match(kind):
            raise UsageError(
                f"{quoted(kind)} is not a journal entry kind",
                hint="lowercase letters, digits, '.', '_' and '-', e.g. qr.created",
            )
        payload = json.loads(json.dumps(fields, default=_jsonable))  # plain JSON values only
        while True:
            nanoseconds = time.time_ns()
            with _SEQUENCE_LOCK:
                sequence = next(_SEQUENCE)
            name = f"{nanoseconds:020d}-{self.host}-{sequence:06d}.json"
            entry = JournalEntry(from_nanoseconds(nanoseconds), kind, payload, self.host, name)
            if not self.enabled:
                return entry
            document = {"version": FORMAT_VERSION, **entry.to_dict()}
            text = json.dumps(document, sort_keys=True, ensure_ascii=False) + "\n"
            if self.storage.write_text(name, text, exclusive=True):
                return entry

    def entries(self, *, kind: str | None = None) -> list[JournalEntry]:
        """Every readable entry, oldest first (by the time in its name, then host and seq)."""
        found = [entry for entry in self._read_all(self.names()) if kind in (None, entry.kind)]
        return sorted(found, key=lambda entry: entry.name)

    def names(self) -> list[str]:
        """The names of every entry, oldest first, without reading them (one listing)."""
        if not self.enabled:
            return []
        try:
            listing = self.storage.list()
        except NotFoundError:  # nothing written yet (or no bucket): an empty history
            return []
        # A writer's temporary file, or something that is not ours, is no entry.
        return sorted(item.name for item in listing if not item.is_dir and _NAME.match(item.name))

    def read(self, names: list[str]) -> list[JournalEntry]:
        """The entries of `names` that can be read, oldest first."""
        return sorted(self._read_all(names), key=lambda entry: entry.name)

    def _read_all(self, names: list[str]) -> list[JournalEntry]:
        found: list[JournalEntry] = []
        for name in names:
            match = _NAME.match(name)
            if match is None:
                continue
            entry = self._read(name, int(match.group("ns")), match.group("host"))
            if entry is not None:
                found.append(entry)
        return found

    def _read(self, name: str, nanoseconds: int, host: str) -> JournalEntry | None:
        try:
            document = json.loads(self.storage.read_text(name))
        except (NotFoundError, ValueError):
            return None  # deleted meanwhile, or not JSON: skip it rather than fail the reader
        if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
            return None
        fields = document.get("fields")
        return JournalEntry(
            timestamp=from_nanoseconds(nanoseconds),
            kind=document["kind"],
            fields=fields if isinstance(fields, dict) else {},
            host=str(document.get("host") or host),
            name=name,
        )


def _clean_host(hostname: str) -> str:
    cleaned = _HOST_CHARS.sub("-", hostname).strip("-.")[:63]
    return cleaned or "unknown"


def _rfc3339(moment: datetime) -> str:
    return rfc3339(moment, "microseconds")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return _rfc3339(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, PurePath):
        return str(value)
    raise UsageError(f"journal fields must be JSON values, not {type(value).__name__}")
