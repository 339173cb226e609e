"""`tpuctl runs`: every run found by its record (tpuctl.jobs.reconcile.discover), as it stands:
in progress, done, given up (and why) or stopped; who reconciled it last (the host, a person's
`up` or a scheduler's `reconcile`) and when; the step it reached; its goodput so far; its
preemptions, job failures and flex-start run ends; and the queued resource it holds.

Everything comes from the run's record directory (its run.json, journal, supervisor.json and
the workers' state objects), so no credentials for the TPU API are needed unless the queued
resources are asked about live. A run in progress that nobody reconciled for longer than
`stale_after` is flagged: its scheduler (or its `up`) stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from tpuctl.clock import format_duration, parse_rfc3339
from tpuctl.envelope import Result
from tpuctl.errors import NotFoundError, TpuctlError

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.jobs.reconcile.discover import FoundRun
    from tpuctl.jobs.reconcile.store import RunFile

# A run in progress whose supervisor.json is older than this is flagged: a scheduler steps it
# every minute (GitHub's every five, often late), `up` every few seconds.
STALE_AFTER = 600.0

IN_PROGRESS, NOT_STARTED = "in_progress", "not_started"
FINISHED = {"done": "done", "gave_up": "given_up", "stopped": "stopped"}


@dataclass
class LastStep:
    """Who reconciled the run last (supervisor.json): when, on which host, as a person's `up`
    or a scheduler's `reconcile`, and what it decided."""

    at: datetime | None
    host: str | None
    by: str | None
    pid: int | None
    action: str | None
    message: str | None

    @classmethod
    def parse(cls, document: dict[str, Any]) -> LastStep:
        pid = document.get("pid")
        return cls(
            at=parse_rfc3339(document.get("at")) if isinstance(document.get("at"), str) else None,
            host=_text(document.get("host")),
            by=_text(document.get("by")),
            pid=pid if isinstance(pid, int) else None,
            action=_text(document.get("action")),
            message=_text(document.get("message")),
        )


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass
class HeldQueuedResource:
    """A queued resource the run holds: its zone and state, as the record last said it
    (`source` record) or as the API says now (`api`)."""

    zone: str
    state: str
    source: str


@dataclass
class RunRow:
    """One run (docs/output.md, kind Runs)."""

    name: str
    run: str
    record_url: str
    project: str | None
    zones: list[str]
    state: str  # in_progress | done | given_up | stopped | not_started
    why: str | None = None  # a give-up's reason
    exit_code: int | None = None  # a give-up's exit code
    attempt: int = 0
    last_reconciled: LastStep | None = None
    unsupervised: bool = False  # in progress, and nobody reconciled it for too long
    advice: str | None = None  # what to do about it
    latest_step: int | None = None  # the latest committed checkpoint, as last seen
    last_step: int | None = None  # the furthest step a worker reported
    goodput: float | None = None
    total_seconds: float | None = None
    preemptions: int = 0
    failures: int = 0
    run_ends: int = 0
    restarts: int = 0
    queued_resources: list[HeldQueuedResource] = field(default_factory=list)
    source: str | None = None  # the spec's path where the run was started
    error: str | None = None  # what could not be read


@dataclass
class RunsResult(Result):
    """`tpuctl runs`: every run found, and the queued resources of runs out of reach."""

    KIND: ClassVar[str] = "Runs"
    bucket: str | None
    project: str | None
    live: bool
    runs: list[RunRow] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run_row(found: FoundRun, *, now: datetime, stale_after: float = STALE_AFTER) -> RunRow:
    """The row of the run whose record is at `found.url` (see the module doc)."""
    import posixpath

    from tpuctl.jobs.goodput import build_report
    from tpuctl.jobs.reconcile.record import RunRecord
    from tpuctl.jobs.reconcile.store import read_run_file
    from tpuctl.storage.journal import Journal
    from tpuctl.storage.locations import open_location
    from tpuctl.worker import JOURNAL_DIR, WORKERS_DIR, join_location

    storage = open_location(found.url)
    problems: list[str] = []
    run_file: RunFile | None = None
    try:
        run_file = read_run_file(storage)
    except TpuctlError as unreadable:
        problems.append(f"run.json: {unreadable.message}")
    name = run_file.name if run_file else found.name or posixpath.basename(found.url.rstrip("/"))
    run = run_file.run if run_file else name
    entries = Journal(None, url=join_location(found.url, JOURNAL_DIR)).entries()
    record = RunRecord().fold(entries)
    document = _beat(storage)
    beat = LastStep.parse(document) if document is not None else None
    last_step = _workers_last_step(join_location(found.url, WORKERS_DIR))
    latest = _latest_step(document, entries)
    report = build_report(entries, name=name, run=run, now=now, latest_step=latest)
    state = NOT_STARTED if not record.started else FINISHED.get(record.finished or "", IN_PROGRESS)
    error = record.error or {}
    row = RunRow(
        name=name,
        run=run,
        record_url=found.url,
        project=run_file.project if run_file else None,
        zones=list(run_file.zones) if run_file else [],
        state=state,
        why=_text(error.get("message")) if state == "given_up" else None,
        exit_code=error.get("exit_code") if state == "given_up" else None,
        attempt=record.attempt,
        last_reconciled=beat,
        latest_step=latest,
        last_step=last_step,
        goodput=None if report.goodput is None else round(report.goodput, 4),
        total_seconds=round(report.total_seconds, 3) if entries else None,
        preemptions=record.preemptions,
        failures=record.failures,
        run_ends=len(record.run_ends),
        restarts=record.restarts,
        queued_resources=_held(record.states, found),
        source=run_file.source if run_file else None,
        error="; ".join(problems) or None,
    )
    _flag(row, now, stale_after)
    return row


def _beat(storage: Any) -> dict[str, Any] | None:
    """supervisor.json, or None."""
    import json

    from tpuctl.jobs.reconcile.store import SUPERVISOR

    try:
        document = json.loads(storage.read_text(SUPERVISOR))
    except (NotFoundError, TpuctlError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _workers_last_step(url: str) -> int | None:
    from tpuctl.storage.worker_states import read_worker_states

    steps = [s.last_step for s in read_worker_states(url).values() if s.last_step is not None]
    return max(steps) if steps else None


def _latest_step(beat: dict[str, Any] | None, entries: list[Any]) -> int | None:
    """The latest committed checkpoint the last step saw, else the latest a journal entry
    named."""
    seen = (beat or {}).get("latest_step")
    if isinstance(seen, int):
        return seen
    for entry in reversed(entries):
        for key in ("latest_step", "checkpoint_step"):
            value = entry.fields.get(key)
            if isinstance(value, int):
                return value
    return None


def _held(states: dict[str, str], found: FoundRun) -> list[HeldQueuedResource]:
    held = [
        HeldQueuedResource(zone, state, "record")
        for zone, state in sorted(states.items())
        if zone and state != "DELETED"
    ]
    if found.zone is not None and found.state is not None:  # found by it: the API said so
        held = [q for q in held if q.zone != found.zone]
        held.append(HeldQueuedResource(found.zone, found.state, "api"))
        held.sort(key=lambda q: q.zone)
    return held


def _flag(row: RunRow, now: datetime, stale_after: float) -> None:
    """A run in progress that nobody reconciled for longer than `stale_after`: flagged, with
    what to do."""
    if row.state != IN_PROGRESS:
        return
    beat = row.last_reconciled
    age = None if beat is None or beat.at is None else (now - beat.at).total_seconds()
    if age is not None and age <= stale_after:
        return
    row.unsupervised = True
    who = ""
    if beat is not None and beat.at is not None:
        who = f" (last by {beat.by or 'a step'} on {beat.host or 'an unknown host'})"
    since = "ever" if age is None else f"for {format_duration(age)}"
    spec = row.source or "SPEC"
    row.advice = (
        f"nobody has reconciled it {since}{who}: its scheduler seems to have stopped; check "
        f"it, or hand the run to one: tpuctl supervise {spec} --on cron --install (or take it "
        f"on: tpuctl up {spec})"
    )


def live_queued_resources(api: TpuApi, name: str, zones: list[str]) -> list[HeldQueuedResource]:
    """The run's queued resource in each of its zones, as the API says now."""
    from tpuctl.cloud import describe

    held = []
    for zone in zones:
        queued_resource = api.in_zone(zone).find_queued_resource(name)
        if queued_resource is not None:
            held.append(HeldQueuedResource(zone, describe.state_name(queued_resource), "api"))
    return held
