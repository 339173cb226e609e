"""`tpuctl up`: reconcile steps in a loop with their waits, and the live account of each.

Every decision is the reconcile step's (tpuctl.jobs.reconcile): one decision path whether a
person runs `up` or a scheduler runs `tpuctl reconcile` every minute. What `up` adds is the
loop: it holds the run's lease for its whole life (a second `up` or a scheduler's step finds
it held), waits as long as each decision says, rides out a TPU API outage, and turns how the
run ended into its exit: done (0), or the give-up's error with its exit code.

`up` on a run that gave up, or that `tpuctl delete` stopped, starts a new attempt with fresh
budgets (a scheduler's step never does); on a run that is done it says so and how to run it
again. Ctrl-C leaves the queued resource and the job running and says how to resume or delete.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from tpuctl.clock import Clock
from tpuctl.envelope import Result
from tpuctl.errors import ApiUnavailableError, Interrupted, TpuctlError, UsageError
from tpuctl.jobs.reconcile.decision import (
    DONE,
    FINISH,
    GIVE_UP,
    GIVEN_UP,
    NOTHING,
    STOPPED,
    Decision,
    Policy,
)
from tpuctl.jobs.reconcile.step import Said, StepResult, StoreLike, give_up_error, run_step
from tpuctl.jobs.reconcile.world import World

if TYPE_CHECKING:
    from tpuctl.jobs.adapters import LeaseLike
    from tpuctl.spec.model import Spec
    from tpuctl.storage.lease import Holder

# How long `up` declares its lease good for after each heartbeat: a laptop that sleeps longer
# than this hands the run to whichever supervisor steps next.
UP_STALE_AFTER = 180.0
SLEEP_SLICE = 0.5  # a wait is cut into slices this long, so Ctrl-C stops it at once
# Journaled for the next step (a delete about to be sent), not worth a line: the entry after
# it says what happened.
QUIET_KINDS = frozenset({"qr.deleting"})


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
    poll: float | None = None  # steady spacing of steps while nothing changes (6 s default)
    job_check_every: float = 20.0  # a running job's workers are read this often
    # After every worker ended the job, how long the nodes must stay undisturbed before it
    # counts as done (all exited 0) or failed: long enough for an autocheckpoint reboot to show.
    settle: float = 120.0
    crashloop_restarts: int = 2
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    keep_on_timeout: bool = False
    start_attempts: int = 3  # deliveries tried (SSH right after ACTIVE can be early)
    running_timeout: float = 600.0  # after a start, how long the job may take to be running
    resume_hint: str | None = None  # e.g. "tpuctl up job.yaml", for the Ctrl-C message
    wait_for_lease: bool = False  # another supervisor holds the run: wait for it
    # The zones to queue in, tried as the spec's zone_policy says; empty: the spec's.
    zones: tuple[str, ...] = ()
    # On a capacity ladder, every new bring-up (after a preemption or a run's end) starts
    # from the first rung again.
    prefer_cheapest: bool = False
    # Stop once the job runs and hand the run over (to a scheduler's tpuctl reconcile).
    detach: bool = False


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


def policy_of(
    spec: Spec, options: UpOptions, default_zone: str, *, delete_kept: bool = True
) -> Policy:
    """What a decision needs of the spec and the options (tpuctl reconcile uses the same,
    with `delete_kept` False: what a person kept stays)."""
    from tpuctl.spec.ladder import rung_names, rung_specs

    recovery = spec.recovery
    own_zones = {rung.zones for rung in rung_specs(spec)}
    if len(own_zones) > 1:
        raise UsageError(
            f"{spec.name}: the rungs of capacity.fallback queue in different zones, and a "
            "supervised run queues every rung in the same zones",
            hint="give the zones once, in capacity.zones, and none in the rungs",
        )
    return Policy(
        name=spec.name,
        zones=tuple(options.zones or spec.zones or (default_zone,)),
        zone_policy=spec.capacity.zone_policy,
        claims_zone=spec.claims_zone,
        max_preemptions=recovery.max_preemptions,
        max_failures=recovery.max_failures,
        queue_timeout=options.queue_timeout,
        provision_timeout=options.provision_timeout,
        keep=options.keep,
        keep_on_timeout=options.keep_on_timeout,
        delete_kept=delete_kept,
        settle=options.settle,
        running_timeout=options.running_timeout,
        crashloop_restarts=options.crashloop_restarts,
        start_attempts=options.start_attempts,
        poll=options.poll if options.poll is not None else 6.0,
        job_check_every=options.job_check_every,
        rungs=rung_names(spec),
        prefer_cheapest=options.prefer_cheapest,
    )


@dataclass
class UpResult(Result):
    """How `tpuctl up` ended (only success prints this; the rest are errors with exit codes)."""

    KIND: ClassVar[str] = "Up"
    name: str
    outcome: str  # done | stopped | detached (--detach: the job runs, handed over)
    preemptions: int = 0
    failures: int = 0
    restarts: int = 0
    latest_step: int | None = None
    deleted: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    zone: str | None = None  # where the job ran last
    message: str | None = None
    already: bool = False  # it was over before this up began: nothing was done
    # --detach: who takes the run on (target, the command, whether it was installed, the
    # commands that install and remove it); None otherwise.
    supervisor: dict[str, Any] | None = None


class Supervisor:
    """`Supervisor(spec, world, store, policy, …).run()`: see the module doc."""

    def __init__(
        self,
        spec: Spec,
        world: World,
        store: StoreLike,
        policy: Policy,
        *,
        options: UpOptions | None = None,
        clock: Clock | None = None,
        on_event: Callable[[UpEvent], None] | None = None,
        stop_requested: Callable[[], bool] | None = None,
        lease: LeaseLike | None = None,
    ) -> None:
        self.spec = spec
        self.world = world
        self.store = store
        self.policy = policy
        self.options = options or UpOptions()
        self.clock = clock or world.clock
        self.on_event = on_event or (lambda _event: None)
        # Ctrl-C inside an SSH fan-out is absorbed by the engine (it returns an interrupted
        # result), so the CLI also raises a flag, checked between steps and inside waits.
        self.stop_requested = stop_requested or (lambda: False)
        self.lease = lease
        self.last: StepResult | None = None
        self.acted = False  # a step of this up decided something (wrote an entry)

    def _said(self, said: Said) -> None:
        if said.kind in QUIET_KINDS:
            return
        self.on_event(UpEvent(said.at, said.kind, said.message, said.fields))

    def _say(self, kind: str, message: str, **fields: Any) -> None:
        """Say something that is not the run's history (it is not journaled)."""
        self.on_event(UpEvent(self.clock.now(), kind, message, fields))

    # ------------------------------------------------------------------------ the loop

    def run(self) -> UpResult:
        """Step until the run is done; raise the TpuctlError whose exit code says how it
        ended otherwise."""
        self._take_lease()
        try:
            return self._loop()
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
                self._say(
                    "lease.waiting",
                    f"{self.spec.name}: waiting for {holder.describe(self.clock.now())} to end",
                )

        previous = self.lease.acquire(wait=self.options.wait_for_lease, on_wait=waiting)
        if previous is not None:
            self._say(
                "lease.taken_over",
                f"{self.spec.name}: took the run over from {previous.describe(self.clock.now())}",
            )

    def _check(self) -> None:
        if self.stop_requested():
            raise KeyboardInterrupt
        if self.lease is not None:
            self.lease.renew_if_due()

    def _journal(self, kind: str, message: str, **fields: Any) -> None:
        """up's own beginning and end, beside the steps' entries (report reads them)."""
        try:
            self.store.append(kind, message, fields)
        except TpuctlError:
            return

    def _loop(self) -> UpResult:
        started = self.clock.now()
        first = True
        self._journal("up.start", f"{self.spec.name}: tpuctl up supervises the run")
        try:
            result = self._steps(started, first)
        except TpuctlError as error:
            self._journal(
                "up.exit",
                f"tpuctl up exits with {int(error.exit_code)} ({error.kind})",
                exit_code=int(error.exit_code),
                outcome=error.kind,
                reason=error.message,
            )
            raise
        self._journal(
            "up.exit", f"{self.spec.name}: {result.outcome}", exit_code=0, outcome=result.outcome
        )
        return result

    def _steps(self, started: datetime, first: bool) -> UpResult:
        gave_up: Decision | None = None
        try:
            while True:
                self._check()
                result = run_step(
                    self.world,
                    self.store,
                    self.policy,
                    on_said=self._said,
                    new_attempt=first,
                    check=self._check,
                )
                if first:
                    self._first_account(result)
                first = False
                self.last = result
                self.acted = self.acted or any(s.kind not in QUIET_KINDS for s in result.said)
                if result.api_unavailable is not None:
                    raise self._outage(result.api_unavailable)
                decision = result.decision
                if decision.action == GIVE_UP:
                    gave_up = decision
                over = decision.action in (FINISH, NOTHING)
                if over and decision.outcome in (DONE, STOPPED):
                    return self._ended(result, started)
                if self.options.detach and decision.running is not None:
                    return self._ended(result, started, detached=True)
                if over and decision.outcome == GIVEN_UP:
                    # Once what it gave up on is gone (or kept): its error, its exit code.
                    reason = gave_up if gave_up is not None else decision
                    raise give_up_error(
                        reason.give_up, deleted=gave_up is not None and bool(gave_up.zones)
                    )
                self._sleep(decision.next_in)
        except (KeyboardInterrupt, Interrupted) as interrupted:
            raise self._interrupted() from (
                interrupted if isinstance(interrupted, Interrupted) else None
            )

    def _first_account(self, result: StepResult) -> None:
        """A new up on a run under way says where it stands, even when nothing changed."""
        decision = result.decision
        if any(said.kind not in QUIET_KINDS for said in result.said):
            return
        if decision.running is not None:
            self._say(
                "up.picked_up",
                f"{self.spec.name}: the job is already running ({decision.running}); "
                "supervising it without a restart",
            )
        elif decision.action not in (FINISH, NOTHING):
            self._say("up.status", decision.message)

    def _sleep(self, seconds: float) -> None:
        end = self.clock.monotonic() + max(0.0, seconds)
        while True:
            left = end - self.clock.monotonic()
            if left <= 0:
                return
            self.clock.sleep(min(SLEEP_SLICE, left))
            self._check()

    def _ended(self, result: StepResult, started: datetime, *, detached: bool = False) -> UpResult:
        record, seen = result.record, result.seen
        present = seen.present()
        outcome = "done" if result.decision.outcome == DONE else "stopped"
        message = result.decision.message
        if detached:
            outcome = "detached"
            message = (
                f"{self.spec.name}: the job runs ({result.decision.running}); handed over: "
                "nothing supervises it until a scheduler steps it"
            )
        zone = record.job_zone
        return UpResult(
            name=self.spec.name,
            outcome=outcome,
            preemptions=record.preemptions,
            failures=record.failures,
            restarts=record.restarts,
            latest_step=seen.latest_step,
            deleted=not present and not record.kept,
            started_at=started,
            finished_at=self.clock.now(),
            zone=zone or (self.policy.zones[0] if len(self.policy.zones) == 1 else None),
            message=message,
            already=not self.acted and not detached,
        )

    # ------------------------------------------------------------------------ endings

    def resume_command(self) -> str:
        """The command that picks this run up again, every word shell-quoted."""
        return self.options.resume_hint or shlex.join(["tpuctl", "up", self.spec.source])

    def _delete_commands(self) -> str:
        seen = self.last.seen if self.last is not None else None
        zones = [s.zone for s in seen.present()] if seen is not None else []
        zones = zones or [self.policy.zones[0]]
        return "  and  ".join(self.world.slices.delete_command(zone) for zone in zones)

    def _interrupted(self) -> Interrupted:
        seen = self.last.seen if self.last is not None else None
        states = ", ".join(f"{s.zone} {s.state}" for s in seen.present()) if seen else ""
        resume = self.resume_command()
        delete = self._delete_commands()
        return Interrupted(
            f"interrupted: stopped supervising {self.spec.name}"
            + (f" ({states})" if states else "")
            + "; the queued resource and the job were left running",
            hint=f"resume with: {resume}  (it picks up the running job)  or delete it: {delete}",
            name=self.spec.name,
            state=states or "unknown",
            deleted=False,
            delete_command=delete,
            resume_command=resume,
        )

    def _outage(self, why: str) -> TpuctlError:
        """An action (a create, a delete) could not be sent: the API is down. What is left is
        named with the commands that resume or delete it."""
        return ApiUnavailableError(
            f"{self.spec.name}: the TPU API is unavailable ({why})",
            hint=f"{self.spec.name} and its job may still be running: resume with: "
            f"{self.resume_command()}  or delete it with: {self._delete_commands()}",
            name=self.spec.name,
            deleted=False,
        )
