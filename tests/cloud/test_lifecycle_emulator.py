"""create → wait → status → reset → delete against the emulator, with the real google-cloud-tpu
client and the real CLI (in-process through the error boundary, or as a process for signals)."""

from __future__ import annotations

import re
import signal
import subprocess
from typing import Any

from tests.harness import EMULATOR_SPEED, Project
from tests.support import wait_for


def wait_gone(project: Project, name: str, timeout: float = 30.0) -> None:
    wait_for(lambda: project.cli("status", name).exit_code == 5, timeout, f"{name} gone")


def test_happy_path_create_wait_status_reset_delete(project: Project) -> None:
    spec = project.spec()
    name = spec.stem
    created = project.cli("create", str(spec), "--wait", "--format", "json")
    assert created.exit_code == 0, created.stderr
    result = created.json()
    assert result["action"] == "created"
    assert result["wait"]["state"] == "ACTIVE"
    states = [t["state"] for t in result["wait"]["transitions"]]
    assert states[-1] == "ACTIVE"
    # Each change is on stderr with its RFC 3339 UTC time; nothing but JSON on stdout.
    assert re.search(rf"^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ {name}: .*ACTIVE$", created.stderr, re.M)

    status = project.cli("status", name, "--format", "json")
    assert status.exit_code == 0, status.stderr
    summary = status.json()
    assert summary["state"] == "ACTIVE"
    assert summary["managed_by_tpuctl"] is True
    (node,) = summary["nodes"]
    assert node["state"] == "READY" and node["health"] == "HEALTHY"
    assert node["workers"] and node["workers"][0]["internal_ip"]
    # The spec path works wherever a name does.
    by_spec = project.cli("status", str(spec), "--format", "json")
    assert by_spec.json()["resource"] == summary["resource"]
    table = project.cli("status", name)
    assert "READY" in table.stdout and node["workers"][0]["internal_ip"] in table.stdout

    reset = project.cli("reset", name, "--wait", "--format", "json")
    assert reset.exit_code == 0, reset.stderr
    assert reset.json()["state"] == "ACTIVE"

    deleted = project.cli("delete", name, "--force", "--yes", "--format", "json")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.json() == {
        "apiVersion": "tpuctl/v1",
        "kind": "Delete",
        "name": name,
        "action": "deleted",
        "force": True,
        "state": "ACTIVE",
        "zones": ["us-central2-b"],
    }
    assert project.cli("status", name).exit_code == 5
    # Deleting what is not there: 5, or success when asked.
    assert project.cli("delete", name, "--yes").exit_code == 5
    assert project.cli("delete", name, "--yes", "--ignore-missing").exit_code == 0
    missing = project.cli("wait", name)
    assert missing.exit_code == 5
    assert "not found" in missing.stderr


def test_create_is_idempotent_for_the_same_spec_and_refuses_a_changed_one(project: Project) -> None:
    spec = project.spec()
    name = spec.stem
    first = project.cli("create", str(spec), "--format", "json")
    assert first.exit_code == 0, first.stderr
    assert first.json()["action"] == "created"
    again = project.cli("create", str(spec), "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert again.json()["action"] == "exists"
    assert project.qr_names() == [name]

    changed = project.cli("create", str(spec), "--set", "tpu.accelerator=v4-16", "--format", "json")
    assert changed.exit_code == 1
    error = changed.json()["error"]
    fields = {d["field"]: d for d in error["differences"]}
    assert fields["accelerator"]["existing"] == "v4-8"
    assert fields["accelerator"]["spec"] == "v4-16"
    assert "spec_hash" in fields
    assert "accelerator: v4-8 → v4-16" in changed.stderr
    assert project.qr_names() == [name]


def test_a_create_retried_after_unavailable_makes_one_queued_resource(
    project: Project, emulator: Any
) -> None:
    from tpuctl.jobs.provision import create_request
    from tpuctl.spec.load import load_spec

    admin = emulator.admin
    spec_path = project.spec()
    name = spec_path.stem
    # Through the CLI: the first calls fail UNAVAILABLE and are retried.
    admin.api_fault(code="UNAVAILABLE", count=3)
    created = project.cli("create", str(spec_path), "--format", "json")
    assert created.exit_code == 0, created.stderr
    faults = [e for e in admin.events(0) if e["kind"] == "api.fault"]
    assert len(faults) >= 3
    assert project.qr_names() == [name]

    # The create call itself retried, then sent again whole (as a retry whose first attempt
    # got through would be): one request_id, one queued resource.
    second = project.spec()
    api = project.api()
    request = create_request(load_spec(second).spec, api.location)
    admin.api_fault(code="UNAVAILABLE", count=2)
    first_op = api.create_queued_resource(request)
    replay_op = api.create_queued_resource(request)
    assert first_op.operation.name == replay_op.operation.name
    assert sorted(project.qr_names()) == sorted([name, second.stem])


def test_queue_deadline_exits_4_and_deletes_what_it_gave_up_on(
    project: Project, no_v4_capacity: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    outcome = project.cli(
        "create", str(spec), "--wait", "--queue-timeout", "2s", "--format", "json"
    )
    assert outcome.exit_code == 4, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "deadline"
    assert error["phase"] == "queueing"
    assert error["state"] == "WAITING_FOR_RESOURCES"
    assert error["deleted"] is True
    assert "deleted it" in outcome.stderr
    assert project.cli("status", name).exit_code == 5
    assert name not in project.qr_names()


def test_keep_on_timeout_keeps_it_and_says_how_to_delete(
    project: Project, no_v4_capacity: Any
) -> None:
    spec = project.spec(extra="deadlines:\n  queue: 1s\n")
    name = spec.stem
    outcome = project.cli("create", str(spec), "--wait", "--keep-on-timeout")
    assert outcome.exit_code == 4
    assert f"tpuctl delete {name}" in outcome.stderr
    assert project.cli("status", name).exit_code == 0


def test_valid_until_expiry_fails_with_exit_6_and_the_reason(
    project: Project, no_v4_capacity: Any, emulator: Any
) -> None:
    window = max(2, round(1.5 * EMULATOR_SPEED))  # ~1.5 s of real time
    spec = project.spec(extra=f"  valid_until: {window}s\n")
    name = spec.stem
    outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    assert outcome.exit_code == 6, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "failed"
    assert error["state"] == "FAILED"
    assert "valid_until" in error["reason"]
    assert f"tpuctl delete {name}" in error["hint"]
    # The same spec again: the FAILED one is reported with the command that clears it.
    again = project.cli("create", str(spec))
    assert again.exit_code == 6
    assert "FAILED" in again.stderr and f"tpuctl delete {name}" in again.stderr


def test_spot_preemption_while_waiting_exits_7(
    project: Project, emulator: Any, no_v4_capacity: Any
) -> None:
    admin = emulator.admin
    spec = project.spec()
    name = spec.stem
    waiting = project.spawn("create", str(spec), "--wait", "--format", "json")
    try:
        full = f"projects/{project.name}/locations/us-central2-b/queuedResources/{name}"
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


def test_delete_without_force_explains_the_services_refusal(project: Project) -> None:
    spec = project.spec()
    name = spec.stem
    assert project.cli("create", str(spec), "--wait").exit_code == 0
    refused = project.cli("delete", name, "--yes", "--format", "json")
    assert refused.exit_code == 1
    error = refused.json()["error"]
    assert "--force" in error["message"] and "--force" in error["hint"]
    assert "node" in error["message"]  # the service's own words are kept
    assert project.cli("status", name).exit_code == 0


def test_reset_of_a_queued_resource_that_is_not_active_is_explained(
    project: Project, no_v4_capacity: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    assert project.cli("create", str(spec)).exit_code == 0
    refused = project.cli("reset", name)
    assert refused.exit_code == 1
    assert "only an ACTIVE" in refused.stderr and "WAITING_FOR_RESOURCES" in refused.stderr


def test_list_shows_tpuctl_queued_resources(project: Project) -> None:
    spec = project.spec()
    assert project.cli("create", str(spec)).exit_code == 0
    listed = project.cli("list", "--format", "json")
    assert [q["name"] for q in listed.json()["queued_resources"]] == [spec.stem]
    table = project.cli("list")
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
    project: Project, no_v4_capacity: Any, read_until: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    assert project.cli("create", str(spec)).exit_code == 0
    process = project.spawn("wait", name)
    _out, err = interrupt_after_waiting(process, name, read_until)
    assert process.returncode == 130, err
    command = f"tpuctl delete {name} --project {project.name} --zone us-central2-b --force --yes"
    assert command in err
    assert "WAITING_FOR_RESOURCES" in err
    # Left in place, as promised.
    assert project.cli("status", name).exit_code == 0


def test_ctrl_c_with_delete_on_interrupt_deletes_it(
    project: Project, no_v4_capacity: Any, read_until: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    process = project.spawn("create", str(spec), "--wait", "--delete-on-interrupt")
    _out, err = interrupt_after_waiting(process, name, read_until)
    assert process.returncode == 130, err
    assert "deletion requested" in err
    wait_gone(project, name)


def test_create_says_how_a_local_job_code_gets_delivered(project: Project) -> None:
    (project.tmp_path / "src").mkdir()
    spec = project.spec(extra="job:\n  code: ./src\n  command: python3 train.py\n")
    created = project.cli("create", str(spec), "--wait")
    assert created.exit_code == 0, created.stderr
    assert "job.code ./src is local" in created.stderr
    assert f"tpuctl up {spec}" in created.stderr
    without_code = project.spec(extra="job:\n  command: python3 train.py\n")
    plain = project.cli("create", str(without_code))
    assert plain.exit_code == 0, plain.stderr
    assert "is local" not in plain.stderr
