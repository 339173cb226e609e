"""The babysitter behind `tpuctl up`: bring a job's QR up, start the job, and recover it.

Decisions, in the order they are checked on every poll:

* the done marker (or every worker reporting `done`) → delete the QR unless kept; exit 0;
* the QR SUSPENDED (spot preemption), or FAILED after it was ACTIVE → delete it (force) and
  create it again from the same spec (same run name, so the job resumes), wait, deliver and
  start; counts against `recovery.max_preemptions` (exhausted → PreemptedError, exit 7);
* the job exited on every worker without the done marker, while every node is READY and not
  under maintenance, and it stayed so for `failure_confirm` seconds → restart it, counting
  against `recovery.max_failures` (exhausted → CommandFailedError, exit 3). A maintenance event
  or a reset is not a failure: the boot count goes up and the startup script relaunches the job;
* a crash loop: the latest complete checkpoint did not advance across the last
  `crashloop_restarts` restarts → CommandFailedError (exit 3).

Budgets count within one `Babysitter.run()`; the Journal keeps the history across runs.
Nothing here prints, sleeps on its own or exits: every dependency (API, fleet, job operations,
storage, journal, clock) is injected, and every decision goes to `on_event` and the Journal.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl.cloud import lifecycle
from tpuctl.cloud.watcher import GONE, SUSPENDED_STATES, Clock, WatchEvent, WatchPolicy
from tpuctl.errors import (
    CommandFailedError,
    Interrupted,
    NotFoundError,
    PreemptedError,
    QueuedResourceFailed,
    TpuctlError,
)
from tpuctl.resume.logs import LogFacts, parse_log

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.spec.model import Spec

LOG_ROOT = "/var/log/tpuctl"
RUNNING_STATES = frozenset({"running"})
LIVE_STATES = frozenset({"starting", "setup", "running"})
ENDED_STATES = frozenset({"exited", "setup-failed"})


# ------------------------------------------------------------------------------ protocols


class WorkerStatus(Protocol):
    """What `tpuctl.fanout.jobs.job_status` reports for one worker (the fields used here)."""

    @property
    def state(self) -> str: ...

    @property
    def boot(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def exit_code(self) -> int | None: ...

    @property
    def reachable(self) -> bool: ...


class JobOps(Protocol):
    """The worker-side operations the babysitter and the drill need."""

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def job_status(self, fleet: Fleet, spec: Spec) -> Sequence[WorkerStatus]: ...

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        """Worker `target`'s job log (`current.log`, or `boot-<boot>.log`); "" when absent."""
        ...


class JobRecord(Protocol):
    """The job's shared storage: the done marker and the checkpoint directory."""

    def is_done(self) -> bool: ...

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        """(step, committed_at) of the latest complete checkpoint, or None."""
        ...

    def complete_steps(self) -> tuple[int, ...]: ...


class JournalLike(Protocol):
    def append(self, kind: str, **fields: Any) -> object: ...


# ------------------------------------------------------------------------------ log probes


def log_path(run_name: str, boot: int | None) -> str:
    """The worker path of a run's log (under $TPUCTL_VM_ROOT on an emulated worker)."""
    name = "current.log" if boot is None else f"boot-{boot}.log"
    return f"{LOG_ROOT}/{run_name}/{name}"


def read_log_command(run_name: str, boot: int | None, lines: int = 400) -> str:
    """The head and the tail of a log: the resume line is near the start, the steps at the end."""
    from tpuctl.fanout.remote import remote_path

    path = remote_path(log_path(run_name, boot))
    return (
        f'f={path}; [ -e "$f" ] || exit 0; '
        f'if [ $(wc -l <"$f") -le {2 * lines} ]; then cat "$f"; '
        f'else head -n {lines} "$f"; tail -n {lines} "$f"; fi'
    )


# ------------------------------------------------------------------------------ defaults


class FanoutJobOps:
    """JobOps over SSH: tpuctl.fanout.jobs, plus log reads through the fan-out engine."""

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        from tpuctl.fanout import jobs

        return jobs.deliver_and_start(fleet, spec)

    def job_status(self, fleet: Fleet, spec: Spec) -> Sequence[WorkerStatus]:
        from tpuctl.fanout import jobs

        return jobs.job_status(fleet, spec)

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        from tpuctl.fanout import jobs

        return jobs.restart_job(fleet, spec)

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        from tpuctl.fanout.engine import run_fanout
        from tpuctl.resume.checkpoints import run_name

        command = read_log_command(run_name(spec), boot)
        options = fleet.options(keep_output=True, timeout=30.0)
        result = run_fanout([target], command, fleet.connect, options)
        worker = result.results[0]
        if not worker.ok:
            return ""
        return worker.stdout.bytes().decode("utf-8", errors="replace")


class StorageJobRecord:
    """JobRecord over the spec's checkpoint dir (local path or gs://) and done marker."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def is_done(self) -> bool:
        from tpuctl.resume.checkpoints import is_done

        return is_done(self.spec)

    def _report(self) -> Any:
        from tpuctl.resume.checkpoints import checkpoint_root, inspect_checkpoints

        root = checkpoint_root(self.spec)
        if root is None:
            return None
        try:
            return inspect_checkpoints(root)
        except NotFoundError:
            return None

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        report = self._report()
        if report is None or report.latest_step is None:
            return None
        return int(report.latest_step), report.latest_committed_at

    def complete_steps(self) -> tuple[int, ...]:
        report = self._report()
        return () if report is None else tuple(int(step) for step in report.complete_steps)


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class UpEvent:
    """One decision or observation: printed by the CLI, appended to the Journal."""

    at: datetime
    kind: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpOptions:
    keep: bool = False
    poll: float | None = None  # steady ACTIVE poll spacing; None: the watcher's (6 s + jitter)
    job_check_every: float = 20.0  # per-worker job status over SSH
    failure_confirm: float = 10.0  # every worker exited for this long (same boots) = a failure
    crashloop_restarts: int = 2
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    keep_on_timeout: bool = False
    start_attempts: int = 3  # deliver_and_start tries (SSH right after ACTIVE can be early)
    running_timeout: float = 600.0  # after a start, how long the job may take to be running
    resume_hint: str | None = None  # e.g. "tpuctl up job.yaml", for the Ctrl-C message


@dataclass
class UpResult:
    name: str
    outcome: str  # "done"
    preemptions: int = 0
    failures: int = 0
    restarts: int = 0
    latest_step: int | None = None
    deleted: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "preemptions": self.preemptions,
            "failures": self.failures,
            "restarts": self.restarts,
            "latest_step": self.latest_step,
            "deleted": self.deleted,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class _Done(Exception):
    """Internal: the done marker was seen."""


# ------------------------------------------------------------------------------ the babysitter


class Babysitter:
    """`Babysitter(spec, api, fleet_factory=…).run()`: see the module docstring."""

    def __init__(
        self,
        spec: Spec,
        api: TpuApi,
        *,
        fleet_factory: Callable[[], Fleet],
        jobs: JobOps | None = None,
        record: JobRecord | None = None,
        journal: JournalLike | None = None,
        options: UpOptions | None = None,
        clock: Clock | None = None,
        on_event: Callable[[UpEvent], None] | None = None,
        rng: random.Random | None = None,
        stop_requested: Callable[[], bool] | None = None,
    ) -> None:
        self.spec = spec
        # Ctrl-C inside an SSH fan-out is absorbed by the engine (it returns an interrupted
        # result), so the CLI also raises a flag, checked after every step.
        self.stop_requested = stop_requested or (lambda: False)
        self.api = api
        self.name = spec.name
        self.fleet_factory = fleet_factory
        self.jobs: JobOps = jobs or FanoutJobOps()
        self.record: JobRecord = record or StorageJobRecord(spec)
        self.journal = journal
        self.options = options or UpOptions()
        self.clock = clock or Clock()
        self.on_event = on_event or (lambda _event: None)
        self.rng = rng or random.Random()
        self.result = UpResult(name=self.name, outcome="running")
        self.state: str | None = None
        self.ever_active = False
        self._fleet: Fleet | None = None
        self._restart_steps: list[int | None] = []
        self._boots: dict[str, int | None] = {}
        self._ended_key: tuple[Any, ...] | None = None
        self._ended_since: float | None = None
        self._awaiting_running_since: float | None = None
        self._disruption: str | None = None  # what the job is recovering from, if anything
        self._last_step: tuple[int, datetime] | None = None
        self._step_seconds: float | None = None
        self._fast_polls = 0
        self._next_job_check = 0.0

    # --------------------------------------------------------------------------- plumbing

    def emit(self, kind: str, message: str, **fields: Any) -> None:
        event = UpEvent(self.clock.now(), kind, message, fields)
        if self.journal is not None:
            self.journal.append(kind, message=message, **fields)
        self.on_event(event)

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            self._fleet = self.fleet_factory()
        return self._fleet

    def _recovery(self) -> tuple[int, int]:
        recovery = self.spec.recovery
        return recovery.max_preemptions, recovery.max_failures

    # --------------------------------------------------------------------------- entry point

    def run(self) -> UpResult:
        """Babysit until done; raise the TpuctlError whose exit code says how it ended."""
        max_preemptions, max_failures = self._recovery()
        self.result.started_at = self.clock.now()
        self.emit(
            "up.start",
            f"babysitting {self.name} (run {_run_name(self.spec)}; budgets: "
            f"{max_preemptions} preemptions, {max_failures} job failures)",
            name=self.name,
            run=_run_name(self.spec),
            max_preemptions=max_preemptions,
            max_failures=max_failures,
            keep=self.options.keep,
        )
        try:
            self._babysit()
        except _Done:
            self._finish()
        except KeyboardInterrupt:
            error = self._interrupted()
            self._exit(error)
            raise error from None
        except Interrupted as interrupted:
            error = self._interrupted()
            self._exit(error)
            raise error from interrupted
        except TpuctlError as error:
            self._exit(error)
            raise
        self.result.outcome = "done"
        self.result.finished_at = self.clock.now()
        self.emit("up.exit", f"{self.name}: done", exit_code=0, outcome="done")
        return self.result

    def _exit(self, error: TpuctlError) -> None:
        self.emit(
            "up.exit",
            f"tpuctl up exits with {int(error.exit_code)} ({error.kind})",
            exit_code=int(error.exit_code),
            outcome=error.kind,
            reason=error.message,
        )

    def _interrupted(self) -> Interrupted:
        state = self.state or "unknown"
        resume = self.options.resume_hint or f"tpuctl up {self.spec.source}"
        delete = lifecycle.delete_command(self.api, self.name)
        return Interrupted(
            f"interrupted: stopped babysitting {self.name} (state {state}); the queued resource "
            "and the job were left running",
            hint=f"resume with: {resume}  (it picks up the running job)  or delete it: {delete}",
            name=self.name,
            state=state,
            deleted=False,
            delete_command=delete,
            resume_command=resume,
        )

    # --------------------------------------------------------------------------- main loop

    def _babysit(self) -> None:
        if self.record.is_done():
            self.emit("job.done", f"{self.name}: the done marker exists already", already=True)
            raise _Done
        existed = self._bring_up(first=True)
        self._start_job(resume_existing=existed)
        while True:
            self.clock.sleep(self._next_delay())
            self._poll_once()

    def _next_delay(self) -> float:
        now = self.clock.monotonic()
        if self._fast_polls > 0 or self._awaiting_running_since is not None:
            self._fast_polls = max(0, self._fast_polls - 1)
            delay = self.rng.uniform(0.5, 1.0)
        elif self.options.poll is not None:
            delay = self.options.poll
        else:
            base = WatchPolicy().slow_min
            delay = base * (1.0 + self.rng.uniform(0.0, WatchPolicy().slow_jitter))
        return max(0.0, min(delay, self._next_job_check - now))

    def _check_stop(self) -> None:
        if self.stop_requested():
            raise KeyboardInterrupt

    def _poll_once(self) -> None:
        self._check_stop()
        observation = lifecycle.observe(self.api, self.name)
        changed = self._saw_state(observation.state, observation.initiator, observation.failure)
        if self.record.is_done():
            self.emit("job.done", f"{self.name}: the done marker appeared")
            raise _Done
        state = observation.state
        if state == GONE:
            raise NotFoundError(
                f"{self.name} was deleted while tpuctl up was babysitting it",
                hint=f"create it again with: {self.options.resume_hint or 'tpuctl up SPEC'}",
                name=self.name,
            )
        if state == "SUSPENDED" or (state == "FAILED" and self.ever_active):
            self._recover_qr(state, observation.initiator, observation.failure)
            return
        if state == "FAILED":
            raise QueuedResourceFailed(
                f"{self.name} FAILED before it was ever ACTIVE: {observation.failure}",
                hint=lifecycle.delete_command(self.api, self.name),
                name=self.name,
                state=state,
            )
        if state in SUSPENDED_STATES:  # SUSPENDING: SUSPENDED follows within seconds
            self._fast_polls = 3
            return
        if state != "ACTIVE":
            return
        now = self.clock.monotonic()
        if changed or now >= self._next_job_check:
            self._check_job()

    def _saw_state(self, state: str, initiator: str | None, failure: str | None) -> bool:
        if state == self.state:
            return False
        previous = self.state
        self.state = state
        if state == "ACTIVE":
            self.ever_active = True
        self._fast_polls = 3
        why = f" (initiated by {initiator})" if initiator and state in SUSPENDED_STATES else ""
        why += f": {failure}" if failure and state == "FAILED" else ""
        arrow = f"{previous} → {state}" if previous else state
        self.emit(
            "qr.state",
            f"{self.name}: {arrow}{why}",
            state=state,
            previous=previous,
            initiator=initiator,
            failure=failure,
        )
        return True

    def _on_watch(self, event: WatchEvent) -> None:
        if event.kind == "state":
            observation = event.observation
            self._saw_state(
                event.state,
                observation.initiator if observation else None,
                observation.failure if observation else None,
            )
        elif event.kind == "warning":
            self.emit("qr.warning", f"{self.name}: {event.message}", state=event.state)

    # --------------------------------------------------------------------------- QR

    def _bring_up(self, *, first: bool) -> bool:
        """Create (or accept) the QR and wait for ACTIVE; recreate it on preemption.

        Returns whether an ACTIVE QR existed already (the job may be running on it).
        """
        existed_active = False
        while True:
            existing = self.api.find_queued_resource(self.name)
            if existing is not None:
                from tpuctl.cloud import describe

                state = describe.state_name(existing)
                self._saw_state(state, describe.enum_name(existing.state.state_initiator), None)
                if state in SUSPENDED_STATES:
                    initiator = describe.enum_name(existing.state.state_initiator)
                    self._recover_qr(state, initiator, None, restart_job=False)
                    return False
                existed_active = first and state == "ACTIVE"
            plan = lifecycle.plan_create(
                self.spec,
                project=self.api.location.project,
                zone=self.api.location.zone,
            )
            created = lifecycle.create(self.api, plan)
            if created["action"] == "created":
                self.emit("qr.created", f"created {self.name}", request_id=plan.request_id)
            else:
                self.emit(
                    "qr.exists",
                    f"{self.name} exists from this spec "
                    f"({created['queued_resource']['state']}); using it",
                    state=created["queued_resource"]["state"],
                )
            try:
                self._wait_active()
            except PreemptedError as error:
                self._recover_qr(str(error.details.get("state") or "SUSPENDED"), None, None, False)
                return False
            except QueuedResourceFailed as error:
                if not self.ever_active:
                    raise
                self._recover_qr("FAILED", None, error.details.get("reason"), restart_job=False)
                return False
            return existed_active

    def _wait_active(self) -> None:
        options = self.options
        policy = WatchPolicy(
            until="ACTIVE",
            queue_timeout=options.queue_timeout,
            provision_timeout=options.provision_timeout,
        )
        wait_options = lifecycle.WaitOptions(policy=policy, keep_on_timeout=options.keep_on_timeout)
        lifecycle.wait(self.api, self.name, wait_options, on_event=self._on_watch, clock=self.clock)
        self.ever_active = True
        self._fleet = None  # new workers (or host keys) after a (re)create

    def _recover_qr(
        self,
        state: str,
        initiator: str | None,
        failure: str | None,
        restart_job: bool = True,
    ) -> None:
        """Delete a SUSPENDED (or FAILED after ACTIVE) QR and create it again."""
        max_preemptions, _ = self._recovery()
        self.result.preemptions += 1
        count = self.result.preemptions
        checkpoint = self.record.latest_checkpoint()
        last = self._last_step
        cause = "spot preemption" if state in SUSPENDED_STATES else f"{state}: {failure}"
        self.emit(
            "preemption.detected",
            f"{self.name} is {state} ({cause}"
            + (f", initiated by {initiator}" if initiator else "")
            + f"); recovery {count} of {max_preemptions}",
            state=state,
            initiator=initiator,
            failure=failure,
            count=count,
            budget=max_preemptions,
            checkpoint_step=checkpoint[0] if checkpoint else None,
            last_step=last[0] if last else None,
            last_step_at=last[1] if last else None,
            step_seconds=self._step_seconds,
        )
        self._disruption = "preemption"
        lifecycle.delete(self.api, self.name, force=True, wait_until_gone=True, ignore_missing=True)
        self.state = GONE
        if count > max_preemptions:
            self.emit(
                "qr.deleted",
                f"deleted {self.name}: a {state} queued resource is never re-allocated",
                reason="preemption budget exhausted",
            )
            raise PreemptedError(
                f"{self.name} was preempted {count} times; recovery.max_preemptions is "
                f"{max_preemptions}: gave up (the queued resource was deleted)",
                hint="raise recovery.max_preemptions, or use another capacity tier",
                name=self.name,
                preemptions=count,
            )
        self.emit("qr.deleted", f"deleted {self.name} to recreate it", reason="recreate")
        plan = lifecycle.plan_create(
            self.spec, project=self.api.location.project, zone=self.api.location.zone
        )
        lifecycle.create(self.api, plan)
        self.emit(
            "qr.recreated",
            f"created {self.name} again (same run name, so the job resumes)",
            count=count,
            request_id=plan.request_id,
        )
        try:
            self._wait_active()
        except PreemptedError as error:
            self._recover_qr(str(error.details.get("state") or "SUSPENDED"), None, None, False)
        except QueuedResourceFailed as error:
            self._recover_qr("FAILED", None, error.details.get("reason"), restart_job=False)
        if restart_job:
            self._start_job(resume_existing=False)

    # --------------------------------------------------------------------------- the job

    def _start_job(self, *, resume_existing: bool) -> None:
        if resume_existing:
            statuses = self._statuses()
            states = [status.state for status in statuses]
            if statuses and all(state == "done" for state in states):
                self.emit("job.done", f"{self.name}: every worker reports done")
                raise _Done
            live = [s for s in statuses if s.state in LIVE_STATES]
            waiting = [s for s in statuses if s.state == "waiting-for-code"]
            if live and not waiting:
                self._boots = {_label(s): s.boot for s in statuses}
                self.emit(
                    "job.running",
                    f"{self.name}: the job is already running ({_describe(statuses)}); "
                    "babysitting it without a restart",
                    boots=_boots_of(statuses),
                    already=True,
                )
                self._next_job_check = self.clock.monotonic() + self.options.job_check_every
                return
        self._deliver()

    def _deliver(self) -> None:
        attempts = max(1, self.options.start_attempts)
        result: FanoutResult | None = None
        for attempt in range(1, attempts + 1):
            result = self.jobs.deliver_and_start(self.fleet, self.spec)
            self._check_stop()
            if not int(result.exit_code):
                break
            self.emit(
                "job.start_failed",
                f"delivering/starting the job failed on {len(result.failed)} of "
                f"{len(result)} workers (attempt {attempt} of {attempts})",
                attempt=attempt,
                workers=[w.target.label for w in result.failed],
            )
            self._fleet = None
            if attempt < attempts:
                self.clock.sleep(5.0)
        assert result is not None
        if int(result.exit_code):
            error = result.error()
            raise error if error is not None else TpuctlError("could not start the job")
        self.emit(
            "job.started",
            f"{self.name}: job delivered and started on {len(result)} workers",
            workers=len(result),
            recovering=self._disruption,
        )
        self._awaiting_running_since = self.clock.monotonic()
        self._ended_key = None
        self._ended_since = None
        self._next_job_check = self.clock.monotonic() + 1.0

    def _statuses(self) -> Sequence[WorkerStatus]:
        try:
            statuses = self.jobs.job_status(self.fleet, self.spec)
        except TpuctlError:
            self._check_stop()
            self._fleet = None  # addresses or host keys may have changed: resolve again
            statuses = self.jobs.job_status(self.fleet, self.spec)
        self._check_stop()
        return statuses

    def _check_job(self) -> None:
        now = self.clock.monotonic()
        statuses = self._statuses()
        self._next_job_check = now + (
            1.0 if self._awaiting_running_since is not None else self.options.job_check_every
        )
        reachable = [s for s in statuses if s.reachable]
        if not statuses or len(reachable) < len(statuses):
            return  # decide nothing on a partial view
        if any(s.state in ("unknown", "none") for s in statuses):
            return  # not readable, or the startup script has not run yet
        states = [s.state for s in statuses]
        if all(state == "done" for state in states):
            self.emit("job.done", f"{self.name}: every worker reports done")
            raise _Done
        if any(state == "waiting-for-code" for state in states):
            # A replaced slice (fresh disk) or a recreated QR: ship the code again.
            self.emit(
                "job.redeliver",
                f"{self.name}: {states.count('waiting-for-code')} workers wait for the code "
                "(a new disk); delivering it",
            )
            self._deliver()
            return
        self._probe_progress(statuses)
        if all(state in ENDED_STATES for state in states):
            self._job_ended(statuses, now)
            return
        self._ended_key = None
        self._ended_since = None
        if any(state in RUNNING_STATES for state in states):
            self._job_running(statuses)
        elif (
            self._awaiting_running_since is not None
            and now - self._awaiting_running_since > self.options.running_timeout
        ):
            raise TpuctlError(
                f"{self.name}: the job did not reach running within "
                f"{self.options.running_timeout:g} s ({_describe(statuses)})",
                hint=f"see its logs: tpuctl logs {self.name}",
                name=self.name,
            )

    def _job_running(self, statuses: Sequence[WorkerStatus]) -> None:
        boots = {_label(s): s.boot for s in statuses}
        relaunched = bool(self._boots) and any(
            (boots.get(label) or 0) > (old or 0) for label, old in self._boots.items()
        )
        first = self._awaiting_running_since is not None
        if first or relaunched:
            facts = self._resume_facts(statuses)
            if first:
                message = f"{self.name}: the job is running ({_describe(statuses)})"
            else:
                message = (
                    f"{self.name}: the job relaunched itself after a reboot (maintenance or "
                    f"reset; boots {_boots_of(statuses)}): not a failure"
                )
            self.emit(
                "job.running" if first else "job.relaunched",
                message
                + (f"; resumed from step {facts.resume_point}" if facts.resume_point else ""),
                boots=_boots_of(statuses),
                resumed_from=facts.resume_point,
                recovering=self._disruption,
            )
            self._disruption = None
            self._awaiting_running_since = None
        self._boots = boots

    def _job_ended(self, statuses: Sequence[WorkerStatus], now: float) -> None:
        key = tuple((_label(s), s.boot, s.pid, s.state) for s in statuses)
        if key != self._ended_key:
            self._ended_key = key
            self._ended_since = now
            self._next_job_check = now + min(self.options.failure_confirm, 1.0)
            return
        if self._ended_since is None or now - self._ended_since < self.options.failure_confirm:
            self._next_job_check = now + min(self.options.failure_confirm, 1.0)
            return
        if self.record.is_done():
            self.emit("job.done", f"{self.name}: the done marker appeared")
            raise _Done
        if not self._nodes_settled():
            self._ended_since = now  # under maintenance or repair: not the job's fault
            return
        self._job_failed(statuses)

    def _nodes_settled(self) -> bool:
        """Every node READY and not under maintenance (a reboot is not a job failure)."""
        from tpuctl.cloud import describe

        for node_id in dict.fromkeys(target.node_id for target in self.fleet.targets):
            node = self.api.get_node(self.api.location.node_name(node_id))
            if node is None:
                return False
            if describe.enum_name(node.state) != "READY":
                return False
            if describe.enum_name(node.health) == "UNHEALTHY_MAINTENANCE":
                return False
        return True

    def _job_failed(self, statuses: Sequence[WorkerStatus]) -> None:
        _, max_failures = self._recovery()
        self.result.failures += 1
        count = self.result.failures
        checkpoint = self.record.latest_checkpoint()
        latest = checkpoint[0] if checkpoint else None
        self.result.latest_step = latest
        codes = sorted({s.exit_code for s in statuses if s.exit_code is not None})
        self.emit(
            "job.failed",
            f"{self.name}: the job exited on every worker without the done marker "
            f"(exit codes {codes or '?'}; latest checkpoint {latest}); failure {count}, "
            f"budget {max_failures}",
            count=count,
            budget=max_failures,
            exit_codes=codes,
            latest_step=latest,
            last_step=self._last_step[0] if self._last_step else None,
            step_seconds=self._step_seconds,
            states=[s.state for s in statuses],
        )
        self._ended_key = None
        self._ended_since = None
        window = self.options.crashloop_restarts
        if len(self._restart_steps) >= window and not _advanced(
            latest, self._restart_steps[-window]
        ):
            self.emit(
                "crashloop",
                f"{self.name}: crash loop: the latest checkpoint ({latest}) did not advance "
                f"across the last {window} restarts; giving up",
                latest_step=latest,
                steps_at_restarts=self._restart_steps[-window:],
            )
            raise CommandFailedError(
                f"{self.name}: crash loop: {window} restarts brought no new checkpoint "
                f"(latest step {latest})",
                hint=f"fix the job and run tpuctl up again; see tpuctl logs {self.name}",
                name=self.name,
                failures=count,
                reason="crashloop",
            )
        if count > max_failures:
            raise CommandFailedError(
                f"{self.name}: the job failed {count} times; recovery.max_failures is "
                f"{max_failures}: gave up",
                hint=f"see its logs: tpuctl logs {self.name}",
                name=self.name,
                failures=count,
                reason="failure budget exhausted",
            )
        self._restart_steps.append(latest)
        self._disruption = "failure"
        result = self.jobs.restart_job(self.fleet, self.spec)
        self._check_stop()
        self.result.restarts += 1
        self.emit(
            "job.restarted",
            f"{self.name}: restarted the job (restart {self.result.restarts}; it resumes from "
            f"step {latest if latest is not None else 0})",
            count=self.result.restarts,
            from_step=latest,
            workers_ok=len(result.succeeded),
        )
        self._awaiting_running_since = self.clock.monotonic()
        self._next_job_check = self.clock.monotonic() + 1.0

    def _probe_progress(self, statuses: Sequence[WorkerStatus]) -> None:
        """Worker 0's last step, for the step-time estimate and the wasted-progress report."""
        if not self.fleet.targets:
            return
        try:
            text = self.jobs.read_log(self.fleet, self.spec, self.fleet.targets[0], None)
        except TpuctlError:
            return
        facts = parse_log(text)
        if facts.last_step is None:
            return
        now = self.clock.now()
        previous = self._last_step
        if previous is not None and facts.last_step > previous[0]:
            elapsed = (now - previous[1]).total_seconds()
            self._step_seconds = elapsed / (facts.last_step - previous[0])
        self._last_step = (facts.last_step, now)

    def _resume_facts(self, statuses: Sequence[WorkerStatus]) -> LogFacts:
        if not self.fleet.targets:
            return LogFacts()
        try:
            return parse_log(self.jobs.read_log(self.fleet, self.spec, self.fleet.targets[0], None))
        except TpuctlError:
            return LogFacts()

    # --------------------------------------------------------------------------- the end

    def _finish(self) -> None:
        checkpoint = self.record.latest_checkpoint()
        self.result.latest_step = checkpoint[0] if checkpoint else self.result.latest_step
        if self.options.keep:
            self.emit("qr.kept", f"kept {self.name} (--keep)")
            return
        deleted = lifecycle.delete(
            self.api, self.name, force=True, wait_until_gone=True, ignore_missing=True
        )
        self.result.deleted = deleted["action"] in ("deleted", "delete_requested")
        self.state = GONE
        self.emit("qr.deleted", f"deleted {self.name}: the job is done", reason="done")


# ------------------------------------------------------------------------------ helpers


def _run_name(spec: Spec) -> str:
    if spec.job is not None and spec.job.run_name:
        return spec.job.run_name
    return spec.name


def _label(status: Any) -> str:
    label = getattr(status, "label", None)
    if isinstance(label, str):
        return label
    target = getattr(status, "target", None)
    if target is not None and isinstance(getattr(target, "label", None), str):
        return str(target.label)
    return str(id(status))


def _boots_of(statuses: Sequence[WorkerStatus]) -> dict[str, int | None]:
    return {_label(s): s.boot for s in statuses}


def _describe(statuses: Sequence[WorkerStatus]) -> str:
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status.state] = counts.get(status.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def _advanced(latest: int | None, earlier: int | None) -> bool:
    if latest is None:
        return False
    return earlier is None or latest > earlier
