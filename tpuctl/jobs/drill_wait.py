"""What `tpuctl drill` waits for: the job running with its progress showing before the event,
every worker back on a new boot after it, and progress again (step lines, or committed
checkpoints when the log has none). Each wait ends at the drill's deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.errors import TpuctlError

if TYPE_CHECKING:
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.jobs.drill import Drill
    from tpuctl.jobs.drill_verdict import DrillReport
    from tpuctl.storage.logs import LogFacts


class DrillWaits:
    """The waits of one Drill, which owns the deadline, the job operations and the record."""

    def __init__(self, owner: Drill) -> None:
        self.owner = owner

    def preflight(
        self, report: DrillReport, observer: WorkerTarget
    ) -> dict[str, tuple[int | None, int | None]]:
        """Wait until every worker runs the job and its progress shows: the observer logged two
        steps apart, or (a log with no step lines it recognises) a committed checkpoint."""
        owner = self.owner
        first: tuple[int, float] | None = None
        running_since: float | None = None
        first_checkpoint: int | None = None
        while True:
            owner.left("the job to be running on every worker, its progress showing")
            statuses = owner.statuses()
            now = owner.clock.monotonic()
            if statuses and all(s.state == "running" for s in statuses):
                running_since = now if running_since is None else running_since
                boots = {s.label: (s.boot, s.pid) for s in statuses}
                facts = owner.facts(observer)
                if facts.last_step is not None:
                    if first is None:
                        first = (facts.last_step, now)
                    elif facts.last_step > first[0]:
                        report.step_before_trigger = facts.last_step
                        report.step_seconds = (now - first[1]) / (facts.last_step - first[0])
                        return boots
                elif facts.step_lines == 0:
                    latest = self.latest_checkpoint()
                    first_checkpoint = first_checkpoint if first_checkpoint else latest
                    advanced = latest is not None and latest != first_checkpoint
                    if advanced or now - running_since >= owner.options.progress_patience:
                        if latest is None:
                            raise self.blind(observer)
                        report.progress_from = "checkpoints"
                        report.step_before_trigger = latest
                        report.notes.append(
                            f"no step lines in the log of worker {observer.label} match "
                            f"{owner.pattern.pattern!r}: progress read from committed "
                            "checkpoints, so steps between checkpoints are not visible"
                        )
                        return boots
            elif statuses and all(s.state == "done" for s in statuses):
                raise TpuctlError(
                    f"drill on {owner.name}: the job has already finished; nothing to disrupt",
                    name=owner.name,
                )
            else:
                running_since = None
            owner.clock.sleep(owner.options.poll)

    def latest_checkpoint(self) -> int | None:
        owner = self.owner
        steps = owner.record.complete_steps() if owner.record is not None else ()
        return max(steps) if steps else None

    def blind(self, observer: WorkerTarget) -> TpuctlError:
        """Neither step lines nor checkpoints: say what was looked for, and where."""
        owner = self.owner
        where = (
            f"no committed checkpoint under {owner.record.location}"
            if owner.record is not None and owner.record.location
            else "no checkpoint.dir to look in (no spec, or none in it)"
        )
        return TpuctlError(
            f"drill on {owner.name}: cannot see the job's progress after "
            f"{owner.options.progress_patience:g} s of it running: no line in the log of worker "
            f"{observer.label} matches {owner.pattern.pattern!r}, and {where}",
            hint="give --step-pattern a regular expression whose first group is the step number "
            "in your trainer's log lines, or set checkpoint.dir where the job writes its "
            "checkpoints",
            name=owner.name,
            waiting_for="progress",
        )

    def wait_back(
        self, before: dict[str, tuple[int | None, int | None]]
    ) -> dict[str, tuple[int | None, int | None]]:
        """Every worker running (or done) a new boot of the job: another (boot, pid) than
        before on each; a disk that waits for the code gets it (unless tpuctl up does that)."""
        owner = self.owner
        delivered_at = -1e9
        while True:
            owner.left("the job to run again on every worker with a new boot")
            statuses = owner.statuses()
            now = owner.clock.monotonic()
            if statuses:
                waiting = any(s.state == "waiting-for-code" for s in statuses)
                if (
                    waiting
                    and not owner.options.external_recovery
                    and owner.spec is not None
                    and now - delivered_at > 15.0
                ):
                    owner.jobs.deliver_and_start(owner.fleet, owner.spec)
                    delivered_at = now
                current = {s.label: (s.boot, s.pid) for s in statuses}
                # Every slice restarts (multislice repair restarts the others too); a killed
                # worker's status file still says running with its old pid until it reboots.
                fresh = all(current[label] != before.get(label) for label in current)
                if fresh and all(s.state in ("running", "done") for s in statuses):
                    return current
            owner.clock.sleep(owner.options.poll)

    def wait_new_steps(self, observer: WorkerTarget) -> LogFacts:
        owner = self.owner
        while True:
            owner.left("the job to log steps after the restart")
            facts = owner.facts(observer)
            if facts.step_lines > 0 and facts.resume_point is not None:
                return facts
            statuses = owner.statuses()
            if statuses and all(s.state == "done" for s in statuses):
                return facts
            owner.clock.sleep(owner.options.poll)

    def wait_new_checkpoint(self, resumed_from: int | None) -> None:
        """Progress after the restart, seen without step lines: a checkpoint past the one the
        job resumed from, or the job done."""
        owner = self.owner
        while True:
            owner.left("a new committed checkpoint after the restart")
            latest = self.latest_checkpoint()
            if latest is not None and (resumed_from is None or latest > resumed_from):
                return
            statuses = owner.statuses()
            if statuses and all(s.state == "done" for s in statuses):
                return
            owner.clock.sleep(owner.options.poll)
