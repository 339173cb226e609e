"""The startup script on a Compute Engine TPU VM (under real bash, a fake metadata server): its
identity from the keys Compute Engine serves (instance names as endpoints, resolved through
the hosts file; tpu-env's TPU_-prefixed keys), and the platform's notices (preempted, host
maintenance) giving the trainer the SIGTERM Autocheckpoint gives on Cloud TPU."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tests.render.test_startup import UNTIL_RELEASED, _sh_quote
from tests.support import wait_for_bytes
from tpuctl.render.startup import render_startup_script

COMPUTE_ATTRIBUTES = {
    "accelerator-type": "v5p-16",
    "agent-worker-number": "1",
    "tpu-env": "TPU_WORKER_ID: '1'\nTPU_ACCELERATOR_TYPE: 'v5p-16'\nZONE: 'us-east5-a'\n",
    "worker-network-endpoints": "run-x7k2,run-a9q1",
}


def test_identity_from_compute_engine_keys_and_the_hosts_file(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], metadata_server: Any
) -> None:
    metadata_server.attributes = dict(COMPUTE_ATTRIBUTES)
    spec = job_spec('env | grep ^TPUCTL_ | sort >"$HOME/env"', slices=1)
    worker = make_worker("demo")
    (worker.root / "etc").mkdir()
    (worker.root / "etc/hosts").write_text(
        "# the VPC's names\n10.4.0.9 run-x7k2\n10.4.0.3 run-a9q1\n"
    )
    result = worker.run(render_startup_script(spec))
    assert result.returncode == 0, result.stderr
    worker.wait_for_state("exited")
    env = dict(
        line.split("=", 1) for line in (worker.root / "home/tpuctl/env").read_text().splitlines()
    )
    # Worker 0 is the first instance name of worker-network-endpoints, at its address.
    assert env["TPUCTL_COORDINATOR_ADDRESS"] == "10.4.0.9:8476"
    assert env["TPUCTL_WORKER_ID"] == "1" and env["TPUCTL_WORKERS_PER_SLICE"] == "2"
    assert env["TPUCTL_PROCESS_ID"] == "1" and env["TPUCTL_NUM_PROCESSES"] == "2"
    log = (worker.log_dir / "boot-1.log").read_text()
    assert "v5p-16" in log and "differs" not in log


def test_worker_number_from_tpu_env_when_agent_worker_number_is_missing(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], metadata_server: Any
) -> None:
    attributes = dict(COMPUTE_ATTRIBUTES)
    del attributes["agent-worker-number"]
    metadata_server.attributes = attributes
    spec = job_spec('env | grep ^TPUCTL_WORKER_ID >"$HOME/env"', slices=1)
    worker = make_worker("demo")
    assert worker.run(render_startup_script(spec)).returncode == 0
    worker.wait_for_state("exited")
    assert (worker.root / "home/tpuctl/env").read_text() == "TPUCTL_WORKER_ID=1\n"


def _saving_trainer() -> str:
    trainer = (
        "import os, signal, sys, time\n"
        "home = os.environ['HOME']\n"
        "def on_term(*_):\n"
        "    open(home + '/saved', 'w').write('saved')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open(home + '/started', 'w').write('yes')\n"
        "time.sleep(30)\n"
    )
    return f"exec {sys.executable} -c {_sh_quote(trainer)}"


def _start_saving(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], reap: list[int]
) -> Any:
    """A worker of one Compute Engine slice running a trainer that saves on SIGTERM, returned
    once the trainer has its handler: a SIGTERM before that ends it unsaved, as it would any
    trainer, which is not what these tests are about."""
    worker = make_worker("demo")
    worker.environment["TPUCTL_PLATFORM_POLL_SECONDS"] = "1"  # the shortest pause it takes
    assert worker.run(render_startup_script(job_spec(_saving_trainer(), slices=1))).returncode == 0
    status = worker.wait_for_state("running", "exited")
    if status.get("pid", "").isdigit():
        reap.append(int(status["pid"]))
    wait_for_bytes(worker.root / "home/tpuctl/started", 10, "the trainer's SIGTERM handler")
    return worker


def test_a_preemption_notice_stops_the_trainer_so_it_saves(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    metadata_server: Any,
    _reap_trainers: list[int],
) -> None:
    metadata_server.attributes = dict(COMPUTE_ATTRIBUTES)
    metadata_server.instance = {"preempted": "FALSE", "maintenance-event": "NONE"}
    worker = _start_saving(make_worker, job_spec, _reap_trainers)
    metadata_server.instance["preempted"] = "TRUE"
    status = worker.wait_for_state("exited")
    # Stopped by the notice: saved, and an exit after SIGTERM is never "done".
    assert status["reason"] == "forwarded SIGTERM"
    assert (worker.root / "home/tpuctl/saved").read_text() == "saved"
    assert (
        "the VM is preempted: stopping the trainer" in (worker.log_dir / "boot-1.log").read_text()
    )


def test_announced_maintenance_stops_the_trainer_before_its_window(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    metadata_server: Any,
    _reap_trainers: list[int],
) -> None:
    metadata_server.attributes = dict(COMPUTE_ATTRIBUTES)
    metadata_server.instance = {"preempted": "FALSE", "maintenance-event": "NONE"}
    worker = _start_saving(make_worker, job_spec, _reap_trainers)
    # The window starts now: well within the lead (the job's grace) before it.
    metadata_server.instance["upcoming-maintenance"] = (
        '{"can_reschedule": false, "type": "SCHEDULED", '
        '"window_start_time": "2020-01-01T00:00:00Z", "maintenance_status": "PENDING"}'
    )
    status = worker.wait_for_state("exited")
    assert status["reason"] == "forwarded SIGTERM"
    assert (worker.root / "home/tpuctl/saved").read_text() == "saved"
    log = (worker.log_dir / "boot-1.log").read_text()
    assert "host maintenance at 2020-01-01T00:00:00Z: stopping the trainer" in log


def test_no_platform_watch_on_a_cloud_tpu_vm(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], metadata_server: Any
) -> None:
    # Cloud TPU's keys (no TPU_WORKER_ID): Autocheckpoint's business, not the script's.
    metadata_server.instance = {"preempted": "TRUE"}
    spec = job_spec(f'echo ran >"$HOME/ran"; {UNTIL_RELEASED}', slices=2)
    worker = make_worker("demo")
    assert worker.run(render_startup_script(spec)).returncode == 0
    worker.wait_for_state("running")
    (worker.root / "home/tpuctl/release").touch()
    status = worker.wait_for_state("exited")
    assert status["exit_code"] == "0"
    assert "stopping the trainer" not in (worker.log_dir / "boot-1.log").read_text()
