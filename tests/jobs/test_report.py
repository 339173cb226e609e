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
