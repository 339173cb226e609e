"""One interface to the Cloud TPU API, two transports: the same commands, results, exit codes
and retries over gRPC (google-cloud-tpu) and over the REST API (TPUCTL_TPU_TRANSPORT=rest),
against the emulator's two faces of one state; and what only REST carries (a flex-start run's
provisioning model and termination time) read back where tpuctl needs it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tests.harness import ZONE, Project, unique
from tests.support import wait_for

TRANSPORTS = ("grpc", "rest")


def _spec(project: Project, extra: str = "", accelerator: str = "v4-8") -> Any:
    name = unique("tr")
    path = project.tmp_path / f"{name}.yaml"
    runtime = "v2-alpha-tpuv6e" if accelerator.startswith("v6e") else "tpu-ubuntu2204-base"
    path.write_text(
        f"apiVersion: tpuctl/v1\nname: {name}\ntpu:\n  accelerator: {accelerator}\n"
        f"  runtime: {runtime}\n{extra}",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_create_status_reset_delete_over_either_transport(project: Project, transport: str) -> None:
    env = {"TPUCTL_TPU_TRANSPORT": transport}
    spec = _spec(project, "capacity: {tier: spot}\n")
    name = spec.stem
    created = project.cli("create", str(spec), "--wait", "--format", "json", env=env)
    assert created.exit_code == 0, created.stderr
    assert created.json()["wait"]["state"] == "ACTIVE"
    resource = f"projects/{project.name}/locations/{ZONE}/queuedResources/{name}"
    over_rest = project.emulator.admin.rest_requests(resource)
    assert [r["method"] for r in over_rest] == (["POST"] if transport == "rest" else [])
    status = project.cli("status", name, "--format", "json", env=env).json()
    assert status["state"] == "ACTIVE" and status["tier"] == "spot"
    assert status["nodes"][0]["state"] == "READY" and status["nodes"][0]["workers"]
    listed = project.cli("list", "--format", "json", env=env).json()
    assert [entry["name"] for entry in listed["queued_resources"]] == [name]
    reset = project.cli("reset", name, "--wait", "--format", "json", env=env)
    assert reset.exit_code == 0, reset.stderr
    # The same create again is accepted (same spec), over either transport.
    again = project.cli("create", str(spec), "--format", "json", env=env)
    assert again.exit_code == 0 and again.json()["action"] == "exists"
    deleted = project.cli("delete", name, "--force", "--yes", "--format", "json", env=env)
    assert deleted.exit_code == 0, deleted.stderr
    wait_for(lambda: project.cli("status", name, env=env).exit_code == 5, 30, f"{name} gone")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("fault", "exit_code", "kind"),
    [
        ({"code": "PERMISSION_DENIED", "count": 1}, 8, "auth"),
        ({"code": "NOT_FOUND", "count": 1}, 5, "not_found"),
        ({"code": "UNAVAILABLE", "count": 1000}, 11, "api_unavailable"),
    ],
)
def test_errors_map_to_the_same_exit_codes(
    project: Project, transport: str, fault: dict[str, Any], exit_code: int, kind: str
) -> None:
    env = {"TPUCTL_TPU_TRANSPORT": transport, "TPUCTL_API_RETRY_SECONDS": "1"}
    project.emulator.admin.api_fault(**fault)
    try:
        outcome = project.cli("status", "some-qr", "--format", "json", env=env)
    finally:
        project.emulator.admin.api_fault(code="UNAVAILABLE", count=0)
    assert outcome.exit_code == exit_code, outcome.stderr
    assert outcome.json()["error"]["kind"] == kind


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unavailable_is_retried_then_succeeds(project: Project, transport: str) -> None:
    env = {"TPUCTL_TPU_TRANSPORT": transport}
    project.emulator.admin.api_fault(code="UNAVAILABLE", count=3)
    try:
        outcome = project.cli("list", "--format", "json", env=env)
    finally:
        project.emulator.admin.api_fault(code="UNAVAILABLE", count=0)
    assert outcome.exit_code == 0, outcome.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_create_is_resource_exhausted(project: Project, transport: str) -> None:
    env = {"TPUCTL_TPU_TRANSPORT": transport}
    spec = _spec(project)
    project.emulator.admin.api_fault(create_exhausted=1)
    try:
        outcome = project.cli("create", str(spec), "--format", "json", env=env)
    finally:
        project.emulator.admin.api_fault(create_exhausted=0)
    assert outcome.exit_code == 1, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "resource_exhausted" and error["created"] is False


def test_a_flex_start_spec_goes_over_rest_and_its_end_is_read(project: Project) -> None:
    """The gRPC transport is asked for, yet a flex-start create goes over REST (gRPC's
    message has no provisioning model); the emulator kept what REST sent, and a slice set
    read over REST knows when its run ends."""
    from tpuctl.jobs.reconcile.world import TpuSlices
    from tpuctl.spec.load import load_spec

    spec_path = _spec(project, "capacity: {tier: flex-start, max_run_duration: 2h}\n", "v6e-1")
    name = spec_path.stem
    created = project.cli("create", str(spec_path), "--wait", "--format", "json")
    assert created.exit_code == 0, created.stderr
    resource = f"projects/{project.name}/locations/{ZONE}/queuedResources/{name}"
    [sent] = project.emulator.admin.rest_requests(resource)
    assert sent["body"]["provisioningModel"] == "FLEX_START"
    assert sent["body"]["runDuration"] == {"maxRunDuration": "7200s"}

    spec = load_spec(spec_path, environ={}).spec
    slices = TpuSlices(project.api(), spec, fleet_factory=lambda **_: None)
    seen = slices.look(ZONE)
    assert seen.state == "ACTIVE"
    assert seen.termination_time is not None
    left = (seen.termination_time - datetime.now(timezone.utc)).total_seconds()
    # Two emulated hours at the session emulator's speed (20): 360 s of real time, less
    # what creating took.
    assert 0 < left <= 7200 / 20
    over_grpc = project.api().get_queued_resource(name)
    from tpuctl.cloud import describe

    assert describe.tier_of(over_grpc) == "on-demand"  # gRPC cannot tell
    assert describe.tier_of(slices.api.get_queued_resource(name)) == "flex-start"
    status = project.cli("status", name, "--format", "json", env={"TPUCTL_TPU_TRANSPORT": "rest"})
    assert status.json()["tier"] == "flex-start"
    project.cli("delete", name, "--force", "--yes")
