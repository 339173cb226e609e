"""End to end: `tpuctl up` babysits the toy trainer in the emulator through a spot preemption,
a reset, and a crash loop; `tpuctl report` shows what happened."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_output_contract import check
from tests.e2e.conftest import FAST_UP, Job
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def test_preemption_is_recovered_and_the_result_is_the_uninterrupted_one(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = make_job(steps=240, checkpoint_every=10, max_preemptions=2)
    job.start_up()
    wait_for(lambda: any(step >= 30 for step in job.complete_steps()), what="steps 30+")
    emulator.admin.preempt(f"projects/{job.env['TPUCTL_PROJECT']}/locations/"
                           f"us-central2-b/queuedResources/{job.name}")  # fmt: skip
    code, log = job.wait_up()
    assert code == 0, log
    assert "SUSPENDED" in log and "created" in log and "again" in log
    # Same run name → same checkpoint dir: it resumed, and the result is byte for byte the one
    # of a run that was never interrupted; every step was applied exactly once.
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert json.loads(final)["history"] == [[1, job.steps]]
    assert not job.qr_exists()
    kinds = job.journal_kinds()
    for kind in ("up.start", "preemption.detected", "qr.deleted", "qr.recreated",
                 "job.started", "job.running", "job.done", "up.exit"):  # fmt: skip
        assert kind in kinds, (kind, kinds)
    assert kinds.count("qr.recreated") == 1
    resumed = [e.fields.get("resumed_from") for e in job.journal() if e.kind == "job.running"]
    assert resumed[-1] is not None and resumed[-1] >= 30

    # The report sees the disruption and the time it cost.
    outcome = job.cli("report", str(job.spec), "--format", "json")
    assert outcome.exit_code == 0, outcome.stderr
    report = outcome.json()
    check(report, "report")
    assert report["status"] == "done"
    assert [d["kind"] for d in report["disruptions"]] == ["preemption"]
    disruption = report["disruptions"][0]
    assert disruption["recovery_seconds"] > 0
    assert set(report["badput"]) == {
        "queueing", "provisioning", "disruption_recovery", "between_runs", "wasted_progress",
    }  # fmt: skip
    assert report["badput"]["between_runs"] == 0 and report["flex_runs"] == []
    assert report["badput"]["disruption_recovery"] == pytest.approx(
        disruption["recovery_seconds"], abs=0.01
    )
    assert 0 < report["goodput"] < 1
    parts = report["productive_seconds"] + sum(report["badput"].values())
    assert parts == pytest.approx(report["total_seconds"], abs=0.05)
    table = job.cli("report", str(job.spec))
    assert "preemption" in table.stdout and "goodput" in table.stdout


def test_reset_resumes_and_a_finished_job_is_not_relaunched(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=160, slices=1, accelerator="v4-8", checkpoint_every=10)
    job.start_up("--keep")
    wait_for(lambda: any(step >= 20 for step in job.complete_steps()), what="steps 20+")
    reset = job.cli("reset", job.name)
    assert reset.exit_code == 0, reset.stderr
    code, log = job.wait_up()
    assert code == 0, log
    assert "not a failure" in log
    assert "resumed from step" in job.log(0, 0, boot=2)
    assert job.qr_exists()  # --keep
    final = job.checkpoint_dir / "final.json"
    before = final.stat().st_mtime_ns

    # A reboot of the finished job: the startup script sees the done marker, starts nothing.
    again = job.cli("reset", job.name)
    assert again.exit_code == 0, again.stderr
    wait_for(lambda: "not relaunching" in job.log(0, 0, boot=3), what="boot 3 to see DONE")
    boot3 = job.log(0, 0, boot=3)
    assert "resumed from step" not in boot3 and "trainer started" not in boot3
    assert final.stat().st_mtime_ns == before
    # And `tpuctl up` on a finished job only cleans up.
    outcome = job.cli("up", str(job.spec), "--poll", "0.5")
    assert outcome.exit_code == 0, outcome.stderr
    assert ": the run is over (done)" in outcome.stderr
    assert not job.qr_exists()


def test_preemption_budget_exhausted_exits_7_and_deletes_the_suspended_qr(
    make_job: Callable[..., Job], emulator: Any
) -> None:
    job = make_job(steps=400, slices=1, accelerator="v4-8", max_preemptions=0)
    job.start_up()
    job.wait_running()
    emulator.admin.preempt(f"projects/{job.env['TPUCTL_PROJECT']}/locations/"
                           f"us-central2-b/queuedResources/{job.name}")  # fmt: skip
    code, log = job.wait_up()
    assert code == 7, log
    assert "max_preemptions" in log
    # A SUSPENDED QR is never re-allocated and holds its name: up does not leave it behind.
    assert not job.qr_exists()
    kinds = job.journal_kinds()
    assert "qr.recreated" not in kinds
    exits = [e.fields for e in job.journal() if e.kind == "up.exit"]
    assert exits[-1]["exit_code"] == 7


def test_crash_loop_stops_with_exit_3(make_job: Callable[..., Job]) -> None:
    job = make_job(
        steps=100, slices=1, accelerator="v4-8", extra_args="--fail-at-step 3", max_failures=5
    )
    job.start_up()
    code, log = job.wait_up()
    assert code == 3, log
    assert "crash loop" in log
    kinds = job.journal_kinds()
    # Two restarts that brought no new checkpoint, then it gave up (well before the budget of 5).
    assert kinds.count("job.restarted") == 2
    assert kinds.count("job.failed") == 3
    assert "crashloop" in kinds
    exits = [e.fields for e in job.journal() if e.kind == "up.exit"]
    assert exits[-1]["exit_code"] == 3


def test_failure_budget_exhausted_exits_3(make_job: Callable[..., Job]) -> None:
    job = make_job(steps=100, slices=1, accelerator="v4-8", extra_args="--fail-at-step 3")
    job.start_up()  # recovery.max_failures: 0
    code, log = job.wait_up()
    assert code == 3, log
    assert "max_failures is 0" in log
    assert "job.restarted" not in job.journal_kinds()
    # The workers are gone with the queued resource; their last lines are not.
    assert not job.qr_exists()
    report = job.cli("report", str(job.spec), "--format", "json").json()
    assert report["status"] == "given_up" and report["logs"]["where"], report["logs"]
    assert "simulated failure at step 3" in report["logs"]["tails"]["0/0"]
    table = job.cli("report", str(job.spec)).stdout
    assert "last log lines kept at the give-up" in table
    assert "--- 0/0" in table and "simulated failure at step 3" in table


def test_ctrl_c_leaves_the_job_and_up_again_picks_it_up_without_a_restart(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=200, slices=1, accelerator="v4-8", checkpoint_every=10)
    process = job.start_up()
    job.wait_running()
    process.send_signal(signal.SIGINT)
    code, log = job.wait_up(timeout=30)
    assert code == 130, log
    assert "resume with: tpuctl up" in log and "tpuctl delete" in log
    assert job.qr_exists()
    assert job.journal()[-1].fields["exit_code"] == 130

    job.start_up()
    code, log = job.wait_up()
    assert code == 0, log
    assert "already running" in log and "without a restart" in log, log
    assert "job delivered" not in log
    assert not job.qr_exists()
    # One trainer process ran the whole job: one boot, started fresh once, never resumed.
    kinds = job.journal_kinds()
    assert kinds.count("up.start") == 2 and kinds.count("job.started") == 1


def test_a_preempt_drill_is_refused_against_the_real_api(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=10, slices=1, accelerator="v4-8")
    env = {**job.env, "TPU_EMULATOR_HOST": ""}
    outcome = job.cli_env(env, "drill", str(job.spec), "--kind", "preempt")
    assert outcome.exit_code == 2, outcome.stderr
    assert "cannot be triggered against the real Cloud TPU API" in outcome.stderr


def test_a_queueing_deadline_exits_4_and_cancels_the_request(
    make_job: Callable[..., Job], emulator: Any
) -> None:
    job = make_job(steps=10, slices=1, accelerator="v4-8")
    admin = emulator.admin
    before = admin.capacity()["v4"]["total"]
    admin.capacity({"v4": 0})  # nothing fits: the request waits for resources
    try:
        outcome = job.cli("up", str(job.spec), "--queue-timeout", "1")
    finally:
        admin.capacity({"v4": before})
    assert outcome.exit_code == 4, outcome.stderr
    assert "queueing deadline" in outcome.stderr
    assert not job.qr_exists()  # given up on, so it can never boot orphan workers later
    exits = [e.fields for e in job.journal() if e.kind == "up.exit"]
    assert exits[-1]["exit_code"] == 4


def test_a_second_up_says_who_babysits_the_run_and_a_patient_one_takes_over(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=160, slices=1, accelerator="v4-8", checkpoint_every=10)
    job.start_up()
    job.wait_running()
    second = job.cli("up", str(job.spec), "--poll", "0.5")
    assert second.exit_code == 1, second.stderr
    assert "another supervisor holds this run" in second.stderr
    assert "--wait-for-lease" in second.stderr
    assert job.journal_kinds().count("up.start") == 1  # the second wrote nothing

    patient = subprocess.Popen(
        [sys.executable, "-m", "tpuctl", "up", str(job.spec), *FAST_UP, "--wait-for-lease"],
        env=job.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    code, log = job.wait_up()
    assert code == 0, log
    output, _ = patient.communicate(timeout=120)
    assert patient.returncode == 0, output
    assert "waiting for 'tpuctl up" in output
    assert "the run is done; nothing was done" in output  # it took over a finished run


def _up_of(project: Any, name: str, command: str, *, max_failures: int = 0) -> Path:
    """A spec of one v4-8 running `command`, its checkpoint dir under the test's tmp_path."""
    return project.write_spec(
        {
            "name": name,
            "tpu": {"accelerator": "v4-8", "runtime": "tpu-ubuntu2204-base"},
            "capacity": {"tier": "spot"},
            "checkpoint": {"dir": str(project.tmp_path / f"ckpt-{name}")},
            "job": {"command": command},
            "recovery": {"max_preemptions": 1, "max_failures": max_failures},
        }
    )


def _run_up(project: Any, spec: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuctl", "up", str(spec), *FAST_UP, *extra],
        env=project.child_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_short_job_with_side_effects_runs_once_under_up(project: Any) -> None:
    """The boot starts the job; it ends at once; up's delivery must not run it again."""
    counter = project.tmp_path / "counter"
    name = f"once-{project.name[-8:]}"
    spec = _up_of(project, name, f"echo ran >>{counter}")
    done = _run_up(project, spec)
    assert done.returncode == 0, done.stderr
    assert counter.read_text() == "ran\n", done.stderr
    assert not project.qr_exists(name)


def test_a_failing_job_s_last_lines_outlive_its_workers(project: Any) -> None:
    """up gives up on a job that fails (no budget left) and deletes its workers: their last
    log lines are in up's own output, in the journal and beside it, after the QR is gone."""
    name = f"fails-{project.name[-8:]}"
    spec = _up_of(
        project, name, "echo 'epoch 1: loss nan'; echo 'out of memory on HBM' >&2; exit 3"
    )
    done = _run_up(project, spec)
    assert done.returncode == 3, done.stderr
    assert "out of memory on HBM" in done.stderr, done.stderr
    assert "tpuctl report" in done.stderr
    assert not project.qr_exists(name)
    record = project.tmp_path / f"ckpt-{name}" / "tpuctl" / name
    kept = (record / "logs" / "0-0.log").read_text()
    assert "epoch 1: loss nan" in kept and "out of memory on HBM" in kept
    from tpuctl.spec.load import load_spec
    from tpuctl.storage.journal import Journal

    [logs] = Journal(load_spec(str(spec)).spec).entries(kind="job.logs")
    assert "out of memory on HBM" in logs.fields["tails"]["0/0"]


def test_a_preempted_job_that_just_exits_0_is_seen_to_its_end_and_deleted(
    make_job: Callable[..., Job],
) -> None:
    """A trainer with no conventions (no marker, no target step) preempted by a drill under
    up: up recovers it, sees it exit 0 undisturbed, deletes the QR and says so all along."""
    # Its checkpoints in the spec's checkpoint.dir: the drill sees its progress there.
    job = make_job(steps=240, slices=1, accelerator="v4-8", conventionless=True, elsewhere=False)
    job.start_up()
    job.wait_running()
    outcome = job.cli("drill", str(job.spec), "--kind", "preempt", "--external-recovery",
                      "--timeout", "120")  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    code, log = job.wait_up()
    assert code == 0, log
    assert "recovery 1 of" in log and "every worker of every slice exited 0" in log, log
    assert not job.qr_exists()
