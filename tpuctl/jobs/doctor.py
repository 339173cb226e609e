"""`tpuctl doctor`: what would stop a spec's run, found before money is spent. Read-only.

Each check is one line: the credentials and account; the TPU API enabled (Service Usage); the
accelerator type and runtime version offered in the zone and, for `tier: reserved`, the
reservation (TPU API); TPU quota for the tier (Cloud Quotas); the checkpoint bucket's existence,
region and the VMs' service account's access (Cloud Storage); how SSH will authenticate and
whether a firewall rule lets it in (Compute Engine). Independent reads run side by side.

`create` and `up` run the PREFLIGHT subset (TPU API and bucket) first. A check that cannot be
read is a warning, never a block: only a definite answer blocks.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from tpuctl.cloud.client import TpuApi, load_credentials
from tpuctl.cloud.resolve import Location, is_emulator
from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.plan import accelerator_of, judge_bucket, region_of
from tpuctl.spec.model import Spec
from tpuctl.topology import AcceleratorError, runtime_warning

Severity = Literal["blocking", "warning", "info"]
# A doctor rides out no outage: a read failing for this long is said, not waited for.
DOCTOR_RETRY_SECONDS = 10.0
CHECK_THREADS = 8


class PreflightError(TpuctlError):
    """A check that blocks the run (create and up refuse to spend money on it)."""

    exit_code = ExitCode.USAGE
    kind = "preflight"


@dataclass
class Check:
    """One line of the doctor: `ok` or not; how much it matters when not (`severity`); what
    was found (`message`); what to do (`fix`)."""

    name: str
    ok: bool
    severity: Severity
    message: str
    fix: str | None = None

    @property
    def blocks(self) -> bool:
        return not self.ok and self.severity == "blocking"

    @property
    def warns(self) -> bool:
        return not self.ok and not self.blocks


def passed(name: str, message: str, severity: Severity = "blocking") -> Check:
    return Check(name, True, severity, message)


def blocked(name: str, message: str, fix: str) -> Check:
    return Check(name, False, "blocking", message, fix)


def warned(name: str, message: str, fix: str | None = None) -> Check:
    return Check(name, False, "warning", message, fix)


def noted(name: str, message: str) -> Check:
    return Check(name, True, "info", message)


@dataclass
class Doctor(Result):
    """Kind `Doctor`: every check, in a fixed order; `ok` when none blocks the run."""

    KIND: ClassVar[str] = "Doctor"

    name: str
    project: str
    zone: str
    emulator: bool
    checks: list[Check] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    ok: bool = True
    blocking: int = 0
    warnings: int = 0

    def __post_init__(self) -> None:
        self.tally()

    def tally(self) -> None:
        self.blocking = sum(check.blocks for check in self.checks)
        self.warnings = sum(check.warns for check in self.checks)
        self.ok = self.blocking == 0

    @property
    def first_blocking(self) -> Check | None:
        return next((check for check in self.checks if check.blocks), None)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.USAGE

    def exit_error(self) -> TpuctlError | None:
        first = self.first_blocking
        if first is None:
            return None
        return PreflightError(f"{first.name}: {first.message}", hint=first.fix, check=first.name)


@dataclass
class Inputs:
    """What every check reads: the spec, where it runs, the TPU API, the credentials."""

    spec: Spec
    location: Location
    api: TpuApi
    credentials: Any
    environ: Mapping[str, str]

    @property
    def emulator(self) -> bool:
        return is_emulator(self.environ)

    @property
    def project(self) -> str:
        return self.location.project

    @property
    def zone(self) -> str:
        return self.location.zone


def run_doctor(
    spec: Spec,
    location: Location,
    connect: Callable[[], TpuApi],
    *,
    impersonate: str | None = None,
    preflight: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Doctor:
    """Every check (or, with `preflight`, the ones create and up run first), side by side."""
    env = os.environ if environ is None else environ
    started = time.monotonic()
    result = Doctor(spec.name, location.project, location.zone, is_emulator(env))
    account = credentials_check(impersonate, env)
    result.checks.append(account.check)
    if account.credentials is None:
        result.checks.append(noted("remote checks", "skipped: no credentials to ask with"))
    else:
        api = connect()
        inputs = Inputs(
            spec, location, api.with_retry(DOCTOR_RETRY_SECONDS), account.credentials, env
        )
        result.checks.extend(_remote_checks(inputs, preflight))
    result.elapsed_seconds = round(time.monotonic() - started, 3)
    result.tally()
    return result


def _remote_checks(inputs: Inputs, preflight: bool) -> list[Check]:
    with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="doctor") as pool:
        service: Future[tuple[list[Check], str | None]] = pool.submit(service_check, inputs)

        def project_number() -> str | None:
            return service.result()[1]

        groups: list[Future[list[Check]]] = []
        every_zone = zone_inputs(inputs)
        for where in every_zone:
            groups.append(pool.submit(_guarded, "accelerator", accelerator_check, where))
            groups.append(pool.submit(_guarded, "runtime", runtime_checks, where))
            groups.append(pool.submit(_guarded, "reservation", reservation_checks, where))
            if not preflight:
                groups.append(pool.submit(_guarded, "quota", quota_check, where))
        zones = [where.zone for where in every_zone]
        groups.append(pool.submit(_guarded, "bucket", bucket_checks, inputs, project_number, zones))
        if not preflight:
            groups.append(pool.submit(_guarded, "ssh", ssh_check, inputs))
            groups.append(pool.submit(_guarded, "firewall", firewall_check, inputs))
        checks = list(service.result()[0])
        for group in groups:
            checks.extend(group.result())
    return checks


def zone_inputs(inputs: Inputs) -> list[Inputs]:
    """The inputs of every zone the run may queue in (capacity.zones, when the zone asked
    about is one of them), each zone's checks asking that zone."""
    zones = inputs.spec.zones if inputs.zone in inputs.spec.zones else (inputs.zone,)
    return [
        inputs
        if zone == inputs.zone
        else replace(
            inputs,
            location=replace(inputs.location, zone=zone),
            api=inputs.api.in_zone(zone),
        )
        for zone in zones
    ]


def _guarded(name: str, check: Callable[..., list[Check]], *args: Any) -> list[Check]:
    """A check that fails unexpectedly is a warning naming why, never a crash of the doctor."""
    try:
        return check(*args)
    except TpuctlError as error:
        return [warned(name, f"could not check: {error.message}", error.hint)]
    except Exception as error:
        return [warned(name, f"could not check: {type(error).__name__}: {error}")]


# --------------------------------------------------------------------------- credentials


@dataclass
class Account:
    check: Check
    credentials: Any


def credentials_check(impersonate: str | None, environ: Mapping[str, str]) -> Account:
    if is_emulator(environ):
        return Account(noted("credentials", "emulator: anonymous credentials"), _anonymous())
    try:
        credentials = load_credentials(impersonate=impersonate, environ=environ)
    except TpuctlError as error:
        fix = error.hint or "run 'gcloud auth application-default login'"
        return Account(blocked("credentials", error.message, fix), None)
    return Account(passed("credentials", f"as {describe_account(credentials)}"), credentials)


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()  # type: ignore[no-untyped-call]


def describe_account(credentials: Any) -> str:
    """Who the credentials act as, as far as they say without a network call."""
    email = getattr(credentials, "service_account_email", None)
    if email and email != "default":
        return f"service account {email}"
    account = getattr(credentials, "account", None)
    if account:
        return f"user {account}"
    if email == "default":
        return "the VM's default service account (metadata server)"
    return f"{type(credentials).__name__} from Application Default Credentials"


# ------------------------------------------------------------------------- service usage


def service_check(inputs: Inputs) -> tuple[list[Check], str | None]:
    """The TPU API enabled for the project; the project's number (for the default service
    account) as a by-product."""
    from tpuctl.cloud.services import SERVICE_USAGE_ENV, endpoint_override, service_state

    name = "tpu-api"
    if inputs.emulator and endpoint_override(SERVICE_USAGE_ENV, inputs.environ) is None:
        return [noted(name, f"skipped on the emulator (set {SERVICE_USAGE_ENV} to ask one)")], None
    try:
        state = service_state(inputs.project, inputs.credentials, environ=inputs.environ)
    except Exception as error:
        return [
            warned(
                name,
                f"cannot read whether tpu.googleapis.com is enabled: {_api_reason(error)}",
                "grant serviceusage.services.get (roles/serviceusage.serviceUsageViewer)",
            )
        ], None
    if state.enabled:
        return [passed(name, f"tpu.googleapis.com is enabled in {inputs.project}")], (
            state.project_number
        )
    return [
        blocked(
            name,
            f"tpu.googleapis.com is {state.state} in project {inputs.project}",
            f"gcloud services enable tpu.googleapis.com --project {inputs.project}",
        )
    ], state.project_number


def _api_reason(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    code = getattr(error, "grpc_status_code", None) or getattr(error, "code", None)
    prefix = f"{getattr(code, 'name', code)}: " if code is not None else ""
    return f"{prefix}{' '.join(str(message).split())}"


# ------------------------------------------------------------------------------ TPU API


def accelerator_check(inputs: Inputs) -> list[Check]:
    spec = inputs.spec
    try:
        accelerator = accelerator_of(spec)
    except AcceleratorError as error:
        return [blocked("accelerator", str(error), "fix tpu.accelerator (tpuctl validate)")]
    wanted = accelerator.accelerator_type
    offered = inputs.api.get_accelerator_type(wanted)
    if offered is not None:
        topologies = sorted({config.topology for config in offered.accelerator_configs})
        shape = f" (topology {', '.join(topologies)})" if topologies else ""
        if spec.tpu.topology and topologies and spec.tpu.topology not in topologies:
            return [
                blocked(
                    "accelerator",
                    f"{wanted} is offered in {inputs.zone} with topology "
                    f"{', '.join(topologies)}, not {spec.tpu.topology}",
                    f"set tpu.topology to {topologies[0]}",
                )
            ]
        return [passed("accelerator", f"{wanted} is offered in {inputs.zone}{shape}")]
    same_family = [
        name
        for name in inputs.api.list_accelerator_types()
        if name.rpartition("-")[0] == wanted.rpartition("-")[0]
    ]
    fix = (
        f"use a type offered there ({_some(same_family)}) or another zone"
        if same_family
        else f"use another zone: {inputs.zone} offers no {accelerator.generation}"
    )
    return [blocked("accelerator", f"{wanted} is not offered in {inputs.zone}", fix)]


def _some(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


def runtime_checks(inputs: Inputs) -> list[Check]:
    runtime = inputs.spec.tpu.runtime
    offered = inputs.api.list_runtime_versions()
    if runtime not in offered:
        close = difflib.get_close_matches(runtime, offered, n=1, cutoff=0.6)
        fix = (
            f"set tpu.runtime to {close[0]} (the closest offered)"
            if close
            else f"set tpu.runtime to one of: {_some(sorted(offered), 12)}"
        )
        message = f"runtime version {runtime!r} is not offered in {inputs.zone}"
        return [blocked("runtime", message, fix)]
    checks = [passed("runtime", f"{runtime} is offered in {inputs.zone}")]
    try:
        mismatch = runtime_warning(accelerator_of(inputs.spec), runtime)
    except AcceleratorError:
        mismatch = None
    if mismatch:
        checks.append(warned("runtime", mismatch))
    return checks


def reservation_checks(inputs: Inputs) -> list[Check]:
    """For `tier: reserved`: the named reservation (or any) exists, is ACTIVE and has room."""
    spec = inputs.spec
    if spec.capacity.tier != "reserved":
        return []
    wanted = spec.capacity.reservation
    reservations = inputs.api.list_reservations()
    found = [r for r in reservations if wanted is None or _names(r.name, wanted)]
    where = f"{inputs.project}/{inputs.zone}"
    if not found:
        what = f"reservation {wanted!r}" if wanted else "TPU reservation"
        names = [r.name.rsplit("/", 1)[-1] for r in reservations]
        listed = f" (there: {_some(names)})" if names else ""
        fix = (
            f"set capacity.reservation to one of: {_some(names)}"
            if names
            else "ask Google for a reservation in this zone, or use tier spot or on-demand"
        )
        return [blocked("reservation", f"no {what} in {where}{listed}", fix)]
    reservation = found[0]
    short = reservation.name.rsplit("/", 1)[-1]
    state = type(reservation).State(reservation.state).name
    if state != "ACTIVE":
        return [warned("reservation", f"reservation {short} is {state}, not ACTIVE")]
    return [passed("reservation", _reservation_room(inputs.spec, short, reservation))]


def _names(name: str, wanted: str) -> bool:
    return name == wanted or name.rsplit("/", 1)[-1] == wanted.rsplit("/", 1)[-1]


def _reservation_room(spec: Spec, short: str, reservation: Any) -> str:
    standard = reservation.standard
    if not standard.size:
        return f"reservation {short} is ACTIVE"
    units = type(standard).CapacityUnits(standard.capacity_units).name.lower()
    accelerator = accelerator_of(spec)
    per_slice = accelerator.tensorcores if units == "cores" else accelerator.chips
    need = per_slice * spec.tpu.slices
    free = standard.size - standard.usage.total
    return f"reservation {short} is ACTIVE: {free} of {standard.size} {units} free, {need} needed"


# ------------------------------------------------------------------------------- quota


def quota_check(inputs: Inputs) -> list[Check]:
    from tpuctl.cloud.services import CLOUD_QUOTAS_ENV, endpoint_override, tpu_quota

    name = "quota"
    if inputs.emulator and endpoint_override(CLOUD_QUOTAS_ENV, inputs.environ) is None:
        return [noted(name, f"skipped on the emulator (set {CLOUD_QUOTAS_ENV} to ask one)")]
    spec = inputs.spec
    accelerator = accelerator_of(spec)
    tier = spec.capacity.tier
    try:
        limit = tpu_quota(
            inputs.project,
            inputs.zone,
            accelerator.generation,
            tier,
            inputs.credentials,
            environ=inputs.environ,
        )
    except Exception as error:
        return [
            warned(
                name,
                f"cannot read TPU quota: {_api_reason(error)}",
                "grant cloudquotas.quotas.get (roles/cloudquotas.viewer) to check it",
            )
        ]
    if limit is None:
        return [
            warned(
                name, f"no {accelerator.generation} {tier} TPU quota is listed for {inputs.zone}"
            )
        ]
    need = limit.needed(accelerator, spec.tpu.slices)
    if limit.limit is None:
        return [passed(name, f"{limit.metric}: no limit in {limit.applies_to}")]
    said = f"{limit.metric} is {limit.limit} {limit.unit} in {limit.applies_to}"
    if limit.limit < need:
        return [
            blocked(
                name,
                f"{said}; {spec.tpu.slices} × {accelerator.accelerator_type} needs {need}",
                "request more in the console's Quotas page "
                f"(https://console.cloud.google.com/iam-admin/quotas?project={inputs.project})",
            )
        ]
    return [passed(name, f"{said}, {need} needed (what other TPUs use is not counted)")]


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
        checks.append(_placement_check(bucket, location, placement, where))
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

    from tpuctl.cloud.client import CLOUD_PLATFORM_SCOPE

    return impersonated_credentials.Credentials(  # type: ignore[no-untyped-call]
        source_credentials=credentials,
        target_principal=account,
        target_scopes=[CLOUD_PLATFORM_SCOPE],
        lifetime=300,
    )


# --------------------------------------------------------------------------- SSH access


def _compute_reachable(inputs: Inputs) -> bool:
    from tpuctl.cloud.compute_rest import COMPUTE_ENV

    return not inputs.emulator or bool(inputs.environ.get(COMPUTE_ENV, "").strip())


def ssh_check(inputs: Inputs) -> list[Check]:
    """How SSH will authenticate: OS Login when node or project metadata turns it on (the
    node's own value wins), else keys in the node's ssh-keys metadata."""
    from tpuctl.cloud.compute_rest import COMPUTE_ENV, ComputeError, project_metadata
    from tpuctl.cloud.oslogin import OS_LOGIN, flag

    node = flag(inputs.spec.tpu.metadata.get(OS_LOGIN))
    if node is not None:
        return [_ssh_line(node, "the spec's tpu.metadata")]
    if not _compute_reachable(inputs):
        return [_ssh_line(False, f"the emulator without {COMPUTE_ENV}: project metadata unread")]
    try:
        project = project_metadata(inputs.project, inputs.credentials, environ=inputs.environ)
    except ComputeError as error:
        return [
            warned(
                "ssh",
                f"cannot read project metadata ({error.message}): assuming ssh-keys in node "
                "metadata, unless the project turns OS Login on",
                "grant compute.projects.get (roles/compute.viewer) to check it",
            )
        ]
    value = flag(project.get(OS_LOGIN))
    return [
        _ssh_line(bool(value), "project metadata" if value is not None else "no enable-oslogin set")
    ]


def _ssh_line(os_login: bool, source: str) -> Check:
    if os_login:
        return noted(
            "ssh",
            f"OS Login (enable-oslogin TRUE in {source}): the key goes to the OS Login profile",
        )
    return noted("ssh", f"ssh-keys in node metadata ({source}), key ~/.ssh/google_compute_engine")


def firewall_check(inputs: Inputs) -> list[Check]:
    """A rule that lets tcp:22 reach the VMs. tpuctl connects directly (it has no IAP tunnel),
    so any source counts; whether IAP's range is admitted is said too."""
    from tpuctl.cloud.compute_rest import IAP_RANGE, ComputeError, firewall_rules, ssh_path

    name = "firewall"
    if inputs.emulator:
        return [noted(name, "skipped on the emulator (it has no firewalls)")]
    tpu = inputs.spec.tpu
    network = (tpu.network or "default").rsplit("/", 1)[-1]
    try:
        rules = firewall_rules(inputs.project, inputs.credentials, environ=inputs.environ)
    except ComputeError as error:
        return [
            warned(
                name,
                f"cannot list firewall rules: {error.message}",
                "grant compute.firewalls.list (roles/compute.viewer) to check them",
            )
        ]
    path = ssh_path(rules, network, tpu.tags, tpu.service_account)
    if not path.rules:
        return [
            warned(
                name,
                f"no firewall rule on network {network} lets tcp:22 in to the TPU VMs",
                f"gcloud compute firewall-rules create allow-ssh --project {inputs.project} "
                f"--network {network} --direction INGRESS --allow tcp:22 "
                "--source-ranges YOUR_IP/32",
            )
        ]
    iap = "admitted" if path.iap else "not admitted (tpuctl does not tunnel through IAP)"
    sources = ", ".join(path.sources) or "no source ranges"
    return [
        passed(
            name,
            f"tcp:22 on {network} open by {', '.join(path.rules)} from {sources}; IAP's "
            f"{IAP_RANGE} {iap}; deny rules not weighed",
            "warning",
        )
    ]
