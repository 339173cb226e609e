"""The queued-resource side of `tpuctl up`: follow its state, bring it up in one of the run's
zones (tpuctl.jobs.zone_choice), and recreate it after a spot preemption (or a FAILED after
ACTIVE), counting against the preemption budget; a recreate follows the zone policy again.

`QrWatch` belongs to one Babysitter (tpuctl.jobs.up), whose injected QR operations, record,
journal and clock it uses (what it needs of its owner is `QrOwner`); the job side is
tpuctl.jobs.job_watch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tpuctl.clock import format_duration
from tpuctl.cloud.watcher import (
    GONE,
    OUTAGE_REPORT_EVERY,
    SUSPENDED_STATES,
    WatchEvent,
    WatchPolicy,
)
from tpuctl.errors import ApiUnavailableError, PreemptedError, QueuedResourceFailed
from tpuctl.jobs.zone_choice import Found, ZoneChoice

if TYPE_CHECKING:
    from tpuctl.clock import Clock
    from tpuctl.jobs.adapters import JobRecord, QueuedResourceOps
    from tpuctl.jobs.job_watch import JobWatch
    from tpuctl.spec.model import Spec


class QrSettings(Protocol):
    """What the QR watch reads of `up`'s options (tpuctl.jobs.up.UpOptions)."""

    @property
    def queue_timeout(self) -> float | None: ...
    @property
    def provision_timeout(self) -> float | None: ...
    @property
    def keep_on_timeout(self) -> bool: ...
    @property
    def zones(self) -> tuple[str, ...]: ...


class QrTally(Protocol):
    """The count of `up`'s result the QR watch keeps (tpuctl.jobs.up.UpResult)."""

    preemptions: int


class QrOwner(Protocol):
    """What a QrWatch needs of the babysitter that owns it (tpuctl.jobs.up.Babysitter); `qr`
    is replaced when a bring-up moves to another zone."""

    qr: QueuedResourceOps

    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> Spec: ...
    @property
    def options(self) -> QrSettings: ...
    @property
    def result(self) -> QrTally: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def record(self) -> JobRecord: ...
    @property
    def job(self) -> JobWatch: ...
    def emit(self, kind: str, message: str, **fields: Any) -> None: ...
    def forget_fleet(self) -> None: ...
    def check_stop(self) -> None: ...
    def renew_lease(self) -> None: ...


class QrWatch:
    """The queued resource's state as `up` last saw it, and the recoveries it ran."""

    def __init__(self, owner: QrOwner) -> None:
        self.owner = owner
        self.state: str | None = None
        self.ever_active = False
        self.fast_polls = 0  # polls to make quickly after a change
        self.outage_since: float | None = None  # monotonic, while the TPU API is down
        self.outage_said = 0.0
        self.choice: ZoneChoice | None = None  # the latest bring-up across the run's zones

    def outage(self, error: ApiUnavailableError) -> None:
        """The API is down: say so at once, then every OUTAGE_REPORT_EVERY seconds."""
        owner = self.owner
        now = owner.clock.monotonic()
        if self.outage_since is None:
            self.outage_since = now
        elif now - self.outage_said < OUTAGE_REPORT_EVERY:
            return
        self.outage_said = now
        owner.emit(
            "api.unavailable",
            f"{owner.name}: the TPU API is unavailable for "
            f"{format_duration(now - self.outage_since)} ({error.message}); the job runs on, "
            "nothing is decided until the API answers",
            status=error.details.get("status"),
        )

    def recovered(self) -> None:
        if self.outage_since is None:
            return
        owner = self.owner
        lasted = owner.clock.monotonic() - self.outage_since
        self.outage_since = None
        owner.emit(
            "api.available",
            f"{owner.name}: the TPU API answers again after {format_duration(lasted)}",
        )

    def saw_state(self, state: str, initiator: str | None, failure: str | None) -> bool:
        owner = self.owner
        if state == self.state:
            return False
        previous = self.state
        self.state = state
        if state == "ACTIVE":
            self.ever_active = True
        self.fast_polls = 3
        why = f" (initiated by {initiator})" if initiator and state in SUSPENDED_STATES else ""
        why += f": {failure}" if failure and state == "FAILED" else ""
        arrow = f"{previous} → {state}" if previous else state
        owner.emit(
            "qr.state",
            f"{owner.name}: {arrow}{why}",
            state=state,
            previous=previous,
            initiator=initiator,
            failure=failure,
        )
        return True

    def on_watch(self, event: WatchEvent) -> None:
        owner = self.owner
        owner.renew_lease()  # a wait may last hours: the lease lives on through its polls
        if event.kind == "state":
            observation = event.observation
            self.saw_state(
                event.state,
                observation.initiator if observation else None,
                observation.failure if observation else None,
            )
        elif event.kind == "warning":
            owner.emit("qr.warning", f"{owner.name}: {event.message}", state=event.state)

    def zone_choice(self) -> ZoneChoice:
        """A bring-up across the run's zones (UpOptions.zones, else the QR's own zone)."""
        owner = self.owner
        options = owner.options
        policy = WatchPolicy(
            until="ACTIVE",
            queue_timeout=options.queue_timeout,
            provision_timeout=options.provision_timeout,
        )

        def moved(ops: QueuedResourceOps) -> None:
            owner.qr = ops

        def tick() -> None:
            owner.renew_lease()
            owner.check_stop()

        self.choice = ZoneChoice(
            owner.spec,
            owner.qr,
            options.zones or (owner.qr.zone,),
            owner.record,
            wait_policy=policy,
            keep_on_timeout=options.keep_on_timeout,
            clock=owner.clock,
            emit=owner.emit,
            on_watch=self.on_watch,
            on_zone=moved,
            tick=tick,
        )
        return self.choice

    def bring_up(self) -> bool:
        """Create (or accept) the QR in one of the run's zones and wait for ACTIVE; recreate it
        on preemption.

        Returns whether an ACTIVE QR existed already (the job may be running on it).
        """
        owner = self.owner
        choice = self.zone_choice()
        found = choice.find()
        current = choice.pick(found)
        existed_active = False
        if current is not None:
            owner.qr, existing = current
            self.saw_state(existing.state, existing.initiator, existing.failure)
            if existing.state in SUSPENDED_STATES:
                self.recover(existing.state, existing.initiator, None, restart_job=False)
                return False
            existed_active = existing.state == "ACTIVE"
        try:
            self.acquire(choice, found)
        except PreemptedError as error:
            self.recover(str(error.details.get("state") or "SUSPENDED"), None, None, False)
            return False
        except QueuedResourceFailed as error:
            if not self.ever_active:
                raise
            self.recover("FAILED", None, error.details.get("reason"), restart_job=False)
            return False
        return existed_active

    def acquire(self, choice: ZoneChoice, found: list[Found], again: int | None = None) -> None:
        """Bring the QR up under the zone policy (taking up what `found` holds) until ACTIVE."""
        owner = self.owner
        owner.qr = choice.bring_up(found, again=again)
        self.state = "ACTIVE"
        self.ever_active = True
        owner.forget_fleet()  # new workers (or host keys) after a (re)create

    def queued_elsewhere(self) -> list[QueuedResourceOps]:
        """Queued resources of a race still running (Ctrl-C leaves them), the run's own aside."""
        racers = self.choice.racers if self.choice is not None else []
        return [ops for ops in racers if ops.zone != self.owner.qr.zone]

    def recover(
        self,
        state: str,
        initiator: str | None,
        failure: str | None,
        restart_job: bool = True,
    ) -> None:
        """Delete a SUSPENDED (or FAILED after ACTIVE) QR and create it again."""
        owner = self.owner
        max_preemptions = owner.spec.recovery.max_preemptions
        owner.result.preemptions += 1
        count = owner.result.preemptions
        checkpoint = owner.record.latest_checkpoint()
        last = owner.job.last_step
        cause = "spot preemption" if state in SUSPENDED_STATES else f"{state}: {failure}"
        owner.emit(
            "preemption.detected",
            f"{owner.name} is {state} ({cause}"
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
            step_seconds=owner.job.step_seconds,
        )
        owner.job.disruption = "preemption"
        owner.qr.delete()
        self.state = GONE
        if count > max_preemptions:
            owner.emit(
                "qr.deleted",
                f"deleted {owner.name}: a {state} queued resource is never re-allocated",
                reason="preemption budget exhausted",
            )
            raise PreemptedError(
                f"{owner.name} was preempted {count} times; recovery.max_preemptions is "
                f"{max_preemptions}: gave up (the queued resource was deleted)",
                hint="raise recovery.max_preemptions, or use another capacity tier",
                name=owner.name,
                preemptions=count,
            )
        owner.emit("qr.deleted", f"deleted {owner.name} to recreate it", reason="recreate")
        choice = self.zone_choice()  # the zone policy again, from the first zone
        try:
            self.acquire(choice, choice.find(), again=count)
        except PreemptedError as error:
            self.recover(str(error.details.get("state") or "SUSPENDED"), None, None, False)
        except QueuedResourceFailed as error:
            self.recover("FAILED", None, error.details.get("reason"), restart_job=False)
        if restart_job:
            owner.job.start(resume_existing=False)
