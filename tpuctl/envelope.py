"""The one output contract: every command's result is a typed `Result`, and with `--format json`
or `yaml` it is printed inside one versioned envelope, made here and nowhere else.

    {"apiVersion": "tpuctl/v1", "kind": "QueuedResource", ...the result's fields}
    {"apiVersion": "tpuctl/v1", "kind": "Error", "error": {"kind", "message", "exit_code", ...}}

docs/output.md documents every kind, and a contract test checks each command's real output
against it key for key.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from datetime import datetime, timedelta
from enum import Enum
from pathlib import PurePath
from typing import Any, ClassVar

from tpuctl.clock import rfc3339
from tpuctl.errors import ExitCode, TpuctlError

API_VERSION = "tpuctl/v1"
ERROR_KIND = "Error"


class Result:
    """Base of every command's result: a dataclass whose fields are its JSON shape.

    `KIND` names the shape (docs/output.md has a section per kind). Fields whose metadata says
    `{"json": False}` are kept for the table only. `exit_code` is how the command ends once the
    result is printed (a fan-out where some worker failed exits 3 after its table).
    """

    KIND: ClassVar[str] = "Result"

    def to_dict(self) -> dict[str, Any]:
        assert is_dataclass(self), f"{type(self).__name__} must be a dataclass"
        return {
            item.name: jsonable(getattr(self, item.name))
            for item in fields(self)
            if item.metadata.get("json", True)
        }

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK

    def exit_error(self) -> TpuctlError | None:
        """The error to report on stderr after printing, when `exit_code` is not OK."""
        return None


def envelope(result: Result) -> dict[str, Any]:
    """The JSON document for a result: apiVersion, kind, then the result's own fields."""
    fields = result.to_dict()
    clash = {"apiVersion", "kind"} & set(fields)
    assert not clash, f"{type(result).__name__} has fields the envelope owns: {clash}"
    document: dict[str, Any] = jsonable({"apiVersion": API_VERSION, "kind": result.KIND, **fields})
    return document


def error_envelope(error: TpuctlError) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": ERROR_KIND, "error": jsonable(error.to_dict())}


_PLAIN = frozenset((str, int, float, bool))


def jsonable(value: Any) -> Any:
    """Plain JSON values: results and dataclasses as objects, times as RFC 3339, durations as
    seconds, enums by value, paths as strings."""
    if value is None or type(value) in _PLAIN:  # most leaves: skip the checks below
        return value
    if isinstance(value, Result):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: jsonable(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, PurePath):
        return str(value)
    return value


def to_json(document: Any) -> str:
    text = json.dumps(jsonable(document), indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Arguments and paths that were not UTF-8 are surrogate escapes (U+DC80-U+DCFF): as
        # \udcXX escapes the JSON stays UTF-8, and json.loads then os.fsencode give the bytes.
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
