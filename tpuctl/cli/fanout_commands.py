"""SSH fan-out commands: ssh, ps, logs, stop, upload, download, run; the logic is in tpuctl.fanout.

Exit codes: 0 every worker ok; 3 a command failed somewhere; 4 a command or connection timed
out; 10 workers unreachable (worse than a failure, so it wins); 8 a host key did not match;
130 interrupted. The result (table, or JSON/YAML) is printed first in every case.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.options import (
    DURATION,
    app_context,
    impersonate_option,
    output_option,
    project_zone_options,
    set_option,
    ssh_settings,
    worker_ssh_options,
)
from tpuctl.cli.targets import connect_api, load_spec_warned, resolve_location_for, resolve_target
from tpuctl.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.cli.context import AppContext
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult
    from tpuctl.fanout.targets import WorkerTarget

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------------------------- options


def ssh_options(func: F) -> F:
    """Options shared by every fan-out command: reaching the workers, and how hard to try."""
    options = [
        worker_ssh_options,
        click.option(
            "--connect-timeout",
            type=DURATION,
            default=20.0,
            show_default=True,
            help="Deadline for TCP connect + SSH handshake + auth, per attempt.",
        ),
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=64,
            show_default=True,
            help="Connections being set up at once (running commands never hold a slot).",
        ),
        impersonate_option,
        project_zone_options,
        output_option,
    ]
    for option in options:
        func = option(func)
    return func


def selector_options(default: str = "all") -> Callable[[F], F]:
    def decorate(func: F) -> F:
        func = click.option(
            "--worker",
            default=None,
            help=f"Workers: all, 0, 1,3 or 0-7 (default {default}).",
        )(func)
        return click.option(
            "--node",
            default=None,
            help=f"Slices (nodes) by index, or node ids: all, 0, 1,3 or 0-3 (default {default}).",
        )(func)

    return decorate


def _fleet(
    app: AppContext,
    target: str,
    params: dict[str, Any],
    *,
    node: str | None,
    worker: str | None,
    default: str = "all",
    user: str | None = None,
) -> Fleet:
    from tpuctl.fanout.operations import prepare_fleet

    resolved = resolve_target(app, target, params.pop("project"), params.pop("zone"))
    api = connect_api(resolved.location, params.pop("impersonate"))
    settings = ssh_settings(app, **{**params, "user": params.get("user") or user})
    return prepare_fleet(
        api,
        resolved.name,
        settings,
        nodes=node or default,
        workers=worker or default,
        on_progress=app.info,
    )


SSH_KEYS = (
    "user",
    "internal_ip",
    "ssh_port",
    "strict_host_key_checking",
    "connect_timeout",
    "batch_size",
    "impersonate",
    "project",
    "zone",
)


def _ssh_params(values: dict[str, Any]) -> dict[str, Any]:
    return {key: values.pop(key) for key in SSH_KEYS}


# ------------------------------------------------------------------------------- output


class PrefixedOutput:
    """Worker lines to our stdout/stderr as `[slice/worker] line` (whole lines, one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, target: WorkerTarget, stream: str, lines: bytes) -> None:
        prefix = f"[{target.label}] ".encode()
        data = b"".join(prefix + line + b"\n" for line in lines.rstrip(b"\n").split(b"\n"))
        out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        with self._lock:
            out.write(data)
            out.flush()


class OutputFiles:
    """One file per worker and stream: <dir>/<node>-w<worker>.out|.err (no cross-slice clash)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._files: dict[tuple[str, int, str], Any] = {}

    def path(self, target: WorkerTarget, stream: str) -> Path:
        suffix = "out" if stream == "stdout" else "err"
        return self.directory / f"{target.node_id}-w{target.worker}.{suffix}"

    def __call__(self, target: WorkerTarget, stream: str, lines: bytes) -> None:
        key = (target.node_id, target.worker, stream)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = self.path(target, stream).open("ab")
        handle.write(lines)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


def _status_cell(row: dict[str, Any]) -> str:
    status = str(row["status"])
    return status.upper() if status != "ok" else status


def _draw_result(result: FanoutResult, extra_columns: bool = False) -> Callable[[Console], None]:
    data = result.to_dict()

    def draw(console: Console) -> None:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        columns = ["WORKER", "NODE", "ADDRESS", "STATUS", "EXIT", "TIME", "LAST OUTPUT / ERROR"]
        if extra_columns:
            columns[6:6] = ["RUN", "PID", "STATE"]
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in data["workers"]:
            note = row["error"] or _last_line(row["stderr_tail"]) or _last_line(row["stdout_tail"])
            cells = [
                f"{row['slice']}/{row['worker']}",
                row["node"],
                row["address"],
                _status_cell(row),
                "-" if row["exit_code"] is None else str(row["exit_code"]),
                f"{row['duration_s']:.1f}s",
                note or "",
            ]
            if extra_columns:
                detail = row["detail"] or {}
                cells[6:6] = [
                    str(detail.get("run") or "-"),
                    str(detail.get("pid") or "-"),
                    _describe_state(detail),
                ]
            table.add_row(*cells)
        console.print(table)
        summary = data["summary"]
        parts = [f"{summary[s]} {s}" for s in ("ok", *_BAD) if summary.get(s)]
        console.print(
            f"{summary['workers']} workers: {', '.join(parts)} in {summary['duration_s']:.1f}s",
            markup=False,
        )

    return draw


_BAD = ("failed", "unreachable", "timeout", "hostkey-mismatch", "interrupted")


def _describe_state(detail: dict[str, Any]) -> str:
    from tpuctl.fanout.remote import RunState

    if "state" not in detail:
        return "started" if detail.get("pid") else "-"
    return RunState(
        detail["state"], detail.get("run"), detail.get("pid"), detail.get("exit_code"),
        detail.get("signal"),
    ).describe()  # fmt: skip


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:120] if lines else ""


def _finish(
    app: AppContext, result: FanoutResult, *, extra_columns: bool = False, ok_when: bool = False
) -> None:
    """Print the result, name the workers still running at an interrupt, set the exit code."""
    app.emit(result.to_dict(), _draw_result(result, extra_columns))
    if result.interrupted:
        running = [r.target.label for r in result if r.started and r.status == "interrupted"]
        if running:
            app.warn(f"interrupted while still running on: {', '.join(running)}")
    code = ExitCode.OK if ok_when else result.exit_code
    if code != ExitCode.OK:
        error = result.error()
        if error is not None:
            sys.stderr.write(f"error: {error.one_line()}\n")
        sys.stderr.flush()
        # The result is already on stdout (one JSON document with --format json): exit with
        # the code without a second, error-shaped document.
        click.get_current_context().exit(int(code))


def _retry_note(app: AppContext) -> Callable[[WorkerTarget, str, str], None]:
    def note(target: WorkerTarget, kind: str, message: str) -> None:
        if kind == "retry":
            app.info(f"[{target.label}] connection set-up failed, retrying: {message}")

    return note


# ------------------------------------------------------------------------------- commands


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("target", metavar="NAME|SPEC")
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
    **values: Any,
) -> None:
    """Run COMMAND on the selected workers of every slice (tpuctl ssh NAME -- COMMAND…).

    Output is streamed as `[slice/worker] line`, then a table of every worker's exit code,
    duration and status. With no COMMAND and one worker, opens an interactive shell.
    --detach starts COMMAND in its own session on every worker (see ps, logs, stop).
    """
    from tpuctl.fanout import operations

    app = app_context()
    text = command[0] if len(command) == 1 else " ".join(command)
    if not text and (detach or timeout or output_dir):
        raise UsageError("--detach, --timeout and --output-dir need a COMMAND")
    params = _ssh_params(values)
    fleet = _fleet(app, target, params, node=node, worker=worker, default="all" if text else "0")
    if not text:
        _shell(fleet)
        return
    if detach:
        result = operations.start_detached(fleet, text, on_event=_retry_note(app))
        app.info(f"run {result.extra['run_id']} started on {len(result.succeeded)} workers")
        _finish(app, result, extra_columns=True)
        return
    files = OutputFiles(output_dir) if output_dir is not None else None
    sink: Any = files if files is not None else (None if app.machine_output else PrefixedOutput())
    try:
        result = operations.run_command(
            fleet, text, timeout=timeout, on_output=sink, on_event=_retry_note(app)
        )
    finally:
        if files is not None:
            files.close()
    _finish(app, result)


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


def _run_option(func: F) -> F:
    return click.option(
        "--run", "run_id", default=None, help="Run id (default: the latest run on each worker)."
    )(func)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    if startup_job:
        if run_id is not None:
            raise UsageError("--job shows the startup-script job; --run names a detached run")
        _job_ps(app, target, _ssh_params(values), node=node, worker=worker)
        return
    fleet = _fleet(app, target, _ssh_params(values), node=node, worker=worker)
    _finish(app, operations.run_status(fleet, run_id), extra_columns=True)


def _job_ps(
    app: AppContext, target: str, params: dict[str, Any], *, node: str | None, worker: str | None
) -> None:
    """`ps --job`: every worker's startup-script job status, in the fan-out table and JSON."""
    from tpuctl.fanout import jobs
    from tpuctl.fanout.operations import prepare_fleet

    resolved = resolve_target(app, target, params.pop("project"), params.pop("zone"))
    api = connect_api(resolved.location, params.pop("impersonate"))
    run_name = jobs.resolve_run_name(api, resolved.name, resolved.spec)
    settings = ssh_settings(app, **params)
    fleet = prepare_fleet(
        api,
        resolved.name,
        settings,
        nodes=node or "all",
        workers=worker or "all",
        on_progress=app.info,
    )
    _finish(app, jobs.probe_jobs(fleet, run_name), extra_columns=True)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
@_run_option
@click.option("-n", "--lines", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("-f", "--follow", is_flag=True, default=False, help="Keep printing new lines.")
@selector_options()
@ssh_options
def logs(
    *,
    target: str,
    run_id: str | None,
    lines: int,
    follow: bool,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """The last lines of a detached run's log on every worker (prefixed), or --follow them."""
    from tpuctl.fanout import operations

    app = app_context()
    fleet = _fleet(app, target, _ssh_params(values), node=node, worker=worker)
    sink = None if app.machine_output else PrefixedOutput()
    result = operations.run_logs(fleet, run_id, lines=lines, follow=follow, on_output=sink)
    # Ctrl-C is how one stops following: not an error.
    _finish(app, result, ok_when=follow and result.interrupted)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    fleet = _fleet(app, target, _ssh_params(values), node=node, worker=worker)
    _finish(app, operations.stop_run(fleet, run_id, grace=grace), extra_columns=True)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
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
    fleet = _fleet(app, target, _ssh_params(values), node=node, worker=worker)
    destination = remote_dir or f"~/{local_dir.resolve().name}"
    result = operations.upload(fleet, local_dir, destination, on_event=_retry_note(app))
    app.info(
        f"uploaded {result.extra['bytes']} bytes (sha256 {str(result.extra['sha256'])[:12]}…) "
        f"to {destination} on {len(result.succeeded)}/{len(result)} workers"
    )
    _finish(app, result)


@click.command()
@click.argument("target", metavar="NAME|SPEC")
@click.argument("remote_path")
@click.argument("local_dir", type=click.Path(file_okay=False, path_type=Path))
@selector_options("0")
@ssh_options
def download(
    *,
    target: str,
    remote_path: str,
    local_dir: Path,
    node: str | None,
    worker: str | None,
    **values: Any,
) -> None:
    """Copy REMOTE_PATH (a file or directory) from one worker into LOCAL_DIR."""
    from tpuctl.fanout import operations

    app = app_context()
    fleet = _fleet(app, target, _ssh_params(values), node=node, worker=worker, default="0")
    result = operations.download(fleet, remote_path, local_dir)
    if "files" in result.extra:
        app.info(f"downloaded {result.extra['files']} entries into {local_dir}")
    _finish(app, result)


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
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
    from tpuctl.spec.load import resolve_code_path

    app = app_context()
    spec = load_spec_warned(app, spec_path, overrides)
    if spec.job is None:
        raise UsageError(f"{spec_path} has no job section: nothing to run")
    params = _ssh_params(values)
    location = resolve_location_for(params.pop("project"), params.pop("zone"), spec)
    api = connect_api(location, params.pop("impersonate"))
    from tpuctl.fanout.operations import prepare_fleet

    settings = ssh_settings(app, **{**params, "user": params.get("user") or spec.job.user})
    fleet = prepare_fleet(api, spec.name, settings, on_progress=app.info)
    code_dir = resolve_code_path(spec)
    job = operations.run_job(
        fleet, spec, code_dir=code_dir, on_progress=app.info, on_event=_retry_note(app)
    )
    result = job.result
    result.extra["step"] = list(job.steps)[-1]
    if job.run_id is not None:
        result.extra["run_id"] = job.run_id
        app.info(f"run {job.run_id} started on {len(result.succeeded)}/{len(result)} workers")
    if follow and not app.machine_output and job.run_id and result.exit_code == ExitCode.OK:
        first = fleet.only(fleet.targets[:1])
        app.info(f"following {first.targets[0].label}'s log (Ctrl-C stops following)")
        followed = operations.run_logs(
            first, job.run_id, lines=50, follow=True, on_output=PrefixedOutput()
        )
        if followed.interrupted:
            app.info(
                f"stopped following; the job keeps running (tpuctl stop {spec.name} "
                f"--run {job.run_id})"
            )
    _finish(app, result, extra_columns=job.run_id is not None)
