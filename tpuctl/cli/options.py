"""Shared click options, declared once and stacked on commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.completion import complete_spec_path, complete_target
from tpuctl.cli.context import FORMATS, AppContext
from tpuctl.errors import quoted

if TYPE_CHECKING:
    from tpuctl.fanout.operations import SshSettings

F = TypeVar("F", bound=Callable[..., Any])


def _set_format(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        app = ctx.find_root().obj
        if isinstance(app, AppContext):
            app.output = value  # type: ignore[assignment]
    return value


def output_option(func: F) -> F:
    """`--format` on a subcommand too (`tpuctl status X --format json`), same as the global one."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(FORMATS),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_set_format,
        help="Output: a table for people (wide: every column), json or yaml for scripts.",
    )(func)


def spec_argument(func: F) -> F:
    return click.argument(
        "spec_path",
        metavar="SPEC",
        type=click.Path(dir_okay=False),
        shell_complete=complete_spec_path,
    )(func)


def target_argument(func: F) -> F:
    """NAME|SPEC: a queued resource's name (or full resource path) or a spec file; it completes
    to both (tpuctl.cli.targets.resolve_target tells them apart)."""
    return click.argument("target", metavar="NAME|SPEC", shell_complete=complete_target)(func)


def set_option(func: F) -> F:
    """`--set path=value` overrides, typed like YAML; repeatable."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="PATH=VALUE",
        help="Override one spec key, e.g. --set tpu.slices=4 (typed like YAML). Repeatable.",
    )(func)


def project_zone_options(func: F) -> F:
    """`--project/--zone`. No `envvar=` on purpose: a flag outranks the spec, but TPUCTL_PROJECT
    and TPUCTL_ZONE rank below it, so the environment is read by the resolver, not by click."""
    func = click.option(
        "--zone",
        default=None,
        help="Zone (else the spec, TPUCTL_ZONE, CLOUDSDK_COMPUTE_ZONE, the gcloud config).",
    )(func)
    return click.option(
        "--project",
        default=None,
        help="Project (else the spec, TPUCTL_PROJECT, CLOUDSDK_CORE_PROJECT, the gcloud config, "
        "ADC).",
    )(func)


def zones_options(func: F) -> F:
    """`--zones Z1,Z2` and `--all-zones`: several zones at once, instead of `--zone`."""
    func = click.option(
        "--all-zones",
        is_flag=True,
        default=False,
        help="Every zone of the project (the TPU API's locations), asked side by side.",
    )(func)
    return click.option(
        "--zones",
        default=None,
        metavar="Z1,Z2",
        help="These zones (comma-separated), asked side by side, instead of --zone.",
    )(func)


def run_zones_option(func: F) -> F:
    """`--zones Z1,Z2` for the commands that bring a queued resource up (create, up)."""
    return click.option(
        "--zones",
        default=None,
        metavar="Z1,Z2",
        help="Queue in these zones (comma-separated, in order of preference) instead of the "
        "spec's zone or capacity.zones, tried as capacity.zone_policy says.",
    )(func)


def one_of_zone_zones(zone: str | None, zones: str | None) -> str | None:
    """`--zones`, refused beside `--zone` (one zone or several, not both)."""
    if zone is not None and zones is not None:
        from tpuctl.errors import UsageError

        raise UsageError("--zone and --zones exclude one another", hint="pass only one of them")
    return zones


def with_zones(overrides: tuple[str, ...], zones: str | None) -> tuple[str, ...]:
    """`--zones a,b` as the override it stands for (`capacity.zones=[a, b]`, which replaces
    the spec's zone)."""
    if zones is None:
        return overrides
    from tpuctl.cloud.zones import parse_zones

    return (*overrides, f"capacity.zones=[{', '.join(parse_zones(zones))}]")


def yes_option(func: F) -> F:
    return click.option(
        "--yes", "-y", is_flag=True, default=False, help="Do not ask for confirmation."
    )(func)


def dry_run_option(func: F) -> F:
    return click.option(
        "--dry-run", is_flag=True, default=False, help="Show what would be sent; send nothing."
    )(func)


class DurationType(click.ParamType):  # type: ignore[type-arg]  # generic only in click ≥ 8.3
    """A duration in tpuctl's one grammar (tpuctl.clock.parse_duration: `0.5`, `90s`, `1.5h`,
    `1h30m`, `850ms`; a plain number is seconds) → seconds, more than zero unless
    `zero_ok`."""

    name = "duration"

    def __init__(self, *, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from tpuctl.clock import DURATION_HINT, parse_duration

        try:
            seconds = parse_duration(value if isinstance(value, float | int) else str(value))
        except ValueError as error:
            self.fail(f"{error}; {DURATION_HINT}", param, ctx)
        if not (seconds > 0 or self.zero_ok):
            self.fail(f"{quoted(value)} is not a positive duration; {DURATION_HINT}", param, ctx)
        return seconds


DURATION = DurationType()
DURATION_OR_ZERO = DurationType(zero_ok=True)


def impersonate_option(func: F) -> F:
    return click.option(
        "--impersonate-service-account",
        "impersonate",
        metavar="EMAIL",
        default=None,
        envvar="TPUCTL_IMPERSONATE_SERVICE_ACCOUNT",
        help="Act as this service account (google-auth impersonated credentials).",
    )(func)


def worker_ssh_options(func: F) -> F:
    """How to reach the workers: the flags of every command that connects to them."""
    options = [
        click.option(
            "--strict-host-key-checking",
            type=click.Choice(["yes", "accept-new", "no"]),
            default="accept-new",
            show_default=True,
            help="Host keys are checked against the workers' guest attributes, else against "
            "the keys pinned in ~/.ssh/tpuctl_known_hosts. accept-new: a worker that publishes "
            "none and is not pinned yet is trusted on first use and pinned; yes: it is "
            "refused; no: nothing is checked.",
        ),
        click.option(
            "--ssh-port", type=int, default=None, help="SSH port (else TPUCTL_SSH_PORT, else 22)."
        ),
        click.option(
            "--internal-ip",
            is_flag=True,
            default=False,
            help="Connect to the workers' internal IPs (from inside their VPC). Workers with no "
            "external IP are always reached at their internal ones.",
        ),
        click.option(
            "--tunnel-through-iap",
            is_flag=True,
            default=False,
            help="Reach each worker through its own `gcloud compute start-iap-tunnel` (gcloud "
            "from TPUCTL_GCLOUD, else PATH), for workers with no external IP; a firewall rule "
            "must admit 35.235.240.0/20 on tcp:22.",
        ),
        click.option(
            "--proxy-jump",
            metavar="[USER@]HOST[:PORT]",
            default=None,
            help="Reach the workers' internal IPs through this bastion (one SSH connection to "
            "it, as ssh -J); its host key is checked against ~/.ssh/known_hosts and tpuctl's "
            "known hosts. USER defaults to the workers' login user.",
        ),
        click.option(
            "--user",
            default=None,
            help="SSH user (default: $USER; with OS Login, your account's POSIX user).",
        ),
        click.option(
            "--key-ttl",
            type=DURATION,
            default=24 * 3600.0,
            show_default="24h",
            help="With OS Login: how long the imported SSH key stays valid.",
        ),
    ]
    for option in options:
        func = option(func)
    return func


WORKER_SSH_KEYS = (
    "user",
    "internal_ip",
    "tunnel_through_iap",
    "proxy_jump",
    "ssh_port",
    "strict_host_key_checking",
    "key_ttl",
)


def pop_worker_ssh(values: dict[str, Any]) -> dict[str, Any]:
    """worker_ssh_options' values, taken out of a command's keyword arguments."""
    return {key: values.pop(key) for key in WORKER_SSH_KEYS}


def ssh_settings(
    app: AppContext,
    *,
    user: str | None,
    internal_ip: bool,
    ssh_port: int | None,
    strict_host_key_checking: str,
    tunnel_through_iap: bool = False,
    proxy_jump: str | None = None,
    **tuning: Any,
) -> SshSettings:
    """SshSettings from worker_ssh_options (plus connect_timeout/batch_size where a command has
    them), saying loudly what `--strict-host-key-checking no` gives up."""
    from tpuctl.fanout.operations import SshSettings

    if strict_host_key_checking == "no":
        app.warn(
            "--strict-host-key-checking no: worker host keys are NOT checked against their "
            "guest attributes or pinned keys; anyone able to intercept the connection could "
            "impersonate a worker and read your commands, output and uploads"
        )
    return SshSettings(
        user=user,
        internal_ip=internal_ip,
        tunnel_through_iap=tunnel_through_iap,
        proxy_jump=proxy_jump,
        ssh_port=ssh_port,
        strict_host_key_checking=strict_host_key_checking,  # type: ignore[arg-type]
        **tuning,
    )
