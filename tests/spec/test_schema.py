"""The JSON Schema and the Markdown reference come from the same field table as validation."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuctl.errors import SpecError
from tpuctl.spec import model
from tpuctl.spec.fields import SPEC_FIELDS, Field, walk_fields
from tpuctl.spec.load import json_schema, load_spec_text, reference_markdown

DATA = Path(__file__).parent / "data"


def _check(schema: dict[str, Any], value: Any, path: str = "$") -> list[str]:
    """A tiny JSON Schema validator for the keywords json_schema() uses."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not any(_is_type(value, name) for name in names):
            return [f"{path}: {value!r} is not {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: too long")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below minimum")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above maximum")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += _check(schema["items"], item, f"{path}[{index}]")
    if isinstance(value, dict):
        errors += _check_object(schema, value, path)
    if "anyOf" in schema and all(_check(sub, value, path) for sub in schema["anyOf"]):
        errors.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema:
        matches = sum(not _check(sub, value, path) for sub in schema["oneOf"])
        if matches != 1:
            errors.append(f"{path}: matches {matches} of oneOf")
    if "not" in schema and not _check(schema["not"], value, path):
        errors.append(f"{path}: matches a `not` schema")
    return errors


def _check_object(schema: dict[str, Any], value: dict[str, Any], path: str) -> list[str]:
    errors = [f"{path}: missing {key}" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(f"{path}: too many properties")
    for key, item in value.items():
        if "propertyNames" in schema:
            errors += _check(schema["propertyNames"], key, f"{path}.{key}(name)")
        if key in properties:
            errors += _check(properties[key], item, f"{path}.{key}")
        elif extra is False:
            errors.append(f"{path}: additional property {key}")
        elif isinstance(extra, dict):
            errors += _check(extra, item, f"{path}.{key}")
    return errors


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "null":
        return value is None
    raise AssertionError(f"unknown type {name}")


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    for part in path.split("."):
        schema = schema["properties"][part]
    return schema


def test_schema_is_json_and_draft_2020_12() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(json.dumps(schema)) == schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["apiVersion", "name", "tpu"]


def test_schema_lists_every_key_of_the_table() -> None:
    schema = json_schema()
    paths = [path for path, _ in walk_fields()]
    assert len(paths) > 50
    for path, field in walk_fields():
        node = _schema_at(schema, path)
        assert node["description"], path
        if field.kind == "section":
            assert node["additionalProperties"] is False, path
            assert set(node["properties"]) == {child.name for child in field.children}
        if field.enum:
            assert node["enum"] == list(field.enum), path
        if field.default is not None:
            assert node["default"] == field.default, path
    assert _schema_at(schema, "capacity.tier")["enum"] == list(model.TIERS)
    assert _schema_at(schema, "job.framework")["default"] == "custom"
    assert _schema_at(schema, "tpu.slices")["maximum"] == 256


def test_example_spec_is_valid_against_the_schema() -> None:
    schema = json_schema()
    for name in ("reference-example.yaml", "example.yaml"):
        data = yaml.safe_load((DATA / name).read_text(encoding="utf-8"))
        assert _check(schema, data) == [], name


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"capacity": {"teir": "spot"}}, "additional property teir"),
        ({"capacity": {"tier": "spto"}}, "not in"),
        (
            {"tpu": {"accelerator": "v4-8", "type": "v4", "topology": "2x2x1", "runtime": "r"}},
            "oneOf",
        ),
        ({"tpu": {"runtime": "r"}}, "oneOf"),
        ({"tpu": {"accelerator": "v4-8", "runtime": "r", "labels": {"managed-by": "x"}}}, "not"),
        ({"tpu": {"accelerator": "v4-8", "runtime": "r", "slices": True}}, "is not integer"),
        ({"name": "Bad_Name"}, "does not match"),
        ({"job": {"env": {"1X": "a"}, "command": "x"}}, "does not match"),
        ({"job": {"setup": 3, "command": "x"}}, "anyOf"),
        ({"job": {"parallelism": {"ici": {"fsdpp": 2}}, "command": "x"}}, "additional property"),
        ({"job": {"framework": "pax"}}, "missing command"),
        ({"recovery": {"max_failures": -1}}, "below minimum"),
    ],
)
def test_schema_rejects_what_the_loader_rejects(patch: dict[str, Any], fragment: str) -> None:
    base: dict[str, Any] = {
        "apiVersion": "tpuctl/v1",
        "name": "demo",
        "tpu": {"accelerator": "v4-8", "runtime": "r"},
    }
    assert _check(json_schema(), base) == []
    errors = _check(json_schema(), {**base, **patch})
    assert any(fragment in error for error in errors), errors
    with pytest.raises(SpecError):  # the loader agrees
        load_spec_text(yaml.safe_dump({**base, **patch}))


def test_reference_markdown_has_a_row_per_key() -> None:
    text = reference_markdown()
    lines = text.splitlines()
    assert lines[0] == "| Key | Type | Default | Description |"
    rows = {line.split("|")[1].strip().strip("`") for line in lines[2:]}
    assert rows == {path for path, _ in walk_fields()}
    assert "| `capacity.tier` | `spot` \\| `reserved` \\| `on-demand` \\| `best-effort` |" in text
    assert "| `job.run_name` | string | the spec's name |" in text
    assert (
        "| `job.command` | string (a shell line) or list of strings (an argv) | required in `job` |"
        in text
    )
    assert "| `name` | string | **required** |" in text
    assert "| `tpu.slices` | integer 1–256 | `1` |" in text


_MODEL_SECTIONS: dict[str, type[Any]] = {
    "tpu": model.TpuSpec,
    "capacity": model.CapacitySpec,
    "checkpoint": model.CheckpointSpec,
    "job": model.JobSpec,
    "deadlines": model.DeadlinesSpec,
    "recovery": model.RecoverySpec,
}


def _model_default(item: dataclasses.Field[Any]) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def test_table_defaults_match_the_model() -> None:
    sections = {field.name: field for field in SPEC_FIELDS}
    for section_name, cls in _MODEL_SECTIONS.items():
        section: Field = sections[section_name]
        model_fields = {item.name: item for item in dataclasses.fields(cls)}
        for field in section.children:
            if field.name not in model_fields:
                # Only the gcloud-style tier booleans are folded into another key.
                assert section_name == "capacity" and field.name in (
                    "spot",
                    "reserved",
                    "on_demand",
                    "best_effort",
                ), field.name
                continue
            expected = _model_default(model_fields[field.name])
            if field.default is None or field.default_doc:
                continue
            documented = field.default
            if isinstance(documented, list):
                documented = tuple(documented)
            assert documented == expected, f"{section_name}.{field.name}"
        # Every model field is a key of the table.
        assert set(model_fields) <= {child.name for child in section.children}, section_name
