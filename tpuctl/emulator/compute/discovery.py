"""Compute Engine's discovery document (v1), as google-api-python-client ships it: the methods
the fake serves (paths, HTTP verbs, query parameters) and a checker of request bodies against
the document's schemas (no unknown field, every enum value known, every value of its type).

The fake rejects what the service rejects with it, and tests of rendered requests run the same
checker (`problems(...)`): one reading of the document for both. Pure apart from reading the
JSON file once; google-api-python-client is the emulator's dependency, never tpuctl's.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "v1"
# Parameters every Google API method takes besides its own (the document's top level).
_NUMBER = re.compile(r"^-?[0-9]+$")
_UNSIGNED = re.compile(r"^[0-9]+$")
INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)


class DiscoveryMissing(RuntimeError):
    """google-api-python-client (which ships the discovery documents) is not installed."""


def document_path(version: str = VERSION) -> Path:
    """The installed compute.<version>.json, found without importing googleapiclient."""
    spec = importlib.util.find_spec("googleapiclient")
    if spec is None or not spec.submodule_search_locations:
        raise DiscoveryMissing(
            "Compute Engine's discovery document comes with google-api-python-client, which is "
            "not installed (pip install 'tpuctl[emulator]')"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "discovery_cache" / "documents" / f"compute.{version}.json"


@functools.lru_cache(maxsize=4)
def document(version: str = VERSION) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(document_path(version).read_text(encoding="utf-8"))
    return data


@dataclass(frozen=True)
class Method:
    """One method of the document: `instances.insert` and what it takes."""

    resource: str
    name: str
    http_method: str
    path: str  # "projects/{project}/zones/{zone}/instances"
    query: frozenset[str]  # its query parameters
    request: str | None  # the body's schema, e.g. "Instance"
    response: str | None

    @property
    def id(self) -> str:
        return f"{self.resource}.{self.name}"

    def pattern(self) -> re.Pattern[str]:
        """A regex matching this method's path below /compute/v1/, one group per parameter."""
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.path))
        return re.compile(f"^{regex}$")


def method(resource: str, name: str, version: str = VERSION) -> Method:
    """`method("instances", "insert")` → its Method; KeyError when the document lacks it."""
    spec = document(version)["resources"][resource]["methods"][name]
    query = frozenset(
        key for key, value in spec.get("parameters", {}).items() if value.get("location") == "query"
    )
    return Method(
        resource=resource,
        name=name,
        http_method=str(spec["httpMethod"]),
        path=str(spec["path"]),
        query=query,
        request=spec.get("request", {}).get("$ref"),
        response=spec.get("response", {}).get("$ref"),
    )


def global_parameters(version: str = VERSION) -> frozenset[str]:
    """Query parameters every method accepts (alt, fields, prettyPrint, key, …)."""
    return frozenset(document(version).get("parameters", {}))


def enum_values(schema: str, field: str, version: str = VERSION) -> tuple[str, ...]:
    """The enum of `schema.field`, e.g. ("FLEX_START", "RESERVATION_BOUND", "SPOT", "STANDARD")."""
    spec = document(version)["schemas"][schema]["properties"][field]
    return tuple(spec.get("enum") or spec.get("items", {}).get("enum") or ())


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a body: where (a dotted path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def problems(
    schema: str,
    body: Any,
    *,
    output_only: bool = True,
    version: str = VERSION,
    root: str = "",
) -> list[Problem]:
    """Everything in `body` the schema `schema` does not allow: unknown fields, enum values not
    in the enum, values of the wrong JSON type, integers out of range. With `output_only` False,
    fields the document marks read-only are problems too (a request should not carry them; the
    service ignores most of them)."""
    walk = _Walk(document(version)["schemas"], output_only)
    walk.check({"$ref": schema}, body, root)
    return walk.found


@dataclass
class _Walk:
    schemas: Mapping[str, Any]
    output_only: bool
    found: list[Problem] = field(default_factory=list)

    def check(self, spec: Mapping[str, Any], value: Any, path: str) -> None:
        if "$ref" in spec:
            spec = self.schemas[spec["$ref"]]
        kind = spec.get("type")
        if kind == "object" or "properties" in spec:
            self.check_object(spec, value, path)
        elif kind == "array":
            if not isinstance(value, list):
                self.found.append(Problem(path, f"expected a list, not {_json_type(value)}"))
                return
            for index, item in enumerate(value):
                self.check(spec.get("items", {}), item, f"{path}[{index}]")
        elif kind == "string":
            _check_string(spec, value, path, self.found)
        elif kind == "integer":
            _check_integer(spec, value, path, self.found)
        elif kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            self.found.append(Problem(path, f"expected a number, not {_json_type(value)}"))
        elif kind == "boolean" and not isinstance(value, bool):
            self.found.append(Problem(path, f"expected true or false, not {_json_type(value)}"))
        # "any" (and no type) takes any JSON value.

    def check_object(self, spec: Mapping[str, Any], value: Any, path: str) -> None:
        if not isinstance(value, dict):
            self.found.append(Problem(path, f"expected an object, not {_json_type(value)}"))
            return
        properties: Mapping[str, Any] = spec.get("properties", {})
        extra = spec.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in properties:
                if not self.output_only and properties[key].get("readOnly"):
                    self.found.append(Problem(where, "is output only"))
                self.check(properties[key], item, where)
            elif extra is not None:
                self.check(extra, item, where)
            else:
                near = _closest(str(key), properties)
                hint = f" (did you mean {near!r}?)" if near else ""
                self.found.append(Problem(where, f"unknown field{hint}"))


def _check_string(spec: Mapping[str, Any], value: Any, path: str, found: list[Problem]) -> None:
    form = spec.get("format")
    if form in ("int64", "uint64"):
        # JSON carries 64-bit integers as strings; the services take plain numbers too.
        pattern = _UNSIGNED if form == "uint64" else _NUMBER
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not pattern.match(text):
            found.append(Problem(path, f"expected a {form} (a string of digits), not {value!r}"))
        return
    if not isinstance(value, str):
        found.append(Problem(path, f"expected a string, not {_json_type(value)}"))
        return
    allowed = spec.get("enum")
    if allowed and value not in allowed:
        found.append(Problem(path, f"{value!r} is not one of {', '.join(allowed)}"))


def _check_integer(spec: Mapping[str, Any], value: Any, path: str, found: list[Problem]) -> None:
    if isinstance(value, str) and _NUMBER.match(value):
        value = int(value)  # proto3 JSON accepts quoted integers
    if isinstance(value, bool) or not isinstance(value, int):
        found.append(Problem(path, f"expected an integer, not {_json_type(value)}"))
        return
    low, high = UINT32 if spec.get("format") == "uint32" else INT32
    if not low <= value <= high:
        found.append(Problem(path, f"{value} is out of range for {spec.get('format', 'int32')}"))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _closest(word: str, choices: Mapping[str, Any]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return matches[0] if matches else None
