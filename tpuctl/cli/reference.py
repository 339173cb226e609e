"""The generated docs pages: the CLI reference from the click tree (docs/cli.md) and the spec
reference from the field table (docs/spec.md), each between markers in its page."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import click

START_MARKER = "<!-- cli-reference:start -->"
END_MARKER = "<!-- cli-reference:end -->"


def markers(section: str) -> tuple[str, str]:
    return f"<!-- {section}:start -->", f"<!-- {section}:end -->"


def walk_commands(
    command: click.Command | None = None, ctx: click.Context | None = None
) -> Iterator[tuple[click.Command, click.Context]]:
    """Every command of the tree, depth first, importing each lazily registered one."""
    if command is None:
        from tpuctl.cli.main import cli

        command = cli
        # The root's context_settings (-h as well as --help) are inherited by every child.
        ctx = click.Context(cli, info_name="tpuctl", **cli.context_settings)
    assert ctx is not None
    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None:
                raise LookupError(f"command {ctx.command_path} {name} is listed but not found")
            yield from walk_commands(sub, click.Context(sub, info_name=name, parent=ctx))


def help_text(command: click.Command) -> str:
    """The command's help as written, without click's `\\b` and `\\f` markers."""
    text = inspect.cleandoc(command.help or "").split("\f", 1)[0]
    lines = [line for line in text.splitlines() if line.strip() != "\b"]
    return "\n".join(lines).strip()


def _command_markdown(command: click.Command, ctx: click.Context) -> str:
    pieces = " ".join(command.collect_usage_pieces(ctx))
    depth = ctx.command_path.count(" ")
    parts = [
        f"{'#' * min(3 + depth, 5)} `{ctx.command_path}`",
        "",
        help_text(command) or "(no help)",
        "",
        "```text",
        f"Usage: {ctx.command_path} {pieces}".rstrip(),
        "```",
    ]
    options = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):
            continue  # arguments are in the usage line; click gives them no help text
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, description = record
        options.append(f"- `{names}`: {description}" if description else f"- `{names}`")
    if options:
        parts += ["", *options]
    if isinstance(command, click.Group):
        listed = ", ".join(f"`{name}`" for name in command.list_commands(ctx))
        parts += ["", f"Commands: {listed}"]
    return "\n".join(parts)


def cli_reference_markdown() -> str:
    """The whole CLI reference: the root, then every command and subcommand."""
    sections = [_command_markdown(command, ctx) for command, ctx in walk_commands()]
    return "\n\n".join(sections) + "\n"


def spec_reference_markdown() -> str:
    from tpuctl.spec.schema import reference_markdown

    text = reference_markdown()
    return text if text.endswith("\n") else text + "\n"


@dataclass(frozen=True)
class GeneratedPage:
    """A docs page whose section between `<!-- SECTION:start -->` and `<!-- SECTION:end -->` is
    generated; the rest of the page is written by hand."""

    path: str  # from the repository root
    section: str
    title: str
    generate: Callable[[], str]

    def fresh(self, document: str) -> str:
        """The page with its section regenerated; a page (or a section) that is missing is
        created, so regenerating is always the fix."""
        generated = self.generate()
        replaced = replace_section(document, generated, self.section)
        if replaced is not None:
            return replaced
        start, end = markers(self.section)
        section = f"{start}\n{generated}{end}\n"
        if not document.strip():
            return f"# {self.title}\n\n{section}"
        separator = "\n" if document.endswith("\n") else "\n\n"
        return f"{document}{separator}{section}"


# The command that rewrites every generated page (and with --check, says which are stale).
REGENERATE = "scripts/update-docs"

PAGES = (
    GeneratedPage("docs/cli.md", "cli-reference", "CLI reference", cli_reference_markdown),
    GeneratedPage("docs/spec.md", "spec-reference", "Spec reference", spec_reference_markdown),
)


def replace_section(document: str, generated: str, section: str = "cli-reference") -> str | None:
    """The document with the text between the markers replaced; None when a marker is missing."""
    start_marker, end_marker = markers(section)
    start = document.find(start_marker)
    end = document.find(end_marker)
    if start < 0 or end < start:
        return None
    head = document[: start + len(start_marker)]
    return f"{head}\n{generated}{document[end:]}"


def current_section(document: str, section: str = "cli-reference") -> str | None:
    """The text between the markers (without them), or None when a marker is missing."""
    start_marker, end_marker = markers(section)
    start = document.find(start_marker)
    end = document.find(end_marker)
    if start < 0 or end < start:
        return None
    return document[start + len(start_marker) : end].removeprefix("\n")
