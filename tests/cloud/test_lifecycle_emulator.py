"""create → wait → status → reset → delete against the emulator, with the real google-cloud-tpu
client and the real CLI (in-process through the error boundary, or as a process for signals)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from typing import Any

import pytest

pytestmark = pytest.mark.emulator

# `cloud`, `no_v4_capacity`, `read_until`, `tpu_emulator`: tests/cloud/conftest.py.
Cloud = Any


def wait_gone(cloud: Cloud, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cloud.cli("status", name).exit_code == 5:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} still exists after {timeout} s")


def test_happy_path_create_wait_status_reset_delete(cloud: Cloud) -> None:
    spec = cloud.spec()
    name = spec.stem
    created = cloud.cli("create", str(spec), "--wait", "--format", "json")
    assert created.exit_code == 0, created.stderr
    result = created.json()
    assert result["action"] == "created"
    assert result["wait"]["state"] == "ACTIVE"
    states = [t["state"] for t in result["wait"]["transitions"]]
    assert states[-1] == "ACTIVE"
    # Each change is on stderr with its RFC 3339 UTC time; nothing but JSON on stdout.
    assert re.search(rf"^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ {name}: .*ACTIVE$", created.stderr, re.M)

    status = cloud.cli("status", name, "--format", "json")
    assert status.exit_code == 0, status.stderr
    summary = status.json()
    assert summary["state"] == "ACTIVE"
    assert summary["managed_by_tpuctl"] is True
    (node,) = summary["nodes"]
    assert node["state"] == "READY" and node["health"] == "HEALTHY"
    assert node["workers"] and node["workers"][0]["internal_ip"]
    # The spec path works wherever a name does.
    by_spec = cloud.cli("status", str(spec), "--format", "json")
    assert by_spec.json()["resource"] == summary["resource"]
    table = cloud.cli("status", name)
    assert "READY" in table.stdout and node["workers"][0]["internal_ip"] in table.stdout

    reset = cloud.cli("reset", name, "--wait", "--format", "json")
    assert reset.exit_code == 0, reset.stderr
    assert reset.json()["state"] == "ACTIVE"

    deleted = cloud.cli("delete", name, "--force", "--yes", "--format", "json")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.json() == {"name": name, "action": "deleted", "force": True, "state": "ACTIVE"}
    assert cloud.cli("status", name).exit_code == 5
    # Deleting what is not there: 5, or success when asked.
    assert cloud.cli("delete", name, "--yes").exit_code == 5
    assert cloud.cli("delete", name, "--yes", "--ignore-missing").exit_code == 0
    missing = cloud.cli("wait", name)
    assert missing.exit_code == 5
    assert "not found" in missing.stderr


def test_create_is_idempotent_for_the_same_spec_and_refuses_a_changed_one(cloud: Cloud) -> None:
    spec = cloud.spec()
    name = spec.stem
    first = cloud.cli("create", str(spec), "--format", "json")
    assert first.exit_code == 0, first.stderr
    assert first.json()["action"] == "created"
    again = cloud.cli("create", str(spec), "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert again.json()["action"] == "exists"
    assert cloud.qr_names() == [name]

    changed = cloud.cli("create", str(spec), "--set", "tpu.accelerator=v4-16", "--format", "json")
    assert changed.exit_code == 1
    error = changed.json()["error"]
    fields = {d["field"]: d for d in error["differences"]}
    assert fields["accelerator"]["existing"] == "v4-8"
    assert fields["accelerator"]["spec"] == "v4-16"
    assert "spec_hash" in fields
    assert "accelerator: v4-8 → v4-16" in changed.stderr
    assert cloud.qr_names() == [name]


def test_a_create_retried_after_unavailable_makes_one_queued_resource(
    cloud: Cloud, tpu_emulator: Any
) -> None:
    from tpuctl.cloud import lifecycle
    from tpuctl.spec.load import load_spec

    admin = tpu_emulator.admin
    spec_path = cloud.spec()
    name = spec_path.stem
    # Through the CLI: the first calls fail UNAVAILABLE and are retried.
    admin.api_fault(code="UNAVAILABLE", count=3)
    created = cloud.cli("create", str(spec_path), "--format", "json")
    assert created.exit_code == 0, created.stderr
    faults = [e for e in admin.events(0) if e["kind"] == "api.fault"]
    assert len(faults) >= 3
    assert cloud.qr_names() == [name]

    # The create call itself retried, then sent again whole (as a retry whose first attempt
    # got through would be): one request_id, one queued resource.
    second = cloud.spec()
    api = cloud.api()
    plan = lifecycle.plan_create(
        load_spec(second).spec, project=cloud.project, zone="us-central2-b"
    )
    admin.api_fault(code="UNAVAILABLE", count=2)
    first_op = api.create_queued_resource(plan.request)
    replay_op = api.create_queued_resource(plan.request)
    assert first_op.operation.name == replay_op.operation.name
    assert sorted(cloud.qr_names()) == sorted([name, second.stem])


def test_queue_deadline_exits_4_and_deletes_what_it_gave_up_on(
    cloud: Cloud, no_v4_capacity: Any
) -> None:
    spec = cloud.spec()
    name = spec.stem
    outcome = cloud.cli("create", str(spec), "--wait", "--queue-timeout", "2s", "--format", "json")
    assert outcome.exit_code == 4, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "deadline"
    assert error["phase"] == "queueing"
    assert error["state"] == "WAITING_FOR_RESOURCES"
    assert error["deleted"] is True
    assert "deleted it" in outcome.stderr
    assert cloud.cli("status", name).exit_code == 5
    assert name not in cloud.qr_names()


def test_keep_on_timeout_keeps_it_and_says_how_to_delete(cloud: Cloud, no_v4_capacity: Any) -> None:
    spec = cloud.spec(extra="deadlines:\n  queue: 1s\n")
    name = spec.stem
    outcome = cloud.cli("create", str(spec), "--wait", "--keep-on-timeout")
    assert outcome.exit_code == 4
    assert f"tpuctl delete {name}" in outcome.stderr
    assert cloud.cli("status", name).exit_code == 0


def test_valid_until_expiry_fails_with_exit_6_and_the_reason(
    cloud: Cloud, no_v4_capacity: Any, tpu_emulator: Any
) -> None:
    window = max(2, round(1.5 * tpu_emulator.speed))  # ~1.5 s of real time
    spec = cloud.spec(extra=f"  valid_until: {window}s\n")
    name = spec.stem
    outcome = cloud.cli("create", str(spec), "--wait", "--format", "json")
    assert outcome.exit_code == 6, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "failed"
    assert error["state"] == "FAILED"
    assert "valid_until" in error["reason"]
    assert f"tpuctl delete {name}" in error["hint"]
    # The same spec again: the FAILED one is reported with the command that clears it.
    again = cloud.cli("create", str(spec))
    assert again.exit_code == 6
    assert "FAILED" in again.stderr and f"tpuctl delete {name}" in again.stderr


def test_spot_preemption_while_waiting_exits_7(
    cloud: Cloud, tpu_emulator: Any, no_v4_capacity: Any
) -> None:
    admin = tpu_emulator.admin
    spec = cloud.spec()
    name = spec.stem
    waiting = cloud.spawn("create", str(spec), "--wait", "--format", "json")
    try:
        full = f"projects/{cloud.project}/locations/us-central2-b/queuedResources/{name}"
        admin.wait_for_event(
            lambda e: e["kind"] == "qr.state" and e["qr"] == full and e["detail"] == "CREATING",
            timeout=30,
        )
        no_v4_capacity()  # capacity back: it goes on to PROVISIONING
        admin.wait_for_event(
            lambda e: e["kind"] == "qr.state" and e["qr"] == full and e["detail"] == "PROVISIONING",
            timeout=30,
        )
        admin.preempt(full)
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 7, err
    import json

    error = json.loads(out)["error"]
    assert error["kind"] == "preempted"
    assert error["initiator"] == "SERVICE"
    assert error["state"] in ("SUSPENDING", "SUSPENDED")


def test_delete_without_force_explains_the_services_refusal(cloud: Cloud) -> None:
    spec = cloud.spec()
    name = spec.stem
    assert cloud.cli("create", str(spec), "--wait").exit_code == 0
    refused = cloud.cli("delete", name, "--yes", "--format", "json")
    assert refused.exit_code == 1
    error = refused.json()["error"]
    assert "--force" in error["message"] and "--force" in error["hint"]
    assert "node" in error["message"]  # the service's own words are kept
    assert cloud.cli("status", name).exit_code == 0


def test_reset_of_a_queued_resource_that_is_not_active_is_explained(
    cloud: Cloud, no_v4_capacity: Any
) -> None:
    spec = cloud.spec()
    name = spec.stem
    assert cloud.cli("create", str(spec)).exit_code == 0
    refused = cloud.cli("reset", name)
    assert refused.exit_code == 1
    assert "only an ACTIVE" in refused.stderr and "WAITING_FOR_RESOURCES" in refused.stderr


def test_list_shows_tpuctl_queued_resources(cloud: Cloud) -> None:
    spec = cloud.spec()
    assert cloud.cli("create", str(spec)).exit_code == 0
    listed = cloud.cli("list", "--format", "json")
    assert [q["name"] for q in listed.json()["queued_resources"]] == [spec.stem]
    table = cloud.cli("list")
    assert spec.stem in table.stdout and "spot" in table.stdout


def interrupt_after_waiting(
    process: subprocess.Popen[str], name: str, read_until: Any
) -> tuple[str, str]:
    """SIGINT once the watcher has printed the WAITING_FOR_RESOURCES state line."""
    seen: list[str] = []
    try:
        assert read_until(process.stderr, f"{name}: WAITING_FOR_RESOURCES", seen), "".join(seen)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return out, "".join(seen) + err


def test_ctrl_c_during_wait_prints_the_cleanup_command_and_exits_130(
    cloud: Cloud, no_v4_capacity: Any, read_until: Any
) -> None:
    spec = cloud.spec()
    name = spec.stem
    assert cloud.cli("create", str(spec)).exit_code == 0
    process = cloud.spawn("wait", name)
    _out, err = interrupt_after_waiting(process, name, read_until)
    assert process.returncode == 130, err
    command = f"tpuctl delete {name} --project {cloud.project} --zone us-central2-b --force --yes"
    assert command in err
    assert "WAITING_FOR_RESOURCES" in err
    # Left in place, as promised.
    assert cloud.cli("status", name).exit_code == 0


def test_ctrl_c_with_delete_on_interrupt_deletes_it(
    cloud: Cloud, no_v4_capacity: Any, read_until: Any
) -> None:
    spec = cloud.spec()
    name = spec.stem
    process = cloud.spawn("create", str(spec), "--wait", "--delete-on-interrupt")
    _out, err = interrupt_after_waiting(process, name, read_until)
    assert process.returncode == 130, err
    assert "deletion requested" in err
    wait_gone(cloud, name)


def test_create_says_how_a_local_job_code_gets_delivered(cloud: Cloud) -> None:
    (cloud.tmp_path / "src").mkdir()
    spec = cloud.spec(extra="job:\n  code: ./src\n  command: python3 train.py\n")
    created = cloud.cli("create", str(spec), "--wait")
    assert created.exit_code == 0, created.stderr
    assert "job.code ./src is local" in created.stderr
    assert f"tpuctl up {spec}" in created.stderr
    without_code = cloud.spec(extra="job:\n  command: python3 train.py\n")
    plain = cloud.cli("create", str(without_code))
    assert plain.exit_code == 0, plain.stderr
    assert "is local" not in plain.stderr
