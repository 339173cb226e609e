"""The shell scripts tpuctl runs on workers: detached runs, status, logs, stop, upload, TPU reset.

Every value from a user reaches the remote shell through `shlex.quote` (or `remote_path`);
the scripts are run by the login shell (bash on TPU VMs and emulated workers): POSIX sh, except
the probes run on every worker at once (`ps`, `status --jobs`), which are bash (`bash_script`)
so that they start no process where a builtin does the job: at 1,024 workers each `cat`,
`stat`, `tail | tail | tr` is a thousand processes. On an emulated worker, machine-wide paths
live under $TPUCTL_VM_ROOT (unset on a real VM), like the startup script.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from tpuctl.errors import UsageError, quoted

RUNS_DIR = "$HOME/.tpuctl/runs"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
UPLOAD_CHECKSUM_EXIT = 97


def new_run_id() -> str:
    """Sortable and unique: 20260102-150405-a1b2c3."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id) or run_id == "latest":
        raise UsageError(f"{quoted(run_id)} is not a run id (letters, digits, '.', '_', '-')")
    return run_id


def remote_path(path: str) -> str:
    """A shell word for a worker path: `~`/`~/x` in $HOME, relative ones in the login directory
    (the home), absolute ones under ${TPUCTL_VM_ROOT:-} (empty on a real VM)."""
    if path in ("~", ""):
        return '"$HOME"'
    if path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"'
    if path.startswith("~"):
        raise UsageError(f"{quoted(path)}: only ~ and ~/… are understood, not ~user")
    if path.startswith("/"):
        return '"${TPUCTL_VM_ROOT:-}"' + shlex.quote(path)
    return shlex.quote(path)


def env_exports(env: Mapping[str, str]) -> str:
    """`export A='x'; export B='y'; ` for a command prefix; names are checked, values quoted."""
    parts = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise UsageError(f"{quoted(name)} is not a valid environment variable name")
        if "\0" in value:
            raise UsageError(f"the value of {name} contains a NUL character")
        parts.append(f"export {name}={shlex.quote(value)}; ")
    return "".join(parts)


def bash_script(body: str) -> str:
    """`body`, a bash script, as a command for the worker's login shell: bash runs it as is;
    another shell (sh, dash) runs only the first line, which hands the script to bash. A POSIX
    shell parses and runs a `-c` script one line at a time, so it never parses the bash."""
    return f'[ -n "${{BASH_VERSION-}}" ] || exec bash -c {shlex.quote(body)}\n{body}'


# Bash: `tail_bytes N FILE` sets $buf to FILE's last N bytes (the whole file when it is no
# longer; empty when it is missing), trailing newlines included, as `tail -c N` prints them.
# A file of at most N bytes is read by the read builtin; a longer one by one `tail -c`: bash
# cannot seek, and a log may be gigabytes. Needs LC_ALL=C (read -N counts characters); NUL
# bytes are dropped, as command substitution drops them.
TAIL_BYTES = (
    "tail_bytes() {\n"
    '  buf=""; [[ -f $2 ]] || return 0\n'
    '  IFS= read -r -N "$(($1 + 1))" buf 2>/dev/null <"$2" || return 0\n'
    '  IFS= read -r -N "$1" buf < <(exec tail -c "$1" -- "$2" 2>/dev/null)\n'
    "}\n"
)


# ------------------------------------------------------------------------------ detached runs

# This boot of the VM (the kernel's id for it): a run's pid file keeps the boot it started in.
_BOOT = 'boot=""; read -r boot 2>/dev/null </proc/sys/kernel/random/boot_id; boot=${boot:--}; '

# A run's files are `$R/<id>.<name>` (log, pid, command, started, exit, stopped), with
# `$R/latest` naming the latest run: no directory per run, so starting one costs no `mkdir`
# process once $R exists. Runs started by earlier versions have a directory, `$R/<id>/<name>`;
# `$p` is the prefix either way.

# The leader of a detached run: a bash started as a background job with job control on
# (`set -m`), so it leads a process group of its own with no `setsid` process (its session is the
# start's: see _START). It ignores HUP (all nohup does when output goes to a file), records the
# command and its start (the printf builtin's epoch), runs the command in a subshell (a fork, no
# exec: `$$` there is this leader) with TERM and INT at their defaults, and records the exit
# status; with TERM trapped here, a TERM to the group reaches the command while this shell
# waits, which then records 143 instead of dying first. `exit` is written in place, not renamed
# into place (no `mv` process): its few bytes arrive in one write, and readers take an empty
# `exit` for not written yet (`-s`), while this shell, still alive, keeps the run running.
_LEADER = (
    'p=$1; printf "%s\\n" "$2" >"${p}command"; printf "%(%s)T\\n" -1 >"${p}started"; '
    "trap '' HUP; trap : TERM INT; "
    '( trap - TERM INT; c=$2; set --; eval "$c" ) </dev/null >>"${p}log" 2>&1; '
    'printf "%s\\n" "$?" >"${p}exit"'
)

# The start, in bash. The pid file holds the leader's pid (its group's), the boot, and the
# session the start shell leads ("-": none; sshd makes one for each command), which holds the
# run once that shell has exited: `stop` signals the group and the session, so a process
# that left the group is still reached. Linux reuses no number a group or session still has.
_START = (
    '[ -d "$R" ] || mkdir -p "$R" || exit 1; : >>"${p}log" || exit 1; '
    'printf "%s\\n" "$id" >"$R/latest"; '
    + _BOOT
    + 'sid=""; read -r _ _ _ _ _ sid _ 2>/dev/null </proc/$$/stat; [ "$sid" = "$$" ] || sid=""; '
    f'set -m; bash -c {shlex.quote(_LEADER)} tpuctl-run "$p" "$c" </dev/null >/dev/null 2>&1 & '
    'printf "%s %s %s\\n" "$!" "$boot" "${sid:--}" >"${p}pid"; printf "started %s\\n" "$!"'
)


def start_script(run_id: str, command: str, *, workdir: str | None = None) -> str:
    """Start `command` detached in a process group of its own; prints `started <pid>` and
    returns at once.

    The run's empty log, `latest` and its pid file are written before this returns, so a
    `ps` or `logs` right after it finds the run on every worker. Starting costs the worker
    one process, the leader's bash (and a `mkdir` the first time). The command is in the
    script once, in `$c`: a login shell that is not bash hands the rest to bash with `$c` as
    its argument.
    """
    check_run_id(run_id)
    # `cd … || exit`, not `cd … && …`: a failed cd must not start the run elsewhere.
    where = f"cd {remote_path(workdir)} || exit 1; " if workdir else ""
    body = (
        f'[ "$0" != tpuctl-start ] || c=$1; {where}R="{RUNS_DIR}"; id={run_id}; p="$R/$id."; '
        + _START
    )
    return (
        f"c={shlex.quote(command)}\n"
        f'[ -n "${{BASH_VERSION-}}" ] || exec bash -c {shlex.quote(body)} tpuctl-start "$c"\n{body}'
    )


_NO_RUN = 'echo "state=none run=$id"; exit 0'


def _resolve_run(run_id: str | None, *, pid: bool = True, none: str = _NO_RUN) -> str:
    """POSIX sh: `$R` (the runs), `$id` (the run: `run_id`, else the latest), `$p` (the prefix
    of its files: `$R/$id.`, or `$R/$id/` for a run of an earlier version) and, with `pid`,
    `$pid` and `$sid` (its session; its pid for a run that is its session's leader); runs
    `none` (by default: exits after `state=none run=…`) when there is no such run. Files are
    read by the read builtin (stderr redirected first: a missing file is no error), not
    `$(cat …)`, a process each."""
    latest = '""; read -r id 2>/dev/null <"$R/latest"'
    chosen = shlex.quote(check_run_id(run_id)) if run_id else latest
    return (
        f'R="{RUNS_DIR}"; id={chosen}; p="$R/$id."; '
        'if [ ! -f "${p}log" ]; then p="$R/$id/"; '
        f'if [ -z "$id" ] || [ ! -d "$p" ]; then {none}; fi; fi; '
        + (
            _BOOT + 'pid=""; b=""; sid=""; read -r pid b sid 2>/dev/null <"${p}pid"; '
            # Recorded in an earlier boot (a maintenance reboot): that number names another
            # process now, or none. A pid file without a boot is from before it was kept.
            '[ -z "$b" ] || [ "$b" = "$boot" ] || pid=""; '
            # Its session: the one its start shell led ("-": none), or for a run of an
            # earlier version (setsid) its own, whose leader it is.
            'if [ -z "$pid" ] || [ "$sid" = - ]; then sid=""; '
            'elif [ "${p%/}" != "$p" ]; then sid=$pid; fi; '
            if pid
            else ""
        )
    )


# Alive: the leader, or anything left in its process group or session (pgrep, a process,
# only once both builtin kills have found nothing).
_ALIVE = (
    'alive() { [ -n "$pid" ] && { kill -0 "$pid" 2>/dev/null || kill -0 -- "-$pid" 2>/dev/null '
    '|| { [ -n "$sid" ] && pgrep -s "$sid" >/dev/null 2>&1; }; }; }; '
)


def status_script(run_id: str | None) -> str:
    """A line `state=running|exited|stopped|unknown|none run=… pid=… exit=… started=<epoch>`,
    then `last=<the log's last line>` (from its last 2 KiB, carriage returns removed).

    Bash, with builtins only for a run started by this version whose log is at most 2 KiB
    (one `tail -c` for a longer log; one `stat` for a run without a `started` file).
    """
    return bash_script(
        "LC_ALL=C; "
        + _resolve_run(run_id)
        + _ALIVE
        + "if [[ -s ${p}exit ]]; then s=exited; elif alive; then s=running; "
        "elif [[ -f ${p}stopped ]]; then s=stopped; else s=unknown; fi; "
        'e=""; read -r e 2>/dev/null <"${p}exit"; '
        't=""; read -r t 2>/dev/null <"${p}started"; '
        # A run started before the `started` file: its pid file's mtime.
        '[[ -n $t ]] || t=$(exec stat -c %Y -- "${p}pid" 2>/dev/null); '
        'printf "state=%s run=%s pid=%s exit=%s started=%s\\n" "$s" "$id" "$pid" "$e" "$t"\n'
        + TAIL_BYTES
        # The log's last line (`tail -n 1`: a final newline ends it), on a line of its own.
        + "tail_bytes 2048 \"${p}log\"; t=${buf%$'\\n'}; t=${t##*$'\\n'}; t=${t//$'\\r'/}\n"
        "printf 'last=%s\\n' \"$t\"\n"
    )


def logs_script(run_id: str | None, lines: int | None, *, follow: bool) -> str:
    """The last `lines` of the run's log (None: all of it); with `follow`, until the run's
    process ends. No such run is a failure saying so on stderr: stdout is the log alone."""
    missing = (
        'if [ -n "$id" ]; then echo "no detached run $id here" >&2; '
        'else echo "no detached run here (--job reads the startup job\'s log)" >&2; fi; exit 1'
    )
    # A run's log and pid file are there once its start returns (start_script), so a
    # `tpuctl run` that follows at once finds them.
    shown = tail_command('"${p}log"', lines, follow=None)
    if follow:
        # Until the run's process ends; a run with none in this boot is over: its log as is.
        shown = f'[ -n "$pid" ] || {shown}; ' + tail_command(
            '"${p}log"', lines, follow='--pid="$pid"'
        )
    return (
        _resolve_run(run_id, pid=follow, none=missing)
        + '[ -f "${p}log" ] || { echo "no log at ${p}log" >&2; exit 1; }; '
        + shown
    )


def tail_command(path: str, lines: int | None, *, follow: str | None) -> str:
    """`exec tail` (or cat) of `path`, a shell word: its last `lines` (None: all of it), and
    with `follow` (tail's extra options, e.g. --pid) new lines as they come."""
    if lines is None and follow is None:
        return f"exec cat -- {path}"
    tail = "tail -n " + ("+1" if lines is None else str(int(lines)))
    if follow is not None:
        tail += f" -F {follow}".rstrip()
    return f"exec {tail} -- {path}"


def stop_script(run_id: str | None, grace: float) -> str:
    """TERM to the run's process group and session, KILL after `grace` seconds if any is left."""
    steps = max(1, int(grace * 10))
    return (
        _resolve_run(run_id)
        + _ALIVE
        + 'if ! alive; then echo "state=not-running run=$id pid=$pid"; exit 0; fi; '
        ': >"${p}stopped"; '
        'kill -TERM -- "-$pid" 2>/dev/null; '
        '[ -z "$sid" ] || pkill -TERM -s "$sid" 2>/dev/null; '
        f"i=0; while [ $i -lt {steps} ]; do "
        'if ! alive; then echo "state=stopped run=$id pid=$pid signal=TERM"; exit 0; fi; '
        "sleep 0.1; i=$((i+1)); done; "
        'kill -KILL -- "-$pid" 2>/dev/null; '
        '[ -z "$sid" ] || pkill -KILL -s "$sid" 2>/dev/null; '
        'echo "state=stopped run=$id pid=$pid signal=KILL"'
    )


@dataclass(frozen=True)
class RunState:
    """A detached run on one worker: running, exited (its code), stopped, started, unknown or
    none; `signal` is what stopped it (TERM or KILL); `started` when it began and `last_line`
    its log's last line, where the probe reads them."""

    state: str
    run: str | None
    pid: int | None
    exit_code: int | None
    signal: str | None = None
    started: datetime | None = None
    last_line: str | None = None

    def describe(self) -> str:
        if self.state == "exited":
            return f"exited {self.exit_code}"
        if self.state == "stopped" and self.signal:
            return f"stopped (SIG{self.signal})"
        return self.state


def parse_state(output: str) -> RunState | None:
    """The last `state=…` line of a status or stop script's output, and the `last=` line
    after it."""
    lines = output.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if not line.startswith("state="):
            continue
        fields = dict(part.partition("=")[::2] for part in line.split())
        following = lines[index + 1] if index + 1 < len(lines) else ""
        last = following[len("last=") :] if following.startswith("last=") else None
        epoch = _int(fields.get("started"))
        return RunState(
            state=fields.get("state") or "unknown",
            run=fields.get("run") or None,
            pid=_int(fields.get("pid")),
            exit_code=_int(fields.get("exit")),
            signal=fields.get("signal") or None,
            started=None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc),
            last_line=last or None,
        )
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


# ----------------------------------------------------------------------------- transfers


def receive_archive(temp_template: str, sha256: str) -> str:
    """Shell lines that read a tar.gz from stdin into `$t` (a temporary file from
    `temp_template`, removed at exit) and exit UPLOAD_CHECKSUM_EXIT unless its sha256 is
    `sha256`; `$s` holds the digest of what arrived."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError("sha256 must be 64 lowercase hex digits")
    return (
        f't=$(mktemp "{temp_template}") || exit 1\n'
        "trap 'rm -f -- \"$t\"' EXIT\n"
        'cat >"$t" || exit 1\n'
        's=$(sha256sum "$t" | cut -d" " -f1)\n'
        f'if [ "$s" != {sha256} ]; then echo "checksum mismatch: received $s" >&2; '
        f"exit {UPLOAD_CHECKSUM_EXIT}; fi\n"
    )


def upload_script(remote_dir: str, sha256: str) -> str:
    """Receive a tar.gz on stdin (checked, see receive_archive), then extract it."""
    return (
        f'd={remote_path(remote_dir)}\nmkdir -p -- "$d" || exit 1\n'
        + receive_archive("$d/.tpuctl-upload.XXXXXX", sha256)
        + 'tar -xzf "$t" -C "$d" || exit 1\necho "sha256 $s ok"\n'
    )


def download_script(remote: str) -> str:
    """A tar.gz of one file or directory on stdout (its last path component at the top); a
    path that is not there fails with `REMOTE: no such file or directory` on stderr (tar's own
    last words would be only that it exited with a failure)."""
    stripped = remote.rstrip("/") or "/"
    parent, _, name = stripped.rpartition("/")
    if not name:
        raise UsageError(f"cannot download {quoted(remote)}: name a file or directory")
    base = remote_path(parent or ("/" if stripped.startswith("/") else "."))
    word = shlex.quote(name)
    missing = shlex.quote(f"{remote}: no such file or directory")
    return (
        f"cd {base} 2>/dev/null && {{ [ -e {word} ] || [ -L {word} ]; }} "
        f"|| {{ echo {missing} >&2; exit 1; }}; tar -czf - -- {word}"
    )


# -------------------------------------------------------------------------------- TPU reset


def free_tpu_script() -> str:
    """Kill whatever holds the TPU devices, then remove libtpu's lockfile (under
    ${TPUCTL_VM_ROOT:-} on emulated workers); sudo -n only when plain kill/rm is refused."""
    return (
        'r=${TPUCTL_VM_ROOT:-}; found=""; '
        'for dev in "$r"/dev/accel* "$r"/dev/vfio/*; do [ -e "$dev" ] || continue; '
        'p=$(fuser "$dev" 2>/dev/null) && found="$found $p"; done; '
        'if [ -n "$found" ]; then '
        "kill -KILL $found 2>/dev/null || sudo -n kill -KILL $found 2>/dev/null || true; "
        'echo "killed TPU holders:$found"; fi; '
        'f="$r/tmp/libtpu_lockfile"; '
        'if [ -e "$f" ]; then rm -f -- "$f" 2>/dev/null || sudo -n rm -f -- "$f"; '
        'echo "removed $f"; fi; true'
    )
