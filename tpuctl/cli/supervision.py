"""What `up` and `reconcile` share: the supervision flags, the run's kept flags (run.json)
and one supervised step or loop over a run (tpuctl.cli.run_commands has the commands, and
`reconcile --all` and `runs`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.doctor_commands import no_preflight_option, preflight
from tpuctl.cli.job_commands import fleet_factory
from tpuctl.cli.options import (
    DURATION,
    WORKER_SSH_KEYS,
    impersonate_option,
    one_of_zone_zones,
    output_option,
    pop_worker_ssh,
    project_zone_options,
    run_zones_option,
    ssh_settings,
    with_zones,
    worker_ssh_options,
)
from tpuctl.cli.targets import (
    api_of,
    connect_api,
    load_spec_loaded,
    resolve_location_for,
    up_command,
)
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.resolve import Location
    from tpuctl.jobs.reconcile.decision import Policy
    from tpuctl.jobs.reconcile.store import RunStore
    from tpuctl.jobs.reconcile.world import World
    from tpuctl.jobs.up import UpOptions
    from tpuctl.spec.load import LoadedSpec
    from tpuctl.spec.model import Spec

F = Callable[..., Any]
# The flags a run keeps in its run.json when given (`tpuctl reconcile --all` steps it with
# them): how it is supervised, and how its workers are reached.
RECORDED_OPTIONS = (
    "keep",
    "settle",
    "queue_timeout",
    "provision_timeout",
    "keep_on_timeout",
    "no_preflight",
    *WORKER_SSH_KEYS,
)
# Runs `tpuctl reconcile --all` steps side by side.
PARALLEL_RUNS = 4


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


def given_options(names: tuple[str, ...] = RECORDED_OPTIONS) -> dict[str, Any]:
    """The options of `names` given on the command line (or in the environment), with their
    values: what a run keeps in its run.json."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return {
        name: ctx.params[name]
        for name in names
        if name in ctx.params and ctx.get_parameter_source(name) in given
    }


def supervised(
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
    by: str,
) -> Supervised:
    """A run from the spec at `spec_path` and the command line; its run.json (written at the
    run's start, and when a person's `up` takes it on) keeps the spec's text and the options
    given. A scheduler's step (`by` reconcile) takes the options the run keeps for those not
    given on its own command line, so it supervises the run as the person who started it
    asked (`tpuctl up --keep --detach`, then `tpuctl reconcile SPEC` from cron)."""
    every = with_zones(overrides, one_of_zone_zones(zone, zones))
    loaded = load_spec_loaded(app, spec_path, every, creating=True)
    if loaded.spec.job is None:
        raise UsageError(f"{spec_path} has no job section: nothing to supervise", hint="add job:")
    return supervise(
        app,
        loaded,
        source=spec_path if spec_path == "-" else os.path.abspath(spec_path),
        overrides=overrides,
        project=project,
        zone=zone,
        impersonate=impersonate,
        tuning={**tuning, "no_preflight": no_preflight},
        delete_kept=delete_kept,
        command=up_command(spec_path, every, project, zone),
        by=by,
        over_ssh=over_ssh,
        given=given_options(),
        record_run=True,
        inherited=None if by == "reconcile" else {},
    )


def supervise(
    app: AppContext,
    loaded: LoadedSpec,
    *,
    source: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    tuning: dict[str, Any],
    delete_kept: bool,
    command: str,
    by: str,
    given: Mapping[str, Any],
    over_ssh: bool = False,
    record_run: bool,
    inherited: Mapping[str, Any] | None,
    url: str | None = None,
) -> Supervised:
    """Everything a step of `loaded`'s run needs. `tuning`: the command's options (with
    `no_preflight`); `given`: those given explicitly, which win over `inherited` (the options
    the run keeps in its run.json; None: read them from it, if it is there). `record_run`: the
    step keeps the run's spec, with `given`, in its run.json at the run's start; `url`: where
    its record was found."""
    from tpuctl.clock import Clock
    from tpuctl.jobs.adapters import FanoutJobOps, StorageJobRecord
    from tpuctl.jobs.reconcile.store import RunFile, RunStore
    from tpuctl.jobs.reconcile.world import ObjectWorkers, SshWorkers, TpuSlices, World
    from tpuctl.jobs.up import policy_of, up_options
    from tpuctl.spec.ladder import rung_specs
    from tpuctl.worker import worker_states_dir

    spec = loaded.spec
    location = resolve_location_for(project, zone, spec)
    store = RunStore(spec, location.project, location.zone, url=url, by=by)
    if inherited is None:
        inherited = kept_options(store)
    tuning = {**tuning, **inherit_options(inherited, given, tuning)}
    no_preflight = bool(tuning.pop("no_preflight", False))
    api = connect_api(location, impersonate, api_of(spec))
    if not no_preflight:
        preflight(app, spec, location, api, impersonate)
    settings = ssh_settings(app, **pop_worker_ssh(tuning))
    run_zones = (location.zone,) if zone else spec.zones or (location.zone,)
    options = up_options(spec, resume_hint=command, zones=run_zones, **tuning)
    policy = policy_of(spec, options, location.zone, delete_kept=delete_kept)
    if record_run:
        store.run_file = RunFile(
            name=spec.name,
            run=spec.run_name,
            spec=loaded.text,
            source=source,
            project=location.project,
            zone=location.zone,
            zones=policy.zones,
            overrides=overrides,
            variables=loaded.variables,
            options=dict(given),
        )
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
    return Supervised(spec, location, api, world, store, policy, options, command)


def kept_options(store: RunStore) -> Mapping[str, Any]:
    """The options the run keeps in its run.json ({} when it has none yet)."""
    from tpuctl.errors import NotFoundError
    from tpuctl.jobs.reconcile.store import read_run_file

    try:
        return read_run_file(store.storage).options
    except NotFoundError:
        return {}
    except TpuctlError as error:
        app_context().warn(f"{store.url}: {error.message}; the options given here are used")
        return {}


def inherit_options(
    kept: Mapping[str, Any], given: Mapping[str, Any], tuning: Mapping[str, Any]
) -> dict[str, Any]:
    """The kept options this command takes: the recorded ones it has, unless given here."""
    return {
        key: value
        for key, value in kept.items()
        if key in RECORDED_OPTIONS and key in tuning and key not in given
    }
