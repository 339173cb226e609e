"""`tpuctl supervise SPEC --on TARGET`: what runs `tpuctl reconcile SPEC` on a scheduler, printed
or written to a directory (the renderers are in tpuctl.render.supervisor)."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.options import (
    DURATION,
    impersonate_option,
    one_of_zone_zones,
    output_option,
    project_zone_options,
    run_zones_option,
    set_option,
    spec_argument,
)
from tpuctl.cli.output import emit

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.render.supervisor import Supervisor, SupervisorOptions
    from tpuctl.spec.model import Spec

TARGET_CHOICES = ("cron", "systemd", "kubernetes", "cloud-run", "github")


@click.command()
@spec_argument
@click.option(
    "--on",
    "target",
    type=click.Choice(TARGET_CHOICES),
    required=True,
    help="The scheduler: cron or systemd on this machine; kubernetes, cloud-run or github "
    "elsewhere (those need checkpoint.dir on gs://).",
)
@click.option(
    "--every",
    type=DURATION,
    default=60.0,
    show_default="1m",
    help="Time between steps: 5s-30s (cron, systemd) or 1m-1h, dividing a minute or an hour. "
    "Kubernetes and Cloud Scheduler fire at most every minute, GitHub every 5 minutes.",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the files there (else print them) and name them in the install commands.",
)
@set_option
@project_zone_options
@run_zones_option
@impersonate_option
@click.option(
    "--env",
    "variables",
    multiple=True,
    metavar="NAME=VALUE",
    help="One more variable in the step's environment. Repeatable.",
)
@click.option(
    "--tpuctl",
    "executable",
    default=None,
    help="The tpuctl executable cron and systemd run (default: this one, by absolute path).",
)
@click.option(
    "--service-account",
    metavar="EMAIL",
    default=None,
    help="The Google service account the supervisor acts as: Workload Identity (kubernetes, "
    "github), the Cloud Run job's account and Cloud Scheduler's token (cloud-run).",
)
@click.option(
    "--workload-identity-provider",
    metavar="NAME",
    default=None,
    help="github: projects/NUMBER/locations/global/workloadIdentityPools/POOL/providers/ID.",
)
@click.option(
    "--image",
    default=None,
    help="kubernetes, cloud-run: an image with tpuctl on PATH (default: python:3.11-slim, "
    "with a pip install of tpuctl before each step).",
)
@click.option(
    "--package",
    metavar="REQUIREMENT",
    default=None,
    help="What pip installs before each step (default: tpuctl at this version).",
)
@click.option("--region", default=None, help="cloud-run: the region (default: the zone's).")
@click.option(
    "--namespace", default="default", show_default=True, help="kubernetes: the namespace."
)
@click.option(
    "--system",
    is_flag=True,
    default=False,
    help="systemd: system units run as this user, instead of user units.",
)
@click.option(
    "--install",
    is_flag=True,
    default=False,
    help="cron, systemd: install it on this machine now (the install commands, run for you) "
    "instead of printing the files.",
)
@output_option
def supervise(
    *,
    spec_path: str,
    target: str,
    every: float,
    output_dir: str | None,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    variables: tuple[str, ...],
    executable: str | None,
    service_account: str | None,
    workload_identity_provider: str | None,
    image: str | None,
    package: str | None,
    region: str | None,
    namespace: str,
    system: bool,
    install: bool,
) -> None:
    """Render what runs `tpuctl reconcile SPEC` every minute (or --every) on a scheduler.

    \b
    cron        a crontab line: flock so steps never overlap, output to a log file
    systemd     a oneshot service and its timer (user units, or --system)
    kubernetes  a CronJob, its ServiceAccount (Workload Identity) and the spec in a ConfigMap
    cloud-run   the gcloud commands: a Cloud Run job and the Cloud Scheduler job that starts it
    github      a GitHub Actions workflow on a schedule (Workload Identity Federation)

    Each maps exit 12 (the run goes on) to success; a given-up run keeps failing until a person
    looks. The files go to stdout (or --output-dir); the commands that install and remove
    them to stderr. Offline: no credentials, no network. With --install (cron, systemd),
    the install commands run here and then, and the remove commands are said.
    """
    from tpuctl.cli.views.supervisor import supervisor_view
    from tpuctl.errors import UsageError

    app = app_context()
    if install and target not in LOCAL_TARGETS:
        raise UsageError(
            f"--install puts cron or systemd in place on this machine, not {target}",
            hint=f"run the install commands tpuctl supervise SPEC --on {target} prints",
        )
    if install and output_dir is not None:
        raise UsageError("--install and --output-dir exclude one another", hint="pass one")
    render = Rendering(
        spec_path=spec_path,
        target=target,
        every=every,
        overrides=overrides,
        project=project,
        zone=zone,
        zones=zones,
        impersonate=impersonate,
        variables=variables,
        executable=executable,
        service_account=service_account,
        workload_identity_provider=workload_identity_provider,
        image=image,
        package=package,
        region=region,
        namespace=namespace,
        system=system,
    )
    result = install_supervisor(app, render) if install else render_for(app, render, output_dir)
    if not app.machine_output:
        for note in result.notes:
            app.info(f"note: {note}")
        if install:
            _say_installed(result)
        else:
            _say_commands(result, printed=output_dir is None)
    emit(result, supervisor_view, exact=True)


LOCAL_TARGETS = ("cron", "systemd")


@dataclass(frozen=True)
class Rendering:
    """What `tpuctl supervise` was asked for (its flags), to render from."""

    spec_path: str
    target: str
    every: float = 60.0
    overrides: tuple[str, ...] = ()
    project: str | None = None
    zone: str | None = None
    zones: str | None = None
    impersonate: str | None = None
    variables: tuple[str, ...] = ()
    executable: str | None = None
    service_account: str | None = None
    workload_identity_provider: str | None = None
    image: str | None = None
    package: str | None = None
    region: str | None = None
    namespace: str = "default"
    system: bool = False


def render_for(app: AppContext, asked: Rendering, output_dir: str | None) -> Supervisor:
    """The supervisor `asked` for, its files written to `output_dir` when given."""
    from dataclasses import replace

    from tpuctl.cli.targets import load_spec_warned
    from tpuctl.render.supervisor import render_supervisor

    zones = one_of_zone_zones(asked.zone, asked.zones)
    spec = load_spec_warned(app, asked.spec_path, asked.overrides)
    options = local_options(spec, asked.spec_path, asked.target, output_dir, asked.variables)
    scope = reconcile_args(
        spec,
        asked.overrides,
        project_flag=asked.project,
        zone_flag=asked.zone,
        zones=zones,
        impersonate=asked.impersonate,
    )
    options = replace(
        options,
        every_seconds=asked.every,
        reconcile_args=tuple(scope.args),
        project=scope.project,
        region=asked.region or scope.region,
        tpuctl=tuple(tpuctl_command(asked.executable)),
        system=asked.system,
        image=asked.image,
        package=asked.package,
        service_account=asked.service_account,
        namespace=asked.namespace,
        workload_identity_provider=asked.workload_identity_provider,
    )
    result = render_supervisor(options)
    if output_dir is not None:
        write_files(result, Path(output_dir))
    return result


def install_supervisor(app: AppContext, asked: Rendering) -> Supervisor:
    """Render the cron or systemd supervisor into a scratch directory and run its install
    commands here (`sh -c`, one by one); TpuctlError naming the command that failed. A
    systemd user's linger that cannot be enabled is only a warning (the timer runs while the
    user is logged in)."""
    import subprocess
    import tempfile

    from tpuctl.errors import TpuctlError

    with tempfile.TemporaryDirectory(prefix="tpuctl-supervise-") as scratch:
        result = render_for(app, asked, scratch)
        for command in result.install:
            done = subprocess.run(
                ["sh", "-c", command], capture_output=True, text=True, timeout=120, check=False
            )
            if done.returncode == 0:
                continue
            said = (done.stderr or done.stdout).strip().splitlines()
            why = said[-1] if said else f"exit {done.returncode}"
            if command.startswith("loginctl enable-linger"):
                app.warn(f"{command}: {why}: the timer runs only while you are logged in")
                continue
            raise TpuctlError(
                f"installing the {asked.target} supervisor failed at `{command}`: {why}",
                hint=f"install it by hand: tpuctl supervise {shlex.quote(asked.spec_path)} "
                f"--on {asked.target} --output-dir DIR prints the commands",
            )
    for file in result.files:
        file.path = None  # written to a scratch directory, now gone: installed elsewhere
    result.installed = True
    return result


def supervise_command(
    spec_path: str,
    target: str,
    *,
    overrides: tuple[str, ...] = (),
    project: str | None = None,
    zone: str | None = None,
    zones: str | None = None,
    impersonate: str | None = None,
) -> str:
    """The `tpuctl supervise` line that hands a run over to `target` (installing it, for cron
    and systemd), every word shell-quoted."""
    words = ["tpuctl", "supervise", os.path.abspath(spec_path), "--on", target]
    for override in overrides:
        words += ["--set", override]
    words += [*(["--project", project] if project else [])]
    words += [*(["--zones", zones] if zones else []), *(["--zone", zone] if zone else [])]
    words += [*(["--impersonate-service-account", impersonate] if impersonate else [])]
    if target in LOCAL_TARGETS:
        words.append("--install")
    return shlex.join(words)


def hand_over(
    app: AppContext,
    *,
    spec_path: str,
    overrides: tuple[str, ...],
    project: str | None,
    zone: str | None,
    zones: str | None,
    impersonate: str | None,
    target: str | None,
) -> dict[str, Any]:
    """`tpuctl up --detach`: the supervisor that takes the run on (`target`: installed here
    now), else the command that sets one up. Its document: target, command, installed,
    install and remove."""
    command = supervise_command(
        spec_path,
        target or "cron",
        overrides=overrides,
        project=project,
        zone=zone,
        zones=zones,
        impersonate=impersonate,
    )
    if target is None:
        return {
            "target": None,
            "command": command,
            "installed": False,
            "step": None,
            "install": [command],
            "remove": [],
        }
    from tpuctl.errors import TpuctlError

    asked = Rendering(
        spec_path=spec_path,
        target=target,
        overrides=overrides,
        project=project,
        zone=zone,
        zones=zones,
        impersonate=impersonate,
    )
    try:
        result = install_supervisor(app, asked)
    except TpuctlError as error:
        error.message = f"the job runs, but nothing supervises it: {error.message}"
        raise
    return {
        "target": target,
        "command": command,
        "installed": True,
        "step": shlex.join(result.command),
        "install": list(result.install),
        "remove": list(result.remove),
    }


@dataclass(frozen=True)
class Scope:
    """The step's flags that say which run (--set, --project, --zone(s), who to act as), and
    the project and region the remote targets are set up in."""

    args: list[str]
    project: str | None
    region: str | None


def reconcile_args(
    spec: Spec,
    overrides: tuple[str, ...],
    *,
    project_flag: str | None,
    zone_flag: str | None,
    zones: str | None,
    impersonate: str | None,
) -> Scope:
    """The flags given here, and the project and zone found here when the spec lacks them (a
    scheduler elsewhere has no gcloud configuration to find them in)."""
    from tpuctl.cloud.resolve import PLACEHOLDER_PROJECT, PLACEHOLDER_ZONE, offline_location
    from tpuctl.cloud.zones import parse_zones
    from tpuctl.plan import region_of

    location, _ = offline_location(
        project_flag=project_flag,
        zone_flag=zone_flag or (parse_zones(zones)[0] if zones else None),
        spec_project=spec.project,
        spec_zone=spec.zone or next(iter(spec.zones), None),
    )
    project = None if location.project == PLACEHOLDER_PROJECT else location.project
    zone = None if location.zone == PLACEHOLDER_ZONE else location.zone
    args: list[str] = []
    for override in overrides:
        args += ["--set", override]
    if project and (project_flag or not spec.project):
        args += ["--project", project]
    if zones:
        args += ["--zones", zones]
    elif zone and (zone_flag or not spec.zones):
        args += ["--zone", zone]
    if impersonate:
        args += ["--impersonate-service-account", impersonate]
    return Scope(args, project, region_of(zone) if zone else None)


def local_options(
    spec: Spec, spec_path: str, target: str, output_dir: str | None, variables: tuple[str, ...]
) -> SupervisorOptions:
    """What the renderer needs from this machine: absolute paths, the spec's bytes, the
    environment a local step keeps."""
    from tpuctl.render.supervisor import SupervisorOptions, local_environment

    extra = _variables(variables)
    path = os.path.abspath(spec_path)
    local = target in ("cron", "systemd")
    return SupervisorOptions(
        target=target,  # type: ignore[arg-type]  # a click.Choice of TARGETS
        name=spec.name,
        spec_path=path,
        spec_text=Path(path).read_text(encoding="utf-8"),
        environment=local_environment(os.environ, home=_account_home(), extra=extra)
        if local
        else extra,
        directory=os.path.abspath(output_dir) if output_dir else "",
        state_dir=str(_state_home() / "tpuctl" / "supervise"),
        user=_user_name(),
        spec_in_repository=repository_path(Path(path)),
        checkpoint_dir=spec.checkpoint.dir,
        job_code=spec.job.code if spec.job is not None else None,
    )


def tpuctl_command(executable: str | None) -> list[str]:
    """The tpuctl a scheduler on this machine runs, by absolute path: --tpuctl, else the one
    running now, else the one on PATH, else this Python with `-m tpuctl`."""
    import shutil

    if executable:
        found = shutil.which(executable) if os.sep not in executable else executable
        return [os.path.abspath(found or executable)]
    running = sys.argv[0] if sys.argv else ""
    if os.path.basename(running) == "tpuctl" and os.path.isfile(running):
        return [os.path.abspath(running)]
    on_path = shutil.which("tpuctl")
    if on_path:
        return [os.path.abspath(on_path)]
    return [sys.executable, "-m", "tpuctl"]


def repository_path(spec: Path) -> str | None:
    """The spec's path inside the git work tree that holds it, else None."""
    for parent in spec.parents:
        if (parent / ".git").exists():
            return spec.relative_to(parent).as_posix()
    return None


def write_files(result: Supervisor, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for file in result.files:
        path = directory / file.name
        path.write_text(file.content, encoding="utf-8")
        if file.executable:
            path.chmod(0o755)
        file.path = str(path.resolve())


def _say_installed(result: Supervisor) -> None:
    app = app_context()
    app.info(f"installed: {result.unit} steps the run every {result.every_seconds} s; remove:")
    for command in result.remove:
        app.info(f"  {command}")


def _say_commands(result: Supervisor, *, printed: bool) -> None:
    app = app_context()
    if printed:
        names = " and ".join(file.name for file in result.files)
        app.info(f"save the output as {names} (or pass --output-dir DIR), then install:")
    else:
        app.info("install:")
    for command in result.install:
        app.info(f"  {command}")
    app.info("remove:")
    for command in result.remove:
        app.info(f"  {command}")


def _variables(variables: tuple[str, ...]) -> dict[str, str]:
    from tpuctl.errors import UsageError

    chosen: dict[str, str] = {}
    for item in variables:
        name, equals, value = str(item).partition("=")
        if not equals or not name.isidentifier():
            raise UsageError(
                f"--env {item!r} is not NAME=VALUE", hint="e.g. --env TPUCTL_SSH_PORT=2222"
            )
        chosen[name] = value
    return chosen


def _state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def _account_home() -> str | None:
    """The home directory cron and systemd give this account (its passwd entry)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return None


def _user_name() -> str | None:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None
