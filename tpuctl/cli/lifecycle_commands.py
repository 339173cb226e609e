"""Lifecycle commands: create, status, list, wait, reset, delete; the logic is in tpuctl.cloud."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.completion import complete_target
from tpuctl.cli.context import app_context
from tpuctl.cli.doctor_commands import no_preflight_option, preflight
from tpuctl.cli.options import (
    DURATION,
    dry_run_option,
    impersonate_option,
    one_of_zone_zones,
    output_option,
    project_zone_options,
    run_zones_option,
    set_option,
    spec_argument,
    ssh_settings,
    target_argument,
    with_zones,
    worker_ssh_options,
    yes_option,
    zones_options,
)
from tpuctl.cli.output import emit
from tpuctl.cli.progress import WaitProgress
from tpuctl.cli.targets import (
    Target,
    api_of,
    connect_api,
    connect_target,
    connect_zones,
    load_spec_warned,
    resolve_location_for,
    resolve_target,
    up_command,
    warn_zone_errors,
)
from tpuctl.cli.views import lifecycle as views
from tpuctl.cloud.watcher import TARGETS
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.lifecycle import WaitOptions
    from tpuctl.cloud.results import CreateResult
    from tpuctl.spec.model import Spec

F = TypeVar("F", bound=Callable[..., Any])


def wait_options(func: F) -> F:
    options = [
        click.option(
            "--delete-on-interrupt",
            is_flag=True,
            default=False,
            help="On Ctrl-C, delete the queued resource instead of leaving it.",
        ),
        click.option(
            "--keep-on-timeout",
            is_flag=True,
            default=False,
            help="At a deadline, keep the queued resource (default: delete it).",
        ),
        click.option(
            "--provision-timeout",
            type=DURATION,
            default=None,
            help="Give up after this long in PROVISIONING (else the spec's deadlines.provision).",
        ),
        click.option(
            "--queue-timeout",
            type=DURATION,
            default=None,
            help="Give up after this long queueing (else the spec's deadlines.queue).",
        ),
        click.option(
            "--until",
            type=click.Choice(TARGETS),
            default="ACTIVE",
            show_default=True,
            help="The state to wait for.",
        ),
    ]
    for option in options:
        func = option(func)
    return func


def _wait_options(spec: Spec | None, **flags: Any) -> WaitOptions:
    """WaitOptions from wait_options' flags, the spec's deadlines filling what they leave."""
    from tpuctl.cloud.lifecycle import WaitOptions
    from tpuctl.cloud.watcher import WatchPolicy

    queue, provision = flags["queue_timeout"], flags["provision_timeout"]
    if spec is not None:
        if queue is None and spec.deadlines.queue is not None:
            queue = spec.deadlines.queue.total_seconds()
        if provision is None and spec.deadlines.provision is not None:
            provision = spec.deadlines.provision.total_seconds()
    policy = WatchPolicy(until=flags["until"], queue_timeout=queue, provision_timeout=provision)
    return WaitOptions(
        policy=policy,
        keep_on_timeout=flags["keep_on_timeout"],
        delete_on_interrupt=flags["delete_on_interrupt"],
    )


@click.command()
@spec_argument
@set_option
@project_zone_options
@run_zones_option
@impersonate_option
@click.option("--wait", "wait_after", is_flag=True, default=False, help="Then wait (see wait).")
@wait_options
@no_preflight_option
@dry_run_option
@output_option
def create(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    wait_after: bool,
    no_preflight: bool,
    dry_run: bool,
    **waiting: Any,
) -> None:
    """Create the queued resource SPEC describes; succeed if it already exists from this spec.

    A same-named queued resource from a different spec is an error listing what differs.
    With --wait, continue as `tpuctl wait` (deadlines, delete on give-up, Ctrl-C handling);
    with several zones (capacity.zones or --zones) it queues in them as capacity.zone_policy
    says, as `up` does, and says which zone it ended up in. Without --wait one zone is used:
    the one already holding it, else the first that accepts the create (a zone answering
    RESOURCE_EXHAUSTED created nothing, so the next is tried, with or without --wait). First
    the preflight checks (`tpuctl doctor`'s TPU API and bucket part) must pass: a blocking one
    is exit 2 with its fix.
    """
    from tpuctl.cloud.results import CreateResult
    from tpuctl.jobs.provision import create_request

    app = app_context()
    overrides = with_zones(overrides, one_of_zone_zones(zone, zones))
    spec = load_spec_warned(app, spec_path, overrides, creating=True)
    location = resolve_location_for(project, zone, spec)
    run_zones = (location.zone,) if zone else spec.zones or (location.zone,)
    request = create_request(spec, location)
    if dry_run:
        from tpuctl.render.request import request_as_dict

        app.info(f"dry run: would create {location.queued_resource_name(spec.name)}")
        result = CreateResult("dry_run", spec.name, request.request_id)
        compute = spec.tpu.api == "compute"  # Compute Engine's requests, in their order
        result.request = request.as_dict() if compute else request_as_dict(request)
        emit(result, views.create_view)
        return
    api = connect_api(location, impersonate, api_of(spec))
    if not no_preflight:
        preflight(app, spec, location, api, impersonate)
    options = _wait_options(spec, **waiting)
    result = _create(app, api, spec, request, zones=run_zones, options=options, wait=wait_after)
    result.zone = result.zone or location.zone
    state = f" ({result.queued_resource.state})" if result.queued_resource else ""
    where = f" in {result.zone}" if len(run_zones) > 1 else ""
    app.info(f"{'created' if result.action == 'created' else 'exists:'} {spec.name}{where}{state}")
    if spec.job is not None and spec.job.code and not spec.job.code.startswith("gs://"):
        app.info(
            f"note: job.code {spec.job.code} is local, so the job starts once it is delivered: "
            f"run `{up_command(spec_path, overrides, project, zone)}` (delivers it, then "
            "babysits the job)"
        )
    emit(result, views.create_view)


def _create(
    app: AppContext,
    api: TpuApi,
    spec: Spec,
    request: Any,
    *,
    zones: tuple[str, ...],
    options: WaitOptions,
    wait: bool,
) -> CreateResult:
    """Create (and with `wait` wait for) the queued resource, across `zones` when several."""
    from tpuctl.cloud import lifecycle

    if len(zones) > 1 or spec.claims_zone:
        from tpuctl.jobs.zone_choice import create_in_zones

        with WaitProgress(app, spec.name).shown() as progress:
            return create_in_zones(
                api, spec, zones, options, say=app.info, on_event=progress, wait=wait
            )
    if wait:
        with WaitProgress(app, spec.name).shown() as progress:
            return lifecycle.create_and_wait(api, request, options, on_event=progress)
    return lifecycle.create(api, request, delete_on_interrupt=options.delete_on_interrupt)


@click.command()
@target_argument
@project_zone_options
@impersonate_option
@click.option(
    "--jobs",
    "show_jobs",
    is_flag=True,
    default=False,
    help="Also read every worker's startup-script job over SSH (state, boot, pid, exit code, "
    "heartbeat age; JSON key jobs). The run name comes from SPEC, or NAME's tpuctl-run label.",
)
@worker_ssh_options
@output_option
def status(
    *,
    target: str,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    show_jobs: bool = False,
    **ssh: Any,
) -> None:
    """State of a queued resource (how long in it, who caused it, why it failed), its slices,
    nodes, health and every worker's addresses."""
    from tpuctl.cloud import queries

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    api = connect_target(app, resolved, impersonate)
    summary = queries.status(api, resolved.name)
    if show_jobs:
        from tpuctl.jobs.control import jobs_of

        settings = ssh_settings(app, **ssh)
        summary.jobs = jobs_of(api, summary, resolved.spec, settings, on_progress=app.info)
        if summary.state != "ACTIVE":
            app.warn(f"{resolved.name} is {summary.state}: no workers to read the job from")
    emit(summary, views.status_view)


@click.command("list")
@click.option("--all", "include_all", is_flag=True, default=False, help="Not only tpuctl's.")
@project_zone_options
@zones_options
@impersonate_option
@output_option
def list_command(
    *,
    include_all: bool,
    project: str | None,
    zone: str | None,
    zones: str | None,
    all_zones: bool,
    impersonate: str | None,
) -> None:
    """List tpuctl's queued resources in the zone (every one with --all).

    With --zones or --all-zones the zones are asked side by side and the table gets a ZONE
    column; a zone that cannot be listed is a warning, the others are still listed, and the
    command then exits with that zone's code (8 permission, 1 other errors; the highest of
    several).
    """
    from tpuctl.cloud import queries

    app = app_context()
    api, asked = connect_zones(project, zone, zones, all_zones, impersonate)
    result = queries.list_queued_resources(api, include_all=include_all, zones=asked)
    warn_zone_errors(app, result.zone_errors)
    emit(result, views.list_view)


@click.command()
@target_argument
@project_zone_options
@impersonate_option
@wait_options
@output_option
def wait(
    *,
    target: str,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    **waiting: Any,
) -> None:
    """Wait for a state (ACTIVE by default) with separate queueing and provisioning deadlines.

    At a deadline the queued resource is deleted (exit 4) unless --keep-on-timeout; FAILED
    exits 6, SUSPENDED or preempted 7; Ctrl-C prints the command that deletes it (exit 130).
    Deadlines count from when this wait first sees the phase.
    """
    from tpuctl.cloud import lifecycle

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    api = connect_target(app, resolved, impersonate, missing_ok=waiting["until"] == "DELETED")
    options = _wait_options(resolved.spec, **waiting)
    with WaitProgress(app, resolved.name).shown() as progress:
        result = lifecycle.wait(api, resolved.name, options, on_event=progress)
    emit(result, views.wait_view)


@click.command()
@click.argument("target", metavar="NAME", shell_complete=complete_target)
@project_zone_options
@impersonate_option
@click.option("--wait", "wait_after", is_flag=True, default=False, help="Wait until ACTIVE again.")
@click.option(
    "--timeout", type=DURATION, default=900.0, help="With --wait: give up after this long."
)
@output_option
def reset(
    *,
    target: str,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    wait_after: bool,
    timeout: float,
) -> None:
    """Reset (restart) every VM of an ACTIVE queued resource; the startup script runs again."""
    from tpuctl.cloud import lifecycle

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    api = connect_target(app, resolved, impersonate)
    with WaitProgress(app, resolved.name).shown() as progress:
        result = lifecycle.reset(
            api, resolved.name, wait_for_active=wait_after, timeout=timeout, on_event=progress
        )
    emit(result, views.reset_view)


@click.command()
@target_argument
@project_zone_options
@impersonate_option
@click.option("--force", is_flag=True, default=False, help="Delete its nodes too.")
@click.option(
    "--async", "no_wait", is_flag=True, default=False, help="Return once the delete is sent."
)
@click.option("--ignore-missing", is_flag=True, default=False, help="Succeed if it does not exist.")
@click.option(
    "--timeout", type=DURATION, default=600.0, help="Give up waiting for it to go after this."
)
@yes_option
@output_option
def delete(
    *,
    target: str,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    force: bool,
    no_wait: bool,
    ignore_missing: bool,
    timeout: float,
    yes: bool,
) -> None:
    """Delete a queued resource (--force: with its nodes) and wait until it is gone."""
    from tpuctl.cloud import lifecycle

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    if not yes:
        _confirm_delete(resolved, force)
    api = connect_api(resolved.location, impersonate, api_of(resolved.spec))
    if resolved.spec is not None:
        _stop_supervision(app, resolved)
    with WaitProgress(app, resolved.name).shown() as progress:
        if resolved.zones:  # a spec with several zones: wherever it is, in each that holds it
            result = lifecycle.delete_in_zones(
                api,
                resolved.name,
                resolved.zones,
                force=force,
                wait_until_gone=not no_wait,
                ignore_missing=ignore_missing,
                timeout=timeout,
                on_event=progress,
                on_progress=app.info,
            )
        else:
            result = lifecycle.delete(
                api,
                resolved.name,
                force=force,
                wait_until_gone=not no_wait,
                ignore_missing=ignore_missing,
                timeout=timeout,
                on_event=progress,
            )
    emit(result, views.delete_view)


def _stop_supervision(app: AppContext, resolved: Target) -> None:
    """A supervised run deleted by its spec is marked stopped first, so no supervisor (up, or
    a scheduler's reconcile) creates it again; `tpuctl up SPEC` starts it again."""
    from tpuctl.jobs.reconcile.store import RunStore

    assert resolved.spec is not None
    store = RunStore(resolved.spec, resolved.location.project, resolved.location.zone)
    try:
        if not store.journal.names():
            return  # never supervised: nothing to stop
        store.append(
            "run.stopped",
            f"{resolved.name}: stopped by tpuctl delete; tpuctl up starts it again",
            {"by": "tpuctl delete"},
        )
    except TpuctlError as error:
        app.warn(
            f"could not mark the run stopped in its journal ({error.message}): a supervisor "
            "may create it again"
        )
        return
    app.info(f"{resolved.name}: marked stopped in its journal, so no supervisor creates it again")


def _confirm_delete(resolved: Target, force: bool) -> None:
    zones = ",".join(resolved.zones) or resolved.location.zone
    where = f"{resolved.location.project}/{zones}"
    if not sys.stdin.isatty():
        raise UsageError(
            f"refusing to delete {resolved.name} in {where} without confirmation "
            "(stdin is not a terminal)",
            hint="pass --yes",
        )
    nodes = " and its nodes" if force else ""
    if not click.confirm(f"Delete queued resource {resolved.name}{nodes} in {where}?", err=True):
        raise TpuctlError(f"not deleted: {resolved.name}", hint="you declined")
