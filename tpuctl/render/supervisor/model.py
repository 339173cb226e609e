"""The vocabulary of `tpuctl supervise`: what to render for (SupervisorOptions), how often
(Schedule), and the result (Supervisor: the files, and the commands that install and remove
them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tpuctl import __version__
from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, UsageError

Target = Literal["cron", "systemd", "kubernetes", "cloud-run", "github"]
TARGETS: tuple[Target, ...] = ("cron", "systemd", "kubernetes", "cloud-run", "github")
# Targets that run somewhere else: they reach the run's state only through checkpoint.dir on gs://.
REMOTE_TARGETS: tuple[Target, ...] = ("kubernetes", "cloud-run", "github")

# `tpuctl reconcile` ends one step within about this long (its own deadline).
STEP_DEADLINE_SECONDS = 60
# What a step returns while the run goes on: every scheduler is told it is a success.
IN_PROGRESS = int(ExitCode.IN_PROGRESS)
DEFAULT_IMAGE = "docker.io/library/python:3.11-slim"
DEFAULT_PACKAGE = f"tpuctl=={__version__}"
# Where the step finds the spec: Kubernetes mounts it from a ConfigMap, a Cloud Run task writes
# it from a variable (into /tmp: an image may run as any user), a workflow that does not check
# the repository out writes it into its workspace.
CONTAINER_SPEC_DIR = "/etc/tpuctl"
CONTAINER_SPEC = f"{CONTAINER_SPEC_DIR}/spec.yaml"
CLOUD_RUN_SPEC = "/tmp/tpuctl/spec.yaml"
GITHUB_SPEC = "tpuctl-spec.yaml"


@dataclass(frozen=True)
class SupervisorOptions:
    """Everything a renderer needs, decided by the caller (paths made absolute, the environment
    chosen): the renderers only turn it into text.

    `spec_path` is the spec as the step will read it on this machine (cron, systemd);
    `spec_text` its bytes, for the targets that carry it along (a ConfigMap, a Cloud Run
    variable, a workflow); `spec_in_repository` its path inside the git repository that holds
    it (github checks the repository out instead of carrying the text)."""

    target: Target
    name: str  # the run: the spec's name
    spec_path: str
    spec_text: str = ""
    every_seconds: float = 60.0
    tpuctl: tuple[str, ...] = ("tpuctl",)  # the command, by absolute path for cron and systemd
    reconcile_args: tuple[str, ...] = ()  # --set, --project, --zone(s), --impersonate-…
    environment: Mapping[str, str] = field(default_factory=dict)
    directory: str = ""  # where the files are written ("" : the current directory)
    state_dir: str = "~/.local/state/tpuctl/supervise"  # cron's lock and log files
    system: bool = False  # systemd: system units (User=) instead of user units
    user: str | None = None  # systemd --system: the account the step runs as
    image: str | None = None  # a container image with tpuctl on PATH
    package: str | None = None  # what pip installs first (DEFAULT_PACKAGE with no image)
    service_account: str | None = None  # the supervisor's Google service account
    project: str | None = None
    region: str | None = None
    namespace: str = "default"
    workload_identity_provider: str | None = None
    spec_in_repository: str | None = None
    checkpoint_dir: str | None = None  # where the run's state lives (gs://… for REMOTE_TARGETS)
    job_code: str | None = None  # the spec's job.code, which a remote step cannot upload if local

    @property
    def unit(self) -> str:
        """The scheduler-side name of this run's supervisor."""
        return f"tpuctl-reconcile-{self.name}"

    @property
    def pip_package(self) -> str | None:
        """What a container installs before the step: the given package, else tpuctl at this
        version when no image (that would hold it) was given."""
        if self.package:
            return self.package
        return None if self.image else DEFAULT_PACKAGE

    @property
    def container_image(self) -> str:
        return self.image or DEFAULT_IMAGE


@dataclass
class SupervisorFile:
    """One artefact: its file name, its text, and where it was written (None: printed)."""

    name: str
    content: str
    path: str | None = None

    @property
    def executable(self) -> bool:
        return self.name.endswith(".sh")


@dataclass
class Supervisor(Result):
    """Kind `Supervisor`: what runs `tpuctl reconcile` for one run on one scheduler."""

    KIND: ClassVar[str] = "Supervisor"

    name: str
    target: str
    unit: str
    every_seconds: int
    schedule: str  # the scheduler's own expression (cron syntax, or systemd's OnCalendar)
    command: list[str]  # the reconcile step each firing runs
    files: list[SupervisorFile] = field(default_factory=list)
    install: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    installed: bool = False  # --install: the install commands ran on this machine


# ---------------------------------------------------------------------------------- schedule

# Intervals that divide a minute (below it) or an hour (from a minute up): every one of them
# maps to a cron expression and a calendar without a gap at the turn of the hour.
SUBMINUTE_SECONDS = (5, 6, 10, 12, 15, 20, 30)
MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
# The fastest each target fires: cron and systemd below a minute (cron by sleeping into it),
# Kubernetes and Cloud Scheduler once a minute, GitHub once every five minutes.
FASTEST: dict[Target, int] = {
    "cron": SUBMINUTE_SECONDS[0],
    "systemd": SUBMINUTE_SECONDS[0],
    "kubernetes": 60,
    "cloud-run": 60,
    "github": 300,
}
WHY_NOT_FASTER: dict[Target, str] = {
    "kubernetes": "a Kubernetes CronJob fires at most once a minute",
    "cloud-run": "Cloud Scheduler fires at most once a minute",
    "github": "GitHub runs scheduled workflows at most every 5 minutes (and often late)",
}


@dataclass(frozen=True)
class Schedule:
    """How often a step runs on a target: `seconds` between steps, the cron expression, the
    seconds into each minute that cron's lines sleep (sub-minute), systemd's OnCalendar."""

    seconds: int
    cron: str
    offsets: tuple[int, ...]
    calendar: str
    notes: tuple[str, ...] = ()


def schedule_for(target: Target, every: float) -> Schedule:
    """The schedule for `every` seconds on `target`: faster than the target can fire is rounded
    up to what it can (with a note); an interval that does not divide a minute or an hour is a
    UsageError."""
    seconds = _checked_interval(every)
    notes: tuple[str, ...] = ()
    if seconds < FASTEST[target]:
        fastest = FASTEST[target]
        why = WHY_NOT_FASTER[target]
        notes = (f"--every {say_interval(seconds)} rounded up to {say_interval(fastest)}: {why}",)
        seconds = fastest
    if seconds < 60:
        offsets = tuple(range(0, 60, seconds))
        return Schedule(seconds, "* * * * *", offsets, f"*-*-* *:*:00/{seconds}", notes)
    minutes = seconds // 60
    if minutes == 1:
        return Schedule(seconds, "* * * * *", (0,), "*-*-* *:*:00", notes)
    if minutes == 60:
        return Schedule(seconds, "0 * * * *", (0,), "*-*-* *:00:00", notes)
    return Schedule(seconds, f"*/{minutes} * * * *", (0,), f"*-*-* *:00/{minutes}:00", notes)


def _checked_interval(every: float) -> int:
    seconds = round(every)
    if abs(every - seconds) > 1e-9 or seconds <= 0:
        raise UsageError(f"--every {every:g}s is not a whole number of seconds", hint=_EVERY_HINT)
    said = say_interval(seconds)
    if seconds < 60 and seconds not in SUBMINUTE_SECONDS:
        raise UsageError(f"--every {said} does not divide a minute", hint=_EVERY_HINT)
    if seconds >= 60 and (seconds % 60 or seconds // 60 not in MINUTES):
        raise UsageError(f"--every {said} does not divide an hour", hint=_EVERY_HINT)
    return seconds


_EVERY_HINT = "use 5s, 10s, 15s, 20s or 30s, or 1m, 2m, 5m, 10m, 15m, 30m or 1h (default 1m)"


def say_interval(seconds: int) -> str:
    """`15s`, `1m`, `1h`: an interval as --every takes it."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
