"""Scale: 64 slices × 16 VMs in one emulator, and `true` over SSH on all 1,024 workers."""

from __future__ import annotations

import concurrent.futures
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.emulator import workers_helpers
from tests.emulator.workers_helpers import identity, new_key
from tests.support import child_environment
from tpuctl.emulator.vms import vm
from tpuctl.emulator.vms.workers import WorkerInfo, WorkerPlane

# It starts emulators of its own (servers, worker VMs): an emulator test. It measures no time
# (scripts/bench does), so it runs beside the other tests.
pytestmark = pytest.mark.emulator

SLICES = 64
VMS_PER_SLICE = 16
IN_FLIGHT = 128


@pytest.mark.slow
def test_1024_workers_run_true_over_ssh(tmp_path: Path) -> None:
    key = new_key("scale@ci")
    plane = WorkerPlane(tmp_path)
    plane.start()
    try:
        started = time.perf_counter()

        def create(index: int) -> list[WorkerInfo]:
            return plane.create_node(
                identity(
                    f"slice-{index}",
                    workers=VMS_PER_SLICE,
                    accelerator_type="v4-128",
                    topology="4x4x4",
                    slice_index=index,
                    num_slices=SLICES,
                ),
                {"ssh-keys": key.metadata_line("ci")},
                coordinator="127.0.0.2:8080",
            )

        # From a thread pool, as the control plane does (16 threads).
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            nodes = list(pool.map(create, range(SLICES)))
        targets = [(info.ip, info.host_key) for infos in nodes for info in infos]
        create_seconds = time.perf_counter() - started
        assert len({ip for ip, _ in targets}) == SLICES * VMS_PER_SLICE

        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        request = {
            "targets": targets,
            "port": plane.ssh_port,
            "user": "ci",
            "key": key.private.export_private_key().decode(),
            "command": "true",
            "limit": IN_FLIGHT,
        }
        completed = subprocess.run(
            [sys.executable, workers_helpers.__file__],
            input=json.dumps(request),
            env=child_environment(),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        assert completed.returncode == 0, completed.stderr[-3000:]
        report = json.loads(completed.stdout)
        server_cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (
            cpu_before.ru_utime + cpu_before.ru_stime
        )
        print(
            f"\n[scale] create {SLICES}x{VMS_PER_SLICE} workers: {create_seconds:.2f}s; "
            f"`true` on {len(targets)} workers, {IN_FLIGHT} in flight: "
            f"{report['seconds']:.2f}s wall, client CPU {report['client_cpu_seconds']:.3f}s, "
            f"emulator CPU {server_cpu:.3f}s"
        )
        assert report["failed"] == 0, report["failures"]
        assert report["ok"] == SLICES * VMS_PER_SLICE
        assert create_seconds < 30
        assert report["seconds"] < 120
    finally:
        plane.close()
    assert vm.scan_processes(plane.instance_id) == {}
