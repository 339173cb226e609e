"""The worker side of job control: the scripts that deliver the code, read the job's status,
stop it and run the startup script again on a worker: POSIX sh, except the status probe, run on
every worker by `status --jobs`, `ps --job` and `up`, which is bash that starts no process
(tpuctl.fanout.remote.bash_script).

They speak the worker contract (tpuctl.worker); every value from a spec reaches the shell
through `shlex.quote`. On an emulated worker, machine-wide paths live under $TPUCTL_VM_ROOT.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from tpuctl import worker as contract
from tpuctl.errors import UsageError, quoted
from tpuctl.fanout.remote import TAIL_BYTES, bash_script, receive_archive, tail_command

if TYPE_CHECKING:
    from tpuctl.spec.model import Spec

# Seconds a restart waits for the startup lock after the trainer's group is gone (the supervisor
# records the exit and leaves), before it kills whatever still holds the lock.
LOCK_WAIT_SECONDS = 10


_VM_ROOT = '"${TPUCTL_VM_ROOT:-}"'


def _on_vm(path: str) -> str:
    """A shell word for a machine-wide path on a worker (under $TPUCTL_VM_ROOT when emulated)."""
    return _VM_ROOT + shlex.quote(path)


def _state_dir(run_name: str) -> str:
    return _on_vm(contract.state_dir(check_run_name(run_name)))


def check_run_name(run_name: str) -> str:
    try:
        return contract.check_run_name(run_name)
    except ValueError as error:
        raise UsageError(str(error)) from None


# `as_root CMD…`: plain when the SSH user is root, else sudo -n (TPU VMs give gcloud's users
# password-less sudo). sudo drops the environment: the emulator's variables and the rerun flag
# are passed on.
_AS_ROOT = (
    'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n env '
    '${TPUCTL_VM_ROOT:+"TPUCTL_VM_ROOT=$TPUCTL_VM_ROOT"} '
    '${GCE_METADATA_HOST:+"GCE_METADATA_HOST=$GCE_METADATA_HOST"} '
    '${TPUCTL_STARTUP_RERUN:+"TPUCTL_STARTUP_RERUN=$TPUCTL_STARTUP_RERUN"} '
    '${TPUCTL_STARTUP_RESTART:+"TPUCTL_STARTUP_RESTART=$TPUCTL_STARTUP_RESTART"} "$@"; fi; }\n'
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
        raise UsageError(f"job.workdir {quoted(workdir)}: only ~ and ~/… are understood, not ~user")
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
    log = _on_vm(f"{contract.log_dir(run_name)}/startup-rerun.log")
    return f"log={log}\n" + _RERUN


def _read_status(*, show: bool = False) -> str:
    """POSIX sh that reads the status file into `$state` and `$pid` (with `show`, also prints
    its lines as `status.KEY=value`) and defines `leader`: whether `$pid` leads its own process
    group and session, as the trainer does (setsid) and a reused pid rarely does. Builtins only:
    the read builtin and parameter expansion, where sed and cut were a process each."""
    echo = "printf 'status.%s\\n' \"$line\"; " if show else ""
    return (
        'st="$d/status"; state=""; pid=""\n'
        'if [ -r "$st" ]; then\n'
        '  while IFS= read -r line || [ -n "$line" ]; do\n'
        f"    {echo}case $line in state=*) state=${{line#state=}} ;; "
        "pid=*) pid=${line#pid=} ;; esac\n"
        '  done <"$st"\n'
        "fi\n"
        "leader() {\n"
        '  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1\n'
        # /proc/PID/stat: `PID (COMM) STATE PPID PGRP SESSION …`; COMM may hold `) `.
        '  ids=""; read -r ids 2>/dev/null <"/proc/$pid/stat"\n'
        '  ids=${ids##*") "}; ids=${ids#* }; ids=${ids#* }\n'
        '  [ "${ids%% *}" = "$pid" ] || return 1\n'
        '  ids=${ids#* }; [ "${ids%% *}" = "$pid" ]\n'
        "}\n"
    )


_READ_STATUS = _read_status()


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
        f'as_job touch -- "$w"/{contract.CODE_READY_MARKER} || exit 1\n'
        'echo "uploaded $s $w"\n'
    )


def _skip_when_running(run_name: str) -> str:
    return (
        f"d={_state_dir(run_name)}\n" + _READ_STATUS + 'if [ "$state" = running ] && leader; then\n'
        '  echo "startup skipped running $pid"; exit 0\n'
        "fi\n"
    )


def deliver_script(spec: Spec, sha256: str | None) -> str:
    """The worker side of `deliver_and_start`: with `sha256`, unpack the archive on stdin into
    the workdir (then the marker); without, skip a running job; then rerun the startup script."""
    job = spec.job
    assert job is not None, "deliver_script needs a spec with a job"
    run_name = check_run_name(spec.run_name)
    parts = [_job_user_prelude(job.user), _rerun_prelude(run_name)]
    if sha256 is not None:
        parts.append(_upload_part(job.workdir, sha256))
    else:
        parts.append(_skip_when_running(run_name))
    parts.append("rerun_startup\n")
    return "".join(parts)


def probe_script(run_name: str) -> str:
    """Prints the worker's clock (`now=`), the status file as `status.KEY=value`, the boot
    count file (`bootfile=`), whether the trainer's process group is alive (`alive=`) and the
    job log's last line from the trainer (`last=`, from its last 4 KiB).

    Bash, run on every worker at once: builtins only (the clock from printf, files through the
    read builtin), but for one `tail -c` when the log is longer than 4 KiB.
    """
    log = _on_vm(contract.log_path(check_run_name(run_name), None))
    return bash_script(
        "LC_ALL=C\n"
        "printf 'now=%(%s)T\\n' -1\n"
        f"d={_state_dir(check_run_name(run_name))}\n"
        + _read_status(show=True)
        # `true`: an empty file is read too (read fails at its end); only a missing one is not.
        + 'b=""; if { read -r b; true; } 2>/dev/null <"$d/boot"; then '
        'echo "bootfile=$b"; fi\n'
        "if leader; then echo alive=1; else echo alive=0; fi\n"
        + TAIL_BYTES
        + f"tail_bytes 4096 {log}\n"
        # The trainer's last line (not the supervisor's own), as `grep -v … | tail -n 1`;
        # none, or an empty one: the log's last line (from its last 2 KiB).
        + 't=${buf%$\'\\n\'}; mapfile -t lines <<<"$t"; last=""\n'
        "for ((i = ${#lines[@]} - 1; i >= 0; i--)); do\n"
        '  [[ ${lines[i]} == *" tpuctl-startup: "* ]] || { last=${lines[i]}; break; }\n'
        "done\n"
        "if [[ -z $last ]]; then\n"
        "  (( ${#buf} <= 2048 )) || buf=${buf:${#buf}-2048}\n"
        "  t=${buf%$'\\n'}; last=${t##*$'\\n'}\n"
        "fi\n"
        "last=${last//$'\\r'/}\n"
        "printf 'last=%s\\n' \"$last\"\n"
    )


def stop_script(run_name: str, grace: float) -> str:
    """Prints `state=stopped pid=N signal=TERM|KILL`, or `state=not-running pid=N`."""
    return (
        _AS_ROOT
        + f"d={_state_dir(run_name)}\n"
        + _READ_STATUS
        + _stop_group(grace)
        # Stopped by a person in this boot: the startup script may launch it again when asked
        # (a delivery); a job that ended by itself is not launched twice in one boot.
        + "mark_stopped() {\n"
        '  b=""; { read -r b; true; } 2>/dev/null <"$d/boot"\n'
        '  printf \'%s\\n\' "$b" | as_root tee "$d/stopped" >/dev/null 2>&1 || true\n'
        "}\n"
        'if stop_group; then mark_stopped; echo "state=stopped pid=$pid signal=$signal"; '
        'else echo "state=not-running pid=$pid"; fi\n'
    )


def restart_script(run_name: str, grace: float) -> str:
    """Stop the group (`stopped TERM|KILL|none`), free the startup lock, rerun the script."""
    lock = _on_vm(contract.STARTUP_LOCK)
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
        "TPUCTL_STARTUP_RESTART=1; export TPUCTL_STARTUP_RESTART\n"
        "rerun_startup\n"
    )


def read_log_script(run_name: str, boot: int | None, lines: int = 400) -> str:
    """The head and the tail of a run's log on a worker (`current.log`, or one boot's): the
    resume line is near the start, the steps at the end."""
    path = _on_vm(contract.log_path(check_run_name(run_name), boot))
    return (
        f'f={path}; [ -e "$f" ] || exit 0; '
        f'if [ $(wc -l <"$f") -le {2 * lines} ]; then cat "$f"; '
        f'else head -n {lines} "$f"; tail -n {lines} "$f"; fi'
    )


def job_log_script(run_name: str, lines: int | None, *, follow: bool) -> str:
    """The job's log on a worker (`current.log`, the boot's now): its last `lines` (None: all
    of it), and with `follow` new lines until interrupted."""
    path = _on_vm(contract.log_path(check_run_name(run_name), None))
    return (
        f'f={path}; [ -e "$f" ] || {{ echo "no job log for run {run_name} ($f)" >&2; exit 1; }}; '
        + tail_command('"$f"', lines, follow="" if follow else None)
    )


def mark_done_script(run_name: str) -> str:
    """Write the run's done marker on this worker (as root: the state dir is root's), its text
    read from stdin."""
    return (
        _AS_ROOT
        + f"d={_state_dir(run_name)}\n"
        + 'as_root mkdir -p -- "$d" && as_root sh -c \'cat >"$1/DONE.tmp" && '
        'mv -f -- "$1/DONE.tmp" "$1/DONE"\' tpuctl-done "$d" && echo "done marked"\n'
    )
