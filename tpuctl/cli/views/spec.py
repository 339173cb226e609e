"""Views of the spec commands: validate's verdict, what render prints, the plan."""

from __future__ import annotations

import json
from collections.abc import Callable

from tpuctl.cli.format import Style
from tpuctl.cli.views.table import Column, render
from tpuctl.plan import CheckpointMode, Plan
from tpuctl.spec.results import Rendered, Validation

SIZE_COLUMNS = (Column(""), Column("PER SLICE", align="right"), Column("TOTAL", align="right"))
MODE_COLUMNS = (
    Column("MODE"),
    Column("INTERVAL", align="right"),
    Column("STEPS", align="right"),
    Column("LOST/FAILURE", align="right"),
    Column("LOST STEPS", align="right"),
    Column("WASTE", align="right"),
)


def validation_view(result: Validation, _style: Style) -> str:
    where = ", on Compute Engine" if result.api == "compute" else ""
    return (
        f"{result.source} is valid: {result.name}, {result.slices}× {result.accelerator} "
        f"({result.tier}{where})\n"
    )


def rendered_view(result: Rendered, _style: Style) -> str:
    """Exactly what a person would pipe or save: the request JSON, the script, the line."""
    if result.what == "request":
        request = result.requests if result.requests is not None else result.request
        return json.dumps(request, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    text = result.startup_script if result.what == "startup-script" else result.gcloud
    text = text or ""
    return text if result.what == "startup-script" or text.endswith("\n") else text + "\n"


def _capacity_lines(result: Plan, style: Style) -> list[str]:
    """Each rung's price an hour, and the flex-start runs the job needs."""
    from tpuctl.plan.prices import PRICES_READ, PRICES_SOURCE

    lines = ["", "Capacity (list prices per hour, every chip):"]
    for price in result.capacity:
        cost = (
            f"${price.hour:,.2f}/h (${price.chip_hour:.2f} per chip-hour)"
            if price.hour is not None and price.chip_hour is not None
            else "no price in the table (plan --prices FILE)"
        )
        lines.append(f"  {price.rung}: {cost}")
    lines.append(f"  prices from {PRICES_SOURCE} ({PRICES_READ}), unless --prices")
    runs = result.runs
    if runs is not None:
        duration = style.duration
        lines += [
            "",
            f"Flex-start runs: {runs.runs} of at most {duration(runs.max_run_seconds)} "
            f"({duration(runs.work_seconds)} of steps; each run trains "
            f"{duration(runs.useful_seconds)}: its stop {duration(runs.lead_seconds)} before "
            f"the end and a restart of {duration(runs.restart_seconds)} aside)",
        ]
    return lines


def plan_view(result: Plan, style: Style) -> str:
    """Sizes per slice and in total, then each check in plain words."""
    text = (
        f"{result.name}: {result.slices}× {result.accelerator} "
        f"({result.generation}, topology {result.topology})\n"
    )
    rows: list[list[object]] = [
        ["VMs (hosts)", result.vms_per_slice, result.vms_total],
        ["chips", result.chips_per_slice, result.chips_total],
        ["TensorCores", result.tensorcores_per_slice, result.tensorcores_total],
        ["chips per VM", result.chips_per_vm, ""],
    ]
    text += render(SIZE_COLUMNS, rows, width=style.width)
    lines: list[str] = []
    if result.parallelism is not None:
        mesh = result.parallelism
        lines += ["", "Parallelism:", f"  {mesh.ici.message}", f"  {mesh.dcn.message}"]
        lines += [f"  warning: {warning}" for warning in mesh.warnings]
    if result.dcn is not None:
        lines += ["", "DCN (data parallelism across slices):"]
        lines += [f"  {note}" for note in result.dcn.notes]
    if result.checkpoint is not None:
        check = result.checkpoint
        duration = style.duration
        lines += [
            "",
            f"Checkpoint interval (M = {duration(check.mtbf_seconds)} [{check.mtbf_basis}], "
            f"δ = {duration(check.save_seconds)}, R = {duration(check.restart_seconds)}):",
            f"  Young √(2δM):          {duration(check.young_interval_seconds)}",
            f"  Daly:                  {duration(check.daly_interval_seconds)}",
            f"  waste at Daly's τ:     {check.waste_fraction:.1%}",
            f"  lost work per failure: {duration(check.lost_work_per_failure_seconds)}",
        ]
        if check.modes:
            lines += ["", "Periodic against continuous checkpointing:"]
            rows = [_mode_row(mode, check.selected, duration) for mode in check.modes]
            width = None if style.width is None else max(20, style.width - 2)
            table = render(MODE_COLUMNS, rows, width=width)
            lines += [f"  {line}" for line in table.splitlines()]
        lines += [f"  {note}" for note in check.notes]
    lines += _capacity_lines(result, style)
    if result.bucket is not None:
        bucket = result.bucket
        where = bucket.location or "unknown"
        lines += ["", f"Checkpoint bucket {bucket.bucket}: {where}, slices in {bucket.region}"]
    if result.notes:
        lines += ["", *(f"note: {note}" for note in result.notes)]
    lines += [f"warning: {warning}" for warning in result.warnings]
    return text + "".join(line + "\n" for line in lines)


def _mode_row(
    mode: CheckpointMode, selected: str, duration: Callable[[float], str]
) -> list[object]:
    steps = "" if mode.interval_steps is None else f"{mode.interval_steps} steps"
    lost = mode.lost_steps_per_failure
    lost_steps = "" if lost is None else f"{lost:.1f}"
    return [
        mode.mode + (" (the spec's)" if mode.mode == selected else ""),
        duration(mode.interval_seconds),
        steps,
        duration(mode.lost_work_per_failure_seconds),
        lost_steps,
        f"{mode.waste_fraction:.1%}",
    ]
