"""The startup-script job on the workers: deliver its code and (re)start it, read its status,
stop or restart it, over one SSH fan-out each.

The job itself is run by the startup script (tpuctl.render.startup) as root on every boot; this
module only talks to what that script leaves on a worker: the status file
`${TPUCTL_VM_ROOT:-}/var/lib/tpuctl/<run>/status` (KEY=value lines), the startup lock, and the
code-ready marker in the workdir. Every value from the spec reaches the remote shell through
`shlex.quote`. Remote scripts are POSIX sh, run by the login shell.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.fanout.engine import EventCallback, run_fanout
from tpuctl.fanout.operations import Fleet, pack_local
from tpuctl.fanout.remote import UPLOAD_CHECKSUM_EXIT, receive_archive
from tpuctl.fanout.results import FanoutResult, WorkerResult
from tpuctl.render.startup import CODE_READY_MARKER, STATE_ROOT

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.spec.model import JobSpec, Spec

# Seconds a restart waits for the startup lock after the trainer's group is gone (the supervisor
# records the exit and leaves), before it kills whatever still holds the lock.
LOCK_WAIT_SECONDS = 10
DEFAULT_GRACE = 30.0
_STATUS_KEYS = ("state", "boot", "pid", "started", "exit_code", "heartbeat", "reason")
_JOB_STATES_WITHOUT_FILE = "none"


# --------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class WorkerJobStatus:
    """One worker's startup-script job, as its status file tells it.

    `state` is the script's (starting, setup, waiting-for-code, running, exited, done,
    setup-failed), `none` when this run never started on the worker, or `unknown` when the
    worker could not be read (`reachable` False, `error` says why). `trainer_alive` is whether
    the recorded pid still leads its own process group (a live trainer), measured on the worker.
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

    @property
    def label(self) -> str:
        return f"{self.slice}/{self.worker}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "slice": self.slice,
            "node": self.node,
            "worker": self.worker,
            "state": self.state,
            "boot": self.boot,
            "pid": self.pid,
            "trainer_alive": self.trainer_alive,
            "started": self.started,
            "exit_code": self.exit_code,
            "heartbeat_age_s": self.heartbeat_age_s,
            "reason": self.reason,
            "reachable": self.reachable,
            "error": self.error,
        }


# ------------------------------------------------------------------------------ shell pieces


def _state_dir(run_name: str) -> str:
    return '"${TPUCTL_VM_ROOT:-}"' + shlex.quote(f"{STATE_ROOT}/{_check_run_name(run_name)}")


def _check_run_name(run_name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", run_name):
        raise UsageError(f"{run_name!r} is not a run name (letters, digits, '.', '_', '-')")
    return run_name


# `as_root CMD…`: plain when the SSH user is root, else sudo -n (TPU VMs give gcloud's users
# password-less sudo). sudo drops the environment: the emulator's variables and the rerun flag
# are passed on.
_AS_ROOT = (
    'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n env '
    '${TPUCTL_VM_ROOT:+"TPUCTL_VM_ROOT=$TPUCTL_VM_ROOT"} '
    '${GCE_METADATA_HOST:+"GCE_METADATA_HOST=$GCE_METADATA_HOST"} '
    '${TPUCTL_STARTUP_RERUN:+"TPUCTL_STARTUP_RERUN=$TPUCTL_STARTUP_RERUN"} "$@"; fi; }\n'
)


def _job_user_prelude(user: str) -> str:
    """Sets `h` (the job user's home) and `as_job CMD…` (run as the job user), like the startup
    script: on an emulated worker the home is $TPUCTL_VM_ROOT/home/<user> and there is one OS
    user; on a real VM the user is created if the startup script has not done it yet."""
    return (
        _AS_ROOT + f"u={shlex.quote(user)}\n"
        'if [ -n "${TPUCTL_VM_ROOT:-}" ]; then\n'
        '  h="$TPUCTL_VM_ROOT/home/$u"; as_job() { "$@"; }\n'
        "else\n"
        '  if ! id -u -- "$u" >/dev/null 2>&1; then\n'
        '    as_root useradd -m -s /bin/bash -- "$u" ||\n'
        '      { echo "cannot create user $u" >&2; exit 1; }\n'
        "  fi\n"
        '  h=$(getent passwd -- "$u" | cut -d: -f6)\n'
        '  if [ "$(id -un)" = "$u" ]; then as_job() { "$@"; }\n'
        '  elif [ "$(id -u)" = 0 ]; then as_job() { runuser -u "$u" -- "$@"; }\n'
        '  else as_job() { sudo -n -u "$u" -- "$@"; }\n'
        "  fi\n"
        "fi\n"
        '[ -n "$h" ] || { echo "no home directory for $u" >&2; exit 1; }\n'
    )


def workdir_word(workdir: str) -> str:
    """A shell word for the job's workdir, resolved as the startup script does: `~`, `~/x` and
    relative paths in the job user's home (`$h`), absolute ones under ${TPUCTL_VM_ROOT:-}."""
    if workdir in ("~", ""):
        return '"$h"'
    if workdir.startswith("~/"):
        rest = workdir[2:].strip("/")
        return '"$h"/' + shlex.quote(rest) if rest else '"$h"'
    if workdir.startswith("~"):
        raise UsageError(f"job.workdir {workdir!r}: only ~ and ~/… are understood, not ~user")
    if workdir.startswith("/"):
        return '"${TPUCTL_VM_ROOT:-}"' + shlex.quote(workdir)
    return '"$h"/' + shlex.quote(workdir)


# Reruns the startup script detached, so the SSH command returns at once: the guest agent's
# runner on a real VM, else (the emulator) the script fetched from the metadata server.
_RERUN = (
    "rerun_startup() {\n"
    "  cd / || exit 1\n"
    "  if command -v google_metadata_script_runner >/dev/null 2>&1; then\n"
    "    set -- google_metadata_script_runner startup\n"
    "  else\n"
    '    f=$(mktemp "${TPUCTL_VM_ROOT:-}/tmp/tpuctl-startup.XXXXXX") || exit 1\n'
    "    if ! curl -fsS --retry 3 --retry-connrefused --connect-timeout 5 --max-time 30 "
    "-H 'Metadata-Flavor: Google' -o \"$f\" "
    '"http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/'
    'attributes/startup-script"; then\n'
    '      rm -f -- "$f"; echo "cannot fetch startup-script from the metadata server" >&2; exit 1\n'
    "    fi\n"
    '    set -- sh -c \'mkdir -p -- "${2%/*}"; bash "$1" >>"$2" 2>&1; rc=$?; '
    'rm -f -- "$1"; exit $rc\' tpuctl-startup "$f" "$log"\n'
    "  fi\n"
    "  TPUCTL_STARTUP_RERUN=1; export TPUCTL_STARTUP_RERUN\n"
    '  as_root setsid "$@" </dev/null >/dev/null 2>&1 &\n'
    '  echo "startup started $!"\n'
    "}\n"
)


def _rerun_prelude(run_name: str) -> str:
    log = '"${TPUCTL_VM_ROOT:-}"' + shlex.quote(f"/var/log/tpuctl/{run_name}/startup-rerun.log")
    return f"log={log}\n" + _RERUN


# Whether `$pid` leads its own process group and session: the trainer does (setsid), a reused
# pid rarely does. Also reads the status file into shell variables.
_READ_STATUS = (
    'st="$d/status"; state=""; pid=""\n'
    'if [ -r "$st" ]; then state=$(sed -n "s/^state=//p" "$st"); '
    'pid=$(sed -n "s/^pid=//p" "$st"); fi\n'
    "leader() {\n"
    '  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1\n'
    "  ids=$(sed 's/^.*) //' \"/proc/$pid/stat\" | cut -d' ' -f3,4) || return 1\n"
    '  [ "$ids" = "$pid $pid" ]\n'
    "}\n"
)


def _stop_group(grace: float) -> str:
    """TERM the trainer's process group, KILL what is left after `grace` (needs $pid).

    `kill -SIG -PGID` through a shell's builtin kill: dash's refuses `--`, and procps'
    /bin/kill (what sudo would run) needs it.
    """
    steps = max(1, int(grace * 10))
    return (
        "kill_group() {\n"
        '  if [ "$(id -u)" = 0 ]; then kill "-$1" "-$pid" 2>/dev/null\n'
        '  else sudo -n sh -c \'kill "-$1" "-$2"\' tpuctl-kill "$1" "$pid" 2>/dev/null; fi\n'
        "}\n"
        "stop_group() {\n"
        "  if ! leader && ! kill_group 0; then return 1; fi\n"
        "  kill_group TERM\n"
        f"  i=0; while [ $i -lt {steps} ]; do\n"
        "    kill_group 0 || { signal=TERM; return 0; }\n"
        "    sleep 0.1; i=$((i+1))\n"
        "  done\n"
        "  kill_group KILL; signal=KILL; return 0\n"
        "}\n"
    )


# ------------------------------------------------------------------------------- delivering


def pack_code(path: Path) -> bytes:
    """job.code as tar.gz: a directory's contents, or one file under its own name."""
    if not path.exists():
        raise UsageError(
            f"job.code {path} does not exist", hint="job.code is relative to the spec file"
        )
    return pack_local(path)


def _upload_part(workdir: str, sha256: str) -> str:
    """Read the archive from stdin, check it, unpack it as the job user, then the marker last."""
    return (
        f"w={workdir_word(workdir)}\n"
        + receive_archive("${TPUCTL_VM_ROOT:-}/tmp/tpuctl-code.XXXXXX", sha256)
        # Like the startup script: a workdir the job user cannot create is made by root for it.
        + 'as_job mkdir -p -- "$w" 2>/dev/null ||\n'
        '  { as_root mkdir -p -- "$w" && as_root chown -- "$u:" "$w"; } || exit 1\n'
        'as_job tar -xzf - -C "$w" <"$t" ||\n'
        '  { echo "cannot unpack the code into $w" >&2; exit 1; }\n'
        f'as_job touch -- "$w"/{CODE_READY_MARKER} || exit 1\n'
        'echo "uploaded $s $w"\n'
    )


def _skip_when_running(run_name: str) -> str:
    return (
        f"d={_state_dir(run_name)}\n" + _READ_STATUS + 'if [ "$state" = running ] && leader; then\n'
        '  echo "startup skipped running $pid"; exit 0\n'
        "fi\n"
    )


def deliver_and_start(
    fleet: Fleet, spec: Spec, *, on_event: EventCallback | None = None
) -> FanoutResult:
    """Put the spec's job on every worker and (re)run the startup script there.

    With a local job.code (a directory's contents, or one file) the archive is packed once,
    streamed to every worker, checked (sha256) and unpacked into the job user's workdir, and
    `<workdir>/.tpuctl-uploaded` is created last; then the startup script runs again, detached,
    and launches the job (its lock keeps a running trainer the only one: it goes on with the
    code it started with until `restart_job`). With gs:// code or none, the script is rerun
    only where the job is not running. Per worker, `detail` holds
    `uploaded` (the sha256 or None), `workdir`, `startup` ("started" | "skipped") and `pid`.
    """
    from tpuctl.spec.load import resolve_code_path

    job = _job(spec)
    run_name = _check_run_name(job.run_name or spec.name)
    local = resolve_code_path(spec)
    archive = pack_code(local) if local is not None else None
    extra: dict[str, Any] = {"run_name": run_name, "code": job.code}
    digest = None
    if archive is not None:
        digest = hashlib.sha256(archive).hexdigest()
        extra.update({"sha256": digest, "bytes": len(archive)})
    result = run_fanout(
        fleet.targets,
        deliver_script(spec, digest),
        fleet.connect,
        fleet.options(stdin=archive),
        on_event=on_event,
    )
    for worker in result:
        worker.detail = _delivery_detail(worker.stdout.text())
        if worker.exit_code == UPLOAD_CHECKSUM_EXIT:
            worker.error = "checksum mismatch after transfer"
        elif worker.ok and worker.detail["startup"] is None:
            worker.status = "failed"
            worker.error = "the startup script was not started"
    result.extra.update(extra)
    return result


def deliver_script(spec: Spec, sha256: str | None) -> str:
    """The worker side of `deliver_and_start`: with `sha256`, unpack the archive on stdin into
    the workdir (then the marker); without, skip a running job; then rerun the startup script."""
    job = _job(spec)
    run_name = _check_run_name(job.run_name or spec.name)
    parts = [_job_user_prelude(job.user), _rerun_prelude(run_name)]
    if sha256 is not None:
        parts.append(_upload_part(job.workdir, sha256))
    else:
        parts.append(_skip_when_running(run_name))
    parts.append("rerun_startup\n")
    return "".join(parts)


def _delivery_detail(output: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"uploaded": None, "workdir": None, "startup": None, "pid": None}
    for line in output.splitlines():
        words = line.split(" ", 2)
        if words[0] == "uploaded" and len(words) == 3:
            detail["uploaded"], detail["workdir"] = words[1], words[2]
        elif words[0] == "startup" and len(words) == 3:
            detail["startup"] = words[1]
            detail["pid"] = _int(words[2].split()[-1])
    return detail


# ---------------------------------------------------------------------------------- status


def probe_jobs(fleet: Fleet, run_name: str) -> FanoutResult:
    """Read every worker's status file in one fan-out; `detail` is WorkerJobStatus.to_dict()
    (plus `run`), so the fan-out table and JSON show it."""
    script = probe_script(run_name)
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(keep_output=True))
    for worker in result:
        status = parse_probe(worker)
        worker.detail = {"run": run_name, **status.to_dict()}
        worker.stdout = type(worker.stdout)()  # parsed into `detail`; not output to show
    return result


def probe_script(run_name: str) -> str:
    """Prints the worker's clock (`now=`), the status file as `status.KEY=value`, the boot
    count file (`bootfile=`) and whether the trainer's process group is alive (`alive=`)."""
    return (
        f"d={_state_dir(_check_run_name(run_name))}\n" + _READ_STATUS + 'echo "now=$(date +%s)"\n'
        'if [ -r "$st" ]; then sed "s/^/status./" "$st"; fi\n'
        'b=$(cat "$d/boot" 2>/dev/null) && echo "bootfile=$b"\n'
        "if leader; then echo alive=1; else echo alive=0; fi\n"
    )


def statuses_of(result: FanoutResult) -> list[WorkerJobStatus]:
    """The WorkerJobStatus of every worker of a `probe_jobs` result, in target order."""
    statuses = []
    for worker in result:
        detail = dict(worker.detail or {})
        detail.pop("run", None)
        statuses.append(WorkerJobStatus(**detail))
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
            None, None, None, reachable=worker.status not in ("unreachable", "hostkey-mismatch"),
            error=worker.error or worker.stderr.text() or worker.status,
        )  # fmt: skip
    values: dict[str, str] = {}
    for line in worker.stdout.bytes().decode("utf-8", errors="replace").splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    status = {key: values.get(f"status.{key}", "") for key in _STATUS_KEYS}
    now, heartbeat = _int(values.get("now")), _int(status["heartbeat"])
    age = float(max(0, now - heartbeat)) if now is not None and heartbeat is not None else None
    boot = _int(status["boot"])
    return WorkerJobStatus(
        slice=target.slice_index,
        node=target.node_id,
        worker=target.worker,
        state=status["state"] or _JOB_STATES_WITHOUT_FILE,
        boot=boot if boot is not None else _int(values.get("bootfile")),
        pid=_int(status["pid"]),
        started=status["started"] or None,
        exit_code=_int(status["exit_code"]),
        heartbeat_age_s=age,
        reason=status["reason"] or None,
        reachable=True,
        trainer_alive=values.get("alive") == "1",
    )


def run_name_of(api: TpuApi, name: str) -> str | None:
    """The run name a queued resource was created for (its nodes' `tpuctl-run` label), or None.

    Labels are lowercased and limited to [a-z0-9_-], so a run name with capitals or dots does
    not survive: pass the spec instead.
    """
    from tpuctl.cloud.describe import template_of
    from tpuctl.render.request import RUN_LABEL

    labels = template_of(api.get_queued_resource(name)).labels
    return labels.get(RUN_LABEL) or None


def resolve_run_name(api: TpuApi, name: str, spec: Spec | None) -> str:
    """The run whose job to read: the spec's, else the queued resource's `tpuctl-run` label."""
    if spec is not None:
        return _check_run_name(_job(spec).run_name or spec.name)
    found = run_name_of(api, name)
    if found is None:
        raise UsageError(
            f"{name} has no tpuctl-run label, so its job's run name is unknown",
            hint="pass the spec file instead of the name",
        )
    return _check_run_name(found)


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
    boot or `restart_job` launches the job again. `detail`: state stopped|not-running, pid,
    signal.
    """
    job = _job(spec)
    run_name = _check_run_name(job.run_name or spec.name)
    options = fleet.options(timeout=grace + 30.0)
    script = stop_script(run_name, grace)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_event=on_event)
    for worker in result:
        worker.detail = {"run": run_name, **_key_values(worker.stdout.text(), "state=")}
        if worker.ok and "state" not in worker.detail:
            worker.status, worker.error = "failed", "no state reported"
    return result


def stop_script(run_name: str, grace: float) -> str:
    """Prints `state=stopped pid=N signal=TERM|KILL`, or `state=not-running pid=N`."""
    return (
        _AS_ROOT
        + f"d={_state_dir(run_name)}\n"
        + _READ_STATUS
        + _stop_group(grace)
        + 'if stop_group; then echo "state=stopped pid=$pid signal=$signal"; '
        'else echo "state=not-running pid=$pid"; fi\n'
    )


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
    `detail`: stopped (TERM|KILL|None), startup, pid of the rerun.
    """
    job = _job(spec)
    run_name = _check_run_name(job.run_name or spec.name)
    options = fleet.options(timeout=grace + 3 * LOCK_WAIT_SECONDS + 30.0)
    script = restart_script(run_name, grace)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_event=on_event)
    for worker in result:
        detail = _delivery_detail(worker.stdout.text())
        stopped = next(
            (line.split()[1] for line in worker.stdout.text().splitlines()
             if line.startswith("stopped ")),
            "none",
        )  # fmt: skip
        worker.detail = {
            "run": run_name,
            "stopped": None if stopped == "none" else stopped,
            "startup": detail["startup"],
            "pid": detail["pid"],
        }
        if worker.ok and detail["startup"] is None:
            worker.status, worker.error = "failed", "the startup script was not started"
    return result


def restart_script(run_name: str, grace: float) -> str:
    """Stop the group (`stopped TERM|KILL|none`), free the startup lock, rerun the script."""
    lock = '"${TPUCTL_VM_ROOT:-}"' + shlex.quote(f"{STATE_ROOT}/startup.lock")
    return (
        _AS_ROOT
        + f"d={_state_dir(run_name)}\n"
        + _READ_STATUS
        + _stop_group(grace)
        + _rerun_prelude(run_name)
        + 'signal=""\n'
        'if stop_group; then echo "stopped $signal"; else echo "stopped none"; fi\n'
        f"lock={lock}\n"
        'if [ -e "$lock" ] && ! as_root flock -w '
        f'{LOCK_WAIT_SECONDS} "$lock" true; then\n'
        '  echo "startup lock still held; killing its holders" >&2\n'
        '  as_root fuser -k -TERM "$lock" >/dev/null 2>&1; sleep 1\n'
        '  as_root fuser -k -KILL "$lock" >/dev/null 2>&1\n'
        f'  as_root flock -w {LOCK_WAIT_SECONDS} "$lock" true || '
        '{ echo "the startup lock is still held" >&2; exit 1; }\n'
        "fi\n"
        "rerun_startup\n"
    )


# ----------------------------------------------------------------------------------- helpers


def _job(spec: Spec) -> JobSpec:
    if spec.job is None:
        raise UsageError(f"{spec.source} has no job section: there is no job on the workers")
    return spec.job


def _key_values(output: str, prefix: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(prefix):
            pairs = dict(part.partition("=")[::2] for part in line.split())
            return {
                "state": pairs.get("state") or None,
                "pid": _int(pairs.get("pid")),
                "signal": pairs.get("signal") or None,
            }
    return {}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
