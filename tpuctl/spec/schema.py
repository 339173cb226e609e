"""The field table (tpuctl.spec.fields) as a JSON Schema for editors and linters, and as the
spec reference page (docs/spec.md): both generated, never written by hand."""

from __future__ import annotations

from typing import Any

from tpuctl.clock import DURATION_PATTERN
from tpuctl.spec.field import Field
from tpuctl.spec.fields import ROOT, field_at, walk_fields
from tpuctl.spec.model import API_VERSION

# --- JSON Schema ------------------------------------------------------------------------------

_SCALAR_SCHEMA: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "bool": {"type": "boolean"},
    "duration": {
        "anyOf": [
            {"type": "number", "minimum": 0},
            {"type": "string", "pattern": DURATION_PATTERN},
        ]
    },
    "time_bound": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}]},
}


def _field_schema(field: Field) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    if field.kind == "str":
        schema.update(_string_schema(field))
    elif field.kind in _SCALAR_SCHEMA:
        schema.update(_SCALAR_SCHEMA[field.kind])
    elif field.kind == "str_list":
        schema.update({"type": "array", "items": _string_schema(field)})
    elif field.kind == "commands":
        schema["anyOf"] = [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
    elif field.kind == "command":
        schema["anyOf"] = [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ]
    elif field.kind == "str_map":
        schema.update(_map_schema(field))
    elif field.kind == "sections":
        schema.update({"type": "array", "items": section_schema(field)})
    else:
        schema.update(section_schema(field))
    if field.enum:
        schema["enum"] = list(field.enum)
    if field.minimum is not None:
        schema["minimum"] = field.minimum
    if field.maximum is not None:
        schema["maximum"] = field.maximum
    description = field.doc
    if field.default_doc:
        description += f" Default: {field.default_doc}."
    schema["description"] = description
    if field.default is not None:
        schema["default"] = field.default
    if field.example is not None:
        schema["examples"] = [field.example]
    return schema


def _string_schema(field: Field) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if field.pattern:
        schema["pattern"] = field.pattern
    if field.max_length is not None:
        schema["maxLength"] = field.max_length
    return schema


def _map_schema(field: Field) -> dict[str, Any]:
    value: dict[str, Any] = {"type": ["string", "number"]}
    if field.value_pattern:
        value["pattern"] = field.value_pattern
    schema: dict[str, Any] = {"type": "object", "additionalProperties": value}
    names: dict[str, Any] = {}
    if field.key_pattern:
        names["pattern"] = field.key_pattern
    if field.forbidden_keys:
        names["not"] = {"enum": list(field.forbidden_keys)}
    if names:
        schema["propertyNames"] = names
    if field.max_items is not None:
        schema["maxProperties"] = field.max_items
    return schema


def section_schema(section: Field) -> dict[str, Any]:
    """The object schema of a section: its properties, required keys and alternative forms."""
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {child.name: _field_schema(child) for child in section.children},
    }
    required = [child.name for child in section.children if child.required]
    if required:
        schema["required"] = required
    if section.one_of:
        every = {name for group in section.one_of for name in group}
        schema["oneOf"] = [
            {
                "required": list(group),
                "not": {"anyOf": [{"required": [name]} for name in sorted(every - set(group))]},
            }
            for group in section.one_of
        ]
    return schema


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the spec, for editors (yaml-language-server) and CI."""
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"tpuctl job spec ({API_VERSION})",
    }
    schema.update(section_schema(ROOT))
    schema["description"] = (
        "A Cloud TPU queued resource and the job it runs. `${VAR}` in string values expands "
        "from the environment; `$${` is a literal `${`."
    )
    return schema


# --- Markdown reference -----------------------------------------------------------------------

_KIND_NAMES: dict[str, str] = {
    "str": "string",
    "int": "integer",
    "bool": "boolean",
    "duration": "duration",
    "time_bound": "duration or RFC 3339 time",
    "str_list": "list of strings",
    "commands": "string or list of strings",
    "command": "string (a shell line) or list of strings (an argv)",
    "str_map": "map of strings",
    "section": "mapping",
    "sections": "list of mappings",
}


def _type_cell(field: Field) -> str:
    if field.enum:
        return " \\| ".join(f"`{value}`" for value in field.enum)
    text = _KIND_NAMES[field.kind]
    if field.minimum is not None and field.maximum is not None:
        text += f" {field.minimum}–{field.maximum}"
    elif field.minimum is not None:
        text += f" ≥ {field.minimum}"
    return text


def _default_cell(path: str, field: Field) -> str:
    if field.required:
        parent = path.rpartition(".")[0]
        section = field_at(parent) if parent else None
        if section is not None and not section.required:
            return f"required in `{parent}`"
        return "**required**"
    if field.default_doc:
        return field.default_doc
    if field.default is None:
        return ""
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    if field.default in ([], {}):
        return "empty"
    return f"`{field.default}`"


def reference_markdown() -> str:
    """A Markdown table of every key: dotted path, type, default, description."""
    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for path, field in walk_fields():
        doc = field.doc.replace("|", "\\|")
        lines.append(f"| `{path}` | {_type_cell(field)} | {_default_cell(path, field)} | {doc} |")
    return "\n".join(lines) + "\n"
