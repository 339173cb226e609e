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
* its job, once ACTIVE (decide_job.py): start it where it does not run, follow it while it
  runs, and once every worker ended it, wait for the settle period: a disruption is not an
  end, every worker exiting 0 in one boot is done, anything else a failure (restart, within
  the budget; a crash loop gives up).

Every decision is one action; what the step must remember goes to the journal as notes.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuctl.clock import format_duration, parse_rfc3339
from tpuctl.cloud.watcher import GONE, QUEUE_STATES, SUSPENDED_STATES
from tpuctl.errors import ExitCode
from tpuctl.jobs.reconcile.decide_losses import Losses
from tpuctl.jobs.reconcile.decision import (
    CLAIM,
    CREATE,
    DELETE,
    DONE,
    FAST,
    FINISH,
    GIVEN_UP,
    NOTHING,
    OUTAGE_SAY_EVERY,
    REFUSE,
    STOPPED,
    WAIT,
    Decision,
    GiveUp,
    Policy,
    give_up_of,
)
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen, SliceSeen


def decide(seen: Seen, record: RunRecord, policy: Policy) -> Decision:
    """The one action this step takes (see the module doc)."""
    return _Decider(seen, record, policy).decide()


class _Decider(Losses):
    """Where the run lives (its job's part is decide_job.JobSteps; what the platform takes
    back, decide_losses.Losses)."""

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
                termination_time=seen.termination_time,
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
