"""Supervision commands: `up` (reconcile steps in a loop, with its live account) and
`reconcile` (one step, for the scheduler a user already has). The logic is in
tpuctl.jobs.reconcile and tpuctl.jobs.up."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.completion import complete_spec_path
from tpuctl.cli.context import app_context
from tpuctl.cli.job_commands import stamped
from tpuctl.cli.options import (
    DURATION,
    impersonate_option,
    output_option,
    set_option,
    spec_argument,
)
from tpuctl.cli.output import emit
from tpuctl.cli.progress import interrupts
from tpuctl.cli.targets import (
    connect_api,
    resolve_location_for,
)
from tpuctl.cli.views import jobs as views
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.cloud.client import TpuApi
    from tpuctl.jobs.reconcile.discover import Found, FoundRun
    from tpuctl.jobs.reconcile.step import ReconcileResult, RunError

from tpuctl.cli.supervision import (
    PARALLEL_RUNS,
    given_options,
    supervise,
    supervised,
    supervision_options,
)


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
@click.option(
    "--detach",
    is_flag=True,
    default=False,
    help="Get the run created, ACTIVE and its job running, then hand it over: exit 0 and say "
    "what supervises it from then on (the tpuctl supervise command to run, or with "
    "--supervise the scheduler installed).",
)
@click.option(
    "--supervise",
    "supervise_on",
    type=click.Choice(["cron", "systemd"]),
    default=None,
    help="With --detach (which it implies): install this scheduler on this machine to take "
    "the run on, as `tpuctl supervise SPEC --on TARGET --install` does.",
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
    supervise_on: str | None,
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
    --detach stops supervising once the job runs and exits 0, saying how a scheduler takes
    the run on (tpuctl supervise SPEC --on cron --install); --supervise cron|systemd installs
    that scheduler itself. Until one steps the run, nothing recovers it.

    \b
    Exit codes: 0 done (or with --detach, running and handed over), 1 another supervisor holds
    the run, 2 a preflight check blocks the run (see tpuctl doctor; --no-preflight skips
    them), 3 job failures exhausted or a crash loop, 4 a queueing or provisioning deadline,
    6 FAILED before ever ACTIVE, 7 preemption budget exhausted, 10 the workers stayed
    unreachable, 11 the TPU API stayed unavailable, 130 interrupted.
    """
    from tpuctl.jobs.up import UP_STALE_AFTER, Supervisor

    app = app_context()
    if supervise_on is not None:
        tuning["detach"] = True
    run = supervised(
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
        by="up",
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
    if result.outcome == "detached":
        from tpuctl.cli.supervise_commands import hand_over

        result.supervisor = hand_over(
            app,
            spec_path=spec_path,
            overrides=overrides,
            project=project,
            zone=zone,
            zones=zones,
            impersonate=impersonate,
            target=supervise_on,
        )
    emit(result, views.up_view)


@click.command()
@click.argument(
    "spec_path",
    metavar="[SPEC]",
    required=False,
    type=click.Path(dir_okay=False),
    shell_complete=complete_spec_path,
)
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
    "--all",
    "every_run",
    is_flag=True,
    default=False,
    help="Instead of SPEC: every run found with --bucket (every record under that checkpoint "
    "location) and/or --project (every run tpuctl labelled there that holds a queued "
    "resource), each stepped from the spec its record keeps (run.json).",
)
@click.option(
    "--bucket",
    metavar="URL",
    default=None,
    help="With --all: a checkpoint location (gs://BUCKET/PREFIX or a local path) whose runs "
    "to step.",
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
    spec_path: str | None,
    overrides: tuple[str, ...],
    every_run: bool,
    bucket: str | None,
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    no_preflight: bool,
    step_deadline: float,
    read_workers: str,
    **tuning: Any,
) -> None:
    """One supervision step for SPEC's run (or with --all, for every run found): observe,
    decide, act once, record, exit.

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
    --all --bucket gs://B/PREFIX steps every run whose record lives under that location;
    --all --project P every run tpuctl labelled in P's zones that holds a queued resource now
    (its record location is in the nodes' metadata; a run between a delete and its next
    create, or done, is found only by --bucket). Each run is stepped from the spec its record
    keeps (run.json, written at its first step): its ${VAR}s from this environment, the
    options its first step was given unless given here. A run that cannot be stepped (a
    ${VAR} unset, its record unreadable) is an error of its own; the others go on.

    \b
    Exit codes: 0 done (or stopped by tpuctl delete): nothing is left billed; 12 in progress
    (or another supervisor holds the run): call it again; 11 the TPU API was unavailable:
    nothing was decided this time; a run that gave up keeps exiting with its code: 3 job
    failures or a crash loop, 4 a deadline, 6 FAILED, 7 preemption budget, 10 unreachable;
    1 error, 2 invalid spec or a preflight check, 8 permission. With --all: the highest code
    of a run that gave up or could not be stepped, else 11 if the API was unavailable, else 12
    if any run is in progress, else 0.
    """
    from tpuctl.jobs.reconcile.step import reconcile_once

    app = app_context()
    tuning.setdefault("poll", None)
    if every_run:
        if spec_path is not None or overrides or zone or zones:
            raise UsageError(
                "--all steps the runs it finds, each from its own spec: SPEC, --set, --zone "
                "and --zones do not go with it",
                hint="tpuctl reconcile --all --bucket gs://BUCKET/PREFIX (or --project P)",
            )
        if bucket is None and project is None:
            raise UsageError(
                "--all needs --bucket or --project: where to find the runs",
                hint="tpuctl reconcile --all --bucket gs://BUCKET/PREFIX",
            )
        _reconcile_all(
            app,
            bucket=bucket,
            project=project,
            impersonate=impersonate,
            no_preflight=no_preflight,
            step_deadline=step_deadline,
            tuning=tuning,
            over_ssh=read_workers == "ssh",
        )
        return
    if spec_path is None:
        raise UsageError(
            "give SPEC, or --all with --bucket or --project", hint="tpuctl reconcile job.yaml"
        )
    if bucket is not None:
        raise UsageError("--bucket goes with --all", hint="tpuctl reconcile --all --bucket URL")
    run = supervised(
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
        by="reconcile",
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


def _reconcile_all(
    app: AppContext,
    *,
    bucket: str | None,
    project: str | None,
    impersonate: str | None,
    no_preflight: bool,
    step_deadline: float,
    tuning: dict[str, Any],
    over_ssh: bool,
) -> None:
    """One step of every run found, side by side (each under its own lease), as one
    Reconciles document."""
    from concurrent.futures import ThreadPoolExecutor

    from tpuctl.jobs.reconcile.step import ReconcilesResult, RunError, reconciles_code

    found = find_runs(app, bucket=bucket, project=project, impersonate=impersonate)
    errors = [
        RunError(
            None, None, error.kind, f"zone {error.zone}: {error.message}", None, error.exit_code
        )
        for error in found.zone_errors
    ]
    if not found.runs:
        app.info(f"no runs found in {_where(bucket, project)}")
    given = given_options()
    words = ["tpuctl", "reconcile", "--all"]
    words += [
        *(["--bucket", bucket] if bucket else []),
        *(["--project", project] if project else []),
    ]
    command = shlex.join(words)
    ctx = click.get_current_context()

    def step(run: FoundRun) -> ReconcileResult | RunError:
        with ctx.scope(cleanup=False):
            return _step_found(
                app,
                run,
                impersonate=impersonate,
                no_preflight=no_preflight,
                step_deadline=step_deadline,
                tuning=dict(tuning),
                given=given,
                command=command,
                over_ssh=over_ssh,
            )

    with interrupts(), ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        outcomes = list(pool.map(step, found.runs))
    from tpuctl.jobs.reconcile.step import ReconcileResult

    runs = [outcome for outcome in outcomes if isinstance(outcome, ReconcileResult)]
    errors += [outcome for outcome in outcomes if isinstance(outcome, RunError)]
    result = ReconcilesResult(
        bucket=bucket,
        project=project,
        code=int(reconciles_code(runs, errors)),
        runs=runs,
        errors=errors,
        skipped=[skipped.to_dict() for skipped in found.skipped],
    )
    emit(result, views.reconciles_view)


def find_runs(
    app: AppContext, *, bucket: str | None, project: str | None, impersonate: str | None
) -> Found:
    """Every run under `bucket` and every one labelled in `project` (their union)."""
    from tpuctl.jobs.reconcile.discover import Found, runs_in_project, runs_under

    found = Found()
    if bucket is not None:
        found.add(runs_under(bucket))
    if project is not None:
        from tpuctl.cli.targets import connect_zones

        api, zones = connect_zones(project, None, None, True, impersonate)
        found.add(runs_in_project(api, zones))
    return found


def _where(bucket: str | None, project: str | None) -> str:
    return " and ".join(
        [*([bucket] if bucket else []), *([f"project {project}"] if project else [])]
    )


def _step_found(
    app: AppContext,
    found: FoundRun,
    *,
    impersonate: str | None,
    no_preflight: bool,
    step_deadline: float,
    tuning: dict[str, Any],
    given: Mapping[str, Any],
    command: str,
    over_ssh: bool,
) -> ReconcileResult | RunError:
    """One step of a run found by its record, from the spec its run.json keeps; what stops it
    is its own error."""
    from tpuctl.clock import utc_now
    from tpuctl.jobs.reconcile.discover import load_run_spec
    from tpuctl.jobs.reconcile.step import RunError, reconcile_once
    from tpuctl.jobs.reconcile.store import read_run_file
    from tpuctl.storage.locations import open_location

    name = found.name
    try:
        run_file = read_run_file(open_location(found.url))
        name = run_file.name
        loaded = load_run_spec(run_file, found.url, now=utc_now())
        for warning in loaded.warnings:
            app.warn(f"{name}: {warning}")
        multizone = len(run_file.zones) > 1
        run = supervise(
            app,
            loaded,
            source=run_file.source,
            overrides=run_file.overrides,
            project=run_file.project,
            zone=None if multizone else (run_file.zones or (run_file.zone,))[0],
            impersonate=impersonate,
            tuning={**tuning, "no_preflight": no_preflight},
            delete_kept=False,
            command=command,
            by="reconcile",
            over_ssh=over_ssh,
            given=given,
            record_run=False,
            inherited=run_file.options,
            url=found.url,
        )
        return reconcile_once(
            run.world,
            run.store,
            run.policy,
            command=command,
            on_said=stamped(app),
            deadline=step_deadline,
            on_late=app.warn,
        )
    except TpuctlError as error:
        app.warn(f"{name or found.url}: {error.one_line()}")
        return RunError.of(error, name=name, record_url=found.url)


@click.command()
@click.option(
    "--bucket",
    metavar="URL",
    default=None,
    help="Every run whose record lives under this checkpoint location (gs://BUCKET/PREFIX or "
    "a local path).",
)
@click.option(
    "--project",
    default=None,
    help="Every run tpuctl labelled in this project that holds a queued resource now.",
)
@click.option(
    "--live",
    is_flag=True,
    default=False,
    help="Ask the TPU API for each run's queued resources (else as its record last said).",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default=600.0,
    show_default="10m",
    help="Flag a run in progress that nobody reconciled for longer than this.",
)
@impersonate_option
@output_option
def runs(
    *,
    bucket: str | None,
    project: str | None,
    live: bool,
    stale_after: float,
    impersonate: str | None,
) -> None:
    """Every run under a checkpoint location (--bucket) or in a project (--project): its state,
    who reconciled it last and when, how far it got, its goodput, its queued resource.

    \b
    STATE        in progress, done, given up (with why and its exit code) or stopped
    RECONCILED   when the last step was taken, on which host, by a person's up or a
                 scheduler's reconcile
    STEP         the latest committed checkpoint the last step saw, else the furthest step a
                 worker reported
    GOODPUT      productive time / total time so far (tpuctl report has the definitions)
    P/F/E        preemptions, job failures and flex-start run ends (this attempt)
    QUEUED       the queued resource it holds: zone and state, as its record last said
                 (--live asks the API)
    A run in progress that nobody reconciled for longer than --stale-after is flagged with
    what to do: its scheduler (or its up) stopped. --project finds only the runs that hold a
    queued resource now; --bucket finds every run, done or between a delete and a create.
    Read from the runs' records: no TPU API access without --project or --live.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tpuctl.cli.views.runs import runs_view
    from tpuctl.clock import utc_now
    from tpuctl.jobs.runs import RunsResult, run_row

    app = app_context()
    if bucket is None and project is None:
        raise UsageError(
            "tpuctl runs needs --bucket or --project: where to find the runs",
            hint="tpuctl runs --bucket gs://BUCKET/PREFIX",
        )
    found = find_runs(app, bucket=bucket, project=project, impersonate=impersonate)
    now = utc_now()
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(
            pool.map(lambda run: run_row(run, now=now, stale_after=stale_after), found.runs)
        )
    if live:
        _ask_live(rows, impersonate)
    result = RunsResult(
        bucket=bucket,
        project=project,
        live=live,
        runs=rows,
        skipped=[skipped.to_dict() for skipped in found.skipped],
        errors=[f"zone {error.zone}: {error.message}" for error in found.zone_errors],
    )
    emit(result, runs_view)


def _ask_live(rows: list[Any], impersonate: str | None) -> None:
    """Each run's queued resources, as the TPU API says now (one connection per project)."""
    from tpuctl.jobs.runs import live_queued_resources

    apis: dict[str, TpuApi] = {}
    for row in rows:
        if row.project is None or not row.zones:
            continue
        try:
            api = apis.get(row.project)
            if api is None:
                location = resolve_location_for(row.project, row.zones[0], None)
                api = apis[row.project] = connect_api(location, impersonate, "either")
            row.queued_resources = live_queued_resources(api, row.name, row.zones)
        except TpuctlError as error:
            row.error = "; ".join(filter(None, [row.error, f"the TPU API: {error.message}"]))
