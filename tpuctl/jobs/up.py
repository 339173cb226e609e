"""The babysitter behind `tpuctl up`: bring a job's queued resource up, start the job, and
recover it until it is done.

Decisions, in the order they are checked on every poll:

* the done marker (or every worker reporting `done`) → delete the QR unless kept; exit 0;
* the QR side (tpuctl.jobs.qr_watch): SUSPENDED (spot preemption), or FAILED after it was
  ACTIVE → delete it (force) and create it again from the same spec (same run name, so the
  job resumes), wait, deliver and start; counts against `recovery.max_preemptions`
  (exhausted → PreemptedError, exit 7);
* the job side (tpuctl.jobs.job_watch), once every worker has ended the job: an exit followed
  by a reboot, maintenance or repair is a disruption (the job resumes), whatever its code; with
  nothing disturbing the nodes for `settle` seconds, every worker having exited 0 in the same
  boot (and none stopped by a SIGTERM its supervisor forwarded) is done (the marker is written
  for it), anything else a failure: the job is restarted, counting against
  `recovery.max_failures` (exhausted → exit 3); a crash loop (no new checkpoint across the last
  `crashloop_restarts` restarts) → exit 3.

Whenever it gives up (a budget, a crash loop, FAILED) the QR is deleted unless `keep`. Budgets
count within one `Babysitter.run()`; the journal keeps the history across runs. Nothing here
prints, sleeps on its own or exits: every dependency (the QR, the fleet, job operations, storage,
journal, clock) is injected, and every decision goes to `on_event` and the journal.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from tpuctl.clock import Clock
from tpuctl.cloud.watcher import GONE, SUSPENDED_STATES, WatchPolicy
from tpuctl.envelope import Result
from tpuctl.errors import (
    ApiUnavailableError,
    DeadlineError,
    Interrupted,
    NotFoundError,
    QueuedResourceFailed,
    TpuctlError,
)
from tpuctl.jobs.adapters import (
    FanoutJobOps,
    JobOps,
    JobRecord,
    JournalLike,
    LeaseLike,
    QueuedResourceOps,
    StorageJobRecord,
)
from tpuctl.jobs.job_watch import JobDone, JobWatch
from tpuctl.jobs.qr_watch import QrWatch
from tpuctl.storage.lease import LeaseLost

if TYPE_CHECKING:
    from tpuctl.cloud.resolve import Location
    from tpuctl.fanout.operations import Fleet
    from tpuctl.spec.model import Spec
    from tpuctl.storage.lease import Holder, Lease


@dataclass(frozen=True)
class UpEvent:
    """One decision or observation: printed by the CLI, appended to the journal."""

    at: datetime
    kind: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpOptions:
    keep: bool = False
    poll: float | None = None  # steady ACTIVE poll spacing; None: the watcher's (6 s + jitter)
    job_check_every: float = 20.0  # per-worker job status over SSH
    # After every worker ended the job, how long the nodes must stay undisturbed before it
    # counts as done (all exited 0) or failed: long enough for an autocheckpoint reboot to show.
    settle: float = 120.0
    crashloop_restarts: int = 2
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    keep_on_timeout: bool = False
    start_attempts: int = 3  # deliver_and_start tries (SSH right after ACTIVE can be early)
    running_timeout: float = 600.0  # after a start, how long the job may take to be running
    resume_hint: str | None = None  # e.g. "tpuctl up job.yaml", for the Ctrl-C message
    wait_for_lease: bool = False  # another up holds the run: wait for it instead of exiting
    # The zones to queue in, tried as the spec's zone_policy says; empty: the QR's own zone.
    zones: tuple[str, ...] = ()


def up_options(
    spec: Spec,
    *,
    queue_timeout: float | None = None,
    provision_timeout: float | None = None,
    **settings: Any,
) -> UpOptions:
    """UpOptions from `up`'s flags, the spec's deadlines filling the ones not given."""
    if queue_timeout is None and spec.deadlines.queue is not None:
        queue_timeout = spec.deadlines.queue.total_seconds()
    if provision_timeout is None and spec.deadlines.provision is not None:
        provision_timeout = spec.deadlines.provision.total_seconds()
    return UpOptions(queue_timeout=queue_timeout, provision_timeout=provision_timeout, **settings)


def run_lease(spec: Spec, location: Location, *, command: str) -> Lease:
    """The lease of the spec's run: next to its journal, or without checkpoint.dir in this
    user's state directory (which guards this machine only)."""
    from tpuctl.storage.lease import Lease, local_lease_storage, path_of
    from tpuctl.worker import lease_location

    url = lease_location(spec)
    if url is not None:
        storage, name = path_of(url)
        return Lease(storage, name, command=command)
    storage = local_lease_storage(location.project, location.zone)
    return Lease(storage, f"{spec.name}.json", command=command)


@dataclass
class UpResult(Result):
    """How `tpuctl up` ended (only success prints this; the rest are errors with exit codes)."""

    KIND: ClassVar[str] = "Up"
    name: str
    outcome: str  # "done"
    preemptions: int = 0
    failures: int = 0
    restarts: int = 0
    latest_step: int | None = None
    deleted: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    zone: str | None = None  # where the job ran last


class Babysitter:
    """`Babysitter(spec, api, fleet_factory=…).run()`: see the module docstring."""

    def __init__(
        self,
        spec: Spec,
        qr: QueuedResourceOps,
        *,
        fleet_factory: Callable[..., Fleet],  # (zone=…) → the workers there
        jobs: JobOps | None = None,
        record: JobRecord | None = None,
        journal: JournalLike | None = None,
        options: UpOptions | None = None,
        clock: Clock | None = None,
        on_event: Callable[[UpEvent], None] | None = None,
        rng: random.Random | None = None,
        stop_requested: Callable[[], bool] | None = None,
        lease: LeaseLike | None = None,
    ) -> None:
        self.spec = spec
        # Ctrl-C inside an SSH fan-out is absorbed by the engine (it returns an interrupted
        # result), so the CLI also raises a flag, checked after every step.
        self.stop_requested = stop_requested or (lambda: False)
        self.qr = qr
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
        self.job = JobWatch(self)
        self.qr_watch = QrWatch(self)
        self.lease = lease
        self._fleet: Fleet | None = None

    # --------------------------------------------------------------------------- plumbing

    def emit(self, kind: str, message: str, **fields: Any) -> None:
        """Say and journal a decision; its `zone` is the run's current zone unless given."""
        fields.setdefault("zone", self.qr.zone)
        event = UpEvent(self.clock.now(), kind, message, fields)
        if self.journal is not None:
            self.journal.append(kind, message=message, **fields)
        self.on_event(event)

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            self._fleet = self.fleet_factory(zone=self.qr.zone)
        return self._fleet

    def forget_fleet(self) -> None:
        """Resolve the workers again on next use (new addresses or host keys)."""
        self._fleet = None

    def check_stop(self) -> None:
        if self.stop_requested():
            raise KeyboardInterrupt

    # --------------------------------------------------------------------------- entry point

    def run(self) -> UpResult:
        """Babysit until done; raise the TpuctlError whose exit code says how it ended.

        The run's lease is taken first: with another `up` alive on it, LeaseHeld before
        anything is written or done (or, `wait_for_lease`, a wait until it ends)."""
        self._take_lease()
        try:
            return self._run()
        finally:
            if self.lease is not None:
                self.lease.release()

    def _take_lease(self) -> None:
        if self.lease is None:
            return
        said: list[str] = []

        def waiting(holder: Holder) -> None:
            if not said:
                said.append(holder.id)
                message = f"{self.name}: waiting for {holder.describe(self.clock.now())} to end"
                self.on_event(UpEvent(self.clock.now(), "lease.waiting", message, {}))

        previous = self.lease.acquire(wait=self.options.wait_for_lease, on_wait=waiting)
        if previous is not None:
            self.emit(
                "lease.taken_over",
                f"{self.name}: took the run over from {previous.describe(self.clock.now())}",
                previous_host=previous.host,
                previous_pid=previous.pid,
            )

    def renew_lease(self) -> None:
        """Keep the lease (called on every poll, waits included); LeaseLost if taken over."""
        if self.lease is not None:
            self.lease.renew_if_due()

    def _run(self) -> UpResult:
        recovery = self.spec.recovery
        self.result.started_at = self.clock.now()
        zones = list(self.options.zones or (self.qr.zone,))
        where = ""
        if len(zones) > 1:
            where = f"; zones {', '.join(zones)}, {self.spec.capacity.zone_policy}"
        self.emit(
            "up.start",
            f"babysitting {self.name} (run {self.spec.run_name}; budgets: "
            f"{recovery.max_preemptions} preemptions, {recovery.max_failures} job failures"
            f"{where})",
            name=self.name,
            run=self.spec.run_name,
            max_preemptions=recovery.max_preemptions,
            max_failures=recovery.max_failures,
            keep=self.options.keep,
            zones=zones,
            zone_policy=self.spec.capacity.zone_policy,
        )
        try:
            self._babysit()
        except JobDone:
            self._finish()
        except (KeyboardInterrupt, Interrupted) as interrupted:
            error = self._interrupted()
            self._exit(error)
            raise error from (interrupted if isinstance(interrupted, Interrupted) else None)
        except TpuctlError as error:
            self._give_up(error)
            self._exit(error)
            raise
        self.result.outcome = "done"
        self.result.zone = self.qr.zone
        self.result.finished_at = self.clock.now()
        self.emit("up.exit", f"{self.name}: done", exit_code=0, outcome="done")
        return self.result

    def _give_up(self, error: TpuctlError) -> None:
        """Whatever made `up` give up (a budget, a crash loop, FAILED), the queued resource is
        not left billing: deleted unless --keep, and said so. (A FAILED one can still hold
        ACTIVE slices. Deadlines are handled by the wait, Ctrl-C leaves it on purpose.)"""
        if isinstance(error, LeaseLost):
            return  # another up babysits the run now: it decides
        if isinstance(error, ApiUnavailableError):
            # Nothing can be deleted while the API is down: name what is left and the way on.
            resume = self._resume_command()
            error.hint = (
                f"{self.name} and its job may still be running: resume with: {resume}  or "
                f"delete it with: {self._delete_commands()}"
            )
            error.details["deleted"] = False
            return
        if self.qr_watch.state == GONE or isinstance(error, DeadlineError):
            return
        if self.options.keep:
            command = self.qr.delete_command()
            self.emit("qr.kept", f"kept {self.name} (--keep); delete it with: {command}")
            error.details["deleted"] = False
            return
        try:
            self.qr.delete()
        except TpuctlError as failure:
            command = self.qr.delete_command()
            self.emit(
                "qr.delete_failed",
                f"could not delete {self.name} after giving up ({failure.message}); delete it "
                f"with: {command}",
            )
            error.details["deleted"] = False
            return
        self.qr_watch.state = GONE
        self.emit("qr.deleted", f"deleted {self.name}: gave up ({error.kind})", reason="gave up")
        error.details["deleted"] = True

    def _exit(self, error: TpuctlError) -> None:
        self.emit(
            "up.exit",
            f"tpuctl up exits with {int(error.exit_code)} ({error.kind})",
            exit_code=int(error.exit_code),
            outcome=error.kind,
            reason=error.message,
        )

    def _resume_command(self) -> str:
        """The command that picks this run up again, every word shell-quoted."""
        return self.options.resume_hint or shlex.join(["tpuctl", "up", self.spec.source])

    def _delete_commands(self) -> str:
        """The command that deletes the run's QR, and those of a race's other zones."""
        others = self.qr_watch.queued_elsewhere()
        return "  and  ".join(ops.delete_command() for ops in [self.qr, *others])

    def _interrupted(self) -> Interrupted:
        state = self.qr_watch.state or "unknown"
        resume = self._resume_command()
        delete = self._delete_commands()
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
            raise JobDone
        existed = self.qr_watch.bring_up()
        self.job.start(resume_existing=existed)
        while True:
            self.clock.sleep(self._next_delay())
            self._poll_once()

    def _next_delay(self) -> float:
        now = self.clock.monotonic()
        if self.qr_watch.fast_polls > 0 or self.job.awaiting_running_since is not None:
            self.qr_watch.fast_polls = max(0, self.qr_watch.fast_polls - 1)
            delay = self.rng.uniform(0.5, 1.0)
        elif self.options.poll is not None:
            delay = self.options.poll
        else:
            policy = WatchPolicy()
            delay = policy.slow_min * (1.0 + self.rng.uniform(0.0, policy.slow_jitter))
        return max(0.0, min(delay, self.job.next_check - now))

    def _poll_once(self) -> None:
        self.check_stop()
        self.renew_lease()
        try:
            observation = self.qr.observe()
        except ApiUnavailableError as error:
            # Nothing is decided blind: the job runs on, and up waits for the API with it.
            self.qr_watch.outage(error)
            return
        self.qr_watch.recovered()
        watch = self.qr_watch
        changed = watch.saw_state(observation.state, observation.initiator, observation.failure)
        if self.record.is_done():
            self.emit("job.done", f"{self.name}: the done marker appeared")
            raise JobDone
        state = observation.state
        if state == GONE:
            raise NotFoundError(
                f"{self.name} was deleted while tpuctl up was babysitting it",
                hint=f"create it again with: {self.options.resume_hint or 'tpuctl up SPEC'}",
                name=self.name,
            )
        if state == "SUSPENDED" or (state == "FAILED" and self.qr_watch.ever_active):
            self.qr_watch.recover(state, observation.initiator, observation.failure)
            return
        if state == "FAILED":
            raise QueuedResourceFailed(
                f"{self.name} FAILED before it was ever ACTIVE: {observation.failure}",
                hint=self.qr.delete_command(),
                name=self.name,
                state=state,
            )
        if state in SUSPENDED_STATES:  # SUSPENDING: SUSPENDED follows within seconds
            self.qr_watch.fast_polls = 3
            return
        if state == "ACTIVE" and (changed or self.clock.monotonic() >= self.job.next_check):
            self.job.check()

    def _finish(self) -> None:
        checkpoint = self.record.latest_checkpoint()
        self.result.latest_step = checkpoint[0] if checkpoint else self.result.latest_step
        if self.options.keep:
            self.emit("qr.kept", f"kept {self.name} (--keep)")
            return
        deleted = self.qr.delete()
        self.result.deleted = deleted.action in ("deleted", "delete_requested")
        self.qr_watch.state = GONE
        self.emit("qr.deleted", f"deleted {self.name}: the job is done", reason="done")
