"""Docs are tested: every command has help, and the README's CLI reference is the generated one."""

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
    START_MARKER,
    cli_reference_markdown,
    current_section,
    help_text,
    replace_section,
    walk_commands,
)

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GENERATOR = REPO / "scripts" / "update-readme"


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
    readme = tmp_path / "README.md"
    readme.write_text("# tpuctl\n", encoding="utf-8")
    command = [sys.executable, str(GENERATOR), "--readme", str(readme)]
    stale = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert readme.read_text(encoding="utf-8") == "# tpuctl\n"
    subprocess.run(command, check=True, capture_output=True)
    assert current_section(readme.read_text(encoding="utf-8")) == cli_reference_markdown()
    fresh = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert fresh.returncode == 0


def test_readme_cli_reference_is_current() -> None:
    fix = "run scripts/update-readme to (re)generate it"
    assert README.exists(), f"README.md is missing; {fix}"
    section = current_section(README.read_text(encoding="utf-8"))
    assert section is not None, (
        f"README.md has no generated CLI reference ({START_MARKER} … {END_MARKER}); {fix}"
    )
    assert section == cli_reference_markdown(), f"README.md's CLI reference is stale; {fix}"


def test_readme_spec_reference_is_current() -> None:
    from tpuctl.cli.reference import spec_reference_markdown

    section = current_section(README.read_text(encoding="utf-8"), "spec-reference")
    assert section is not None, "README.md has no spec reference section; run scripts/update-readme"
    assert section == spec_reference_markdown(), (
        "README.md's spec reference is stale; run scripts/update-readme"
    )


def test_readme_example_specs_are_valid(tmp_path: Path) -> None:
    """Every complete spec shown in the README loads without an error."""
    from tpuctl.spec.load import load_spec_text

    text = README.read_text(encoding="utf-8")
    blocks = [
        block.split("```", 1)[0]
        for block in text.split("```yaml\n")[1:]
        if block.startswith("apiVersion: tpuctl/v1")
    ]
    assert blocks, "the README shows no complete spec"
    for block in blocks:
        load_spec_text(block, source="README.md")
