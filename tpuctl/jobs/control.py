"""Job control: deliver the startup-script job's code and (re)start it, read its status, stop
or restart it on every worker, over one SSH fan-out each.

The job itself is run by the startup script (tpuctl.render.startup) as root on every boot; this
module only talks to what that script leaves on a worker (tpuctl.worker: the status file, the
startup lock, the code-ready marker in the workdir). Every value from the spec reaches the
remote shell through `shlex.quote`. Remote scripts are POSIX sh, run by the login shell.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl import worker as contract
from tpuctl.errors import UsageError
from tpuctl.fanout.engine import EventCallback, OutputCallback, run_fanout
from tpuctl.fanout.operations import Fleet, pack_local
from tpuctl.fanout.remote import UPLOAD_CHECKSUM_EXIT
from tpuctl.fanout.results import NOT_REACHED, FanoutResult, Transfer, WorkerResult
from tpuctl.jobs.scripts import (
    LOCK_WAIT_SECONDS,
    check_run_name,
    deliver_script,
    job_log_script,
    mark_done_script,
    probe_script,
    restart_script,
    stop_script,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.describe import QueuedResourceStatus
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.spec.model import JobSpec, Spec

DEFAULT_GRACE = 30.0


# --------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class WorkerJobStatus:
    """One worker's startup-script job, as its status file tells it.

    `state` is the script's (starting, setup, waiting-for-code, waiting-for-zone, running,
    exited, done, setup-failed), `none` when this run never started on the worker, or `unknown`
    when the worker could not be read (`reachable` False, `error` says why). `trainer_alive` is
    whether the recorded pid still leads its own process group (a live trainer), measured on the
    worker.
    """

    slice: int
    node: str
    worker: int
    state: str
    boot: int | None
    pid: int | None
    started: str | None
    exit_code: int | None
    heartbeat_age_s: float | None
    reason: str | None
    reachable: bool
    trainer_alive: bool = False
    error: str | None = None
    # The supervisor itself forwarded a SIGTERM/SIGINT to the trainer: a graceful shutdown of
    # the VM (spot soft-off, reboot), so an exit that follows is saved-and-stopped, not done.
    signalled: bool = False
    last_line: str | None = None  # the job log's last line

    @property
    def label(self) -> str:
        return f"{self.slice}/{self.worker}"


@dataclass(frozen=True)
class Delivery:
    """What delivering and (re)starting the job did on one worker: the code's sha256 when it
    was uploaded, the workdir, whether the startup script was `started` or `skipped` (the job
    was running), the pid of the startup run; and for a restart, the signal that stopped the
    old trainer (TERM, KILL, or None when none was running)."""

    uploaded: str | None = None
    workdir: str | None = None
    startup: str | None = None
    pid: int | None = None
    stopped: str | None = None


@dataclass(frozen=True)
class JobStop:
    """`stopped` (with the signal that did it) or `not-running`, and the trainer's pid."""

    state: str | None
    pid: int | None
    signal: str | None = None


# ------------------------------------------------------------------------------- delivering


def pack_code(path: Path) -> bytes:
    """job.code as tar.gz: a directory's contents, or one file under its own name."""
    if not path.exists():
        raise UsageError(
            f"job.code {path} does not exist", hint="job.code is relative to the spec file"
        )
    return pack_local(path)


def deliver_and_start(
    fleet: Fleet, spec: Spec, *, on_event: EventCallback | None = None
) -> FanoutResult:
    """Put the spec's job on every worker and (re)run the startup script there.

    With a local job.code (a directory's contents, or one file) the archive is packed once,
    streamed to every worker, checked (sha256) and unpacked into the job user's workdir, and
    `<workdir>/.tpuctl-uploaded` is created last; then the startup script runs again, detached,
    and launches the job (its lock keeps a running trainer the only one: it goes on with the
    code it started with until `restart_job`). With gs:// code or none, the script is rerun
    only where the job is not running. Per worker, `detail` is a Delivery.
    """
    from tpuctl.spec.load import resolve_code_path

    job = _job(spec)
    run_name = check_run_name(spec.run_name)
    local = resolve_code_path(spec)
    archive = pack_code(local) if local is not None else None
    digest = None if archive is None else hashlib.sha256(archive).hexdigest()
    result = run_fanout(
        fleet.targets,
        deliver_script(spec, digest),
        fleet.connect,
        fleet.options(stdin=archive),
        on_event=on_event,
    )
    for worker in result:
        worker.detail = _delivery(worker.stdout.text())
        if worker.exit_code == UPLOAD_CHECKSUM_EXIT:
            worker.error = "checksum mismatch after transfer"
        elif worker.ok and worker.detail.startup is None:
            worker.status = "failed"
            worker.error = "the startup script was not started"
    result.operation, result.run = "deliver", run_name
    if archive is not None:
        result.transfer = Transfer(digest, len(archive), job.code, job.workdir)
    return result


def _delivery(output: str, stopped: str | None = None) -> Delivery:
    uploaded = workdir = startup = None
    pid = None
    for line in output.splitlines():
        words = line.split(" ", 2)
        if words[0] == "uploaded" and len(words) == 3:
            uploaded, workdir = words[1], words[2]
        elif words[0] == "startup" and len(words) == 3:
            startup, pid = words[1], _int(words[2].split()[-1])
    return Delivery(uploaded, workdir, startup, pid, stopped)


# ---------------------------------------------------------------------------------- status


def probe_jobs(fleet: Fleet, run_name: str) -> FanoutResult:
    """Read every worker's status file in one fan-out; `detail` is its WorkerJobStatus, so the
    fan-out table and JSON show it."""
    script = probe_script(run_name)
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(keep_output=True))
    for worker in result:
        worker.detail = parse_probe(worker)
        worker.stdout = type(worker.stdout)()  # parsed into `detail`; not output to show
    result.operation, result.run = "job-status", run_name
    return result


def job_logs(
    fleet: Fleet,
    run_name: str,
    *,
    lines: int | None = 20,
    follow: bool = False,
    on_output: OutputCallback | None = None,
    raw: bool = False,
) -> FanoutResult:
    """Every worker's job log (the current boot's): its last `lines` (None: all of it), or
    `follow` it; the text streams through `on_output` (as lines, or `raw` byte for byte)."""
    script = job_log_script(run_name, lines, follow=follow)
    options = fleet.options(raw_output=raw)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_output=on_output)
    result.operation, result.run = "logs", run_name
    return result


def statuses_of(result: FanoutResult) -> list[WorkerJobStatus]:
    """The WorkerJobStatus of every worker of a `probe_jobs` result, in target order."""
    statuses = []
    for worker in result:
        assert isinstance(worker.detail, WorkerJobStatus)
        statuses.append(worker.detail)
    return statuses


def job_status_for_run(fleet: Fleet, run_name: str) -> list[WorkerJobStatus]:
    """Every selected worker's job status for `run_name`."""
    return statuses_of(probe_jobs(fleet, run_name))


def job_status(fleet: Fleet, spec: Spec) -> list[WorkerJobStatus]:
    """Every selected worker's job status for the spec's run (see WorkerJobStatus)."""
    job = _job(spec)
    return job_status_for_run(fleet, job.run_name or spec.name)


def parse_probe(worker: WorkerResult) -> WorkerJobStatus:
    """One worker's WorkerJobStatus from its `probe_script` result (unknown if it failed)."""
    target = worker.target
    if not worker.ok:
        return WorkerJobStatus(
            target.slice_index, target.node_id, target.worker, "unknown", None, None, None,
            None, None, None, reachable=worker.status not in NOT_REACHED,
            error=worker.error or worker.stderr.text() or worker.status,
        )  # fmt: skip
    values: dict[str, str] = {}
    for line in worker.stdout.bytes().decode("utf-8", errors="replace").splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    status = {key: values.get(f"status.{key}", "") for key in contract.STATUS_KEYS}
    now, heartbeat = _int(values.get("now")), _int(status["heartbeat"])
    age = float(max(0, now - heartbeat)) if now is not None and heartbeat is not None else None
    boot = _int(status["boot"])
    return WorkerJobStatus(
        slice=target.slice_index,
        node=target.node_id,
        worker=target.worker,
        state=status["state"] or contract.NO_STATUS,
        boot=boot if boot is not None else _int(values.get("bootfile")),
        pid=_int(status["pid"]),
        started=status["started"] or None,
        exit_code=_int(status["exit_code"]),
        heartbeat_age_s=age,
        reason=status["reason"] or None,
        reachable=True,
        trainer_alive=values.get("alive") == "1",
        signalled=status["signalled"] == "1",
        last_line=values.get("last") or None,
    )


def run_name_of(api: TpuApi, name: str) -> str | None:
    """The run name a queued resource was created for (its nodes' `tpuctl-run` label), or None.

    Labels are lowercased and limited to [a-z0-9_-], so a run name with capitals or dots does
    not survive: pass the spec instead.
    """
    from tpuctl.cloud.describe import template_of

    labels = template_of(api.get_queued_resource(name)).labels
    return labels.get(contract.RUN_LABEL) or None


def resolve_run_name(api: TpuApi, name: str, spec: Spec | None) -> str:
    """The run whose job to read: the spec's, else the queued resource's `tpuctl-run` label."""
    if spec is not None:
        return check_run_name(spec.run_name)
    found = run_name_of(api, name)
    if found is None:
        raise UsageError(
            f"{name} has no tpuctl-run label, so its job's run name is unknown",
            hint="pass the spec file instead of the name",
        )
    return check_run_name(found)


def mark_done(fleet: Fleet, spec: Spec, reason: str) -> FanoutResult:
    """Write the done marker (with why) on every worker's disk, for a spec without
    checkpoint.dir; the startup script then never relaunches the job there."""
    run_name = check_run_name(spec.run_name)
    result = run_fanout(
        fleet.targets,
        mark_done_script(run_name),
        fleet.connect,
        fleet.options(stdin=reason.encode()),
    )
    result.operation, result.run = "mark-done", run_name
    return result


# ------------------------------------------------------------------------------ stop/restart


def stop_job(
    fleet: Fleet,
    spec: Spec,
    grace: float = DEFAULT_GRACE,
    *,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """SIGTERM to the trainer's process group on every worker, SIGKILL after `grace` seconds.

    The supervisor records the exit (state `exited`); no done marker is written, so the next
    boot or `restart_job` launches the job again. `detail` is a JobStop.
    """
    _job(spec)
    run_name = check_run_name(spec.run_name)
    options = fleet.options(timeout=grace + 30.0)
    script = stop_script(run_name, grace)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_event=on_event)
    for worker in result:
        worker.detail = _job_stop(worker.stdout.text())
        if worker.ok and worker.detail.state is None:
            worker.status, worker.error = "failed", "no state reported"
    result.operation, result.run = "stop-job", run_name
    return result


def restart_job(
    fleet: Fleet,
    spec: Spec,
    *,
    grace: float = DEFAULT_GRACE,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """Stop whatever is left of the job on every worker and run the startup script again.

    For a job that exited without being done: the trainer's process group gets SIGTERM, then
    SIGKILL after `grace`; the startup lock is awaited (the supervisor leaves once its trainer
    is gone) and anything still holding it is killed; then the script runs again, detached,
    and relaunches the job because no done marker exists (with one, it records `done`).
    `detail` is a Delivery (with `stopped`).
    """
    _job(spec)
    run_name = check_run_name(spec.run_name)
    options = fleet.options(timeout=grace + 3 * LOCK_WAIT_SECONDS + 30.0)
    script = restart_script(run_name, grace)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_event=on_event)
    for worker in result:
        output = worker.stdout.text()
        stopped = next(
            (line.split()[1] for line in output.splitlines() if line.startswith("stopped ")),
            "none",
        )
        worker.detail = _delivery(output, None if stopped == "none" else stopped)
        if worker.ok and worker.detail.startup is None:
            worker.status, worker.error = "failed", "the startup script was not started"
    result.operation, result.run = "restart", run_name
    return result


# ----------------------------------------------------------------------------------- helpers


def _job(spec: Spec) -> JobSpec:
    if spec.job is None:
        raise UsageError(f"{spec.source} has no job section: there is no job on the workers")
    return spec.job


def _job_stop(output: str) -> JobStop:
    for line in reversed(output.splitlines()):
        if line.startswith("state="):
            pairs = dict(part.partition("=")[::2] for part in line.split())
            return JobStop(
                pairs.get("state") or None, _int(pairs.get("pid")), pairs.get("signal") or None
            )
    return JobStop(None, None)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def jobs_of(
    api: TpuApi,
    status: QueuedResourceStatus,
    spec: Spec | None,
    settings: SshSettings,
    *,
    on_progress: Callable[[str], None] | None = None,
) -> list[WorkerJobStatus]:
    """`status --jobs`: every worker's job of an ACTIVE queued resource ([] otherwise); the run
    name comes from the spec, else the queued resource's label."""
    from tpuctl.jobs.fleet import prepare_fleet

    run_name = resolve_run_name(api, status.name, spec)
    if status.state != "ACTIVE":
        return []
    fleet = prepare_fleet(api, status.name, settings, on_progress=on_progress)
    return job_status_for_run(fleet, run_name)
