"""The checkpoint bucket: exists, is in the slices' region, and the VMs can write to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.jobs.doctor.checks import (
    Check,
    Inputs,
    blocked,
    noted,
    passed,
    warned,
)
from tpuctl.plan import judge_bucket, region_of
from tpuctl.spec.model import Spec

# ------------------------------------------------------------------------------ bucket


def service_account_of(spec: Spec, project_number: str | None) -> str | None:
    """The account the TPU VMs run as: the spec's, else the Compute Engine default."""
    if spec.tpu.service_account:
        return spec.tpu.service_account
    if project_number:
        return f"{project_number}-compute@developer.gserviceaccount.com"
    return None


def bucket_checks(
    inputs: Inputs, project_number: Callable[[], str | None], zones: Sequence[str] = ()
) -> list[Check]:
    """The checkpoint bucket exists, is in the slices' region (in each of `zones`, else the
    zone asked about), and the VMs can write to it."""
    from tpuctl.storage.gcs import bucket_metadata
    from tpuctl.worker import checkpoint_root

    root = checkpoint_root(inputs.spec)
    if not root or not root.startswith("gs://"):
        what = "no checkpoint.dir" if not root else f"checkpoint.dir {root} is on the workers"
        return [noted("bucket", f"{what}: no bucket to check")]
    name = root.removeprefix("gs://").split("/", 1)[0]
    bucket = f"gs://{name}"
    try:
        location, location_type, data_locations = bucket_metadata(name)
    except TpuctlError as error:
        if error.exit_code == ExitCode.NOT_FOUND:
            region = region_of(inputs.zone)
            return [
                blocked(
                    "bucket",
                    f"{bucket} does not exist",
                    f"gcloud storage buckets create {bucket} --location {region} "
                    f"--project {inputs.project}",
                )
            ]
        return [warned("bucket", f"cannot read {bucket}: {error.message}", error.hint)]
    checks = [passed("bucket", f"{bucket} exists")]
    for zone in zones or (inputs.zone,):
        placement = judge_bucket(
            bucket,
            zone,
            location=location,
            location_type=location_type,
            data_locations=data_locations,
        )
        where = f" in {zone}" if len(zones) > 1 else ""
        checks.append(replace(_placement_check(bucket, location, placement, where), zone=zone))
    checks.append(_write_check(inputs, name, project_number()))
    return checks


def _placement_check(bucket: str, location: str | None, placement: Any, where: str) -> Check:
    """`where`: " in ZONE" when the run may queue in several zones."""
    if placement.ok:
        return passed("bucket-region", f"{bucket} is in {location}, with the slices{where}")
    return blocked(
        "bucket-region",
        f"{bucket} is in {location}, the slices{where} in {placement.region}: every save and "
        "restore would cross regions",
        f"use a bucket in {placement.region} (gcloud storage buckets create gs://NAME "
        f"--location {placement.region})",
    )


def _write_check(inputs: Inputs, name: str, project_number: str | None) -> Check:
    from tpuctl.storage.gcs import missing_permissions

    bucket = f"gs://{name}"
    emulated = bool(inputs.environ.get("STORAGE_EMULATOR_HOST", "").strip())
    account = service_account_of(inputs.spec, project_number)
    if account is None and not emulated:
        return warned(
            "bucket-write",
            f"cannot name the VMs' service account to test {bucket} with (the Compute Engine "
            "default needs the project number, from Service Usage)",
            "set tpu.service_account in the spec",
        )
    who = account or "the VMs' service account"
    credentials = inputs.credentials if emulated else _acting_as(inputs.credentials, account)
    try:
        missing = missing_permissions(name, credentials, project=inputs.project)
    except TpuctlError as error:
        if error.exit_code == ExitCode.NOT_FOUND:  # the bucket exists: the call is unanswered
            reason = "the storage endpoint does not answer testIamPermissions"
        else:
            reason = error.message
        return warned(
            "bucket-write",
            f"cannot test {who}'s access to {bucket}: {reason}",
            None if emulated else f"grant yourself roles/iam.serviceAccountTokenCreator on {who}",
        )
    if missing:
        return blocked(
            "bucket-write",
            f"{who} lacks {', '.join(missing)} on {bucket}",
            f"gcloud storage buckets add-iam-policy-binding {bucket} --member "
            f"serviceAccount:{account or 'SERVICE_ACCOUNT'} --role roles/storage.objectUser",
        )
    return passed("bucket-write", f"{who} can write, read, list and delete in {bucket}")


def _acting_as(credentials: Any, account: str | None) -> Any:
    """Credentials of the VMs' service account, minted from the caller's (testIamPermissions
    answers for whoever calls it)."""
    from google.auth import impersonated_credentials

    from tpuctl.spec.model import CLOUD_PLATFORM_SCOPE

    return impersonated_credentials.Credentials(  # type: ignore[no-untyped-call]
        source_credentials=credentials,
        target_principal=account,
        target_scopes=[CLOUD_PLATFORM_SCOPE],
        lifetime=300,
    )
