"""`tpuctl doctor` and the preflight of create and up, against the session emulator (the TPU
API) and local fakes of Service Usage, Cloud Quotas, Cloud Storage and Compute Engine, each
spoken to by its real client library: every blocking case exits 2 with its fix on stderr."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.cli.test_output_contract import check as check_contract
from tests.cli.test_startup_imports import HEAVY, imported_by
from tests.cloud_fakes import (
    ComputeFake,
    GcsFake,
    QuotaFake,
    ServiceUsageFake,
    compute_server,
    gcs_server,
    quota_server,
    service_usage_server,
)
from tests.harness import ZONE, Project, unique
from tests.support import Outcome

pytestmark = pytest.mark.emulator

ACCOUNT = "trainer@my-project.iam.gserviceaccount.com"
ALL_OBJECT_PERMISSIONS = {
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
}


def write(project: Project, *, tpu: dict[str, Any] | None = None, **sections: Any) -> Path:
    document = {
        "name": unique("doc"),
        "tpu": {"accelerator": "v4-8", "runtime": "tpu-ubuntu2204-base", **(tpu or {})},
        "capacity": {"tier": "spot"},
        **sections,
    }
    return project.write_spec(document)


def checks_of(outcome: Outcome) -> dict[str, dict[str, Any]]:
    """The JSON result's checks by name (the first of each name)."""
    found: dict[str, dict[str, Any]] = {}
    for item in outcome.json()["checks"]:
        found.setdefault(item["name"], item)
    return found


def doctor(project: Project, spec: Path, env: dict[str, str] | None = None) -> Outcome:
    return project.cli("doctor", str(spec), "--format", "json", env=env)


@pytest.fixture
def gcs() -> Iterator[tuple[GcsFake, str]]:
    fake = GcsFake()
    with gcs_server(fake) as url:
        yield fake, url


def test_a_sound_spec_passes_and_matches_the_documented_shape(project: Project) -> None:
    spec = write(project)
    outcome = doctor(project, spec)
    assert outcome.exit_code == 0, outcome.stderr
    document = outcome.json()
    check_contract(document, "doctor")
    assert (document["ok"], document["blocking"], document["emulator"]) == (True, 0, True)
    checks = checks_of(outcome)
    assert checks["accelerator"]["ok"] and "v4-8 is offered in" in checks["accelerator"]["message"]
    assert checks["runtime"]["message"] == f"tpu-ubuntu2204-base is offered in {ZONE}"
    assert checks["credentials"]["message"] == "emulator: anonymous credentials"
    assert "skipped on the emulator" in checks["tpu-api"]["message"]
    assert "reservation" not in checks  # a spot spec needs none

    table = project.cli("doctor", str(spec))
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert any(line.startswith("✓") and " accelerator " in line for line in lines), lines
    assert lines[-1].startswith(f"ready: nothing blocks {spec.stem} in {project.name}/{ZONE}")
    assert table.stderr == ""


def test_an_unknown_runtime_blocks_with_the_closest_one(project: Project) -> None:
    spec = write(project, tpu={"runtime": "tpu-ubuntu2204-bsae"})
    outcome = project.cli("doctor", str(spec))
    assert outcome.exit_code == 2
    assert any(line.startswith("✗") and " runtime " in line for line in outcome.stdout.splitlines())
    assert outcome.stderr == (
        f"error: runtime: runtime version 'tpu-ubuntu2204-bsae' is not offered in {ZONE} "
        "(set tpu.runtime to tpu-ubuntu2204-base (the closest offered))\n"
    )
    as_json = doctor(project, spec)
    assert as_json.exit_code == 2
    assert (as_json.json()["ok"], as_json.json()["blocking"]) == (False, 1)


def test_a_missing_reservation_blocks_until_the_emulator_has_it(project: Project) -> None:
    spec = write(project, capacity={"tier": "reserved", "reservation": "doc-pool"})
    outcome = doctor(project, spec)
    assert outcome.exit_code == 2
    blocked = checks_of(outcome)["reservation"]
    assert blocked["message"] == f"no reservation 'doc-pool' in {project.name}/{ZONE}"
    assert "tier spot or on-demand" in blocked["fix"]
    assert "error: reservation: no reservation 'doc-pool'" in outcome.stderr

    name = f"projects/{project.name}/locations/{ZONE}/reservations/doc-pool"
    project.emulator.admin.reservation(name, chips=64, generation="v4")
    try:
        listed = project.api().list_reservations()
        assert [reservation.name for reservation in listed] == [name]
        outcome = doctor(project, spec)
        assert outcome.exit_code == 0, outcome.stderr
        assert checks_of(outcome)["reservation"]["message"] == (
            "reservation doc-pool is ACTIVE: 64 of 64 chips free, 4 needed"
        )
    finally:
        project.emulator.admin.reservation(name, remove=True)


def test_a_bucket_in_another_region_blocks(project: Project, gcs_bucket: str) -> None:
    # fake-gcs-server puts every bucket in US-CENTRAL1; the slices are in us-central2.
    spec = write(project, checkpoint={"dir": f"gs://{gcs_bucket}/runs"})
    outcome = doctor(project, spec)
    assert outcome.exit_code == 2
    checks = checks_of(outcome)
    assert checks["bucket"]["ok"]
    region = checks["bucket-region"]
    assert not region["ok"] and region["message"].startswith(
        f"gs://{gcs_bucket} is in US-CENTRAL1, the slices in us-central2"
    )
    assert region["fix"].startswith("use a bucket in us-central2")
    # fake-gcs-server answers no testIamPermissions: a warning, not a block.
    write_check = checks["bucket-write"]
    assert (write_check["ok"], write_check["severity"]) == (False, "warning")
    assert "does not answer testIamPermissions" in write_check["message"]
    assert outcome.stderr.startswith("error: bucket-region: ")


def test_every_zone_a_run_may_queue_in_is_checked(project: Project, gcs_bucket: str) -> None:
    spec = write(project, checkpoint={"dir": f"gs://{gcs_bucket}/runs"})
    text = spec.read_text(encoding="utf-8").replace(f"zone: {ZONE}\n", "")
    zoned = text.replace("capacity:\n", "capacity:\n  zones: [us-central1-a, us-central2-b]\n")
    spec.write_text(zoned, encoding="utf-8")
    outcome = doctor(project, spec, env={"TPUCTL_ZONE": "us-central1-a"})
    assert outcome.exit_code == 2
    checks = outcome.json()["checks"]
    offered = [item["message"] for item in checks if item["name"] == "accelerator"]
    assert [message.split(" (")[0] for message in offered] == [
        "v4-8 is offered in us-central1-a",
        "v4-8 is offered in us-central2-b",
    ]
    regions = [(item["ok"], item["message"]) for item in checks if item["name"] == "bucket-region"]
    assert regions == [
        (True, f"gs://{gcs_bucket} is in US-CENTRAL1, with the slices in us-central1-a"),
        (
            False,
            f"gs://{gcs_bucket} is in US-CENTRAL1, the slices in us-central2-b in us-central2: "
            "every save and restore would cross regions",
        ),
    ]


def test_a_bucket_the_service_account_cannot_write_blocks(
    project: Project, gcs: tuple[GcsFake, str]
) -> None:
    fake, url = gcs
    fake.buckets["ckpt-doc"] = ("US-CENTRAL2", {"storage.objects.get", "storage.objects.list"})
    spec = write(
        project, tpu={"service_account": ACCOUNT}, checkpoint={"dir": "gs://ckpt-doc/runs"}
    )
    env = {"STORAGE_EMULATOR_HOST": url}
    outcome = doctor(project, spec, env)
    assert outcome.exit_code == 2
    checks = checks_of(outcome)
    assert checks["bucket-region"]["ok"]
    assert checks["bucket-write"]["message"] == (
        f"{ACCOUNT} lacks storage.objects.create, storage.objects.delete on gs://ckpt-doc"
    )
    fix = (
        f"gcloud storage buckets add-iam-policy-binding gs://ckpt-doc --member "
        f"serviceAccount:{ACCOUNT} --role roles/storage.objectUser"
    )
    assert checks["bucket-write"]["fix"] == fix
    assert outcome.stderr.rstrip().endswith(f"({fix})")

    fake.buckets["ckpt-doc"] = ("US-CENTRAL2", ALL_OBJECT_PERMISSIONS)
    outcome = doctor(project, spec, env)
    assert outcome.exit_code == 0, outcome.stderr
    assert checks_of(outcome)["bucket-write"]["ok"]


def test_a_missing_bucket_blocks(project: Project, gcs: tuple[GcsFake, str]) -> None:
    _fake, url = gcs
    spec = write(project, checkpoint={"dir": "gs://no-such-bucket/runs"})
    outcome = doctor(project, spec, {"STORAGE_EMULATOR_HOST": url})
    assert outcome.exit_code == 2
    bucket = checks_of(outcome)["bucket"]
    assert bucket["message"] == "gs://no-such-bucket does not exist"
    assert bucket["fix"].startswith("gcloud storage buckets create gs://no-such-bucket")
    assert "--location us-central2" in bucket["fix"]


def test_a_disabled_tpu_api_blocks(project: Project, gcs: tuple[GcsFake, str]) -> None:
    fake = ServiceUsageFake(state="DISABLED")
    gcs_fake, url = gcs
    gcs_fake.buckets["ckpt-doc"] = ("US-CENTRAL2", ALL_OBJECT_PERMISSIONS)
    spec = write(project, checkpoint={"dir": "gs://ckpt-doc/runs"})
    with service_usage_server(fake) as host:
        env = {"TPUCTL_SERVICE_USAGE_ENDPOINT": host, "STORAGE_EMULATOR_HOST": url}
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 2
        assert fake.asked == [f"projects/{project.name}/services/tpu.googleapis.com"]
        assert outcome.stderr == (
            f"error: tpu-api: tpu.googleapis.com is DISABLED in project {project.name} "
            f"(gcloud services enable tpu.googleapis.com --project {project.name})\n"
        )
        # Enabled, it also names the Compute Engine default account from the project number.
        fake.state = "ENABLED"
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 0, outcome.stderr
        checks = checks_of(outcome)
        assert checks["tpu-api"]["ok"] and checks["tpu-api"]["severity"] == "blocking"
        account = "123456789012-compute@developer.gserviceaccount.com"
        assert checks["bucket-write"]["message"].startswith(f"{account} can write")
        # Unreadable is a warning, never a block.
        fake.refuse = grpc.StatusCode.PERMISSION_DENIED
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 0, outcome.stderr
        assert checks_of(outcome)["tpu-api"]["severity"] == "warning"
        assert "cannot name the VMs' service account" not in outcome.stdout  # the emulated GCS


def test_quota_below_the_need_blocks_and_unreadable_quota_warns(project: Project) -> None:
    spec = write(project, tpu={"accelerator": "v4-16", "slices": 2})  # 2 × 8 chips
    fake = QuotaFake({"tpu.googleapis.com/tpu-v4-preemptible": {ZONE: 8, "": 0}})
    with quota_server(fake) as host:
        env = {"TPUCTL_CLOUD_QUOTAS_ENDPOINT": host}
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 2
        quota = checks_of(outcome)["quota"]
        assert quota["message"] == (
            f"tpu.googleapis.com/tpu-v4-preemptible is 8 chips in {ZONE}; 2 × v4-16 needs 16"
        )
        fake.limits = {"tpu.googleapis.com/tpu-v4-preemptible": {"": 64}}
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 0, outcome.stderr
        assert checks_of(outcome)["quota"]["message"].startswith(
            "tpu.googleapis.com/tpu-v4-preemptible is 64 chips in every location, 16 needed"
        )
        fake.refuse = grpc.StatusCode.PERMISSION_DENIED
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 0, outcome.stderr
        quota = checks_of(outcome)["quota"]
        assert (quota["ok"], quota["severity"]) == (False, "warning")
        assert quota["message"].startswith("cannot read TPU quota: PERMISSION_DENIED")


def test_ssh_says_what_will_be_used(project: Project) -> None:
    spec = write(project)
    fake = ComputeFake(metadata={"enable-oslogin": "TRUE"})
    with compute_server(fake) as url:
        outcome = doctor(project, spec, {"TPUCTL_COMPUTE_ENDPOINT": url})
        assert outcome.exit_code == 0, outcome.stderr
        assert checks_of(outcome)["ssh"]["message"].startswith(
            "OS Login (enable-oslogin TRUE in project metadata)"
        )
        fake.metadata = {}
        outcome = doctor(project, spec, {"TPUCTL_COMPUTE_ENDPOINT": url})
        assert checks_of(outcome)["ssh"]["message"].startswith("ssh-keys in node metadata")
    # The node's own metadata wins over the project's.
    spec = write(project, tpu={"metadata": {"enable-oslogin": "FALSE"}})
    outcome = doctor(project, spec)
    assert checks_of(outcome)["ssh"]["message"].startswith(
        "ssh-keys in node metadata (the spec's tpu.metadata)"
    )


def test_create_and_up_run_the_preflight_first(project: Project) -> None:
    spec = write(
        project, tpu={"runtime": "tpu-ubuntu2204-bsae"}, job={"command": "python3 train.py"}
    )
    for command in ("create", "up"):
        outcome = project.cli(command, str(spec))
        assert outcome.exit_code == 2, (command, outcome.stderr)
        assert "runtime version 'tpu-ubuntu2204-bsae' is not offered" in outcome.stderr
        assert "or skip the checks with --no-preflight" in outcome.stderr
        assert not project.qr_exists(spec.stem)
    as_json = project.cli("create", str(spec), "--format", "json")
    error = as_json.json()["error"]
    assert (error["kind"], error["exit_code"], error["check"]) == ("preflight", 2, "runtime")
    # Skipped on purpose, the create goes through (the emulator does not check runtimes).
    skipped = project.cli("create", str(spec), "--no-preflight")
    assert skipped.exit_code == 0, skipped.stderr
    assert project.qr_exists(spec.stem)


def test_a_passing_preflight_says_so_once(project: Project) -> None:
    spec = write(project)
    outcome = project.cli("create", str(spec))
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stderr.count("preflight: ") == 1
    assert "checks passed" in outcome.stderr


def test_doctor_help_imports_no_heavy_module(tmp_path: Path) -> None:
    code, modules = imported_by(["doctor", "--help"], tmp_path)
    assert code == 0
    assert modules.isdisjoint(HEAVY), sorted(modules & set(HEAVY))


def test_a_preflight_with_warnings_does_not_count_them_as_passed(project: Project) -> None:
    """A check that could not be made is a warning: the closing line counts it apart from the
    checks that passed, so "N checks passed" never follows a "could not check"."""
    spec = write(project)
    usage = ServiceUsageFake(refuse=grpc.StatusCode.PERMISSION_DENIED)
    with service_usage_server(usage) as usage_host:
        env = {"TPUCTL_SERVICE_USAGE_ENDPOINT": usage_host}
        outcome = project.cli("create", str(spec), env=env)
        document = project.cli("doctor", str(spec), "--format", "json", env=env).json()
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stderr.splitlines()
    [closing] = [line for line in lines if line.startswith("preflight: ")]
    assert any(line.startswith("warning: tpu-api: cannot read") for line in lines)
    assert "1 could not be checked (warning above)" in closing, closing
    passed = int(closing.split("preflight: ", 1)[1].split(" ", 1)[0])
    assert passed == sum(c["ok"] and c["severity"] != "info" for c in document["checks"])


def _two_zones(project: Project, spec: Path) -> None:
    text = spec.read_text(encoding="utf-8").replace(f"zone: {ZONE}\n", "")
    zoned = text.replace("capacity:\n", "capacity:\n  zones: [us-central1-a, us-central2-b]\n")
    spec.write_text(zoned, encoding="utf-8")


def test_a_multi_zone_doctor_says_which_zone_each_row_is(project: Project) -> None:
    spec = write(project)
    _two_zones(project, spec)
    env = {"TPUCTL_ZONE": "us-central1-a"}
    outcome = doctor(project, spec, env)
    assert outcome.exit_code == 0, outcome.stderr
    checks = outcome.json()["checks"]
    zones = [(item["name"], item["zone"]) for item in checks if item["name"] == "quota"]
    assert zones == [("quota", "us-central1-a"), ("quota", "us-central2-b")]
    assert next(item for item in checks if item["name"] == "credentials")["zone"] is None

    table = project.cli("doctor", str(spec), env=env).stdout.splitlines()
    assert table[0].split() == ["CHECK", "ZONE", "RESULT"], table[0]
    quota = [line for line in table if " quota " in line]
    assert len(quota) == 2 and len(set(quota)) == 2, quota  # not two identical rows
    assert "us-central1-a" in quota[0] and "us-central2-b" in quota[1]
    single = project.cli("doctor", str(write(project))).stdout.splitlines()
    assert "ZONE" not in single[0].split(), single[0]  # one zone: it is in the verdict


def test_doctor_in_a_pipe_pads_no_line_to_the_longest_message(project: Project) -> None:
    long_dir = "/var/tmp/" + "/".join(["a-rather-long-directory-name"] * 10)
    spec = write(project, tpu={"runtime": "tpu-ubuntu2204-bsae"}, checkpoint={"dir": long_dir})
    outcome = project.cli("doctor", str(spec))
    assert outcome.exit_code == 2
    lines = outcome.stdout.splitlines()
    bucket = next(line for line in lines if " bucket " in line)
    assert long_dir in bucket and len(bucket) > 300  # the long message, whole
    credentials = next(line for line in lines if " credentials " in line)
    assert len(credentials) < 80, credentials  # not padded to the bucket's message
    assert not any(line.endswith(" ") for line in lines)
    runtime = lines.index(next(line for line in lines if line.startswith("✗")))
    fix = lines[runtime + 1]  # the fix, whole, under the row it mends
    assert fix.strip() == "fix: set tpu.runtime to tpu-ubuntu2204-base (the closest offered)"
    assert fix.index("fix:") == lines[0].index("RESULT")


COMPUTE_FAMILY = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


def write_compute(project: Project, **capacity: Any) -> Path:
    return write(
        project,
        tpu={"api": "compute", "accelerator": "v6e-4", "runtime": COMPUTE_FAMILY},
        capacity={"tier": "on-demand", **capacity},
    )


def test_a_compute_spec_checks_its_machine_type_image_and_reservation(project: Project) -> None:
    spec = write_compute(project, tier="reserved", reservation="tpu-pool")
    fake = ComputeFake(
        machine_types={ZONE: {"ct6e-standard-4t"}},
        families={"ubuntu-os-accelerator-images": {COMPUTE_FAMILY}},
        reservations={ZONE: {"tpu-pool": "READY"}},
    )
    with compute_server(fake) as url:
        env = {"TPUCTL_COMPUTE_ENDPOINT": url}
        outcome = doctor(project, spec, env)
        assert outcome.exit_code == 0, outcome.stderr
        found = checks_of(outcome)
        assert found.get("machine-type", {}).get("ok"), outcome.stdout
        assert (
            found["machine-type"]["ok"] and "ct6e-standard-4t" in found["machine-type"]["message"]
        )
        assert found["image"]["ok"] and COMPUTE_FAMILY in found["image"]["message"]
        assert found["reservation"]["ok"] and "READY" in found["reservation"]["message"]
        # None of the Cloud TPU API's checks: this spec's slices are Compute Engine's.
        assert "accelerator" not in found and "runtime" not in found

        fake.machine_types = {"us-east5-a": {"ct6e-standard-4t"}}
        missing = doctor(project, spec, env)
        assert missing.exit_code == 2
        blocked = checks_of(missing)["machine-type"]
        assert blocked["message"] == f"machine type ct6e-standard-4t is not offered in {ZONE}"
        assert "gcloud compute machine-types list" in blocked["fix"]

        fake.machine_types = {ZONE: {"ct6e-standard-4t"}}
        fake.reservations = {}
        assert checks_of(doctor(project, spec, env))["reservation"]["ok"] is False


def test_a_compute_spec_on_the_emulator_skips_what_its_compute_engine_lacks(
    project: Project,
) -> None:
    outcome = doctor(project, write_compute(project))
    assert outcome.exit_code == 0, outcome.stderr
    found = checks_of(outcome)
    assert found["machine-type"]["severity"] == "info"
    assert "has no machineTypes.get" in found["machine-type"]["message"]
    assert "could not check" not in outcome.stdout
