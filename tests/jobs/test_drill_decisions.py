"""The drill's decisions: its verdict (tpuctl.jobs.drill_verdict, pure) for what each event
allows, and a whole maintenance drill (tpuctl.jobs.drill) run against fakes and a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jobs.fakes import FakeClock, FakeJobs, FakeQr, FakeRecord, fleet, spec
from tpuctl.cloud.watcher import GONE
from tpuctl.errors import DeadlineError, ExitCode, TpuctlError, UsageError
from tpuctl.jobs.drill import GOING_DOWN_CONNECT_TIMEOUT, Drill, DrillOptions, check_kind
from tpuctl.jobs.drill_verdict import DrillReport, judge
from tpuctl.storage.logs import compile_step_pattern, parse_log

PATTERN = compile_step_pattern(None)


def verdict(
    *,
    drill: str = "maintenance",
    autocheckpoint: bool = True,
    old_log: str,
    new_log: str,
    before: set[int],
    after: set[int],
    has_record: bool = True,
) -> DrillReport:
    report = DrillReport(name="job", run="job", drill=drill, autocheckpoint=autocheckpoint)
    judge(
        report,
        old_text=old_log,
        new=parse_log(new_log, PATTERN),
        before_steps=before,
        after_steps=after,
        pattern=PATTERN,
        has_record=has_record,
    )
    return report


def test_maintenance_with_autocheckpoint_allows_no_recomputed_step() -> None:
    ok = verdict(
        old_log="step 49/100\nstep 50/100\nautocheckpoint at step 50\n",
        new_log="resumed from step 50\nstep 51/100\n",
        before={40},
        after={40, 50},
    )
    assert (ok.ok, ok.recomputed_steps, ok.allowed_steps) == (True, 0, 0)
    assert ok.checkpoint_at_event and ok.new_checkpoint_at_event and ok.exit_code == ExitCode.OK
    lost = verdict(
        old_log="step 50/100\n",
        new_log="resumed from step 40\nstep 41/100\n",
        before={40},
        after={40},
    )
    assert not lost.ok and lost.recomputed_steps == 10 and lost.allowed_steps == 0
    assert lost.verdict.startswith("FAILED: no checkpoint at the event step")
    assert lost.exit_code == ExitCode.ERROR and lost.exit_error() is not None


def test_without_autocheckpoint_the_steps_since_the_last_checkpoint_are_allowed() -> None:
    within = verdict(
        drill="preempt",
        autocheckpoint=False,
        old_log="step 57/100\n",
        new_log="resumed from step 50\nstep 51/100\n",
        before={40, 50},
        after={40, 50},
    )
    assert (within.ok, within.recomputed_steps, within.allowed_steps) == (True, 7, 7)
    beyond = verdict(
        drill="preempt",
        autocheckpoint=False,
        old_log="step 57/100\n",
        new_log="resumed from step 40\nstep 41/100\n",
        before={40, 50},
        after={40, 50},
    )
    assert not beyond.ok and beyond.recomputed_steps == 17 and beyond.allowed_steps == 7
    assert beyond.verdict.startswith("FAILED: progress lost beyond what the event allows")


def test_a_checkpoint_completed_after_the_resume_is_not_one_it_could_have_used() -> None:
    """A slice failure: slice 0 ran on to step 57 and saved its part of step 50, which became
    complete only when the replaced slice, up later than worker 0's resume from 40, saved its
    own: 40 was the latest checkpoint the new process could use."""
    late = verdict(
        drill="slice-failure",
        autocheckpoint=True,
        old_log="step 57/100\n",
        new_log="resumed from step 40\nstep 41/100\n",
        before={40},
        after={40, 50},
    )
    assert (late.ok, late.recomputed_steps, late.allowed_steps) == (True, 17, 17)


def test_a_resume_past_the_log_s_last_step_raises_the_step_at_the_event() -> None:
    """A preemption while the worker read lags: its log showed step 19, yet step 20's checkpoint
    was complete and the job resumed from it. The job had reached step 20: nothing was lost,
    and the report says the step at the event is a lower bound."""
    stale = verdict(
        drill="preempt",
        autocheckpoint=True,
        old_log="step 18/100\nstep 19/100\n",
        new_log="resumed from step 20\nstep 21/100\n",
        before={10},
        after={10, 20},
    )
    assert (stale.step_at_event, stale.step_at_event_exact) == (20, False)
    assert stale.last_checkpoint_before_event == 20 and stale.resumed_from == 20
    assert (stale.ok, stale.recomputed_steps, stale.allowed_steps) == (True, 0, 0)
    assert any("after the last step the log showed (19)" in note for note in stale.notes)


def test_no_step_lines_at_all_is_no_verdict_but_a_failure() -> None:
    blind = verdict(old_log="", new_log="", before=set(), after=set())
    assert not blind.ok and "could not tell" in blind.verdict


def test_preempt_and_slice_failure_drills_need_the_emulator() -> None:
    check_kind("maintenance", on_emulator=False)
    with pytest.raises(UsageError):
        check_kind("preempt", on_emulator=False)
    with pytest.raises(UsageError):
        check_kind("slice-failure", on_emulator=False)
    with pytest.raises(UsageError):
        check_kind("flood", on_emulator=True)


def _drill(
    time: FakeClock,
    jobs: FakeJobs,
    qr: FakeQr,
    record: FakeRecord,
    options: DrillOptions,
    **extra: Any,
) -> Drill:
    """A drill of `qr` against fakes, on `time`'s clock (`extra`: admin, on_event)."""
    return Drill(
        qr, spec(), fleet_factory=fleet, options=options, jobs=jobs, record=record,
        clock=time.clock(), **extra,
    )  # fmt: skip


def test_a_whole_maintenance_drill_against_fakes() -> None:
    time, jobs, qr, record = FakeClock(), FakeJobs(), FakeQr(state="ACTIVE"), FakeRecord()
    jobs.set("running")
    record.steps = [40]
    jobs.logs[1] = "starting fresh\nstep 41/100\n"
    time.at(1, lambda: jobs.logs.__setitem__(1, "starting fresh\nstep 41/100\nstep 42/100\n"))

    def maintenance_happens() -> None:
        jobs.logs[1] = "step 41/100\nstep 42/100\nstep 43/100\nautocheckpoint at step 43\n"
        record.steps.append(43)
        jobs.reboot()
        jobs.logs[2] = "resumed from step 43\nstep 44/100\n"

    time.at(3, maintenance_happens)
    drill = _drill(time, jobs, qr, record, DrillOptions(kind="maintenance", timeout=60, poll=0.5))
    report = drill.run()
    assert qr.maintenances == [("job", 0)]
    assert report.ok, report.verdict
    assert (report.step_at_event, report.resumed_from, report.recomputed_steps) == (43, 43, 0)
    assert report.boots_before == {"0/0": 1, "0/1": 1} and report.boots_after["0/0"] == 2


def test_a_drill_whose_job_never_comes_back_gives_up_at_its_timeout() -> None:
    time, jobs, qr = FakeClock(), FakeJobs(), FakeQr(state="ACTIVE")
    jobs.set("running")
    jobs.logs[1] = "step 41/100\n"
    time.at(1, lambda: jobs.logs.__setitem__(1, "step 41/100\nstep 42/100\n"))
    options = DrillOptions(kind="maintenance", timeout=20, poll=0.5)
    drill = _drill(time, jobs, qr, FakeRecord(steps=[40]), options)
    with pytest.raises(DeadlineError) as raised:
        drill.run()
    assert "new boot" in raised.value.message and time.t < 60


def _silent_drill(time: FakeClock, jobs: FakeJobs, record: FakeRecord) -> Drill:
    jobs.set("running")
    jobs.logs[1] = "loading data…\n"  # nothing a step pattern recognises
    options = DrillOptions(kind="maintenance", timeout=600, poll=0.5)
    return _drill(time, jobs, FakeQr(state="ACTIVE"), record, options)


def test_a_job_without_step_lines_is_drilled_from_its_checkpoints() -> None:
    time, jobs, record = FakeClock(), FakeJobs(), FakeRecord(steps=[100])

    def maintenance_happens() -> None:
        record.steps.append(137)  # the save on the autocheckpoint SIGTERM
        jobs.reboot()
        jobs.logs[2] = ""

    time.at(5, lambda: record.steps.append(120))  # periodic progress: seen, drill goes on
    time.at(7, maintenance_happens)
    time.at(30, lambda: record.steps.append(157))  # progress after the restart
    report = _silent_drill(time, jobs, record).run()
    assert report.ok, report.verdict
    assert report.progress_from == "checkpoints"
    assert (report.step_before_trigger, report.step_at_event, report.resumed_from) == (
        120,
        137,
        137,
    )
    assert report.recomputed_steps == 0 and not report.step_at_event_exact
    assert time.t < 60  # it did not wait out the patience: the checkpoints moved

    time, jobs, record = FakeClock(), FakeJobs(), FakeRecord(steps=[100])
    time.at(5, lambda: record.steps.append(120))
    time.at(7, jobs.reboot)  # maintenance, and no save on the SIGTERM
    time.at(30, lambda: record.steps.append(140))
    lost = _silent_drill(time, jobs, record).run()
    assert not lost.ok and "no checkpoint was saved at the event" in lost.verdict
    assert lost.resumed_from == 120 and lost.exit_code == ExitCode.ERROR


def test_a_job_showing_neither_steps_nor_checkpoints_fails_within_a_minute() -> None:
    time, jobs, record = FakeClock(), FakeJobs(), FakeRecord()
    with pytest.raises(TpuctlError) as raised:
        _silent_drill(time, jobs, record).run()
    message = raised.value.message
    assert "no line in the log of worker 0/0 matches" in message
    assert "no committed checkpoint under gs://bucket/ckpt/job" in message
    assert "--step-pattern" in (raised.value.hint or "")
    assert 60 <= time.t < 61


def test_the_drills_messages_read_as_words_not_python() -> None:
    """No `None` where a step is not known yet, and the step pattern as it is written (a
    person copies it into --step-pattern), not Python's repr with doubled backslashes."""
    time, jobs, qr = FakeClock(), FakeJobs(), FakeQr(state="ACTIVE")
    jobs.set("running")
    jobs.logs[1] = "starting fresh\nstep 1/100\n"
    time.at(1, lambda: jobs.logs.__setitem__(1, "starting fresh\nstep 1/100\nstep 2/100\n"))

    def maintenance_happens() -> None:
        jobs.reboot()
        jobs.logs[2] = "starting fresh\nstep 1/100\n"

    time.at(3, maintenance_happens)
    said: list[str] = []
    _drill(
        time,
        jobs,
        qr,
        FakeRecord(),  # no checkpoint yet
        DrillOptions(kind="maintenance", timeout=60, poll=0.5),
        on_event=lambda event: said.append(event.message),
    ).run()
    assert not any("None" in message for message in said), said
    assert "latest checkpoint: none yet" in said[0], said[0]

    time, jobs, record = FakeClock(), FakeJobs(), FakeRecord()
    with pytest.raises(TpuctlError) as raised:
        _silent_drill(time, jobs, record).run()
    pattern = PATTERN.pattern
    assert "\\b" in pattern and f"matches '{pattern}'," in raised.value.message
    assert "\\\\" not in raised.value.message


def test_a_failed_verdict_never_says_none() -> None:
    from tpuctl.jobs.drill_verdict import judge_checkpoints

    report = DrillReport(name="job", run="job", drill="preempt", autocheckpoint=False)
    judge_checkpoints(report, before_steps={100}, at_restart=set())
    assert not report.ok and "None" not in report.verdict, report.verdict
    assert "from scratch" in report.verdict


class _Admin:
    """The emulator's admin client, as far as a preempt drill uses it."""

    def __init__(self, qr: FakeQr) -> None:
        self.qr = qr

    def preempt(self, name: str) -> None:
        self.qr.state = "SUSPENDED"


def test_after_a_preemption_the_old_log_is_read_with_a_short_connect_timeout() -> None:
    """The old boot's log is read from a VM that is going down: with the fleet's 20 s connect
    timeout a silent one held the drill while tpuctl up recreated the run and finished its
    job, and the drill then waited for a recreate it had missed until its deadline."""
    time, qr, record, jobs = FakeClock(), FakeQr(state="ACTIVE"), FakeRecord(steps=[40]), FakeJobs()

    def going_down(timeout: float) -> None:
        time.t += timeout  # the silent VM holds the read that long; meanwhile tpuctl up
        qr.state = GONE  # recreated the run, the job finished and the run was deleted
        record.done = True

    jobs.going_down = going_down
    jobs.set("running")
    jobs.logs[1] = "step 41/100\n"
    time.at(1, lambda: jobs.logs.__setitem__(1, "step 41/100\nstep 42/100\n"))
    options = DrillOptions(kind="preempt", timeout=90, poll=0.5, external_recovery=True)
    drill = _drill(time, jobs, qr, record, options, admin=_Admin(qr))
    started = time.t
    with pytest.raises(TpuctlError) as raised:
        drill.run()
    assert jobs.connect_timeouts == [GOING_DOWN_CONNECT_TIMEOUT] and GOING_DOWN_CONNECT_TIMEOUT <= 5
    # Not the deadline's 90 s: the drill says at once what happened and what to do.
    assert not isinstance(raised.value, DeadlineError) and time.t - started < 30
    assert "finished before the drill saw it run again" in raised.value.message
    assert "longer" in (raised.value.hint or "")
