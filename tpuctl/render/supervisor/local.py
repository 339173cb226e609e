"""The schedulers on this machine: a crontab (with flock, so steps never overlap) and its step
script, or a systemd service with its timer. Both run the step as the local user, with the
environment chosen for it (cron's own is nearly empty)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from tpuctl.errors import UsageError
from tpuctl.render.supervisor.model import (
    IN_PROGRESS,
    STEP_DEADLINE_SECONDS,
    Schedule,
    Supervisor,
    SupervisorFile,
    SupervisorOptions,
    say_interval,
)

# ----------------------------------------------------------------------------------------- cron


# Debian's cron refuses a command longer than this (MAX_COMMAND): the step, with its environment
# and paths, goes into a script beside the lock, and the line stays short.
CRON_COMMAND_LIMIT = 1000


def render_cron(options: SupervisorOptions, schedule: Schedule, argv: Sequence[str]) -> Supervisor:
    """A step script (the environment cron lacks, then `exec tpuctl reconcile …`) installed in
    the state directory, and one crontab line per firing in a minute (one, unless --every is
    below a minute: cron fires once a minute, so the other lines sleep into it). Each line takes
    a lock with `flock -n`, so a step still running makes the next one return at once (as in
    progress), appends the step's output to a log file, and maps exit 12 (in progress) to 0."""
    unit = options.unit
    state = options.state_dir.rstrip("/") or "/"
    script, lock, log = f"{unit}.sh", f"{unit}.lock", f"{unit}.log"
    body = (
        f"cd {shlex.quote(state)} && flock -n -E {IN_PROGRESS} {lock} ./{script} "
        f'>>{log} 2>&1; rc=$?; [ "$rc" = {IN_PROGRESS} ] && rc=0; exit "$rc"'
    )
    if "\n" in body:
        raise UsageError(
            f"a crontab line cannot hold a line break (in the state directory {state!r})",
            hint="set XDG_STATE_HOME to a path without one, or use --on systemd",
        )
    lines = [
        f"{schedule.cron} {f'sleep {offset} && ' if offset else ''}{_cron_escaped(body)} # {unit}"
        for offset in schedule.offsets
    ]
    too_long = [line for line in lines if len(line) > CRON_COMMAND_LIMIT]
    if too_long:
        raise UsageError(
            f"the crontab line is {len(too_long[0])} characters, more than cron takes "
            f"({CRON_COMMAND_LIMIT}): the state directory {state} is too long",
            hint="set XDG_STATE_HOME to a shorter path",
        )
    every = say_interval(schedule.seconds)
    header = [
        f"one `tpuctl reconcile` step of run {options.name} every {every} ({state}/{script}), "
        f"never two at once (flock); output appended to {state}/{log}",
    ]
    if len(schedule.offsets) > 1:
        header.append("cron fires once a minute: the lines after the first sleep into the minute")
    text = "".join(f"# {unit}: {line}\n" for line in header) + "".join(f"{x}\n" for x in lines)
    exports = [f"export {key}={shlex.quote(value)}" for key, value in options.environment.items()]
    step = "\n".join(
        [
            "#!/bin/sh",
            f"# {unit}: the step cron runs for run {options.name} ({unit}.cron), in the",
            "# environment it was set up in (cron's own is nearly empty).",
            *exports,
            f"exec {shlex.join(argv)}",
        ]
    )
    name = f"{unit}.cron"
    marker = f"^# {unit}: |# {unit}$"
    keep_others = f"crontab -l 2>/dev/null | grep -v -E {shlex.quote(marker)}"
    installed = shlex.quote(f"{state}/{script}")
    return Supervisor(
        name=options.name,
        target="cron",
        unit=unit,
        every_seconds=schedule.seconds,
        schedule=schedule.cron,
        command=list(argv),
        files=[SupervisorFile(name, text), SupervisorFile(script, step + "\n")],
        install=[
            f"mkdir -p {shlex.quote(state)} && cp {shlex.quote(_path(options, script))} "
            f"{installed} && chmod 755 {installed}",
            f"({keep_others}; cat {shlex.quote(_path(options, name))}) | crontab -",
        ],
        remove=[f"{keep_others} | crontab -", f"rm -f {installed}"],
        notes=list(schedule.notes),
    )


def _cron_escaped(command: str) -> str:
    """`%` ends a crontab command (the rest goes to its standard input) unless escaped."""
    return command.replace("%", "\\%")


def _path(options: SupervisorOptions, name: str) -> str:
    return f"{options.directory.rstrip('/')}/{name}" if options.directory else name


# -------------------------------------------------------------------------------------- systemd

_SYSTEMD_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def systemd_word(word: str, *, in_exec: bool = True) -> str:
    """One word of a unit file's command line or assignment: specifiers (`%`) doubled, and in
    ExecStart `$` doubled too (systemd expands variables there); quoted, with C escapes, unless
    it is made of plain characters only."""
    escaped = word.replace("%", "%%")
    if in_exec:
        escaped = escaped.replace("$", "$$")
    if _SYSTEMD_BARE.fullmatch(escaped):
        return escaped
    for raw, quoted in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\t", "\\t")):
        escaped = escaped.replace(raw, quoted)
    return f'"{escaped}"'


def render_systemd(
    options: SupervisorOptions, schedule: Schedule, argv: Sequence[str]
) -> Supervisor:
    """A oneshot service (exit 12 counts as success) and a timer on a calendar (Persistent, so
    a step missed while the machine slept runs at wake-up). A timer never starts a service that
    is still running, so steps never overlap. User units unless `system`."""
    unit = options.unit
    every = say_interval(schedule.seconds)
    service_lines = [
        f"# {unit}.service: one `tpuctl reconcile` step of run {options.name}, started by",
        f"# {unit}.timer every {every}; exit {IN_PROGRESS} (the run goes on) counts as success.",
        "[Unit]",
        f"Description=tpuctl reconcile {options.name} (one supervision step)",
        "",
        "[Service]",
        "Type=oneshot",
        "ExecStart=" + " ".join(systemd_word(word) for word in argv),
        f"SuccessExitStatus={IN_PROGRESS}",
        # The step ends itself within its deadline; this only stops one that hangs.
        f"TimeoutStartSec={2 * STEP_DEADLINE_SECONDS}",
    ]
    service_lines += [
        "Environment=" + systemd_word(f"{key}={value}", in_exec=False)
        for key, value in options.environment.items()
    ]
    if options.system and options.user:
        service_lines.append(f"User={systemd_word(options.user)}")
    timer_lines = [
        "[Unit]",
        f"Description=Run {unit}.service every {every}",
        "",
        "[Timer]",
        f"OnCalendar={schedule.calendar}",
        "AccuracySec=1s",
        "Persistent=true",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    service, timer = f"{unit}.service", f"{unit}.timer"
    files = [
        SupervisorFile(service, "\n".join(service_lines) + "\n"),
        SupervisorFile(timer, "\n".join(timer_lines) + "\n"),
    ]
    install, remove = _systemd_commands(options, service, timer)
    return Supervisor(
        name=options.name,
        target="systemd",
        unit=unit,
        every_seconds=schedule.seconds,
        schedule=schedule.calendar,
        command=list(argv),
        files=files,
        install=install,
        remove=remove,
        notes=list(schedule.notes),
    )


def _systemd_commands(
    options: SupervisorOptions, service: str, timer: str
) -> tuple[list[str], list[str]]:
    sources = " ".join(shlex.quote(_path(options, name)) for name in (service, timer))
    if options.system:
        where, systemctl = "/etc/systemd/system", "systemctl"
    else:
        where, systemctl = '"${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"', "systemctl --user"
    install = [
        f"mkdir -p {where}",
        f"cp {sources} {where}/",
        f"{systemctl} daemon-reload",
        f"{systemctl} enable --now {timer}",
    ]
    if not options.system:
        # A user's timers stop at logout unless the user lingers.
        install.append('loginctl enable-linger "$USER"')
    remove = [
        f"{systemctl} disable --now {timer}",
        f"rm -f {where}/{service} {where}/{timer}",
        f"{systemctl} daemon-reload",
    ]
    return install, remove
