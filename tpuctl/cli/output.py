"""Printing a command's result, the one way every command does it: the versioned envelope for
json/yaml (tpuctl.envelope), the result's view for people; then the exit code the result
carries (a fan-out where some worker failed exits 3 after its table)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import click

from tpuctl.cli.context import app_context
from tpuctl.cli.format import Style
from tpuctl.cli.views.table import fit_lines, terminal_safe
from tpuctl.envelope import Result, envelope, error_envelope, jsonable, to_json
from tpuctl.errors import ExitCode, TpuctlError

R = TypeVar("R", bound=Result)
View = Callable[[R, Style], str]


def emit(
    result: R,
    view: View[R] | None = None,
    *,
    people_on_stderr: bool = False,
    exact: bool = False,
) -> None:
    """Print `result` (table, wide, json or yaml) and end the command with its exit code.
    `people_on_stderr`: the view goes to stderr (stdout carries the workers' own output).
    The view's text is made safe for a terminal (control characters escaped) and its prose
    wrapped to the terminal's width, unless `exact` (a script or command line to copy)."""
    app = app_context()
    if app.output == "json":
        write(to_json(envelope(result)) + "\n")
    elif app.output == "yaml":
        write(to_yaml(envelope(result)))
    elif view is not None:
        style = app.style()
        text = view(result, style)
        if not exact:
            text = terminal_safe(text)
            if style.width is not None and not style.wide:  # wide: every line whole
                text = fit_lines(text, style.width)
        if people_on_stderr:
            sys.stderr.write(text)
            sys.stderr.flush()
        else:
            write(text)
    code = result.exit_code
    if code != ExitCode.OK:
        error = result.exit_error()
        if error is not None:
            sys.stderr.write(f"error: {terminal_safe(error.one_line())}\n")
            sys.stderr.flush()
        # The result is already on stdout (one document with --format json): exit with the
        # code, without a second, error-shaped document.
        click.get_current_context().exit(int(code))


def emit_error(error: TpuctlError, *, machine: str | None) -> None:
    """An error at the boundary: its envelope on stdout for json/yaml, one line on stderr."""
    if machine == "json":
        write(to_json(error_envelope(error)) + "\n")
    elif machine == "yaml":
        write(to_yaml(error_envelope(error)))
    sys.stderr.write(f"error: {terminal_safe(error.one_line())}\n")
    sys.stderr.flush()


def to_yaml(document: object) -> str:
    import yaml

    return str(yaml.safe_dump(jsonable(document), sort_keys=False, allow_unicode=True))


def write(text: str) -> None:
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        # Paths and arguments that were not UTF-8 come as surrogate escapes: their bytes are
        # shown as \xNN.
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "replace")
        sys.stdout.write(raw.decode("utf-8", "backslashreplace"))
    sys.stdout.flush()
