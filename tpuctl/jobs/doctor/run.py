"""Running the doctor: every check side by side (each zone's own), and the credentials."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.credentials import load_credentials
from tpuctl.cloud.resolve import Location, is_emulator
from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.jobs.doctor.access import firewall_check, ssh_check
from tpuctl.jobs.doctor.checks import (
    CHECK_THREADS,
    DOCTOR_RETRY_SECONDS,
    Check,
    Inputs,
    PreflightError,
    blocked,
    noted,
    passed,
    warned,
)
from tpuctl.jobs.doctor.compute import compute_checks
from tpuctl.jobs.doctor.storage import bucket_checks
from tpuctl.jobs.doctor.tpu import (
    accelerator_check,
    quota_check,
    reservation_checks,
    runtime_checks,
    service_check,
)
from tpuctl.spec.model import Spec


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
            if inputs.spec.tpu.api == "compute":  # its machine type, image and reservation
                groups.append(pool.submit(_zoned, "compute", compute_checks, where))
                continue
            groups.append(pool.submit(_zoned, "accelerator", accelerator_check, where))
            groups.append(pool.submit(_zoned, "runtime", runtime_checks, where))
            groups.append(pool.submit(_zoned, "reservation", reservation_checks, where))
            if not preflight:
                groups.append(pool.submit(_zoned, "quota", quota_check, where))
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


def _zoned(name: str, check: Callable[[Inputs], list[Check]], inputs: Inputs) -> list[Check]:
    """A check of one zone, each of its lines saying which."""
    return [replace(item, zone=inputs.zone) for item in _guarded(name, check, inputs)]


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
