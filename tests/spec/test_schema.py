"""The JSON Schema and the Markdown reference come from the same field table as validation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tpuctl.clock import MAX_DURATION_SECONDS, format_duration
from tpuctl.errors import SpecError
from tpuctl.spec import model
from tpuctl.spec.field import Field
from tpuctl.spec.fields import SPEC_FIELDS, walk_fields
from tpuctl.spec.load import json_schema, load_spec_text, reference_markdown

DATA = Path(__file__).parent / "data"


def _errors(value: Any) -> list[tuple[str, str]]:
    """What the JSON Schema finds wrong with `value`: (keyword, JSON path) per error."""
    validator = Draft202012Validator(json_schema())
    return [(str(error.validator), error.json_path) for error in validator.iter_errors(value)]


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    for part in path.split("."):
        name, items, _ = part.partition("[]")
        schema = schema["properties"][name]
        if items:  # an item of a list of sections
            schema = schema["items"]
    return schema


def test_schema_is_json_and_draft_2020_12() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(json.dumps(schema)) == schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["apiVersion", "name", "tpu"]
    Draft202012Validator.check_schema(schema)  # a valid schema by the metaschema


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
    for name in ("reference-example.yaml", "example.yaml"):
        data = yaml.safe_load((DATA / name).read_text(encoding="utf-8"))
        assert _errors(data) == [], name


BASE: dict[str, Any] = {
    "apiVersion": "tpuctl/v1",
    "name": "demo",
    "tpu": {"accelerator": "v4-8", "runtime": "r"},
}


@pytest.mark.parametrize(
    ("patch", "keyword", "where"),
    [
        ({"capacity": {"teir": "spot"}}, "additionalProperties", "$.capacity"),
        ({"capacity": {"tier": "spto"}}, "enum", "$.capacity.tier"),
        (
            {"tpu": {"accelerator": "v4-8", "type": "v4", "topology": "2x2x1", "runtime": "r"}},
            "oneOf",
            "$.tpu",
        ),
        ({"tpu": {"runtime": "r"}}, "oneOf", "$.tpu"),
        (
            {"tpu": {"accelerator": "v4-8", "runtime": "r", "labels": {"managed-by": "x"}}},
            "not",
            "$.tpu.labels",
        ),
        ({"tpu": {"accelerator": "v4-8", "runtime": "r", "slices": True}}, "type", "$.tpu.slices"),
        ({"name": "Bad_Name"}, "pattern", "$.name"),
        ({"job": {"env": {"1X": "a"}, "command": "x"}}, "pattern", "$.job.env"),
        ({"job": {"setup": 3, "command": "x"}}, "anyOf", "$.job.setup"),
        (
            {"job": {"parallelism": {"ici": {"fsdpp": 2}}, "command": "x"}},
            "additionalProperties",
            "$.job.parallelism.ici",
        ),
        ({"job": {"framework": "pax"}}, "required", "$.job"),
        ({"recovery": {"max_failures": -1}}, "minimum", "$.recovery.max_failures"),
        ({"deadlines": {"queue": "1.5 hours"}}, "anyOf", "$.deadlines.queue"),
        ({"deadlines": {"provision": -90}}, "anyOf", "$.deadlines.provision"),
    ],
)
def test_schema_rejects_what_the_loader_rejects(
    patch: dict[str, Any], keyword: str, where: str
) -> None:
    assert _errors(BASE) == []
    assert _errors({**BASE, **patch}) == [(keyword, where)]
    with pytest.raises(SpecError):  # the loader agrees
        load_spec_text(yaml.safe_dump({**BASE, **patch}))


@pytest.mark.parametrize("duration", ["1.5h", "1h30m", "850ms", "2D", " 90 ", "+30s", 1.5, 45])
def test_schema_takes_every_duration_the_loader_takes(duration: object) -> None:
    document = {**BASE, "deadlines": {"queue": duration}}
    assert _errors(document) == []
    load_spec_text(yaml.safe_dump(document))


@given(st.floats(min_value=0.001, max_value=MAX_DURATION_SECONDS, allow_nan=False))
def test_what_tpuctl_prints_as_a_duration_is_a_valid_spec_duration(seconds: float) -> None:
    text = format_duration(seconds)
    assert _errors({**BASE, "deadlines": {"queue": text}}) == [], text


def test_reference_markdown_has_a_row_per_key() -> None:
    text = reference_markdown()
    lines = text.splitlines()
    assert lines[0] == "| Key | Type | Default | Description |"
    rows = {line.split("|")[1].strip().strip("`") for line in lines[2:]}
    assert rows == {path for path, _ in walk_fields()}
    assert (
        "| `capacity.tier` | `spot` \\| `reserved` \\| `on-demand` \\| `best-effort` \\| "
        "`flex-start` \\| `reservation-bound` |" in text
    )
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
