"""The run's journal folded into what a decision needs: every timer, budget and counter (pure).

Nothing here lives in a process: a step reads the journal (or its last snapshot plus the
entries after it), folds it into a `RunRecord`, and a decision is a function of that record and
of what the step saw. Budgets therefore count across the whole run, whichever processes and
machines took part.

An attempt starts at a `run.start` entry (the first step of a run writes one; `tpuctl up` on a
run that gave up or was stopped writes another): counters count within the current attempt.
Counting is idempotent by key, so a step killed after it wrote a decision and before it acted
never counts twice: a preemption by the queued resource's incarnation, a job failure by the
ending it saw (every worker's boot, pid, state and exit code).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

from tpuctl.clock import parse_rfc3339, rfc3339

FORMAT_VERSION = 1


class EntryLike(Protocol):
    """A journal entry (tpuctl.storage.journal.JournalEntry)."""

    @property
    def timestamp(self) -> datetime: ...

    @property
    def kind(self) -> str: ...

    @property
    def fields(self) -> dict[str, Any]: ...


@dataclass
class Ended:
    """Every worker ended the job, as first seen at `since` (restarted while a disruption
    shows); `key` names that ending (labels, boots, pids, states, exit codes)."""

    key: str
    since: datetime
    disruption: str | None = None


@dataclass
class RunRecord:
    """Everything the journal says about the current attempt of a run (see the module doc)."""

    attempt: int = 0
    attempt_started: datetime | None = None
    # How the attempt ended: done, gave_up (with `error`: kind, exit_code, message, hint) or
    # stopped (by `tpuctl delete`); None while it goes on.
    finished: str | None = None
    error: dict[str, Any] | None = None
    kept: bool = False  # it ended with its queued resource kept (--keep): nothing to delete
    # Budgets, counted once per key.
    preempted: list[str] = field(default_factory=list)  # incarnations counted
    rung: int = 0  # the capacity ladder's rung the run asks for now
    rung_preemptions: int = 0  # preemptions since it began asking for it
    # Incarnations a flex-start run's end took back (neither a preemption nor a failure).
    run_ends: list[str] = field(default_factory=list)
    failed_endings: list[str] = field(default_factory=list)
    restarts: int = 0
    restart_steps: list[int | None] = field(default_factory=list)
    restarted_endings: list[str] = field(default_factory=list)
    # The queued resource: the last state said per zone, and per incarnation when it was
    # first seen PROVISIONING and whether it was ever ACTIVE.
    states: dict[str, str] = field(default_factory=dict)
    incarnations: dict[str, str] = field(default_factory=dict)
    provisioning_since: dict[str, str] = field(default_factory=dict)  # RFC 3339
    ever_active: list[str] = field(default_factory=list)
    # When the platform takes each incarnation back (flex-start), RFC 3339: a slice gone at
    # that time was taken back (Compute Engine deletes such a VM), not preempted.
    ends_at: dict[str, str] = field(default_factory=dict)
    # The bring-up across zones: zones given up since the round began, and a race on.
    round_given_up: list[str] = field(default_factory=list)
    round_outcomes: dict[str, str] = field(default_factory=dict)  # zone → why it was given up
    racing: bool = False
    # The job on the current queued resource.
    job_started_at: datetime | None = None
    job_incarnation: str | None = None
    start_failures: int = 0
    running_boots: dict[str, int | None] | None = None
    ended: Ended | None = None
    recovering: str | None = None  # what the job recovers from: preemption, failure, …
    # The latest committed step when the job stopped for it: where it resumes (nothing is
    # saved while it is down).
    resume_point: int | None = None
    job_zone: str | None = None  # where the job was started or seen running last
    done_said: bool = False  # the job's end was recorded (job.done)
    logs_saved: bool = False
    # What was said, so it is said once (then again after a while).
    wait_key: str | None = None
    wait_said_at: datetime | None = None
    api_down_since: datetime | None = None
    api_said_at: datetime | None = None
    last_entry: str = ""  # the name of the last entry folded in (for snapshots)

    @property
    def preemptions(self) -> int:
        return len(self.preempted)

    @property
    def failures(self) -> int:
        return len(self.failed_endings)

    @property
    def started(self) -> bool:
        return self.attempt > 0

    # ------------------------------------------------------------------------ folding

    def fold(self, entries: Iterable[EntryLike]) -> RunRecord:
        """This record with `entries` (oldest first) applied; returns itself."""
        for entry in entries:
            self.apply(entry.timestamp, entry.kind, entry.fields)
            name = getattr(entry, "name", "")
            if name:
                self.last_entry = name
        return self

    def apply(self, at: datetime, kind: str, fields: Mapping[str, Any]) -> None:
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, at, fields)

    # ------------------------------------------------------------------------ snapshots

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["version"] = FORMAT_VERSION
        for key in ("attempt_started", "job_started_at", "wait_said_at", "api_down_since"):
            document[key] = _time(getattr(self, key))
        document["api_said_at"] = _time(self.api_said_at)
        if self.ended is not None:
            document["ended"] = {**asdict(self.ended), "since": rfc3339(self.ended.since, "auto")}
        return document

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> RunRecord | None:
        """A snapshot read back; None when it is not one this version wrote."""
        if not isinstance(document, Mapping) or document.get("version") != FORMAT_VERSION:
            return None
        values = {key: value for key, value in document.items() if key != "version"}
        try:
            for key in (
                "attempt_started",
                "job_started_at",
                "wait_said_at",
                "api_down_since",
                "api_said_at",
            ):
                values[key] = parse_rfc3339(values.get(key))
            ended = values.get("ended")
            if ended is not None:
                since = parse_rfc3339(ended["since"])
                if since is None:
                    return None
                values["ended"] = Ended(str(ended["key"]), since, ended.get("disruption"))
            return cls(**values)
        except (TypeError, KeyError, ValueError):
            return None


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment, "auto")


# ---------------------------------------------------------------------------- entry kinds


def _run_start(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    fresh = RunRecord(attempt=record.attempt + 1, attempt_started=at)
    record.__dict__.update(fresh.__dict__)


def _finished(state: str) -> Any:
    def apply(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
        record.finished = state
        record.kept = bool(fields.get("kept"))
        if state == "gave_up":
            error = fields.get("error")
            record.error = dict(error) if isinstance(error, Mapping) else {}

    return apply


def _qr_state(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    zone, state = str(fields.get("zone") or ""), str(fields.get("state") or "")
    incarnation = fields.get("incarnation")
    record.states[zone] = state
    if isinstance(incarnation, str) and incarnation:
        record.incarnations[zone] = incarnation
        if state == "PROVISIONING":
            record.provisioning_since.setdefault(incarnation, rfc3339(at, "auto"))
        if state == "ACTIVE" and incarnation not in record.ever_active:
            record.ever_active.append(incarnation)
        end = fields.get("termination_time")
        if isinstance(end, datetime):
            end = rfc3339(end)
        if isinstance(end, str) and end:
            record.ends_at[incarnation] = end
    if state == "ACTIVE" and not fields.get("racing"):
        record.round_given_up = []
        record.round_outcomes = {}


def _qr_gone(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    zone = str(fields.get("zone") or "")
    record.states[zone] = "DELETED"


def _zone_gave_up(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    zone = str(fields.get("zone") or "")
    if zone and zone not in record.round_given_up:
        record.round_given_up.append(zone)
    if zone:
        record.round_outcomes[zone] = str(fields.get("outcome") or "")


def _race(on: bool) -> Any:
    def apply(record: RunRecord, _at: datetime, _fields: Mapping[str, Any]) -> None:
        record.racing = on

    return apply


def _disruption_of_slice(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    """A preemption (or a FAILED, vanished or taken-back queued resource): counted once per
    incarnation; the next bring-up follows the zone policy from its first zone again."""
    incarnation = str(fields.get("incarnation") or "")
    if incarnation and incarnation not in record.preempted:
        record.preempted.append(incarnation)
        record.rung_preemptions += 1
    record.round_given_up = []
    record.round_outcomes = {}
    record.racing = False
    record.recovering = str(fields.get("cause") or "preemption")
    record.resume_point = _step(fields.get("checkpoint_step"))
    _forget_job(record)


def _run_ended(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    """A flex-start run's time was up: counted apart from preemptions; a new run follows."""
    incarnation = str(fields.get("incarnation") or "")
    if incarnation and incarnation not in record.run_ends:
        record.run_ends.append(incarnation)
    record.round_given_up = []
    record.round_outcomes = {}
    record.racing = False
    record.recovering = "run end"
    record.resume_point = _step(fields.get("checkpoint_step"))
    _forget_job(record)


def _rung(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    """The ladder's rung the run asks for now: a new round of zones, a new budget."""
    rung = fields.get("rung")
    record.rung = rung if isinstance(rung, int) else 0
    record.rung_preemptions = 0
    record.round_given_up = []
    record.round_outcomes = {}
    record.racing = False


def _forget_job(record: RunRecord) -> None:
    record.job_started_at = None
    record.job_incarnation = None
    record.start_failures = 0
    record.running_boots = None
    record.ended = None
    record.logs_saved = False


def _job_started(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    if fields.get("only"):  # started on a replaced slice's workers: the job was running
        return
    record.job_started_at = at
    record.job_zone = str(fields.get("zone") or "") or record.job_zone
    incarnation = fields.get("incarnation")
    record.job_incarnation = str(incarnation) if incarnation else None
    record.start_failures = 0
    record.running_boots = None
    record.ended = None


def _start_failed(record: RunRecord, _at: datetime, _fields: Mapping[str, Any]) -> None:
    record.start_failures += 1


def _job_running(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    boots = fields.get("boots")
    record.running_boots = dict(boots) if isinstance(boots, Mapping) else {}
    record.recovering = None
    record.ended = None
    incarnation = fields.get("incarnation")
    if incarnation:
        record.job_incarnation = str(incarnation)
    record.job_zone = str(fields.get("zone") or "") or record.job_zone
    if record.job_started_at is None:
        record.job_started_at = _at


def _job_ended(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    record.ended = Ended(str(fields.get("key") or ""), at)


def _job_disrupted(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    if record.ended is not None:
        record.ended.since = at
        record.ended.disruption = str(fields.get("disruption") or "") or None


def _job_failed(record: RunRecord, _at: datetime, fields: Mapping[str, Any]) -> None:
    ending = str(fields.get("ending") or "")
    if ending not in record.failed_endings:
        record.failed_endings.append(ending)
    record.ended = None


def _job_restarted(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    record.restarts += 1
    ending = fields.get("ending")
    if isinstance(ending, str):
        record.restarted_endings.append(ending)
    step = fields.get("from_step")
    record.restart_steps.append(step if isinstance(step, int) else None)
    record.recovering = "failure"
    record.resume_point = _step(step)
    record.job_started_at = at
    record.running_boots = None
    record.ended = None


def _logs_saved(record: RunRecord, _at: datetime, _fields: Mapping[str, Any]) -> None:
    record.logs_saved = True


def _job_done(record: RunRecord, _at: datetime, _fields: Mapping[str, Any]) -> None:
    record.done_said = True


def _waiting(record: RunRecord, at: datetime, fields: Mapping[str, Any]) -> None:
    record.wait_key = str(fields.get("key") or "") or None
    record.wait_said_at = at


def _api_down(record: RunRecord, at: datetime, _fields: Mapping[str, Any]) -> None:
    if record.api_down_since is None:
        record.api_down_since = at
    record.api_said_at = at


def _api_up(record: RunRecord, _at: datetime, _fields: Mapping[str, Any]) -> None:
    record.api_down_since = None
    record.api_said_at = None


_HANDLERS: dict[str, Any] = {
    "run.start": _run_start,
    "run.done": _finished("done"),
    "run.gave_up": _finished("gave_up"),
    "run.stopped": _finished("stopped"),
    "qr.state": _qr_state,
    "qr.deleted": _qr_gone,
    "zone.gave_up": _zone_gave_up,
    "zone.race": _race(True),
    "zone.chosen": _race(False),
    "preemption.detected": _disruption_of_slice,
    "run.ended": _run_ended,
    "capacity.rung": _rung,
    "job.started": _job_started,
    "job.start_failed": _start_failed,
    "job.running": _job_running,
    "job.relaunched": _job_running,
    "job.ended": _job_ended,
    "job.disrupted": _job_disrupted,
    "job.failed": _job_failed,
    "job.restarted": _job_restarted,
    "job.logs": _logs_saved,
    "job.done": _job_done,
    "reconcile.wait": _waiting,
    "api.unavailable": _api_down,
    "api.available": _api_up,
}
