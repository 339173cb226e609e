"""The job side of `tpuctl up`: start the job, read every worker's status, and decide what it
means: running, relaunched after a reboot, waiting for its code, done, failed, a crash loop.

`JobWatch` belongs to one Babysitter (tpuctl.jobs.up), which owns the queued resource; it acts
through the babysitter's injected job operations, record and journal (what it needs of its
owner is `JobOwner`), and never sleeps.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl import worker as contract
from tpuctl.errors import ApiUnavailableError, CommandFailedError, TpuctlError
from tpuctl.storage.logs import LogFacts, parse_log

if TYPE_CHECKING:
    from tpuctl.clock import Clock
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult
    from tpuctl.jobs.adapters import JobOps, JobRecord, QueuedResourceOps, WorkerStatus
    from tpuctl.spec.model import Spec


class JobSettings(Protocol):
    """What the job watch reads of `up`'s options (tpuctl.jobs.up.UpOptions)."""

    @property
    def job_check_every(self) -> float: ...
    @property
    def settle(self) -> float: ...
    @property
    def crashloop_restarts(self) -> int: ...
    @property
    def start_attempts(self) -> int: ...
    @property
    def running_timeout(self) -> float: ...


class JobTally(Protocol):
    """The counts of `up`'s result the job watch keeps (tpuctl.jobs.up.UpResult)."""

    failures: int
    restarts: int
    latest_step: int | None


class JobOwner(Protocol):
    """What a JobWatch needs of the babysitter that owns it (tpuctl.jobs.up.Babysitter)."""

    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> Spec: ...
    @property
    def options(self) -> JobSettings: ...
    @property
    def result(self) -> JobTally: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def jobs(self) -> JobOps: ...
    @property
    def record(self) -> JobRecord: ...
    @property
    def qr(self) -> QueuedResourceOps: ...
    @property
    def fleet(self) -> Fleet: ...
    def emit(self, kind: str, message: str, **fields: Any) -> None: ...
    def forget_fleet(self) -> None: ...
    def check_stop(self) -> None: ...


# How often the job is read while an ending settles (the settle period itself is UpOptions').
SETTLE_POLL = 5.0


class JobDone(Exception):
    """The job has finished for good (the babysitter then deletes the queued resource)."""


@dataclass
class _Ended:
    """Every worker has ended the job, as first seen at `since` (monotonic, restarted while a
    disruption shows), and the disruption seen meanwhile, if any."""

    key: tuple[tuple[str, int | None, int | None, str, int | None], ...]
    since: float
    disruption: str | None = None


class JobWatch:
    """The job's state as `up` last saw it, and the decisions taken on it."""

    def __init__(self, owner: JobOwner) -> None:
        self.owner = owner
        self.boots: dict[str, int | None] = {}
        self.ended: _Ended | None = None
        self.awaiting_running_since: float | None = None
        self.restart_steps: list[int | None] = []  # the latest checkpoint at each restart
        self.disruption: str | None = None  # what the job is recovering from, if anything
        self.last_step: tuple[int, datetime] | None = None
        self.step_seconds: float | None = None
        self.next_check = 0.0

    # ------------------------------------------------------------------------- starting

    def start(self, *, resume_existing: bool) -> None:
        """Start the job, or (on a queued resource that was ACTIVE already) pick it up."""
        owner = self.owner
        if resume_existing:
            statuses = self.statuses()
            states = [status.state for status in statuses]
            if statuses and all(state == "done" for state in states):
                owner.emit("job.done", f"{owner.name}: every worker reports done")
                raise JobDone
            live = [s for s in statuses if s.state in contract.LIVE_STATES]
            waiting = [s for s in statuses if s.state == "waiting-for-code"]
            if live and not waiting:
                self.boots = _boots_of(statuses)
                owner.emit(
                    "job.running",
                    f"{owner.name}: the job is already running ({_describe(statuses)}); "
                    "babysitting it without a restart",
                    boots=self.boots,
                    already=True,
                )
                self.next_check = owner.clock.monotonic() + owner.options.job_check_every
                return
        self.deliver()

    def deliver(self) -> None:
        """Deliver the code and (re)run the startup script everywhere; a few tries, since SSH
        right after ACTIVE can be early."""
        owner = self.owner
        attempts = max(1, owner.options.start_attempts)
        result: FanoutResult | None = None
        for attempt in range(1, attempts + 1):
            result = owner.jobs.deliver_and_start(owner.fleet, owner.spec)
            owner.check_stop()
            if not int(result.exit_code):
                break
            owner.emit(
                "job.start_failed",
                f"delivering/starting the job failed on {len(result.failed)} of "
                f"{len(result)} workers (attempt {attempt} of {attempts})",
                attempt=attempt,
                workers=[w.target.label for w in result.failed],
            )
            owner.forget_fleet()
            if attempt < attempts:
                owner.clock.sleep(5.0)
        assert result is not None
        if int(result.exit_code):
            error = result.error()
            raise error if error is not None else TpuctlError("could not start the job")
        owner.emit(
            "job.started",
            f"{owner.name}: job delivered and started on {len(result)} workers",
            workers=len(result),
            recovering=self.disruption,
        )
        self.awaiting_running_since = owner.clock.monotonic()
        self.ended = None
        self.next_check = owner.clock.monotonic() + 1.0

    def statuses(self) -> Sequence[WorkerStatus]:
        owner = self.owner
        try:
            statuses = owner.jobs.job_status(owner.fleet, owner.spec)
        except TpuctlError:
            owner.check_stop()
            owner.forget_fleet()  # addresses or host keys may have changed: resolve again
            statuses = owner.jobs.job_status(owner.fleet, owner.spec)
        owner.check_stop()
        return statuses

    # ------------------------------------------------------------------------- watching

    def check(self) -> None:
        """Read every worker's job and act on what it says."""
        owner = self.owner
        now = owner.clock.monotonic()
        statuses = self.statuses()
        self.next_check = now + (
            1.0 if self.awaiting_running_since is not None else owner.options.job_check_every
        )
        reachable = [s for s in statuses if s.reachable]
        if not statuses or len(reachable) < len(statuses):
            return  # decide nothing on a partial view
        if any(s.state in (contract.UNREADABLE, contract.NO_STATUS) for s in statuses):
            return  # not readable, or the startup script has not run yet
        states = [s.state for s in statuses]
        if all(state == "done" for state in states):
            owner.emit("job.done", f"{owner.name}: every worker reports done")
            raise JobDone
        if any(state == "waiting-for-code" for state in states):
            # A replaced slice (fresh disk) or a recreated QR: ship the code again.
            owner.emit(
                "job.redeliver",
                f"{owner.name}: {states.count('waiting-for-code')} workers wait for the code "
                "(a new disk); delivering it",
            )
            self.deliver()
            return
        if any(state == "waiting-for-zone" for state in states):
            # Booted before their zone was claimed for the run: run the startup script again.
            owner.emit(
                "job.redeliver",
                f"{owner.name}: {states.count('waiting-for-zone')} workers booted before "
                f"{owner.qr.zone} was claimed for the run; starting the job there",
            )
            self.deliver()
            return
        self.probe_progress()
        if all(state in contract.ENDED_STATES for state in states):
            self._ended(statuses, now)
            return
        self.ended = None
        if any(state == "running" for state in states):
            self._running(statuses)
        elif (
            self.awaiting_running_since is not None
            and now - self.awaiting_running_since > owner.options.running_timeout
        ):
            raise TpuctlError(
                f"{owner.name}: the job did not reach running within "
                f"{owner.options.running_timeout:g} s ({_describe(statuses)})",
                hint=f"see its logs: {logs_command(owner.name)}",
                name=owner.name,
            )

    def _running(self, statuses: Sequence[WorkerStatus]) -> None:
        owner = self.owner
        boots = _boots_of(statuses)
        relaunched = bool(self.boots) and any(
            (boots.get(label) or 0) > (old or 0) for label, old in self.boots.items()
        )
        first = self.awaiting_running_since is not None
        if first or relaunched:
            facts = self.resume_facts()
            if first:
                message = f"{owner.name}: the job is running ({_describe(statuses)})"
            else:
                message = (
                    f"{owner.name}: the job relaunched itself after a reboot (maintenance or "
                    f"reset; boots {boots}): not a failure"
                )
            owner.emit(
                "job.running" if first else "job.relaunched",
                message
                + (f"; resumed from step {facts.resume_point}" if facts.resume_point else ""),
                boots=boots,
                resumed_from=facts.resume_point,
                recovering=self.disruption,
            )
            self.disruption = None
            self.awaiting_running_since = None
        self.boots = boots

    def _ended(self, statuses: Sequence[WorkerStatus], now: float) -> None:
        """Every worker ended the job. What that means is decided only after the settle period
        with nothing disrupting the nodes: an exit followed by a reboot or maintenance is a
        disruption (the job resumes), whatever its code; every worker exiting 0 in the same boot
        is done; anything else is a failure."""
        owner = self.owner
        settle = owner.options.settle
        key = tuple((s.label, s.boot, s.pid, s.state, s.exit_code) for s in statuses)
        if self.ended is None or key != self.ended.key:
            self.ended = _Ended(key, now)
            self.next_check = now + min(settle, 1.0)
            return
        if owner.record.is_done():
            owner.emit("job.done", f"{owner.name}: the done marker appeared")
            raise JobDone
        try:
            disruption = owner.qr.node_disruption([t.node_id for t in owner.fleet.targets])
        except ApiUnavailableError:
            disruption = "the TPU API is unavailable, so the nodes cannot be seen"
        if disruption is not None:
            if disruption != self.ended.disruption:
                owner.emit(
                    "job.disrupted",
                    f"{owner.name}: the job exited and {disruption}: a disruption, not the job's "
                    "end (it resumes when the workers are back)",
                    disruption=disruption,
                    exit_codes=sorted({s.exit_code for s in statuses if s.exit_code is not None}),
                )
            self.ended.disruption = disruption
            self.ended.since = now  # the settle period starts again once it is over
            self.next_check = now + 1.0
            return
        waited = now - self.ended.since
        if waited < settle:
            self.next_check = now + min(settle - waited, SETTLE_POLL)
            return
        if all(_finished(s) for s in statuses):
            self._done(statuses)
        self._failed(statuses)

    def _done(self, statuses: Sequence[WorkerStatus]) -> None:
        """Every worker exited 0 in one boot and the settle period saw no disruption: done,
        written down so that no boot relaunches it."""
        owner = self.owner
        boots = sorted({s.boot for s in statuses if s.boot is not None})
        reason = (
            f"every worker of every slice exited 0 in boot {','.join(map(str, boots))} and "
            f"nothing disrupted the nodes in the {owner.options.settle:g} s after the last exit"
        )
        if not owner.record.write_done(reason):
            owner.jobs.mark_done(owner.fleet, owner.spec, reason)
        owner.emit("job.done", f"{owner.name}: done: {reason}", reason=reason, boots=boots)
        raise JobDone

    def _failed(self, statuses: Sequence[WorkerStatus]) -> None:
        owner = self.owner
        max_failures = owner.spec.recovery.max_failures
        owner.result.failures += 1
        count = owner.result.failures
        checkpoint = owner.record.latest_checkpoint()
        latest = checkpoint[0] if checkpoint else None
        owner.result.latest_step = latest
        codes = sorted({s.exit_code for s in statuses if s.exit_code is not None})
        owner.emit(
            "job.failed",
            f"{owner.name}: the job ended on every worker without being done "
            f"({_why_failed(statuses)}; latest checkpoint {latest}); failure {count}, "
            f"budget {max_failures}",
            count=count,
            budget=max_failures,
            exit_codes=codes,
            latest_step=latest,
            last_step=self.last_step[0] if self.last_step else None,
            step_seconds=self.step_seconds,
            states=[s.state for s in statuses],
        )
        self.ended = None
        self._give_up_on_crash_loop(latest, count)
        if count > max_failures:
            raise CommandFailedError(
                f"{owner.name}: the job failed {count} times; recovery.max_failures is "
                f"{max_failures}: gave up",
                hint=f"see its logs: {logs_command(owner.name)}",
                name=owner.name,
                failures=count,
                reason="failure budget exhausted",
            )
        self.restart_steps.append(latest)
        self.disruption = "failure"
        result = owner.jobs.restart_job(owner.fleet, owner.spec)
        owner.check_stop()
        owner.result.restarts += 1
        owner.emit(
            "job.restarted",
            f"{owner.name}: restarted the job (restart {owner.result.restarts}; it resumes "
            f"from step {latest if latest is not None else 0})",
            count=owner.result.restarts,
            from_step=latest,
            workers_ok=len(result.succeeded),
        )
        self.awaiting_running_since = owner.clock.monotonic()
        self.next_check = owner.clock.monotonic() + 1.0

    def _give_up_on_crash_loop(self, latest: int | None, count: int) -> None:
        """A crash loop: the latest checkpoint did not advance across the last restarts."""
        owner = self.owner
        window = owner.options.crashloop_restarts
        if len(self.restart_steps) < window or _advanced(latest, self.restart_steps[-window]):
            return
        owner.emit(
            "crashloop",
            f"{owner.name}: crash loop: the latest checkpoint ({latest}) did not advance "
            f"across the last {window} restarts; giving up",
            latest_step=latest,
            steps_at_restarts=self.restart_steps[-window:],
        )
        raise CommandFailedError(
            f"{owner.name}: crash loop: {window} restarts brought no new checkpoint "
            f"(latest step {latest})",
            hint=f"fix the job and run tpuctl up again; see {logs_command(owner.name)}",
            name=owner.name,
            failures=count,
            reason="crashloop",
        )

    # ------------------------------------------------------------------------- progress

    def probe_progress(self) -> None:
        """Worker 0's last step, for the step-time estimate and the wasted-progress report."""
        facts = self.resume_facts()
        if facts.last_step is None:
            return
        now = self.owner.clock.now()
        previous = self.last_step
        if previous is not None and facts.last_step > previous[0]:
            elapsed = (now - previous[1]).total_seconds()
            self.step_seconds = elapsed / (facts.last_step - previous[0])
        self.last_step = (facts.last_step, now)

    def resume_facts(self) -> LogFacts:
        owner = self.owner
        if not owner.fleet.targets:
            return LogFacts()
        try:
            return parse_log(
                owner.jobs.read_log(owner.fleet, owner.spec, owner.fleet.targets[0], None)
            )
        except TpuctlError:
            return LogFacts()


def _finished(status: WorkerStatus) -> bool:
    """This worker's part ended well: exit 0 (or its own done marker) and no SIGTERM."""
    ended_well = status.state == "done" or (status.state == "exited" and status.exit_code == 0)
    return ended_well and not status.signalled


def _why_failed(statuses: Sequence[WorkerStatus]) -> str:
    """The workers' endings in a few words: exit codes, setup failures, SIGTERMs."""
    parts = []
    failed = [s.label for s in statuses if s.state == "setup-failed"]
    if failed:
        parts.append(f"setup failed on {', '.join(failed)}")
    codes = sorted({s.exit_code for s in statuses if s.exit_code not in (None, 0)})
    if codes:
        parts.append(f"exit codes {', '.join(map(str, codes))}")
    signalled = [s.label for s in statuses if s.signalled]
    if signalled:
        parts.append(f"stopped by a SIGTERM on {', '.join(signalled)} and no reboot followed")
    return "; ".join(parts) or "every worker exited"


def _boots_of(statuses: Sequence[WorkerStatus]) -> dict[str, int | None]:
    return {status.label: status.boot for status in statuses}


def _describe(statuses: Sequence[WorkerStatus]) -> str:
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status.state] = counts.get(status.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def _advanced(latest: int | None, earlier: int | None) -> bool:
    if latest is None:
        return False
    return earlier is None or latest > earlier


def logs_command(name: str) -> str:
    """The `tpuctl logs` line a person runs to read the job's logs (shell-quoted)."""
    return shlex.join(["tpuctl", "logs", name, "--job"])
