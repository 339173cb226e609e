"""`up` as reconcile steps in a loop, against fakes of the queued resource in each zone, the
workers' jobs and the checkpoints, with a fake clock: each budget, the crash loop, FAILED
before and after ACTIVE, a preemption, a reboot, done, zones, outages, the lease."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from tests.jobs.fakes import FakeClock, FakeJobs, FakeLease, FakeRecord, spec
from tests.jobs.reconcile_fakes import FakeSlices, FakeStore, make_world
from tpuctl.cloud.watcher import GONE
from tpuctl.errors import (
    ApiUnavailableError,
    CommandFailedError,
    DeadlineError,
    ExitCode,
    Interrupted,
    PreemptedError,
    QueuedResourceFailed,
    ResourceExhaustedError,
    TpuctlError,
)
from tpuctl.jobs.reconcile.world import World
from tpuctl.jobs.up import Supervisor, UpOptions, UpResult, policy_of
from tpuctl.spec.model import Spec
from tpuctl.storage.lease import Holder, LeaseHeld, LeaseLost

FAST = UpOptions(poll=1.0, job_check_every=2.0, settle=10.0)


@dataclass
class Run:
    """Everything a supervisor sees, and the supervisor."""

    spec: Spec = field(default_factory=spec)
    options: UpOptions = FAST
    zones: tuple[str, ...] = ("z",)
    time: FakeClock = field(default_factory=FakeClock)
    jobs: FakeJobs = field(default_factory=FakeJobs)
    record: FakeRecord = field(default_factory=FakeRecord)
    store: FakeStore | None = None
    slices: FakeSlices | None = None
    ladder: tuple[tuple[str, ...], bool] = ((), False)  # the rungs' names, prefer_cheapest

    def __post_init__(self) -> None:
        self.store = self.store or FakeStore(self.time)
        self.slices = self.slices or FakeSlices(self.time, self.zones, on_ready=self.jobs.new_disks)

    @property
    def journal(self) -> FakeStore:
        assert self.store is not None
        return self.store

    @property
    def qr(self) -> FakeSlices:
        assert self.slices is not None
        return self.slices

    def world(self) -> World:
        return make_world(self.time, self.qr, self.jobs, self.record, self.spec)

    def supervisor(self, **overrides: object) -> Supervisor:
        options = dataclasses.replace(self.options, zones=self.zones)
        rungs, cheapest = self.ladder
        policy = dataclasses.replace(
            policy_of(self.spec, options, self.zones[0]), rungs=rungs, prefer_cheapest=cheapest
        )
        return Supervisor(
            self.spec,
            self.world(),
            self.journal,
            policy,
            options=options,
            clock=self.time.clock(),
            **overrides,  # type: ignore[arg-type]
        )

    def run(self) -> UpResult:
        return self.supervisor().run()

    def zone(self, name: str = "z") -> object:
        return self.qr.zone(name)


def active(run: Run, zone: str = "z") -> None:
    """The run's queued resource exists and is ACTIVE already."""
    fake = run.qr.zone(zone)
    fake.state, fake.creates, fake.created_at = "ACTIVE", 1, 0.0


def test_a_done_marker_at_the_start_deletes_the_queued_resource_and_exits_0() -> None:
    run = Run(record=FakeRecord(done=True))
    active(run)
    result = run.run()
    assert (result.outcome, result.deleted) == ("done", True)
    assert run.qr.zone("z").state == GONE and run.qr.zone("z").deletes == 1
    assert run.jobs.delivered == 0


def test_a_job_that_writes_its_done_marker_ends_the_run() -> None:
    run = Run()
    run.time.at(20, lambda: setattr(run.record, "done", True))
    result = run.run()
    zone = run.qr.zone("z")
    assert result.outcome == "done" and zone.creates == 1 and zone.deletes == 1
    assert run.jobs.delivered == 1 and "job.done" in run.journal.kinds
    assert run.journal.kinds[-2:] == ["run.done", "up.exit"]


def test_keep_leaves_the_queued_resource() -> None:
    run = Run(options=UpOptions(poll=1.0, keep=True))
    run.time.at(5, lambda: setattr(run.record, "done", True))
    assert run.run().deleted is False
    assert run.qr.zone("z").state == "ACTIVE" and "qr.kept" in run.journal.kinds


def test_a_preemption_recreates_the_queued_resource_and_restarts_the_job() -> None:
    run = Run()
    run.time.at(10, lambda: setattr(run.qr.zone("z"), "state", "SUSPENDED"))
    run.time.at(40, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.preemptions == 1 and run.qr.zone("z").creates == 2
    assert run.jobs.delivered == 2  # started again on the new workers
    assert run.journal.kinds.count("qr.recreated") == 1
    assert run.qr.most_at_once() == 1


def test_the_preemption_budget_ends_with_exit_7_and_nothing_left() -> None:
    run = Run(spec=spec(max_preemptions=1))
    run.time.at(10, lambda: setattr(run.qr.zone("z"), "state", "SUSPENDED"))
    run.time.at(40, lambda: setattr(run.qr.zone("z"), "state", "SUSPENDED"))
    with pytest.raises(PreemptedError) as raised:
        run.run()
    assert raised.value.exit_code == ExitCode.PREEMPTED
    zone = run.qr.zone("z")
    assert zone.state == GONE and zone.creates == 2  # up ends once it is gone
    assert "run.gave_up" in run.journal.kinds


def test_failed_before_ever_active_is_exit_6() -> None:
    run = Run()
    run.qr.zone("z").next_state = "FAILED"
    with pytest.raises(QueuedResourceFailed) as raised:
        run.run()
    assert raised.value.exit_code == ExitCode.QR_FAILED
    assert run.jobs.delivered == 0 and run.qr.zone("z").deletes == 1


def test_failed_after_active_is_recovered_like_a_preemption() -> None:
    run = Run()
    run.time.at(10, lambda: setattr(run.qr.zone("z"), "state", "FAILED"))
    run.time.at(40, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.preemptions == 1 and run.qr.zone("z").creates == 2
    assert result.outcome == "done"


def test_a_flex_start_run_that_reaches_its_end_is_followed_by_a_new_run() -> None:
    """The platform takes a flex-start slice back at its maximum run duration: neither a
    preemption (no budget spent) nor a failure (the job stopped to save just before it)."""
    run = Run(spec=spec(max_preemptions=0, max_failures=0))
    run.qr.zone("z").run_for = 30.0

    def stopped_to_save() -> None:  # the startup script's SIGTERM ahead of the end
        run.jobs.set("exited", 0, signalled=True)

    run.time.at(25, stopped_to_save)

    def second_run_done() -> None:
        run.qr.zone("z").run_for = None
        run.record.done = True

    run.time.at(55, second_run_done)
    result = run.run()
    assert result.outcome == "done" and result.preemptions == 0 and result.failures == 0
    kinds = run.journal.kinds
    assert kinds.count("run.ended") == 1 and "preemption.detected" not in kinds
    assert "job.failed" not in kinds and "job.disrupted" in kinds
    assert run.qr.zone("z").creates == 2 and run.journal.of("qr.recreated")
    assert "maximum run duration" in run.journal.of("run.ended")[0]["message"]


def test_a_flex_start_slice_gone_at_its_end_is_a_run_end_not_a_preemption() -> None:
    """Compute Engine deletes a flex-start VM at its maximum run duration: a step that finds it
    gone (maybe a new process, as a scheduler runs) reads the end the record kept."""
    run = Run(spec=spec(max_preemptions=0, max_failures=0))
    run.qr.zone("z").run_for = 30.0
    run.qr.zone("z").gone_at_end = True
    run.time.at(25, lambda: run.jobs.set("exited", 0, signalled=True))

    def second_run_done() -> None:
        run.qr.zone("z").run_for = None
        run.record.done = True

    run.time.at(55, second_run_done)
    result = run.run()
    assert result.outcome == "done" and result.preemptions == 0 and result.failures == 0
    kinds = run.journal.kinds
    assert kinds.count("run.ended") == 1 and "preemption.detected" not in kinds
    assert "qr.vanished" not in kinds and run.qr.zone("z").creates == 2


def test_a_job_failure_is_restarted_within_the_budget_then_exit_3() -> None:
    run = Run(spec=spec(max_failures=1))
    run.record.steps = [10]
    run.time.at(10, lambda: run.jobs.set("exited", 1))

    def advance_and_fail() -> None:
        run.record.steps.append(20)  # progress, so it is no crash loop
        run.jobs.set("exited", 1)

    run.time.at(40, advance_and_fail)
    with pytest.raises(CommandFailedError) as raised:
        run.run()
    assert raised.value.details["reason"] == "failure budget exhausted"
    assert run.jobs.restarted == 1 and raised.value.exit_code == ExitCode.COMMAND_FAILED
    # The workers' last log lines were kept before the queued resource was deleted.
    logs = run.journal.of("job.logs")
    assert logs and "last line of 0/0" in logs[0]["tails"]["0/0"]
    assert run.journal.kinds.index("job.logs") < run.journal.kinds.index("run.gave_up")


def test_a_crash_loop_stops_when_restarts_bring_no_new_checkpoint() -> None:
    run = Run(spec=spec(max_failures=10))
    run.record.steps = [10]
    for t in (10, 40, 70, 100):
        run.time.at(t, lambda: run.jobs.set("exited", 1))
    with pytest.raises(CommandFailedError) as raised:
        run.run()
    assert raised.value.details["reason"] == "crashloop"
    assert run.jobs.restarted == 2 and "crashloop" in run.journal.kinds


def test_an_exit_while_the_nodes_are_under_maintenance_is_not_a_failure() -> None:
    run = Run(spec=spec(max_failures=0))
    zone = run.qr.zone("z")
    run.time.at(10, lambda: (run.jobs.set("exited", 0), setattr(zone, "settled", False)))
    run.time.at(30, lambda: (run.jobs.reboot(), setattr(zone, "settled", True)))
    run.time.at(50, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.failures == 0 and run.jobs.restarted == 0
    assert "job.relaunched" in run.journal.kinds and "job.disrupted" in run.journal.kinds


def test_every_worker_exiting_0_undisturbed_is_done_and_writes_the_marker() -> None:
    run = Run()
    run.time.at(10, lambda: run.jobs.set("exited", 0))
    result = run.run()
    assert result.outcome == "done" and run.record.done
    assert "every worker of every slice exited 0" in (run.record.reason or "")
    assert run.qr.zone("z").deletes == 1


def test_a_running_job_is_picked_up_without_a_restart() -> None:
    run = Run()
    active(run)
    run.jobs.set("running")
    run.time.at(10, lambda: setattr(run.record, "done", True))
    run.run()
    assert run.jobs.delivered == 0 and run.qr.zone("z").creates == 1
    running = run.journal.of("job.running")
    assert running and running[0].get("already") is True


def test_an_api_outage_is_ridden_out_said_and_decides_nothing() -> None:
    run = Run()
    run.jobs.set("running")
    active(run)
    run.time.at(10, lambda: setattr(run.qr, "api_down", True))
    run.time.at(12, lambda: run.jobs.set("exited", 0))  # during the outage
    run.time.at(100, lambda: setattr(run.qr, "api_down", False))
    result = run.run()
    kinds = run.journal.kinds
    # Said at once, then every 30 s while it lasted; nothing decided until the API answered.
    assert kinds.count("api.unavailable") == 3 and kinds.count("api.available") == 1
    assert kinds.index("api.available") < kinds.index("job.done")
    assert result.outcome == "done" and run.time.t >= 100
    assert "job.failed" not in kinds and run.qr.zone("z").deletes == 1


def test_an_outage_when_up_must_create_exits_11_naming_what_may_be_left() -> None:
    run = Run()
    run.qr.zone("z").undeletable = True  # the create is refused the same way below
    run.qr.api_down = False

    def refuse(zone: str, rung: int = 0) -> tuple[str, str | None]:
        raise ApiUnavailableError("the TPU API kept failing", status="UNAVAILABLE")

    run.qr.create = refuse  # type: ignore[method-assign]
    with pytest.raises(ApiUnavailableError) as raised:
        run.run()
    error = raised.value
    assert error.exit_code == ExitCode.API_UNAVAILABLE == 11
    assert "may still be running: resume with: tpuctl up" in (error.hint or "")
    assert "tpuctl delete job --force --yes" in (error.hint or "")
    assert error.details["deleted"] is False


def test_a_second_up_on_a_held_run_writes_nothing_and_deletes_nothing() -> None:
    other = Holder("x", "ci-runner", 42, "tpuctl up job.yaml", None, None)
    run = Run()
    active(run)
    with pytest.raises(LeaseHeld) as raised:
        run.supervisor(lease=FakeLease(held_by=other)).run()
    assert "tpuctl up job.yaml" in raised.value.message and raised.value.exit_code == 1
    assert run.journal.kinds == [] and run.qr.zone("z").deletes == 0


def test_a_lease_taken_over_stops_this_up_and_leaves_the_run_to_the_other() -> None:
    run = Run()
    run.jobs.set("running")
    active(run)
    lease = FakeLease(lost_at=40, clock=run.time)
    with pytest.raises(LeaseLost):
        run.supervisor(lease=lease).run()
    assert lease.acquired and lease.released
    assert run.qr.zone("z").state == "ACTIVE" and run.qr.zone("z").deletes == 0


def test_up_on_a_run_that_is_done_says_so_and_does_nothing() -> None:
    run = Run()
    run.time.at(10, lambda: setattr(run.record, "done", True))
    run.run()
    entries = len(run.journal.entries)
    again = run.run()
    assert again.outcome == "done" and again.already
    assert run.journal.kinds[entries:] == ["up.start", "up.exit"]  # nothing decided
    assert run.jobs.delivered == 1


def test_up_on_a_run_that_gave_up_starts_a_new_attempt_with_fresh_budgets() -> None:
    run = Run(spec=spec(max_preemptions=0))
    run.time.at(10, lambda: setattr(run.qr.zone("z"), "state", "SUSPENDED"))
    with pytest.raises(PreemptedError):
        run.run()
    run.time.at(run.time.t + 30, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done" and result.preemptions == 0
    assert run.journal.kinds.count("run.start") == 2


# ------------------------------------------------------------------------------ zones


def zoned(policy: str = "sequential", zones: tuple[str, ...] = ("a", "b")) -> Run:
    """A run that may queue in zones a and b (a 60 s queueing deadline in each)."""
    base = spec()
    capacity = dataclasses.replace(base.capacity, zones=zones, zone_policy=policy)
    options = dataclasses.replace(FAST, queue_timeout=60.0)
    return Run(spec=dataclasses.replace(base, capacity=capacity), options=options, zones=zones)


def test_sequential_moves_on_at_the_deadline_leaving_nothing_behind() -> None:
    run = zoned()
    a, b = run.qr.zone("a"), run.qr.zone("b")
    a.next_state = None  # no capacity in a
    run.time.at(150, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done"
    assert (a.creates, a.deletes) == (1, 1)
    assert (b.creates, b.deletes) == (1, 1)  # deleted at the end: done
    assert run.jobs.delivered == 1 and run.qr.most_at_once() == 1
    kinds = run.journal.kinds
    assert kinds.index("zone.next") < kinds.index("job.started")
    assert run.journal.of("zone.next")[0]["zone"] == "b"
    assert run.journal.of("qr.created")[0]["zone"] == "a"
    assert run.record.claim_history == []  # a sequential run has nothing to claim


def test_sequential_with_every_zone_exhausted_exits_4_naming_each() -> None:
    run = zoned()
    for zone in ("a", "b"):
        run.qr.zone(zone).next_state = None
    with pytest.raises(DeadlineError) as raised:
        run.run()
    error = raised.value
    assert error.exit_code == ExitCode.DEADLINE and "no zone became ACTIVE" in error.message
    assert error.details["zones"] == ["a", "b"]
    assert all(run.qr.zone(zone).deletes == 1 for zone in ("a", "b"))
    assert run.jobs.delivered == 0


def test_sequential_never_moves_on_while_the_last_zone_s_request_may_still_exist() -> None:
    run = zoned()
    a = run.qr.zone("a")
    a.next_state = None
    a.undeletable = True
    with pytest.raises(ApiUnavailableError):
        run.run()
    assert run.qr.zone("b").creates == 0


def test_a_zone_that_refuses_the_create_is_left_for_the_next() -> None:
    run = zoned()
    run.qr.zone("a").refuses = True
    run.time.at(30, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done" and result.zone == "b"
    assert run.qr.zone("a").creates == 0 and run.qr.zone("b").creates == 1
    refused = run.journal.of("zone.gave_up")
    assert (
        refused[0]["outcome"] == "resource_exhausted"
        and "nothing was created" in (refused[0]["message"])
    )
    assert run.qr.zone("a").deletes == 0  # nothing to delete there


def test_every_zone_refusing_the_create_gives_up_having_created_and_deleted_nothing() -> None:
    run = zoned("first-active")
    for zone in ("a", "b"):
        run.qr.zone(zone).refuses = True
    with pytest.raises(ResourceExhaustedError) as raised:
        run.run()
    assert raised.value.exit_code == ExitCode.ERROR
    assert "every zone (a, b) refused the create" in raised.value.message
    assert raised.value.details["deleted"] is False
    assert all(run.qr.zone(z).creates == run.qr.zone(z).deletes == 0 for z in ("a", "b"))


def test_first_active_keeps_the_first_active_and_deletes_the_others_before_the_job() -> None:
    run = zoned("first-active")
    a, b = run.qr.zone("a"), run.qr.zone("b")
    a.next_state = None
    b.ready_after = 3.0
    run.time.at(60, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done"
    assert (a.creates, a.deletes) == (1, 1) and (b.creates, b.deletes) == (1, 1)
    assert run.record.claim_history == ["b"]
    kinds = run.journal.kinds
    deleted_a = next(
        i for i, entry in enumerate(run.journal.entries)
        if entry.kind == "qr.deleted" and entry.fields["zone"] == "a"
    )  # fmt: skip
    assert kinds.index("zone.race") < kinds.index("zone.chosen") < deleted_a
    assert deleted_a < kinds.index("zone.claimed") < kinds.index("job.started")
    assert run.jobs.delivered == 1


def test_first_active_with_two_active_unclaimed_keeps_the_first_zone() -> None:
    run = zoned("first-active")
    active(run, "a")
    active(run, "b")  # both filled while nobody watched (an interrupted race)
    run.time.at(60, lambda: setattr(run.record, "done", True))
    run.run()
    a, b = run.qr.zone("a"), run.qr.zone("b")
    assert (a.creates, b.creates, b.deletes) == (1, 1, 1)
    assert run.record.claim_history == ["a"]
    assert run.jobs.delivered == 1  # its workers waited for the claim: the job is started


def test_first_active_withdraws_a_stale_claim_before_queueing_anywhere() -> None:
    run = zoned("first-active")
    run.record.claimed = "b"  # a claim left by an earlier run; b holds nothing now
    run.time.at(60, lambda: setattr(run.record, "done", True))
    run.run()
    assert run.record.claim_history[:1] == [None]
    kinds = run.journal.kinds
    assert kinds.index("zone.unclaimed") < kinds.index("qr.created")


def test_first_active_takes_up_the_claimed_zone_s_running_job_without_a_race() -> None:
    run = zoned("first-active")
    a = run.qr.zone("a")
    a.state, a.created_at, a.next_state = "WAITING_FOR_RESOURCES", 0.0, None
    active(run, "b")
    run.record.claimed = "b"
    run.jobs.set("running")
    run.time.at(30, lambda: setattr(run.record, "done", True))
    run.run()
    assert a.deletes == 1 and run.qr.zone("b").creates == 1 and run.jobs.delivered == 0
    assert "zone.race" not in run.journal.kinds and run.record.claim_history == []


def test_first_active_refuses_to_move_a_claim_whose_zone_still_holds_the_run() -> None:
    run = zoned("first-active", zones=("a", "c"))
    active(run, "b")  # the run is in b, which the zones asked leave out
    run.record.claimed = "b"
    with pytest.raises(TpuctlError) as raised:
        run.run()
    assert "claimed for b" in raised.value.message
    assert run.qr.zone("a").creates == 0 and run.qr.zone("b").deletes == 0


def test_a_preempted_zone_run_follows_the_policy_again() -> None:
    run = zoned("first-active")
    a, b = run.qr.zone("a"), run.qr.zone("b")
    a.next_state = None
    b.ready_after = 3.0
    run.time.at(30, lambda: setattr(b, "state", "SUSPENDED"))

    def a_has_capacity() -> None:
        a.next_state, b.next_state, a.ready_after = "ACTIVE", None, 1.0

    run.time.at(31, a_has_capacity)
    run.time.at(120, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.preemptions == 1
    # b's claim is withdrawn only once b is gone, then a race, then a claimed.
    assert run.record.claim_history == ["b", None, "a"]
    assert run.journal.kinds.count("zone.race") == 2
    assert run.jobs.delivered == 2


def test_first_active_with_every_zone_exhausted_exits_4_and_leaves_nothing() -> None:
    run = zoned("first-active")
    for zone in ("a", "b"):
        run.qr.zone(zone).next_state = None
    with pytest.raises(DeadlineError) as raised:
        run.run()
    assert sorted(raised.value.details["zones"]) == ["a", "b"]
    assert all(run.qr.zone(zone).deletes == 1 for zone in ("a", "b"))
    assert run.record.claim_history == []


def test_ctrl_c_during_a_race_names_every_zone_left_queued() -> None:
    run = zoned("first-active")
    for zone in ("a", "b"):
        run.qr.zone(zone).next_state = None
    stop = {"now": False}
    run.time.at(5, lambda: stop.update(now=True))
    with pytest.raises(Interrupted) as raised:
        run.supervisor(stop_requested=lambda: stop["now"]).run()
    hint = raised.value.hint or ""
    assert "--zone a" in hint and "--zone b" in hint
    assert run.qr.zone("a").state == run.qr.zone("b").state == "WAITING_FOR_RESOURCES"


# ------------------------------------------------------------------------ killed steps


class Killed(BaseException):
    """The process died (SIGKILL) at a crash point."""


def _scripted(run: Run) -> None:
    """A run with a preemption, a job failure and a restart, then done."""
    run.record.steps = [10]
    run.time.at(10, lambda: setattr(run.qr.zone("z"), "state", "SUSPENDED"))

    def fail() -> None:
        run.record.steps.append(20)
        run.jobs.set("exited", 1)

    run.time.at(40, fail)
    run.time.at(90, lambda: setattr(run.record, "done", True))


def _crash_points(monkeypatch: pytest.MonkeyPatch, kill_at: int | None) -> list[str]:
    from tpuctl.jobs.reconcile import crash

    reached: list[str] = []

    def point(what: str) -> None:
        reached.append(what)
        if kill_at is not None and len(reached) == kill_at:
            raise Killed(what)

    monkeypatch.setattr(crash, "point", point)
    return reached


def test_a_step_killed_at_any_crash_point_is_finished_by_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kill the supervisor before each side effect in turn (a create, a delete, a journal
    entry, a restart…), then start a new one on the same world: it converges with no
    duplicate queued resource, the budgets counted once, and the run done."""
    clean = Run(spec=spec(max_preemptions=1, max_failures=1))
    _scripted(clean)
    points = _crash_points(monkeypatch, None)
    clean.run()
    assert clean.journal.of("preemption.detected") and clean.journal.of("job.failed")
    total = len(points)
    assert total > 20
    for kill_at in range(1, total + 1):
        run = Run(spec=spec(max_preemptions=1, max_failures=1))
        _scripted(run)
        reached = _crash_points(monkeypatch, kill_at)
        with pytest.raises(Killed):
            run.run()
        killed_at = reached[-1]
        _crash_points(monkeypatch, None)
        result = run.run()  # a new supervisor, from the journal and the world alone
        where = f"killed at point {kill_at} ({killed_at})"
        assert result.outcome == "done", where
        assert (result.preemptions, result.failures) == (1, 1), where
        zone = run.qr.zone("z")
        assert zone.creates == 2 and run.qr.most_at_once() == 1, where
        assert run.jobs.restarted == 1, where
        assert len(run.journal.of("preemption.detected")) == 1, where


def test_a_run_stopped_by_delete_ends_up_and_its_leftovers_go() -> None:
    run = Run()
    run.jobs.set("running")
    active(run)

    def delete_by_spec() -> None:  # `tpuctl delete SPEC` marks the run stopped, then deletes
        run.journal.append("run.stopped", "stopped by tpuctl delete", {"by": "tpuctl delete"})

    run.time.at(10, delete_by_spec)
    result = run.run()
    assert result.outcome == "stopped"
    zone = run.qr.zone("z")
    assert zone.state == GONE and zone.deletes == 1  # what it left is deleted, never recreated
    assert zone.creates == 1


# --------------------------------------------------------------- the real record store


def test_the_store_folds_only_what_its_snapshot_has_not_seen(tmp_path: object) -> None:
    from pathlib import Path

    from tpuctl.jobs.reconcile.store import RunStore

    base = Path(str(tmp_path))
    job_spec = dataclasses.replace(
        spec(), checkpoint=dataclasses.replace(spec().checkpoint, dir=str(base / "ckpt"))
    )
    store = RunStore(job_spec, "p", "z")
    record = store.load()
    assert not record.started
    entry = store.append("run.start", "start", {"attempt": 1})
    record.apply(entry.timestamp, entry.kind, entry.fields)
    record.last_entry = entry.name
    store.save(record)
    other = RunStore(job_spec, "p", "z", hostname="elsewhere")  # another machine's step
    other.append("preemption.detected", "preempted", {"incarnation": "z@1"})
    reads: list[list[str]] = []
    again = RunStore(job_spec, "p", "z")
    real_read = again.journal.read
    again.journal.read = lambda names: reads.append(names) or real_read(names)  # type: ignore[method-assign]
    folded = again.load()
    assert folded.attempt == 1 and folded.preempted == ["z@1"]
    assert len(reads) == 1 and len(reads[0]) == 1  # only the entry the snapshot had not folded
    (base / "ckpt" / "tpuctl" / "job" / "state.json").write_text("{not json")
    assert RunStore(job_spec, "p", "z").load().preempted == ["z@1"]  # the journal is the truth


# ------------------------------------------------------------------------ the ladder


def laddered(prefer_cheapest: bool = False, max_preemptions: int = 1) -> Run:
    """spot → flex-start → on-demand, a 60 s queueing deadline on each rung."""
    run = Run(
        spec=spec(max_preemptions=max_preemptions),
        options=dataclasses.replace(FAST, queue_timeout=60.0),
    )
    run.ladder = (("spot", "flex-start 1d", "on-demand"), prefer_cheapest)
    return run


def test_a_rung_with_no_capacity_is_climbed_and_nothing_is_left_on_it() -> None:
    run = laddered()
    zone = run.qr.zone("z")
    zone.next_state = None  # spot: no capacity

    def capacity_on_the_next_rung() -> None:
        zone.next_state = "ACTIVE"

    run.time.at(61, capacity_on_the_next_rung)
    run.time.at(120, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done"
    assert run.qr.rungs_asked == [0, 1]
    rungs = run.journal.of("capacity.rung")
    assert [r["rung"] for r in rungs] == [1] and rungs[0]["name"] == "flex-start 1d"
    assert "found no capacity within the queueing deadline" in rungs[0]["message"]
    assert zone.creates == zone.deletes == 2 and run.qr.most_at_once() == 1


def test_a_spent_preemption_budget_climbs_instead_of_giving_up() -> None:
    run = laddered(max_preemptions=1)
    zone = run.qr.zone("z")
    for t in (10, 30):
        run.time.at(t, lambda: setattr(zone, "state", "SUSPENDED"))
    run.time.at(90, lambda: setattr(run.record, "done", True))
    result = run.run()
    assert result.outcome == "done" and result.preemptions == 2
    assert run.qr.rungs_asked == [0, 0, 1]
    assert run.journal.of("capacity.rung")[0]["rung"] == 1


def test_the_last_rung_s_end_is_the_run_s() -> None:
    run = laddered()
    run.qr.zone("z").next_state = None
    with pytest.raises(DeadlineError):
        run.run()
    assert run.qr.rungs_asked == [0, 1, 2]
    assert run.qr.zone("z").creates == run.qr.zone("z").deletes == 3


def test_prefer_cheapest_starts_every_new_bring_up_from_the_first_rung() -> None:
    run = laddered(prefer_cheapest=True, max_preemptions=1)
    zone = run.qr.zone("z")
    for t in (10, 30, 50):
        run.time.at(t, lambda: setattr(zone, "state", "SUSPENDED"))
    run.time.at(120, lambda: setattr(run.record, "done", True))
    run.run()
    # Two preemptions on spot climb to flex-start; its preemption sends it back down.
    assert run.qr.rungs_asked == [0, 0, 1, 0]
    assert [r["rung"] for r in run.journal.of("capacity.rung")] == [1, 0]


def test_detach_hands_over_once_the_job_runs_and_deletes_nothing() -> None:
    run = Run(options=dataclasses.replace(FAST, detach=True))
    result = run.run()
    assert result.outcome == "detached" and not result.already and not result.deleted
    assert "the job runs (2 running); handed over" in (result.message or "")
    zone = run.qr.zone("z")
    assert (zone.state, zone.creates, zone.deletes) == ("ACTIVE", 1, 0)
    assert run.jobs.delivered == 1 and "job.running" in run.journal.kinds
    assert run.journal.kinds[-1] == "up.exit" and "run.done" not in run.journal.kinds
    # The scheduler's first step takes it on where up left it: no second start.
    again = Run(store=run.journal, slices=run.qr, jobs=run.jobs, time=run.time)
    again.time.at(again.time.t + 5, lambda: setattr(again.record, "done", True))
    assert again.run().outcome == "done" and run.jobs.delivered == 1


def test_the_run_s_spec_is_kept_at_its_start_and_at_a_person_s_up() -> None:
    """`begin` (run.json) before the run's first entry; again when a person's up takes the
    run on; never at a scheduler's later steps."""
    from tpuctl.jobs.reconcile.step import run_step

    run = Run()
    world = run.world()
    policy = policy_of(run.spec, FAST, "z")
    first = run_step(world, run.journal, policy)
    assert run.journal.begun == 1 and first.said[0].kind == "run.start"
    run_step(world, run.journal, policy)
    assert run.journal.begun == 1
    run_step(world, run.journal, policy, new_attempt=True)  # up on a run under way
    assert run.journal.begun == 2 and run.journal.kinds.count("run.start") == 1
