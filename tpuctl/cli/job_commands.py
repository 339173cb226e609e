"""Job commands: up (the babysitter), drill (rehearse a disruption), report (timeline, goodput).

The logic is in tpuctl.cloud.recovery, tpuctl.resume.drill and tpuctl.resume.report.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.context import AppContext, rfc3339
from tpuctl.cli.options import (
    DURATION,
    app_context,
    impersonate_option,
    output_option,
    project_zone_options,
    set_option,
    spec_argument,
    ssh_settings,
    worker_ssh_options,
)
from tpuctl.cli.targets import (
    connect_api,
    is_spec_path,
    load_spec_warned,
    resolve_location_for,
    resolve_target,
)
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.recovery import JournalLike
    from tpuctl.fanout.operations import Fleet, SshSettings
    from tpuctl.resume.drill import DrillReport
    from tpuctl.resume.report import JobReport
    from tpuctl.spec.model import Spec

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------------------------- shared


def _fleet_factory(app: AppContext, api: TpuApi, name: str, settings: SshSettings) -> Any:
    def make() -> Fleet:
        from tpuctl.fanout.operations import prepare_fleet

        return prepare_fleet(api, name, settings, on_progress=app.info)

    return make


def _journal(app: AppContext, spec: Spec | None) -> JournalLike | None:
    """The run's Journal in shared storage; None (with a warning) when it cannot be kept."""
    if spec is None:
        return None
    from tpuctl.resume.journal import Journal

    journal = Journal(spec)
    if not journal.enabled:
        app.warn(
            "the spec has no checkpoint.dir: decisions are not journaled, so tpuctl report "
            "will have nothing to show"
        )
        return None
    return journal


def _stamped(app: AppContext) -> Callable[[Any], None]:
    """Each event as `RFC3339 message` on stderr."""

    def say(event: Any) -> None:
        app.info(f"{rfc3339(event.at)} {event.message}")

    return say


class _StopFlag:
    """Set by Ctrl-C or SIGTERM (a CI runner cancelling the job), which also raise
    KeyboardInterrupt; the flag survives code that absorbs the exception (the SSH engine)."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self) -> bool:
        return self.raised


@contextmanager
def _interrupts() -> Iterator[_StopFlag]:
    flag = _StopFlag()

    def handler(_signum: int, _frame: Any) -> None:
        flag.raised = True
        raise KeyboardInterrupt

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield flag
        return
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    total = round(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{value:.1f}s"


# ------------------------------------------------------------------------------- up


@click.command()
@spec_argument
@set_option
@click.option("--keep", is_flag=True, default=False, help="Keep the queued resource when done.")
@click.option(
    "--poll",
    type=DURATION,
    default=None,
    help="Seconds between status polls of an ACTIVE queued resource (default: 6 s + jitter).",
)
@click.option(
    "--job-check-every",
    type=DURATION,
    default=20.0,
    show_default=True,
    help="Seconds between per-worker job status checks over SSH.",
)
@click.option(
    "--failure-confirm",
    type=DURATION,
    default=10.0,
    show_default=True,
    help="How long every worker must stay exited before it counts as a job failure.",
)
@click.option(
    "--queue-timeout",
    type=DURATION,
    default=None,
    help="Give up after this long queueing (else the spec's deadlines.queue).",
)
@click.option(
    "--provision-timeout",
    type=DURATION,
    default=None,
    help="Give up after this long in PROVISIONING (else the spec's deadlines.provision).",
)
@click.option(
    "--keep-on-timeout",
    is_flag=True,
    default=False,
    help="At a deadline, keep the queued resource (default: delete it).",
)
@worker_ssh_options
@project_zone_options
@impersonate_option
@output_option
def up(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    keep: bool,
    poll: float | None,
    job_check_every: float,
    failure_confirm: float,
    queue_timeout: float | None,
    provision_timeout: float | None,
    keep_on_timeout: bool,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    **ssh: Any,
) -> None:
    """Run SPEC's job to completion: create, wait, start, watch and recover; the CI babysitter.

    \b
    Creates the queued resource (or uses the one made from this spec), waits for ACTIVE within
    the spec's deadlines, delivers and starts the job, then watches the queued resource and
    the job:
    - SUSPENDED (spot preemption) or FAILED after ACTIVE: delete it, create it again under the
      same run name (so the job resumes), start the job; recovery.max_preemptions times.
    - the job exited on every worker without its done marker: restart it,
      recovery.max_failures times; a maintenance event or reset is not a failure.
    - a crash loop (2 restarts without a new checkpoint) stops at once.
    - the done marker: delete the queued resource (unless --keep), exit 0.
    Every decision goes to stderr with a UTC time and to the run's Journal in checkpoint.dir,
    so `tpuctl report` on any machine sees the same. Ctrl-C leaves everything running;
    `tpuctl up SPEC` again picks the running job up without restarting it.

    \b
    Exit codes: 0 done, 3 job failures exhausted or a crash loop, 4 a queueing or provisioning
    deadline, 6 FAILED before ever ACTIVE, 7 preemption budget exhausted, 130 interrupted.
    """
    from tpuctl.cloud.recovery import Babysitter, UpOptions

    app = app_context()
    spec = load_spec_warned(app, spec_path, overrides)
    if spec.job is None:
        raise UsageError(f"{spec_path} has no job section: nothing to babysit", hint="add job:")
    location = resolve_location_for(project, zone, spec)
    api = connect_api(location, impersonate)
    settings = ssh_settings(app, **ssh)
    if queue_timeout is None and spec.deadlines.queue is not None:
        queue_timeout = spec.deadlines.queue.total_seconds()
    if provision_timeout is None and spec.deadlines.provision is not None:
        provision_timeout = spec.deadlines.provision.total_seconds()
    resume = "tpuctl up " + " ".join(
        shlex.quote(arg) for arg in [spec_path, *(f"--set={o}" for o in overrides)]
    )
    options = UpOptions(
        keep=keep,
        poll=poll,
        job_check_every=job_check_every,
        failure_confirm=failure_confirm,
        queue_timeout=queue_timeout,
        provision_timeout=provision_timeout,
        keep_on_timeout=keep_on_timeout,
        resume_hint=resume,
    )
    with _interrupts() as stop_flag:
        babysitter = Babysitter(
            spec,
            api,
            fleet_factory=_fleet_factory(app, api, spec.name, settings),
            journal=_journal(app, spec),
            options=options,
            on_event=_stamped(app),
            stop_requested=stop_flag,
        )
        result = babysitter.run()
    data = result.to_dict()
    app.emit(data, _line(_up_summary(data)))


def _up_summary(data: dict[str, Any]) -> str:
    kept = "deleted" if data["deleted"] else "kept"
    return (
        f"{data['name']}: {data['outcome']} (latest step {data['latest_step']}); "
        f"{data['preemptions']} preemptions, {data['failures']} job failures, "
        f"{data['restarts']} restarts; queued resource {kept}"
    )


def _line(text: str) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        console.print(text, markup=False)

    return draw


# ------------------------------------------------------------------------------- drill


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    "instead of doing it here.",
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
    kind: str,
    worker: int,
    slice_index: int | None,
    timeout: float,
    external_recovery: bool,
    step_pattern: str | None,
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    **ssh: Any,
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
    import re

    from tpuctl.cloud.resolve import EMULATOR_ENV, is_emulator
    from tpuctl.resume.drill import Drill, DrillOptions

    app = app_context()
    if kind != "maintenance" and not is_emulator():
        raise UsageError(
            f"--kind {kind} cannot be triggered against the real Cloud TPU API (no API preempts "
            "a spot VM or breaks a slice on purpose)",
            hint="use the emulator (TPU_EMULATOR_HOST), or --kind maintenance",
        )
    resolved = resolve_target(app, target, project, zone, overrides)
    if kind == "preempt" and resolved.spec is None and not external_recovery:
        raise UsageError(
            "a preempt drill recreates the queued resource from its spec: give SPEC, "
            "or --external-recovery when tpuctl up is babysitting it"
        )
    if step_pattern is not None:
        from tpuctl.resume.logs import compile_step_pattern

        try:
            compile_step_pattern(step_pattern)
        except re.error as error:
            raise UsageError(f"--step-pattern is not a regular expression: {error}") from None
        except ValueError as error:
            raise UsageError(f"--step-pattern: {error}") from None
    api = connect_api(resolved.location, impersonate)
    admin = None
    if is_emulator():
        from tpuctl.emulator.admin import AdminClient

        admin = AdminClient(os.environ[EMULATOR_ENV])
    settings = ssh_settings(app, **ssh)
    options = DrillOptions(
        kind=kind,  # type: ignore[arg-type]  # click.Choice checked it
        worker=worker,
        slice=slice_index,
        timeout=timeout,
        external_recovery=external_recovery,
        step_pattern=step_pattern,
    )
    runner = Drill(
        api,
        resolved.name,
        resolved.spec,
        fleet_factory=_fleet_factory(app, api, resolved.name, settings),
        options=options,
        admin=admin,
        journal=_journal(app, resolved.spec),
        on_event=_stamped(app),
    )
    with _interrupts():
        report = runner.run()
    app.emit(report.to_dict(), _draw_drill(report))
    if not report.ok:
        sys.stderr.write(f"error: drill failed: {report.verdict}\n")
        click.get_current_context().exit(1)


def _draw_drill(report: DrillReport) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=False)
        table.add_column("what")
        table.add_column("value")
        rows = [
            ("drill", f"{report.kind} on {report.name} (run {report.run})"),
            ("autocheckpoint", "on" if report.autocheckpoint else "off"),
            ("triggered", rfc3339(report.triggered_at) if report.triggered_at else "-"),
            ("back after", _seconds(report.recovery_seconds)),
            ("step at the event", _value(report.step_at_event)
             + ("" if report.step_at_event_exact else " (lower bound)")),
            ("checkpoint at that step", "yes" if report.checkpoint_at_event else "no"),
            ("last checkpoint before", _value(report.last_checkpoint_before_event)),
            ("resumed from step", _value(report.resumed_from)),
            ("steps recomputed", _value(report.recomputed_steps)),
            ("allowed", _value(report.allowed_steps)),
            ("boots", _boots(report)),
        ]  # fmt: skip
        for what, value in rows:
            table.add_row(what, value)
        console.print(table)
        for note in report.notes:
            console.print(f"note: {note}", markup=False)
        console.print(report.verdict, markup=False)

    return draw


def _boots(report: DrillReport) -> str:
    return ", ".join(
        f"{label} {report.boots_before.get(label)}→{boot}"
        for label, boot in report.boots_after.items()
    )


def _value(value: Any) -> str:
    return "-" if value is None else str(value)


# ------------------------------------------------------------------------------- report


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    Read from the run's Journal (in checkpoint.dir, written by `tpuctl up` and `tpuctl drill`)
    and its checkpoint dir. A NAME works while the queued resource exists (its startup script
    names the checkpoint dir); afterwards give the SPEC.

    \b
    Definitions (after ml-goodput-measurement, the infrastructure part):
    total time      from `tpuctl up` starting to the done marker (or now)
    queueing        CREATING / WAITING_FOR_RESOURCES, and before the queued resource existed
    provisioning    PROVISIONING, and ACTIVE until the job first runs (boot, code, setup)
    recovery        from detecting a disruption (preemption, job failure, a drill's event)
                    until the job runs again
    wasted progress steps computed twice after a disruption × the mean step time
    goodput         (running time − wasted progress) / total time
    Start-up, data loading and checkpoint saves inside the job count as productive: only
    the training code can measure those.
    """
    from tpuctl.resume.report import build_report

    app = app_context()
    if is_spec_path(target):
        spec = load_spec_warned(app, target, overrides)
    else:
        resolved = resolve_target(app, target, project, zone, overrides)
        api = connect_api(resolved.location, impersonate)
        spec = spec_from_queued_resource(api, resolved.name)
    from tpuctl.resume.journal import Journal

    journal = Journal(spec)
    if not journal.enabled:
        raise UsageError(
            f"{spec.name} has no checkpoint.dir, so it has no Journal to report from",
            hint="set checkpoint.dir in the spec (a gs:// bucket) and run it with tpuctl up",
        )
    entries = journal.entries()
    latest_step, step_seconds = _checkpoint_facts(spec)
    run = spec.job.run_name if spec.job is not None and spec.job.run_name else spec.name
    result = build_report(
        entries,
        name=spec.name,
        run=run,
        latest_step=latest_step,
        checkpoint_step_seconds=step_seconds,
    )
    if not entries:
        app.warn(f"the Journal of run {run} is empty: was it started with tpuctl up?")
    app.emit(result.to_dict(), _draw_report(result))


def _checkpoint_facts(spec: Spec) -> tuple[int | None, float | None]:
    from tpuctl.resume.checkpoints import checkpoint_root, inspect_checkpoints
    from tpuctl.resume.report import checkpoint_step_seconds

    root = checkpoint_root(spec)
    if root is None:
        return None, None
    try:
        found = inspect_checkpoints(root)
    except TpuctlError:
        return None, None
    commits = [(folder.step, folder.committed_at) for folder in found.steps if folder.complete]
    return found.latest_step, checkpoint_step_seconds(commits)


def spec_from_queued_resource(api: TpuApi, name: str) -> Spec:
    """The spec facts a report needs (checkpoint dir, run name, framework), read back from the
    startup script in the queued resource's node template."""
    from tpuctl.spec.model import CheckpointSpec, JobSpec, Spec, TpuSpec

    queued_resource = api.get_queued_resource(name)
    values: dict[str, str] = {}
    accelerator = "unknown"
    for node_spec in queued_resource.tpu.node_spec:
        node = node_spec.node
        accelerator = node.accelerator_type or accelerator
        script = node.metadata.get("startup-script", "")
        for line in script.splitlines():
            key, sep, _rest = line.partition("=")
            if sep and key in ("RUN_NAME", "CHECKPOINT_DIR_SPEC", "FRAMEWORK", "SPEC_NAME"):
                try:
                    words = shlex.split(line)
                except ValueError:
                    continue
                if len(words) == 1:
                    values[key] = words[0].partition("=")[2]
    directory = values.get("CHECKPOINT_DIR_SPEC")
    if not directory or "RUN_NAME" not in values or not directory.startswith(("gs://", "/")):
        raise UsageError(
            f"cannot tell the checkpoint dir of {name} from its queued resource",
            hint="give the spec file instead of the name",
        )
    framework = values.get("FRAMEWORK", "custom")
    return Spec(
        name=values.get("SPEC_NAME", name),
        tpu=TpuSpec(accelerator=accelerator, runtime="unknown"),
        checkpoint=CheckpointSpec(dir=directory),
        job=JobSpec(command="", run_name=values["RUN_NAME"], framework=framework),  # type: ignore[arg-type]
        source=name,
    )


def _draw_report(result: JobReport) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.table import Table

        data = result.to_dict()
        goodput = data["goodput"]
        console.print(
            f"{result.name} (run {result.run}): {result.status}; "
            f"{_seconds(result.total_seconds)} from {rfc3339(result.started_at)} to "
            f"{rfc3339(result.ended_at)}; latest step {_value(result.latest_step)}",
            markup=False,
        )
        timeline = Table(box=None, pad_edge=False, title=None)
        for column in ("PHASE", "FROM", "TO", "DURATION"):
            timeline.add_column(column)
        for phase in result.timeline:
            timeline.add_row(
                phase.phase, rfc3339(phase.start), rfc3339(phase.end), _seconds(phase.seconds)
            )
        console.print(timeline)
        if result.disruptions:
            table = Table(box=None, pad_edge=False)
            for column in ("DISRUPTION", "DETECTED", "RUNNING AGAIN", "RECOVERY", "RECOMPUTED"):
                table.add_column(column)
            for item in result.disruptions:
                table.add_row(
                    item.kind,
                    rfc3339(item.detected_at),
                    rfc3339(item.running_again_at) if item.running_again_at else "-",
                    _seconds(item.recovery_seconds),
                    _value(item.recomputed_steps),
                )
            console.print(table)
        else:
            console.print("no disruptions", markup=False)
        buckets = Table(box=None, pad_edge=False)
        for column in ("BUCKET", "TIME", "SHARE"):
            buckets.add_column(column)
        for key, seconds in data["badput"].items():
            share = data["badput_fraction"][key]
            buckets.add_row(
                key.replace("_", " "), _seconds(seconds), "-" if share is None else f"{share:.1%}"
            )
        buckets.add_row(
            "productive",
            _seconds(result.productive_seconds),
            "-" if goodput is None else f"{goodput:.1%}",
        )
        console.print(buckets)
        console.print(
            "goodput " + ("-" if goodput is None else f"{goodput:.3f}")
            + (f" (mean step {result.step_seconds:.3f}s)" if result.step_seconds else ""),
            markup=False,
        )  # fmt: skip
        for note in result.notes:
            console.print(f"note: {note}", markup=False)

    return draw
