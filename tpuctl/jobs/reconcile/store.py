"""A run's record directory: its journal, a snapshot of the folded record, the supervisor's
last step, the workers' last log lines kept at a give-up, the lease, and the run's own spec
(`run.json`: what a step needs to supervise the run without the user's files).

With checkpoint.dir it is `<checkpoint.dir>/tpuctl/<run>/`, readable and writable from any
machine (and the worker VMs keep their job's state objects there too). Without one it is this
user's state directory, so only this machine can supervise the run.

The snapshot (`state.json`) holds the record folded up to some journal entry and the names of
the last entries folded: a step lists the journal (one call) and reads only the entries it has
not folded yet, so a step costs the same on the run's first day and on its tenth. The journal
stays the truth: a missing or unreadable snapshot means folding it all again.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.clock import rfc3339
from tpuctl.errors import NotFoundError, TpuctlError
from tpuctl.jobs.reconcile import crash
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.storage.journal import Journal, JournalEntry
from tpuctl.worker import JOURNAL_DIR, LEASE_FILE, join_location, record_dir

if TYPE_CHECKING:
    from tpuctl.spec.model import Spec
    from tpuctl.storage.lease import Lease
    from tpuctl.storage.storage import Storage

SNAPSHOT = "state.json"
SUPERVISOR = "supervisor.json"
RUN_FILE = "run.json"
LOGS_DIR = "logs"
RUN_FILE_VERSION = 1
SNAPSHOT_TAIL = 256  # names of the last entries folded, kept in the snapshot
STEP_STALE_AFTER = 60.0  # a reconcile step's lease: stale one deadline after its heartbeat


def local_run_dir(project: str, zone: str, name: str) -> str:
    """Without checkpoint.dir: this user's state directory (it guards this machine only)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "tpuctl" / "runs" / project / zone / name)


@dataclass(frozen=True)
class RunFile:
    """`run.json`: the run's spec as it was read (its YAML text, before `${VAR}`s and
    overrides), the `--set` overrides, where it runs, and the names (never the values: they
    may be secrets) of the `${VAR}`s it expands, which a step that loads it again takes from
    its own environment. `options` are the supervision flags given explicitly (e.g.
    `{"keep": true}`), which a step of `tpuctl reconcile --all` keeps."""

    name: str
    run: str
    spec: str
    source: str
    project: str
    zone: str
    zones: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    variables: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RUN_FILE_VERSION,
            "name": self.name,
            "run": self.run,
            "spec": self.spec,
            "source": self.source,
            "overrides": list(self.overrides),
            "variables": list(self.variables),
            "project": self.project,
            "zone": self.zone,
            "zones": list(self.zones),
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, document: Any) -> RunFile:
        """A run.json read back; TpuctlError when it is not one (naming what is wrong)."""
        if not isinstance(document, Mapping) or document.get("version") != RUN_FILE_VERSION:
            raise TpuctlError(
                f"{RUN_FILE} is not one this tpuctl wrote (version "
                f"{document.get('version') if isinstance(document, Mapping) else None})"
            )
        try:
            text = document["spec"]
            if not isinstance(text, str):
                raise TypeError("spec")
            options = document.get("options") or {}
            return cls(
                name=str(document["name"]),
                run=str(document.get("run") or document["name"]),
                spec=text,
                source=str(document.get("source") or "<spec>"),
                project=str(document["project"]),
                zone=str(document["zone"]),
                zones=tuple(str(zone) for zone in document.get("zones") or ()),
                overrides=tuple(str(item) for item in document.get("overrides") or ()),
                variables=tuple(str(item) for item in document.get("variables") or ()),
                options=dict(options) if isinstance(options, Mapping) else {},
            )
        except (KeyError, TypeError) as error:
            raise TpuctlError(f"{RUN_FILE} lacks {error}") from None


def read_run_file(storage: Storage) -> RunFile:
    """The run.json of the record directory `storage` is (NotFoundError when there is none)."""
    text = storage.read_text(RUN_FILE)
    try:
        document = json.loads(text)
    except ValueError:
        raise TpuctlError(f"{storage.child_url(RUN_FILE)} is not JSON") from None
    return RunFile.from_dict(document)


class RunStore:
    """One run's record directory (see the module doc). `url`: where it is when it was found
    there (tpuctl reconcile --all), else from the spec; `run_file`: what `begin` writes;
    `by`: who steps (`up` or `reconcile`), said in supervisor.json."""

    def __init__(
        self,
        spec: Spec,
        project: str,
        zone: str,
        *,
        hostname: str | None = None,
        url: str | None = None,
        run_file: RunFile | None = None,
        by: str = "reconcile",
    ) -> None:
        shared = record_dir(spec)
        self.shared = shared is not None
        if url is None:
            url = shared if shared is not None else local_run_dir(project, zone, spec.name)
        self.url = url
        self._storage: Storage | None = None
        self.journal = Journal(spec, url=join_location(self.url, JOURNAL_DIR), hostname=hostname)
        self.run_file = run_file
        self.by = by

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            from tpuctl.storage.locations import open_location

            self._storage = open_location(self.url)
        return self._storage

    # ------------------------------------------------------------------------ the record

    def load(self) -> RunRecord:
        """The record folded from the snapshot and the entries written since."""
        record, tail = self._snapshot()
        names = self.journal.names()
        known = set(tail)
        oldest = tail[0] if tail else ""
        new = [
            name for name in names if name not in known and (not record.last_entry or name > oldest)
        ]
        entries = self.journal.read(new)
        record.fold(entries)
        self._tail = [*tail, *(entry.name for entry in entries)][-SNAPSHOT_TAIL:]
        self._saved_last = record.last_entry
        return record

    def _snapshot(self) -> tuple[RunRecord, list[str]]:
        try:
            document = json.loads(self.storage.read_text(SNAPSHOT))
        except (NotFoundError, ValueError, TpuctlError):
            return RunRecord(), []
        if not isinstance(document, dict):
            return RunRecord(), []
        record = RunRecord.from_dict(document.get("record") or {})
        tail = document.get("tail")
        if record is None or not isinstance(tail, list) or not record.last_entry:
            return RunRecord(), []
        return record, [str(name) for name in tail]

    def append(self, kind: str, message: str, fields: dict[str, Any]) -> JournalEntry:
        """One journal entry, now."""
        entry = self.journal.append(kind, message=message, **fields)
        self._tail = [*getattr(self, "_tail", []), entry.name][-SNAPSHOT_TAIL:]
        return entry

    def save(self, record: RunRecord) -> None:
        """The snapshot, when the record moved on since it was loaded (best effort)."""
        if record.last_entry == getattr(self, "_saved_last", None):
            return
        document = {"record": record.to_dict(), "tail": getattr(self, "_tail", [])}
        crash.point("save the snapshot")
        try:
            self.storage.write_text(SNAPSHOT, json.dumps(document, sort_keys=True) + "\n")
        except TpuctlError:
            return  # the next step folds the journal again
        self._saved_last = record.last_entry

    # ------------------------------------------------------------------------ the rest

    def begin(self) -> None:
        """The run starts (or a person's `up` takes it on): keep its spec beside its record
        (run.json), before the journal says so, so a killed step leaves nothing a later one
        could not find again."""
        if self.run_file is None:
            return
        text = json.dumps(self.run_file.to_dict(), indent=2, sort_keys=True) + "\n"
        crash.point("write the run's spec")
        self.storage.write_text(RUN_FILE, text)

    def beat(self, document: dict[str, Any]) -> None:
        """Who reconciled the run last (the host, and `by`: a person's `up` or a scheduler's
        `reconcile`), when, and what it decided (`tpuctl runs` reads it)."""
        body = {"host": socket.gethostname(), "pid": os.getpid(), "by": self.by, **document}
        crash.point("write the supervisor's heartbeat")
        try:
            self.storage.write_text(SUPERVISOR, json.dumps(body, default=_jsonable) + "\n")
        except TpuctlError:
            return

    def last_beat(self) -> dict[str, Any] | None:
        try:
            document = json.loads(self.storage.read_text(SUPERVISOR))
        except (NotFoundError, ValueError, TpuctlError):
            return None
        return document if isinstance(document, dict) else None

    def save_logs(self, tails: dict[str, str]) -> str | None:
        """Each worker's log tail as `logs/<slice>-<worker>.log`; where they went."""
        try:
            for label, text in sorted(tails.items()):
                self.storage.write_text(f"{LOGS_DIR}/{label.replace('/', '-')}.log", text)
        except TpuctlError:
            return None
        return join_location(self.url, LOGS_DIR)

    def lease(self, command: str, *, stale_after: float = STEP_STALE_AFTER) -> Lease:
        from tpuctl.storage.lease import Lease

        return Lease(self.storage, LEASE_FILE, command=command, stale_after=stale_after)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
