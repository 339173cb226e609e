"""The goodput arithmetic behind `tpuctl report`: buckets, disruptions, step times (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpuctl.jobs.goodput import build_report, checkpoint_step_seconds

T0 = datetime(2026, 1, 2, 3, 0, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Entry:
    timestamp: datetime
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


def at(seconds: float, kind: str, **fields: Any) -> Entry:
    return Entry(T0 + timedelta(seconds=seconds), kind, fields)


def test_report_buckets_a_preemption_and_sums_to_the_total() -> None:
    entries = [
        at(0, "up.start"),
        at(1, "qr.created"),
        at(10, "qr.state", state="PROVISIONING"),
        at(20, "qr.state", state="ACTIVE"),
        at(25, "job.started"),
        at(30, "job.running", resumed_from=0),
        at(100, "preemption.detected", last_step=70, step_seconds=1.0),
        at(102, "qr.deleted"),
        at(103, "qr.recreated"),
        at(130, "job.running", resumed_from=60),
        at(200, "job.done"),
        at(201, "qr.deleted"),
    ]
    report = build_report(entries, name="n", run="n", now=T0 + timedelta(hours=1))
    assert report.status == "done"
    assert report.total_seconds == 200
    assert report.badput["queueing"] == 10
    assert report.badput["provisioning"] == 20  # PROVISIONING, then ACTIVE until it ran
    assert report.badput["disruption_recovery"] == 30  # detection → running again
    assert report.badput["wasted_progress"] == 10  # (70 − 60) steps × 1 s
    assert report.running_seconds == 140
    assert report.productive_seconds == 130
    assert report.goodput == pytest.approx(130 / 200)
    [disruption] = report.disruptions
    assert disruption.kind == "preemption" and disruption.recovery_seconds == 30
    assert disruption.recomputed_steps == 10


def test_report_takes_the_drills_exact_count_and_an_open_run() -> None:
    entries = [
        at(0, "up.start"),
        at(5, "qr.state", state="ACTIVE"),
        at(6, "job.running"),
        at(50, "drill.triggered", drill="maintenance", step_seconds=0.5),
        at(52, "drill.recovered", resumed_from=80),
        at(52, "drill.result", recomputed_steps=0),
    ]
    report = build_report(entries, name="n", run="n", now=T0 + timedelta(seconds=60))
    assert report.status == "running" and report.total_seconds == 60
    [disruption] = report.disruptions
    assert disruption.kind == "drill: maintenance"
    assert disruption.recomputed_steps == 0 and disruption.recomputed_exact
    assert report.badput["disruption_recovery"] == 2


def test_checkpoint_step_seconds_uses_the_steadiest_stretch() -> None:
    commits = [(10, T0), (20, T0 + timedelta(seconds=10)), (30, T0 + timedelta(seconds=60))]
    assert checkpoint_step_seconds(commits) == 1.0
    assert checkpoint_step_seconds([(10, T0)]) is None


def test_the_timeline_says_which_zone_ran_which_part() -> None:
    entries = [
        at(0, "up.start", zone="a"),
        at(1, "zone.race", zones=["a", "b"], zone=None),
        at(2, "qr.created", zone="a", racing=True),
        at(3, "qr.created", zone="b", racing=True),
        at(4, "qr.state", state="WAITING_FOR_RESOURCES", zone="a", racing=True),
        at(20, "qr.state", state="PROVISIONING", zone="b", racing=True),
        at(30, "qr.state", state="ACTIVE", zone="b", racing=True),
        at(31, "zone.chosen", zone="b"),
        at(32, "qr.deleted", zone="a", racing=True),  # the loser: b's state is unchanged
        at(35, "job.running", zone="b", resumed_from=None),
        at(60, "preemption.detected", zone="b"),
        at(61, "qr.deleted", zone="b"),
        at(62, "zone.next", zone="a"),
        at(63, "qr.recreated", zone="a"),
        at(70, "qr.state", state="ACTIVE", zone="a"),
        at(75, "job.running", zone="a", resumed_from=0),
        at(100, "job.done", zone="a"),
    ]
    report = build_report(entries, name="n", run="n")
    parts = [(phase.phase, phase.zones, phase.seconds) for phase in report.timeline]
    assert parts == [
        ("queueing", ("a",), 1),
        ("queueing", ("a", "b"), 19),
        ("provisioning", ("a", "b"), 11),
        ("provisioning", ("b",), 4),
        ("running", ("b",), 25),
        ("disruption_recovery", ("b",), 2),
        ("disruption_recovery", ("a",), 13),
        ("running", ("a",), 25),
    ]
    assert report.timeline[0].to_dict()["zones"] == ["a"]
    assert report.badput["queueing"] == 20 and report.badput["provisioning"] == 15


def test_each_part_of_a_ladders_timeline_names_its_rung() -> None:
    entries = [
        at(0, "up.start"),
        at(1, "qr.created"),
        at(20, "capacity.rung", rung=1, name="flex-start 10m", previous=0, why="no capacity"),
        at(21, "qr.deleted"),
        at(22, "qr.created", rung=1),
        at(30, "qr.state", state="ACTIVE"),
        at(35, "job.running", resumed_from=0),
        at(60, "run.ended", last_step=40),
        at(61, "capacity.rung", rung=2, name="on-demand", previous=1, why="no capacity"),
        at(70, "qr.created", rung=2),
        at(80, "job.running", resumed_from=40),
        at(100, "job.done"),
    ]
    report = build_report(
        entries, name="n", run="n", now=T0 + timedelta(hours=1), first_rung="spot"
    )
    parts = [(phase.phase, phase.rung, phase.seconds) for phase in report.timeline]
    assert parts == [
        ("queueing", "spot", 20),
        ("queueing", "flex-start 10m", 10),
        ("provisioning", "flex-start 10m", 5),
        ("running", "flex-start 10m", 25),
        ("between_runs", "flex-start 10m", 1),
        ("between_runs", "on-demand", 19),
        ("running", "on-demand", 20),
    ]
    assert report.timeline[0].to_dict()["rung"] == "spot"
    # Without a ladder, no rung.
    plain = build_report(entries[:2], name="n", run="n", now=T0 + timedelta(seconds=5))
    assert [phase.rung for phase in plain.timeline] == [None]


def test_a_journal_without_zones_has_an_empty_zone_list() -> None:
    entries = [at(0, "up.start"), at(1, "qr.created"), at(5, "qr.state", state="ACTIVE")]
    report = build_report(entries, name="n", run="n")
    assert all(phase.to_dict()["zones"] == [] for phase in report.timeline)


def test_a_short_failed_job_s_run_is_running_time_not_provisioning() -> None:
    """The job started, exited before up's first look saw it running, and failed: the time
    from its start to the failure was the job's, on an ACTIVE slice. A restart that fails as
    fast is running time again, after the recovery from the first failure."""
    entries = [
        at(0, "up.start"),
        at(1, "qr.created"),
        at(10, "qr.state", state="ACTIVE"),
        at(20, "job.started"),
        at(50, "job.failed", exit_codes=[1], states=["exited", "exited"]),
        at(52, "job.restarted", count=1),
        at(90, "job.failed", exit_codes=[1], states=["exited", "exited"]),
        at(91, "up.exit", exit_code=3, outcome="failed"),
    ]
    report = build_report(entries, name="n", run="n", now=T0 + timedelta(hours=1))
    assert report.status == "failed" and report.total_seconds == 91
    assert report.badput["provisioning"] == 10  # ACTIVE until the job started: 10 → 20
    assert report.running_seconds == 30 + 38  # 20 → 50, then 52 → 90
    assert report.badput["disruption_recovery"] == 2 + 1  # 50 → 52, 90 → 91
    first, second = report.disruptions
    assert first.kind == "job failure" and first.recovery_seconds == 2
    assert second.kind == "job failure" and second.running_again_at is None  # up gave up


def test_a_job_whose_setup_failed_never_ran() -> None:
    entries = [
        at(0, "up.start"),
        at(10, "qr.state", state="ACTIVE"),
        at(20, "job.started"),
        at(50, "job.failed", exit_codes=[], states=["setup-failed", "setup-failed"]),
        at(51, "up.exit", exit_code=3, outcome="failed"),
    ]
    report = build_report(entries, name="n", run="n", now=T0 + timedelta(hours=1))
    assert report.running_seconds == 0
    assert report.badput["provisioning"] == 40  # boot and setup: the job never ran


def _one_attempt(*ending: Entry) -> list[Entry]:
    return [
        at(0, "run.start", attempt=1),
        at(1, "qr.created"),
        at(10, "qr.state", state="ACTIVE"),
        at(12, "job.running", resumed_from=None),
        *ending,
    ]


def test_a_run_s_end_is_its_done_marker_give_up_or_stop() -> None:
    later = T0 + timedelta(hours=5)
    done = build_report(
        _one_attempt(
            at(100, "job.done"), at(101, "qr.deleting"), at(130, "qr.deleted"), at(131, "run.done")
        ),
        name="n",
        run="n",
        now=later,
    )
    # The deletion after the done marker is not the job's time.
    assert (done.status, done.total_seconds, done.running_seconds) == ("done", 100, 88)
    gave_up = build_report(
        _one_attempt(
            at(50, "job.failed", exit_codes=[1]),
            at(60, "run.gave_up", error={"kind": "command_failed", "exit_code": 3}),
            at(61, "qr.deleted"),
        ),
        name="n",
        run="n",
        now=later,
    )
    assert (gave_up.status, gave_up.total_seconds) == ("given_up", 60)
    stopped = build_report(_one_attempt(at(70, "run.stopped")), name="n", run="n", now=later)
    assert (stopped.status, stopped.total_seconds) == ("stopped", 70)
    # An up's exit no longer decides: the run goes on after a scheduler took it over.
    going = build_report(
        _one_attempt(at(20, "up.exit", exit_code=0, outcome="detached")),
        name="n", run="n", now=T0 + timedelta(seconds=300),
    )  # fmt: skip
    assert (going.status, going.total_seconds) == ("running", 300)


def test_a_new_attempt_after_a_give_up_is_running_again() -> None:
    entries = [
        *_one_attempt(at(60, "run.gave_up", error={"kind": "deadline", "exit_code": 4})),
        at(100, "run.start", attempt=2),
        at(101, "qr.created"),
    ]
    report = build_report(entries, name="n", run="n", now=T0 + timedelta(seconds=200))
    assert report.status == "running" and report.total_seconds == 200


def test_flex_start_run_ends_are_counted_apart_with_each_run_s_share() -> None:
    entries = _one_attempt(
        at(100, "run.ended", count=1, last_step=80, termination_time="2026-01-02T03:01:40Z"),
        at(101, "qr.deleted"),
        at(102, "qr.recreated", count=1),
        at(120, "qr.state", state="ACTIVE"),
        at(130, "job.running", resumed_from=78, recovering="run end"),
        at(230, "job.done"),
        at(231, "run.done"),
    )
    entries[3] = at(12, "job.running", resumed_from=None, step_seconds=0.5)
    report = build_report(entries, name="n", run="n")
    assert report.status == "done" and report.total_seconds == 230
    assert report.disruptions == []  # neither a preemption nor a failure
    assert report.badput["between_runs"] == 30 and report.badput["disruption_recovery"] == 0
    assert report.badput["wasted_progress"] == 1.0  # steps 78 to 80 again, 0.5 s each
    assert ("between_runs", 30) in [(p.phase, p.seconds) for p in report.timeline]
    first, second = (run.to_dict(report.total_seconds) for run in report.flex_runs)
    assert (first["run"], first["seconds"], first["running_seconds"]) == (1, 100, 88)
    assert first["ended"] and first["gap_seconds"] == 30 and first["recomputed_steps"] == 2
    assert first["termination_time"] == "2026-01-02T03:01:40Z"
    assert (second["seconds"], second["running_seconds"], second["ended"]) == (130, 100, False)
    assert first["share"] + second["share"] == pytest.approx(1.0)
    # A run that never reached its end has no runs to tell apart.
    assert build_report(_one_attempt(at(50, "run.done")), name="n", run="n").flex_runs == []


def test_a_give_up_s_kept_log_lines_are_in_the_report() -> None:
    entries = _one_attempt(
        at(50, "job.failed", exit_codes=[1]),
        at(
            55,
            "job.logs",
            tails={"0/0": "step 3\nTraceback: boom"},
            reasons={"0/0": "exit 1"},
            where="gs://b/run/tpuctl/n/logs",
        ),
        at(56, "run.gave_up", error={"kind": "command_failed", "exit_code": 3}),
    )
    report = build_report(entries, name="n", run="n")
    logs = report.to_dict()["logs"]
    assert logs["tails"] == {"0/0": "step 3\nTraceback: boom"}
    assert logs["where"] == "gs://b/run/tpuctl/n/logs" and logs["reasons"] == {"0/0": "exit 1"}
    assert build_report(_one_attempt(), name="n", run="n").logs is None
