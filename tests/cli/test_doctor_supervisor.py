"""`tpuctl doctor SPEC --as-supervisor`: every permission a reconcile step needs, asked with
testIamPermissions of the project (Resource Manager), the checkpoint bucket (Cloud Storage) and
the VMs' service account (IAM), against local fakes spoken to over real HTTP; one line per
missing permission with the role that grants it, exit 2 while any blocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_output_contract import check as check_contract
from tests.cloud_fakes import GcsFake, IamFake, gcs_server, iam_server
from tests.harness import Project, unique
from tests.support import Outcome
from tpuctl.jobs.doctor.supervisor import PROJECT_PERMISSIONS, SSH_PERMISSIONS

pytestmark = pytest.mark.emulator

SUPERVISOR = "supervisor@my-project.iam.gserviceaccount.com"
VMS = "trainer@my-project.iam.gserviceaccount.com"
TPU = {p.name for p in PROJECT_PERMISSIONS} | {p.name for p in SSH_PERMISSIONS}
OBJECTS = {f"storage.objects.{verb}" for verb in ("create", "get", "list", "delete")}


@pytest.fixture
def fakes() -> Iterator[tuple[IamFake, GcsFake, dict[str, str]]]:
    iam, gcs = IamFake(), GcsFake()
    with iam_server(iam) as iam_url, gcs_server(gcs) as gcs_url:
        env = {
            "TPUCTL_RESOURCE_MANAGER_ENDPOINT": iam_url,
            "TPUCTL_IAM_ENDPOINT": iam_url,
            "STORAGE_EMULATOR_HOST": gcs_url,
        }
        yield iam, gcs, env


def write(project: Project, *, checkpoint: str | None = "gs://state-bucket/runs") -> Path:
    document: dict[str, Any] = {
        "name": unique("sup"),
        "tpu": {"accelerator": "v4-8", "runtime": "tpu-ubuntu2204-base", "service_account": VMS},
    }
    if checkpoint:
        document["checkpoint"] = {"dir": checkpoint}
    return project.write_spec(document)


def doctor(project: Project, spec: Path, env: dict[str, str], *more: str) -> Outcome:
    args = ["doctor", str(spec), "--as-supervisor", "--impersonate-service-account", SUPERVISOR]
    return project.cli(*args, *more, "--format", "json", env=env)


def lines(outcome: Outcome, name: str) -> list[dict[str, Any]]:
    return [check for check in outcome.json()["checks"] if check["name"] == name]


def test_a_supervisor_with_every_permission_passes(
    project: Project, fakes: tuple[IamFake, GcsFake, dict[str, str]]
) -> None:
    iam, gcs, env = fakes
    iam.projects[project.name] = set(TPU)
    iam.accounts[VMS] = {"iam.serviceAccounts.actAs"}
    gcs.buckets["state-bucket"] = ("US-CENTRAL2", set(OBJECTS))
    spec = write(project)
    outcome = doctor(project, spec, env)
    assert outcome.exit_code == 0, outcome.stderr
    check_contract(outcome.json(), "doctor")
    (tpu,) = lines(outcome, "project-iam")
    assert tpu["ok"] and tpu["message"] == (
        f"{SUPERVISOR} holds the 8 TPU permissions a reconcile step uses on project {project.name}"
    )
    assert lines(outcome, "bucket-iam")[0]["ok"]
    (act_as,) = lines(outcome, "act-as")
    assert act_as["message"] == f"{SUPERVISOR} may create VMs that run as {VMS}"
    # What was asked, of whom: the documented list, exactly.
    asked = dict(iam.asked)
    assert asked[f"projects/{project.name}"] == [
        "tpu.queuedResources.create",
        "tpu.queuedResources.get",
        "tpu.queuedResources.list",
        "tpu.queuedResources.delete",
        "tpu.nodes.get",
        "tpu.nodes.list",
        "tpu.operations.get",
        "tpu.nodes.update",
    ]
    assert asked[f"serviceAccounts/{VMS}"] == ["iam.serviceAccounts.actAs"]


def test_each_missing_permission_is_one_line_with_its_role(
    project: Project, fakes: tuple[IamFake, GcsFake, dict[str, str]]
) -> None:
    iam, gcs, env = fakes
    iam.projects[project.name] = TPU - {"tpu.queuedResources.delete", "tpu.operations.get"}
    iam.accounts[VMS] = set()
    gcs.buckets["state-bucket"] = ("US-CENTRAL2", OBJECTS - {"storage.objects.delete"})
    spec = write(project)
    outcome = doctor(project, spec, env)
    assert outcome.exit_code == 2
    document = outcome.json()
    assert (document["ok"], document["blocking"]) == (False, 4)
    tpu = lines(outcome, "project-iam")
    assert [line["message"].split(":")[0] for line in tpu] == [
        f"{SUPERVISOR} lacks tpu.queuedResources.delete on project {project.name}",
        f"{SUPERVISOR} lacks tpu.operations.get on project {project.name}",
    ]
    assert tpu[0]["fix"].startswith("grant roles/tpu.admin")
    assert tpu[0]["fix"].endswith(
        f"gcloud projects add-iam-policy-binding {project.name} --member "
        f"serviceAccount:{SUPERVISOR} --role roles/tpu.admin"
    )
    (bucket,) = lines(outcome, "bucket-iam")
    assert bucket["message"].startswith(
        f"{SUPERVISOR} lacks storage.objects.delete on gs://state-bucket"
    )
    assert bucket["fix"] == (
        f"gcloud storage buckets add-iam-policy-binding gs://state-bucket --member "
        f"serviceAccount:{SUPERVISOR} --role roles/storage.objectUser"
    )
    (act_as,) = lines(outcome, "act-as")
    assert act_as["fix"] == (
        f"gcloud iam service-accounts add-iam-policy-binding {VMS} --member "
        f"serviceAccount:{SUPERVISOR} --role roles/iam.serviceAccountUser"
    )
    assert outcome.stderr.startswith(
        f"error: project-iam: {SUPERVISOR} lacks tpu.queuedResources.delete"
    )
    table = project.cli(
        "doctor", str(spec), "--as-supervisor", "--impersonate-service-account", SUPERVISOR,
        env=env,
    )  # fmt: skip
    marked = [line for line in table.stdout.splitlines() if line.startswith("✗")]
    assert len(marked) == 4, table.stdout


def test_ssh_permissions_block_only_without_worker_state_objects(
    project: Project, fakes: tuple[IamFake, GcsFake, dict[str, str]]
) -> None:
    iam, gcs, env = fakes
    iam.projects[project.name] = TPU - {"tpu.nodes.update"}
    iam.accounts[VMS] = {"iam.serviceAccounts.actAs"}
    gcs.buckets["state-bucket"] = ("US-CENTRAL2", set(OBJECTS))
    on_gcs = doctor(project, write(project), env)
    assert on_gcs.exit_code == 0, on_gcs.stderr
    (ssh,) = lines(on_gcs, "project-iam")
    assert (ssh["ok"], ssh["severity"]) == (False, "warning")
    assert ssh["message"].endswith("used only where a worker's state object is missing or stale")

    local = doctor(project, write(project, checkpoint=None), env)
    assert local.exit_code == 2
    (ssh,) = lines(local, "project-iam")
    assert (ssh["ok"], ssh["severity"]) == (False, "blocking")
    (state,) = lines(local, "state")
    assert "only a scheduler on this machine (cron, systemd) can supervise it" in state["message"]
    assert lines(local, "bucket-iam") == []


def test_unanswered_questions_warn_and_the_emulator_alone_skips(
    project: Project, fakes: tuple[IamFake, GcsFake, dict[str, str]]
) -> None:
    _iam, gcs, env = fakes  # no project or account granted anything: both answer 403
    gcs.buckets["state-bucket"] = ("US-CENTRAL2", set(OBJECTS))
    outcome = doctor(project, write(project), env)
    assert outcome.exit_code == 0, outcome.stderr
    (tpu,) = lines(outcome, "project-iam")
    assert (tpu["severity"], tpu["ok"]) == ("warning", False)
    assert tpu["message"].startswith(f"cannot test {SUPERVISOR}'s permissions on project")
    assert lines(outcome, "act-as")[0]["severity"] == "warning"

    bare = doctor(project, write(project), {"STORAGE_EMULATOR_HOST": env["STORAGE_EMULATOR_HOST"]})
    assert bare.exit_code == 0, bare.stderr
    assert lines(bare, "project-iam")[0]["message"] == (
        "skipped on the emulator (set TPUCTL_RESOURCE_MANAGER_ENDPOINT to ask one)"
    )
    assert lines(bare, "act-as")[0]["message"] == (
        "skipped on the emulator (set TPUCTL_IAM_ENDPOINT to ask one)"
    )
