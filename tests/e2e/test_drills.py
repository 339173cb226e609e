"""End to end: `tpuctl drill` against a job that `tpuctl up` babysits, in the emulator.

Each test starts `tpuctl up` (a real process), lets the toy trainer run, disrupts it with
`tpuctl drill`, and checks the numbers the drill reports against the checkpoints and logs the
run left on the (emulated) workers' disks. `up` must also treat the event as no failure of the
job: its failure budget is 0, so a wrong call would end it with exit 3.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable

import pytest

from tests.cli.test_output_contract import check
from tests.e2e.conftest import Job
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def _drill(job: Job, *args: str) -> dict[str, object]:
    outcome = job.cli("drill", str(job.spec), "--format", "json", "--timeout", "90", *args)
    assert outcome.exit_code == 0, outcome.stdout + outcome.stderr
    report: dict[str, object] = outcome.json()
    check(report, "drill")
    return report


def _finish(job: Job) -> str:
    code, log = job.wait_up()
    assert code == 0, log
    assert "not a failure" in log or "resumed from step" in log, log
    assert not job.qr_exists()
    return log


def test_maintenance_with_autocheckpoint_loses_nothing(make_job: Callable[..., Job]) -> None:
    job = make_job(steps=200, slices=1, accelerator="v4-8", autocheckpoint=True)
    job.start_up()
    job.wait_running()
    report = _drill(job, "--kind", "maintenance")
    event = report["step_at_event"]
    assert isinstance(event, int) and event > 0
    # The SIGTERM made the trainer save at the step it had reached, and it resumed there.
    assert report["checkpoint_at_event"] is True
    assert report["autocheckpoint_logged"] == event
    assert report["resumed_from"] == event
    assert report["recomputed_steps"] == 0
    assert report["allowed_steps"] == 0
    boots_before = report["boots_before"]
    boots_after = report["boots_after"]
    assert isinstance(boots_before, dict) and isinstance(boots_after, dict)
    assert all(boots_after[label] == boots_before[label] + 1 for label in boots_before)
    # The new boot's log starts where the old one stopped (read before up deletes the disks).
    assert f"resumed from step {event}" in job.log(0, 0, boot=2)
    assert f"autocheckpoint at step {event}" in job.log(0, 0, boot=1)
    log = _finish(job)
    assert "relaunched itself after a reboot" in log
    kinds = job.journal_kinds()
    assert {"drill.triggered", "drill.recovered", "drill.result", "job.relaunched"} <= set(kinds)
    assert "job.failed" not in kinds


def test_maintenance_without_autocheckpoint_recomputes_since_last_checkpoint(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(
        steps=200, slices=1, accelerator="v4-8", autocheckpoint=False, checkpoint_every=25
    )
    job.start_up()
    job.wait_running()
    # The event must come after a periodic checkpoint, for there to be one to resume from.
    wait_for(job.complete_steps, 60, "the first periodic checkpoint")
    report = _drill(job, "--kind", "maintenance")
    event = report["step_at_event"]
    last = report["last_checkpoint_before_event"]
    assert isinstance(event, int) and isinstance(last, int)
    # Killed at once: no save at the event; it resumed from the last periodic checkpoint and
    # recomputes exactly the steps since then, nothing more. That is 25 when the kill came
    # between a checkpoint step's log line and its save (the trainer logs a step, then saves).
    assert last % 25 == 0 and 0 <= event - last <= 25
    assert report["autocheckpoint_logged"] is None
    assert report["resumed_from"] == last
    assert report["recomputed_steps"] == event - last == report["allowed_steps"]
    assert f"resumed from step {last}" in job.log(0, 0, boot=2)
    _finish(job)


def test_slice_failure_restarts_and_resumes_every_slice_together(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=200, slices=2, autocheckpoint=True, checkpoint_every=10)
    job.start_up()
    job.wait_running()
    report = _drill(job, "--kind", "slice-failure", "--slice", "1", "--external-recovery")
    resumed = report["resumed_from"]
    assert isinstance(resumed, int)
    assert report["recomputed_steps"] is not None
    assert report["recomputed_steps"] <= report["allowed_steps"]  # type: ignore[operator]
    # Every worker of both slices runs a new process that resumed from a checkpoint: the
    # restarted slice at once, the replaced one (fresh disk, code delivered again by tpuctl up)
    # a moment later. The toy trainer's processes do not wait for each other the way JAX's
    # distributed runtime does, so the late slice may pick up a newer checkpoint than worker 0.
    event = report["step_at_event"]
    assert isinstance(event, int)
    # The drill ends once worker 0 resumed; the others' trainers may still be starting (the
    # replaced slice's "trainer started" comes a moment before its "resumed from" line).
    for slice_index in range(2):
        for worker in range(2):

            def resumed_at(s: int = slice_index, w: int = worker) -> list[str]:
                return re.findall(r"resumed from step (\d+)", job.log(s, w))

            found = wait_for(resumed_at, 30, f"worker {slice_index}/{worker} to resume")
            text = job.log(slice_index, worker)
            assert int(found[0]) >= resumed, (slice_index, worker, text[-500:])
            assert "starting fresh" not in text
    boots_before, boots_after = report["boots_before"], report["boots_after"]
    assert isinstance(boots_before, dict) and isinstance(boots_after, dict)
    assert boots_after["0/0"] == boots_before["0/0"] + 1  # restarted, disk kept
    assert boots_after["1/0"] == 1  # replaced: a new disk boots for the first time
    log = _finish(job)
    assert "wait for the code" in log
    final = json.loads((job.checkpoint_dir / "final.json").read_text())
    assert final["step"] == job.steps and final["history"] == [[1, job.steps]]


def _check_preemption(report: dict[str, object]) -> int:
    """A preemption gives no grace: the job resumes from the last checkpoint before it and
    recomputes only the steps since then."""
    event, last = report["step_at_event"], report["last_checkpoint_before_event"]
    assert isinstance(event, int) and isinstance(last, int)
    assert report["resumed_from"] == last
    assert report["recomputed_steps"] == event - last == report["allowed_steps"]
    assert report["ok"] is True
    return last


def test_preempt_drill_while_up_recovers(make_job: Callable[..., Job]) -> None:
    # The recreated QR has new VMs with new host keys: the drill must look its observer up
    # again, or every log read fails verification and it never sees the job come back.
    job = make_job(steps=200, slices=2, autocheckpoint=True, checkpoint_every=10)
    job.start_up()
    job.wait_running()
    last = _check_preemption(_drill(job, "--kind", "preempt", "--external-recovery"))
    log = _finish(job)
    assert f"resumed from step {last}" in log
    assert job.journal_kinds().count("qr.recreated") == 1


def test_preempt_drill_recovers_by_itself(make_job: Callable[..., Job]) -> None:
    # 600 steps (30 s): the job must still run when the second `up` starts, after the drill.
    # With 200, a slow machine finished the job first, and that up found it done.
    job = make_job(steps=600, slices=1, accelerator="v4-8", checkpoint_every=10)
    up = job.start_up()
    job.wait_running()
    up.send_signal(signal.SIGINT)  # stop babysitting: the QR and the job are left running
    code, _ = job.wait_up(timeout=60)
    assert code == 130
    _check_preemption(_drill(job, "--kind", "preempt"))
    assert "qr.recreated" in job.journal_kinds()
    job.start_up()  # picks the running job up and sees it through
    code, log = job.wait_up()
    assert code == 0, log
    assert "supervising it without a restart" in log
    assert not job.qr_exists()
    final = json.loads((job.checkpoint_dir / "final.json").read_text())
    assert final["history"] == [[1, job.steps]]
