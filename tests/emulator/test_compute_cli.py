"""`tpuctl emulator compute …`: the Compute Engine fake's faults and pools from the command line,
with tpuctl's exit codes for what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.emulator.compute_helpers import Compute, instance_body, unique_zone
from tests.emulator.test_cli import _run
from tpuctl.emulator.client.testing import EmulatorProcess

# Its clients are google-cloud-compute's: tests/order.py keeps it on few processes.
pytestmark = pytest.mark.compute_library


def test_compute_commands(
    emulator: EmulatorProcess, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    zone = unique_zone()
    code, out, _ = _run(
        ["emulator", "compute", "capacity", "tpu7x=8", "--zone", zone, "--format", "json"], capsys
    )
    assert code == 0
    assert json.loads(out)["pools"]["tpu7x"] == {"total": 8, "used": 0, "free": 8}

    compute = Compute(emulator, f"cli-{zone}")
    body = instance_body("cli-spot", zone, "tpu7x-standard-4t", model="SPOT")
    compute.wait(compute.insert_instance(zone, body))
    target = f"projects/{compute.project}/zones/{zone}/instances/cli-spot"
    code, out, _ = _run(["emulator", "compute", "maintenance", target, "--at", "+1h"], capsys)
    assert code == 0 and "maintenance" in out
    upcoming = compute.get(zone, "cli-spot").resource_status.upcoming_maintenance
    assert upcoming.maintenance_status == "PENDING"
    code, out, _ = _run(["emulator", "compute", "preempt", target, "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["preempted"] == [
        f"https://www.googleapis.com/compute/v1/{target}"
    ]
    compute.wait_status(zone, "cli-spot", "TERMINATED")

    code, _, err = _run(["emulator", "compute", "preempt", "no-such-vm"], capsys)
    assert code == 5 and "no-such-vm" in err
    code, _, err = _run(["emulator", "compute", "capacity", "v4=1"], capsys)
    assert code == 2 and "tpu7x" in err
    code, _, err = _run(["emulator", "compute", "maintenance", target], capsys)
    assert code == 2 and "TERMINATED" in err  # only a running VM is maintained
