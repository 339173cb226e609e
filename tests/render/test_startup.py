"""The startup script end to end under real bash, against a fake metadata server."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for, wait_for_bytes
from tpuctl.errors import SpecError
from tpuctl.render.startup import render_startup_script
from tpuctl.worker import CODE_READY_MARKER, LOG_ROOT, STATE_ROOT

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
# A job that runs until the test creates $HOME/release: the test, not a sleep, decides when
# training ends. Bounded (~30 s) so that a failed test leaves nothing running for long.
UNTIL_RELEASED = 'for _ in $(seq 600); do test -e "$HOME/release" && break; sleep 0.05; done'


def release(worker: Any) -> None:
    """Let an UNTIL_RELEASED job finish."""
    (worker.root / "home/tpuctl/release").touch()


def holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open."""
    target = os.path.realpath(path)
    try:
        return any(os.readlink(fd.path) == target for fd in os.scandir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def supervisor_pid(result: subprocess.CompletedProcess[str]) -> int:
    match = re.search(r"supervisor started as pid (\d+)", result.stderr)
    assert match, result.stderr
    return int(match.group(1))


def test_first_run_launches_once_with_identity(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    spec = job_spec(
        'echo started >>"$HOME/runs"; env | grep -E "^(TPUCTL|MEGASCALE)_" | sort >"$HOME/env";'
        f' pwd >"$HOME/pwd"; {UNTIL_RELEASED}',
        checkpoint_dir="~/ckpt",
    )
    worker = make_worker("demo")
    before = int(time.time())
    result = worker.run(render_startup_script(spec))
    assert result.returncode == 0, result.stderr
    # The guest agent waits for the script: it returned while training goes on (the job
    # cannot end before the release below).
    running = worker.wait_for_state("running")
    assert running["boot"] == "1" and running["pid"].isdigit()
    assert RFC3339.fullmatch(running["started"])
    release(worker)
    status = worker.wait_for_state("exited")
    assert status["exit_code"] == "0"
    # The heartbeat is the Unix time of a write made during this run.
    assert before <= int(status["heartbeat"]) <= int(time.time())

    home = worker.root / "home/tpuctl"
    assert (home / "runs").read_text() == "started\n"
    assert (home / "pwd").read_text() == f"{home}/job\n"
    env = dict(line.split("=", 1) for line in (home / "env").read_text().splitlines())
    assert env["TPUCTL_WORKER_ID"] == "1"
    assert env["TPUCTL_SLICE_ID"] == "1"
    assert env["TPUCTL_NUM_SLICES"] == "2"
    # Across slices the coordinator is slice 0's worker 0, named by MEGASCALE_COORDINATOR_ADDRESS.
    assert env["TPUCTL_COORDINATOR_ADDRESS"] == "10.0.0.2:8476"
    assert env["TPUCTL_PROCESS_ID"] == "3" and env["TPUCTL_NUM_PROCESSES"] == "4"
    assert env["TPUCTL_RUN_NAME"] == "demo"
    assert env["TPUCTL_CHECKPOINT_DIR"] == f"{home}/ckpt"
    # With checkpoint.dir the marker lives beside the checkpoints (<dir>/tpuctl/<run>/DONE).
    assert env["TPUCTL_DONE_MARKER"] == f"{home}/ckpt/tpuctl/demo/DONE"
    assert env["TPUCTL_AUTOCHECKPOINT"] == "0"
    assert "TPUCTL_TARGET_STEP" not in env
    assert env["MEGASCALE_SLICE_ID"] == "1" and env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.2:8080"
    log = (worker.log_dir / "boot-1.log").read_text()
    assert "trainer exited with 0" in log
    assert (worker.log_dir / "current.log").resolve() == worker.log_dir / "boot-1.log"


def test_single_slice_coordinator_is_first_endpoint(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    metadata_server: Any,
) -> None:
    metadata_server.attributes = {
        "agent-worker-number": "0",
        "tpu-env": "NODE_ID: 'solo'\nWORKER_ID: '0'\n",
        "worker-network-endpoints": "unknown:unknown:10.9.0.7,unknown:unknown:10.9.0.8",
    }
    spec = job_spec(
        'env | grep ^TPUCTL_ >"$HOME/env"; env | grep -c ^MEGASCALE_ >"$HOME/m"', slices=1
    )
    worker = make_worker("demo")
    assert worker.run(render_startup_script(spec)).returncode == 0
    worker.wait_for_state("exited")
    home = worker.root / "home/tpuctl"
    env = dict(line.split("=", 1) for line in (home / "env").read_text().splitlines())
    assert env["TPUCTL_COORDINATOR_ADDRESS"] == "10.9.0.7:8476"
    assert env["TPUCTL_NUM_SLICES"] == "1" and env["TPUCTL_WORKER_ID"] == "0"
    assert (home / "m").read_text() == "0\n"


def test_concurrent_second_run_does_not_start_a_second_trainer(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    spec = job_spec(f'echo started >>"$HOME/runs"; {UNTIL_RELEASED}')
    worker = make_worker("demo")
    script = render_startup_script(spec)
    assert worker.run(script).returncode == 0
    worker.wait_for_state("running")
    second = worker.run(script)  # the first trainer still runs: it waits for the release
    assert second.returncode == 0
    assert "nothing to do" in second.stderr
    release(worker)
    worker.wait_for_state("exited")
    assert (worker.root / "home/tpuctl/runs").read_text() == "started\n"
    assert worker.status()["boot"] == "1"


def test_exit_code_never_means_done_but_the_marker_does(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    # Exits 0 without the marker (MaxText after an on-demand save): the next boot relaunches.
    spec = job_spec(
        'echo run >>"$HOME/runs"; if [ "$TPUCTL_BOOT" = 2 ]; then touch "$TPUCTL_DONE_MARKER"; fi'
    )
    worker = make_worker("demo")
    script = render_startup_script(spec)
    worker.run(script)
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    worker.run(script)
    status = worker.wait_for_state("done")
    assert status["boot"] == "2"
    third = worker.run(script)
    assert "done marker" in third.stderr
    assert worker.status()["state"] == "done" and worker.status()["boot"] == "3"
    assert (worker.root / "home/tpuctl/runs").read_text() == "run\nrun\n"
    assert not (worker.log_dir / "boot-3.log").read_text().count("trainer started")


def test_stale_tpu_holders_killed_and_lockfile_removed(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    _reap_trainers: list[int],
) -> None:
    worker = make_worker("demo")
    (worker.root / "dev/vfio").mkdir(parents=True)
    device = worker.root / "dev/accel0"
    device.touch()
    (worker.root / "tmp").mkdir()
    lockfile = worker.root / "tmp/libtpu_lockfile"
    lockfile.write_text("stale")
    # A leftover trainer from a previous boot, still holding the device open.
    holder = subprocess.Popen(
        ["bash", "-c", 'exec 3<"$1"; exec sleep 60', "holder", str(device)],
        start_new_session=True,
    )
    _reap_trainers.append(holder.pid)
    wait_for(lambda: holds_open(holder.pid, device), 10, "the holder to open the device")
    spec = job_spec(
        'if test -e "$TPUCTL_VM_ROOT/tmp/libtpu_lockfile"; then echo present; else echo gone; fi'
        ' >"$HOME/l"'
    )
    assert worker.run(render_startup_script(spec)).returncode == 0
    worker.wait_for_state("exited")
    assert holder.wait(timeout=5) == -signal.SIGKILL
    assert not lockfile.exists()
    assert (worker.root / "home/tpuctl/l").read_text() == "gone\n"


def test_setup_failure_is_recorded_and_stops_the_launch(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    spec = job_spec(
        'echo started >>"$HOME/runs"',
        setup=('echo one >>"$HOME/setup"', "echo two; exit 3", 'echo three >>"$HOME/setup"'),
    )
    worker = make_worker("demo")
    result = worker.run(render_startup_script(spec))
    assert result.returncode == 1
    status = worker.status()
    assert status["state"] == "setup-failed"
    assert status["reason"] == "setup command 2 exited with 3"
    home = worker.root / "home/tpuctl"
    assert (home / "setup").read_text() == "one\n"
    assert not (home / "runs").exists()
    assert "two\n" in (worker.log_dir / "boot-1.log").read_text()


def test_unreachable_metadata_is_a_setup_failure(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    metadata_server: Any,
) -> None:
    metadata_server.attributes = {}
    worker = make_worker("demo")
    result = worker.run(render_startup_script(job_spec("true")))
    assert result.returncode == 1
    assert worker.status()["state"] == "setup-failed"
    assert "agent-worker-number" in worker.status()["reason"]


def test_sigterm_is_forwarded_and_the_trainer_gets_its_grace(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    _reap_trainers: list[int],
) -> None:
    trainer = (
        "import os, signal, sys, time\n"
        "home = os.environ['HOME']\n"
        "def on_term(*_):\n"
        "    time.sleep(0.5)  # a checkpoint save\n"
        "    open(home + '/saved', 'w').write('saved')\n"
        "    sys.exit(42)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open(home + '/ids', 'w').write(f'{os.getpid()} {os.getpgid(0)} {os.getsid(0)}')\n"
        "time.sleep(30)\n"
    )
    spec = job_spec(f"exec {sys.executable} -c {_sh_quote(trainer)}")
    worker = make_worker("demo")
    result = worker.run(render_startup_script(spec))
    status = worker.wait_for_state("running")
    trainer_pid = int(status["pid"])
    _reap_trainers.append(trainer_pid)
    ids = worker.root / "home/tpuctl/ids"
    pid, group, session = (
        int(word) for word in wait_for_bytes(ids, 10, "the trainer to start").split()
    )
    # Its own session and process group, so the whole group can be signalled.
    assert pid == group == session == trainer_pid
    os.kill(supervisor_pid(result), signal.SIGTERM)
    status = worker.wait_for_state("exited")
    assert status["exit_code"] == "42"
    assert status["reason"] == "forwarded SIGTERM"
    assert (worker.root / "home/tpuctl/saved").read_text() == "saved"


def test_heartbeat_advances_while_running(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    worker = make_worker("demo")
    worker.run(render_startup_script(job_spec(UNTIL_RELEASED)))
    first = worker.wait_for_state("running")

    def advanced() -> dict[str, str] | None:
        later = worker.current_status()
        return later if int(later.get("heartbeat", 0)) > int(first["heartbeat"]) else None

    # The job runs until released, so any newer heartbeat was written while it ran.
    later = wait_for(advanced, 10, "a newer heartbeat")
    assert later["state"] == "running" and later["pid"] == first["pid"]
    release(worker)
    assert worker.wait_for_state("exited")["exit_code"] == "0"


def test_the_last_status_is_the_supervisors_even_when_a_heartbeat_write_is_under_way(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], tmp_path: Path
) -> None:
    # An `mv` that takes half a second to put a status saying "running" in place: the job
    # ends while the heartbeat (every 0.05 s) is almost always inside one. Killed there, the
    # heartbeat's rename would land after the supervisor's last write.
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "mv").write_text(
        "#!/bin/sh\n"
        'if grep -q "^state=running" "$2" 2>/dev/null; then sleep 0.5; fi\n'
        f'exec {shutil.which("mv")} "$@"\n'
    )
    (slow / "mv").chmod(0o755)
    worker = make_worker("demo")
    worker.environment.update(PATH=f"{slow}:{os.environ['PATH']}", TPUCTL_HEARTBEAT_SECONDS="0.05")
    worker.run(render_startup_script(job_spec("sleep 1")))
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    time.sleep(1.5)  # three times what a late rename would take
    assert worker.status()["state"] == "exited"


def test_a_spec_without_a_job_has_no_startup_script(job_spec: Callable[..., Any]) -> None:
    spec = job_spec("true")
    with pytest.raises(SpecError):
        render_startup_script(replace(spec, job=None))


def test_invalid_env_name_and_nul_are_spec_errors(job_spec: Callable[..., Any]) -> None:
    with pytest.raises(SpecError) as caught:
        render_startup_script(job_spec("true", env={"1BAD": "x"}))
    assert caught.value.path == "job.env.1BAD"
    with pytest.raises(SpecError) as caught:
        render_startup_script(job_spec("echo \0"))
    assert caught.value.path == "job.command"


def test_preset_flags_reach_the_command(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    spec = job_spec(
        'printf \'%s\\n\' "$@" >"$HOME/argv"; true',
        framework="maxtext",
        checkpoint_dir="~/out dir",
        autocheckpoint=True,
    )
    # bash -c 'cmd' appends to the end of the command: make the printf take them as "$@".
    spec = _with_command(spec, 'f() { printf \'%s\\n\' "$@" >"$HOME/argv"; }; f')
    worker = make_worker("demo")
    worker.run(render_startup_script(spec))
    worker.wait_for_state("exited")
    home = worker.root / "home/tpuctl"
    assert (home / "argv").read_text().splitlines() == [
        "run_name=demo",
        f"base_output_directory={home}/out dir",
        "enable_checkpointing=true",
        "async_checkpointing=true",
        "enable_autocheckpoint=true",
    ]


def _with_command(spec: Any, command: str) -> Any:
    return replace(spec, job=replace(spec.job, command=command))


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_local_code_waits_for_the_upload_then_runs(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any]
) -> None:
    spec = job_spec("./run.sh")
    spec = replace(spec, job=replace(spec.job, code="./src"))
    worker = make_worker("demo")
    script = render_startup_script(spec)
    assert worker.run(script).returncode == 0
    status = worker.status()
    assert status["state"] == "waiting-for-code"
    # What tpuctl's upload does: the files, the marker last, then the script again.
    workdir = worker.root / "home/tpuctl/job"
    (workdir / "run.sh").write_text('#!/bin/sh\necho ran >"$HOME/ran"\n')
    (workdir / "run.sh").chmod(0o755)
    (workdir / CODE_READY_MARKER).touch()
    assert worker.run(script).returncode == 0
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert (worker.root / "home/tpuctl/ran").read_text() == "ran\n"


def test_code_archive_is_fetched_and_unpacked(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.sh").write_text('echo "trained $1" >"$HOME/out"\n')
    archive = tmp_path / "code.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "train.sh", arcname="train.sh")
    # A stand-in gcloud on PATH: `gcloud storage cp -- gs://… DEST` copies the local archive.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(
        f'#!/bin/sh\necho "gcloud $*" >>{tmp_path}/gcloud.calls\nexec cp {archive} "$5"\n'
    )
    (bin_dir / "gcloud").chmod(0o755)
    spec = job_spec("bash train.sh 7")
    spec = replace(spec, job=replace(spec.job, code="gs://bucket/code.tar.gz"))
    worker = make_worker("demo")
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    try:
        assert worker.run(render_startup_script(spec)).returncode == 0
    finally:
        os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert (worker.root / "home/tpuctl/out").read_text() == "trained 7\n"
    calls = (tmp_path / "gcloud.calls").read_text()
    assert calls.startswith("gcloud storage cp -- gs://bucket/code.tar.gz ")


def test_worker_paths_match_the_constants(job_spec: Callable[..., Any]) -> None:
    script = render_startup_script(job_spec("true"))
    assert f"STATE_ROOT='{STATE_ROOT}'\n" in script
    assert f"LOG_ROOT='{LOG_ROOT}'\n" in script
    assert f"CODE_READY_MARKER='{CODE_READY_MARKER}'\n" in script
    assert 'TPUCTL_DIR="$VM_ROOT$STATE_ROOT"' in script
    assert 'LOG_DIR="$VM_ROOT$LOG_ROOT/$RUN_NAME"' in script


def _can_isolate_a_real_vm() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("useradd"):
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


# The real-VM path (no TPUCTL_VM_ROOT): create the user, drop to it with setpriv, group-writable
# state dir. Run in a private mount namespace over copies of /etc and empty /home, /var/lib and
# /var/log, so this machine's users and directories are never touched.
REAL_VM_HARNESS = r"""
set -e
work=$1 script=$2
mkdir -p "$work/etc" "$work/home" "$work/varlib" "$work/varlog"
cp -a /etc/. "$work/etc/"
mount --bind "$work/etc" /etc
mount --bind "$work/home" /home
mount --bind "$work/varlib" /var/lib
mount --bind "$work/varlog" /var/log
bash "$script"
for _ in $(seq 100); do
  grep -qx 'state=done' /var/lib/tpuctl/demo/status 2>/dev/null && break
  sleep 0.1
done
cat /var/lib/tpuctl/demo/status
stat -c 'state-dir %U:%G %a' /var/lib/tpuctl/demo
stat -c 'marker %U' /var/lib/tpuctl/demo/DONE
cat /home/tpuctl/job/out
"""


@pytest.mark.skipif(not _can_isolate_a_real_vm(), reason="needs root and mount namespaces")
def test_real_vm_creates_the_user_and_runs_the_job_as_it(
    job_spec: Callable[..., Any], metadata_server: Any, tmp_path: Path
) -> None:
    spec = job_spec(
        'printf "%s %s %s\\n" "$(id -un)" "$HOME" "$PWD" >out; touch "$TPUCTL_DONE_MARKER"',
        setup=('id -un >"$HOME/setup-user"',),
    )
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script(spec))
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env["GCE_METADATA_HOST"] = metadata_server.host
    result = subprocess.run(
        [
            "unshare",
            "-m",
            "bash",
            "-c",
            REAL_VM_HARNESS,
            "harness",
            str(tmp_path / "w"),
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "state=done" in lines
    assert "state-dir root:tpuctl 775" in lines
    assert "marker tpuctl" in lines
    assert lines[-1] == "tpuctl /home/tpuctl /home/tpuctl/job"
    assert (tmp_path / "w/home/tpuctl/setup-user").read_text() == "tpuctl\n"
