"""`tpuctl doctor SPEC`, and the preflight create and up run before they spend money; the
checks are in tpuctl.jobs.doctor."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.options import (
    impersonate_option,
    output_option,
    project_zone_options,
    set_option,
    spec_argument,
)
from tpuctl.cli.output import emit
from tpuctl.cli.targets import api_of, connect_api, load_spec_warned, resolve_location_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.resolve import Location
    from tpuctl.jobs.doctor.checks import Check
    from tpuctl.spec.model import Spec

F = TypeVar("F", bound=Callable[..., Any])


def no_preflight_option(func: F) -> F:
    return click.option(
        "--no-preflight",
        "no_preflight",
        is_flag=True,
        default=False,
        help="Skip the preflight checks (the TPU API and bucket part of `tpuctl doctor`).",
    )(func)


@click.command()
@spec_argument
@set_option
@project_zone_options
@impersonate_option
@click.option(
    "--as-supervisor",
    is_flag=True,
    default=False,
    help="Check instead that the account in use (or the impersonated one) may run every "
    "`tpuctl reconcile` step of the run: TPU permissions on the project, object permissions on "
    "the checkpoint bucket, actAs on the VMs' service account (testIamPermissions).",
)
@output_option
def doctor(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    as_supervisor: bool,
) -> None:
    """Check, read-only and before any money is spent, what would stop SPEC's run.

    \b
    One line per check, ✓ passed, ✗ blocks the run (with the fix), ! a warning, - a note:
    - credentials and the account in use; the TPU API enabled (Service Usage)
    - the accelerator type and runtime version offered in the zone; for tier reserved,
      the reservation (TPU API)
    - TPU quota for the chips the spec needs, per tier (Cloud Quotas; unreadable: a warning)
    - the checkpoint bucket: exists, in the slices' region, and the VMs' service account
      (tpu.service_account, else the Compute Engine default) can write to it
    - SSH: metadata keys or OS Login, and a firewall rule for tcp:22
    With --as-supervisor: one line per permission a reconcile step needs and the account
    lacks, with the role that grants it (docs/supervision.md).
    Exit 0 when nothing blocks the run, else 2 with the first blocking check's fix on stderr.
    """
    from tpuctl.cli.views.doctor import doctor_view
    from tpuctl.jobs.doctor import run_doctor, run_supervisor_doctor

    app = app_context()
    spec = load_spec_warned(app, spec_path, overrides)
    location = resolve_location_for(project, zone, spec)
    if as_supervisor:
        emit(run_supervisor_doctor(spec, location, impersonate=impersonate), doctor_view)
        return
    result = run_doctor(
        spec,
        location,
        lambda: connect_api(location, impersonate, api_of(spec)),
        impersonate=impersonate,
    )
    emit(result, doctor_view)


def preflight(
    app: AppContext, spec: Spec, location: Location, api: TpuApi, impersonate: str | None
) -> None:
    """The checks create and up run first: warnings said on stderr, the first blocking one
    raised (exit 2, with its fix)."""
    from tpuctl.jobs.doctor import run_doctor

    result = run_doctor(spec, location, lambda: api, impersonate=impersonate, preflight=True)
    for check in result.checks:
        if check.warns:
            app.warn(f"{check.name}: {check.message}" + (f" ({check.fix})" if check.fix else ""))
    error = result.exit_error()
    if error is not None:
        error.hint = f"{error.hint}; or skip the checks with --no-preflight"
        raise error
    app.info(f"preflight: {preflight_count(result.checks)} in {result.elapsed_seconds:.1f} s")


def preflight_count(checks: Sequence[Check]) -> str:
    """The preflight's closing count: what passed, apart from what could not be checked
    (warned above) and what was only noted (skipped, or what will be used)."""
    passed = sum(check.ok and check.severity != "info" for check in checks)
    warned = sum(check.warns for check in checks)
    noted = sum(check.ok and check.severity == "info" for check in checks)
    parts = [f"{passed} check{'s' if passed != 1 else ''} passed"]
    if warned:
        parts.append(f"{warned} could not be checked (warning{'s' if warned != 1 else ''} above)")
    if noted:
        parts.append(f"{noted} noted")
    return ", ".join(parts)
