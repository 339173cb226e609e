"""The Cloud TPU discovery documents google-api-python-client ships (tpu.v2alpha1.json,
tpu.v2.json), and a check that a JSON value is what a schema of theirs describes."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

_FORMATS = {
    "int64": re.compile(r"^-?\d+$"),
    "uint64": re.compile(r"^\d+$"),
    "google-duration": re.compile(r"^-?\d+(\.\d{1,9})?s$"),
    "google-datetime": re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$"),
}


@cache
def document(version: str) -> dict[str, Any]:
    """The discovery document of Cloud TPU `version`; the test is skipped without it."""
    try:
        import googleapiclient
    except ImportError:
        pytest.skip("google-api-python-client (the test extra) is not installed")
    path = (
        Path(googleapiclient.__file__).parent
        / "discovery_cache"
        / "documents"
        / f"tpu.{version}.json"
    )
    if not path.exists():
        pytest.skip(f"this google-api-python-client ships no {path.name}")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def methods(version: str) -> dict[str, dict[str, Any]]:
    """Every method of the document, by id (`tpu.projects.locations.nodes.get`)."""
    found: dict[str, dict[str, Any]] = {}

    def walk(resources: dict[str, Any]) -> None:
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                found[method["id"]] = method
            walk(resource.get("resources", {}))

    walk(document(version)["resources"])
    return found


def problems(version: str, schema: str, value: Any, where: str = "") -> list[str]:
    """What in `value` the schema `schema` of `version`'s document does not allow: an unknown
    key, a wrong type, an enum value or format it does not have."""
    return _check(document(version)["schemas"], {"$ref": schema}, value, where or schema)


def _check(schemas: dict[str, Any], spec: dict[str, Any], value: Any, where: str) -> list[str]:
    if "$ref" in spec:
        spec = schemas[spec["$ref"]]
    kind = spec.get("type")
    if kind == "any":
        return []
    if kind == "object" or "properties" in spec:
        if not isinstance(value, dict):
            return [f"{where}: an object expected, not {value!r}"]
        found: list[str] = []
        properties = spec.get("properties", {})
        extra = spec.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                found += _check(schemas, properties[key], item, f"{where}.{key}")
            elif extra is not None:
                if key != "@type":
                    found += _check(schemas, extra, item, f"{where}.{key}")
            else:
                found.append(f"{where}.{key}: no such field in {spec.get('id', 'the schema')}")
        return found
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: a list expected, not {value!r}"]
        return [
            problem
            for index, item in enumerate(value)
            for problem in _check(schemas, spec["items"], item, f"{where}[{index}]")
        ]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{where}: a string expected, not {value!r}"]
        if "enum" in spec and value not in spec["enum"]:
            return [f"{where}: {value!r} is none of {spec['enum']}"]
        pattern = _FORMATS.get(spec.get("format", ""))
        if pattern is not None and not pattern.match(value):
            return [f"{where}: {value!r} is not a {spec['format']}"]
        return []
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: an integer expected, not {value!r}"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{where}: a boolean expected, not {value!r}"]
    return [f"{where}: cannot check type {kind!r}"]
