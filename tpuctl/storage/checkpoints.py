"""Reading an Orbax checkpoint directory, and the job-level paths tpuctl keeps beside it.

The layout (see shared/reference/checkpoints.md): one child per step, named `N`, `<prefix>_N`
or zero-padded; a step is complete when `N/commit_success.txt` exists. On Cloud Storage Orbax
writes straight into `N/` and adds that file last, so without it the save is unfinished. On a
local disk Orbax writes `N.orbax-checkpoint-tmp[-…]` and renames it when done, so any non-tmp
folder is complete, with or without the file (Orbax before 0.12.3 did not write it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from tpuctl.clock import rfc3339
from tpuctl.envelope import Result
from tpuctl.errors import NotFoundError, SourceLocation, SpecError
from tpuctl.spec.model import Spec
from tpuctl.storage.locations import open_location
from tpuctl.storage.storage import Entry, Storage, StorageKind
from tpuctl.worker import DONE_FILE, checkpoint_root, record_dir

COMMIT_FILE = "commit_success.txt"
METADATA_FILE = "_CHECKPOINT_METADATA"
TMP_MARKER = ".orbax-checkpoint-tmp"

_STEP_NAME = re.compile(r"(?:(?P<prefix>.+)_)?(?P<digits>[0-9]+)")
# `N.orbax-checkpoint-tmp`, or with the `-<timestamp>` / `-<counter>` of older Orbax versions.
_TMP_NAME = re.compile(r"(?P<base>.+?)" + re.escape(TMP_MARKER) + r"(?:-(?P<suffix>.+))?")


@dataclass(frozen=True)
class StepFolder:
    """One step's folder. `committed_at` is the metadata's commit time, else the commit file's."""

    step: int
    name: str
    complete: bool
    has_commit_file: bool
    prefix: str | None = None
    started_at: datetime | None = None
    committed_at: datetime | None = None
    save_seconds: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "name": self.name,
            "complete": self.complete,
            "has_commit_file": self.has_commit_file,
            "prefix": self.prefix,
            "started_at": _rfc3339(self.started_at),
            "committed_at": _rfc3339(self.committed_at),
            "save_seconds": self.save_seconds,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class TmpFolder:
    """A save that never reached its rename. Stale ones are older than the newest commit."""

    step: int
    name: str
    modified_at: datetime | None
    stale: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "name": self.name,
            "modified_at": _rfc3339(self.modified_at),
            "stale": self.stale,
        }


@dataclass(frozen=True)
class CheckpointReport(Result):
    """What a checkpoint directory holds, as a resuming framework would see it."""

    KIND: ClassVar[str] = "Checkpoints"
    url: str
    storage: StorageKind
    inspected_at: datetime
    steps: tuple[StepFolder, ...] = ()  # every step folder, complete or not, by step
    tmp_folders: tuple[TmpFolder, ...] = ()
    ignored: tuple[str, ...] = ()  # children that are not step or tmp folders
    latest_step: int | None = None  # the highest complete step: where a restart resumes
    latest_committed_at: datetime | None = None
    unfinished_steps: tuple[int, ...] = ()

    @property
    def complete_steps(self) -> tuple[int, ...]:
        return tuple(sorted({folder.step for folder in self.steps if folder.complete}))

    @property
    def stale_tmp_folders(self) -> tuple[TmpFolder, ...]:
        return tuple(folder for folder in self.tmp_folders if folder.stale)

    @property
    def latest_age_seconds(self) -> float | None:
        if self.latest_committed_at is None:
            return None
        return (self.inspected_at - self.latest_committed_at).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape of `tpuctl checkpoints --format json`."""
        return {
            "url": self.url,
            "storage": self.storage,
            "inspected_at": _rfc3339(self.inspected_at),
            "latest_step": self.latest_step,
            "latest_committed_at": _rfc3339(self.latest_committed_at),
            "latest_age_seconds": self.latest_age_seconds,
            "complete_steps": list(self.complete_steps),
            "unfinished_steps": list(self.unfinished_steps),
            "stale_tmp_folders": [folder.name for folder in self.stale_tmp_folders],
            "steps": [folder.to_dict() for folder in self.steps],
            "tmp_folders": [folder.to_dict() for folder in self.tmp_folders],
            "ignored": list(self.ignored),
        }


def inspect_checkpoints(url: str, *, now: datetime | None = None) -> CheckpointReport:
    """Read the checkpoint directory at `url` (a local path or gs://bucket/prefix).

    Raises NotFoundError (exit 5) when the directory or bucket does not exist, AuthError when
    it cannot be read.
    """
    storage = open_location(url)
    inspected_at = now or datetime.now(timezone.utc)
    if not storage.is_dir():
        if storage.exists():
            raise NotFoundError(f"{storage.url} is a file, not a checkpoint directory")
        raise NotFoundError(
            f"checkpoint directory {storage.url} does not exist",
            hint="no checkpoint was saved there yet, or the path is wrong",
            path=storage.url,
        )
    steps: list[StepFolder] = []
    tmp_entries: list[tuple[int, Entry]] = []
    ignored: list[str] = []
    for entry in storage.list():
        tmp = _TMP_NAME.fullmatch(entry.name)
        base = _STEP_NAME.fullmatch(tmp.group("base") if tmp else entry.name)
        if not entry.is_dir or base is None:
            ignored.append(entry.name)
        elif tmp is not None:
            tmp_entries.append((int(base.group("digits")), entry))
        else:
            steps.append(
                _read_step(storage, entry, int(base.group("digits")), base.group("prefix"))
            )
    steps.sort(key=lambda folder: (folder.step, folder.name))
    complete = [folder for folder in steps if folder.complete]
    latest = complete[-1] if complete else None
    commits = [folder.committed_at for folder in complete if folder.committed_at is not None]
    newest_commit = max(commits) if commits else None
    tmp_folders = [
        _tmp_folder(storage, step, entry, latest.step if latest else None, newest_commit)
        for step, entry in sorted(tmp_entries, key=lambda item: (item[0], item[1].name))
    ]
    return CheckpointReport(
        url=storage.url,
        storage=storage.kind,
        inspected_at=inspected_at,
        steps=tuple(steps),
        tmp_folders=tuple(tmp_folders),
        ignored=tuple(ignored),
        latest_step=latest.step if latest else None,
        latest_committed_at=latest.committed_at if latest else None,
        unfinished_steps=tuple(folder.step for folder in steps if not folder.complete),
    )


def _read_step(storage: Storage, entry: Entry, step: int, prefix: str | None) -> StepFolder:
    children = {child.name: child for child in storage.list(entry.name)}
    commit = children.get(COMMIT_FILE)
    notes: list[str] = []
    started_at = committed_at = None
    save_seconds = None
    if METADATA_FILE in children:
        init_ns, commit_ns = _metadata_times(storage, f"{entry.name}/{METADATA_FILE}")
        if init_ns is None and commit_ns is None:
            notes.append(f"unreadable {METADATA_FILE}")
        started_at = _from_nanoseconds(init_ns)
        committed_at = _from_nanoseconds(commit_ns)
        if init_ns is not None and commit_ns is not None:
            save_seconds = (commit_ns - init_ns) / 1e9
    if commit is not None:
        complete = True
        committed_at = committed_at or commit.modified
    elif storage.kind == "local":
        # Renamed from its tmp name, so finished; Orbax before 0.12.3 wrote no commit file.
        complete = True
        notes.append(f"no {COMMIT_FILE} (saved before Orbax 0.12.3?)")
        committed_at = committed_at or entry.modified
        if not children:
            notes.append("empty folder")
    else:
        complete = False
        notes.append(f"no {COMMIT_FILE}: save in progress or abandoned")
    return StepFolder(
        step=step,
        name=entry.name,
        complete=complete,
        has_commit_file=commit is not None,
        prefix=prefix,
        started_at=started_at,
        committed_at=committed_at,
        save_seconds=save_seconds,
        notes=tuple(notes),
    )


def _metadata_times(storage: Storage, path: str) -> tuple[int | None, int | None]:
    """`init_timestamp_nsecs` and `commit_timestamp_nsecs` (null while a save is unfinished)."""
    try:
        data = json.loads(storage.read_text(path))
    except (ValueError, NotFoundError):  # half-written, or pruned while we looked
        return None, None
    if not isinstance(data, dict):
        return None, None
    return _nanoseconds(data.get("init_timestamp_nsecs")), _nanoseconds(
        data.get("commit_timestamp_nsecs")
    )


def _nanoseconds(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _from_nanoseconds(value: int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value / 1e9, tz=timezone.utc)


def _tmp_folder(
    storage: Storage,
    step: int,
    entry: Entry,
    latest_step: int | None,
    newest_commit: datetime | None,
) -> TmpFolder:
    # A Cloud Storage prefix has no time: take its newest object's.
    modified = entry.modified if entry.modified is not None else storage.newest_modified(entry.name)
    # Older than the newest commit, or for a step at or below the latest complete one: no save
    # in progress would write there, so it is left over from an interrupted one.
    stale = (newest_commit is not None and modified is not None and modified < newest_commit) or (
        latest_step is not None and step <= latest_step
    )
    return TmpFolder(step=step, name=entry.name, modified_at=modified, stale=stale)


def _rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment, "milliseconds")


def resolve_checkpoint_location(spec: Spec) -> str:
    """Where the spec's framework keeps its steps; a SpecError without checkpoint.dir."""
    root = checkpoint_root(spec)
    if root is None:
        raise SpecError(
            "the spec names no checkpoint directory",
            location=SourceLocation(spec.source),
            path="checkpoint.dir",
            hint="set checkpoint.dir (gs://BUCKET/PATH), or pass the directory itself",
        )
    return root


def is_done(spec: Spec) -> bool:
    """Whether the job's done marker exists (False without checkpoint.dir)."""
    record = record_dir(spec)
    if record is None:
        return False
    try:
        return open_location(record).stat(DONE_FILE) is not None
    except NotFoundError:  # a missing bucket: nothing was ever finished there
        return False


def write_done(spec: Spec, reason: str) -> bool:
    """Write the done marker with `reason`; False (nothing written) without checkpoint.dir."""
    record = record_dir(spec)
    if record is None:
        return False
    open_location(record).write_text(DONE_FILE, reason.rstrip("\n") + "\n")
    return True
