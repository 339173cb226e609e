"""One reconcile step: fold the journal, observe, decide, record the decision, act once, and
keep a snapshot and the supervisor's heartbeat. The lease is the caller's: `tpuctl reconcile`
takes it for one step, `tpuctl up` for its whole life."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

from tpuctl.envelope import Result
from tpuctl.errors import (
    ApiUnavailableError,
    CommandFailedError,
    DeadlineError,
    ExitCode,
    PreemptedError,
    QueuedResourceFailed,
    ResourceExhaustedError,
    TpuctlError,
    UnreachableError,
)
from tpuctl.jobs.reconcile import crash
from tpuctl.jobs.reconcile.act import act
from tpuctl.jobs.reconcile.decide import decide
from tpuctl.jobs.reconcile.decision import (
    DONE,
    GIVEN_UP,
    IN_PROGRESS,
    REFUSE,
    STOPPED,
    Decision,
    GiveUp,
    Policy,
    give_up_of,
)
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen
from tpuctl.jobs.reconcile.world import World, observe


@dataclass(frozen=True)
class Said:
    """One entry a step wrote (and said): when, what, the message and its facts."""

    at: datetime
    kind: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


class Written(Protocol):
    """A journal entry as written (tpuctl.storage.journal.JournalEntry)."""

    @property
    def timestamp(self) -> datetime: ...

    @property
    def fields(self) -> dict[str, Any]: ...

    @property
    def name(self) -> str: ...


class StoreLike(Protocol):
    """The run's record directory (tpuctl.jobs.reconcile.store.RunStore, or a fake)."""

    def load(self) -> RunRecord: ...

    def begin(self) -> None:
        """The run starts, or a person's `up` takes it on: keep what a later step needs."""
        ...

    def append(self, kind: str, message: str, fields: dict[str, Any]) -> Written: ...

    def save(self, record: RunRecord) -> None: ...

    def beat(self, document: dict[str, Any]) -> None: ...


@dataclass
class StepResult:
    """What one step saw, decided and wrote."""

    seen: Seen
    decision: Decision
    record: RunRecord
    said: list[Said]
    api_unavailable: str | None = None  # an action found the API down: nothing more was done

    @property
    def outcome(self) -> str:
        return self.decision.outcome


def run_step(
    world: World,
    store: StoreLike,
    policy: Policy,
    *,
    on_said: Callable[[Said], None] | None = None,
    new_attempt: bool = False,
    check: Callable[[], None] | None = None,
) -> StepResult:
    """One step (see the module doc). `store` loads and saves the record and appends entries
    (RunStore); `new_attempt` starts a new attempt of a run that gave up or was stopped
    (`tpuctl up` on it, whose first step passes it); `check` is called before acting (the
    lease still ours). At the run's start, and at the first step of a person's `up`, the store
    keeps the run's own spec (`begin`) before anything is journaled."""
    record = store.load()
    said: list[Said] = []
    starting = not record.started or (new_attempt and record.finished in ("gave_up", "stopped"))
    if starting or new_attempt:
        store.begin()

    def write(kind: str, message: str, **fields: Any) -> None:
        facts = {key: value for key, value in fields.items() if value is not None}
        crash.point(f"journal {kind}")
        entry = store.append(kind, message, facts)
        record.apply(entry.timestamp, kind, entry.fields)
        record.last_entry = entry.name
        item = Said(entry.timestamp, kind, message, facts)
        said.append(item)
        if on_said is not None:
            on_said(item)

    if starting:
        write(
            "run.start",
            f"{policy.name}: supervising the run (attempt {record.attempt + 1}; budgets: "
            f"{policy.max_preemptions} preemptions, {policy.max_failures} job failures"
            + (
                f"; zones {', '.join(policy.zones)}, {policy.zone_policy}"
                if len(policy.zones) > 1
                else ""
            )
            + ")",
            attempt=record.attempt + 1,
            max_preemptions=policy.max_preemptions,
            max_failures=policy.max_failures,
            zones=list(policy.zones),
            zone_policy=policy.zone_policy,
        )
    seen = observe(world, policy, record)
    decision = decide(seen, record, policy)
    if decision.action == REFUSE:
        raise give_up_error(decision.give_up, deleted=False)
    for note in decision.notes:
        write(note.kind, note.message, **dict(note.fields))
    unavailable = None
    if check is not None:
        check()
    try:
        act(decision, world, record, seen, write)
    except ApiUnavailableError as error:
        unavailable = error.message
    store.save(record)
    store.beat(
        {
            "at": world.clock.now(),
            "outcome": decision.outcome,
            "action": decision.action,
            "message": decision.message,
            "attempt": record.attempt,
            "latest_step": seen.latest_step,
        }
    )
    return StepResult(seen, decision, record, said, unavailable)


def exit_code(result: StepResult) -> ExitCode:
    """The code a scheduler acts on: 0 done or stopped, 12 in progress, 11 the API could not
    be read (nothing was decided), the give-up's own code."""
    outcome = result.decision.outcome
    if outcome in (DONE, STOPPED):
        return ExitCode.OK
    if outcome == GIVEN_UP and result.decision.give_up is not None:
        return ExitCode(result.decision.give_up.exit_code)
    if result.decision.api_unavailable or result.api_unavailable:
        return ExitCode.API_UNAVAILABLE
    return ExitCode.IN_PROGRESS


_ERRORS: dict[str, type[TpuctlError]] = {
    "deadline": DeadlineError,
    "qr_failed": QueuedResourceFailed,
    "preempted": PreemptedError,
    "command_failed": CommandFailedError,
    "unreachable": UnreachableError,
    "resource_exhausted": ResourceExhaustedError,
}


def give_up_error(give_up: GiveUp | None, *, deleted: bool | None = None) -> TpuctlError:
    """The error a supervisor exits with for a run that gave up."""
    if give_up is None:
        return TpuctlError("the run gave up")
    error_class = _ERRORS.get(give_up.kind, TpuctlError)
    details = dict(give_up.details)
    if deleted is not None:
        details["deleted"] = deleted
    error = error_class(give_up.message, hint=give_up.hint, **details)
    if error_class is TpuctlError and give_up.exit_code != int(ExitCode.ERROR):
        error.exit_code = ExitCode(give_up.exit_code)
    return error


@dataclass
class ReconcileResult(Result):
    """`tpuctl reconcile`: one step of a run, what it saw, decided and did, and what comes
    next."""

    KIND: ClassVar[str] = "Reconcile"
    name: str
    outcome: str  # in_progress | done | given_up | stopped
    code: int  # the exit code (see `exit_code`)
    message: str
    action: str
    next_in_s: float | None = None
    observed: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None
    record: dict[str, Any] | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    held_by: str | None = None  # another supervisor holds the run (nothing was done)
    error: dict[str, Any] | None = None
    record_url: str | None = None  # the run's record directory (journal, lease, run.json)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode(self.code)

    def exit_error(self) -> TpuctlError | None:
        if self.outcome == GIVEN_UP and self.error is not None:
            return give_up_error(give_up_of(self.error))
        return None


@dataclass(frozen=True)
class RunError:
    """A run `tpuctl reconcile --all` found but could not step (its run.json unreadable, a
    `${VAR}` of its spec unset, its record moved, a zone that could not be listed)."""

    name: str | None
    record_url: str | None
    kind: str
    message: str
    hint: str | None
    exit_code: int

    @classmethod
    def of(cls, error: TpuctlError, *, name: str | None, record_url: str | None) -> RunError:
        return cls(name, record_url, error.kind, error.message, error.hint, int(error.exit_code))


@dataclass
class ReconcilesResult(Result):
    """`tpuctl reconcile --all`: one step of every run found (`runs`, each a Reconcile), the
    runs that could not be stepped (`errors`), and queued resources of runs whose record is
    out of reach (`skipped`). `code` is the exit code (see `reconciles_code`)."""

    KIND: ClassVar[str] = "Reconciles"
    bucket: str | None
    project: str | None
    code: int
    runs: list[ReconcileResult] = field(default_factory=list)
    errors: list[RunError] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode(self.code)

    def exit_error(self) -> TpuctlError | None:
        failing = [r for r in self.runs if r.outcome == GIVEN_UP]
        parts = [f"{r.name} gave up ({r.code})" for r in failing]
        parts += [f"{e.name or e.record_url}: {e.message}" for e in self.errors]
        if not parts or self.code in (ExitCode.IN_PROGRESS, ExitCode.API_UNAVAILABLE):
            return None
        error = TpuctlError("; ".join(parts), hint="tpuctl report SPEC says why a run gave up")
        error.exit_code = ExitCode(self.code)
        return error


def reconciles_code(runs: list[ReconcileResult], errors: list[RunError]) -> ExitCode:
    """For a scheduler: the highest code of a run that gave up or could not be stepped, else
    11 if the TPU API was unavailable, else 12 if any run is in progress, else 0."""
    failed = [r.code for r in runs if r.outcome == GIVEN_UP]
    failed += [e.exit_code for e in errors if e.exit_code != ExitCode.API_UNAVAILABLE]
    if failed:
        return ExitCode(max(failed))
    codes = {r.code for r in runs} | {e.exit_code for e in errors}
    if ExitCode.API_UNAVAILABLE in codes:
        return ExitCode.API_UNAVAILABLE
    if ExitCode.IN_PROGRESS in codes:
        return ExitCode.IN_PROGRESS
    return ExitCode.OK


def reconcile_result(name: str, result: StepResult) -> ReconcileResult:
    record = result.record
    decision = result.decision
    code = exit_code(result)
    message = decision.message
    if result.api_unavailable:
        message = f"{message}; the TPU API is unavailable ({result.api_unavailable})"
    return ReconcileResult(
        name=name,
        outcome=IN_PROGRESS if result.api_unavailable else decision.outcome,
        code=int(code),
        message=message,
        action=decision.action,
        next_in_s=decision.next_in if decision.outcome == IN_PROGRESS else None,
        observed=result.seen.to_dict(),
        decision=decision.to_dict(),
        record={
            "attempt": record.attempt,
            "preemptions": record.preemptions,
            "failures": record.failures,
            "restarts": record.restarts,
            "finished": record.finished,
        },
        written=[{"at": s.at, "kind": s.kind, "message": s.message} for s in result.said],
        error=decision.give_up.to_dict() if decision.give_up is not None else None,
    )


STEP_DEADLINE = 60.0  # a step's own deadline; its lease goes stale this long after a beat


def reconcile_once(
    world: World,
    store: Any,
    policy: Policy,
    *,
    command: str,
    on_said: Callable[[Said], None] | None = None,
    deadline: float = STEP_DEADLINE,
    on_late: Callable[[str], None] | None = None,
) -> ReconcileResult:
    """`tpuctl reconcile`: one step under the run's lease (`store` is a RunStore). A lease
    held by another supervisor is no error: the run is in progress, and this step did
    nothing."""
    import time

    from tpuctl.storage.lease import LeaseHeld, LeaseKeeper

    lease = store.lease(command, stale_after=deadline)
    try:
        lease.acquire()
    except LeaseHeld as held:
        return ReconcileResult(
            name=policy.name,
            outcome=IN_PROGRESS,
            code=int(ExitCode.IN_PROGRESS),
            message=f"{policy.name}: nothing done: {held.message}",
            action="nothing",
            held_by=held.message,
            record_url=getattr(store, "url", None),
        )
    watchdog = _Watchdog(deadline, on_late)
    try:
        with watchdog, LeaseKeeper(lease, until=time.monotonic() + deadline) as keeper:
            result = run_step(world, store, policy, on_said=on_said, check=keeper.check)
    finally:
        lease.release()
    reconciled = reconcile_result(policy.name, result)
    reconciled.record_url = getattr(store, "url", None)
    return reconciled


class _Watchdog:
    """A step that outlives its deadline ends itself: its lease goes stale then, and another
    step must never act beside it. It stops as a killed step does (the next one finishes what
    it began), exiting 12: the run is in progress."""

    def __init__(self, deadline: float, on_late: Callable[[str], None] | None) -> None:
        import threading

        self.deadline = deadline
        self.on_late = on_late
        self.timer = threading.Timer(deadline, self._late)
        self.timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self.timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.timer.cancel()

    def _late(self) -> None:
        import os

        if self.on_late is not None:
            self.on_late(
                f"the step passed its deadline ({self.deadline:g} s) and stops here; the next "
                "step goes on from what it did"
            )
        os._exit(int(ExitCode.IN_PROGRESS))
