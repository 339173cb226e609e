"""The decision of one reconcile step: a pure function of what the step saw and of the run's
record, with no clock (the time is the observation's) and no cloud.

In the order they are checked:

* the TPU API could not be read: decide nothing (the job runs on), say so every 30 s;
* the run is over (done, gave up, stopped): make sure nothing is left billed, then nothing;
* the done marker (or every worker reporting done): delete what is left, then the run is done;
* where the run lives: zone_policy sequential (one queued resource at a time, the next zone at
  a queueing or provisioning deadline) or first-active (queue everywhere, keep the first
  ACTIVE, delete the others, claim its zone);
* its queued resource: queued or provisioning (deadlines), SUSPENDED or FAILED after ACTIVE (a
  preemption, counted once per incarnation: delete, then create again), FAILED before;
* its job, once ACTIVE: start it where it does not run, follow it while it runs, and once every
  worker ended it, wait for the settle period: a disruption is not an end, every worker
  exiting 0 in one boot is done, anything else a failure (restart, within the budget; a crash
  loop gives up).

Every decision is one action; what the step must remember goes to the journal as notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from tpuctl import worker as contract
from tpuctl.clock import format_duration, parse_rfc3339, rfc3339
from tpuctl.cloud.watcher import GONE, QUEUE_STATES, SUSPENDED_STATES
from tpuctl.errors import ExitCode
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen, SliceSeen, WorkerSeen

# Actions.
WAIT = "wait"
CREATE = "create"  # `zones`: one, or every zone of a first-active race
DELETE = "delete"  # `zones`: what to delete, and `why`
CLAIM = "claim"  # `claim`: the zone the run is claimed for, or None to withdraw the claim
START = "start"  # deliver the job's code and run the startup script everywhere
RESTART = "restart"
MARK_DONE = "mark_done"
GIVE_UP = "give_up"  # keep the workers' last log lines, record it, delete (unless kept)
FINISH = "finish"  # record that the run is done
NOTHING = "nothing"  # the run is over and nothing is left
REFUSE = "refuse"  # a request this step must not act on (nothing is recorded)

# Outcomes of a step, as a scheduler sees them.
IN_PROGRESS = "in_progress"
DONE = "done"
GIVEN_UP = "given_up"
STOPPED = "stopped"

OUTAGE_SAY_EVERY = 30.0  # seconds between "the API is unavailable" notes
WAIT_SAY_AGAIN = 600.0  # a wait that lasts is said again after this long
FAST = 1.0  # seconds to the next step while something changes
REDELIVER_AFTER = 60.0  # a delivered job still waiting for its code is delivered again
# A slice set taken back this close to its termination time ended its run (flex-start), and a
# job that ended this close before it was stopped for it: neither is a preemption or a failure.
TIME_UP_SLACK = 60.0
# A worker in one of these has not started the job of this boot: the job is delivered to it.
WAITING_STATES = frozenset({"waiting-for-code", "waiting-for-zone", "none"})
END_NEAR = 600.0


@dataclass(frozen=True)
class Policy:
    """What a decision needs of the spec and of the supervisor's options."""

    name: str
    zones: tuple[str, ...]
    zone_policy: str = "sequential"  # or first-active
    claims_zone: bool = False
    max_preemptions: int = 3
    max_failures: int = 3
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    keep: bool = False
    keep_on_timeout: bool = False
    # A person's `tpuctl up` without --keep on a run that ended with its queued resource kept
    # deletes it; a scheduler's step leaves what a person chose to keep.
    delete_kept: bool = False
    settle: float = 120.0
    running_timeout: float = 600.0
    crashloop_restarts: int = 2
    start_attempts: int = 3
    poll: float = 6.0  # seconds between steps while nothing changes
    job_check_every: float = 20.0
    # A capacity ladder (capacity.fallback): each rung's name, the first the spec's own tier;
    # a rung is climbed when its queueing deadline passes in every zone or its preemption
    # budget is spent. `prefer_cheapest`: every new bring-up starts from the first rung again.
    rungs: tuple[str, ...] = ()
    prefer_cheapest: bool = False

    @property
    def racing(self) -> bool:
        return self.zone_policy == "first-active" and len(self.zones) > 1


@dataclass(frozen=True)
class Note:
    """A journal entry the step writes before it acts: an observation or a decision."""

    kind: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GiveUp:
    """Why the run ends without being done: the error a supervisor exits with."""

    kind: str
    exit_code: int
    message: str
    hint: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exit_code": self.exit_code,
            "message": self.message,
            "hint": self.hint,
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Decision:
    """One step's decision: its action, why (one line), the notes to record first, and how
    the run stands for a scheduler (`outcome`) with the seconds until another step is useful."""

    action: str
    message: str
    notes: tuple[Note, ...] = ()
    zones: tuple[str, ...] = ()
    claim: str | None = None
    why: str = ""
    give_up: GiveUp | None = None
    outcome: str = IN_PROGRESS
    next_in: float = FAST
    again: int | None = None  # a create after the `again`-th preemption
    rung: int = 0  # a create: the capacity ladder's rung it asks for
    workers: tuple[str, ...] = ()  # a start: only these workers (empty: every one)
    from_step: int | None = None  # a restart: the checkpoint it resumes from
    ending: str | None = None  # a restart: the ending it answers
    kept: bool = False  # the run ends with its queued resource kept
    api_unavailable: bool = False
    running: str | None = None  # the job runs: its workers' states, e.g. "4 running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "message": self.message,
            "zones": list(self.zones),
            "claim": self.claim,
            "outcome": self.outcome,
            "next_in_s": self.next_in,
            "give_up": None if self.give_up is None else self.give_up.to_dict(),
            "notes": [{"kind": note.kind, "message": note.message} for note in self.notes],
        }


def decide(seen: Seen, record: RunRecord, policy: Policy) -> Decision:
    """The one action this step takes (see the module doc)."""
    return _Decider(seen, record, policy).decide()


def ending_key(workers: Sequence[WorkerSeen]) -> str:
    """One ending of the job: every worker's boot, pid, state and exit code."""
    return ";".join(
        f"{w.label}:{w.boot}:{w.pid}:{w.state}:{w.exit_code}"
        for w in sorted(workers, key=lambda w: w.label)
    )


class _Decider:
    def __init__(self, seen: Seen, record: RunRecord, policy: Policy) -> None:
        self.seen = seen
        self.record = record
        self.policy = policy
        self.name = policy.name
        self.now = seen.at
        self.notes: list[Note] = []
        self.rung = record.rung  # the ladder's rung, once this step's notes are written

    # ----------------------------------------------------------------------- plumbing

    def note(self, kind: str, message: str, **fields: Any) -> None:
        self.notes.append(Note(kind, message, fields))

    def make(self, action: str, message: str, **values: Any) -> Decision:
        return Decision(action, message, tuple(self.notes), **values)

    def wait(self, key: str, message: str, next_in: float, **values: Any) -> Decision:
        """Wait, saying why once (and again when the same wait has lasted a while)."""
        said = self.record.wait_said_at
        if key != self.record.wait_key or said is None or self._since(said) >= WAIT_SAY_AGAIN:
            self.note("reconcile.wait", message, key=key)
        return self.make(WAIT, message, next_in=next_in, **values)

    def _since(self, moment: datetime | None) -> float:
        return 0.0 if moment is None else max(0.0, (self.now - moment).total_seconds())

    def give_up(
        self,
        kind: str,
        code: ExitCode,
        message: str,
        *,
        hint: str | None = None,
        delete: bool = True,
        **details: Any,
    ) -> Decision:
        present = tuple(s.zone for s in self.seen.present() if s.state != "DELETING")
        kept = not delete and bool(present)
        return self.make(
            GIVE_UP,
            message,
            give_up=GiveUp(kind, int(code), message, hint, details),
            zones=present if delete else (),
            outcome=GIVEN_UP,
            kept=kept,
        )

    # ----------------------------------------------------------------------- the order

    def decide(self) -> Decision:
        if self.seen.api_error is not None:
            return self._api_down(self.seen.api_error)
        if self.record.api_down_since is not None:
            lasted = format_duration(self._since(self.record.api_down_since))
            self.note("api.available", f"{self.name}: the TPU API answers again after {lasted}")
        self._note_states()
        if self.record.finished is not None:
            return self._over()
        workers = self.seen.workers
        if self.seen.done or (workers and all(w.state == "done" for w in workers)):
            return self._done()
        if self.policy.racing:
            return self._first_active()
        return self._sequential()

    def _api_down(self, why: str) -> Decision:
        record = self.record
        since = record.api_down_since or self.now
        if record.api_said_at is None or self._since(record.api_said_at) >= OUTAGE_SAY_EVERY:
            self.note(
                "api.unavailable",
                f"{self.name}: the TPU API is unavailable for {format_duration(self._since(since))}"
                f" ({why}); the job runs on, nothing is decided until the API answers",
            )
        return self.make(
            WAIT, f"the TPU API is unavailable ({why})", next_in=2.0, api_unavailable=True
        )

    def _note_states(self) -> None:
        """A qr.state note for every zone whose state changed since the record last said."""
        for seen in self.seen.slices.values():
            said = self.record.states.get(seen.zone)
            if seen.state == GONE and said in (None, GONE):
                continue
            if seen.state == said and seen.incarnation == self.record.incarnations.get(seen.zone):
                continue
            why = ""
            if seen.initiator and seen.state in SUSPENDED_STATES:
                why = f" (initiated by {seen.initiator})"
            if seen.failure and seen.state == "FAILED":
                why += f": {seen.failure}"
            shown = said not in (None, GONE, seen.state)
            arrow = f"{said} → {seen.state}" if shown else seen.state
            where = f" in {seen.zone}" if len(self.policy.zones) > 1 else ""
            self.note(
                "qr.state",
                f"{self.name}{where}: {arrow}{why}",
                zone=seen.zone,
                state=seen.state,
                previous=said,
                initiator=seen.initiator,
                failure=seen.failure,
                incarnation=seen.incarnation,
                racing=self.record.racing or None,
            )

    # ----------------------------------------------------------------------- the end

    def _over(self) -> Decision:
        """A run that is over: what a killed step left (a queued resource that a give-up or a
        done run was deleting) is deleted; then there is nothing to do."""
        record = self.record
        outcome = {"done": DONE, "gave_up": GIVEN_UP, "stopped": STOPPED}[record.finished or ""]
        left = [s for s in self.seen.present() if s.state != "DELETING"]
        error = give_up_of(record.error) if record.finished == "gave_up" else None
        deletable = not record.kept or (self.policy.delete_kept and not self.policy.keep)
        deleting = [s for s in self.seen.present() if s.state == "DELETING"]
        if deleting:
            return self.wait(
                "deleting",
                f"{self.name}: the run is over ({record.finished}); waiting for the deletion "
                f"in {', '.join(s.zone for s in deleting)} to finish",
                FAST,
                outcome=outcome,
                give_up=error,
            )
        if left and deletable:
            zones = tuple(s.zone for s in left)
            return self.make(
                DELETE,
                f"{self.name}: the run is over ({record.finished}); deleting what is left in "
                f"{', '.join(zones)}",
                zones=zones,
                why=f"the run is over ({record.finished})",
                outcome=outcome,
                give_up=error,
            )
        message = {
            "done": f"{self.name}: the run is done",
            "gave_up": f"{self.name}: the run gave up: {error.message if error else ''}",
            "stopped": f"{self.name}: the run was stopped (tpuctl delete); "
            "tpuctl up starts it again",
        }[record.finished or ""]
        return self.make(NOTHING, message, outcome=outcome, give_up=error, next_in=0.0)

    def _done(self) -> Decision:
        if not self.record.done_said:
            self.note("job.done", f"{self.name}: the done marker appeared")
        left = self.seen.present()
        deleting = [s for s in left if s.state == "DELETING"]
        to_delete = tuple(s.zone for s in left if s.state != "DELETING")
        if to_delete and not self.policy.keep:
            return self.make(
                DELETE,
                f"deleted {self.name}: the job is done",
                zones=to_delete,
                why="done",
            )
        if deleting:
            return self.wait("deleting", f"{self.name}: the job is done; waiting for the "
                             "deletion to finish", FAST)  # fmt: skip
        return self.make(
            FINISH,
            f"{self.name}: done" + (" (the queued resource is kept)" if to_delete else ""),
            outcome=DONE,
            kept=bool(to_delete),
            next_in=0.0,
        )

    # ----------------------------------------------------------------------- sequential

    def _sequential(self) -> Decision:
        present = self._present()
        if not present:
            return self._create_next()
        current = self._pick(present)
        leftovers = tuple(s.zone for s in present if s is not current and s.state != "DELETING")
        if leftovers:
            return self.make(
                DELETE,
                f"{self.name}: deleting what is left in {', '.join(leftovers)}: the run carries "
                f"on in {current.zone}",
                zones=leftovers,
                why=f"the run carries on in {current.zone}",
            )
        return self._on_slice(current)

    def _present(self) -> list[SliceSeen]:
        return [s for s in self.seen.in_zones(self._zones_looked_at()) if s.present]

    def _zones_looked_at(self) -> list[str]:
        zones = list(self.policy.zones)
        claimed = self.seen.claimed_zone
        if claimed and claimed not in zones and self.policy.claims_zone:
            zones.append(claimed)
        return zones

    def _pick(self, present: Sequence[SliceSeen]) -> SliceSeen:
        """The one the run carries on with: the claimed zone's, else the first ACTIVE, else
        the first (in the zones' order)."""
        for candidate in present:
            if self.policy.claims_zone and candidate.zone == self.seen.claimed_zone:
                return candidate
        for candidate in present:
            if candidate.state == "ACTIVE":
                return candidate
        return present[0]

    def _create_next(self) -> Decision:
        vanished = self._vanished()
        if vanished is not None:
            return vanished
        zones = [z for z in self.policy.zones if z not in self.record.round_given_up]
        if not zones:
            return self._no_zone_left("queueing")
        zone = zones[0]
        if zone != self.policy.zones[0]:
            self.note(
                "zone.next",
                f"{self.name}: trying the next zone, {zone}",
                zone=zone,
                tried=list(self.record.round_given_up),
            )
        return self._create((zone,))

    def _create(self, zones: tuple[str, ...]) -> Decision:
        recovering = self.record.recovering
        again = self.record.preemptions if recovering == "preemption" else None
        if recovering == "run end":
            again = len(self.record.run_ends)
        if (
            self.policy.prefer_cheapest
            and self.rung > 0
            and recovering in ("preemption", "run end")
            and (self.record.rung_preemptions > 0 or self.record.run_ends)
            and not any(note.kind == "capacity.rung" for note in self.notes)
        ):
            self._climb(0, "--prefer-cheapest: a new bring-up starts from the cheapest rung")
        where = f" in {', '.join(zones)}" if len(self.policy.zones) > 1 else ""
        on = f" on {self.policy.rungs[self.rung]}" if len(self.policy.rungs) > 1 else ""
        verb = "creating again" if again else "creating"
        return self.make(
            CREATE,
            f"{self.name}: {verb}{where}{on}",
            zones=zones,
            again=again or None,
            rung=self.rung,
        )

    # ----------------------------------------------------------------------- the ladder

    def _next_rung(self) -> int | None:
        following = self.rung + 1
        return following if following < len(self.policy.rungs) else None

    def _climb(self, rung: int, why: str) -> None:
        names = self.policy.rungs
        self.note(
            "capacity.rung",
            f"{self.name}: {'climbing' if rung > self.rung else 'going back'} to rung "
            f"{rung + 1} of {len(names)}, {names[rung]} ({why})",
            rung=rung,
            name=names[rung],
            previous=self.rung,
            why=why,
        )
        self.rung = rung

    def _climb_instead(self, why: str, present: Sequence[SliceSeen]) -> Decision | None:
        """Climb to the ladder's next rung instead of giving up, if there is one: what this
        rung left is deleted first (the next step creates on the next rung)."""
        following = self._next_rung()
        if following is None:
            return None
        self._climb(following, why)
        left = tuple(s.zone for s in present if s.state != "DELETING")
        if left:
            return self.make(
                DELETE,
                f"{self.name}: {why}; deleting it to ask {self.policy.rungs[following]}",
                zones=left,
                why=f"climbing to {self.policy.rungs[following]}",
            )
        zones = (self.policy.zones[0],) if not self.policy.racing else self.policy.zones
        return self._create(zones)

    def _vanished(self) -> Decision | None:
        """The run's queued resource is gone though nothing of tpuctl's deleted it (someone
        did, or the service): count it like a preemption if it had been ACTIVE, and go on."""
        for zone in self.policy.zones:
            said = self.record.states.get(zone)
            incarnation = self.record.incarnations.get(zone)
            if said in (None, GONE, "DELETING") or self.seen.slices.get(zone) is None:
                continue
            was_active = incarnation in self.record.ever_active
            self.note(
                "qr.vanished",
                f"{self.name} in {zone} is gone (it was {said}) though tpuctl did not delete it",
                zone=zone,
                incarnation=incarnation,
                was_active=was_active,
            )
            if was_active and incarnation not in self.record.preempted:
                return self._count_preemption(zone, incarnation, said, "vanished")
        return None

    # ----------------------------------------------------------------------- first-active

    def _first_active(self) -> Decision:
        present = self._present()
        claimed = self.seen.claimed_zone
        by_zone = {s.zone: s for s in present}
        if claimed is not None:
            holder = by_zone.get(claimed)
            if holder is not None and claimed not in self.policy.zones:
                return self._claimed_elsewhere(claimed)
            if holder is not None:
                others = tuple(s.zone for s in present if s is not holder and s.state != "DELETING")
                if others:
                    return self.make(
                        DELETE,
                        f"{self.name}: the run is claimed for {claimed}; deleting "
                        f"{', '.join(others)}",
                        zones=others,
                        why=f"the run is claimed for {claimed}",
                    )
                return self._on_slice(holder)
            return self.make(
                CLAIM,
                f"{self.name}: withdrew the claim for {claimed}, which holds no queued resource "
                "any more",
                claim=None,
            )
        active = next((s for s in present if s.state == "ACTIVE"), None)
        if active is not None:
            return self._on_slice(active)
        if not present:
            vanished = self._vanished()
            if vanished is not None:
                return vanished
        for racer in present:
            decided = self._racer(racer, present)
            if decided is not None:
                return decided
        missing = tuple(
            z for z in self.policy.zones if z not in by_zone and z not in self.record.round_given_up
        )
        if missing:
            if not self.record.racing:
                self.note(
                    "zone.race",
                    f"{self.name}: queueing in {len(self.policy.zones)} zones at once "
                    f"({', '.join(self.policy.zones)}); the first ACTIVE is kept, the others "
                    "deleted",
                    zones=list(self.policy.zones),
                    zone=None,
                )
            return self._create(missing)
        if not present:
            return self._no_zone_left("queueing")
        queued = ", ".join(f"{s.zone} {s.state}" for s in present)
        return self.wait(
            f"race:{','.join(s.zone for s in present)}",
            f"{self.name}: queued in {queued}; the first ACTIVE is kept",
            self.policy.poll,
        )

    def _racer(self, racer: SliceSeen, present: Sequence[SliceSeen]) -> Decision | None:
        """A racer that is out of the race (a deadline, FAILED, SUSPENDED): deleted."""
        phase = self._deadline_passed(racer)
        if phase is None and racer.state not in ("FAILED", "SUSPENDED"):
            return None
        outcome = "deadline" if phase else racer.state.lower()
        message = f"{self.name} in {racer.zone} is out of the race: " + (
            f"still {racer.state} after the {phase} deadline" if phase else racer.state
        )
        self.note("zone.gave_up", message, zone=racer.zone, racing=True, outcome=outcome)
        others = [s for s in present if s is not racer]
        remaining = [
            z for z in self.policy.zones
            if z != racer.zone and z not in self.record.round_given_up
        ]  # fmt: skip
        if not others and not remaining:
            return self._exhausted(racer, phase)
        return self.make(DELETE, message, zones=(racer.zone,), why=message)

    def _claimed_elsewhere(self, claimed: str) -> Decision:
        message = (
            f"{self.name}: the run is claimed for {claimed}, where its queued resource still is "
            f"(its job may run there), and {claimed} is not among the zones asked "
            f"({', '.join(self.policy.zones)})"
        )
        return self.make(
            REFUSE,
            message,
            give_up=GiveUp(
                "error",
                int(ExitCode.ERROR),
                message,
                f"ask for {claimed} too, or delete it there first",
                {"zone": claimed},
            ),
            outcome=GIVEN_UP,
        )

    # ----------------------------------------------------------------------- one slice

    def _on_slice(self, current: SliceSeen) -> Decision:
        state = current.state
        if state in QUEUE_STATES or state == "PROVISIONING":
            phase = self._deadline_passed(current)
            if phase is not None:
                return self._deadline(current, phase)
            return self._waiting_for(current)
        if state in ("SUSPENDING", "DELETING"):
            return self.wait(
                f"{state}:{current.zone}", f"{self.name} is {state}", FAST
            )  # SUSPENDED or gone follows within seconds
        if state == "SUSPENDED" or (state == "FAILED" and self._was_active(current)):
            return self._recover(current)
        if state == "FAILED":
            return self._failed_before_active(current)
        if state == "ACTIVE":
            return self._active(current)
        return self.wait(f"state:{state}", f"{self.name} is {state}; waiting", self.policy.poll)

    def _was_active(self, current: SliceSeen) -> bool:
        return current.incarnation in self.record.ever_active

    def _deadline_passed(self, current: SliceSeen) -> str | None:
        """`queueing` or `provisioning` when that deadline has passed for `current`."""
        policy = self.policy
        queued = current.state in QUEUE_STATES and policy.queue_timeout is not None
        if queued and self._since(current.created_at) >= (policy.queue_timeout or 0.0):
            return "queueing"
        if current.state == "PROVISIONING" and policy.provision_timeout is not None:
            since = parse_rfc3339(self.record.provisioning_since.get(current.incarnation or ""))
            if since is not None and self._since(since) >= policy.provision_timeout:
                return "provisioning"
        return None

    def _waiting_for(self, current: SliceSeen) -> Decision:
        if current.state == "PROVISIONING":
            return self.wait(
                f"provisioning:{current.incarnation}",
                f"{self.name} is PROVISIONING in {current.zone}",
                FAST,
            )
        queued = format_duration(self._since(current.created_at))
        deadline = self.policy.queue_timeout
        left = (
            f"; the queueing deadline is in "
            f"{format_duration(max(0.0, deadline - self._since(current.created_at)))}"
            if deadline is not None and current.created_at is not None
            else ""
        )
        return self.wait(
            f"queued:{current.incarnation}",
            f"{self.name} is {current.state} in {current.zone} (for {queued}): waiting for "
            f"capacity{left}",
            self.policy.poll,
        )

    def _deadline(self, current: SliceSeen, phase: str) -> Decision:
        timeout = (
            self.policy.queue_timeout if phase == "queueing" else self.policy.provision_timeout
        )
        message = (
            f"{self.name} in {current.zone} still {current.state} after the {phase} deadline "
            f"({format_duration(timeout)})"
        )
        self.note("zone.gave_up", message, zone=current.zone, outcome="deadline", phase=phase)
        remaining = [
            z for z in self.policy.zones
            if z != current.zone and z not in self.record.round_given_up
        ]  # fmt: skip
        if remaining:
            return self.make(
                DELETE,
                f"{message}; deleting it and trying the next zone, {remaining[0]}",
                zones=(current.zone,),
                why=f"the {phase} deadline passed",
            )
        return self._exhausted(current, phase)

    def _exhausted(self, current: SliceSeen, phase: str | None) -> Decision:
        """Every zone was tried: the last one's end is the run's (or a rung's, on a ladder)."""
        tried = [*self.record.round_given_up, current.zone]
        why = f"{self.policy.rungs[self.rung] if self.policy.rungs else 'this tier'} " + (
            f"found no capacity within the {phase} deadline" if phase else "FAILED"
        )
        climbed = self._climb_instead(why, self._present())
        if climbed is not None:
            return climbed
        where = (
            f"no zone became ACTIVE ({', '.join(dict.fromkeys(tried))}; the last: "
            if len(self.policy.zones) > 1
            else ""
        )
        if phase is not None:
            message = f"{self.name}: {where}still {current.state} after the {phase} deadline" + (
                ")" if where else ""
            )
            return self.give_up(
                "deadline",
                ExitCode.DEADLINE,
                message,
                hint="raise the deadline, or queue in other zones (capacity.zones)",
                delete=not self.policy.keep_on_timeout,
                phase=phase,
                zones=tried,
            )
        message = (
            f"{self.name}: {where}{current.state} before it was ever ACTIVE"
            + (f": {current.failure}" if current.failure else "")
            + (")" if where else "")
        )
        return self.give_up("qr_failed", ExitCode.QR_FAILED, message, zones=tried)

    def _no_zone_left(self, phase: str) -> Decision:
        tried = list(self.record.round_given_up)
        outcomes = set(self.record.round_outcomes.values())
        rung = self.policy.rungs[self.rung] if self.policy.rungs else "this tier"
        climbed = self._climb_instead(f"{rung} got no capacity in any zone", [])
        if climbed is not None:
            return climbed
        if outcomes == {"resource_exhausted"}:
            where = "the zone" if len(tried) == 1 else f"every zone ({', '.join(tried)})"
            return self.give_up(
                "resource_exhausted",
                ExitCode.ERROR,
                f"{self.name}: {where} refused the create (no quota or capacity for it); nothing "
                "was created",
                hint="request quota, try another capacity tier, or queue in other zones "
                "(capacity.zones)",
                zones=tried,
                created=False,
            )
        return self.give_up(
            "deadline",
            ExitCode.DEADLINE,
            f"{self.name}: no zone became ACTIVE ({', '.join(tried)})",
            hint="raise the deadline, or queue in other zones (capacity.zones)",
            phase=phase,
            zones=tried,
        )

    def _failed_before_active(self, current: SliceSeen) -> Decision:
        remaining = [
            z for z in self.policy.zones
            if z != current.zone and z not in self.record.round_given_up
        ]  # fmt: skip
        if remaining:
            message = f"{self.name} in {current.zone} FAILED before it was ever ACTIVE"
            self.note("zone.gave_up", message, zone=current.zone, outcome="qr_failed")
            return self.make(
                DELETE,
                f"{message}; deleting it and trying the next zone, {remaining[0]}",
                zones=(current.zone,),
                why="FAILED before it was ever ACTIVE",
            )
        return self._exhausted(current, None)

    def _recover(self, current: SliceSeen) -> Decision:
        """SUSPENDED (spot preemption), or FAILED after ACTIVE: deleted, then created again
        under the same run name, so the job resumes; counted once per incarnation."""
        incarnation = current.incarnation or current.zone
        if self._time_is_up(current):
            return self._run_ended(current, incarnation)
        if incarnation in self.record.preempted:
            count = self.record.rung_preemptions if self.policy.rungs else self.record.preemptions
            if count > self.policy.max_preemptions:
                climbed = self._climb_instead("its preemption budget is spent", [current])
                return climbed if climbed is not None else self._preemption_budget(count)
            return self.make(
                DELETE,
                f"deleted {self.name} to recreate it",
                zones=(current.zone,),
                why="recreate",
            )
        cause = (
            "spot preemption"
            if current.state in SUSPENDED_STATES
            else f"{current.state}: {current.failure}"
        )
        return self._count_preemption(current.zone, incarnation, current.state, cause, current)

    def _time_is_up(self, current: SliceSeen, slack: float = TIME_UP_SLACK) -> bool:
        end = current.termination_time
        return end is not None and (end - self.now).total_seconds() <= slack

    def _run_ended(self, current: SliceSeen, incarnation: str) -> Decision:
        """A flex-start run reached its maximum run duration and was taken back: the job
        saved before it (the startup script stops it ahead of the end); a new run under the
        same run name resumes it."""
        if incarnation not in self.record.run_ends:
            ends = len(self.record.run_ends) + 1
            when = rfc3339(current.termination_time) if current.termination_time else "?"
            self.note(
                "run.ended",
                f"{self.name}'s run {ends} reached its maximum run duration (at {when}) and was "
                "taken back: not a preemption nor a failure; a new run resumes the job",
                zone=current.zone,
                incarnation=incarnation,
                count=ends,
                termination_time=current.termination_time,
                checkpoint_step=self.seen.latest_step,
                last_step=self._last_step(),
            )
        return self.make(
            DELETE,
            f"deleted {self.name}: its run's time was up; a new run follows",
            zones=(current.zone,),
            why="its run's time was up",
        )

    def _count_preemption(
        self,
        zone: str,
        incarnation: str | None,
        state: str | None,
        cause: str,
        current: SliceSeen | None = None,
    ) -> Decision:
        count = self.record.preemptions + 1
        budget = self.policy.max_preemptions
        in_rung = self.record.rung_preemptions + 1
        initiator = current.initiator if current is not None else None
        self.note(
            "preemption.detected",
            f"{self.name} is {state} ({cause}"
            + (f", initiated by {initiator}" if initiator else "")
            + f"); recovery {count} of {budget}",
            zone=zone,
            incarnation=incarnation,
            state=state,
            initiator=initiator,
            failure=current.failure if current is not None else None,
            count=count,
            budget=budget,
            cause="preemption" if cause != "vanished" else "vanished",
            checkpoint_step=self.seen.latest_step,
            last_step=self._last_step(),
        )
        spent = (in_rung if self.policy.rungs else count) > budget
        if spent:
            present = [current] if current is not None else []
            climbed = self._climb_instead(
                f"{self.policy.rungs[self.rung] if self.policy.rungs else ''} was preempted "
                f"{in_rung} times, over recovery.max_preemptions ({budget})",
                present,
            )
            return climbed if climbed is not None else self._preemption_budget(count)
        if current is None:  # it vanished: nothing to delete, create it again
            return self._create((self.policy.zones[0],))
        return self.make(
            DELETE, f"deleted {self.name} to recreate it", zones=(zone,), why="recreate"
        )

    def _preemption_budget(self, count: int) -> Decision:
        budget = self.policy.max_preemptions
        return self.give_up(
            "preempted",
            ExitCode.PREEMPTED,
            f"{self.name} was preempted {count} times; recovery.max_preemptions is {budget}: "
            "gave up (the queued resource was deleted)",
            hint="raise recovery.max_preemptions, or use another capacity tier",
            delete=True,
            preemptions=count,
        )

    def _resumed_from(self, workers: Sequence[WorkerSeen]) -> int | None:
        """Where the job resumed: what its workers logged (the lowest), else the latest
        committed step when it stopped (nothing is saved while it is down), else now."""
        said = [w.resumed_from for w in workers if w.resumed_from is not None]
        if said:
            return min(said)
        if self.record.resume_point is not None:
            return self.record.resume_point
        return self.seen.latest_step

    def _last_step(self) -> int | None:
        steps = [w.last_step for w in self.seen.workers or () if w.last_step is not None]
        return max(steps) if steps else None

    # ----------------------------------------------------------------------- the job

    def _active(self, current: SliceSeen) -> Decision:
        present = self._present()
        others = tuple(s.zone for s in present if s is not current and s.state != "DELETING")
        if others:
            if self.record.racing:
                self.note(
                    "zone.chosen",
                    f"{self.name}: {current.zone} is ACTIVE first; keeping it, deleting "
                    f"{', '.join(others)}",
                    zone=current.zone,
                    deleting=list(others),
                )
            return self.make(
                DELETE,
                f"{self.name}: keeping {current.zone}; deleting {', '.join(others)}",
                zones=others,
                why=f"{current.zone} was ACTIVE first",
            )
        if self.policy.claims_zone and self.seen.claimed_zone != current.zone:
            if self.record.racing:
                self.note(
                    "zone.chosen",
                    f"{self.name}: {current.zone} is ACTIVE first; keeping it",
                    zone=current.zone,
                    deleting=[],
                )
            return self.make(
                CLAIM,
                f"{self.name}: the run is claimed for {current.zone}: its job may start there "
                "and nowhere else",
                claim=current.zone,
            )
        return self._job(current)

    def _job(self, current: SliceSeen) -> Decision:
        workers = self.seen.workers
        if not workers:
            return self.wait("workers", f"{self.name}: reading the workers", FAST)
        unread = [w for w in workers if not w.reachable or w.state == contract.UNREADABLE]
        if unread:
            return self._unreadable(current, workers, unread)
        states = [w.state for w in workers]
        started_here = (
            self.record.job_started_at is not None
            and self.record.job_incarnation == current.incarnation
        )
        waiting = [w for w in workers if w.state in WAITING_STATES]
        live = any(s in contract.LIVE_STATES for s in states)
        if waiting and not live:
            return self._start(current, workers, started_here)
        if waiting:  # a replaced slice (a new disk) among running ones: start it there only
            return self._start(current, waiting, started_here, only=True)
        if live:
            return self._running(current, workers, started_here)
        return self._ended(current, workers)

    def _unreadable(
        self, current: SliceSeen, workers: Sequence[WorkerSeen], unread: Sequence[WorkerSeen]
    ) -> Decision:
        first = unread[0]
        why = first.error or first.reason or first.state
        message = (
            f"{self.name}: {len(unread)} of {len(workers)} workers cannot be read "
            f"({first.label}: {why}); deciding nothing about the job until they can"
        )
        since = self.record.job_started_at
        if since is None:
            active_since = _first_time(self.record.provisioning_since, current.incarnation)
            since = active_since
        if (
            self.record.running_boots is None
            and since is not None
            and self._since(since) > self.policy.running_timeout
        ):
            return self.give_up(
                "unreachable",
                ExitCode.UNREACHABLE,
                f"{self.name}: the workers could not be reached for "
                f"{format_duration(self._since(since))} ({first.label}: {why})",
                hint="check the SSH path: tpuctl doctor SPEC",
            )
        return self.wait(f"unread:{current.incarnation}", message, self.policy.job_check_every)

    def _start(
        self,
        current: SliceSeen,
        workers: Sequence[WorkerSeen],
        started_here: bool,
        *,
        only: bool = False,
    ) -> Decision:
        # Delivered a moment ago and not seen running since: the delivery is still arriving.
        # (Waiting after the job ran is new: a replaced slice's new disk.)
        arriving = started_here and self.record.running_boots is None
        if arriving and self._since(self.record.job_started_at) < REDELIVER_AFTER:
            states = _describe(workers)
            return self.wait(
                f"starting:{current.incarnation}",
                f"{self.name}: the job was delivered; waiting for the workers to start it "
                f"({states})",
                FAST,
            )
        if self.record.start_failures >= self.policy.start_attempts:
            return self.give_up(
                "error",
                ExitCode.ERROR,
                f"{self.name}: could not start the job after {self.record.start_failures} attempts",
                hint="see tpuctl report SPEC for the workers' last log lines",
            )
        why = {
            "waiting-for-code": "waiting for the code",
            "waiting-for-zone": f"booted before {current.zone} was claimed for the run",
            "none": "not started yet",
        }
        reasons = sorted({why.get(w.state, w.state) for w in workers})
        if only:
            labels = ", ".join(w.label for w in workers)
            return self.make(
                START,
                f"{self.name}: {len(workers)} workers wait for the code or the claim "
                f"({labels}: {'; '.join(reasons)}, a new disk) while the others run: "
                "delivering it to them",
                zones=(current.zone,),
                workers=tuple(w.label for w in workers),
            )
        return self.make(
            START,
            f"{self.name}: delivering and starting the job ({'; '.join(reasons)})",
            zones=(current.zone,),
        )

    def _running(
        self, current: SliceSeen, workers: Sequence[WorkerSeen], started_here: bool
    ) -> Decision:
        boots = {w.label: w.boot for w in workers}
        states = [w.state for w in workers]
        record = self.record
        if "running" in states:
            if record.running_boots is None:
                picked_up = not started_here and record.recovering is None
                resumed = self._resumed_from(workers) if record.recovering else None
                message = (
                    f"{self.name}: the job is already running ({_describe(workers)}); "
                    "supervising it without a restart"
                    if picked_up
                    else f"{self.name}: the job is running ({_describe(workers)})"
                ) + (f"; resumed from step {resumed}" if resumed is not None else "")
                self.note(
                    "job.running",
                    message,
                    zone=current.zone,
                    boots=boots,
                    already=picked_up or None,
                    recovering=record.recovering,
                    incarnation=current.incarnation,
                    resumed_from=resumed,
                )
            elif any((boots.get(k) or 0) > (v or 0) for k, v in record.running_boots.items()):
                resumed = self._resumed_from(workers)
                self.note(
                    "job.relaunched",
                    f"{self.name}: the job relaunched itself after a reboot (maintenance, a "
                    f"repair or a reset; boots {_boots(boots)}): not a failure"
                    + (f"; resumed from step {resumed}" if resumed is not None else ""),
                    zone=current.zone,
                    boots=boots,
                    recovering=record.recovering,
                    incarnation=current.incarnation,
                )
            step = self._last_step()
            progress = f" (step {step})" if step is not None else ""
            return self.make(
                WAIT,
                f"{self.name}: the job runs on {len(workers)} workers{progress}",
                next_in=self.policy.job_check_every,
                running=_describe(workers),
            )
        # Starting or in its setup: not running yet.
        since = record.job_started_at
        if started_here and since is not None and self._since(since) > self.policy.running_timeout:
            return self.give_up(
                "error",
                ExitCode.ERROR,
                f"{self.name}: the job did not reach running within "
                f"{format_duration(self.policy.running_timeout)} ({_describe(workers)})",
                hint="see tpuctl report SPEC for the workers' last log lines",
            )
        return self.wait(
            f"setup:{current.incarnation}",
            f"{self.name}: the job is starting ({_describe(workers)})",
            FAST,
        )

    def _ended(self, current: SliceSeen, workers: Sequence[WorkerSeen]) -> Decision:
        """Every worker ended the job: decided only after the settle period with nothing
        disrupting the nodes (see the module doc)."""
        record, policy = self.record, self.policy
        key = ending_key(workers)
        if key in record.failed_endings:
            return self._restart(key, current, workers)
        if record.ended is None or record.ended.key != key:
            codes = sorted({w.exit_code for w in workers if w.exit_code is not None})
            self.note(
                "job.ended",
                f"{self.name}: the job ended on every worker ({_describe(workers)}); waiting "
                f"{format_duration(policy.settle)} for the nodes to settle before deciding",
                key=key,
                exit_codes=codes,
            )
            return self.make(WAIT, f"{self.name}: the job ended; settling", next_in=FAST)
        disruption = current.disruption
        end = current.termination_time
        stopped = not all(_finished(w) for w in workers)  # a SIGTERM, or not all exited 0
        if (
            disruption is None
            and end is not None
            and stopped
            and self._time_is_up(current, END_NEAR)
        ):
            disruption = (
                f"the run's time is up at {rfc3339(end)} (its maximum run duration): the job "
                "was stopped to save before it"
            )
        if disruption is not None:
            current = replace(current, disruption=disruption)
            if current.disruption != record.ended.disruption:
                self.note(
                    "job.disrupted",
                    f"{self.name}: the job exited and {current.disruption}: a disruption, not "
                    "the job's end (it resumes when the workers are back)",
                    disruption=current.disruption,
                    exit_codes=sorted({w.exit_code for w in workers if w.exit_code is not None}),
                )
            return self.make(WAIT, f"{self.name}: {current.disruption}", next_in=FAST)
        waited = self._since(record.ended.since)
        if waited < policy.settle:
            return self.make(
                WAIT,
                f"{self.name}: the job ended; settling ({format_duration(policy.settle - waited)}"
                " to go)",
                next_in=min(policy.settle - waited, 5.0),
            )
        if all(_finished(w) for w in workers):
            found = sorted({w.boot for w in workers if w.boot is not None})
            reason = (
                f"every worker of every slice exited 0 in boot {','.join(map(str, found))} and "
                f"nothing disrupted the nodes in the {format_duration(policy.settle)} after the "
                "last exit"
            )
            return self.make(MARK_DONE, f"{self.name}: done: {reason}", why=reason)
        return self._failed(key, current, workers)

    def _failed(self, key: str, current: SliceSeen, workers: Sequence[WorkerSeen]) -> Decision:
        record, policy = self.record, self.policy
        count = record.failures + 1
        latest = self.seen.latest_step
        codes = sorted({w.exit_code for w in workers if w.exit_code is not None})
        self.note(
            "job.failed",
            f"{self.name}: the job ended on every worker without being done "
            f"({_why_failed(workers)}; latest checkpoint "
            f"{'step ' + str(latest) if latest is not None else 'none'}); failure {count}, "
            f"budget {policy.max_failures}",
            ending=key,
            count=count,
            budget=policy.max_failures,
            exit_codes=codes,
            latest_step=latest,
            last_step=self._last_step(),
            states=[w.state for w in workers],
        )
        window = policy.crashloop_restarts
        steps = record.restart_steps
        if len(steps) >= window and not _advanced(latest, steps[-window]):
            self.note(
                "crashloop",
                f"{self.name}: crash loop: the latest checkpoint "
                f"({'step ' + str(latest) if latest is not None else 'none'}) did not advance "
                f"across the last {window} restarts; giving up",
                latest_step=latest,
                steps_at_restarts=steps[-window:],
            )
            return self.give_up(
                "command_failed",
                ExitCode.COMMAND_FAILED,
                f"{self.name}: crash loop: {window} restarts brought no new checkpoint "
                f"(latest step {latest if latest is not None else 'none'})",
                hint="fix the job and run tpuctl up again; its last log lines: tpuctl report SPEC",
                failures=count,
                reason="crashloop",
            )
        if count > policy.max_failures:
            return self.give_up(
                "command_failed",
                ExitCode.COMMAND_FAILED,
                f"{self.name}: the job failed {count} times; recovery.max_failures is "
                f"{policy.max_failures}: gave up",
                hint="its last log lines: tpuctl report SPEC",
                failures=count,
                reason="failure budget exhausted",
            )
        return self._restart(key, current, workers)

    def _restart(self, key: str, current: SliceSeen, workers: Sequence[WorkerSeen]) -> Decision:
        if self.record.restarts and self._restarted_for(key):
            return self.wait(
                f"restarting:{key}",
                f"{self.name}: restarted the job; waiting for it to run",
                FAST,
            )
        latest = self.seen.latest_step
        return self.make(
            RESTART,
            f"{self.name}: restarting the job (restart {self.record.restarts + 1}; it resumes "
            f"from step {latest if latest is not None else 0})",
            zones=(current.zone,),
            from_step=latest,
            ending=key,
        )

    def _restarted_for(self, key: str) -> bool:
        return self.record.restarted_endings.count(key) > 0


def _first_time(times: Mapping[str, str], key: str | None) -> datetime | None:
    return parse_rfc3339(times.get(key or "")) if key else None


def give_up_of(error: Mapping[str, Any] | None) -> GiveUp | None:
    if not error:
        return None
    return GiveUp(
        str(error.get("kind") or "error"),
        int(error.get("exit_code") or ExitCode.ERROR),
        str(error.get("message") or ""),
        error.get("hint"),
        dict(error.get("details") or {}),
    )


def _finished(worker: WorkerSeen) -> bool:
    """This worker's part ended well: exit 0 (or its own done marker) and no SIGTERM."""
    ended_well = worker.state == "done" or (worker.state == "exited" and worker.exit_code == 0)
    return ended_well and not worker.signalled


def _why_failed(workers: Sequence[WorkerSeen]) -> str:
    parts = []
    failed = [w.label for w in workers if w.state == "setup-failed"]
    if failed:
        parts.append(f"setup failed on {', '.join(failed)}")
    codes = sorted({w.exit_code for w in workers if w.exit_code not in (None, 0)})
    if codes:
        parts.append(f"exit codes {', '.join(map(str, codes))}")
    signalled = [w.label for w in workers if w.signalled]
    if signalled:
        parts.append(f"stopped by a SIGTERM on {', '.join(signalled)} and no reboot followed")
    return "; ".join(parts) or "every worker exited"


def _describe(workers: Sequence[WorkerSeen]) -> str:
    counts: dict[str, int] = {}
    for worker in workers:
        counts[worker.state] = counts.get(worker.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def _boots(boots: Mapping[str, int | None]) -> str:
    return ", ".join(f"{label} {boot}" for label, boot in sorted(boots.items()))


def _advanced(latest: int | None, earlier: int | None) -> bool:
    if latest is None:
        return False
    return earlier is None or latest > earlier
