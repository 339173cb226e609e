"""The babysitter's decisions (tpuctl.jobs.up, tpuctl.jobs.job_watch) with fakes of the queued
resource, the workers' jobs and the checkpoints, and a fake clock: each budget, the crash
loop, FAILED before and after ACTIVE, a preemption, a reboot, done."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.jobs.fakes import (
    FakeClock,
    FakeJobs,
    FakeJournal,
    FakeLease,
    FakeQr,
    FakeRecord,
    fleet,
    spec,
)
from tpuctl.errors import (
    ApiUnavailableError,
    CommandFailedError,
    ExitCode,
    PreemptedError,
    QueuedResourceFailed,
)
from tpuctl.jobs.up import Babysitter, UpOptions, UpResult
from tpuctl.spec.model import Spec
from tpuctl.storage.lease import Holder, LeaseHeld, LeaseLost

FAST = UpOptions(poll=1.0, job_check_every=2.0, settle=10.0)


@dataclass
class World:
    """Everything a babysitter sees, and the babysitter."""

    spec: Spec = field(default_factory=spec)
    qr: FakeQr = field(default_factory=FakeQr)
    jobs: FakeJobs = field(default_factory=FakeJobs)
    record: FakeRecord = field(default_factory=FakeRecord)
    journal: FakeJournal = field(default_factory=FakeJournal)
    time: FakeClock = field(default_factory=FakeClock)
    options: UpOptions = FAST

    def babysitter(self) -> Babysitter:
        return Babysitter(
            self.spec,
            self.qr,
            fleet_factory=fleet,
            jobs=self.jobs,
            record=self.record,
            journal=self.journal,
            options=self.options,
            clock=self.time.clock(),
        )

    def run(self) -> UpResult:
        return self.babysitter().run()


def test_a_done_marker_at_the_start_deletes_the_queued_resource_and_exits_0() -> None:
    world = World(record=FakeRecord(done=True))
    world.qr.state = "ACTIVE"
    result = world.run()
    assert (result.outcome, result.deleted) == ("done", True)
    assert world.qr.state == "DELETED" and world.jobs.delivered == 0


def test_a_job_that_writes_its_done_marker_ends_the_run() -> None:
    world = World()
    world.time.at(20, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.outcome == "done" and world.qr.creates == 1 and world.qr.deletes == 1
    assert world.jobs.delivered == 1 and "job.done" in world.journal.kinds


def test_keep_leaves_the_queued_resource() -> None:
    world = World(options=UpOptions(poll=1.0, keep=True))
    world.time.at(5, lambda: setattr(world.record, "done", True))
    assert world.run().deleted is False
    assert world.qr.state == "ACTIVE" and "qr.kept" in world.journal.kinds


def test_a_preemption_recreates_the_queued_resource_and_restarts_the_job() -> None:
    world = World()
    world.time.at(10, lambda: setattr(world.qr, "state", "SUSPENDED"))
    world.time.at(30, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.preemptions == 1 and world.qr.creates == 2
    assert world.jobs.delivered == 2  # started again on the new workers
    assert world.journal.kinds.count("qr.recreated") == 1


def test_the_preemption_budget_ends_with_exit_7_and_nothing_left() -> None:
    world = World(spec=spec(max_preemptions=1))
    world.time.at(10, lambda: setattr(world.qr, "state", "SUSPENDED"))
    world.time.at(40, lambda: setattr(world.qr, "state", "SUSPENDED"))
    with pytest.raises(PreemptedError) as raised:
        world.run()
    assert raised.value.exit_code == ExitCode.PREEMPTED
    assert world.qr.state == "DELETED" and world.qr.creates == 2
    assert world.journal.kinds[-1] == "up.exit"


def test_failed_before_ever_active_is_exit_6() -> None:
    world = World()
    world.qr.next_state = "FAILED"
    with pytest.raises(QueuedResourceFailed) as raised:
        world.run()
    assert raised.value.exit_code == ExitCode.QR_FAILED
    assert world.jobs.delivered == 0


def test_failed_after_active_is_recovered_like_a_preemption() -> None:
    world = World()
    world.time.at(10, lambda: setattr(world.qr, "state", "FAILED"))
    world.time.at(30, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.preemptions == 1 and world.qr.creates == 2 and result.outcome == "done"


def test_a_job_failure_is_restarted_within_the_budget_then_exit_3() -> None:
    world = World(spec=spec(max_failures=1))
    world.record.steps = [10]
    world.time.at(10, lambda: world.jobs.set("exited", 1))

    def advance_and_fail() -> None:
        world.record.steps.append(20)  # progress, so it is no crash loop
        world.jobs.set("exited", 1)

    world.time.at(40, advance_and_fail)
    with pytest.raises(CommandFailedError) as raised:
        world.run()
    assert raised.value.details["reason"] == "failure budget exhausted"
    assert world.jobs.restarted == 1 and raised.value.exit_code == ExitCode.COMMAND_FAILED


def test_a_crash_loop_stops_when_restarts_bring_no_new_checkpoint() -> None:
    world = World(spec=spec(max_failures=10))
    world.record.steps = [10]
    for t in (10, 40, 70, 100):
        world.time.at(t, lambda: world.jobs.set("exited", 1))
    with pytest.raises(CommandFailedError) as raised:
        world.run()
    assert raised.value.details["reason"] == "crashloop"
    assert world.jobs.restarted == 2 and "crashloop" in world.journal.kinds


def test_an_exit_while_the_nodes_are_under_maintenance_is_not_a_failure() -> None:
    world = World(spec=spec(max_failures=0))
    world.time.at(10, lambda: (world.jobs.set("exited", 0), setattr(world.qr, "settled", False)))
    world.time.at(30, lambda: (world.jobs.reboot(), setattr(world.qr, "settled", True)))
    world.time.at(50, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.failures == 0 and world.jobs.restarted == 0
    assert "job.relaunched" in world.journal.kinds


def test_a_running_job_is_picked_up_without_a_restart() -> None:
    world = World()
    world.qr.state = "ACTIVE"
    world.jobs.set("running")
    world.time.at(10, lambda: setattr(world.record, "done", True))
    world.run()
    assert world.jobs.delivered == 0 and world.qr.creates == 0
    running = [fields for kind, fields in world.journal.entries if kind == "job.running"]
    assert running and running[0].get("already") is True


def test_an_api_outage_is_ridden_out_said_and_decides_nothing() -> None:
    world = World()
    world.jobs.set("running")
    world.time.at(10, lambda: setattr(world.qr, "api_down", True))
    world.time.at(12, lambda: world.jobs.set("exited", 0))  # during the outage
    world.time.at(100, lambda: setattr(world.qr, "api_down", False))
    result = world.run()
    kinds = world.journal.kinds
    # Said at once, then every 30 s while it lasted; nothing decided until the API answered.
    assert kinds.count("api.unavailable") == 3 and kinds.count("api.available") == 1
    assert kinds.index("api.available") < kinds.index("job.done")
    assert result.outcome == "done" and world.time.t >= 100
    assert "job.failed" not in kinds and world.qr.deletes == 1


def test_an_outage_at_create_exits_11_naming_what_may_be_left() -> None:
    world = World(qr=FakeQr(api_down=True))
    with pytest.raises(ApiUnavailableError) as raised:
        world.run()
    error = raised.value
    assert error.exit_code == ExitCode.API_UNAVAILABLE == 11
    assert "may still be running: resume with: tpuctl up" in (error.hint or "")
    assert "tpuctl delete job --force --yes" in (error.hint or "")
    assert error.details["deleted"] is False and world.qr.deletes == 0


def test_a_second_up_on_a_held_run_writes_nothing_and_deletes_nothing() -> None:
    other = Holder("x", "ci-runner", 42, "tpuctl up job.yaml", None, None)
    world = World()
    world.qr.state = "ACTIVE"
    babysitter = world.babysitter()
    babysitter.lease = FakeLease(held_by=other)
    with pytest.raises(LeaseHeld) as raised:
        babysitter.run()
    assert "tpuctl up job.yaml" in raised.value.message and raised.value.exit_code == 1
    assert world.journal.kinds == [] and world.qr.deletes == 0 and world.qr.state == "ACTIVE"


def test_a_lease_taken_over_stops_this_up_and_leaves_the_run_to_the_other() -> None:
    world = World()
    world.jobs.set("running")
    babysitter = world.babysitter()
    lease = FakeLease(lost_at=40, clock=world.time)
    babysitter.lease = lease
    with pytest.raises(LeaseLost):
        babysitter.run()
    assert lease.acquired and lease.released
    assert world.qr.state == "ACTIVE" and world.qr.deletes == 0  # not ours to delete
    assert world.journal.kinds[-1] == "up.exit"
