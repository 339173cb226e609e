"""Which zone a run's queued resource lives in: a spec's zones tried one after another
(`sequential`) or all at once (`first-active`), and the zone claim that lets its job start in
one zone only. `create --wait` brings a queued resource up
through a ZoneChoice.

sequential: create in the first zone and wait with the spec's deadlines; at a deadline the wait
deletes what it gave up on (lifecycle.wait), and only once it is gone is the next zone tried.
A request that FAILS before it was ever ACTIVE is deleted and the next zone tried too. One
queued resource exists at a time, so one job at most can run.

first-active: create in every zone at once (same spec, same run name), watch them side by side
(one Watcher each, stepped when its poll is due), and when one is ACTIVE delete every other,
then claim the run for the winner's zone (tpuctl.storage.zone_claim). Deleting fast is not
what keeps a second copy of the job from running: VMs boot and run the startup script while
their queued resource is still PROVISIONING, so two zones filled together would both boot.
The startup script of such a spec launches the job only where the claim names its own zone
(tpuctl/render/startup.sh, step 4b), and the claim changes only when no queued resource exists
in the zone it names (withdrawn before a race, written once a winner is alone). Whatever the
timing, at most one zone's workers can pass the gate.

With one zone the errors are those of lifecycle.wait, unchanged; with several, the last zone's
error names every zone tried and what happened there (`zones` in its details).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.results import CreateResult
from tpuctl.cloud.watcher import GONE, Outcome, Watcher, WatchEvent, WatchPolicy
from tpuctl.errors import (
    DeadlineError,
    QueuedResourceFailed,
    ResourceExhaustedError,
    TpuctlError,
)

if TYPE_CHECKING:
    from tpuctl.clock import Clock
    from tpuctl.cloud import lifecycle
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.watcher import Observation
    from tpuctl.jobs.adapters import JobRecord, QueuedResourceOps
    from tpuctl.spec.model import Spec

# emit(kind, message, **fields): a decision or observation, for the journal and stderr.
Emit = Callable[..., None]
Found = tuple["QueuedResourceOps", "Observation"]


@dataclass(frozen=True)
class ZoneAttempt:
    """A zone tried and given up: how it ended there (the error's kind) and its message."""

    zone: str
    outcome: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"zone": self.zone, "outcome": self.outcome, "message": self.message}


class ZoneChoice:
    """Bring `spec`'s queued resource up in one of `zones` under its zone_policy."""

    def __init__(
        self,
        spec: Spec,
        qr: QueuedResourceOps,
        zones: Sequence[str],
        record: JobRecord,
        *,
        wait_policy: WatchPolicy,
        keep_on_timeout: bool,
        clock: Clock,
        emit: Emit,
        on_watch: Callable[[WatchEvent], None] | None = None,
        on_zone: Callable[[QueuedResourceOps], None] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.name = qr.name
        self.qr = qr
        self.zones = list(zones) or [qr.zone]
        self.record = record
        self.wait_policy = wait_policy
        self.keep_on_timeout = keep_on_timeout
        self.clock = clock
        self.emit = emit
        self.on_watch = on_watch
        self.on_zone = on_zone or (lambda _ops: None)
        self.tick = tick or (lambda: None)
        self.racing = len(self.zones) > 1 and spec.capacity.zone_policy == "first-active"
        self.racers: list[QueuedResourceOps] = []  # queued while a race runs, for Ctrl-C
        self.claimed_late = False  # the claim came after the winner's VMs may have booted
        self.created = False  # the queued resource brought up was created here
        self.request_id: str | None = None
        self.waited: Any = None  # what the winner's wait returned (a WaitResult), if anything

    # ------------------------------------------------------------------------- where it is

    def find(self) -> list[Found]:
        """Every zone holding the run's queued resource, in the zones' order."""
        found = []
        for zone in self.zones:
            ops = self.qr.in_zone(zone)
            observation = ops.observe()
            if observation.state != GONE:
                found.append((ops, observation))
        return found

    def pick(self, found: Sequence[Found]) -> Found | None:
        """The one the run carries on with: the claimed zone's, else the first ACTIVE, else
        the first found."""
        if not found:
            return None
        claimed = self.record.claimed_zone() if self.spec.claims_zone else None
        for candidate in found:
            if candidate[0].zone == claimed:
                return candidate
        for candidate in found:
            if candidate[1].state == "ACTIVE":
                return candidate
        return found[0]

    # ------------------------------------------------------------------------- bringing up

    def bring_up(self, found: Sequence[Found], *, again: int | None = None) -> QueuedResourceOps:
        """Create (or take up what `found` holds) and wait until one is ACTIVE; returns it.
        `again`: a recreate after the `again`-th preemption (said as such)."""
        if self.racing:
            return self._race(found, again)
        current = self.pick(found)
        for ops, _observation in found:  # one zone at a time: anything else is a leftover
            if current is not None and ops is not current[0]:
                self._delete(ops, f"the run carries on in {current[0].zone}")
        start = self.zones.index(current[0].zone) if current is not None else 0
        first = current[0] if current is not None else None
        return self._one_by_one(self.zones[start:], first, again)

    def create_only(self) -> QueuedResourceOps:
        """`create` without a wait: where the run's queued resource already is, else the
        first zone that accepts the create (one that refuses it, RESOURCE_EXHAUSTED, created
        nothing); claimed for a first-active spec, so its job starts there at boot."""
        current = self.pick(self.find())
        zones = [current[0].zone] if current is not None else self.zones
        attempts: list[ZoneAttempt] = []
        for index, zone in enumerate(zones):
            ops = self.qr.in_zone(zone)
            self._claim_before_create(ops)
            try:
                self._create(ops, None)
            except ResourceExhaustedError as error:
                attempts.append(ZoneAttempt(zone, error.kind, error.message))
                self._refused(zone, error)
                if index == len(zones) - 1:
                    raise self._exhausted(error, attempts) from None
                continue
            return ops
        raise AssertionError("no zone to try")  # zones is never empty

    def _one_by_one(
        self, zones: Sequence[str], first: QueuedResourceOps | None, again: int | None
    ) -> QueuedResourceOps:
        attempts: list[ZoneAttempt] = []
        for index, zone in enumerate(zones):
            ops = first if first is not None and index == 0 else self.qr.in_zone(zone)
            last = index == len(zones) - 1
            self.on_zone(ops)
            if index > 0:
                self.emit(
                    "zone.next",
                    f"{self.name}: trying the next zone, {zone}",
                    zone=zone,
                    tried=[attempt.zone for attempt in attempts],
                )
            self._claim_before_create(ops)
            try:
                self._create(ops, again)
            except ResourceExhaustedError as error:
                attempts.append(ZoneAttempt(zone, error.kind, error.message))
                self._refused(zone, error)
                if last:
                    raise self._exhausted(error, attempts) from None
                continue
            try:
                self.waited = ops.wait(
                    self.wait_policy,
                    keep_on_timeout=self.keep_on_timeout and last,
                    on_event=self.on_watch,
                    clock=self.clock,
                )
            except DeadlineError as error:
                attempts.append(ZoneAttempt(zone, error.kind, error.message))
                # Never two at once: the next zone only once this one is gone.
                if last or not error.details.get("deleted"):
                    raise self._exhausted(error, attempts) from None
            except QueuedResourceFailed as error:
                attempts.append(ZoneAttempt(zone, error.kind, error.message))
                if last:
                    raise self._exhausted(error, attempts) from None
                self._delete(ops, "FAILED before it was ever ACTIVE")
            else:
                return ops
        raise AssertionError("no zone to try")  # zones is never empty

    def _race(self, found: Sequence[Found], again: int | None) -> QueuedResourceOps:
        claimed = self.record.claimed_zone() if self.spec.claims_zone else None
        if claimed is not None:
            holder = next((f for f in found if f[0].zone == claimed), None)
            if holder is None and self.qr.in_zone(claimed).observe().state != GONE:
                raise self._claimed_elsewhere(claimed)
            if holder is not None:
                # The run lives in its claimed zone (its job may run there): no race.
                for ops, _observation in found:
                    if ops is not holder[0]:
                        self._delete(ops, f"the run is claimed for {claimed}")
                return self._one_by_one([claimed], holder[0], again)
            self.record.claim_zone(None)  # its zone holds nothing any more: a new race
            self.emit(
                "zone.unclaimed",
                f"{self.name}: withdrew the claim for {claimed}, which holds no queued "
                "resource any more",
                zone=claimed,
            )
        active = next((ops for ops, seen in found if seen.state == "ACTIVE"), None)
        if active is not None:
            self.claimed_late = True
            return self._choose(active, [ops for ops, _seen in found if ops is not active])
        return self._run_race(found, again)

    def _run_race(self, found: Sequence[Found], again: int | None) -> QueuedResourceOps:
        existing = {ops.zone: ops for ops, _observation in found}
        self.emit(
            "zone.race",
            f"{self.name}: queueing in {len(self.zones)} zones at once "
            f"({', '.join(self.zones)}); the first ACTIVE is kept, the others deleted",
            zones=self.zones,
            zone=None,
        )
        racers: dict[str, QueuedResourceOps] = {}
        attempts: list[ZoneAttempt] = []
        error: TpuctlError | None = None
        for zone in self.zones:
            racer = existing.get(zone) or self.qr.in_zone(zone)
            self.racers.append(racer)
            try:
                self._create(racer, again, racing=True)
            except ResourceExhaustedError as refused:
                self.racers.remove(racer)  # nothing was created there
                attempts.append(ZoneAttempt(zone, refused.kind, refused.message))
                self._refused(zone, refused)
                error = refused
                continue
            racers[zone] = racer
        if not racers:
            assert error is not None
            raise self._exhausted(error, attempts)
        watchers = {
            zone: Watcher(
                ops.observe, self.wait_policy, clock=self.clock, on_event=self._racer(zone)
            )
            for zone, ops in racers.items()
        }
        due = dict.fromkeys(racers, self.clock.monotonic())
        while due:
            self.tick()
            zone = min(due, key=lambda z: (due[z], self.zones.index(z)))
            pause = due[zone] - self.clock.monotonic()
            if pause > 0:
                self.clock.sleep(pause)
            result, delay = watchers[zone].step()
            if result is None:
                due[zone] = self.clock.monotonic() + delay
                continue
            del due[zone]
            ops = racers[zone]
            if result.outcome is Outcome.REACHED:
                self.waited = result
                self.claimed_late = True
                return self._choose(ops, [racers[other] for other in due])
            # This zone is out of the race: what it gave up on is deleted (a deadline's by the
            # wait's own rule; a FAILED or suspended one here), unless the last one is kept.
            keep = self.keep_on_timeout and not due
            error = ops.give_up(result, self.wait_policy, keep_on_timeout=keep, clock=self.clock)
            attempts.append(ZoneAttempt(zone, error.kind, error.message))
            self.racers.remove(ops)
            if not isinstance(error, DeadlineError) and result.state != GONE:
                self._delete(ops, f"{result.state} before it was ever ACTIVE")
            self.emit(
                "zone.gave_up",
                f"{self.name} in {zone} is out of the race: {error.message}",
                zone=zone,
                racing=True,
                outcome=error.kind,
            )
        assert error is not None
        raise self._exhausted(error, attempts)

    def _choose(
        self, winner: QueuedResourceOps, others: Sequence[QueuedResourceOps]
    ) -> QueuedResourceOps:
        """`winner` is kept: every other zone's queued resource is deleted (and gone), then
        the run is claimed for the winner's zone, so its job starts there and nowhere else."""
        self.on_zone(winner)
        self.emit(
            "zone.chosen",
            f"{self.name}: {winner.zone} is ACTIVE first; keeping it"
            + (f", deleting {', '.join(ops.zone for ops in others)}" if others else ""),
            zone=winner.zone,
            deleting=[ops.zone for ops in others],
        )
        for ops in others:
            self._delete(ops, f"{winner.zone} was ACTIVE first")
        self.racers = []
        if self.record.claim_zone(winner.zone) if self.spec.claims_zone else False:
            self.emit(
                "zone.claimed",
                f"{self.name}: the run is claimed for {winner.zone}: its job may start there "
                "and nowhere else",
                zone=winner.zone,
            )
        return winner

    # ------------------------------------------------------------------------- the pieces

    def _claim_before_create(self, ops: QueuedResourceOps) -> None:
        """A first-active spec queued in one zone: claim that zone before its VMs boot, when
        the claim may move (the zone it names holds no queued resource)."""
        if not self.spec.claims_zone:
            return
        claimed = self.record.claimed_zone()
        if claimed == ops.zone:
            return
        if claimed is not None and self.qr.in_zone(claimed).observe().state != GONE:
            raise self._claimed_elsewhere(claimed)
        self.record.claim_zone(ops.zone)
        self.claimed_late = ops.observe().state != GONE
        self.emit(
            "zone.claimed",
            f"{self.name}: the run is claimed for {ops.zone}: its job may start there and "
            "nowhere else",
            zone=ops.zone,
        )

    def _claimed_elsewhere(self, claimed: str) -> TpuctlError:
        ops = self.qr.in_zone(claimed)
        return TpuctlError(
            f"{self.name}: the run is claimed for {claimed}, where its queued resource still "
            f"is (its job may run there), and {claimed} is not among the zones asked "
            f"({', '.join(self.zones)})",
            hint=f"ask for {claimed} too, or delete it first: {ops.delete_command()}",
            name=self.name,
            zone=claimed,
        )

    def _create(self, ops: QueuedResourceOps, again: int | None, *, racing: bool = False) -> None:
        created = ops.create()
        where = f" in {ops.zone}" if len(self.zones) > 1 else ""
        facts: dict[str, Any] = {"zone": ops.zone, "racing": racing or None}
        if created.action == "created":
            self.created, self.request_id = True, created.request_id
            if again is not None:
                self.emit(
                    "qr.recreated",
                    f"created {self.name} again{where} (same run name, so the job resumes)",
                    count=again,
                    request_id=created.request_id,
                    **facts,
                )
            else:
                self.emit(
                    "qr.created",
                    f"created {self.name}{where}",
                    request_id=created.request_id,
                    **facts,
                )
            return
        seen = created.queued_resource.state if created.queued_resource else None
        self.emit(
            "qr.exists",
            f"{self.name}{where} exists from this spec ({seen}); using it",
            state=seen,
            **facts,
        )

    def _refused(self, zone: str, error: TpuctlError) -> None:
        self.emit(
            "zone.refused",
            f"{self.name}: {zone} refused the create (RESOURCE_EXHAUSTED: no quota or "
            "capacity for it there); nothing was created in it",
            zone=zone,
            outcome=error.kind,
            refusal=error.message,
        )

    def _delete(self, ops: QueuedResourceOps, why: str) -> None:
        ops.delete()
        self.emit(
            "qr.deleted",
            f"deleted {self.name} in {ops.zone}: {why}",
            reason=why,
            zone=ops.zone,
            racing=True,
        )

    def _racer(self, zone: str) -> Callable[[WatchEvent], None]:
        """What one racer's watcher sees, said with its zone (it is not the run's zone yet)."""

        def seen(event: WatchEvent) -> None:
            self.tick()
            if event.kind == "state":
                arrow = f"{event.previous} → {event.state}" if event.previous else event.state
                self.emit(
                    "qr.state",
                    f"{self.name} in {zone}: {arrow}",
                    state=event.state,
                    previous=event.previous,
                    zone=zone,
                    racing=True,
                )
            elif event.kind == "warning":
                self.emit(
                    "qr.warning",
                    f"{self.name} in {zone}: {event.message}",
                    state=event.state,
                    zone=zone,
                    racing=True,
                )

        return seen

    def _exhausted(self, error: TpuctlError, attempts: Sequence[ZoneAttempt]) -> TpuctlError:
        """With one zone, `error` itself; with several, the same kind of error saying what
        happened in every zone tried."""
        if len(self.zones) == 1:
            return error
        tried = "; ".join(f"{attempt.zone}: {attempt.message}" for attempt in attempts)
        details = {**error.details, "zones": [attempt.to_dict() for attempt in attempts]}
        return type(error)(
            f"{self.name}: no zone became ACTIVE ({tried})", hint=error.hint, **details
        )


# --- create --wait across zones ----------------------------------------------------------------


def create_in_zones(
    api: TpuApi,
    spec: Spec,
    zones: Sequence[str],
    options: lifecycle.WaitOptions,
    *,
    say: Callable[[str], None],
    on_event: lifecycle.EventCallback | None = None,
    wait: bool = True,
) -> CreateResult:
    """`create --wait` across several zones, as `up` brings a run up (tpuctl.jobs.zone_choice):
    one after another at each queueing deadline, or first-active. Ctrl-C leaves what is
    queued and names the command that deletes each (or deletes them with
    --delete-on-interrupt); any other error names what is left where. Without `wait`, where
    the run's queued resource already is, else the first zone that accepts the create
    (claimed for a first-active spec, so its job starts there)."""
    from tpuctl.clock import Clock
    from tpuctl.jobs.adapters import ApiQueuedResource, StorageJobRecord

    current: Any = ApiQueuedResource(api, spec)

    def moved(ops: Any) -> None:
        nonlocal current
        current = ops

    choice = ZoneChoice(
        spec,
        current,
        zones,
        StorageJobRecord(spec),
        wait_policy=options.policy,
        keep_on_timeout=options.keep_on_timeout,
        clock=Clock(),
        emit=lambda _kind, message, **_facts: say(message),
        on_watch=on_event,
        on_zone=moved,
    )
    try:
        ops = choice.bring_up(choice.find()) if wait else choice.create_only()
        return _brought_up(api.in_zone(ops.zone), spec.name, choice, options)
    except KeyboardInterrupt:
        left = {ops.zone: ops for ops in [current, *choice.racers]}
        raise _interrupted(spec.name, list(left.values()), options.delete_on_interrupt) from None
    except Exception as error:
        raise _stopped(api, spec.name, zones, error) from error


def _brought_up(
    api: TpuApi, name: str, choice: ZoneChoice, options: lifecycle.WaitOptions
) -> CreateResult:
    """The Create document of a queued resource brought up in `api`'s zone: its wait (as
    `tpuctl wait` reports it, whichever way the zone was chosen) and its status."""
    from tpuctl.cloud import lifecycle, queries
    from tpuctl.cloud.watcher import WatchResult

    result = CreateResult("created" if choice.created else "exists", name, choice.request_id)
    result.zone = api.location.zone
    waited = choice.waited
    if isinstance(waited, WatchResult):  # a race's winner: its watcher's own result
        waited = lifecycle.wait_summary(api, name, options.policy.until, waited)
    if waited is not None:
        result.wait = waited
        result.queued_resource = waited.queued_resource
    else:  # no wait (`create` alone), or taken up ACTIVE as it was found
        result.queued_resource = queries.status(api, name)
    return result


def _stopped(api: TpuApi, name: str, zones: Sequence[str], error: Exception) -> Exception:
    """A bring-up across zones that ended in an error: the same error, saying what is left
    where and the command that deletes each, unless it says so itself (a deadline's delete,
    a hint naming the delete) or nothing is left. Any other exception becomes such an error,
    so a queued resource it leaves behind is never unnamed."""
    from tpuctl.cloud.queries import delete_command, locate

    said = isinstance(error, TpuctlError) and (
        "tpuctl delete" in (error.hint or "") or error.details.get("deleted") is False
    )
    if said:
        return error
    try:
        polling = api.with_retry(min(api.retry_total, 5.0))
        located = locate(polling, name, zones)
        left = {zone: located.state_in(zone) for zone in located.holding}
        left |= {failure.zone: "unknown: could not be asked" for failure in located.errors}
    except Exception:  # the API itself fails: anything queued may be left
        left = dict.fromkeys(zones, "unknown: could not be asked")
    if not left:
        return error
    where = ", ".join(f"{zone} ({state})" for zone, state in left.items())
    commands = "  and  ".join(delete_command(api.in_zone(zone), name) for zone in left)
    if isinstance(error, TpuctlError):
        error.message = f"{error.message}; {name} is left in {where}"
        error.hint = f"delete it with: {commands}" + (f"; {error.hint}" if error.hint else "")
        error.details["left_in"] = list(left)
        return error
    return TpuctlError(
        f"internal error: {type(error).__name__}: {error}; {name} is left in {where}",
        hint=f"delete it with: {commands}; rerun with --debug for the traceback and report it",
        name=name,
        left_in=list(left),
    )


def _interrupted(name: str, left: Sequence[Any], delete_them: bool) -> TpuctlError:
    """Ctrl-C during a bring-up across zones: what may be queued where, deleted when asked."""
    from tpuctl.errors import ApiUnavailableError, Interrupted, NotFoundError

    zones = [ops.zone for ops in left]
    undeleted = []
    if delete_them:
        for ops in left:
            try:
                ops.api.delete_queued_resource(name, force=True)
            except NotFoundError:
                pass
            except ApiUnavailableError:
                undeleted.append(ops)
        if not undeleted:
            return Interrupted(
                f"interrupted while waiting for {name} in {', '.join(zones)}; deletion "
                "requested (--delete-on-interrupt)",
                name=name,
                zones=zones,
                deleted=True,
            )
    commands = "  and  ".join(ops.delete_command() for ops in undeleted or left)
    return Interrupted(
        f"interrupted while waiting for {name}; it may be queued in "
        f"{', '.join(ops.zone for ops in undeleted or left)}",
        hint=f"delete it with: {commands}",
        name=name,
        zones=zones,
        deleted=False,
    )
