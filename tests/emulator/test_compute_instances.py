"""The Compute Engine fake's TPU VMs through the unmodified google-cloud-compute client (REST):
a spot v6e VM boots, runs its startup script, answers SSH with the host key its guest
attributes publish, and is preempted (the soft-off SIGTERM, `preempted` TRUE, TERMINATED);
scheduled maintenance is announced, then happens; flex-start waits for capacity."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.api_core import exceptions

from tests.emulator.compute_helpers import (
    Compute,
    OperationFailed,
    instance_body,
    login,
    ssh,
    unique_zone,
)
from tests.emulator.helpers import ZONE, new_project, wait_until

# Its clients are google-cloud-compute's: tests/order.py keeps it on few processes.
pytestmark = pytest.mark.compute_library

# Each boot appends a line to $HOME/boots (the VM's disk); a background job stands for the
# trainer: on SIGTERM it records what the metadata server said then.
RECORDER = """#!/bin/bash
md() {
  curl -s -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/$1"
}
echo "boot $(md attributes/agent-worker-number) $(md attributes/accelerator-type)" >>"$HOME/boots"
nohup bash -c '
  on_term() {
    echo "term preempted=$(curl -s -H Metadata-Flavor:Google \\
      http://$GCE_METADATA_HOST/computeMetadata/v1/instance/preempted)" >> "$HOME/signals"
    exit 0
  }
  trap on_term TERM
  while :; do sleep 0.1; done' >/dev/null 2>&1 &
"""


def lines(path: Any) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_spot_v6e_vm_boots_answers_ssh_and_is_preempted(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    who = login()
    body = instance_body(
        "spot-1",
        ZONE,
        "ct6e-standard-4t",
        model="SPOT",
        instanceTerminationAction="STOP",
        metadata={"startup-script": RECORDER, **who.metadata},
    )
    compute.wait(compute.insert_instance(ZONE, body))
    vm = compute.get(ZONE, "spot-1")
    assert (vm.status, vm.scheduling.provisioning_model) == ("RUNNING", "SPOT")
    assert vm.guest_accelerators[0].accelerator_count == 4
    items = {item.key: item.value for item in vm.metadata.items}
    assert (items["accelerator-type"], items["agent-worker-number"]) == ("v6e-4", "0")
    assert items["worker-network-endpoints"] == "spot-1"
    assert "TPU_ACCELERATOR_TYPE: 'v6e-4'" in items["tpu-env"]
    home = compute.vm_root(ZONE, "spot-1") / "root"
    wait_until(lambda: lines(home / "boots") == ["boot 0 v6e-4"], "the startup script")

    ip = vm.network_interfaces[0].network_i_p
    assert vm.network_interfaces[0].access_configs[0].nat_i_p == ip
    answer = ssh(
        ip,
        emulator.ssh_port,
        compute.host_key(ZONE, "spot-1"),
        who,
        "curl -s -H Metadata-Flavor:Google "
        "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/name",
    )
    assert answer == "spot-1"

    emulator.admin.compute_preempt(f"projects/{compute.project}/zones/{ZONE}/instances/spot-1")
    stopped = compute.wait_status(ZONE, "spot-1", "TERMINATED")
    assert stopped.status_message == "Instance was preempted."
    # The soft-off signal reached the job while the metadata server already said so.
    assert lines(home / "signals") == ["term preempted=TRUE"]
    operations = compute.client("ZoneOperationsClient").list(project=compute.project, zone=ZONE)
    assert "compute.instances.preempted" in [op.operation_type for op in operations]

    with pytest.raises(exceptions.BadRequest, match="cannot be restarted"):
        compute.instances.start(project=compute.project, zone=ZONE, instance="spot-1")
    compute.wait(compute.instances.delete(project=compute.project, zone=ZONE, instance="spot-1"))
    compute.gone(ZONE, "spot-1")


def test_scheduled_maintenance_is_announced_then_reboots_the_vm(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    who = login()
    body = instance_body(
        "maint-1", ZONE, "ct5p-hightpu-4t", metadata={"startup-script": RECORDER, **who.metadata}
    )
    compute.wait(compute.insert_instance(ZONE, body))
    vm = compute.get(ZONE, "maint-1")
    home = compute.vm_root(ZONE, "maint-1") / "root"
    wait_until(lambda: lines(home / "boots") == ["boot 0 v5p-8"], "the first boot")

    target = f"projects/{compute.project}/zones/{ZONE}/instances/maint-1"
    at = emulator.admin.compute_maintenance(target, at="+200s")["at"]
    upcoming = compute.get(ZONE, "maint-1").resource_status.upcoming_maintenance
    assert (upcoming.type_, upcoming.maintenance_status) == ("SCHEDULED", "PENDING")
    assert upcoming.window_start_time == at
    served = ssh(
        vm.network_interfaces[0].network_i_p,
        emulator.ssh_port,
        compute.host_key(ZONE, "maint-1"),
        who,
        "curl -s -H Metadata-Flavor:Google "
        "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/upcoming-maintenance",
    )
    assert json.loads(served)["window_start_time"] == at

    # Then it happens: SIGTERM to what runs, a reboot, the startup script again.
    wait_until(lambda: len(lines(home / "boots")) == 2, "the boot after maintenance", 60)
    assert lines(home / "signals") == ["term preempted=FALSE"]
    back = compute.wait_status(ZONE, "maint-1", "RUNNING")
    assert "upcoming_maintenance" not in back.resource_status
    operations = compute.client("ZoneOperationsClient").list(project=compute.project, zone=ZONE)
    assert "compute.instances.terminateOnHostMaintenance" in [
        op.operation_type for op in operations
    ]
    compute.wait(compute.instances.delete(project=compute.project, zone=ZONE, instance="maint-1"))


def test_flex_start_vm_waits_pending_for_capacity_and_ends_at_its_run_duration(
    emulator: Any,
) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"v6e": 0}, zone=zone)
    body = instance_body(
        "flex-1",
        zone,
        "ct6e-standard-1t",
        model="FLEX_START",
        instanceTerminationAction="DELETE",
        maxRunDuration={"seconds": "200"},
    )
    body["params"] = {"requestValidForDuration": {"seconds": "3600"}}
    insert = compute.insert_instance(zone, body)
    compute.wait_status(zone, "flex-1", "PENDING")
    assert "termination_timestamp" not in compute.get(zone, "flex-1").resource_status.scheduling

    emulator.admin.compute_capacity({"v6e": 1}, zone=zone)
    compute.wait(insert)
    running = compute.wait_status(zone, "flex-1", "RUNNING")
    assert running.resource_status.scheduling.termination_timestamp
    assert emulator.admin.compute_capacity(zone=zone)["v6e"]["used"] == 1
    compute.gone(zone, "flex-1", timeout=60)  # DELETE at the end of maxRunDuration
    assert emulator.admin.compute_capacity(zone=zone)["v6e"]["used"] == 0


def test_no_capacity_fails_the_insert_and_deletes_the_vm(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"tpu7x": 0}, zone=zone)
    insert = compute.insert_instance(zone, instance_body("ironwood", zone, "tpu7x-standard-4t"))
    with pytest.raises(OperationFailed) as failed:
        compute.wait(insert)
    assert failed.value.codes == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert failed.value.operation.http_error_status_code == 503
    compute.gone(zone, "ironwood")


def test_tpu7x_vm_runs_and_reports_its_slice(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    compute.wait(compute.insert_instance(ZONE, instance_body("tpu7x-1", ZONE, "tpu7x-standard-4t")))
    vm = compute.get(ZONE, "tpu7x-1")
    items = {item.key: item.value for item in vm.metadata.items}
    assert items["accelerator-type"] == "tpu7x-8"
    assert "TOPOLOGY: '2x2x1'" in items["tpu-env"]
    assert len(list((compute.vm_root(ZONE, "tpu7x-1") / "dev").glob("accel*"))) == 4
    compute.wait(compute.instances.delete(project=compute.project, zone=ZONE, instance="tpu7x-1"))
    compute.gone(ZONE, "tpu7x-1")


def test_a_time_limited_vm_stops_at_its_end_and_starts_again_on_its_disk(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    body = instance_body(
        "limited",
        ZONE,
        "ct6e-standard-1t",
        instanceTerminationAction="STOP",
        maxRunDuration={"seconds": "120"},
        metadata={"startup-script": RECORDER},
    )
    compute.wait(compute.insert_instance(ZONE, body))
    home = compute.vm_root(ZONE, "limited") / "root"
    wait_until(lambda: len(lines(home / "boots")) == 1, "the first boot")
    stopped = compute.wait_status(ZONE, "limited", "TERMINATED", 60)  # STOP at the end
    assert "termination_timestamp" not in stopped.resource_status.scheduling
    assert lines(home / "signals") == ["term preempted=FALSE"]  # a graceful shutdown

    compute.wait(compute.instances.start(project=compute.project, zone=ZONE, instance="limited"))
    again = compute.wait_status(ZONE, "limited", "RUNNING")
    assert again.resource_status.scheduling.termination_timestamp  # counted from this start
    wait_until(lambda: len(lines(home / "boots")) == 2, "the boot after start")

    compute.wait(compute.instances.stop(project=compute.project, zone=ZONE, instance="limited"))
    assert compute.status(ZONE, "limited") == "TERMINATED"
    compute.wait(compute.instances.start(project=compute.project, zone=ZONE, instance="limited"))
    compute.wait_status(ZONE, "limited", "RUNNING")
    wait_until(lambda: len(lines(home / "boots")) == 3, "the boot after the second start")
    simulate = compute.instances.simulate_maintenance_event(
        project=compute.project, zone=ZONE, instance="limited"
    )
    compute.wait(simulate)
    wait_until(lambda: len(lines(home / "boots")) == 4, "the boot after simulated maintenance")
    compute.wait(compute.instances.delete(project=compute.project, zone=ZONE, instance="limited"))
    compute.gone(ZONE, "limited")


def test_shrinking_a_pool_below_use_preempts_its_newest_spot_vm(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"v6e": 2}, zone=zone)
    for name in ("older", "newer"):
        body = instance_body(name, zone, "ct6e-standard-1t", model="SPOT")
        compute.wait(compute.insert_instance(zone, body))
    emulator.admin.compute_capacity({"v6e": 1}, zone=zone)
    assert compute.wait_status(zone, "newer", "TERMINATED").status_message == (
        "Instance was preempted."
    )
    assert compute.status(zone, "older") == "RUNNING"
    assert emulator.admin.compute_capacity(zone=zone)["v6e"]["used"] == 1


def test_deleting_a_pending_flex_start_vm_ends_its_insert(emulator: Any) -> None:
    compute = Compute(emulator, new_project())
    zone = unique_zone()
    emulator.admin.compute_capacity({"v5p": 0}, zone=zone)
    body = instance_body(
        "queued", zone, "ct5p-hightpu-4t", model="FLEX_START", maxRunDuration={"seconds": "3600"}
    )
    body["params"] = {"requestValidForDuration": {"seconds": "7200"}}
    insert = compute.insert_instance(zone, body)
    compute.wait_status(zone, "queued", "PENDING")
    compute.wait(compute.instances.delete(project=compute.project, zone=zone, instance="queued"))
    compute.gone(zone, "queued")
    with pytest.raises(OperationFailed):  # it never ran: the insert does not say it did
        compute.wait(insert)
    emulator.admin.compute_capacity({"v5p": 4}, zone=zone)
    assert emulator.admin.compute_capacity(zone=zone)["v5p"]["used"] == 0
