"""Reading a queued resource through the API: its status object, the zone's list, one poll of
its state; and the exact commands tpuctl tells people to run about it."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpuctl.cloud import describe
from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.describe import QueuedResourceList, QueuedResourceStatus
from tpuctl.cloud.watcher import GONE, Observation
from tpuctl.cloud.zones import ZoneAnswers, ZoneError, each_zone, zones_exit_code
from tpuctl.errors import NotFoundError, TpuctlError

# States in which a queued resource has no nodes to look up.
_NODELESS_STATES = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "SUSPENDED"})


def delete_command(api: TpuApi, name: str, *, force: bool = True) -> str:
    """The exact command that deletes `name`, every word shell-quoted."""
    flags = " --force" if force else ""
    return f"tpuctl delete {shlex.quote(name)} {api.location.cli_flags()}{flags} --yes"


def status_command(api: TpuApi, name: str) -> str:
    return f"tpuctl status {shlex.quote(name)} {api.location.cli_flags()}"


def status(api: TpuApi, name: str, *, now: datetime | None = None) -> QueuedResourceStatus:
    """The status object for one queued resource (NotFoundError when it does not exist)."""
    queued_resource = api.get_queued_resource(name)
    nodes: dict[str, Any | None] = {}
    if describe.state_name(queued_resource) not in _NODELESS_STATES:
        wanted = set(describe.template_of(queued_resource).node_ids)
        for node in api.list_nodes():
            node_id = describe.short_name(node.name)
            if node_id in wanted:
                nodes[node_id] = node
    return describe.queued_resource_summary(
        queued_resource,
        project=api.location.project,
        zone=api.location.zone,
        nodes=nodes,
        now=now or datetime.now(timezone.utc),
    )


def queued_resources_in_zones(
    api: TpuApi, zones: Sequence[str], *, include_all: bool = False
) -> ZoneAnswers[list[Any]]:
    """tpuctl's queued resources (every one with include_all) of each zone, asked side by side."""

    def listed(zone_api: TpuApi) -> list[Any]:
        return [
            qr for qr in zone_api.list_queued_resources() if include_all or describe.is_managed(qr)
        ]

    return each_zone(api, zones, listed)


def list_queued_resources(
    api: TpuApi, *, include_all: bool = False, zones: Sequence[str] | None = None
) -> QueuedResourceList:
    """tpuctl's queued resources in the API's zone, or in `zones` (all of them with
    include_all); a zone that fails, when there are several, is in `zone_errors`."""
    asked = list(zones) if zones else [api.location.zone]
    found = queued_resources_in_zones(api, asked, include_all=include_all)
    entries = [
        describe.list_entry(qr, zone) for zone, listed in found.answers.items() for qr in listed
    ]
    entries.sort(key=lambda entry: (entry.name, entry.zone or ""))
    return QueuedResourceList(
        project=api.location.project,
        zone=asked[0] if len(asked) == 1 else None,
        all=include_all,
        queued_resources=entries,
        zones=asked,
        zone_errors=found.errors,
    )


def observe(api: TpuApi, name: str) -> Observation:
    """One poll: the queued resource's state, or DELETED when Get says NOT_FOUND."""
    queued_resource = api.find_queued_resource(name)
    if queued_resource is None:
        return Observation(state=GONE)
    failure = describe.failure_of(queued_resource)
    return Observation(
        state=describe.state_name(queued_resource),
        initiator=describe.enum_name(queued_resource.state.state_initiator),
        failure=failure.get("message") if failure else None,
    )


# --- one queued resource among several zones ---------------------------------------------------


@dataclass
class Located:
    """Where a queued resource of one name is among `asked` zones: the zones holding it (each
    with its queued resource, in the order asked) and the zones that could not be asked."""

    name: str
    asked: list[str]
    holding: dict[str, Any] = field(default_factory=dict)
    errors: list[ZoneError] = field(default_factory=list)

    def state_in(self, zone: str) -> str:
        return describe.state_name(self.holding[zone])

    def choose(self, prefer: str | None = None) -> str | None:
        """The zone a command acts in: `prefer` (the run's claimed zone) when it holds it,
        else the first holding it ACTIVE, else the first holding it; None when none does."""
        if prefer in self.holding:
            return prefer
        active = [zone for zone in self.holding if self.state_in(zone) == "ACTIVE"]
        return next(iter(active or self.holding), None)

    def unanswered(self) -> TpuctlError:
        """The error of a queued resource found nowhere: not found when every zone answered,
        else the error of the zones that could not be asked (it may be there)."""
        zones = ", ".join(self.asked)
        if not self.errors:
            return NotFoundError(
                f"queued resource {self.name} not found in any of its zones ({zones})",
                hint=f"list what is there: tpuctl list --zones {','.join(self.asked)}",
                name=self.name,
                zones=self.asked,
            )
        failed = "; ".join(f"{error.zone}: {error.message}" for error in self.errors)
        error = TpuctlError(
            f"cannot tell where {self.name} is: {len(self.errors)} of {len(self.asked)} zones "
            f"could not be asked ({failed}), and no other zone holds it",
            hint="try again, or name the zone with --zone",
            name=self.name,
            zones=self.asked,
        )
        error.exit_code = zones_exit_code(self.errors)
        return error


def locate(api: TpuApi, name: str, zones: Sequence[str]) -> Located:
    """Ask every zone of `zones` side by side whether it holds queued resource `name`."""
    found = each_zone(api, zones, lambda zone_api: zone_api.find_queued_resource(name))
    located = Located(name, list(zones), errors=list(found.errors))
    for zone in zones:
        if found.answers.get(zone) is not None:
            located.holding[zone] = found.answers[zone]
    return located
