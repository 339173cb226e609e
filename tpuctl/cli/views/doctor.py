"""The view of `tpuctl doctor`: one row per check, its mark, the zone when the run may queue in
several, what was found; a check's fix on the line under it, whole."""

from __future__ import annotations

from tpuctl.cli.format import Style
from tpuctl.cli.views.table import Column, display_width, render
from tpuctl.jobs.doctor import Check, Doctor

MARK = Column("", identity=True)
CHECK = Column("CHECK", identity=True)
ZONE = Column("ZONE", identity=True)  # with several zones, the checks of each are told apart
# The last column: in a pipe no line is padded to the longest message.
RESULT = Column("RESULT", shrink=True)


def mark(check: Check) -> str:
    """✓ passed, ✗ blocks the run, ! a warning, - a note (skipped, or what will be used)."""
    if check.blocks:
        return "✗"
    if not check.ok:
        return "!"
    return "-" if check.severity == "info" else "✓"


def doctor_view(result: Doctor, style: Style) -> str:
    zoned = len({check.zone for check in result.checks if check.zone}) > 1
    columns = (MARK, CHECK, ZONE, RESULT) if zoned else (MARK, CHECK, RESULT)
    rows = [
        [mark(c), c.name, *([c.zone or "-"] if zoned else []), c.message] for c in result.checks
    ]
    header, *lines = render(columns, rows, width=style.width, wide=style.wide).splitlines()
    # The fix goes under its row, where RESULT starts: a line of prose that wraps on a
    # terminal, never shortened (a command to copy).
    indent = " " * display_width(header[: header.index("RESULT")] if "RESULT" in header else "")
    text = [header]
    for check, line in zip(result.checks, lines, strict=True):
        text.append(line)
        if check.fix:
            text.append(f"{indent}fix: {check.fix}")
    zones = sorted({check.zone for check in result.checks if check.zone})
    place = f"{result.project} ({len(zones)} zones)" if zoned else f"{result.project}/{result.zone}"
    where = f"{result.name} in {place}"
    if result.emulator:
        where += " (emulator)"
    if result.ok:
        verdict = f"ready: nothing blocks {where}"
    else:
        verdict = f"not ready: {result.blocking} check(s) block {where}"
    if result.warnings:
        verdict += f"; {result.warnings} warning(s)"
    return "\n".join(text) + f"\n{verdict} ({result.elapsed_seconds:.1f} s)\n"
