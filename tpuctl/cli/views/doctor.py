"""The view of `tpuctl doctor`: one row per check, its mark, what was found and the fix."""

from __future__ import annotations

from tpuctl.cli.format import MISSING, Style
from tpuctl.cli.views.table import Column, render
from tpuctl.jobs.doctor import Check, Doctor

DOCTOR_COLUMNS = (
    Column("", identity=True),
    Column("CHECK", identity=True),
    Column("RESULT"),
    Column("FIX"),
)


def mark(check: Check) -> str:
    """✓ passed, ✗ blocks the run, ! a warning, - a note (skipped, or what will be used)."""
    if check.blocks:
        return "✗"
    if not check.ok:
        return "!"
    return "-" if check.severity == "info" else "✓"


def doctor_view(result: Doctor, style: Style) -> str:
    rows = [[mark(c), c.name, c.message, c.fix or MISSING] for c in result.checks]
    table = render(DOCTOR_COLUMNS, rows, width=style.width, wide=style.wide)
    where = f"{result.name} in {result.project}/{result.zone}"
    if result.emulator:
        where += " (emulator)"
    if result.ok:
        verdict = f"ready: nothing blocks {where}"
    else:
        verdict = f"not ready: {result.blocking} check(s) block {where}"
    if result.warnings:
        verdict += f"; {result.warnings} warning(s)"
    return f"{table}{verdict} ({result.elapsed_seconds:.1f} s)\n"
