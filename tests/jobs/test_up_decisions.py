"""The babysitter's decisions (tpuctl.jobs.up, tpuctl.jobs.job_watch) with fakes of the queued
resource, the workers' jobs and the checkpoints, and a fake clock: each budget, the crash
loop, FAILED before and after ACTIVE, a preemption, a reboot, done."""

from __future__ import annotations

import dataclasses
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
    DeadlineError,
    ExitCode,
    Interrupted,
    PreemptedError,
    QueuedResourceFailed,
    TpuctlError,
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


# ------------------------------------------------------------------------------ zones


def zoned(policy: str = "sequential", zones: tuple[str, ...] = ("a", "b")) -> World:
    """A run that may queue in zones a and b (a 60 s queueing deadline in each)."""
    base = spec()
    capacity = dataclasses.replace(base.capacity, zones=zones, zone_policy=policy)
    options = dataclasses.replace(FAST, zones=zones, queue_timeout=60.0)
    world = World(spec=dataclasses.replace(base, capacity=capacity), options=options)
    world.qr = FakeQr(zone=zones[0])
    return world


def entries(world: World, kind: str) -> list[dict[str, object]]:
    return [fields for k, fields in world.journal.entries if k == kind]


def test_sequential_moves_on_at_the_deadline_leaving_nothing_behind() -> None:
    world = zoned()
    a, b = world.qr, world.qr.in_zone("b")
    a.next_state = "WAITING_FOR_RESOURCES"  # no capacity in a
    world.time.at(100, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.outcome == "done" and result.zone == "b"
    assert (a.creates, a.deletes, a.state) == (1, 1, "DELETED")
    assert (b.creates, b.state) == (1, "DELETED")  # deleted at the end: done
    assert world.jobs.delivered == 1
    kinds = world.journal.kinds
    assert kinds.index("zone.next") < kinds.index("job.started")
    assert entries(world, "zone.next")[0]["zone"] == "b"
    # Every entry says its zone: a's queueing, then b's run.
    assert entries(world, "qr.created")[0]["zone"] == "a"
    assert entries(world, "job.running")[0]["zone"] == "b"
    assert world.record.claim_history == []  # a sequential run has nothing to claim


def test_sequential_with_every_zone_exhausted_exits_4_naming_each() -> None:
    world = zoned()
    for zone in ("a", "b"):
        world.qr.in_zone(zone).next_state = "WAITING_FOR_RESOURCES"
    with pytest.raises(DeadlineError) as raised:
        world.run()
    error = raised.value
    assert error.exit_code == ExitCode.DEADLINE and "no zone became ACTIVE" in error.message
    assert [zone["zone"] for zone in error.details["zones"]] == ["a", "b"]
    assert "job in a still WAITING_FOR_RESOURCES" in error.message
    assert all(world.qr.in_zone(zone).state == "DELETED" for zone in ("a", "b"))
    assert world.jobs.delivered == 0


def test_sequential_never_moves_on_while_the_last_zone_s_request_may_still_exist() -> None:
    world = zoned()
    a = world.qr
    a.next_state = "WAITING_FOR_RESOURCES"
    a.undeletable = True
    with pytest.raises(DeadlineError) as raised:
        world.run()
    assert raised.value.details["deleted"] is False
    assert world.qr.in_zone("b").creates == 0


def test_first_active_keeps_the_first_active_and_deletes_the_others_before_the_job() -> None:
    world = zoned("first-active")
    a, b = world.qr, world.qr.in_zone("b")
    world.time.at(5, lambda: setattr(b, "state", "ACTIVE"))
    world.time.at(60, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.outcome == "done" and result.zone == "b"
    assert (a.creates, a.deletes) == (1, 1) and (b.creates, b.deletes) == (1, 1)
    assert world.record.claim_history == ["b"]
    kinds = world.journal.kinds
    deleted_a = next(
        i for i, (kind, fields) in enumerate(world.journal.entries)
        if kind == "qr.deleted" and fields["zone"] == "a"
    )  # fmt: skip
    assert kinds.index("zone.race") < kinds.index("zone.chosen") < deleted_a
    assert deleted_a < kinds.index("zone.claimed") < kinds.index("job.started")
    assert world.jobs.delivered == 1


def test_first_active_with_two_active_unclaimed_keeps_the_first_zone() -> None:
    world = zoned("first-active")
    a, b = world.qr, world.qr.in_zone("b")
    a.state = b.state = "ACTIVE"  # both filled while no up watched (an interrupted race)
    world.time.at(60, lambda: setattr(world.record, "done", True))
    assert world.run().zone == "a"
    assert (a.creates, b.creates, b.deletes) == (0, 0, 1)
    assert world.record.claim_history == ["a"]
    # Its workers waited for the claim: the job is started, not taken as running.
    assert world.jobs.delivered == 1


def test_first_active_withdraws_a_stale_claim_before_queueing_anywhere() -> None:
    world = zoned("first-active")
    world.record.claimed = "b"  # a claim left by an earlier run; b holds nothing now
    world.time.at(5, lambda: setattr(world.qr, "state", "ACTIVE"))
    world.time.at(60, lambda: setattr(world.record, "done", True))
    world.run()
    assert world.record.claim_history == [None, "a"]
    kinds = world.journal.kinds
    assert kinds.index("zone.unclaimed") < kinds.index("qr.created")


def test_first_active_takes_up_the_claimed_zone_s_running_job_without_a_race() -> None:
    world = zoned("first-active")
    a, b = world.qr, world.qr.in_zone("b")
    a.state = "WAITING_FOR_RESOURCES"  # left by an interrupted race
    b.state = "ACTIVE"
    world.record.claimed = "b"
    world.jobs.set("running")
    world.time.at(30, lambda: setattr(world.record, "done", True))
    world.run()
    assert a.deletes == 1 and b.creates == 0 and world.jobs.delivered == 0
    assert "zone.race" not in world.journal.kinds and world.record.claim_history == []


def test_first_active_refuses_to_move_a_claim_whose_zone_still_holds_the_run() -> None:
    world = zoned("first-active", zones=("a",))
    world.qr.in_zone("b").state = "ACTIVE"  # the run is in b, which --zones left out
    world.record.claimed = "b"
    with pytest.raises(TpuctlError) as raised:
        world.run()
    assert "claimed for b" in raised.value.message and world.qr.creates == 0


def test_a_preempted_zone_run_follows_the_policy_again() -> None:
    world = zoned("first-active")
    a, b = world.qr, world.qr.in_zone("b")
    world.time.at(5, lambda: setattr(b, "state", "ACTIVE"))
    world.time.at(30, lambda: setattr(b, "state", "SUSPENDED"))
    world.time.at(40, lambda: setattr(a, "state", "ACTIVE"))  # a has capacity now
    world.time.at(90, lambda: setattr(world.record, "done", True))
    result = world.run()
    assert result.preemptions == 1 and result.zone == "a"
    # b's claim is withdrawn only once b is gone, then a race, then a claimed.
    assert world.record.claim_history == ["b", None, "a"]
    assert world.journal.kinds.count("zone.race") == 2
    assert world.jobs.delivered == 2


def test_first_active_with_every_zone_exhausted_exits_4_and_leaves_nothing() -> None:
    world = zoned("first-active")
    with pytest.raises(DeadlineError) as raised:
        world.run()
    assert [zone["zone"] for zone in raised.value.details["zones"]] == ["a", "b"]
    assert all(world.qr.in_zone(zone).state == "DELETED" for zone in ("a", "b"))
    assert world.record.claim_history == []


def test_ctrl_c_during_a_race_names_every_zone_left_queued() -> None:
    world = zoned("first-active")
    stop = {"now": False}
    world.time.at(5, lambda: stop.update(now=True))
    babysitter = world.babysitter()
    babysitter.stop_requested = lambda: stop["now"]
    with pytest.raises(Interrupted) as raised:
        babysitter.run()
    hint = raised.value.hint or ""
    assert "--zone a" in hint and "--zone b" in hint
    assert world.qr.in_zone("a").state == world.qr.in_zone("b").state == "WAITING_FOR_RESOURCES"
