"""Lifecycle commands: create, status, list, wait, reset, delete; the logic is in tpuctl.cloud."""

from __future__ import annotations

import os
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
    dry_run_option,
    impersonate_option,
    output_option,
    project_zone_options,
    set_option,
    spec_argument,
    ssh_settings,
    worker_ssh_options,
    yes_option,
)
from tpuctl.cli.targets import (
    Target,
    connect_api,
    load_spec_warned,
    resolve_location_for,
    resolve_target,
)
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.cloud.lifecycle import WaitOptions
    from tpuctl.cloud.watcher import WatchEvent
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.spec.model import Spec

F = TypeVar("F", bound=Callable[..., Any])
WAIT_TARGETS = ("ACTIVE", "PROVISIONING", "WAITING_FOR_RESOURCES", "SUSPENDED", "FAILED", "DELETED")
# ----------------------------------------------------------------------------- shared options


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
            type=click.Choice(WAIT_TARGETS),
            default="ACTIVE",
            show_default=True,
            help="The state to wait for.",
        ),
    ]
    for option in options:
        func = option(func)
    return func


# ------------------------------------------------------------------------------ resolution


def _wait_options(
    spec: Spec | None,
    *,
    until: str,
    queue_timeout: float | None,
    provision_timeout: float | None,
    keep_on_timeout: bool,
    delete_on_interrupt: bool,
) -> WaitOptions:
    from tpuctl.cloud.lifecycle import WaitOptions
    from tpuctl.cloud.watcher import WatchPolicy

    if spec is not None:
        if queue_timeout is None and spec.deadlines.queue is not None:
            queue_timeout = spec.deadlines.queue.total_seconds()
        if provision_timeout is None and spec.deadlines.provision is not None:
            provision_timeout = spec.deadlines.provision.total_seconds()
    policy = WatchPolicy(
        until=until, queue_timeout=queue_timeout, provision_timeout=provision_timeout
    )
    return WaitOptions(
        policy=policy, keep_on_timeout=keep_on_timeout, delete_on_interrupt=delete_on_interrupt
    )


# ------------------------------------------------------------------------------- progress


class Progress:
    """Prints each state change with its UTC time to stderr; a live line only on a terminal."""

    def __init__(self, app: AppContext, name: str) -> None:
        self.app = app
        self.name = name
        self.live = sys.stderr.isatty() and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        self._status: Any = None

    def __call__(self, event: WatchEvent) -> None:
        if event.kind == "state":
            arrow = f"{event.previous} → {event.state}" if event.previous else event.state
            self.app.info(f"{rfc3339(event.at)} {self.name}: {arrow}")
        elif event.kind == "warning":
            self.app.warn(f"{self.name}: {event.message}")
        if self._status is not None:
            self._status.update(
                f"{self.name}: {event.state} for {_human_seconds(event.in_state)} "
                f"(waiting {_human_seconds(event.elapsed)})"
            )

    @contextmanager
    def shown(self) -> Iterator[Progress]:
        """The live status line (a rich spinner) while waiting, then SIGTERM handled as Ctrl-C."""
        with _sigterm_as_interrupt():
            if not self.live:
                yield self
                return
            with self.app.stderr.status(f"{self.name}: …") as status:
                self._status = status
                try:
                    yield self
                finally:
                    self._status = None


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """A CI runner cancelling the job sends SIGTERM: treat it like Ctrl-C (report, clean up)."""

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _human_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


# ------------------------------------------------------------------------------ rendering


def _draw_status(summary: dict[str, Any]) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.table import Table

        since = summary.get("state_since")
        when = f" for {_human_seconds(summary.get('in_state_seconds'))}" if since else ""
        line = f"{summary['name']}: {summary['state']}{when}"
        if summary.get("state_initiator"):
            line += f" (initiated by {summary['state_initiator']})"
        console.print(line, markup=False)
        console.print(
            f"  {summary['accelerator']} × {summary['slices']} slice(s), {summary['tier']}, "
            f"runtime {summary['runtime']}, created "
            f"{rfc3339(summary['create_time']) if summary.get('create_time') else '?'}",
            markup=False,
        )
        failure = summary.get("failure")
        if failure:
            console.print(f"  failed: {failure.get('message')}", markup=False)
        table = Table(box=None, pad_edge=False)
        for column in ("SLICE", "NODE", "STATE", "HEALTH", "WORKER", "INTERNAL IP", "EXTERNAL IP"):
            table.add_column(column)
        for index, node in enumerate(summary["nodes"]):
            workers = node["workers"] or [{"worker": "-", "internal_ip": None, "external_ip": None}]
            for worker in workers:
                table.add_row(
                    str(index),
                    node["name"],
                    node["state"] or "-",
                    node["health"] or "-",
                    str(worker["worker"]),
                    worker["internal_ip"] or "-",
                    worker["external_ip"] or "-",
                )
        if summary["nodes"]:
            console.print(table)

    return draw


def _draw_list(result: dict[str, Any]) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.table import Table

        rows = result["queued_resources"]
        if not rows:
            scope = "queued resources" if result["all"] else "tpuctl queued resources"
            console.print(f"no {scope} in {result['project']}/{result['zone']}", markup=False)
            return
        table = Table(box=None, pad_edge=False)
        for column in ("NAME", "STATE", "ACCELERATOR", "SLICES", "TIER", "CREATED", "JOB"):
            table.add_column(column)
        for row in rows:
            created = row.get("create_time")
            table.add_row(
                row["name"],
                row["state"],
                row["accelerator"],
                str(row["slices"]),
                row["tier"],
                rfc3339(created) if created else "-",
                row["job"] or "-",
            )
        console.print(table)

    return draw


def _line(text: str) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        console.print(text, markup=False)

    return draw


# -------------------------------------------------------------------------------- commands


@click.command()
@spec_argument
@set_option
@project_zone_options
@impersonate_option
@click.option("--wait", "wait_after", is_flag=True, default=False, help="Then wait (see wait).")
@wait_options
@dry_run_option
@output_option
def create(
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    impersonate: str | None,
    wait_after: bool,
    until: str,
    queue_timeout: float | None,
    provision_timeout: float | None,
    keep_on_timeout: bool,
    delete_on_interrupt: bool,
    dry_run: bool,
) -> None:
    """Create the queued resource SPEC describes; succeed if it already exists from this spec.

    A same-named queued resource from a different spec is an error listing what differs.
    With --wait, continue as `tpuctl wait` (deadlines, delete on give-up, Ctrl-C handling).
    """
    from tpuctl.cloud import lifecycle

    app = app_context()
    spec = load_spec_warned(app, spec_path, overrides)
    location = resolve_location_for(project, zone, spec)
    plan = lifecycle.plan_create(spec, project=location.project, zone=location.zone)
    if dry_run:
        from tpuctl.render.request import request_as_dict

        result = _create_result("dry_run", plan.name, plan.request_id, None)
        result["request"] = request_as_dict(plan.request)
        app.info(f"dry run: would create {location.queued_resource_name(plan.name)}")
        app.emit(result, _line(_json(result["request"])))
        return
    api = connect_api(location, impersonate)
    created = lifecycle.create(api, plan, delete_on_interrupt=delete_on_interrupt)
    verb = "created" if created["action"] == "created" else "already exists from this spec:"
    app.info(f"{verb} {plan.name} ({created['queued_resource']['state']})")
    result = _create_result(
        created["action"], plan.name, created["request_id"], created["queued_resource"]
    )
    if wait_after:
        options = _wait_options(
            spec,
            until=until,
            queue_timeout=queue_timeout,
            provision_timeout=provision_timeout,
            keep_on_timeout=keep_on_timeout,
            delete_on_interrupt=delete_on_interrupt,
        )
        try:
            with Progress(app, plan.name).shown() as progress:
                result["wait"] = lifecycle.wait(api, plan.name, options, on_event=progress)
        except KeyboardInterrupt:
            # Between create and the first poll: same report as during the wait.
            state = lifecycle.observe(api, plan.name) if not delete_on_interrupt else None
            raise lifecycle.interrupted(
                api, plan.name, state, delete_on_interrupt, during="waiting for"
            ) from None
        result["queued_resource"] = result["wait"]["queued_resource"]
    if spec.job is not None and spec.job.code and not spec.job.code.startswith("gs://"):
        # The startup script cannot fetch a local directory: the job waits until tpuctl
        # delivers it over SSH, which create does not do.
        app.info(
            f"note: job.code {spec.job.code} is local, so the job starts once it is delivered: "
            f"run `tpuctl up {spec_path}` (delivers it, then babysits the job)"
        )
    app.emit(result, _draw_status(result["queued_resource"]))


def _create_result(
    action: str, name: str, request_id: str | None, summary: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "action": action,
        "name": name,
        "request_id": request_id,
        "queued_resource": summary,
        "request": None,
        "wait": None,
    }


def _json(data: Any) -> str:
    from tpuctl.cli.context import to_json

    return to_json(data)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    from tpuctl.cloud import lifecycle

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    api = connect_api(resolved.location, impersonate)
    summary = lifecycle.status(api, resolved.name)
    if not show_jobs:
        app.emit(summary, _draw_status(summary))
        return
    summary["jobs"] = _job_statuses(app, api, resolved, summary, ssh_settings(app, **ssh))
    app.emit(summary, _draw_status_and_jobs(summary))


# ---------------------------------------------------------------------- status --jobs


def _job_statuses(
    app: AppContext, api: Any, resolved: Target, summary: dict[str, Any], settings: SshSettings
) -> list[dict[str, Any]]:
    """Every worker's startup-script job (tpuctl.fanout.jobs), or [] when there are no workers."""
    from tpuctl.fanout import jobs
    from tpuctl.fanout.operations import prepare_fleet

    run_name = jobs.resolve_run_name(api, resolved.name, resolved.spec)
    if summary["state"] != "ACTIVE":
        app.warn(f"{resolved.name} is {summary['state']}: no workers to read the job from")
        return []
    fleet = prepare_fleet(api, resolved.name, settings, on_progress=app.info)
    return [status.to_dict() for status in jobs.job_status_for_run(fleet, run_name)]


def _draw_status_and_jobs(summary: dict[str, Any]) -> Callable[[Console], None]:
    draw_status = _draw_status(summary)

    def draw(console: Console) -> None:
        from rich.table import Table

        draw_status(console)
        if not summary["jobs"]:
            return
        table = Table(box=None, pad_edge=False, title="job", title_justify="left")
        columns = ("SLICE", "WORKER", "STATE", "BOOT", "PID", "STARTED", "EXIT", "HEARTBEAT")
        for column in (*columns, "REASON / ERROR"):
            table.add_column(column, overflow="fold")
        for job in summary["jobs"]:
            pid = (
                "-"
                if job["pid"] is None
                else f"{job['pid']}{'' if job['trainer_alive'] else ' (gone)'}"
            )
            age = job["heartbeat_age_s"]
            table.add_row(
                str(job["slice"]),
                str(job["worker"]),
                job["state"],
                "-" if job["boot"] is None else str(job["boot"]),
                pid,
                job["started"] or "-",
                "-" if job["exit_code"] is None else str(job["exit_code"]),
                "-" if age is None else f"{_human_seconds(age)} ago",
                job["error"] or job["reason"] or "",
            )
        console.print(table)

    return draw


@click.command("list")
@click.option("--all", "include_all", is_flag=True, default=False, help="Not only tpuctl's.")
@project_zone_options
@impersonate_option
@output_option
def list_command(
    *, include_all: bool, project: str | None, zone: str | None, impersonate: str | None
) -> None:
    """List tpuctl's queued resources in the zone (every one with --all)."""
    from tpuctl.cloud import lifecycle

    app = app_context()
    api = connect_api(resolve_location_for(project, zone, None), impersonate)
    result = lifecycle.list_queued_resources(api, include_all=include_all)
    app.emit(result, _draw_list(result))


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    until: str,
    queue_timeout: float | None,
    provision_timeout: float | None,
    keep_on_timeout: bool,
    delete_on_interrupt: bool,
) -> None:
    """Wait for a state (ACTIVE by default) with separate queueing and provisioning deadlines.

    At a deadline the queued resource is deleted (exit 4) unless --keep-on-timeout; FAILED
    exits 6, SUSPENDED or preempted 7; Ctrl-C prints the command that deletes it (exit 130).
    Deadlines count from when this wait first sees the phase.
    """
    from tpuctl.cloud import lifecycle

    app = app_context()
    resolved = resolve_target(app, target, project, zone)
    api = connect_api(resolved.location, impersonate)
    options = _wait_options(
        resolved.spec,
        until=until,
        queue_timeout=queue_timeout,
        provision_timeout=provision_timeout,
        keep_on_timeout=keep_on_timeout,
        delete_on_interrupt=delete_on_interrupt,
    )
    with Progress(app, resolved.name).shown() as progress:
        result = lifecycle.wait(api, resolved.name, options, on_event=progress)
    summary = result["queued_resource"]
    app.emit(result, _draw_status(summary) if summary else _line(f"{resolved.name}: gone"))


@click.command()
@click.argument("target", metavar="NAME")
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
    api = connect_api(resolved.location, impersonate)
    with Progress(app, resolved.name).shown() as progress:
        result = lifecycle.reset(
            api, resolved.name, wait_for_active=wait_after, timeout=timeout, on_event=progress
        )
    app.emit(result, _line(f"{resolved.name}: {result['action'].replace('_', ' ')}"))


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    api = connect_api(resolved.location, impersonate)
    with Progress(app, resolved.name).shown() as progress:
        result = lifecycle.delete(
            api,
            resolved.name,
            force=force,
            wait_until_gone=not no_wait,
            ignore_missing=ignore_missing,
            timeout=timeout,
            on_event=progress,
        )
    messages = {
        "deleted": f"deleted {resolved.name}",
        "delete_requested": f"delete of {resolved.name} requested",
        "missing": f"{resolved.name} does not exist; nothing to delete",
    }
    app.emit(result, _line(messages[result["action"]]))


def _confirm_delete(resolved: Target, force: bool) -> None:
    where = f"{resolved.location.project}/{resolved.location.zone}"
    if not sys.stdin.isatty():
        raise UsageError(
            f"refusing to delete {resolved.name} in {where} without confirmation "
            "(stdin is not a terminal)",
            hint="pass --yes",
        )
    nodes = " and its nodes" if force else ""
    if not click.confirm(f"Delete queued resource {resolved.name}{nodes} in {where}?", err=True):
        raise TpuctlError(f"not deleted: {resolved.name}", hint="you declined")
