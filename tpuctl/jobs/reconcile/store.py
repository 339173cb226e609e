"""A run's record directory: its journal, a snapshot of the folded record, the supervisor's
last step, the workers' last log lines kept at a give-up, and the lease.

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
LOGS_DIR = "logs"
SNAPSHOT_TAIL = 256  # names of the last entries folded, kept in the snapshot
STEP_STALE_AFTER = 60.0  # a reconcile step's lease: stale one deadline after its heartbeat


def local_run_dir(project: str, zone: str, name: str) -> str:
    """Without checkpoint.dir: this user's state directory (it guards this machine only)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "tpuctl" / "runs" / project / zone / name)


class RunStore:
    """One run's record directory (see the module doc)."""

    def __init__(
        self,
        spec: Spec,
        project: str,
        zone: str,
        *,
        hostname: str | None = None,
    ) -> None:
        shared = record_dir(spec)
        self.shared = shared is not None
        self.url = shared if shared is not None else local_run_dir(project, zone, spec.name)
        self._storage: Storage | None = None
        self.journal = Journal(spec, url=join_location(self.url, JOURNAL_DIR), hostname=hostname)

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

    def beat(self, document: dict[str, Any]) -> None:
        """Who reconciled the run last, when, and what it decided (`tpuctl runs` reads it)."""
        body = {"host": socket.gethostname(), "pid": os.getpid(), **document}
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
