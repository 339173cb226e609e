"""Resolving what a command acts on: NAME|SPEC → name, spec and location; the API connection."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from tpuctl.cli.context import AppContext
from tpuctl.errors import TpuctlError, UsageError

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.resolve import Location
    from tpuctl.cloud.zones import ZoneError
    from tpuctl.spec.load import LoadedSpec
    from tpuctl.spec.model import Spec

_RESOURCE_PATH = re.compile(r"^projects/([^/]+)/locations/([^/]+)/queuedResources/([^/]+)$")


@dataclass
class Target:
    """What NAME|SPEC names. `zones`: a spec with several zones (capacity.zones) and no
    --zone: its queued resource may be in any of them, so `connect_target` looks."""

    name: str
    spec: Spec | None
    location: Location
    zones: tuple[str, ...] = ()


def load_spec_warned(
    app: AppContext, path: str, overrides: Sequence[str], *, creating: bool = False
) -> Spec:
    """The spec at `path`, its warnings said. `creating`: a queued resource is to be made from
    it now, so a queueing deadline already past is an error."""
    return load_spec_loaded(app, path, overrides, creating=creating).spec


def load_spec_loaded(
    app: AppContext, path: str, overrides: Sequence[str], *, creating: bool = False
) -> LoadedSpec:
    """`load_spec_warned`, with the spec's text and the `${VAR}`s it expanded."""
    from tpuctl.clock import utc_now
    from tpuctl.spec.load import load_spec

    loaded = load_spec(path, overrides=tuple(overrides), now=utc_now() if creating else None)
    for warning in loaded.warnings:
        app.warn(str(warning))
    return loaded


def is_spec_path(argument: str) -> bool:
    return argument.endswith((".yaml", ".yml")) or os.path.isfile(argument)


def resolve_location_for(
    project: str | None, zone: str | None, spec: Spec | None, parsed: tuple[str, str] | None = None
) -> Location:
    from tpuctl.cloud.credentials import default_project
    from tpuctl.cloud.resolve import resolve_location

    project_flag, zone_flag = project, zone
    if parsed is not None:
        project_flag, zone_flag = project_flag or parsed[0], zone_flag or parsed[1]
    return resolve_location(
        project_flag=project_flag,
        zone_flag=zone_flag,
        spec_project=spec.project if spec else None,
        spec_zone=spec.zone if spec else None,
        default_project=default_project,
        on_warning=_warn,
    )


def _warn(message: str) -> None:
    from click import get_current_context

    from tpuctl.cli.context import app_context

    if get_current_context(silent=True) is None:
        return  # shell completion (a thread of its own): nothing may reach the terminal
    app_context().warn(message)


def up_command(
    spec_path: str, overrides: Sequence[str], project: str | None, zone: str | None
) -> str:
    """The `tpuctl up` line a person runs to pick this spec's job up again, every word
    shell-quoted, with the overrides and the --project/--zone flags they gave."""
    words = ["tpuctl", "up", spec_path, *(f"--set={override}" for override in overrides)]
    words += [*(["--project", project] if project else []), *(["--zone", zone] if zone else [])]
    return shlex.join(words)


def resolve_target(
    app: AppContext,
    argument: str,
    project: str | None,
    zone: str | None,
    overrides: Sequence[str] = (),
) -> Target:
    """NAME|SPEC: a .yaml/.yml or existing file is a spec; a full resource path sets P and Z."""
    if is_spec_path(argument):
        spec = load_spec_warned(app, argument, overrides)
        zones = spec.zones if zone is None and len(spec.zones) > 1 else ()
        return Target(spec.name, spec, resolve_location_for(project, zone, spec), zones)
    match = _RESOURCE_PATH.match(argument)
    if match:
        project_id, zone_id, name = match.groups()
        return Target(name, None, resolve_location_for(project, zone, None, (project_id, zone_id)))
    if "/" in argument:
        raise UsageError(
            f"{argument!r} is neither a queued resource name nor a spec file",
            hint="give a name like my-job, a spec path, or "
            "projects/P/locations/Z/queuedResources/N",
        )
    return Target(argument, None, resolve_location_for(project, zone, None))


def api_of(spec: Spec | None) -> str:
    """Where a spec's slices come from: its tpu.api; for a name without a spec, "either"
    (the Cloud TPU API, then Compute Engine)."""
    return spec.tpu.api if spec is not None else "either"


def connect_api(location: Location, impersonate: str | None, api: str = "tpu") -> TpuApi:
    """The API for a command: a call that keeps failing is said on stderr after a few seconds
    (what is being retried, for how long), not suffered in silence. `api`: the spec's
    tpu.api (Compute Engine answers behind the same face)."""
    from dataclasses import replace

    from tpuctl.cli.context import app_context
    from tpuctl.cloud.client import connect

    api_client = connect(location, impersonate=impersonate, api=api)
    if click.get_current_context(silent=True) is None:
        return api_client  # shell completion: nothing may reach the user's terminal
    warn = app_context().warn
    if hasattr(api_client.client, "on_error"):  # both APIs: a Compute Engine side unlisted
        api_client.client.on_error = warn
    return replace(api_client, on_retry=warn)


def connect_target(
    app: AppContext, target: Target, impersonate: str | None, *, missing_ok: bool = False
) -> TpuApi:
    """The API in the zone that holds the target's queued resource. For a spec with several
    zones, every zone is asked side by side (a run may have landed in any of them): the zone
    its run is claimed for wins, else the first holding it ACTIVE, else the first holding it;
    any other zone still holding it is said, with the command that deletes it there. Found
    nowhere: NotFoundError naming every zone asked (`missing_ok`: the first zone's API)."""
    from tpuctl.cloud.queries import delete_command, locate

    api = connect_api(target.location, impersonate, api_of(target.spec))
    if len(target.zones) < 2:
        return api
    located = locate(api, target.name, target.zones)
    warn_zone_errors(app, located.errors)
    zone = located.choose(_claimed_zone(target.spec) if located.holding else None)
    if zone is None:
        if missing_ok and not located.errors:
            return api
        raise located.unanswered()
    for other in located.holding:
        if other != zone:
            app.warn(
                f"{target.name} is also in {other} ({located.state_in(other)}); acting on the "
                f"one in {zone}. Delete the other with: "
                f"{delete_command(api.in_zone(other), target.name)}"
            )
    chosen = api.in_zone(zone)
    target.location = chosen.location
    return chosen


def _claimed_zone(spec: Spec | None) -> str | None:
    """The zone a first-active run is claimed for, or None (none, or it cannot be read)."""
    if spec is None or not spec.claims_zone:
        return None
    from tpuctl.storage.zone_claim import claimed_zone

    try:
        return claimed_zone(spec)
    except (TpuctlError, OSError, ValueError):
        return None  # a preference only: every zone was asked anyway


def connect_zones(
    project: str | None,
    zone: str | None,
    zones: str | None,
    all_zones: bool,
    impersonate: str | None,
) -> tuple[TpuApi, list[str]]:
    """`--zone` | `--zones a,b` | `--all-zones` → the API and the zones to ask (for
    `--all-zones`, the project's zones as the TPU API lists them)."""
    from tpuctl.cloud.resolve import EVERY_ZONE
    from tpuctl.cloud.zones import parse_zones, zones_to_ask

    if sum((zone is not None, zones is not None, all_zones)) > 1:
        raise UsageError(
            "--zone, --zones and --all-zones exclude one another", hint="pass only one of them"
        )
    chosen = parse_zones(zones) if zones is not None else None
    # With --all-zones only the project matters: the zone is the API's "every location".
    first = EVERY_ZONE if all_zones else chosen[0] if chosen else zone
    api = connect_api(resolve_location_for(project, first, None), impersonate, "either")
    return api, zones_to_ask(api, chosen, every=all_zones)


def warn_zone_errors(app: AppContext, errors: Sequence[ZoneError]) -> None:
    for error in errors:
        app.warn(f"zone {error.zone}: {error.message}")
