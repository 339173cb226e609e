"""Docs are tested: every command has help, and the generated pages (docs/cli.md, docs/spec.md)
are what the generator writes today."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from tpuctl.cli.main import COMMANDS, cli
from tpuctl.cli.reference import (
    END_MARKER,
    PAGES,
    REGENERATE,
    START_MARKER,
    GeneratedPage,
    cli_reference_markdown,
    current_section,
    help_text,
    markers,
    replace_section,
    walk_commands,
)

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GENERATOR = REPO / REGENERATE


def all_command_paths() -> list[str]:
    return [ctx.command_path for _, ctx in walk_commands()]


def help_paths() -> list[str]:
    """Paths to parametrize over; if a command cannot even be imported, its own case fails."""
    try:
        return all_command_paths()
    except Exception:
        return ["tpuctl", *(f"tpuctl {name}" for name in sorted(COMMANDS))]


def test_every_registered_command_is_walked() -> None:
    paths = all_command_paths()
    for name in COMMANDS:
        assert f"tpuctl {name}" in paths
    assert "tpuctl spec schema" in paths


def test_every_command_has_help() -> None:
    missing = [ctx.command_path for command, ctx in walk_commands() if not help_text(command)]
    assert missing == []


def test_registry_entries_resolve_and_have_a_summary() -> None:
    # `tpuctl --help` shows the registry's line without importing; it must say the same thing.
    root = click.Context(cli, info_name="tpuctl")
    for name, (_, _, short) in COMMANDS.items():
        command = cli.get_command(root, name)
        assert command is not None
        assert short.strip(), name


@pytest.mark.parametrize("path", help_paths())
def test_help_of_every_command(cli: Callable[..., Any], path: str) -> None:
    args = path.split()[1:]
    outcome = cli([*args, "--help"])
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.startswith(f"Usage: {path}")
    assert outcome.stderr == ""


def test_reference_is_deterministic_and_complete() -> None:
    reference = cli_reference_markdown()
    assert reference == cli_reference_markdown()
    for path in all_command_paths():
        assert f"`{path}`" in reference
    assert "Usage: tpuctl render [OPTIONS] SPEC" in reference
    assert "`--what [request|startup-script|gcloud]`" in reference


def test_replace_section_round_trip() -> None:
    document = f"# T\n\n{START_MARKER}\nold\n{END_MARKER}\nafter\n"
    updated = replace_section(document, "new\n")
    assert updated == f"# T\n\n{START_MARKER}\nnew\n{END_MARKER}\nafter\n"
    assert current_section(updated) == "new\n"
    assert replace_section("no markers", "x") is None


def test_generator_script_writes_and_checks(tmp_path: Path) -> None:
    cli_page = tmp_path / "docs" / "cli.md"
    cli_page.parent.mkdir()
    cli_page.write_text("# CLI reference\n\nWritten by hand.\n", encoding="utf-8")
    command = [sys.executable, str(GENERATOR), "--root", str(tmp_path)]
    stale = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert "docs/cli.md" in stale.stderr and "docs/spec.md" in stale.stderr
    assert REGENERATE in stale.stderr  # the failure names its fix
    assert cli_page.read_text(encoding="utf-8") == "# CLI reference\n\nWritten by hand.\n"
    assert not (tmp_path / "docs" / "spec.md").exists()
    subprocess.run(command, check=True, capture_output=True)
    written = cli_page.read_text(encoding="utf-8")
    assert written.startswith("# CLI reference\n\nWritten by hand.\n")  # the prose is kept
    assert current_section(written) == cli_reference_markdown()
    spec_page = (tmp_path / "docs" / "spec.md").read_text(encoding="utf-8")
    assert spec_page.startswith("# Spec reference\n")
    fresh = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert fresh.returncode == 0, fresh.stderr


@pytest.mark.parametrize("page", PAGES, ids=[page.path for page in PAGES])
def test_generated_page_is_current(page: GeneratedPage) -> None:
    fix = f"run {REGENERATE} to (re)generate it"
    path = REPO / page.path
    assert path.exists(), f"{page.path} is missing; {fix}"
    start, end = markers(page.section)
    section = current_section(path.read_text(encoding="utf-8"), page.section)
    assert section is not None, (
        f"{page.path} has no generated {page.title} ({start} … {end}); {fix}"
    )
    assert section == page.generate(), f"{page.path}'s {page.title} is stale; {fix}"


def test_every_command_has_a_section_in_the_cli_page() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    headings = {
        line.lstrip("#").strip().strip("`") for line in text.splitlines() if line[:1] == "#"
    }
    missing = [path for path in all_command_paths() if path not in headings]
    assert missing == [], f"docs/cli.md lacks {missing}; run {REGENERATE}"


def test_readme_names_every_command() -> None:
    """The README's commands by task show every command, so a newcomer sees them all."""
    text = README.read_text(encoding="utf-8")
    missing = [name for name in COMMANDS if f"tpuctl {name} " not in text]
    assert missing == [], f"README.md's commands by task do not show {missing}"


def test_example_specs_in_the_docs_are_valid() -> None:
    """Every complete spec shown in the README or a docs page loads without an error."""
    from tpuctl.spec.load import load_spec_text

    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    shown = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        blocks = [
            block.split("```", 1)[0]
            for block in text.split("```yaml\n")[1:]
            if block.startswith("apiVersion: tpuctl/v1")
        ]
        for block in blocks:
            load_spec_text(block, source=str(page.relative_to(REPO)))
        shown += len(blocks) if page == README else 0
    assert shown, "the README shows no complete spec"
