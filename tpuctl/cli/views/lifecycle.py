"""Views of the lifecycle results: status (and its jobs), list, create, wait, reset, delete."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.fanout import JOB_STATUS_COLUMNS, job_cells, job_note
from tpuctl.cli.views.table import Column, render
from tpuctl.cloud.describe import QueuedResourceList, QueuedResourceStatus, WorkerAddress
from tpuctl.cloud.results import CreateResult, DeleteResult, ResetResult, WaitResult
from tpuctl.envelope import to_json

NODE_COLUMNS = (
    Column("SLICE", identity=True, align="right"),
    Column("NODE", identity=True),
    Column("STATE"),
    Column("HEALTH"),
    Column("WORKER", identity=True, align="right"),
    Column("INTERNAL IP", drop=1),
    Column("EXTERNAL IP", drop=2),
)
JOB_COLUMNS = (
    Column("SLICE/WORKER", identity=True),
    *JOB_STATUS_COLUMNS,
    Column("LAST OUTPUT / REASON", shrink=True),
    Column("NODE", wide=True),
)
LIST_COLUMNS = (
    Column("NAME", identity=True),
    Column("STATE"),
    Column("ACCELERATOR"),
    Column("SLICES", align="right", drop=2),
    Column("TIER", drop=3),
    Column("CREATED", drop=1),
    Column("JOB", drop=4),  # most often the queued resource's own name
    Column("ZONE", wide=True),
)
API_COLUMN = Column("API", drop=5)  # tpu | compute: shown once a row is Compute Engine's


def status_view(status: QueuedResourceStatus, style: Style) -> str:
    since = f" for {style.duration(status.in_state_seconds)}" if status.state_since else ""
    head = f"{status.name}: {status.state}{since}"
    if status.state_initiator:
        head += f" (initiated by {status.state_initiator})"
    lines = [
        head,
        f"  {status.accelerator} × {status.slices} slice(s), {status.tier}, runtime "
        f"{status.runtime}, created {style.time(status.create_time)}",
    ]
    if status.api == "compute":
        lines[-1] = (
            f"  {status.accelerator}, {status.tier}, on Compute Engine, "
            f"created {style.time(status.create_time)}"
        )
    if status.failure:
        lines.append(f"  failed: {status.failure.get('message')}")
    text = "\n".join(lines) + "\n"
    rows = []
    for index, node in enumerate(status.nodes):
        workers: list[WorkerAddress | None] = list(node.workers) or [None]
        for worker in workers:
            rows.append(
                [
                    index,
                    node.name,
                    value(node.state),
                    value(node.health),
                    MISSING if worker is None else worker.worker,
                    value(worker.internal_ip if worker else None),
                    value(worker.external_ip if worker else None),
                ]
            )
    if rows:
        text += render(NODE_COLUMNS, rows, width=style.width, wide=style.wide)
    if status.jobs:
        text += "\n" + jobs_table(status.jobs, style)
    return text


def jobs_table(jobs: list[Any], style: Style) -> str:
    """Every worker's startup-script job (tpuctl.jobs.control.WorkerJobStatus)."""
    rows = [[job.label, *job_cells(job, style), job_note(job), job.node] for job in jobs]
    return render(JOB_COLUMNS, rows, width=style.width, wide=style.wide)


def where(project: str, zones: list[str]) -> str:
    """`p/us-central2-b`, or `p (3 zones)` when several were asked."""
    return f"{project}/{zones[0]}" if len(zones) == 1 else f"{project} ({len(zones)} zones)"


def zone_column(columns: tuple[Column, ...], zones: list[str]) -> tuple[Column, ...]:
    """The columns with ZONE shown (not wide-only) when rows come from several zones."""
    if len(zones) < 2:
        return columns
    return tuple(replace(c, wide=False) if c.header == "ZONE" else c for c in columns)


def list_view(result: QueuedResourceList, style: Style) -> str:
    zones = result.zones or [result.zone or "?"]
    if not result.queued_resources:
        scope = "queued resources" if result.all else "tpuctl queued resources"
        return f"no {scope} in {where(result.project, zones)}\n"
    rows = [
        [
            entry.name,
            entry.state,
            entry.accelerator,
            entry.slices,
            entry.tier,
            style.time(entry.create_time),
            value(entry.job),
            value(entry.zone),
        ]
        for entry in result.queued_resources
    ]
    columns = zone_column(LIST_COLUMNS, zones)
    if any(entry.api != "tpu" for entry in result.queued_resources):
        # Some slices are Compute Engine's: say which API each row is, beside its tier.
        columns = (*columns, API_COLUMN)
        for row, entry in zip(rows, result.queued_resources, strict=True):
            row.append(entry.api)
    return render(columns, rows, width=style.width, wide=style.wide)


def create_view(result: CreateResult, style: Style) -> str:
    if result.action == "dry_run":
        return to_json(result.request) + "\n"
    assert result.queued_resource is not None
    return status_view(result.queued_resource, style)


def wait_view(result: WaitResult, style: Style) -> str:
    if result.queued_resource is None:
        return f"{result.name}: gone\n"
    return status_view(result.queued_resource, style)


def reset_view(result: ResetResult, _style: Style) -> str:
    return f"{result.name}: {result.action.replace('_', ' ')}\n"


def delete_view(result: DeleteResult, _style: Style) -> str:
    messages = {
        "deleted": f"deleted {result.name}",
        "delete_requested": f"delete of {result.name} requested",
        "missing": f"{result.name} does not exist; nothing to delete",
    }
    return messages[result.action] + "\n"
