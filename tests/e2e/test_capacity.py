"""End to end on the emulator: a flex-start run of the independent trainer taken back at its
maximum run duration, again and again, until the job is done, with no step computed twice; and
a capacity ladder spot → flex-start → on-demand where spot never gets capacity and flex-start
is taken back once. Each test queues in a zone of its own, with pools of its own, so the
session emulator's other tests keep theirs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Job
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def _capacity_spec(job: Job, zone: str, capacity: str, target_step: int) -> None:
    """The job's spec on v6e-4 in `zone`, with `capacity` (YAML lines under capacity:), and
    done at `target_step` (the trainer's last: it says nothing itself)."""
    text = job.spec.read_text()
    text = text.replace("runtime: tpu-ubuntu2204-base", "runtime: v2-alpha-tpuv6e")
    text = text.replace("capacity:\n  tier: spot\n", f"zone: {zone}\ncapacity:\n{capacity}")
    text = text.replace("job:\n", f"job:\n  target_step: {target_step}\n")
    job.spec.write_text(text)
    job.qr_exists = lambda: _left(job, zone) is not None  # type: ignore[method-assign]


def _left(job: Job, zone: str) -> Any:
    """The run's queued resource in `zone`, or None."""
    return job.project.api().in_zone(zone).find_queued_resource(job.name)


def _saves(job: Job) -> list[int]:
    return job.complete_steps()


def test_flex_start_runs_end_and_resume_until_the_job_is_done(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    zone = "europe-west9-b"
    emulator.admin.capacity({"v6e": 8}, zone=zone, flex_start=True)
    # 10 emulated minutes at the session emulator's speed (20) are 30 s of real time; the
    # trainer is stopped 300 emulated seconds (15 s) before each end, and needs about 24 s of
    # training: more than one run's.
    job = make_job(
        steps=240,
        step_seconds=0.1,
        checkpoint_every=100_000,  # no save of its own: only the ones a stop asks for
        slices=1,
        accelerator="v6e-4",
        extra_args="--keep 100",
        conventionless=True,
        elsewhere=False,
    )
    _capacity_spec(job, zone, "  tier: flex-start\n  max_run_duration: 10m\n", job.steps)
    job.start_up()
    code, log = job.wait_up(timeout=600)
    assert code == 0, log
    ends = [e for e in job.journal() if e.kind == "run.ended"]
    assert len(ends) >= 1, log
    assert "preemption.detected" not in job.journal_kinds()
    assert "job.failed" not in job.journal_kinds()
    # Every run but the last ended with the save its stop asked for, and the next resumed
    # from it: one save per run end, then the last step's; no step was computed twice.
    saves = _saves(job)
    assert len(saves) == len(ends) + 1 and saves[-1] == job.steps, (saves, len(ends))
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert json.loads(final)["history"] == [[1, job.steps]]
    # At each end, the last step the workers reached was the one committed.
    for end in ends:
        last = end.fields.get("last_step")
        assert last is None or last == end.fields.get("checkpoint_step"), end.fields
    assert _left(job, zone) is None  # the queued resource is gone


def test_a_ladder_climbs_from_spot_through_flex_start_to_on_demand(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    zone = "europe-west9-c"
    admin = emulator.admin
    admin.capacity({"v6e": 0}, zone=zone)  # spot (and on-demand) find nothing, for now
    admin.capacity({"v6e": 8}, zone=zone, flex_start=True)
    job = make_job(
        steps=220,
        step_seconds=0.1,
        checkpoint_every=100_000,
        slices=1,
        accelerator="v6e-4",
        extra_args="--keep 100",
        conventionless=True,
        elsewhere=False,
    )
    ladder = (
        "  fallback:\n"
        "    - {tier: spot}\n"
        "    - {tier: flex-start, max_run_duration: 10m}\n"
        "    - {tier: on-demand}\n"
        "deadlines:\n  queue: 12s\n"
    )
    _capacity_spec(job, zone, ladder, job.steps)
    job.start_up()
    # Spot never gets capacity: after its queueing deadline the ladder climbs to flex-start.
    wait_for(
        lambda: "job.running" in job.journal_kinds(), timeout=180, what="the job on flex-start"
    )
    # The next flex-start run will not find capacity; on-demand will.
    admin.capacity({"v6e": 0}, zone=zone, flex_start=True)
    admin.capacity({"v6e": 8}, zone=zone)
    code, log = job.wait_up(timeout=600)
    assert code == 0, log
    journal = job.journal()
    rungs = [e.fields.get("name") for e in journal if e.kind == "capacity.rung"]
    assert rungs == ["flex-start 10m", "on-demand"], rungs
    created = [e.fields.get("rung") for e in journal if e.kind in ("qr.created", "qr.recreated")]
    assert created[0] is None and 1 in created and created[-1] == 2, created
    assert [e.kind for e in journal].count("run.ended") == 1
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    # The report says which rung each part of the run was on, and its table shows it.
    report = job.cli("report", str(job.spec), "--format", "json")
    assert report.exit_code == 0, report.stderr
    on = [part["rung"] for part in report.json()["timeline"]]
    assert [rung for i, rung in enumerate(on) if i == 0 or on[i - 1] != rung] == [
        "spot", "flex-start 10m", "on-demand"
    ], on  # fmt: skip
    assert "CAPACITY" in job.cli("report", str(job.spec)).stdout
    # Nothing is left queued or running on any rung.
    assert _left(job, zone) is None
    status = admin.status()
    mine = [qr for qr in status.get("queued_resources", []) if job.name in json.dumps(qr)]
    assert mine == [], mine
