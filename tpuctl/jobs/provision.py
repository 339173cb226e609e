"""Spec → the create request tpuctl sends (rendered, with a fresh idempotency key), and what is
said about a spec's placement before capacity is bought. Bringing it up across several zones
is tpuctl.jobs.zone_choice's."""

from __future__ import annotations

from typing import Any

from tpuctl.clock import utc_now
from tpuctl.cloud import lifecycle
from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.compute_ops import ComputeCreate
from tpuctl.cloud.resolve import Location
from tpuctl.cloud.results import CreateResult
from tpuctl.render.request import render_request
from tpuctl.spec.model import Spec


def create_request(spec: Spec, location: Location, request_id: str | None = None) -> Any:
    """The CreateQueuedResourceRequest for `spec` in `location`, with one request_id that every
    retry of this create reuses (a new one per create); for a `tpu.api: compute` spec, the
    Compute Engine requests in their order (tpuctl.cloud.compute_ops.ComputeCreate)."""
    if spec.tpu.api == "compute":
        return compute_create(spec, location, request_id or lifecycle.new_request_id())
    return render_request(
        spec,
        project=location.project,
        zone=location.zone,
        request_id=request_id or lifecycle.new_request_id(),
        now=utc_now(),
    )


def compute_create(spec: Spec, location: Location, request_id: str) -> ComputeCreate:
    """The create of a Compute Engine slice named like the spec's queued resource would be."""
    from tpuctl.render.compute import render_compute

    plan = render_compute(
        spec,
        project=location.project,
        zone=location.zone,
        run_name=spec.name,
        startup_script=None,
    )
    return ComputeCreate(
        parent=location.parent,
        queued_resource_id=spec.name,
        request_id=request_id,
        requests=tuple(plan.requests),
        hosts=plan.hosts,
        machine_type=plan.machine_type,
        single_host=plan.single_host,
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
