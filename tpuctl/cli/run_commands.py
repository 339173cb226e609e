"""Supervision commands: `up` (reconcile steps in a loop, with its live account) and
`reconcile` (one step, for the scheduler a user already has). The logic is in
tpuctl.jobs.reconcile and tpuctl.jobs.up."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.doctor_commands import no_preflight_option, preflight
from tpuctl.cli.job_commands import fleet_factory, stamped
from tpuctl.cli.options import (
    DURATION,
    impersonate_option,
    one_of_zone_zones,
    output_option,
    pop_worker_ssh,
    project_zone_options,
    run_zones_option,
    set_option,
    spec_argument,
    ssh_settings,
    with_zones,
    worker_ssh_options,
)
from tpuctl.cli.output import emit
from tpuctl.cli.progress import interrupts
from tpuctl.cli.targets import connect_api, load_spec_warned, resolve_location_for, up_command
from tpuctl.cli.views import jobs as views
from tpuctl.errors import UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.resolve import Location
    from tpuctl.jobs.reconcile.decision import Policy
    from tpuctl.jobs.reconcile.store import RunStore
    from tpuctl.jobs.reconcile.world import World
    from tpuctl.jobs.up import UpOptions
    from tpuctl.spec.model import Spec

F = Callable[..., Any]


def supervision_options(func: F) -> F:
    """The options `up` and `reconcile` share: how a run is supervised."""
    options = [
        click.option(
            "--keep", is_flag=True, default=False, help="Keep the queued resource when done."
        ),
        click.option(
            "--settle",
            "--failure-confirm",
            "settle",
            type=DURATION,
            default=120.0,
            show_default=True,
            help="After every worker ended the job, how long the nodes must stay undisturbed "
            "(no reboot, maintenance or repair) before it counts as done (every worker exited "
            "0) or as a failure: long enough for an autocheckpoint reboot to show.",
        ),
        click.option(
            "--queue-timeout",
            type=DURATION,
            default=None,
            help="Give up after this long queueing (else the spec's deadlines.queue).",
        ),
        click.option(
            "--provision-timeout",
            type=DURATION,
            default=None,
            help="Give up after this long in PROVISIONING (else the spec's deadlines.provision).",
        ),
        click.option(
            "--keep-on-timeout",
            is_flag=True,
            default=False,
            help="At a deadline, keep the queued resource (default: delete it).",
        ),
        click.option(
            "--prefer-cheapest",
            is_flag=True,
            default=False,
            help="On a capacity ladder (capacity.fallback): every new bring-up, after a "
            "preemption or the end of a flex-start run, starts from the first (cheapest) rung "
            "again instead of staying on the rung that ran.",
        ),
        no_preflight_option,
        worker_ssh_options,
        project_zone_options,
        run_zones_option,
        impersonate_option,
        output_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


@dataclass
class Supervised:
    """Everything a step needs, built from the command line."""

    spec: Spec
    location: Location
    api: TpuApi
    world: World
    store: RunStore
    policy: Policy
    options: UpOptions
    command: str


def _supervised(
    app: AppContext,
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    no_preflight: bool,
    tuning: dict[str, Any],
    delete_kept: bool,
    over_ssh: bool,
) -> Supervised:
    from tpuctl.clock import Clock
    from tpuctl.jobs.adapters import FanoutJobOps, StorageJobRecord
    from tpuctl.jobs.reconcile.store import RunStore
    from tpuctl.jobs.reconcile.world import ObjectWorkers, SshWorkers, TpuSlices, World
    from tpuctl.jobs.up import policy_of, up_options
    from tpuctl.spec.ladder import rung_specs
    from tpuctl.worker import worker_states_dir

    overrides = with_zones(overrides, one_of_zone_zones(zone, zones))
    spec = load_spec_warned(app, spec_path, overrides, creating=True)
    if spec.job is None:
        raise UsageError(f"{spec_path} has no job section: nothing to supervise", hint="add job:")
    location = resolve_location_for(project, zone, spec)
    api = connect_api(location, impersonate)
    if not no_preflight:
        preflight(app, spec, location, api, impersonate)
    settings = ssh_settings(app, **pop_worker_ssh(tuning))
    command = up_command(spec_path, overrides, project, zone)
    run_zones = (location.zone,) if zone else spec.zones or (location.zone,)
    options = up_options(spec, resume_hint=command, zones=run_zones, **tuning)
    store = RunStore(spec, location.project, location.zone)
    jobs = FanoutJobOps()
    states = None if over_ssh else worker_states_dir(spec)
    clock = Clock()
    world = World(
        spec=spec,
        slices=TpuSlices(
            api, spec, fleet_factory(app, api, spec.name, settings), rungs=rung_specs(spec)
        ),
        jobs=jobs,
        record=StorageJobRecord(spec),
        workers=ObjectWorkers(states, jobs, clock) if states else SshWorkers(jobs),
        clock=clock,
        save_logs=store.save_logs,
        reread_every=options.job_check_every,
    )
    policy = policy_of(spec, options, location.zone, delete_kept=delete_kept)
    return Supervised(spec, location, api, world, store, policy, options, command)


@click.command()
@spec_argument
@set_option
@click.option(
    "--poll",
    type=DURATION,
    default=None,
    help="Seconds between steps while nothing changes (default: 6 s).",
)
@click.option(
    "--job-check-every",
    type=DURATION,
    default=20.0,
    show_default=True,
    help="Seconds between reads of a running job's workers.",
)
@click.option(
    "--wait-for-lease",
    is_flag=True,
    default=False,
    help="When another supervisor (tpuctl up, or a scheduler's tpuctl reconcile) holds this "
    "run, wait for it to end (or die) and take over, instead of exiting 1.",
)
@supervision_options
def up(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    no_preflight: bool,
    **tuning: Any,
) -> None:
    """Run SPEC's job to completion: create, wait, start, watch and recover; reconcile steps
    in a loop, with every decision said as it is taken.

    \b
    Each step observes the queued resource in the run's zones, every worker's job, the
    journal and the checkpoints, decides one action and takes it:
    - SUSPENDED (spot preemption) or FAILED after ACTIVE: delete it, create it again under the
      same run name (so the job resumes), start the job; recovery.max_preemptions times.
    - the job exited on every worker without its done marker: restart it,
      recovery.max_failures times; a maintenance event or reset is not a failure.
    - a crash loop (2 restarts without a new checkpoint) stops at once.
    - the done marker: delete the queued resource (unless --keep), exit 0.
    Before giving up, each worker's last log lines are kept (tpuctl report shows them).
    Every decision goes to stderr with a UTC time and to the run's journal beside its
    checkpoints, so `tpuctl report` on any machine sees the same, and `tpuctl reconcile` from a
    scheduler takes the run on where up left it. Ctrl-C leaves everything running; `tpuctl up
    SPEC` again picks the running job up without restarting it. One supervisor at a time holds
    a run: up holds its lease (renewed every 30 s, taken over when 3 minutes stale); a second
    one says who holds it and exits 1, or waits (--wait-for-lease). A TPU API outage is ridden
    out (said every 30 s) while the job runs on. On a run that gave up, or that tpuctl delete
    stopped, up starts a new attempt with fresh budgets.

    \b
    Exit codes: 0 done, 1 another supervisor holds the run, 2 a preflight check blocks the
    run (see tpuctl doctor; --no-preflight skips them), 3 job failures exhausted or a crash
    loop, 4 a queueing or provisioning deadline, 6 FAILED before ever ACTIVE, 7 preemption
    budget exhausted, 10 the workers stayed unreachable, 11 the TPU API stayed unavailable,
    130 interrupted.
    """
    from tpuctl.jobs.up import UP_STALE_AFTER, Supervisor

    app = app_context()
    run = _supervised(
        app,
        spec_path=spec_path,
        overrides=overrides,
        project=project,
        zone=zone,
        zones=zones,
        impersonate=impersonate,
        no_preflight=no_preflight,
        tuning=tuning,
        delete_kept=True,
        over_ssh=False,
    )
    with interrupts() as stop_flag:
        supervisor = Supervisor(
            run.spec,
            run.world,
            run.store,
            run.policy,
            options=run.options,
            on_event=stamped(app),
            stop_requested=stop_flag,
            lease=run.store.lease(run.command, stale_after=UP_STALE_AFTER),
        )
        result = supervisor.run()
    emit(result, views.up_view)


@click.command()
@spec_argument
@set_option
@click.option(
    "--read-workers",
    type=click.Choice(["auto", "ssh"]),
    default="auto",
    show_default=True,
    help="How the workers' jobs are read: auto (their state objects beside the journal, SSH "
    "only where one is missing or stale) or ssh (every worker over SSH).",
)
@click.option(
    "--step-deadline",
    type=DURATION,
    default=60.0,
    show_default=True,
    help="The step's own deadline: past it the step stops (the next one goes on), and its "
    "lease goes stale this long after its last heartbeat if it was killed.",
)
@supervision_options
def reconcile(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    no_preflight: bool,
    step_deadline: float,
    read_workers: str,
    **tuning: Any,
) -> None:
    """One supervision step for SPEC's run: observe, decide, act once, record, exit.

    \b
    What tpuctl up decides at that moment, taken once: create the queued resource (or again
    after a preemption), start or restart the job, delete a done run's queued resource, give
    up and delete at a deadline or a spent budget. It converges the run toward its spec from
    wherever the world is, and every timer and budget lives in the run's journal, so any
    machine can take the next step. Run it every minute from cron, a systemd timer, a
    Kubernetes CronJob, Cloud Scheduler or a CI schedule (tpuctl supervise renders each).
    A step holds the run's lease while it acts (stale a minute after its last heartbeat); one
    that finds it held does nothing and says who holds it.

    \b
    Exit codes: 0 done (or stopped by tpuctl delete): nothing is left billed; 12 in progress
    (or another supervisor holds the run): call it again; 11 the TPU API was unavailable:
    nothing was decided this time; a run that gave up keeps exiting with its code: 3 job
    failures or a crash loop, 4 a deadline, 6 FAILED, 7 preemption budget, 10 unreachable;
    1 error, 2 invalid spec or a preflight check, 8 permission.
    """
    from tpuctl.jobs.reconcile.step import reconcile_once

    app = app_context()
    tuning.setdefault("poll", None)
    run = _supervised(
        app,
        spec_path=spec_path,
        overrides=overrides,
        project=project,
        zone=zone,
        zones=zones,
        impersonate=impersonate,
        no_preflight=no_preflight,
        tuning=tuning,
        delete_kept=False,
        over_ssh=read_workers == "ssh",
    )
    with interrupts():
        result = reconcile_once(
            run.world,
            run.store,
            run.policy,
            command=shlex.join(["tpuctl", "reconcile", spec_path]),
            on_said=stamped(app),
            deadline=step_deadline,
            on_late=app.warn,
        )
    emit(result, views.reconcile_view)
