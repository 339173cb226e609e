"""The JSON contract: every command's real output is one envelope with exactly the keys that
docs/output.md shows for its kind (nested objects too), and errors have the documented shape."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.harness import Project
from tpuctl.cli.main import COMMANDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "output.md"
# Objects keyed by data (generations, worker labels, mesh axes, the request's proto fields):
# only "an object whose values look like the documented ones" is checked.
MAPS = frozenset(
    {"capacity", "pools", "boots_before", "boots_after", "axes", "request", "tails", "reasons"}
)
# Commands that print no envelope, on purpose (docs/output.md says why), or groups.
NOT_ENVELOPES = frozenset({"spec", "emulator", "completion"})


def documented_examples() -> dict[str, Any]:
    """`### tpuctl NAME` → the JSON example in the first ```json block after it."""
    text = DOC.read_text(encoding="utf-8")
    examples: dict[str, Any] = {}
    for match in re.finditer(r"^### tpuctl ([\w -]+)\n(.*?)```json\n(.*?)```", text, re.S | re.M):
        examples[match.group(1).strip()] = json.loads(match.group(3))
    error = re.search(r"^## Errors\n.*?```json\n(.*?)```", text, re.S | re.M)
    assert error is not None
    examples["error"] = json.loads(error.group(1))
    return examples


EXAMPLES = documented_examples()


def assert_same_shape(real: Any, documented: Any, where: str = "$") -> None:
    """Same keys at every level the docs spell out. `"...": …` in the docs stands for an object
    documented elsewhere (then only "it is an object" is checked here)."""
    if isinstance(documented, dict):
        if real is None:
            return  # null is allowed wherever an object may be unknown
        assert isinstance(real, dict), f"{where}: expected an object, got {real!r}"
        if "..." in documented:
            return
        key = where.rsplit(".", 1)[-1]
        if key in MAPS:
            sample = next(iter(documented.values()), None)
            for name, value in real.items():
                assert_same_shape(value, sample, f"{where}.{name}")
            return
        assert set(real) == set(documented), (
            f"{where}: keys differ: extra {sorted(set(real) - set(documented))}, "
            f"missing {sorted(set(documented) - set(real))}"
        )
        for name, value in documented.items():
            assert_same_shape(real[name], value, f"{where}.{name}")
    elif isinstance(documented, list) and documented and real:
        assert isinstance(real, list), f"{where}: expected a list"
        for index, item in enumerate(real):
            assert_same_shape(item, documented[0], f"{where}[{index}]")


def body(example: str) -> dict[str, Any]:
    """A documented example without its envelope keys: how it looks embedded in another."""
    return {k: v for k, v in EXAMPLES[example].items() if k not in ("apiVersion", "kind")}


def check(document: Any, example: str, where: str | None = None) -> None:
    assert document["apiVersion"] == "tpuctl/v1"
    assert document["kind"] == EXAMPLES[example]["kind"], where or example
    assert_same_shape(document, EXAMPLES[example], where or example)


def test_every_command_has_a_documented_example() -> None:
    documented = {name.split()[0] for name in EXAMPLES}
    fanout_kinds = {"logs", "stop", "download", "run"}  # the Fanout shape, documented once
    assert set(COMMANDS) - NOT_ENVELOPES - fanout_kinds <= documented, (
        set(COMMANDS) - NOT_ENVELOPES - fanout_kinds - documented
    )


def test_the_error_envelope() -> None:
    error = EXAMPLES["error"]
    assert (error["apiVersion"], error["kind"]) == ("tpuctl/v1", "Error")
    assert {"kind", "message", "exit_code"} <= set(error["error"])


def test_lifecycle_commands_match_their_documented_shapes(project: Project) -> None:
    spec = project.spec()
    name = spec.stem

    def run(*args: str) -> Any:
        outcome = project.cli(*args, "--format", "json")
        assert outcome.exit_code == 0, (args, outcome.stderr)
        return outcome.json()

    dry = run("create", str(spec), "--dry-run")
    check(dry, "create", "create --dry-run")
    assert dry["request"]["queued_resource_id"] == name
    created = run("create", str(spec), "--wait")
    check(created, "create", "create --wait")
    assert_same_shape(created["wait"], body("wait"), "create --wait: wait")
    check(run("create", str(spec)), "create", "create (exists)")
    waited = run("wait", name)
    check(waited, "wait")
    check(run("status", name), "status")
    check(run("describe", name), "describe")
    listed = run("list")
    assert listed["queued_resources"], "list is empty"
    check(listed, "list")
    check(run("reset", name, "--wait"), "reset", "reset --wait")
    check(run("delete", name, "--force", "--yes"), "delete")
    check(run("delete", name, "--yes", "--ignore-missing"), "delete", "delete (missing)")
    # YAML is the same document.
    as_yaml = yaml.safe_load(project.cli("list", "--format", "yaml").stdout)
    assert set(as_yaml) == set(EXAMPLES["list"])
    # Errors: one envelope of kind Error, with the always-present keys.
    failed = project.cli("status", name, "--format", "json")
    assert failed.exit_code == 5
    error = failed.json()
    assert set(error) == {"apiVersion", "kind", "error"} and error["kind"] == "Error"
    assert {"kind", "message", "exit_code"} <= set(error["error"])
    assert (error["error"]["kind"], error["error"]["exit_code"]) == ("not_found", 5)


def test_offline_commands_match_their_documented_shapes(project: Project) -> None:
    spec = project.spec(
        extra="job:\n  command: python3 train.py\n  parallelism: {ici: {fsdp: 4}, dcn: {}}\n"
    )
    for args, example in (
        (("validate", str(spec)), "validate"),
        (("render", str(spec)), "render"),
        (("render", str(spec), "--what", "gcloud"), "render"),
        (("render", str(spec), "--what", "startup-script"), "render"),
        (("plan", str(spec), "--mtbf", "24h"), "plan"),
    ):
        outcome = project.cli(*args, "--format", "json")
        assert outcome.exit_code == 0, (args, outcome.stderr)
        check(outcome.json(), example, " ".join(args[:1] + args[2:]))


def test_version_matches_its_documented_shape() -> None:
    from tests.support import invoke

    for machine in ("json", "yaml"):
        outcome = invoke(["--format", machine, "--version"])
        assert outcome.exit_code == 0, outcome.stderr
        document = (
            json.loads(outcome.stdout) if machine == "json" else yaml.safe_load(outcome.stdout)
        )
        check(document, "--version")


def test_timestamps_are_rfc3339_utc(project: Project) -> None:
    spec = project.spec()
    outcome = project.cli("create", str(spec), "--format", "json")
    summary = outcome.json()["queued_resource"]
    pattern = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    assert pattern.match(summary["create_time"]), summary["create_time"]
    assert pattern.match(summary["state_since"]), summary["state_since"]


def test_emulator_commands_match_their_documented_shapes(project: Project) -> None:
    for args, example in (
        (("emulator", "status"), "emulator status"),
        (("emulator", "capacity"), "emulator capacity"),
        (("emulator", "api-fault", "--count", "0"), "emulator api-fault"),
    ):
        outcome = project.cli(*args, "--format", "json")
        assert outcome.exit_code == 0, (args, outcome.stderr)
        check(outcome.json(), example)
