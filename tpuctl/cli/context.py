"""The one context object every command receives: output mode, consoles, and how to say things.

Results go to stdout (tpuctl.cli.output prints them); progress, notes and warnings to stderr,
never coloured or animated when the stream is not a terminal.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import click

from tpuctl.cli.format import Style
from tpuctl.cli.views.table import terminal_safe

if TYPE_CHECKING:
    from rich.console import Console

OutputFormat = Literal["table", "wide", "json", "yaml"]
FORMATS: tuple[OutputFormat, ...] = ("table", "wide", "json", "yaml")


@dataclass
class AppContext:
    """Settings from the root group, plus the stderr console created on first use (rich is
    imported only for progress displays)."""

    output: OutputFormat = "table"
    debug: bool = False
    quiet: bool = False
    all_rows: bool = False  # `--all-rows` on a fan-out: every worker's row
    _stderr: Console | None = field(default=None, repr=False)

    @property
    def machine_output(self) -> bool:
        return self.output in ("json", "yaml")

    @property
    def stderr(self) -> Console:
        if self._stderr is None:
            from rich.console import Console

            is_tty = sys.stderr.isatty()
            self._stderr = Console(
                file=sys.stderr,
                force_terminal=None if is_tty else False,
                no_color=not is_tty or "NO_COLOR" in os.environ,
                highlight=False,
            )
        return self._stderr

    @property
    def animated(self) -> bool:
        """Whether progress may be drawn live: stderr is a terminal and nobody asked for quiet
        or for machine output."""
        return sys.stderr.isatty() and not self.quiet and not self.machine_output

    def style(self) -> Style:
        """How tables look: sized to the terminal when stdout is one, else whole values."""
        return Style(width=terminal_width(), wide=self.output == "wide", all_rows=self.all_rows)

    def info(self, message: str) -> None:
        """A progress or status line for people, on stderr (not with --quiet)."""
        if self.quiet:
            return
        sys.stderr.write(terminal_safe(message) + "\n")
        sys.stderr.flush()

    def warn(self, message: str) -> None:
        colour = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        line = f"warning: {terminal_safe(message)}"
        sys.stderr.write((f"\x1b[33m{line}\x1b[0m" if colour else line) + "\n")
        sys.stderr.flush()


def terminal_width() -> int | None:
    """The terminal's columns when stdout is one (COLUMNS wins, as for every tool), else None:
    a pipe gets whole values, one line per row."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def app_context() -> AppContext:
    """The AppContext built by the root group (or a default one when a command runs alone)."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    if not isinstance(root.obj, AppContext):
        root.obj = AppContext()
    return root.obj
