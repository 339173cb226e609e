"""The startup-script job on emulated workers: real SSH, real processes, real signals.

QRs are created from specs through the real client; the emulator boots every worker and runs
the rendered startup script as the guest agent would; tpuctl.jobs.control delivers the code and
reads, stops and restarts the job over SSH.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cli.test_output_contract import EXAMPLES, assert_same_shape, check
from tests.harness import Project
from tests.jobs.conftest import JobQR
from tests.support import wait_for
from tpuctl.jobs import control as jobs

REPO = Path(__file__).resolve().parents[2]
TOY_TRAIN = REPO / "scripts" / "toy_train.py"
PYTHON = shlex.quote(sys.executable)

MakeQR = Callable[..., JobQR]


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_delivered_job_runs_once_everywhere_resumes_and_stays_done(
    make_job_qr: MakeQR,
) -> None:
    qr = make_job_qr(
        {
            "framework": "orbax",
            "code": str(TOY_TRAIN),
            "command": f"{PYTHON} toy_train.py --steps 3000 --step-seconds 0.02 "
            "--checkpoint-every 5",
            "setup": ['env | grep -E "^(TPUCTL|MEGASCALE)_" | sort >"$HOME/job-env"'],
        },
        accelerator="v4-16",
        slices=2,
        checkpoint={"autocheckpoint": True},
    )
    assert len(qr.fleet.targets) == 4
    # The first boot finds no code yet: nothing is launched until tpuctl uploads it.
    qr.wait_states("waiting-for-code", boot=1)

    result = jobs.deliver_and_start(qr.fleet, qr.spec)
    assert result.exit_code == 0, [w.to_dict() for w in result]
    digest = hashlib.sha256(jobs.pack_code(TOY_TRAIN)).hexdigest()
    assert (
        result.transfer is not None and result.transfer.sha256 == digest
    )  # a file packs to the same bytes every time
    for worker in result:
        assert worker.detail is not None
        assert worker.detail.uploaded == digest and worker.detail.startup == "started"
    for s, w in qr.labels():
        workdir = qr.job_home(s, w) / "job"
        assert (workdir / "toy_train.py").read_bytes() == TOY_TRAIN.read_bytes()
        assert (workdir / ".tpuctl-uploaded").exists()

    # Launched on every worker, in the same boot (tpuctl's rerun is not a new boot).
    qr.wait_states("running", boot=1)

    # The status file says running as the trainer starts; under load its process group may
    # take a moment more to exist, which is what trainer_alive checks.
    def all_alive() -> list[jobs.WorkerJobStatus] | None:
        statuses = qr.statuses()
        return statuses if all(s.trainer_alive and s.pid for s in statuses) else None

    first = wait_for(all_alive, 20, "every trainer's process group")
    assert len(first) == 4 and all(s.state == "running" and s.boot == 1 for s in first)
    assert all(s.heartbeat_age_s is not None and s.heartbeat_age_s < 30 for s in first)
    marker = qr.checkpoint_dir / "tpuctl" / qr.run_name / "DONE"
    coordinators: set[str] = set()
    for s, w in qr.labels():
        env = _env_file(qr.job_home(s, w) / "job-env")
        assert env["TPUCTL_WORKER_ID"] == str(w) and env["TPUCTL_SLICE_ID"] == str(s)
        assert env["TPUCTL_PROCESS_ID"] == str(w + 2 * s) and env["TPUCTL_NUM_PROCESSES"] == "4"
        assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == str(s)
        coordinators.add(env["MEGASCALE_COORDINATOR_ADDRESS"])
        assert env["TPUCTL_AUTOCHECKPOINT"] == "1" and env["TPUCTL_BOOT"] == "1"
        assert env["TPUCTL_DONE_MARKER"] == str(marker)
        assert env["TPUCTL_CHECKPOINT_DIR"] == str(qr.checkpoint_dir)
    assert len(coordinators) == 1 and "" not in coordinators  # one coordinator for all slices

    # Running the startup script again while the trainer runs starts no second trainer.
    again = jobs.deliver_and_start(qr.fleet, qr.spec)
    assert again.exit_code == 0
    for s, w in qr.labels():
        rerun_log = qr.vm_root(s, w) / "var/log/tpuctl" / qr.run_name / "startup-rerun.log"
        wait_for(
            lambda path=rerun_log: "nothing to do" in path.read_text() if path.exists() else False,
            15,
            "the rerun to find the lock held",
        )
        assert qr.boot_log(s, w, 1).count("trainer started") == 1
    assert [s.pid for s in qr.statuses()] == [s.pid for s in first]

    # A committed checkpoint, then a reset: boot 2 relaunches and resumes from it.
    wait_for(lambda: any(p.name.isdigit() for p in qr.checkpoint_dir.iterdir()), 20, "a save")
    qr.api.reset_queued_resource(qr.name)
    second = qr.wait_states("running", boot=2)
    assert not any(_pid_alive(s.pid) for s in first if s.pid)
    assert {s.pid for s in second}.isdisjoint({s.pid for s in first})
    # Every trainer past its start-up (its SIGTERM handler installed) before stopping them all.
    for s, w in qr.labels():
        wait_for(lambda s=s, w=w: "resumed from step" in qr.boot_log(s, w, 2), 15, "the resume")

    # Stopped (no marker): the job exited, and restart_job relaunches it in the same boot.
    stopped = jobs.stop_job(qr.fleet, qr.spec, grace=10)
    assert stopped.exit_code == 0
    assert {w.detail.state for w in stopped if w.detail} == {"stopped"}
    exited = qr.wait_states("exited", boot=2)
    assert not any(s.trainer_alive for s in exited)
    assert {s.exit_code for s in exited} == {0}  # toy_train saves on SIGTERM and exits 0
    restarted = jobs.restart_job(qr.fleet, qr.spec, grace=5)
    assert restarted.exit_code == 0, [w.to_dict() for w in restarted]
    qr.wait_states("running", boot=2)
    wait_for(lambda: qr.boot_log(0, 0, 2).count("resumed from step") == 2, 15, "a 2nd resume")

    # Finished for good: with the done marker in the shared checkpoint dir, nothing relaunches.
    jobs.stop_job(qr.fleet, qr.spec, grace=10)
    qr.wait_states("exited")
    marker.write_text("finished\n")
    qr.api.reset_queued_resource(qr.name)
    done = qr.wait_states("done", boot=3)
    assert not any(s.trainer_alive for s in done)
    for s, w in qr.labels():
        log = qr.boot_log(s, w, 3)
        assert "not relaunching" in log and "trainer started" not in log


def test_target_step_writes_the_done_marker(make_job_qr: MakeQR) -> None:
    qr = make_job_qr(
        {
            "framework": "orbax",
            "code": str(TOY_TRAIN),
            # The trainer writes no marker itself: only target_step can finish this job.
            "command": f"{PYTHON} toy_train.py --steps 12 --step-seconds 0.01 "
            "--checkpoint-every 4 --done-marker ''",
            "target_step": 12,
        }
    )
    assert jobs.deliver_and_start(qr.fleet, qr.spec).exit_code == 0
    [status] = qr.wait_states("done", boot=1)
    assert status.exit_code == 0
    marker = qr.checkpoint_dir / "tpuctl" / qr.run_name / "DONE"
    assert marker.read_text().startswith("committed step 12 >= target_step 12")
    qr.api.reset_queued_resource(qr.name)
    qr.wait_states("done", boot=2)
    assert "trainer started" not in qr.boot_log(0, 0, 2)


# The trainer under test. Its sleeps are its own work (a save that takes a while, a training
# step), not the test's synchronisation: the test waits for the files it writes.
TRAINER_TRAPPING_TERM = """\
import os, signal, sys, time
home, boot = os.environ["HOME"], os.environ["TPUCTL_BOOT"]
def on_term(*_):
    time.sleep(0.3)  # the autocheckpoint save
    with open(os.path.join(home, "term-" + boot), "w") as out:
        out.write(str(os.getpid()))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(home, "started-" + boot), "w") as out:
    out.write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def test_maintenance_with_autocheckpoint_saves_and_relaunches(
    make_job_qr: MakeQR, tmp_path: Path
) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER_TRAPPING_TERM)
    qr = make_job_qr(
        {"framework": "orbax", "code": str(trainer), "command": f"{PYTHON} trainer.py"},
        checkpoint={"autocheckpoint": True},
    )
    assert jobs.deliver_and_start(qr.fleet, qr.spec).exit_code == 0
    [running] = qr.wait_states("running", boot=1)
    home = qr.job_home(0, 0)
    wait_for((home / "started-1").exists, 10, "the trainer to start")
    node = qr.api.location.node_name(qr.node_ids[0])
    qr.api.client.simulate_maintenance_event(request={"name": node, "worker_ids": ["0"]})
    qr.wait_states("running", boot=2)
    # The trainer got SIGTERM and its grace (the save finished), through the supervisor,
    # which recorded the exit; after the reboot the job runs again from the uploaded code.
    assert (home / "term-1").read_text() == str(running.pid)
    log = qr.boot_log(0, 0, 1)
    assert "forwarding SIGTERM to the trainer" in log
    assert "trainer exited with 0" in log
    assert log.index("forwarding SIGTERM") < log.index("trainer exited with 0")
    wait_for((home / "started-2").exists, 10, "the relaunch")


TRICKY_ENV = {
    "QUOTES": "it's \"double\" and 'single'",
    "SPACES": "  two  spaces  ",
    "DOLLARS": "$HOME ${PATH} $(echo pwned) `echo pwned`",
    "NEWLINES": "line one\nline two\n",
    "UNICODE": "ünïcødé ✓ 日本",
    "BACKSLASH": "a\\b\\\\c",
}
# The spec expands ${VAR} from the local environment; $${ is how a spec says a literal ${.
SPEC_ENV = {key: value.replace("${", "$${") for key, value in TRICKY_ENV.items()}
DUMP_ENV = (
    "import json, os; json.dump(dict(os.environ), open(os.environ['HOME'] + '/env.json', 'w'))"
)


def test_env_quoting_stale_tpu_holder_and_rerun_only_when_stopped(
    make_job_qr: MakeQR,
) -> None:
    command = (
        'if test -e "$TPUCTL_VM_ROOT/tmp/libtpu_lockfile"; then echo present; else echo gone; '
        f'fi >>"$HOME/lockfile"; {PYTHON} -c {shlex.quote(DUMP_ENV)}; exec sleep 60'
    )
    # No job.code: the first boot launches the job at once.
    qr = make_job_qr({"command": command, "env": SPEC_ENV})
    [running] = qr.wait_states("running", boot=1)
    home = qr.job_home(0, 0)
    env_file = home / "env.json"
    wait_for(env_file.exists, 10, "the environment dump")
    environment = wait_for(lambda: _json_or_none(env_file), 10, "a complete dump")
    for key, value in TRICKY_ENV.items():
        assert environment[key] == value, key

    # Running: deliver_and_start (no local code) leaves it alone.
    skipped = jobs.deliver_and_start(qr.fleet, qr.spec)
    assert [w.detail.startup for w in skipped if w.detail] == ["skipped"]
    assert qr.statuses()[0].pid == running.pid

    stopped = jobs.stop_job(qr.fleet, qr.spec, grace=5)
    assert [w.detail.signal for w in stopped if w.detail] == ["TERM"]
    qr.wait_states("exited")
    # A stale process still holding the TPU, and libtpu's lockfile left behind.
    vm = qr.vm_root(0, 0)
    lockfile = vm / "tmp" / "libtpu_lockfile"
    lockfile.write_text("stale")
    device = vm / "dev" / "accel0"
    holder = subprocess.Popen(
        ["bash", "-c", 'exec 3<"$1"; exec sleep 120', "holder", str(device)],
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: any(
                os.path.realpath(f"/proc/{holder.pid}/fd/{fd}") == str(device)
                for fd in os.listdir(f"/proc/{holder.pid}/fd")
            ),
            5,
            "the holder to open the device",
        )
        started = jobs.deliver_and_start(qr.fleet, qr.spec)
        assert [w.detail.startup for w in started if w.detail] == ["started"]
        assert holder.wait(timeout=15) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    qr.wait_states("running", boot=1)
    wait_for(lambda: (home / "lockfile").read_text().count("\n") == 2, 10, "the relaunch")
    assert (home / "lockfile").read_text().splitlines() == ["gone", "gone"]
    assert not lockfile.exists()


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_setup_failure_is_reported_by_status_and_ps(make_job_qr: MakeQR, project: Project) -> None:
    qr = make_job_qr({"command": "true", "setup": ["echo preparing", "exit 7"]})
    [status] = qr.wait_states("setup-failed", boot=1)
    assert status.reason == "setup command 2 exited with 7"
    assert status.pid is None and not status.trainer_alive and status.reachable

    tpuctl = project
    out = tpuctl("status", str(qr.spec_path), "--jobs", "--format", "json")
    assert out.exit_code == 0, out.stderr
    check(out.json(), "status", "status --jobs")
    documented = EXAMPLES["ps --job"]["workers"][0]["detail"]
    assert_same_shape(out.json()["jobs"][0], documented, "status --jobs: jobs[0]")
    [job] = out.json()["jobs"]
    assert (job["state"], job["boot"], job["reason"]) == (
        "setup-failed",
        1,
        "setup command 2 exited with 7",
    )
    wide = {"COLUMNS": "200"}
    table = tpuctl("status", str(qr.spec_path), "--jobs", env=wide)
    assert table.exit_code == 0 and "setup-failed" in table.stdout

    # A NAME only: the run name comes from the nodes' tpuctl-run label.
    ps = tpuctl("ps", qr.name, "--job", "--format", "json")
    assert ps.exit_code == 0, ps.stderr
    check(ps.json(), "ps --job")
    [worker] = ps.json()["workers"]
    assert worker["detail"]["state"] == "setup-failed"
    assert ps.json()["run"] == qr.run_name
    human = tpuctl("ps", qr.name, "--job", env=wide)
    assert "setup-failed" in human.stdout


def test_a_job_that_ended_is_not_launched_again_in_the_same_boot(make_job_qr: MakeQR) -> None:
    """A short job with a side effect (one line appended per run) ends in boot 1; delivering
    it again (as `up` does) reruns the startup script, which must not run the job twice. A
    restart does run it again, as asked."""
    command = 'echo ran >>"$HOME/counter"'
    qr = make_job_qr({"command": command})
    counter = qr.job_home(0, 0) / "counter"
    qr.wait_states("exited", boot=1)
    assert counter.read_text() == "ran\n"

    rerun_log = qr.vm_root(0, 0) / "var/log/tpuctl" / qr.run_name / "startup-rerun.log"
    for delivery in (1, 2):  # one after the other: a rerun that overlaps the last finds its lock
        again = jobs.deliver_and_start(qr.fleet, qr.spec)
        assert again.exit_code == 0, [w.to_dict() for w in again]
        wait_for(
            lambda n=delivery: (
                rerun_log.exists() and rerun_log.read_text().count("not launching it again") == n
            ),
            30,
            f"rerun {delivery} to decide",
        )
    [status] = qr.statuses()
    assert (status.state, status.boot, status.exit_code) == ("exited", 1, 0)
    assert counter.read_text() == "ran\n"

    jobs.restart_job(qr.fleet, qr.spec)
    wait_for(lambda: counter.read_text() == "ran\nran\n", 30, "the restart to run it again")
