"""Resume commands: `tpuctl checkpoints` (what a restart would resume from)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from tpuctl.cli.options import app_context, output_option, set_option

if TYPE_CHECKING:
    from datetime import datetime

    from rich.console import Console

    from tpuctl.cli.context import AppContext
    from tpuctl.resume.checkpoints import CheckpointReport


def _is_spec_argument(argument: str) -> bool:
    """A job spec is a file; a checkpoint location is a directory or a gs:// URL."""
    if argument.startswith("gs://"):
        return False
    if os.path.isfile(argument):
        return True
    return argument.endswith((".yaml", ".yml")) and not os.path.isdir(argument)


def _spec_checkpoint_root(app: AppContext, spec_path: str, overrides: tuple[str, ...]) -> str:
    from tpuctl.errors import SourceLocation, SpecError
    from tpuctl.resume.checkpoints import checkpoint_root
    from tpuctl.spec.load import load_spec

    loaded = load_spec(spec_path, overrides=overrides)
    for warning in loaded.warnings:
        app.warn(str(warning))
    root = checkpoint_root(loaded.spec)
    if root is None:
        raise SpecError(
            "the spec names no checkpoint directory",
            location=SourceLocation(loaded.spec.source),
            path="checkpoint.dir",
            hint="set checkpoint.dir (gs://BUCKET/PATH), or pass the directory itself",
        )
    if not root.startswith(("gs://", "/")):
        app.warn(f"{root} is a path on each worker; reading it on this machine instead")
    return root


@click.command()
@click.argument("location", metavar="DIR|SPEC")
@set_option
@output_option
def checkpoints(location: str, overrides: tuple[str, ...]) -> None:
    """Show the Orbax checkpoints in DIR (a path or gs:// URL) or in a spec's checkpoint dir.

    Lists every step folder (complete or not, when it was committed, how long the save took),
    then the latest complete step a restart resumes from, unfinished saves and stale tmp
    folders. Exit 5 when the directory does not exist, 2 for a spec without checkpoint.dir.
    """
    from tpuctl.errors import UsageError
    from tpuctl.resume.checkpoints import inspect_checkpoints

    app = app_context()
    if _is_spec_argument(location):
        url = _spec_checkpoint_root(app, location, overrides)
    elif overrides:
        raise UsageError(
            "--set applies to a spec, not to a directory", hint=f"{location} is no spec"
        )
    else:
        url = location
    report = inspect_checkpoints(url)
    app.emit(report.to_dict(), _draw_checkpoints(report))


def _draw_checkpoints(report: CheckpointReport) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.measure import Measurement
        from rich.table import Table

        console.print(f"{report.url} ({report.storage})", markup=False)
        table = Table(box=None, pad_edge=False)
        for column in ("STEP", "NAME", "COMPLETE", "COMMITTED AT", "SAVE", "NOTES"):
            table.add_column(column, justify="right" if column in ("STEP", "SAVE") else "left")
        rows: list[tuple[int, str, str, str, str, str]] = [
            (
                folder.step,
                folder.name,
                "yes" if folder.complete else "no",
                _time(folder.committed_at),
                _seconds(folder.save_seconds),
                "; ".join(folder.notes),
            )
            for folder in report.steps
        ]
        rows += [
            (
                folder.step,
                folder.name,
                "no",
                "-",
                "-",
                "stale tmp folder" if folder.stale else "tmp folder: save in progress?",
            )
            for folder in report.tmp_folders
        ]
        for row in sorted(rows, key=lambda row: (row[0], row[1])):
            table.add_row(str(row[0]), *row[1:])
        if rows:
            # Folder names are what people copy: a narrow terminal wraps the lines rather than
            # have rich cut the names short.
            needed = Measurement.get(console, console.options.update_width(1000), table).maximum
            width = console.width  # print(width=) cannot go wider than the console
            console.width = max(width, needed)
            try:
                console.print(table)
            finally:
                console.width = width
        else:
            console.print("no step folders", markup=False)
        latest = "none" if report.latest_step is None else str(report.latest_step)
        console.print(f"latest complete step: {latest}", markup=False)
        console.print(f"unfinished saves: {_steps(report.unfinished_steps)}", markup=False)
        stale = [folder.name for folder in report.stale_tmp_folders]
        console.print(f"stale tmp folders: {', '.join(stale) or 'none'}", markup=False)

    return draw


def _time(moment: datetime | None) -> str:
    from tpuctl.cli.context import rfc3339

    return "-" if moment is None else rfc3339(moment)


def _seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"


def _steps(steps: tuple[int, ...]) -> str:
    return ", ".join(str(step) for step in steps) or "none"
