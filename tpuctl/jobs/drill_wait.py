"""What `tpuctl drill` waits for: the job running with its progress showing before the event,
every worker back on a new boot after it, and progress again (step lines, or committed
checkpoints when the log has none). Each wait ends at the drill's deadline.

The waits are given what they read (`WaitInputs`), never the Drill itself, so they are
unit-tested alone with fake job operations and a fake clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl.errors import DeadlineError, TpuctlError, quoted

if TYPE_CHECKING:
    from tpuctl.clock import Clock
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.jobs.adapters import JobOps, JobRecord, WorkerStatus
    from tpuctl.jobs.drill_verdict import DrillReport
    from tpuctl.spec.model import Spec
    from tpuctl.storage.logs import LogFacts

# A disk that waits for its code is given it again at most this often (seconds).
REDELIVER_EVERY = 15.0
# Each worker's job as (boot, pid): a new boot or a new process shows the job restarted.
Boots = dict[str, tuple[int | None, int | None]]


class DrillFleet:
    """The drill's workers, resolved on first use and again after `forget` (new VMs after a
    preemption or a replaced slice bring new addresses and host keys)."""

    def __init__(self, resolve: Callable[[], Fleet]) -> None:
        self._resolve = resolve
        self._fleet: Fleet | None = None

    def get(self) -> Fleet:
        if self._fleet is None:
            self._fleet = self._resolve()
        return self._fleet

    def forget(self) -> None:
        self._fleet = None


@dataclass(frozen=True)
class WaitInputs:
    """What the drill's waits read: given by the Drill when it starts."""

    name: str  # the queued resource, for messages
    clock: Clock
    deadline: float  # monotonic: past it, every wait raises DeadlineError
    timeout: float  # the seconds the deadline was set from, for its message
    poll: float  # seconds between two looks
    # How long the job may run on every worker with no step line in its log before progress
    # is read from committed checkpoints instead, or (with none) the drill gives up.
    progress_patience: float
    pattern: re.Pattern[str]  # a step line of the trainer's log, the step in group 1
    jobs: JobOps
    job_spec: Spec  # what statuses and logs are read with (the spec, or a bare one for NAME)
    # A disk that waits for its code is given this spec's; None: leave it (no spec, or
    # `tpuctl up` recovers the job and delivers it).
    redeliver: Spec | None
    record: JobRecord | None  # committed checkpoints, when the spec has a checkpoint.dir
    fleet: DrillFleet


class DrillWaits:
    """The waits of one drill, and the reads they are made of."""

    def __init__(self, inputs: WaitInputs) -> None:
        self.inputs = inputs

    # ------------------------------------------------------------------------------ reads

    def left(self, what: str) -> None:
        """DeadlineError, naming `what` was awaited, once the drill's deadline has passed."""
        inputs = self.inputs
        if inputs.clock.monotonic() > inputs.deadline:
            raise DeadlineError(
                f"drill on {inputs.name}: gave up after {inputs.timeout:g} s waiting for {what}",
                hint="raise --timeout, or look at tpuctl status / tpuctl logs",
                name=inputs.name,
                waiting_for=what,
            )

    def statuses(self) -> list[WorkerStatus]:
        """Every worker's job, or [] when they cannot be read (resolved again next time)."""
        inputs = self.inputs
        try:
            return list(inputs.jobs.job_status(inputs.fleet.get(), inputs.job_spec))
        except TpuctlError:
            inputs.fleet.forget()
            return []

    def read(
        self, target: WorkerTarget, boot: int | None, *, connect_timeout: float | None = None
    ) -> str:
        """A worker's job log of `boot` (None: the current one), or "" when unreadable;
        `connect_timeout` shortens the fleet's for a worker that may be going down."""
        inputs = self.inputs
        try:
            fleet = inputs.fleet.get()
            if connect_timeout is not None:
                fleet = fleet.connecting_within(connect_timeout)
            return inputs.jobs.read_log(fleet, inputs.job_spec, target, boot)
        except TpuctlError:
            return ""

    def facts(self, target: WorkerTarget, boot: int | None = None) -> LogFacts:
        from tpuctl.storage.logs import parse_log

        return parse_log(self.read(target, boot), self.inputs.pattern)

    def latest_checkpoint(self) -> int | None:
        record = self.inputs.record
        steps = record.complete_steps() if record is not None else ()
        return max(steps) if steps else None

    # ------------------------------------------------------------------------------ waits

    def preflight(self, report: DrillReport, observer: WorkerTarget) -> Boots:
        """Wait until every worker runs the job and its progress shows: the observer logged two
        steps apart, or (a log with no step lines it recognises) a committed checkpoint."""
        inputs = self.inputs
        first: tuple[int, float] | None = None
        running_since: float | None = None
        first_checkpoint: int | None = None
        while True:
            self.left("the job to be running on every worker, its progress showing")
            statuses = self.statuses()
            now = inputs.clock.monotonic()
            if statuses and all(s.state == "running" for s in statuses):
                running_since = now if running_since is None else running_since
                boots = {s.label: (s.boot, s.pid) for s in statuses}
                facts = self.facts(observer)
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
                    if advanced or now - running_since >= inputs.progress_patience:
                        if latest is None:
                            raise self.blind(observer)
                        report.progress_from = "checkpoints"
                        report.step_before_trigger = latest
                        report.notes.append(
                            f"no step lines in the log of worker {observer.label} match "
                            f"{quoted(inputs.pattern.pattern)}: progress read from committed "
                            "checkpoints, so steps between checkpoints are not visible"
                        )
                        return boots
            elif statuses and all(s.state == "done" for s in statuses):
                raise TpuctlError(
                    f"drill on {inputs.name}: the job has already finished; nothing to disrupt",
                    name=inputs.name,
                )
            else:
                running_since = None
            inputs.clock.sleep(inputs.poll)

    def blind(self, observer: WorkerTarget) -> TpuctlError:
        """Neither step lines nor checkpoints: say what was looked for, and where."""
        inputs = self.inputs
        record = inputs.record
        where = (
            f"no committed checkpoint under {record.location}"
            if record is not None and record.location
            else "no checkpoint.dir to look in (no spec, or none in it)"
        )
        return TpuctlError(
            f"drill on {inputs.name}: cannot see the job's progress after "
            f"{inputs.progress_patience:g} s of it running: no line in the log of worker "
            f"{observer.label} matches {quoted(inputs.pattern.pattern)}, and {where}",
            hint="give --step-pattern a regular expression whose first group is the step number "
            "in your trainer's log lines, or set checkpoint.dir where the job writes its "
            "checkpoints",
            name=inputs.name,
            waiting_for="progress",
        )

    def wait_back(self, before: Boots) -> Boots:
        """Every worker running (or done) a new boot of the job: another (boot, pid) than
        before on each; a disk that waits for the code gets it (unless tpuctl up does that)."""
        inputs = self.inputs
        delivered_at = -1e9
        while True:
            self.left("the job to run again on every worker with a new boot")
            statuses = self.statuses()
            now = inputs.clock.monotonic()
            if statuses:
                waiting = any(s.state == "waiting-for-code" for s in statuses)
                if (
                    waiting
                    and inputs.redeliver is not None
                    and now - delivered_at > REDELIVER_EVERY
                ):
                    inputs.jobs.deliver_and_start(inputs.fleet.get(), inputs.redeliver)
                    delivered_at = now
                current = {s.label: (s.boot, s.pid) for s in statuses}
                # Every slice restarts (multislice repair restarts the others too); a killed
                # worker's status file still says running with its old pid until it reboots.
                fresh = all(current[label] != before.get(label) for label in current)
                if fresh and all(s.state in ("running", "done") for s in statuses):
                    return current
            inputs.clock.sleep(inputs.poll)

    def wait_new_steps(self, observer: WorkerTarget) -> LogFacts:
        """The observer logging steps after the restart (with where it resumed), or the job
        done."""
        inputs = self.inputs
        while True:
            self.left("the job to log steps after the restart")
            facts = self.facts(observer)
            if facts.step_lines > 0 and facts.resume_point is not None:
                return facts
            statuses = self.statuses()
            if statuses and all(s.state == "done" for s in statuses):
                return facts
            inputs.clock.sleep(inputs.poll)

    def wait_new_checkpoint(self, resumed_from: int | None) -> None:
        """Progress after the restart, seen without step lines: a checkpoint past the one the
        job resumed from, or the job done."""
        inputs = self.inputs
        while True:
            self.left("a new committed checkpoint after the restart")
            latest = self.latest_checkpoint()
            if latest is not None and (resumed_from is None or latest > resumed_from):
                return
            statuses = self.statuses()
            if statuses and all(s.state == "done" for s in statuses):
                return
            inputs.clock.sleep(inputs.poll)
