"""`tpuctl gc`: delete the queued resources tpuctl left behind; the logic is in tpuctl.jobs.gc."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.options import (
    DURATION,
    dry_run_option,
    impersonate_option,
    output_option,
    project_zone_options,
    ssh_settings,
    worker_ssh_options,
    yes_option,
    zones_options,
)
from tpuctl.cli.output import emit
from tpuctl.cli.targets import connect_zones, warn_zone_errors
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from tpuctl.jobs.gc import GarbageCollection


@click.command()
@click.option(
    "--older-than",
    type=DURATION,
    default=None,
    metavar="DURATION",
    help="Only queued resources created at least this long ago (e.g. 1d, 12h).",
)
@project_zone_options
@zones_options
@impersonate_option
@click.option(
    "--timeout", type=DURATION, default=600.0, help="Give up waiting for each to go after this."
)
@click.option(
    "--include-exited",
    is_flag=True,
    default=False,
    help="Also delete an ACTIVE one whose job exited on every worker without being done "
    "(crashed, or finished without its marker), unless a tpuctl up babysits it; the row "
    "gives the exit codes.",
)
@dry_run_option
@yes_option
@worker_ssh_options
@output_option
def gc(
    *,
    older_than: float | None,
    project: str | None,
    zone: str | None,
    zones: str | None,
    all_zones: bool,
    impersonate: str | None,
    timeout: float,
    include_exited: bool,
    dry_run: bool,
    yes: bool,
    **ssh: Any,
) -> None:
    """Delete tpuctl's queued resources that nothing will use again: SUSPENDED, FAILED, or
    ACTIVE with a done job or with none.

    An ACTIVE one's job is read on every worker over SSH, as `status --jobs` does (the run name
    from its tpuctl-run label): done everywhere, or never started anywhere, makes it
    collectable; an unreachable worker keeps it. A job that exited on every worker without
    being done (crashed, or finished without its marker: what a dead laptop or CI run leaves
    billed) is kept, its row giving the exit codes, unless --include-exited; a live `tpuctl up`
    babysitting it keeps it anyway. Everything else (queueing, provisioning, a job still
    running) is kept, and every row says why. Queued resources without tpuctl's labels are
    never touched. Deletes take the nodes too (force) and go side by side, and the host-key pins
    of the nodes deleted are removed from tpuctl's known-hosts file (said on stderr; with
    --dry-run, what would be removed).

    Without --yes it asks on a terminal and refuses elsewhere (exit 2). Exits 1 when a delete
    failed, else with the code of a zone that could not be listed (as `list`).
    """
    from tpuctl.cli.views.gc import gc_total, gc_view
    from tpuctl.jobs import gc as garbage

    app = app_context()
    if not (dry_run or yes or sys.stdin.isatty()):
        raise UsageError(
            "refusing to delete without confirmation (stdin is not a terminal)",
            hint="pass --yes to delete, or --dry-run to only list",
        )
    api, asked = connect_zones(project, zone, zones, all_zones, impersonate)
    options = garbage.GcOptions(
        older_than=older_than,
        dry_run=dry_run,
        ssh=ssh_settings(app, **ssh),
        include_exited=include_exited,
    )
    result = garbage.survey(api, asked, options, on_progress=app.info)
    warn_zone_errors(app, result.zone_errors)
    if result.doomed and not dry_run:
        if not yes:
            _confirm(result)
        garbage.collect(api, result, timeout=timeout, on_progress=app.info)
    app.info(gc_total(result))
    if result.pins:
        count = f"{len(result.pins)} host-key pin{'s' if len(result.pins) != 1 else ''}"
        done = "dry run: would prune" if dry_run else "pruned"
        app.info(
            f"{done} {count} of deleted nodes from {result.known_hosts} ({', '.join(result.pins)})"
        )
    emit(result, gc_view)


def _confirm(result: GarbageCollection) -> None:
    doomed = result.doomed
    names = ", ".join(f"{row.name} ({row.zone}, {row.state})" for row in doomed)
    if not click.confirm(
        f"Delete {len(doomed)} queued resource(s) of {result.project} with their nodes: {names}?",
        err=True,
    ):
        raise TpuctlError("nothing deleted", hint="you declined")
