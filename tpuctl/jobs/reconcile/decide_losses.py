"""What the platform takes back, in a reconcile decision: a slice SUSPENDED (a spot
preemption) or FAILED after ACTIVE, one gone though tpuctl did not delete it, and a
flex-start run's end (neither a preemption nor a failure). Each is counted once per
incarnation of the slice; a preemption is deleted and created again under the same run name
within recovery.max_preemptions (or climbs a capacity ladder), a run's end starts a new run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tpuctl.clock import parse_rfc3339, rfc3339
from tpuctl.cloud.watcher import GONE, SUSPENDED_STATES
from tpuctl.errors import ExitCode
from tpuctl.jobs.reconcile.decide_job import JobSteps
from tpuctl.jobs.reconcile.decision import DELETE, TIME_UP_SLACK, Decision
from tpuctl.jobs.reconcile.seen import SliceSeen


class Losses(JobSteps):
    """Preemptions, vanished slices and run ends (where the run lives is decide._Decider)."""

    # Where the run lives decides these (decide._Decider).
    def _create(self, zones: tuple[str, ...]) -> Decision:
        raise NotImplementedError

    def _climb_instead(self, why: str, present: Sequence[SliceSeen]) -> Decision | None:
        raise NotImplementedError

    def _vanished(self) -> Decision | None:
        """The run's queued resource is gone though nothing of tpuctl's deleted it (someone
        did, or the service): count it like a preemption if it had been ACTIVE, and go on."""
        for zone in self.policy.zones:
            said = self.record.states.get(zone)
            incarnation = self.record.incarnations.get(zone)
            if said in (None, GONE, "DELETING") or self.seen.slices.get(zone) is None:
                continue
            was_active = incarnation in self.record.ever_active
            if was_active and incarnation and self._taken_back(zone, incarnation):
                continue  # its run's time was up: the next step makes a new run
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

    def _taken_back(self, zone: str, incarnation: str) -> bool:
        """A flex-start slice gone at its run's end (Compute Engine deletes such a VM): a
        run end, noted once, not a preemption."""
        end = parse_rfc3339(self.record.ends_at.get(incarnation))
        if end is None or (end - self.now).total_seconds() > TIME_UP_SLACK:
            return False
        self._note_run_end(zone, incarnation, end)
        return True

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

    def _run_ended(self, current: SliceSeen, incarnation: str) -> Decision:
        """A flex-start run reached its maximum run duration and was taken back: the job
        saved before it (the startup script stops it ahead of the end); a new run under the
        same run name resumes it."""
        self._note_run_end(current.zone, incarnation, current.termination_time)
        return self.make(
            DELETE,
            f"deleted {self.name}: its run's time was up; a new run follows",
            zones=(current.zone,),
            why="its run's time was up",
        )

    def _note_run_end(self, zone: str, incarnation: str, end: datetime | None) -> None:
        """run.ended, once per incarnation: neither a preemption nor a failure."""
        if incarnation in self.record.run_ends:
            return
        ends = len(self.record.run_ends) + 1
        when = rfc3339(end) if end else "?"
        self.note(
            "run.ended",
            f"{self.name}'s run {ends} reached its maximum run duration (at {when}) and was "
            "taken back: not a preemption nor a failure; a new run resumes the job",
            zone=zone,
            incarnation=incarnation,
            count=ends,
            termination_time=end,
            checkpoint_step=self.seen.latest_step,
            last_step=self._last_step(),
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
