"""`--set dotted.path=value`: one key of a composed spec document replaced, typed like YAML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuctl.errors import SourceLocation, SpecError
from tpuctl.spec.check import describe_value
from tpuctl.spec.yamlsource import Document, expand_variables, join_path, load_value


def apply_override(document: Document, override: str, environ: Mapping[str, str]) -> None:
    """`--set dotted.path=value`: the value is typed as YAML; missing sections are created."""
    where = SourceLocation(f"--set {override}")
    dotted, equals, raw = override.partition("=")
    dotted = dotted.strip()
    parts = dotted.split(".")
    if not equals or not dotted or not all(parts):
        raise SpecError(
            "malformed override",
            location=where,
            hint="write --set dotted.path=value, e.g. --set tpu.slices=2",
        )
    expanded = expand_variables(raw, environ, location=where, path=dotted)
    value = load_value(expanded, location=where, path=dotted)
    node: dict[str, Any] = document.data
    path = ""
    for part in parts[:-1]:
        path = join_path(path, part)
        child = node.get(part)
        if child is None:
            child = node[part] = {}
            document.keys[path] = document.values[path] = where
        elif not isinstance(child, dict):
            raise SpecError(
                f"cannot set {dotted}: {path} is {describe_value(child)}, not a mapping",
                location=where,
                path=path,
            )
        node = child
    node[parts[-1]] = value
    if dotted == "capacity.zones":  # the zones replace the spec's one zone
        _drop(document, "zone")
    stale = [key for key in document.values if key.startswith((dotted + ".", dotted + "["))]
    for key in stale:
        document.values.pop(key, None)
        document.keys.pop(key, None)
    document.keys[dotted] = where
    _record(document, value, dotted, where)


def _drop(document: Document, key: str) -> None:
    document.data.pop(key, None)
    for path in [path for path in document.values if path == key]:
        document.values.pop(path, None)
        document.keys.pop(path, None)


def _record(document: Document, value: Any, path: str, where: SourceLocation) -> None:
    document.values[path] = where
    if isinstance(value, dict):
        for key, item in value.items():
            document.keys[join_path(path, key)] = where
            _record(document, item, join_path(path, key), where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _record(document, item, f"{path}[{index}]", where)
