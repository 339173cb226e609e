"""The JSON contract: every lifecycle command's real output has exactly the keys that
docs/output.md shows for it (nested objects too), and errors have the documented shape."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.emulator

DOC = Path(__file__).resolve().parents[2] / "docs" / "output.md"
Cloud = Any  # tests/cloud/conftest.py


def documented_examples() -> dict[str, Any]:
    """`### tpuctl NAME` → the JSON example in the first ```json block after it."""
    text = DOC.read_text(encoding="utf-8")
    examples: dict[str, Any] = {}
    for match in re.finditer(r"^### tpuctl (\w+)\n(.*?)```json\n(.*?)```", text, re.S | re.M):
        examples[match.group(1)] = json.loads(match.group(3))
    error = re.search(r"^## Errors\n.*?```json\n(.*?)```", text, re.S | re.M)
    assert error is not None
    examples["error"] = json.loads(error.group(1))
    return examples


def assert_same_shape(real: Any, documented: Any, where: str = "$") -> None:
    """Same keys at every level the docs spell out. `"...": …` in the docs stands for an object
    documented elsewhere (then only "it is an object" is checked here)."""
    if isinstance(documented, dict):
        if real is None:
            return  # null is allowed wherever an object may be unknown
        assert isinstance(real, dict), f"{where}: expected an object, got {real!r}"
        if "..." in documented:
            return
        assert set(real) == set(documented), (
            f"{where}: keys differ: extra {sorted(set(real) - set(documented))}, "
            f"missing {sorted(set(documented) - set(real))}"
        )
        for key, value in documented.items():
            assert_same_shape(real[key], value, f"{where}.{key}")
    elif isinstance(documented, list) and documented and real:
        assert isinstance(real, list), f"{where}: expected a list"
        for index, item in enumerate(real):
            assert_same_shape(item, documented[0], f"{where}[{index}]")


def test_docs_have_an_example_for_every_lifecycle_command() -> None:
    examples = documented_examples()
    for command in ("create", "status", "describe", "list", "wait", "reset", "delete", "error"):
        assert command in examples, command


def test_every_command_matches_its_documented_shape(cloud: Cloud) -> None:
    examples = documented_examples()
    spec = cloud.spec()
    name = spec.stem

    def run(*args: str) -> Any:
        outcome = cloud.cli(*args, "--format", "json")
        assert outcome.exit_code == 0, (args, outcome.stderr)
        return outcome.json()

    dry = run("create", str(spec), "--dry-run")
    assert_same_shape(dry, examples["create"], "create --dry-run")
    assert dry["request"]["queued_resource_id"] == name
    created = run("create", str(spec), "--wait")
    assert_same_shape(created, examples["create"], "create --wait")
    assert_same_shape(created["wait"], examples["wait"], "create.wait")
    assert_same_shape(created["queued_resource"], examples["status"], "create.queued_resource")
    assert_same_shape(run("create", str(spec)), examples["create"], "create (exists)")
    waited = run("wait", name)
    assert_same_shape(waited, examples["wait"], "wait")
    assert_same_shape(waited["queued_resource"], examples["status"], "wait.queued_resource")
    assert_same_shape(run("status", name), examples["status"], "status")
    assert_same_shape(run("describe", name), examples["describe"], "describe")
    listed = run("list")
    assert listed["queued_resources"], "list is empty"
    assert_same_shape(listed, examples["list"], "list")
    assert_same_shape(run("reset", name, "--wait"), examples["reset"], "reset --wait")
    assert_same_shape(run("delete", name, "--force", "--yes"), examples["delete"], "delete")
    missing = run("delete", name, "--yes", "--ignore-missing")
    assert_same_shape(missing, examples["delete"], "delete (missing)")

    # YAML is the same object.
    import yaml

    outcome = cloud.cli("list", "--format", "yaml")
    assert set(yaml.safe_load(outcome.stdout)) == set(examples["list"])

    # Errors: one object under "error" with at least the documented always-present keys.
    failed = cloud.cli("status", name, "--format", "json")
    assert failed.exit_code == 5
    error = failed.json()
    assert set(error) == {"error"}
    assert {"kind", "message", "exit_code"} <= set(error["error"])
    assert error["error"]["kind"] == "not_found"
    assert error["error"]["exit_code"] == 5


def test_timestamps_are_rfc3339_utc(cloud: Cloud) -> None:
    spec = cloud.spec()
    outcome = cloud.cli("create", str(spec), "--format", "json")
    summary = outcome.json()["queued_resource"]
    pattern = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    assert pattern.match(summary["create_time"]), summary["create_time"]
    assert pattern.match(summary["state_since"]), summary["state_since"]
