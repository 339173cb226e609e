"""End to end: a run driven to its end by `tpuctl reconcile` steps alone, with no `up` alive, on
the emulator: from a plain shell loop through a spot preemption and a maintenance event; with
steps killed at every crash point in turn; with a third of the steps SIGKILLed at random and two
loops side by side. The trainer just exits 0 at its last step (no marker, no target step), and
its final state must be byte-identical to an uninterrupted run's."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Job
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

# Steps that react within a second or two on the sped-up emulator.
STEP_FLAGS = ("--settle", "2", "--no-preflight")
IN_PROGRESS, API_DOWN = 12, 11


def _reconcile(
    job: Job,
    *flags: str,
    kill_at: int | None = None,
    kill_new: Path | None = None,
    timeout: float = 120,
) -> int:
    """One `tpuctl reconcile` process; its exit code (-9 when a crash point killed it)."""
    environ = job.child_env()
    if kill_at is not None:
        environ["TPUCTL_TEST_KILL_AT"] = str(kill_at)
    if kill_new is not None:
        environ["TPUCTL_TEST_KILL_NEW"] = str(kill_new)
    done = subprocess.run(
        [sys.executable, "-m", "tpuctl", "reconcile", str(job.spec), *STEP_FLAGS, *flags],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode


def _workers_running_since(job: Job, boots: int) -> bool:
    """Every worker's state object says its trainer runs, in boot `boots` or later."""
    record = job.project.tmp_path / f"ckpt-{job.name}" / "tpuctl" / job.name / "workers"
    found = []
    for path in record.glob("*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            return False
    expected = job.slices * 2
    return len(found) == expected and all(
        state["state"] == "running" and state["boot"] >= boots for state in found
    )


def _qr_name(job: Job) -> str:
    return (
        f"projects/{job.env['TPUCTL_PROJECT']}/locations/us-central2-b/queuedResources/{job.name}"
    )


def _journal_has(job: Job, kind: str, count: int = 1) -> bool:
    return job.journal_kinds().count(kind) >= count


def _creates_and_deletes(emulator: Any, job: Job) -> list[str]:
    """The run's queued resource created and deleted, in the emulator's order."""
    name = _qr_name(job)
    return [
        event["kind"]
        for event in emulator.admin.events()
        if event.get("qr") == name and event["kind"] in ("qr.create", "qr.deleted")
    ]


def _never_two_at_once(order: list[str]) -> None:
    alive = 0
    for kind in order:
        alive += 1 if kind == "qr.create" else -1
        assert 0 <= alive <= 1, order


def _one_trainer_per_boot(job: Job, workers: int = 2) -> None:
    """No worker ever ran two trainers in one boot (read from the VMs a kept run left)."""
    seen = 0
    for slice_index in range(job.slices):
        for worker in range(workers):
            logs = job.vm_root(slice_index, worker) / "var/log/tpuctl" / job.name
            for boot_log in logs.glob("boot-*.log"):
                seen += 1
                assert boot_log.read_text(errors="replace").count("trainer started") <= 1, boot_log
    assert seen, "no boot log to look at"
    assert job.cli("delete", str(job.spec), "--force", "--yes").exit_code == 0


def test_a_shell_loop_of_reconcile_steps_sees_a_run_through_preemption_and_maintenance(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = make_job(steps=300, slices=2, conventionless=True, checkpoint_every=10)
    loop = subprocess.Popen(
        [
            "bash",
            "-c",
            'while :; do "$@"; rc=$?; [ $rc = 12 ] || [ $rc = 11 ] || exit $rc; sleep 2; done',
            "loop",
            sys.executable, "-m", "tpuctl", "reconcile", str(job.spec), *STEP_FLAGS,
        ],
        env=job.child_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "loop.log").open("w"),
    )  # fmt: skip
    try:
        wait_for(lambda: _journal_has(job, "job.running"), 90, "the job to run")
        emulator.admin.preempt(_qr_name(job))
        wait_for(lambda: _journal_has(job, "job.started", 2), 90, "the job to start again")
        # Running again on the new VMs (their state objects say so): now a maintenance event.
        wait_for(lambda: _workers_running_since(job, 1), 60, "the workers to run it")
        node = _qr_name(job).replace("queuedResources", "nodes") + "-0"
        emulator.admin.maintenance(node)
        assert loop.wait(timeout=180) == 0, (tmp_path / "loop.log").read_text()
    finally:
        if loop.poll() is None:
            loop.kill()
    kinds = job.journal_kinds()
    assert kinds.count("qr.recreated") == 1 and kinds.count("preemption.detected") == 1
    assert "job.failed" not in kinds and kinds[-1] == "run.done"
    # The maintenance rebooted the new workers and their startup script relaunched the trainer:
    # the job ended in their second boot.
    [done] = [entry for entry in job.journal() if entry.kind == "job.done"]
    assert "exited 0 in boot 2 " in done.fields["message"], done.fields
    assert not job.qr_exists()
    order = _creates_and_deletes(emulator, job)
    assert order.count("qr.create") == 2, order
    _never_two_at_once(order)
    assert (job.checkpoint_dir / "final.json").read_bytes() == job.uninterrupted_final(tmp_path)
    # The steps read every worker from its state object, not over SSH, once there were ones.
    states = list((job.project.tmp_path / f"ckpt-{job.name}" / "tpuctl" / job.name / "workers")
                  .glob("*.json"))  # fmt: skip
    assert len(states) == 4


def test_a_step_killed_between_any_two_of_its_actions_is_finished_by_the_next(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    """Step processes are killed before side effects they have not been killed at yet (a
    create sent but not journaled, a job started but not recorded, a delete sent…), each kind
    once, in the order the run reaches them: the next step, a new process, converges every
    time, and the run ends as an uninterrupted one would. (The in-process test in
    tests/jobs/test_reconcile_up.py kills a run at every one of its points, one run each.)"""
    job = make_job(steps=100, slices=1, accelerator="v4-8", conventionless=True)
    tried = tmp_path / "killed-at"
    code, steps, killed = IN_PROGRESS, 0, 0
    while code in (IN_PROGRESS, API_DOWN, -9):
        steps += 1
        assert steps < 200, tried.read_text()
        code = _reconcile(job, "--keep", kill_new=tried)
        killed += code == -9
        if code == IN_PROGRESS:
            time.sleep(2)  # as a scheduler would call it: not back to back
    assert code == 0, job.journal_kinds()
    points = tried.read_text().splitlines()
    for point in ("create us-central2-b", "journal qr.created", "start the job",
                  "journal job.started", "write the done marker", "journal job.done",
                  "journal qr.kept", "journal run.done"):  # fmt: skip
        assert point in points, points
    assert killed == len(points)
    order = _creates_and_deletes(emulator, job)
    assert order == ["qr.create"], order  # kept (--keep), to read its VMs' boot logs
    _one_trainer_per_boot(job, workers=1)
    assert (job.checkpoint_dir / "final.json").read_bytes() == job.uninterrupted_final(tmp_path)


def test_two_loops_with_a_third_of_their_steps_killed_see_a_preempted_run_through(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = make_job(steps=300, slices=2, conventionless=True, checkpoint_every=10)
    ended: list[int] = []
    lock = threading.Lock()

    def loop(seed: int) -> None:
        chance = random.Random(seed)
        while True:
            with lock:
                if ended:
                    return
            kill_at = chance.randint(1, 12) if chance.random() < 1 / 3 else None
            code = _reconcile(job, "--keep", kill_at=kill_at)
            if code not in (IN_PROGRESS, API_DOWN, -9):
                with lock:
                    ended.append(code)
                return
            if code != -9:
                time.sleep(2)  # as a scheduler would call it: not back to back

    loops = [threading.Thread(target=loop, args=(seed,)) for seed in (1, 2)]
    for thread in loops:
        thread.start()
    try:
        wait_for(lambda: _journal_has(job, "job.running") or ended, 120, "the job to run")
        emulator.admin.preempt(_qr_name(job))
    finally:
        for thread in loops:
            thread.join(timeout=240)
    assert ended and ended[0] == 0, (ended, job.journal_kinds())
    order = _creates_and_deletes(emulator, job)
    assert order == ["qr.create", "qr.deleted", "qr.create"], order  # the last one kept
    _one_trainer_per_boot(job)
    kinds = job.journal_kinds()
    # A step killed after its create was sent and before it said so leaves no qr.recreated:
    # the emulator's two creates above are the truth.
    assert kinds.count("preemption.detected") == 1 and kinds.count("qr.recreated") <= 1
    assert (job.checkpoint_dir / "final.json").read_bytes() == job.uninterrupted_final(tmp_path)


def test_a_step_on_a_held_run_does_nothing_and_says_who_holds_it(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(steps=400, slices=1, accelerator="v4-8")
    job.start_up()
    job.wait_running()
    outcome = job.cli("reconcile", str(job.spec), "--format", "json", *STEP_FLAGS)
    assert outcome.exit_code == IN_PROGRESS, outcome.stderr
    document = outcome.json()
    assert document["kind"] == "Reconcile" and document["outcome"] == "in_progress"
    assert "tpuctl up" in document["held_by"] and document["written"] == []
    assert job.up_process is not None
    job.up_process.terminate()
    job.wait_up()


def test_the_record_says_what_a_step_decided(make_job: Callable[..., Job]) -> None:
    job = make_job(steps=40, slices=1, accelerator="v4-8")
    outcome = job.cli("reconcile", str(job.spec), "--format", "json", *STEP_FLAGS)
    assert outcome.exit_code == IN_PROGRESS, outcome.stderr
    document = outcome.json()
    assert document["action"] == "create" and document["code"] == IN_PROGRESS
    assert [entry["kind"] for entry in document["written"]][:2] == ["run.start", "qr.created"]
    record = job.project.tmp_path / f"ckpt-{job.name}" / "tpuctl" / job.name
    beat = json.loads((record / "supervisor.json").read_text())
    assert beat["action"] == "create" and beat["outcome"] == "in_progress"
    while outcome.exit_code in (IN_PROGRESS, API_DOWN):
        outcome = job.cli("reconcile", str(job.spec), "--format", "json", *STEP_FLAGS)
    assert outcome.exit_code == 0 and outcome.json()["outcome"] == "done"
    again = job.cli("reconcile", str(job.spec), "--format", "json", *STEP_FLAGS)
    assert again.exit_code == 0 and again.json()["action"] == "nothing"
