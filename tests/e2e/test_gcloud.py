"""The real gcloud against the emulator's REST API: it creates, describes, lists and deletes
queued resources and describes and lists TPU VMs; the gRPC client sees what it made and it
sees what the gRPC client made; and the request bodies it sends for each flag are recorded in
tests/emulator/gcloud_bodies.json (rewritten with --update-goldens), where tests of what
`tpuctl render` prints can compare with them without gcloud. The bodies are sent by one gcloud
process that runs each case's command line in turn (gcloud_batch.py); the other tests run a
gcloud process per command."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions

from tests.emulator.helpers import (
    NodeState,
    QrState,
    create,
    new_project,
    qr_request,
    unique,
    wait_state,
    wait_until,
)
from tests.support import child_environment
from tpuctl.emulator.client.testing import EmulatorProcess

GCLOUD = shutil.which("gcloud")
if GCLOUD is None:
    pytest.skip(
        "gcloud is not installed: these tests drive the real gcloud against the emulator",
        allow_module_level=True,
    )

pytestmark = pytest.mark.emulator

ZONE = "us-east5-a"
BODIES = Path(__file__).resolve().parents[1] / "emulator" / "gcloud_bodies.json"
# Keep gcloud on this machine and quiet: no update check, usage report or metadata probe.
QUIET = {
    "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
    "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
    "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
}

Gcloud = Callable[..., subprocess.CompletedProcess[str]]
# Command lines run in one gcloud interpreter (see gcloud_batch.py): each gcloud process
# costs about 0.6 s of CPU before its request, and the bodies test sends one per flag case.
BATCH = Path(__file__).with_name("gcloud_batch.py")


@pytest.fixture
def project() -> str:
    return new_project()


@pytest.fixture
def gcloud_env(emulator: EmulatorProcess, tmp_path: Path, project: str) -> dict[str, str]:
    """gcloud's environment: its own configuration directory (never the user's), pointed at
    the session emulator with the settings `tpuctl emulator env` prints, in `project`."""
    config = tmp_path / "gcloud-config"
    config.mkdir()
    return child_environment({**emulator.gcloud_environment(config, project), **QUIET})


@pytest.fixture
def gcloud(gcloud_env: dict[str, str]) -> Gcloud:
    """`gcloud(*args)`: a gcloud process in `gcloud_env`."""

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert GCLOUD is not None
        done = subprocess.run(
            [GCLOUD, *args], capture_output=True, text=True, env=gcloud_env, timeout=120,
            check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"gcloud {' '.join(args)} failed: {done.stderr}")
        return done

    return run


def _in_one_gcloud(env: dict[str, str], lines: list[list[str]]) -> tuple[list[int], str]:
    """Each command line's exit status, run in turn by one gcloud process (the `gcloud`
    wrapper's own interpreter and environment, this file's CLOUDSDK_PYTHON_ARGS), and what
    that process wrote to stderr."""
    assert GCLOUD is not None
    with tempfile.TemporaryDirectory(prefix="gcloud-batch-") as work:
        lines_path, results_path = Path(work, "lines.json"), Path(work, "results.json")
        lines_path.write_text(json.dumps(lines))
        done = subprocess.run(
            [GCLOUD, str(lines_path), str(results_path)],
            capture_output=True, text=True, env={**env, "CLOUDSDK_PYTHON_ARGS": str(BATCH)},
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        results = json.loads(results_path.read_text())
    assert [result["args"] for result in results] == lines
    return [result["status"] for result in results], done.stderr


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def _gone(client: Any, name: str) -> bool:
    try:
        client.get_queued_resource(name=name)
    except exceptions.NotFound:
        return True
    return False


def test_gcloud_creates_describes_lists_and_deletes_a_qr(
    emulator: EmulatorProcess, gcloud: Gcloud, project: str
) -> None:
    client = emulator.tpu_client()
    qr_id, node_id = unique("gc"), unique("gn")
    parent = f"projects/{project}/locations/{ZONE}"
    name = f"{parent}/queuedResources/{qr_id}"
    alpha = ["alpha", "compute", "tpus", "queued-resources"]
    gcloud(
        *alpha, "create", qr_id, f"--zone={ZONE}", f"--node-id={node_id}",
        "--accelerator-type=v5litepod-1", "--runtime-version=v2-alpha-tpuv5-lite",
        "--labels=made-by=gcloud",
    )  # fmt: skip
    # The gRPC client sees what gcloud made, and it runs.
    wait_state(client, name, QrState.ACTIVE)
    node = client.get_node(name=f"{parent}/nodes/{node_id}")
    assert node.state == NodeState.READY and dict(node.labels) == {"made-by": "gcloud"}

    described = _json(gcloud(*alpha, "describe", qr_id, f"--zone={ZONE}", "--format=json"))
    assert described["name"] == name and described["state"]["state"] == "ACTIVE"
    assert described["provisioningModel"] == "STANDARD"  # what gcloud alpha always sends
    listed = _json(gcloud(*alpha, "list", f"--zone={ZONE}", "--format=json"))
    assert [item["name"] for item in listed] == [name]
    vm = ["compute", "tpus", "tpu-vm"]
    described_vm = _json(gcloud(*vm, "describe", node_id, f"--zone={ZONE}", "--format=json"))
    assert described_vm["state"] == "READY"
    assert described_vm["networkEndpoints"][0]["ipAddress"] == node.network_endpoints[0].ip_address
    assert described_vm["queuedResource"] == name
    listed_vms = _json(gcloud(*vm, "list", f"--zone={ZONE}", "--format=json"))
    assert [item["name"] for item in listed_vms] == [node.name]

    gcloud(*alpha, "delete", qr_id, f"--zone={ZONE}", "--force", "--quiet")
    assert _gone(client, name)  # gcloud waited for the delete operation


def test_gcloud_sees_what_the_grpc_client_made(
    emulator: EmulatorProcess, gcloud: Gcloud, project: str
) -> None:
    client = emulator.tpu_client()
    parent = f"projects/{project}/locations/{ZONE}"
    qr_id = unique("rq")
    request = qr_request(
        parent, accelerator_type="v5litepod-4", node_count=2, prefix=qr_id, tier="spot"
    )
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    described = _json(
        gcloud(
            "compute", "tpus", "queued-resources", "describe", qr_id, f"--zone={ZONE}",
            "--format=json",
        )
    )  # fmt: skip
    assert described["spot"] == {} and described["state"]["state"] == "ACTIVE"
    # The GA track reads v2: multi-node parameters under v2's name.
    assert described["tpu"]["nodeSpec"][0]["multisliceParams"]["nodeCount"] == 2
    listed = _json(gcloud("compute", "tpus", "tpu-vm", "list", f"--zone={ZONE}", "--format=json"))
    assert sorted(item["name"] for item in listed) == [
        f"{parent}/nodes/{qr_id}-{i}" for i in (0, 1)
    ]
    assert {item["schedulingConfig"].get("spot") for item in listed} == {True}
    gcloud(
        "compute", "tpus", "queued-resources", "delete", qr_id, f"--zone={ZONE}", "--force",
        "--quiet",
    )  # fmt: skip
    assert _gone(client, name)


def test_gcloud_errors_are_the_emulators(gcloud: Gcloud) -> None:
    alpha = ["alpha", "compute", "tpus", "queued-resources"]
    missing = gcloud(*alpha, "describe", "nope", f"--zone={ZONE}", check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    flex = gcloud(
        *alpha, "create", unique("fx"), f"--zone={ZONE}", "--node-id=n",
        "--accelerator-type=v6e-4", "--runtime-version=v2-alpha-tpuv6e",
        "--provisioning-model=flex-start", check=False,
    )  # fmt: skip
    assert flex.returncode == 1
    assert "INVALID_ARGUMENT" in flex.stderr and "max_run_duration" in flex.stderr


def test_gcloud_flex_start_runs_with_a_termination_time(
    emulator: EmulatorProcess, gcloud: Gcloud, project: str
) -> None:
    client = emulator.tpu_client()
    qr_id, node_id = unique("fs"), unique("fn")
    alpha = ["alpha", "compute", "tpus", "queued-resources"]
    gcloud(
        *alpha, "create", qr_id, f"--zone={ZONE}", f"--node-id={node_id}",
        "--accelerator-type=v6e-1", "--runtime-version=v2-alpha-tpuv6e",
        "--provisioning-model=flex-start", "--max-run-duration=2h",
    )  # fmt: skip
    name = f"projects/{project}/locations/{ZONE}/queuedResources/{qr_id}"
    wait_state(client, name, QrState.ACTIVE)
    described = _json(gcloud(*alpha, "describe", qr_id, f"--zone={ZONE}", "--format=json"))
    assert described["provisioningModel"] == "FLEX_START"
    assert described["runDuration"]["maxRunDuration"] == "7200s"
    end = described["runDuration"]["terminationTime"]
    vm = _json(
        gcloud(
            "alpha", "compute", "tpus", "tpu-vm", "describe", node_id, f"--zone={ZONE}",
            "--format=json",
        )
    )  # fmt: skip
    assert vm["schedulingConfig"]["terminationTimestamp"] == end
    gcloud(*alpha, "delete", qr_id, f"--zone={ZONE}", "--force", "--quiet")


# -------------------------------------------------------------- the bodies gcloud sends
def _fill(value: Any, names: dict[str, str]) -> Any:
    """`{project}`, `{zone}`… in every string of `value` replaced (or, `reverse`d, put back)."""
    if isinstance(value, dict):
        return {key: _fill(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, names) for item in value]
    if isinstance(value, str):
        for old, new in names.items():
            value = value.replace(old, new)
    return value


def test_the_bodies_gcloud_sends_for_each_flag(
    emulator: EmulatorProcess,
    gcloud: Gcloud,
    gcloud_env: dict[str, str],
    project: str,
    update_goldens: bool,
) -> None:
    recorded = json.loads(BODIES.read_text())
    names = {"{project}": project, "{zone}": ZONE}
    reservation = f"projects/{project}/locations/{ZONE}/reservations/calendar"
    emulator.admin.reservation(reservation, chips=64, generation="v6e", end="+7d")
    client = emulator.tpu_client()
    seen: dict[str, Any] = {}
    lines = [
        [
            *([] if spec["track"] == "ga" else [spec["track"]]),
            "compute", "tpus", "queued-resources", "create", case, f"--zone={ZONE}", "--async",
            *_fill(spec["flags"], names),
        ]
        for case, spec in recorded["cases"].items()
    ]  # fmt: skip
    try:
        statuses, stderr = _in_one_gcloud(gcloud_env, lines)
        for (case, spec), status in zip(recorded["cases"].items(), statuses, strict=True):
            assert status == 0, f"gcloud refused {case}: {stderr}"
            resource = f"projects/{project}/locations/{ZONE}/queuedResources/{case}"
            [request] = emulator.admin.rest_requests(resource)
            assert request["status"] == 200, f"{case}: the emulator refused gcloud's body"
            assert request["version"] == ("v2" if spec["track"] == "ga" else "v2alpha1")
            reverse = {value: key for key, value in names.items()}
            seen[case] = _fill(request["body"], reverse)
    finally:
        for case in recorded["cases"]:
            name = f"projects/{project}/locations/{ZONE}/queuedResources/{case}"
            with contextlib.suppress(exceptions.NotFound):
                client.delete_queued_resource(request={"name": name, "force": True})
        emulator.admin.reservation(reservation, remove=True)
    if update_goldens:
        for case, body in seen.items():
            recorded["cases"][case]["body"] = body
        recorded["gcloud"] = _json(gcloud("version", "--format=json"))["Google Cloud SDK"]
        BODIES.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    for case, body in seen.items():
        assert body == recorded["cases"][case]["body"], f"{case}: gcloud sends another body"
    for case in seen:
        wait_until(
            lambda case=case: _gone(
                client, f"projects/{project}/locations/{ZONE}/queuedResources/{case}"
            ),
            f"{case} to be deleted",
        )


def test_the_recorded_bodies_fit_the_discovery_documents() -> None:
    """Every recorded body is a valid QueuedResource of its API version (gcloud's own check
    of the flags aside), so comparing tpuctl's with them compares against the API."""
    from tests.emulator.discovery import problems

    recorded = json.loads(BODIES.read_text())
    for case, spec in recorded["cases"].items():
        version = "v2" if spec["track"] == "ga" else "v2alpha1"
        assert spec["body"], f"{case}: no body recorded (run with --update-goldens)"
        assert problems(version, "QueuedResource", spec["body"], case) == []
