"""The job's part of a reconcile decision, once its slice set is ACTIVE: start it where it
does not run, follow it while it runs, and once every worker ended it, wait for the settle
period; then done, a restart within the budget, or a give-up (a crash loop, a job that never
starts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from tpuctl import worker as contract
from tpuctl.clock import format_duration, parse_rfc3339, rfc3339
from tpuctl.errors import ExitCode
from tpuctl.jobs.reconcile.decision import (
    END_NEAR,
    FAST,
    MARK_DONE,
    REDELIVER_AFTER,
    RESTART,
    START,
    TIME_UP_SLACK,
    WAIT,
    WAITING_STATES,
    DeciderBase,
    Decision,
    ending_key,
)
from tpuctl.jobs.reconcile.seen import SliceSeen, WorkerSeen


class JobSteps(DeciderBase):
    def _time_is_up(self, current: SliceSeen, slack: float = TIME_UP_SLACK) -> bool:
        end = current.termination_time
        return end is not None and (end - self.now).total_seconds() <= slack

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
