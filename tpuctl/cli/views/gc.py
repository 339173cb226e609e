"""The view of `tpuctl gc`: one row per queued resource with its verdict and why; the total."""

from __future__ import annotations

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.lifecycle import where, zone_column
from tpuctl.cli.views.table import Column, render
from tpuctl.jobs.gc import Collectable, GarbageCollection

GC_COLUMNS = (
    Column("NAME", identity=True),
    Column("ZONE", wide=True),
    Column("STATE"),
    Column("AGE", align="right", drop=1),
    Column("JOB"),
    Column("VERDICT"),
    Column("RESULT"),
    Column("WHY", shrink=True),
    Column("CREATED", wide=True),
)


def _result(row: Collectable, dry_run: bool) -> str:
    if row.verdict == "keep":
        return MISSING
    if row.error is not None:
        return "failed"
    if row.deleted:
        return "deleted"
    return "dry run" if dry_run else "not deleted"


def gc_view(result: GarbageCollection, style: Style) -> str:
    if not result.queued_resources:
        return f"no tpuctl queued resources in {where(result.project, result.zones)}\n"
    rows = [
        [
            row.name,
            row.zone,
            row.state,
            style.duration(row.age_seconds),
            value(row.job_state),
            row.verdict,
            _result(row, result.dry_run),
            row.reason if row.error is None else f"{row.reason}; delete failed: {row.error}",
            style.time(row.create_time),
        ]
        for row in result.queued_resources
    ]
    columns = zone_column(GC_COLUMNS, result.zones)
    return render(columns, rows, width=style.width, wide=style.wide)


def gc_total(result: GarbageCollection) -> str:
    """One line for stderr: what was (or would be) deleted and kept."""
    counts = result.summary
    assert counts is not None
    if result.dry_run:
        return f"dry run: would delete {counts.delete}, keep {counts.keep}"
    total = f"deleted {counts.deleted} of {counts.delete}, kept {counts.keep}"
    return total + (f", {counts.failed} failed" if counts.failed else "")
