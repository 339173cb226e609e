"""The drill's waits (tpuctl.jobs.drill_wait) alone: given what they read, never the Drill, and
driven by fake job operations, a fake record and a fake clock that moves only when they sleep."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jobs.fakes import FakeClock, FakeJobs, FakeRecord, Status, fleet, spec
from tpuctl.errors import DeadlineError, TpuctlError
from tpuctl.fanout.operations import Fleet
from tpuctl.jobs.drill_verdict import DrillReport
from tpuctl.jobs.drill_wait import REDELIVER_EVERY, DrillFleet, DrillWaits, WaitInputs
from tpuctl.spec.model import Spec
from tpuctl.storage.logs import compile_step_pattern

JOB = spec()


class Resolves:
    """A fleet factory that counts how often the workers were resolved."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> Fleet:
        self.count += 1
        return fleet()


def waits(
    time: FakeClock,
    jobs: FakeJobs,
    *,
    record: FakeRecord | None = None,
    redeliver: Spec | None = JOB,
    timeout: float = 60.0,
    patience: float = 10.0,
    resolve: Resolves | None = None,
) -> DrillWaits:
    clock = time.clock()
    return DrillWaits(
        WaitInputs(
            name="job",
            clock=clock,
            deadline=clock.monotonic() + timeout,
            timeout=timeout,
            poll=0.5,
            progress_patience=patience,
            pattern=compile_step_pattern(None),
            jobs=jobs,
            job_spec=JOB,
            redeliver=redeliver,
            record=record,
            fleet=DrillFleet(resolve or Resolves()),
        )
    )


def report() -> DrillReport:
    return DrillReport(name="job", run="job", drill="maintenance", autocheckpoint=True)


OBSERVER = fleet().targets[0]


def test_preflight_times_a_step_from_two_log_lines() -> None:
    time, jobs = FakeClock(), FakeJobs()
    jobs.set("running")
    jobs.logs[1] = "step 10/100\n"
    time.at(2, lambda: jobs.logs.__setitem__(1, "step 10/100\nstep 11/100\nstep 12/100\n"))
    seen = report()
    boots = waits(time, jobs).preflight(seen, OBSERVER)
    assert set(boots) == {"0/0", "0/1"} and all(boot == 1 for boot, _pid in boots.values())
    assert (seen.step_before_trigger, seen.step_seconds) == (12, 1.0)  # 2 steps in 2 s
    assert seen.progress_from != "checkpoints"


def test_preflight_reads_checkpoints_when_the_log_has_no_step_lines() -> None:
    time, jobs, record = FakeClock(), FakeJobs(), FakeRecord(steps=[5])
    jobs.set("running")
    jobs.logs[1] = "loading the dataset\n"
    time.at(3, lambda: record.steps.append(10))
    seen = report()
    waits(time, jobs, record=record).preflight(seen, OBSERVER)
    assert (seen.progress_from, seen.step_before_trigger) == ("checkpoints", 10)
    assert 3 <= time.t < 10  # a new checkpoint ends the wait before the patience runs out
    assert "progress read from committed checkpoints" in seen.notes[0]
    # No new checkpoint: after the patience, the latest one is what progress is read from.
    later, idle = FakeClock(), FakeJobs()
    idle.set("running")
    idle.logs[1] = "loading the dataset\n"
    patient = report()
    waits(later, idle, record=FakeRecord(steps=[5]), patience=4).preflight(patient, OBSERVER)
    assert (patient.step_before_trigger, later.t) == (5, 4.0)


@pytest.mark.parametrize(
    ("record", "where"),
    [
        (None, "no checkpoint.dir to look in"),
        (FakeRecord(), "no committed checkpoint under gs://bucket/ckpt/job"),
    ],
)
def test_preflight_with_neither_steps_nor_checkpoints_says_where_it_looked(
    record: FakeRecord | None, where: str
) -> None:
    time, jobs = FakeClock(), FakeJobs()
    jobs.set("running")
    with pytest.raises(TpuctlError, match="cannot see the job's progress after 4 s") as blind:
        waits(time, jobs, record=record, patience=4).preflight(report(), OBSERVER)
    assert where in blind.value.message and blind.value.hint is not None


def test_preflight_refuses_a_job_already_done() -> None:
    time, jobs = FakeClock(), FakeJobs()
    jobs.set("done", 0)
    with pytest.raises(TpuctlError, match="already finished; nothing to disrupt"):
        waits(time, jobs).preflight(report(), OBSERVER)
    assert time.t == 0.0


def test_every_wait_ends_at_the_drills_deadline() -> None:
    time, jobs = FakeClock(), FakeJobs()  # never started: the workers say "none"
    with pytest.raises(DeadlineError) as late:
        waits(time, jobs, timeout=20).preflight(report(), OBSERVER)
    assert "gave up after 20 s waiting for the job to be running" in late.value.message
    assert late.value.details["waiting_for"].startswith("the job to be running")
    assert 20 < time.t <= 20.5  # one poll past the deadline at most


def test_wait_back_gives_a_fresh_disk_its_code_and_waits_for_new_boots() -> None:
    time, jobs = FakeClock(), FakeJobs()
    jobs.set("running")
    before = {label: (s.boot, s.pid) for label, s in jobs.workers.items()}

    def disk_replaced() -> None:
        for status in jobs.workers.values():
            status.state, status.boot, status.pid = "waiting-for-code", 2, None

    time.at(2, disk_replaced)
    after = waits(time, jobs).wait_back(before)
    assert jobs.delivered == 1
    assert {boot for boot, _pid in after.values()} == {2}
    assert all(after[label] != before[label] for label in after)


def test_wait_back_leaves_the_code_to_tpuctl_up_and_redelivers_at_most_every_15_s() -> None:
    time, jobs = FakeClock(), FakeJobs()
    for status in jobs.workers.values():
        status.state = "waiting-for-code"
    before = {label: (s.boot, s.pid) for label, s in jobs.workers.items()}
    with pytest.raises(DeadlineError):  # --external-recovery: nothing delivers the code
        waits(time, jobs, redeliver=None, timeout=30).wait_back(before)
    assert jobs.delivered == 0

    class Ignored(FakeJobs):
        """A delivery that does not take (the disk keeps waiting)."""

        def deliver_and_start(self, fleet: Fleet, spec: Spec) -> Any:
            self.delivered += 1

    stubborn, later = Ignored(), FakeClock()
    for status in stubborn.workers.values():
        status.state = "waiting-for-code"
    with pytest.raises(DeadlineError):
        waits(later, stubborn, timeout=40).wait_back(before)
    assert REDELIVER_EVERY == 15.0 and stubborn.delivered == 3  # at 0, 15.5 and 31 s


def test_unreadable_workers_are_resolved_again() -> None:
    class Flaky(FakeJobs):
        failures = 2

        def job_status(self, fleet: Fleet, spec: Spec) -> list[Status]:
            if self.failures:
                self.failures -= 1
                raise TpuctlError("worker 0/0 unreachable")
            return super().job_status(fleet, spec)

    time, jobs, resolve = FakeClock(), Flaky(), Resolves()
    jobs.set("running")
    jobs.logs[1] = "step 1/9\n"
    time.at(3, lambda: jobs.logs.__setitem__(1, "step 1/9\nstep 2/9\n"))
    waits(time, jobs, resolve=resolve).preflight(report(), OBSERVER)
    assert resolve.count == 3  # once, then again after each failed read


def test_after_the_restart_new_steps_or_a_new_checkpoint_end_the_wait() -> None:
    time, jobs = FakeClock(), FakeJobs()
    jobs.set("running")
    jobs.logs[1] = "booting\n"  # the new boot has logged no step yet
    time.at(2, lambda: jobs.logs.__setitem__(1, "resumed from step 5\nstep 6/9\n"))
    facts = waits(time, jobs).wait_new_steps(OBSERVER)
    assert (facts.resume_point, facts.last_step, time.t) == (5, 6, 2.0)

    time, record = FakeClock(), FakeRecord(steps=[5])
    time.at(4, lambda: record.steps.append(8))
    waits(time, jobs, record=record).wait_new_checkpoint(resumed_from=5)
    assert time.t == 4.0
    done = FakeJobs()
    done.set("done", 0)
    waits(FakeClock(), done, record=FakeRecord(steps=[5])).wait_new_checkpoint(resumed_from=5)
