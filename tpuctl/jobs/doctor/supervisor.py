"""`tpuctl doctor SPEC --as-supervisor`: can the account a scheduler runs `tpuctl reconcile` as
take every step of the run? Its permissions on the project (Resource Manager's
testIamPermissions), on the checkpoint bucket (Cloud Storage's) and, when the spec names the
VMs' service account, on that account (IAM's). One line per missing permission, with the role
that grants it."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.cloud.resolve import Location, is_emulator
from tpuctl.errors import TpuctlError
from tpuctl.jobs.doctor.checks import Check, blocked, noted, passed, warned
from tpuctl.jobs.doctor.run import Doctor, credentials_check
from tpuctl.spec.model import Spec

TPU_ROLE = "roles/tpu.admin"
BUCKET_ROLE = "roles/storage.objectUser"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"


@dataclass(frozen=True)
class Permission:
    """One permission a reconcile step uses, and what for."""

    name: str
    purpose: str


# What a step calls on the TPU API, on the run's project.
PROJECT_PERMISSIONS = (
    Permission(
        "tpu.queuedResources.create",
        "create the run's queued resource, and again after a preemption",
    ),
    Permission("tpu.queuedResources.get", "read the queued resource's state"),
    Permission("tpu.queuedResources.list", "find the runs tpuctl labelled (--all --project)"),
    Permission(
        "tpu.queuedResources.delete",
        "delete a finished, given-up or preempted run's queued resource",
    ),
    Permission(
        "tpu.nodes.get",
        "read the slices, their workers' addresses and host keys (guest attributes)",
    ),
    Permission("tpu.nodes.list", "list the slices of the run"),
    Permission("tpu.operations.get", "follow a create or a delete to its end"),
)
# Only for reaching workers over SSH: always without checkpoint.dir on gs://, else only where a
# worker's state object is missing or stale.
SSH_PERMISSIONS = (
    Permission(
        "tpu.nodes.update",
        "publish the supervisor's SSH key in the nodes' ssh-keys metadata (SSH to the workers)",
    ),
)
ACT_AS = "iam.serviceAccounts.actAs"


def run_supervisor_doctor(
    spec: Spec,
    location: Location,
    *,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Doctor:
    """The credentials, then every permission a reconcile step of `spec` needs, as the
    account in use (or `impersonate`)."""
    env = os.environ if environ is None else environ
    started = time.monotonic()
    result = Doctor(spec.name, location.project, location.zone, is_emulator(env))
    account = credentials_check(impersonate, env)
    result.checks.append(account.check)
    if account.credentials is None:
        result.checks.append(noted("remote checks", "skipped: no credentials to ask with"))
    else:
        asker = Asker(spec, location.project, account.credentials, impersonate, env)
        result.checks += asker.project_checks()
        result.checks += asker.bucket_checks()
        result.checks += asker.act_as_checks()
    result.elapsed_seconds = round(time.monotonic() - started, 3)
    result.tally()
    return result


@dataclass
class Asker:
    """Asks each testIamPermissions as the supervisor and words the answers."""

    spec: Spec
    project: str
    credentials: Any
    impersonate: str | None
    environ: Mapping[str, str]

    @property
    def who(self) -> str:
        member = self.member
        return "the supervisor's account" if member is None else member.split(":", 1)[1]

    @property
    def member(self) -> str | None:
        """The account as an IAM member, when the credentials say which it is."""
        if self.impersonate:
            return f"serviceAccount:{self.impersonate}"
        email = getattr(self.credentials, "service_account_email", None)
        if email and email != "default":
            return f"serviceAccount:{email}"
        account = getattr(self.credentials, "account", None)
        return f"user:{account}" if account else None

    @property
    def state_on_gcs(self) -> bool:
        directory = self.spec.checkpoint.dir
        return bool(directory and directory.startswith("gs://"))

    def _skipped(self, name: str, variable: str) -> Check | None:
        """On the emulator, a check whose API has no local server named is a note."""
        if is_emulator(self.environ) and not self.environ.get(variable, "").strip():
            return noted(name, f"skipped on the emulator (set {variable} to ask one)")
        return None

    def project_checks(self) -> list[Check]:
        from tpuctl.cloud.iam_rest import RESOURCE_MANAGER_ENV, IamError, project_missing

        skipped = self._skipped("project-iam", RESOURCE_MANAGER_ENV)
        if skipped is not None:
            return [skipped]
        wanted = (*PROJECT_PERMISSIONS, *SSH_PERMISSIONS)
        try:
            missing = set(
                project_missing(
                    self.project,
                    [permission.name for permission in wanted],
                    self.credentials,
                    environ=self.environ,
                )
            )
        except IamError as error:
            return [
                warned(
                    "project-iam",
                    f"cannot test {self.who}'s permissions on project {self.project}: "
                    f"{error.message}",
                    "enable cloudresourcemanager.googleapis.com, or check by hand "
                    "(docs/supervision.md lists the permissions)",
                )
            ]
        fix = (
            f"grant {TPU_ROLE} (or a custom role with the permissions in docs/supervision.md): "
            f"gcloud projects add-iam-policy-binding {self.project} "
            f"--member {self.member or 'MEMBER'} --role {TPU_ROLE}"
        )
        checks = [
            blocked("project-iam", self._lacks(p, f"project {self.project}"), fix)
            for p in PROJECT_PERMISSIONS
            if p.name in missing
        ]
        for permission in SSH_PERMISSIONS:
            if permission.name not in missing:
                continue
            if self.state_on_gcs:  # SSH only where a worker's state object is stale
                message = self._lacks(permission, f"project {self.project}") + (
                    ", used only where a worker's state object is missing or stale"
                )
                checks.append(warned("project-iam", message, fix))
            else:
                checks.append(blocked("project-iam", self._lacks(permission, "the project"), fix))
        if not missing:
            checks.append(
                passed(
                    "project-iam",
                    f"{self.who} holds the {len(wanted)} TPU permissions a reconcile step uses "
                    f"on project {self.project}",
                )
            )
        return checks

    def _lacks(self, permission: Permission, where: str) -> str:
        return f"{self.who} lacks {permission.name} on {where}: needed to {permission.purpose}"

    def bucket_checks(self) -> list[Check]:
        directory = self.spec.checkpoint.dir
        if not self.state_on_gcs:
            where = (
                f"checkpoint.dir {directory} is on the workers"
                if directory
                else ("no checkpoint.dir")
            )
            return [
                noted(
                    "state",
                    f"{where}: the run's journal and lease are in this user's state directory, "
                    "so only a scheduler on this machine (cron, systemd) can supervise it",
                )
            ]
        from tpuctl.storage.gcs import missing_permissions

        assert directory is not None
        name = directory.removeprefix("gs://").split("/", 1)[0]
        bucket = f"gs://{name}"
        try:
            # The objects' four permissions, the ones the VMs' account needs too.
            missing = missing_permissions(name, self.credentials, project=self.project)
        except TpuctlError as error:
            return [
                warned(
                    "bucket-iam",
                    f"cannot test {self.who}'s access to {bucket}: {error.message}",
                    error.hint,
                )
            ]
        fix = (
            f"gcloud storage buckets add-iam-policy-binding {bucket} "
            f"--member {self.member or 'MEMBER'} --role {BUCKET_ROLE}"
        )
        if missing:
            return [
                blocked(
                    "bucket-iam",
                    f"{self.who} lacks {permission} on {bucket}: needed to read and write the "
                    "run's journal, lease and workers' state objects",
                    fix,
                )
                for permission in missing
            ]
        return [
            passed(
                "bucket-iam",
                f"{self.who} can create, read, list and delete objects in {bucket} (the "
                "journal, the lease, the workers' state)",
            )
        ]

    def act_as_checks(self) -> list[Check]:
        """Creating a queued resource whose VMs run as a named service account needs
        actAs on that account."""
        from tpuctl.cloud.iam_rest import IAM_ENV, IamError, service_account_missing

        account = self.spec.tpu.service_account
        if not account:
            return []
        skipped = self._skipped("act-as", IAM_ENV)
        if skipped is not None:
            return [skipped]
        try:
            missing = service_account_missing(
                account, [ACT_AS], self.credentials, environ=self.environ
            )
        except IamError as error:
            return [warned("act-as", f"cannot test {ACT_AS} on {account}: {error.message}")]
        if missing:
            return [
                blocked(
                    "act-as",
                    f"{self.who} lacks {ACT_AS} on {account}: needed to create slices whose "
                    "VMs run as it",
                    f"gcloud iam service-accounts add-iam-policy-binding {account} "
                    f"--member {self.member or 'MEMBER'} --role {ACT_AS_ROLE}",
                )
            ]
        return [passed("act-as", f"{self.who} may create VMs that run as {account}")]
