"""Job commands: up (the babysitter), drill (rehearse a disruption), report (timeline, goodput)
and checkpoints (what a restart resumes from). The logic is in tpuctl.jobs and tpuctl.storage."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.completion import complete_spec_path
from tpuctl.cli.context import app_context
from tpuctl.cli.options import (
    DURATION,
    impersonate_option,
    output_option,
    pop_worker_ssh,
    project_zone_options,
    set_option,
    ssh_settings,
    target_argument,
    worker_ssh_options,
)
from tpuctl.cli.output import emit
from tpuctl.cli.progress import interrupts
from tpuctl.cli.targets import (
    connect_api,
    connect_target,
    is_spec_path,
    load_spec_warned,
    resolve_target,
)
from tpuctl.cli.views import jobs as views
from tpuctl.errors import UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.fanout.operations import Fleet, SshSettings
    from tpuctl.jobs.adapters import JournalLike
    from tpuctl.spec.model import Spec


def fleet_factory(
    app: AppContext, api: TpuApi, name: str, settings: SshSettings
) -> Callable[..., Fleet]:
    """The workers of `name`, in `zone` when given (a run that moved zones), else the api's."""

    def make(zone: str | None = None) -> Fleet:
        from tpuctl.jobs.fleet import prepare_fleet

        where = api.in_zone(zone) if zone and zone != api.location.zone else api
        return prepare_fleet(where, name, settings, on_progress=app.info, on_warning=app.warn)

    return make


def _journal(app: AppContext, spec: Spec | None) -> JournalLike | None:
    """The run's journal in shared storage; None (with a warning) when it cannot be kept."""
    if spec is None:
        return None
    from tpuctl.storage.journal import Journal

    journal = Journal(spec)
    if not journal.enabled:
        app.warn(
            "the spec has no checkpoint.dir: decisions are not journaled, so tpuctl report "
            "will have nothing to show"
        )
        return None
    return journal


def stamped(app: AppContext) -> Callable[[Any], None]:
    """Each event as `RFC3339 message` on stderr."""
    from tpuctl.clock import rfc3339

    def say(event: Any) -> None:
        app.info(f"{rfc3339(event.at)} {event.message}")

    return say


@click.command()
@target_argument
@set_option
@click.option(
    "--kind",
    type=click.Choice(["maintenance", "preempt", "slice-failure"]),
    default="maintenance",
    show_default=True,
    help="The disruption: maintenance (SimulateMaintenanceEvent), or, on the emulator only, "
    "a spot preemption or one slice's hardware failure.",
)
@click.option("--worker", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--slice",
    "slice_index",
    type=click.IntRange(min=0),
    default=None,
    help="The slice to disrupt (maintenance: 0; slice-failure: the last one).",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=600.0,
    show_default=True,
    help="Give up (exit 4) when the job is not back within this long.",
)
@click.option(
    "--external-recovery",
    is_flag=True,
    default=False,
    help="After a preemption, wait for a running `tpuctl up` to recreate the queued resource "
    "instead of doing it here (a job that finishes before the drill sees it run again is an "
    "error: drill a longer one).",
)
@click.option(
    "--step-pattern",
    default=None,
    metavar="REGEX",
    help="How a step shows in the job log; group 1 is the step "
    r"(default: 'step N/' or 'completed step: N').",
)
@worker_ssh_options
@project_zone_options
@impersonate_option
@output_option
def drill(
    *,
    target: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    slice_index: int | None,
    **choices: Any,
) -> None:
    """Rehearse a disruption on a running job and check nothing was lost beyond what it allows.

    \b
    Records the latest checkpoint and the step worker 0 logged, triggers the event, waits
    until every worker runs a new boot of the job, and reports: the step reached when the
    event hit, whether a checkpoint exists at that step (autocheckpoint), the step the job
    resumed from, and how many steps were recomputed. Preempt and slice-failure exist only on
    the emulator (exit 2 against Cloud TPU). After a preemption the drill recreates the
    queued resource itself, unless --external-recovery.

    \b
    Exit 0 when nothing was lost beyond what the event allows: maintenance with
    autocheckpoint, 0 steps (and a checkpoint at the event step); otherwise at most the steps
    since the last checkpoint before the event. Exit 1 with the numbers otherwise; 4 when the
    job is not back within --timeout.
    """
    from tpuctl.cloud.resolve import EMULATOR_ENV, is_emulator
    from tpuctl.jobs.adapters import ApiQueuedResource
    from tpuctl.jobs.drill import Drill, DrillOptions, check_kind

    app = app_context()
    check_kind(choices["kind"], on_emulator=is_emulator())  # before any credentials are needed
    resolved = resolve_target(app, target, project, zone, overrides)
    api = connect_target(app, resolved, impersonate)
    admin: Any = None
    if is_emulator():
        from tpuctl.emulator.client.admin import AdminClient

        admin = AdminClient(os.environ[EMULATOR_ENV])
        if api.api == "compute":
            admin = ComputeAdmin(admin, api)
    settings = ssh_settings(app, **pop_worker_ssh(choices))
    runner = Drill(
        ApiQueuedResource(api, resolved.spec, resolved.name),
        resolved.spec,
        fleet_factory=fleet_factory(app, api, resolved.name, settings),
        options=DrillOptions(slice=slice_index, **choices),
        admin=admin,
        journal=_journal(app, resolved.spec),
        on_event=stamped(app),
    )
    with interrupts():
        report = runner.run()
    emit(report, views.drill_view)


class ComputeAdmin:
    """A drill's emulator calls for a Compute Engine slice: a preemption is the Compute
    Engine fake's, of the run's instance or of every VM of its MIG."""

    def __init__(self, admin: Any, api: TpuApi) -> None:
        self.admin = admin
        self.api = api

    def preempt(self, queued_resource: str) -> dict[str, Any]:
        location = self.api.location
        name = queued_resource.rsplit("/", 1)[-1]
        found = self.api.client.find_slice(location.project, location.zone, name)
        kind = "instances" if found is None or found.group is None else "instanceGroupManagers"
        target = f"projects/{location.project}/zones/{location.zone}/{kind}/{name}"
        result: dict[str, Any] = self.admin.compute_preempt(target)
        return result

    def fail_slice(self, queued_resource: str, slice_index: int) -> dict[str, Any]:
        raise UsageError(
            "the emulator's Compute Engine has no slice failure to inject",
            hint="use --kind preempt or --kind maintenance on a tpu.api: compute spec",
        )


@click.command()
@target_argument
@set_option
@project_zone_options
@impersonate_option
@output_option
def report(
    *,
    target: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    impersonate: str | None,
) -> None:
    """The job's timeline as tpuctl saw it, and its infrastructure goodput.

    \b
    Read from the run's journal (in checkpoint.dir, written by `tpuctl up` and `tpuctl drill`)
    and its checkpoint dir. A NAME works while the queued resource exists (its startup script
    names the checkpoint dir); afterwards give the SPEC.

    \b
    Definitions (after ml-goodput-measurement, the infrastructure part):
    total time      from the run's start to the done marker (or its end, or now)
    queueing        CREATING / WAITING_FOR_RESOURCES, and before the queued resource existed
    provisioning    PROVISIONING, and ACTIVE until the job first runs (boot, code, setup)
    recovery        from detecting a disruption (preemption, job failure, a drill's event)
                    until the job runs again
    between runs    a flex-start run taken back at its maximum run duration, until the job
                    runs again in the next run (each run's share is shown apart)
    wasted progress steps computed twice after a disruption × the mean step time
    goodput         (running time − wasted progress) / total time
    Start-up, data loading and checkpoint saves inside the job count as productive: only
    the training code can measure those. The total ends at the done marker, the give-up or
    the stop of the run's current attempt (or now, while it goes on). A run that gave up
    shows its workers' last log lines, kept before its queued resource was deleted.
    """
    from tpuctl.jobs.report import report_for, spec_of_queued_resource

    app = app_context()
    if is_spec_path(target):
        spec = load_spec_warned(app, target, overrides)
    else:
        resolved = resolve_target(app, target, project, zone, overrides)
        api = connect_api(resolved.location, impersonate, "either")  # a name: either API
        spec = spec_of_queued_resource(api, resolved.name)
    result = report_for(spec)
    if not result.entries:
        app.warn(f"the journal of run {result.run} is empty: was it started with tpuctl up?")
    emit(result, views.report_view)


@click.command()
@click.argument("location", metavar="DIR|SPEC", shell_complete=complete_spec_path)
@set_option
@output_option
def checkpoints(location: str, overrides: tuple[str, ...]) -> None:
    """Show the Orbax checkpoints in DIR (a path or gs:// URL) or in a spec's checkpoint dir.

    Lists every step folder (complete or not, when it was committed, how long the save took),
    then the latest complete step a restart resumes from, unfinished saves and stale tmp
    folders. Exit 5 when the directory does not exist, 2 for a spec without checkpoint.dir.
    """
    from tpuctl.storage.checkpoints import inspect_checkpoints, resolve_checkpoint_location

    app = app_context()
    if _is_checkpoint_spec(location):
        spec = load_spec_warned(app, location, overrides)
        url = resolve_checkpoint_location(spec)
        if not url.startswith(("gs://", "/")):
            app.warn(f"{url} is a path on each worker; reading it on this machine instead")
    elif overrides:
        raise UsageError(
            "--set applies to a spec, not to a directory", hint=f"{location} is no spec"
        )
    else:
        url = location
    emit(inspect_checkpoints(url), views.checkpoints_view)


def _is_checkpoint_spec(argument: str) -> bool:
    """A job spec is a file; a checkpoint location is a directory or a gs:// URL."""
    if argument.startswith("gs://"):
        return False
    if os.path.isfile(argument):
        return True
    return argument.endswith((".yaml", ".yml")) and not os.path.isdir(argument)
