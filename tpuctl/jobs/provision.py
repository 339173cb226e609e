"""Spec → the create request tpuctl sends (rendered, with a fresh idempotency key), and the
create-and-wait every command that brings a queued resource up shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tpuctl.clock import utc_now
from tpuctl.cloud import lifecycle
from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.resolve import Location
from tpuctl.cloud.results import CreateResult
from tpuctl.errors import TpuctlError
from tpuctl.render.request import render_request
from tpuctl.spec.model import Spec


def create_request(spec: Spec, location: Location, request_id: str | None = None) -> Any:
    """The CreateQueuedResourceRequest for `spec` in `location`, with one request_id that every
    retry of this create reuses (a new one per create)."""
    return render_request(
        spec,
        project=location.project,
        zone=location.zone,
        request_id=request_id or lifecycle.new_request_id(),
        now=utc_now(),
    )


def create_from_spec(api: TpuApi, spec: Spec) -> CreateResult:
    """Create the spec's queued resource (or accept the one made from the same spec)."""
    return lifecycle.create(api, create_request(spec, api.location))


def placement_warnings(spec: Spec, zone: str) -> list[str]:
    """What is wrong with where the job's checkpoints live, said before capacity is bought:
    a checkpoint bucket outside the slices' region (or one whose location cannot be read)."""
    from tpuctl.storage.placement import bucket_placement
    from tpuctl.worker import checkpoint_root

    root = checkpoint_root(spec)
    placement = bucket_placement(root, zone) if root else None
    return [placement.warning] if placement is not None and placement.warning else []


def create_in_zones(
    api: TpuApi,
    spec: Spec,
    zones: Sequence[str],
    options: lifecycle.WaitOptions,
    *,
    say: Callable[[str], None],
    on_event: lifecycle.EventCallback | None = None,
    wait: bool = True,
) -> CreateResult:
    """`create --wait` across several zones, as `up` brings a run up (tpuctl.jobs.zone_choice):
    one after another at each queueing deadline, or first-active. Ctrl-C leaves what is
    queued and names the command that deletes each (or deletes them with
    --delete-on-interrupt). Without `wait`, the first zone only (claimed for a first-active
    spec, so its job starts there)."""
    from tpuctl.clock import Clock
    from tpuctl.jobs.adapters import ApiQueuedResource, StorageJobRecord
    from tpuctl.jobs.zone_choice import ZoneChoice

    current: Any = ApiQueuedResource(api, spec)

    def moved(ops: Any) -> None:
        nonlocal current
        current = ops

    choice = ZoneChoice(
        spec,
        current,
        zones,
        StorageJobRecord(spec),
        wait_policy=options.policy,
        keep_on_timeout=options.keep_on_timeout,
        clock=Clock(),
        emit=lambda _kind, message, **_facts: say(message),
        on_watch=on_event,
        on_zone=moved,
    )
    if not wait:
        ops = choice.create_only()
        return CreateResult(
            "created" if choice.created else "exists", spec.name, choice.request_id, zone=ops.zone
        )
    try:
        ops = choice.bring_up(choice.find())
    except KeyboardInterrupt:
        left = {ops.zone: ops for ops in [current, *choice.racers]}
        raise _interrupted(spec.name, list(left.values()), options.delete_on_interrupt) from None
    result = CreateResult("created" if choice.created else "exists", spec.name, choice.request_id)
    waited = choice.waited
    if waited is not None:
        result.wait = waited
        result.queued_resource = waited.queued_resource
    result.zone = ops.zone
    return result


def _interrupted(name: str, left: Sequence[Any], delete_them: bool) -> TpuctlError:
    """Ctrl-C during a bring-up across zones: what may be queued where, deleted when asked."""
    from tpuctl.errors import ApiUnavailableError, Interrupted, NotFoundError

    zones = [ops.zone for ops in left]
    undeleted = []
    if delete_them:
        for ops in left:
            try:
                ops.api.delete_queued_resource(name, force=True)
            except NotFoundError:
                pass
            except ApiUnavailableError:
                undeleted.append(ops)
        if not undeleted:
            return Interrupted(
                f"interrupted while waiting for {name} in {', '.join(zones)}; deletion "
                "requested (--delete-on-interrupt)",
                name=name,
                zones=zones,
                deleted=True,
            )
    commands = "  and  ".join(ops.delete_command() for ops in undeleted or left)
    return Interrupted(
        f"interrupted while waiting for {name}; it may be queued in "
        f"{', '.join(ops.zone for ops in undeleted or left)}",
        hint=f"delete it with: {commands}",
        name=name,
        zones=zones,
        deleted=False,
    )
