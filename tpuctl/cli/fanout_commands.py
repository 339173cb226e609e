"""SSH fan-out commands: ssh, ps, logs, stop, upload, download, run; the logic is in
tpuctl.fanout (the engine) and tpuctl.jobs (the fleet, job control, the runner).

Exit codes: 0 every worker ok; 3 a command failed somewhere; 4 a command ran past --timeout;
10 workers unreachable, a connection that did not come up within --connect-timeout included
(worse than a failure, so it wins); 8 a host key refused or unknown, or credentials refused (an
IAP tunnel); 2 a command too long for a worker's shell; 130 interrupted. The result (table, or
JSON/YAML) is printed first in every case.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.options import (
    DURATION,
    set_option,
    spec_argument,
    target_argument,
)
from tpuctl.cli.output import emit
from tpuctl.cli.progress import FanoutProgress
from tpuctl.cli.reach import reach, selector_options, ssh_options
from tpuctl.cli.streams import LogCollector, OutputFiles, PrefixedOutput
from tpuctl.cli.views.fanout import fanout_view
from tpuctl.errors import UsageError

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult


def _finish(
    app: AppContext,
    result: FanoutResult,
    *,
    quiet_when_ok: bool = False,
    output_on_stdout: bool = False,
) -> None:
    """Print the result; name the workers still running at an interrupt; exit with its code.
    `output_on_stdout`: the workers' own output went to stdout, which stays theirs alone (a
    script's `$(tpuctl ssh …)`): the table goes to stderr. `quiet_when_ok` (logs): stdout is
    the logs alone; the table goes to stderr, and only when a worker was not ok."""
    if result.interrupted and not result.interrupt_expected:
        running = [r.target.label for r in result if r.started and r.status == "interrupted"]
        if running:
            app.warn(f"interrupted while still running on: {', '.join(running)}")
    if not quiet_when_ok:
        emit(result, fanout_view, people_on_stderr=output_on_stdout)
    elif all(worker.ok for worker in result) or (result.interrupt_expected and result.interrupted):
        emit(result, lambda _result, _style: "", people_on_stderr=True)
    else:
        emit(result, fanout_view, people_on_stderr=True)


@click.command()
@target_argument
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@selector_options("all; 0/0 for a shell")
@click.option(
    "--detach", is_flag=True, default=False, help="Start in the background; print the run id."
)
@click.option("--timeout", type=DURATION, default=None, help="Deadline for the command itself.")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each worker's output to DIR/<node>-w<worker>.out/.err instead of the terminal.",
)
@click.option(
    "--stdin",
    "forward_stdin",
    is_flag=True,
    default=False,
    help="Read local stdin (a file or a pipe) once and send those bytes to COMMAND on every "
    "worker, then EOF. Without it COMMAND's stdin is empty.",
)
@ssh_options
def ssh(
    *,
    target: str,
    command: tuple[str, ...],
    node: str | None,
    worker: str | None,
    detach: bool,
    timeout: float | None,
    output_dir: Path | None,
    forward_stdin: bool,
    **values: Any,
) -> None:
    """Run COMMAND on the selected workers of every slice (tpuctl ssh NAME -- COMMAND…).

    One argument after `--` is a shell command line, run as written (`'make && ./train'`);
    several are an argv, each word quoted so it arrives as given (`-- python3 -c 'print(1)'`).
    Output is streamed as `[slice/worker] line` on stdout, then a table of every worker's exit
    code, duration and status on stderr (on stdout with --output-dir, where stdout has
    nothing else). --detach starts COMMAND in a process group of its own on every
    worker (see ps, logs, stop).

    Stdin: COMMAND reads EOF at once, so nothing waits for input; with --stdin it reads the
    bytes of local stdin (read once, the same on every worker), then EOF.

    With no COMMAND and one worker (default 0/0), a shell: at a terminal an interactive one
    (a pty); otherwise, with no pty, the shell reads local stdin until EOF and tpuctl exits
    with its exit code (`tpuctl ssh NAME --node 0 --worker 0 < script.sh`).
    """
    from tpuctl.fanout import operations

    app = app_context()
    text = command[0] if len(command) == 1 else shlex.join(command)
    if not text and (detach or timeout or output_dir):
        raise UsageError("--detach, --timeout and --output-dir need a COMMAND")
    local_stdin = sys.stdin.buffer
    if forward_stdin:
        _check_forwarding(text, detach, local_stdin.isatty())
    fleet = reach(
        app, target, values, node=node, worker=worker, default="all" if text else "0"
    ).fleet
    if not text:
        _shell(fleet)
        return
    progress = FanoutProgress(app, "detach" if detach else "ssh", len(fleet.targets))
    if detach:
        with progress.shown():
            result = operations.start_detached(fleet, text, on_event=progress)
        app.info(f"run {result.run} started on {len(result.succeeded)} workers")
        _finish(app, result)
        return
    files = OutputFiles(output_dir) if output_dir is not None else None
    sink: Any = files if files is not None else (None if app.machine_output else PrefixedOutput())
    try:
        with progress.shown(streaming=sink is not None and files is None):
            result = operations.run_command(
                fleet,
                text,
                timeout=timeout,
                on_output=sink,
                on_event=progress,
                raw=bool(files),
                stdin=local_stdin.read() if forward_stdin else None,
            )
    finally:
        if files is not None:
            files.close()
    _finish(app, result, output_on_stdout=isinstance(sink, PrefixedOutput))


def _check_forwarding(command: str, detach: bool, terminal: bool) -> None:
    """--stdin only where bytes read once can reach a command that reads them."""
    if not command:
        raise UsageError(
            "--stdin needs a COMMAND; the shell (no COMMAND) reads local stdin already",
            hint="tpuctl ssh NAME --node N --worker W < script.sh",
        )
    if detach:
        raise UsageError(
            "--stdin cannot be used with --detach: a detached run outlives tpuctl and reads "
            "/dev/null",
            hint="upload the input first (tpuctl upload) and have the command read the file",
        )
    if terminal:
        raise UsageError(
            "--stdin reads a file or a pipe, not a terminal",
            hint="tpuctl ssh NAME --stdin -- COMMAND < FILE, or PRODUCER | tpuctl ssh …",
        )


def _shell(fleet: Fleet) -> None:
    from tpuctl.fanout.interactive import interactive_shell

    if len(fleet.targets) != 1:
        raise UsageError(
            f"an interactive shell needs exactly one worker, {len(fleet.targets)} selected",
            hint="pass --node N --worker W, or a COMMAND to run on all of them",
        )
    code = interactive_shell(fleet.targets[0], fleet.connect)
    if code:
        click.get_current_context().exit(code)


F = TypeVar("F", bound=Callable[..., Any])


def _run_option(func: F) -> F:
    return click.option(
        "--run", "run_id", default=None, help="Run id (default: the latest run on each worker)."
    )(func)


@click.command()
@target_argument
@_run_option
@click.option(
    "--job",
    "startup_job",
    is_flag=True,
    default=False,
    help="Show the startup-script job (state, boot, pid, exit code, heartbeat) instead of "
    "detached runs; the run name comes from SPEC, or from NAME's tpuctl-run label.",
)
@selector_options()
@ssh_options
def ps(
    *,
    target: str,
    run_id: str | None,
    startup_job: bool,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """State of a detached run on every worker: running, exited (code), stopped or unknown.

    With --job, the state of the job the startup script runs: starting, setup,
    waiting-for-code, running, exited (code), done, setup-failed, or none.
    """
    from tpuctl.fanout import operations

    app = app_context()
    if startup_job and run_id is not None:
        raise UsageError("--job shows the startup-script job; --run names a detached run")
    reached = reach(app, target, values, node=node, worker=worker)
    if startup_job:
        from tpuctl.jobs import control

        name, spec = reached.target.name, reached.target.spec
        run_name = control.resolve_run_name(reached.api, name, spec)
        _finish(app, control.probe_jobs(reached.fleet, run_name))
        return
    _finish(app, operations.run_status(reached.fleet, run_id))


@click.command()
@target_argument
@_run_option
@click.option("-n", "--lines", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("-f", "--follow", is_flag=True, default=False, help="Keep printing new lines.")
@click.option(
    "--job",
    "startup_job",
    is_flag=True,
    default=False,
    help="The startup-script job's log instead of a detached run's (with or without --all); "
    "the run name comes from SPEC, or from NAME's tpuctl-run label.",
)
@click.option(
    "--all",
    "whole",
    is_flag=True,
    default=False,
    help="Gather the whole log of every selected worker instead of its last lines: the same "
    "log as without it (the latest detached run, --run's, or the job's with --job).",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each worker's log to DIR/<slice>-<worker>.log instead of prefixed lines.",
)
@selector_options()
@ssh_options
def logs(
    *,
    target: str,
    run_id: str | None,
    lines: int,
    follow: bool,
    startup_job: bool,
    whole: bool,
    output_dir: Path | None,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """The last lines of a detached run's log on every worker, prefixed: the latest run, the
    one --run names, or with --job the startup-script job's log; --follow them, or gather
    every worker's whole log with --all (to --output-dir). A worker with no detached run
    fails, saying so: the job's log is --job's.

    With --format json each worker's `detail` holds the log read, whole (up to 64 MiB a
    worker, then its end and how much was left out), and its exact bytes in base64 when they
    are not UTF-8."""
    from tpuctl.fanout import operations
    from tpuctl.jobs import control

    app = app_context()
    if startup_job and run_id is not None:
        raise UsageError("--job reads the startup-script job's log; --run names a detached run")
    if whole and follow:
        raise UsageError("--all gathers whole logs, --follow follows them: choose one")
    reached = reach(app, target, values, node=node, worker=worker)
    files = OutputFiles(output_dir, naming=OutputFiles.log_name) if output_dir else None
    collected = LogCollector() if app.machine_output and files is None else None
    sink: Any = files or collected or PrefixedOutput()
    wanted = None if whole else lines
    raw = files is not None or collected is not None  # files and the JSON: the bytes as sent
    try:
        if startup_job:
            run_name = control.resolve_run_name(
                reached.api, reached.target.name, reached.target.spec
            )
            result = control.job_logs(
                reached.fleet, run_name, lines=wanted, follow=follow, on_output=sink, raw=raw
            )
        else:
            result = operations.run_logs(
                reached.fleet, run_id, lines=wanted, follow=follow, on_output=sink, raw=raw
            )
    finally:
        if files is not None:
            files.close()
    if files is not None:
        app.info(f"wrote {len(files.written)} logs into {output_dir}")
    if collected is not None:
        for worker_result in result:
            worker_result.detail = collected.log(worker_result.target)
    result.interrupt_expected = follow  # Ctrl-C is how one stops following
    _finish(app, result, quiet_when_ok=True)


@click.command()
@target_argument
@_run_option
@click.option(
    "--grace", type=DURATION, default=10.0, show_default=True, help="SIGTERM, then SIGKILL after."
)
@selector_options()
@ssh_options
def stop(
    *,
    target: str,
    run_id: str | None,
    grace: float,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """Stop a detached run (its process group and session, children included) everywhere."""
    from tpuctl.fanout import operations

    app = app_context()
    fleet = reach(app, target, values, node=node, worker=worker).fleet
    _finish(app, operations.stop_run(fleet, run_id, grace=grace))


@click.command()
@target_argument
@click.argument("local_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("remote_dir", required=False, default=None)
@selector_options()
@ssh_options
def upload(
    *,
    target: str,
    local_dir: Path,
    remote_dir: str | None,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """Pack LOCAL_DIR once and unpack it into REMOTE_DIR (default ~/<name>) on every worker;
    each worker checks the archive's sha256 before extracting."""
    from tpuctl.fanout import operations

    app = app_context()
    fleet = reach(app, target, values, node=node, worker=worker).fleet
    destination = remote_dir or f"~/{local_dir.resolve().name}"
    with FanoutProgress(app, "upload", len(fleet.targets)).shown() as progress:
        result = operations.upload(fleet, local_dir, destination, on_event=progress)
    if result.transfer is not None and result.succeeded:  # else the table says why
        app.info(
            f"uploaded {result.transfer.bytes} bytes (sha256 {result.transfer.sha256}) to "
            f"{destination} on {len(result.succeeded)}/{len(result)} workers"
        )
    _finish(app, result)


@click.command()
@target_argument
@click.argument("remote_path")
@click.argument("local_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--all",
    "every_worker",
    is_flag=True,
    default=False,
    help="From every selected worker (default all), each into LOCAL_DIR/<slice>-<worker>/.",
)
@selector_options("0, or all with --all")
@ssh_options
def download(
    *,
    target: str,
    remote_path: str,
    local_dir: Path,
    every_worker: bool,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """Copy REMOTE_PATH (a file or directory) from one worker into LOCAL_DIR, or with --all
    from every worker at once, each streamed to disk as it arrives."""
    from tpuctl.fanout import operations

    app = app_context()
    default = "all" if every_worker else "0"
    fleet = reach(app, target, values, node=node, worker=worker, default=default).fleet
    with FanoutProgress(app, "download", len(fleet.targets)).shown() as progress:
        result = operations.download(
            fleet,
            remote_path,
            local_dir,
            every_worker=every_worker,
            on_event=progress,
            on_bytes=progress.add_bytes,
        )
    got = len(result.succeeded)
    if result.transfer is not None and result.transfer.files is not None and got:
        # Only when something came: the table says why a worker gave nothing.
        workers = f" from {got} of {len(result)} workers" if got < len(result) else ""
        app.info(f"downloaded {result.transfer.files} entries{workers} into {local_dir}")
    _finish(app, result)


@click.command()
@spec_argument
@set_option
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Follow worker 0's log after starting (Ctrl-C stops following, not the job).",
)
@ssh_options
def run(*, spec_path: str, overrides: tuple[str, ...], follow: bool, **values: Any) -> None:
    """Start SPEC's job on its ACTIVE queued resource, like MaxText's multihost_runner.

    Uploads job.code (a local directory), runs job.setup, kills whatever holds the TPU and
    removes the libtpu lockfile, starts job.command detached with job.env on every worker,
    then follows worker 0's log. The SSH user defaults to job.user.
    """
    from tpuctl.fanout import operations
    from tpuctl.jobs.runner import run_job
    from tpuctl.spec.load import load_spec, resolve_code_path

    app = app_context()
    spec = load_spec(spec_path, overrides=overrides).spec  # the warnings come with _reach's load
    if spec.job is None:
        raise UsageError(f"{spec_path} has no job section: nothing to run")
    values["user"] = values["user"] or spec.job.user
    fleet = reach(app, spec_path, values, node=None, worker=None, overrides=overrides).fleet
    job = run_job(
        fleet,
        spec,
        code_dir=resolve_code_path(spec),
        on_progress=app.info,
        on_event=FanoutProgress(app, "run", len(fleet.targets)),  # retry notes; steps are lines
    )
    result = job.result
    followed = False
    if job.run_id is not None:
        app.info(f"run {job.run_id} started on {len(result.succeeded)}/{len(result)} workers")
    if follow and not app.machine_output and job.run_id and not result.exit_code:
        first = fleet.only(fleet.targets[:1])
        app.info(f"following {first.targets[0].label}'s log (Ctrl-C stops following)")
        following = operations.run_logs(
            first, job.run_id, lines=50, follow=True, on_output=PrefixedOutput()
        )
        followed = True
        if following.interrupted:
            stop = shlex.join(["tpuctl", "stop", spec.name, "--run", job.run_id])
            app.info(f"stopped following; the job keeps running ({stop})")
    _finish(app, result, output_on_stdout=followed)
