"""`tpuctl emulator …`: run the local Cloud TPU emulator and drive its faults."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.options import DURATION_OR_ZERO, output_option
from tpuctl.cli.output import emit
from tpuctl.cli.views import emulator as views
from tpuctl.errors import TpuctlError, UsageError, quoted

if TYPE_CHECKING:
    from tpuctl.emulator.client.admin import AdminClient

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@click.group("emulator")
def emulator_group() -> None:
    """Run and drive the local Cloud TPU emulator.

    `tpuctl emulator start` prints TPU_EMULATOR_HOST, TPUCTL_SSH_PORT, TPUCTL_COMPUTE_ENDPOINT
    and the settings that point gcloud at it (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU, …) as lines
    to export; `tpuctl emulator env` prints them as `export` lines. The other commands talk to
    the emulator named by TPU_EMULATOR_HOST.
    """


@emulator_group.command("start")
@click.option("--port", type=int, default=0, show_default=True, help="gRPC port (0: any free).")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="VM disks, logs and events.jsonl (default: a temporary directory removed at exit).",
)
@click.option(
    "--speed", type=float, default=1.0, show_default=True, help="Divide every delay by this."
)
@click.option(
    "--capacity",
    default="",
    metavar="GEN=CHIPS,…",
    help="Chips per generation pool, e.g. v4=64,v5e=256 (default 16384 each).",
)
@click.option(
    "--grace",
    type=DURATION_OR_ZERO,
    default="300s",
    show_default=True,
    help="Autocheckpoint grace before a maintenance kill (divided by --speed).",
)
@click.option("--ssh-port", type=int, default=0, show_default=True, help="SSH port (0: any).")
@click.option(
    "--rest-port",
    type=int,
    default=0,
    show_default=True,
    help="Port of the Cloud TPU REST API, the one gcloud uses (0: any free).",
)
@click.option(
    "--flex-start-capacity",
    default="",
    metavar="GEN=CHIPS,…",
    help="Chips per generation in flex-start's own pools (default 16384 each).",
)
@click.option(
    "--delay",
    "delays",
    multiple=True,
    metavar="NAME=SECONDS",
    help="Override a step delay (creating, waiting, provisioning, suspending, deleting, "
    "reset, reboot, repair, stopping, starting). Repeatable.",
)
@click.option("--verbose", "-v", is_flag=True, default=False, help="Log events to stderr.")
def start(  # noqa: PLR0917 - click passes options positionally
    port: int,
    state_dir: Path | None,
    speed: float,
    capacity: str,
    grace: float,
    ssh_port: int,
    rest_port: int,
    flex_start_capacity: str,
    delays: tuple[str, ...],
    verbose: bool,
) -> None:
    """Run the emulator in the foreground until SIGINT or SIGTERM.

    Prints NAME=value lines to export: tpuctl's (TPU_EMULATOR_HOST, TPUCTL_SSH_PORT,
    TPUCTL_COMPUTE_ENDPOINT), then gcloud's (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU and
    _COMPUTE, CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true), so that the real gcloud talks to it too.
    """
    from tpuctl.emulator.control.config import config_from_flags

    try:
        import asyncssh  # noqa: F401  (the worker SSH servers; checked here for a clear error)
    except ImportError:
        raise TpuctlError(
            "the emulator's SSH servers need asyncssh, which is not installed",
            hint="pip install 'tpuctl[emulator]' (scripts/demo and scripts/test install it)",
        ) from None
    from tpuctl.emulator.api.server import serve_until_signalled

    try:
        config = config_from_flags(
            port=port,
            state_dir=state_dir,
            speed=speed,
            capacity=capacity,
            grace=grace,
            ssh_port=ssh_port,
            delays=delays,
            rest_port=rest_port,
            flex_capacity=flex_start_capacity,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    if verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")

    def announce(emulator: Any) -> None:
        sys.stdout.write(
            "".join(f"{name}={value}\n" for name, value in _exports(emulator_info(emulator)))
        )
        sys.stdout.flush()

    serve_until_signalled(config, announce)


def emulator_info(emulator: Any) -> dict[str, Any]:
    """What `start` announces, from a running Emulator (as the admin Status call has it)."""
    return {
        "host": emulator.host,
        "ssh_port": emulator.ssh_port,
        "compute_endpoint": emulator.compute_endpoint,
        "rest_endpoint": emulator.rest_endpoint,
    }


def _exports(info: dict[str, Any], project: str = "") -> list[tuple[str, str]]:
    """tpuctl's variables, then gcloud's, for the emulator `info` describes."""
    from tpuctl.emulator.client.gcloud import gcloud_settings

    tpuctl = [
        ("TPU_EMULATOR_HOST", str(info["host"])),
        ("TPUCTL_SSH_PORT", str(info["ssh_port"])),
        ("TPUCTL_COMPUTE_ENDPOINT", str(info["compute_endpoint"])),
    ]
    gcloud = gcloud_settings(str(info["rest_endpoint"]), str(info["compute_endpoint"]), project)
    return tpuctl + list(gcloud.items())


def host_option(func: F) -> F:
    return click.option(
        "--host",
        envvar="TPU_EMULATOR_HOST",
        default=None,
        help="The emulator (default: $TPU_EMULATOR_HOST).",
    )(func)


def _admin(host: str | None) -> AdminClient:
    from tpuctl.emulator.client.admin import AdminClient

    if not host:
        raise UsageError(
            "TPU_EMULATOR_HOST is not set",
            hint="run `tpuctl emulator start` and export the lines it prints",
        )
    return AdminClient(host)


@emulator_group.command("env")
@click.option(
    "--project",
    default=None,
    help="Also set gcloud's project (CLOUDSDK_CORE_PROJECT); the emulator takes any name.",
)
@click.option("--unset", is_flag=True, default=False, help="Print `unset` lines instead.")
@host_option
def env(project: str | None, unset: bool, host: str | None) -> None:
    """Print `export` lines that point tpuctl and the real gcloud at a running emulator, as
    `gcloud beta emulators … env-init` does: `eval "$(tpuctl emulator env)"`.

    gcloud's: CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU (its REST API), _COMPUTE (the project's
    metadata), CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true, and CLOUDSDK_CORE_PROJECT with
    --project. `--unset` prints the lines that undo them."""
    import shlex

    with _admin(host) as admin:
        info = admin.status()
    for name, value in _exports(info, project or ""):
        line = f"unset {name}" if unset else f"export {name}={shlex.quote(value)}"
        sys.stdout.write(line + "\n")


@emulator_group.command("status")
@host_option
@output_option
def status(host: str | None) -> None:
    """Show capacity, queued resources and injected faults."""
    with _admin(host) as admin:
        data = admin.status()
    emit(views.EmulatorStatus(data), views.status_view)


@emulator_group.command("preempt")
@click.argument("queued_resource")
@host_option
@output_option
def preempt(queued_resource: str, host: str | None) -> None:
    """Spot preemption: kill the VMs, nodes PREEMPTED, QR SUSPENDED (initiator SERVICE)."""
    with _admin(host) as admin:
        reply = admin.preempt(queued_resource)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("fail-slice")
@click.argument("queued_resource")
@click.option("--slice", "slice_index", type=int, required=True, help="Slice (node) index.")
@host_option
@output_option
def fail_slice(queued_resource: str, slice_index: int, host: str | None) -> None:
    """Hardware failure: replace one slice with a fresh disk and restart all the others."""
    with _admin(host) as admin:
        reply = admin.fail_slice(queued_resource, slice_index)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("maintenance")
@click.argument("node")
@click.option("--worker", type=int, default=0, show_default=True)
@click.option(
    "--at",
    type=DURATION_OR_ZERO,
    default=0.0,
    help="When, from now, e.g. +30s (emulated time).",
)
@host_option
@output_option
def maintenance(node: str, worker: int, at: float, host: str | None) -> None:
    """Maintenance on a node: SIGTERM with the autocheckpoint grace (else kill), then reboot."""
    with _admin(host) as admin:
        reply = admin.maintenance(node, worker, at)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("hostkey-fault")
@click.argument("node")
@click.option("--worker", type=int, required=True)
@click.option("--mode", type=click.Choice(["missing", "rotate", "none"]), required=True)
@host_option
@output_option
def hostkey_fault(node: str, worker: int, mode: str, host: str | None) -> None:
    """Make one worker publish no host key in its guest attributes (missing), give it a new
    host key as a rebuilt VM has (rotate; published unless missing), or publish it again
    (none)."""
    with _admin(host) as admin:
        reply = admin.hostkey_fault(node, worker, mode)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("ssh-fault")
@click.argument("node")
@click.option("--worker", type=int, required=True)
@click.option("--mode", type=click.Choice(["hang", "refuse", "none"]), required=True)
@host_option
@output_option
def ssh_fault(node: str, worker: int, mode: str, host: str | None) -> None:
    """Make one worker's SSH server hang or refuse connections (none: heal it)."""
    with _admin(host) as admin:
        reply = admin.ssh_fault(node, worker, mode)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("api-fault")
@click.option("--code", default=None, help="gRPC status code, e.g. UNAVAILABLE.")
@click.option(
    "--count",
    type=int,
    default=None,
    help="How many next API calls fail (default 1 with --code; 0 clears).",
)
@click.option(
    "--create-exhausted", type=int, default=None, help="Next N creates: RESOURCE_EXHAUSTED."
)
@host_option
@output_option
def api_fault(
    code: str | None, count: int | None, create_exhausted: int | None, host: str | None
) -> None:
    """Fail the next API calls (0 clears)."""
    if code is not None and count is None:
        count = 1
    with _admin(host) as admin:
        reply = admin.api_fault(code, count, create_exhausted)
    emit(views.EmulatorFault(reply), views.fault_view)


@emulator_group.command("capacity")
@click.argument("changes", nargs=-1, metavar="[GEN=CHIPS]...")
@click.option(
    "--zone",
    default=None,
    help="The pools this zone draws from; changing them gives the zone pools of its own "
    "(other zones keep sharing theirs).",
)
@click.option(
    "--flex-start",
    is_flag=True,
    default=False,
    help="Flex-start's own pools (provisioning model FLEX_START draws only from these).",
)
@host_option
@output_option
def capacity(
    changes: tuple[str, ...], zone: str | None, flex_start: bool, host: str | None
) -> None:
    """Show or change capacity pools; freed capacity lets waiting QRs proceed."""
    from tpuctl.emulator.control.config import parse_capacity, parse_flag

    try:
        parsed = parse_flag(parse_capacity, ",".join(changes), "capacity")
    except ValueError as error:
        raise UsageError(str(error)) from None
    with _admin(host) as admin:
        data = admin.capacity(parsed, zone=zone, flex_start=flex_start)
    emit(views.EmulatorCapacity(data), views.capacity_view)


@emulator_group.command("reservation")
@click.argument("name")
@click.option("--chips", type=int, default=None, help="Make (or replace) it with this size.")
@click.option("--generation", default=None, help="What it holds chips of (default v4).")
@click.option(
    "--state",
    type=click.Choice(["APPROVED", "PROVISIONING", "ACTIVE", "DEPROVISIONING", "EXPIRED"]),
    default=None,
    help="Its state (default ACTIVE).",
)
@click.option("--start", default=None, help="Its window's start: now, +2h, or RFC 3339.")
@click.option("--end", default=None, help="Its window's end: now (ends it), +2h, or RFC 3339.")
@click.option("--remove", is_flag=True, default=False, help="Remove it.")
@host_option
@output_option
def reservation(  # noqa: PLR0917 - click passes options positionally
    name: str,
    chips: int | None,
    generation: str | None,
    state: str | None,
    start: str | None,
    end: str | None,
    remove: bool,
    host: str | None,
) -> None:
    """Make, change or remove a TPU reservation (projects/P/locations/Z/reservations/R), as
    ListReservations lists it; reservation-bound queued resources draw from it within its
    window and lose their nodes when it ends. Times +2h are emulated (÷ the speed)."""
    with _admin(host) as admin:
        if remove:
            data = admin.call("Reservation", {"name": name, "remove": True})
        elif chips is not None:
            data = {"reservations": admin.reservation(
                name, chips=chips, generation=generation or "v4", state=state or "ACTIVE",
                start=start, end=end,
            )}  # fmt: skip
        else:
            changes = {"state": state, "start": start, "end": end}
            given = {key: value for key, value in changes.items() if value is not None}
            if not given:
                raise UsageError(
                    "nothing to change", hint="give --chips, --state, --start, --end or --remove"
                )
            data = {"reservations": admin.update_reservation(name, **given)}
    emit(views.EmulatorFault(data), views.fault_view)


@emulator_group.command("rest-requests")
@click.argument("resource", required=False)
@host_option
def rest_requests(resource: str | None, host: str | None) -> None:
    """The requests the REST API was sent that change something (POST, PATCH, DELETE), with
    their JSON bodies, as JSON lines, oldest first; with RESOURCE (a full name), only those on
    it (a create counts for what it makes). Shows what gcloud sends."""
    import json

    with _admin(host) as admin:
        for entry in admin.rest_requests(resource):
            sys.stdout.write(json.dumps(entry) + "\n")


@emulator_group.command("project-metadata")
@click.argument("project")
@click.argument("changes", nargs=-1, metavar="[KEY=VALUE|KEY=]...")
@host_option
@output_option
def project_metadata(project: str, changes: tuple[str, ...], host: str | None) -> None:
    """Show or set a project's common instance metadata (`enable-oslogin=TRUE` turns OS Login
    on for its nodes that do not say otherwise); `KEY=` removes a key."""
    parsed: dict[str, str | None] = {}
    for change in changes:
        key, sep, value = change.partition("=")
        if not sep or not key:
            raise UsageError(f"{quoted(change)} is not KEY=VALUE", hint="e.g. enable-oslogin=TRUE")
        parsed[key] = value or None
    with _admin(host) as admin:
        data = admin.project_metadata(project, parsed)
    emit(views.EmulatorFault({"project": project, **data}), views.fault_view)


@emulator_group.command("events")
@click.option("--follow", "-f", is_flag=True, default=False, help="Keep printing new events.")
@click.option("--since", type=int, default=0, show_default=True, help="First event number.")
@host_option
def events(follow: bool, since: int, host: str | None) -> None:
    """The event log as JSON lines, in the emulator's own event format (docs/emulator.md), not
    an envelope: a stream that tests and `jq` read line by line."""
    import json

    with _admin(host) as admin:
        stream = admin.follow(since) if follow else iter(admin.events(since))
        for event in stream:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()


@emulator_group.group("compute")
def compute_group() -> None:
    """Drive the emulator's Compute Engine fake (TPU VMs at TPUCTL_COMPUTE_ENDPOINT).

    TARGET is an instance (projects/P/zones/Z/instances/NAME, or a name that names one) or a
    managed instance group (projects/P/zones/Z/instanceGroupManagers/NAME or
    projects/P/regions/R/instanceGroupManagers/NAME, or its bare name): every instance of it.
    """


@compute_group.command("preempt")
@click.argument("target")
@host_option
@output_option
def compute_preempt(target: str, host: str | None) -> None:
    """Spot preemption: `preempted` TRUE, the soft-off SIGTERM with 30 s to go, then TERMINATED
    (deleted with instanceTerminationAction DELETE)."""
    with _admin(host) as admin:
        reply = admin.compute_preempt(target)
    emit(views.EmulatorFault(reply), views.fault_view)


@compute_group.command("maintenance")
@click.argument("target")
@click.option(
    "--at",
    type=DURATION_OR_ZERO,
    default=0.0,
    help="When, from now, e.g. +30m (emulated time); announced in upcomingMaintenance until then.",
)
@host_option
@output_option
def compute_maintenance(target: str, at: float, host: str | None) -> None:
    """Host maintenance: SIGTERM and the OS's stop timeout, a reboot, the startup script again."""
    with _admin(host) as admin:
        reply = admin.compute_maintenance(target, at)
    emit(views.EmulatorFault(reply), views.fault_view)


@compute_group.command("capacity")
@click.argument("changes", nargs=-1, metavar="[GEN=CHIPS]...")
@click.option(
    "--zone",
    default=None,
    help="The pools this zone draws from; changing them gives the zone pools of its own.",
)
@host_option
@output_option
def compute_capacity(changes: tuple[str, ...], zone: str | None, host: str | None) -> None:
    """Show or change the fake's TPU pools (v5p, v6e, tpu7x); freed chips let flex-start VMs
    and bulk MIGs that wait proceed, shrinking a pool below use preempts its spot VMs."""
    from tpuctl.emulator.compute.catalog import parse_pools

    try:
        parsed = parse_pools(",".join(changes))
    except ValueError as error:
        raise UsageError(str(error)) from None
    with _admin(host) as admin:
        data = admin.compute_capacity(parsed, zone=zone)
    emit(views.EmulatorCapacity(data), views.capacity_view)
