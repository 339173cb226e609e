"""The Cloud TPU REST API's JSON, in v2alpha1 and v2: proto3 JSON of google-cloud-tpu's messages,
plus the fields only REST carries (REST_ONLY), which the control plane keeps as records.Extras.

The REST API's schemas are its discovery documents (tpu.v2alpha1.json, tpu.v2.json, shipped in
google-api-python-client); tests/emulator/test_rest_schema.py checks REST_ONLY and the v2
differences here against them, so the emulator itself needs no copy of the documents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from tpuctl.emulator.control.protos import merge_json
from tpuctl.emulator.control.records import Extras
from tpuctl.emulator.control.status import ApiError, invalid

VERSIONS = ("v2alpha1", "v2")

# A REST-only field's type, as the discovery document gives it: "string", "int64" (a decimal
# string), "google-duration" ("3600s"), "google-datetime" (RFC 3339), ("enum", values),
# ("message", schema) or ("array", item type).
FieldType = str | tuple[str, Any]

_QR_MODELS = (
    "PROVISIONING_MODEL_UNSPECIFIED",
    "STANDARD",
    "SPOT",
    "RESERVATION_BOUND",
    "FLEX_START",
)
_NODE_MODELS = ("PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "RESERVATION_BOUND")

# Fields the v2alpha1 REST schemas have and google-cloud-tpu 1.28's messages lack, by schema.
REST_ONLY: dict[str, dict[str, FieldType]] = {
    "QueuedResource": {
        "provisioningModel": ("enum", _QR_MODELS),
        "runDuration": ("message", "RunDuration"),
    },
    "RunDuration": {"maxRunDuration": "google-duration", "terminationTime": "google-datetime"},
    "SchedulingConfig": {
        "provisioningModel": ("enum", _NODE_MODELS),
        "reservationName": "string",
        "terminationTimestamp": "google-datetime",
    },
    "BootDiskConfig": {
        "diskSizeGb": "int64",
        "provisionedIops": "int64",
        "provisionedThroughput": "int64",
        "sourceImage": "string",
        "storagePool": "string",
    },
    "AttachedDisk": {"workerIds": ("array", "string")},
}
# Output only: set by the service, ignored (dropped) when a request sends them.
OUTPUT_ONLY: dict[str, frozenset[str]] = {
    "RunDuration": frozenset({"terminationTime"}),
    "SchedulingConfig": frozenset({"terminationTimestamp"}),
}
# What v2 lacks of v2alpha1's schemas (the fields and methods only the alpha has) ...
V2_ABSENT: dict[str, frozenset[str]] = {
    "QueuedResource": frozenset({"bestEffort", "provisioningModel", "runDuration"}),
    "Node": frozenset({"autocheckpointEnabled"}),
    "NodeSpec": frozenset({"multiNodeParams"}),
    "MultiNodeParams": frozenset({"workloadType"}),
    "Guaranteed": frozenset({"reserved"}),
    "SchedulingConfig": frozenset({"provisioningModel", "reservationName", "terminationTimestamp"}),
    "BootDiskConfig": frozenset(
        {
            "diskSizeGb",
            "enableConfidentialCompute",
            "provisionedIops",
            "provisionedThroughput",
            "sourceImage",
            "storagePool",
        }
    ),
    "AttachedDisk": frozenset({"workerIds"}),
}
# ... and what it names differently: NodeSpec.multisliceParams is v2alpha1's multiNodeParams.
V2_RENAMED: dict[str, dict[str, str]] = {"NodeSpec": {"multisliceParams": "multiNodeParams"}}

_INT64 = re.compile(r"^-?\d{1,19}$")
_DURATION = re.compile(r"^-?\d+(\.\d{1,9})?s$")
_DATETIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")


class PayloadError(ApiError):
    """INVALID_ARGUMENT for one field of a request body; the REST face adds a BadRequest
    detail naming it, as Google's front ends do."""

    def __init__(self, message: str, field_violation: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)
        self.field_violation = field_violation


def type_url(version: str, name: str) -> str:
    """`type.googleapis.com/google.cloud.tpu.<version>.<name>`."""
    return f"type.googleapis.com/google.cloud.tpu.{version}.{name}"


# ----------------------------------------------------------------------------- requests
def parse_request(body: Any, message: Message, version: str, where: str) -> Extras:
    """Fill `message` (a protobuf message) from the request JSON `body` and answer its
    REST-only fields; INVALID_ARGUMENT, worded as Google's API front end words it, for an
    unknown field or a value of the wrong type."""
    if not isinstance(body, dict):
        raise PayloadError(
            f"Invalid JSON payload received. Expected an object at '{where}', got "
            f"{type(body).__name__}.",
            where,
        )
    known, extras = _split(body, message.DESCRIPTOR, version, where)
    try:
        json_format.ParseDict(known, message)
    except json_format.ParseError as error:
        raise PayloadError(f"Invalid JSON payload received. {error}", where) from None
    return extras


def _split(
    body: Mapping[str, Any], descriptor: Descriptor, version: str, where: str
) -> tuple[dict[str, Any], Extras]:
    """(what the gRPC message takes, the REST-only rest) of one JSON object."""
    schema = descriptor.name
    known: dict[str, Any] = {}
    extras: Extras = {}
    for key, value in body.items():
        name = key
        if version == "v2":
            renames = V2_RENAMED.get(schema, {})
            if _camel(key) in renames:
                name = renames[_camel(key)]
            elif _camel(key) in V2_ABSENT.get(schema, ()):
                raise unknown_field(key, where)
        field = descriptor.fields_by_camelcase_name.get(name) or descriptor.fields_by_name.get(name)
        if field is not None:
            at = f"{where}.{field.name}"
            known[field.json_name], nested = _split_value(field, value, version, at)
            if nested:
                extras[field.json_name] = nested
            continue
        camel = _camel(name)
        rest_type = REST_ONLY.get(schema, {}).get(camel)
        if rest_type is None:
            raise unknown_field(key, where)
        checked = _check(rest_type, value, f"{where}.{snake_case(camel)}", version)
        if camel not in OUTPUT_ONLY.get(schema, frozenset()) and checked not in ({}, None):
            extras[camel] = checked
    return known, extras


def _is_message(field: FieldDescriptor) -> bool:
    """A message field other than a map or a well-known type (their JSON is their own)."""
    kind = field.message_type
    if kind is None or kind.GetOptions().map_entry:
        return False
    return not kind.full_name.startswith(("google.protobuf.", "google.type."))


def _split_value(field: FieldDescriptor, value: Any, version: str, where: str) -> tuple[Any, Any]:
    """(the value for the message, its REST-only fields or None) of one field's JSON."""
    if not _is_message(field):
        return value, None
    if field.is_repeated and isinstance(value, list):
        pairs = [
            _split(item, field.message_type, version, f"{where}[{index}]")
            if isinstance(item, dict)
            else (item, {})
            for index, item in enumerate(value)
        ]
        extras = [extra for _, extra in pairs]
        return [known for known, _ in pairs], extras if any(extras) else None
    if isinstance(value, dict):
        known, extra = _split(value, field.message_type, version, where)
        return known, extra or None
    return value, None  # ParseDict reports the wrong type


def _check(kind: FieldType, value: Any, where: str, version: str) -> Any:
    """`value` checked against a REST-only field's type (INVALID_ARGUMENT otherwise)."""
    if isinstance(kind, tuple):
        tag, detail = kind
        if tag == "enum":
            if value not in detail:
                raise PayloadError(
                    f"Invalid value at '{where}' ({value!r}): one of " + ", ".join(detail), where
                )
            return value
        if tag == "array":
            if not isinstance(value, list):
                raise PayloadError(f"Invalid value at '{where}': a list", where)
            return [_check(detail, item, f"{where}[{i}]", version) for i, item in enumerate(value)]
        if not isinstance(value, dict):  # a message
            raise PayloadError(f"Invalid value at '{where}': an object", where)
        result: dict[str, Any] = {}
        for key, item in value.items():
            camel = _camel(key)
            item_type = REST_ONLY.get(detail, {}).get(camel)
            if item_type is None:
                raise unknown_field(key, where)
            if camel not in OUTPUT_ONLY.get(detail, frozenset()):
                result[camel] = _check(item_type, item, f"{where}.{snake_case(camel)}", version)
        return result
    patterns = {"int64": _INT64, "google-duration": _DURATION, "google-datetime": _DATETIME}
    if kind == "int64" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # proto3 JSON takes an int64 as a number too, and writes a string
    if not isinstance(value, str) or (kind in patterns and not patterns[kind].match(value)):
        raise PayloadError(f"Invalid value at '{where}' ({value!r}): not a valid {kind}", where)
    return value


def unknown_field(key: str, where: str) -> PayloadError:
    at = f" at '{where}'" if where else ""
    return PayloadError(
        f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.',
        f"{where}.{key}" if where else key,
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake_case(name: str) -> str:
    """A JSON (camelCase) field name as the API's errors spell it: pageSize → page_size."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# ---------------------------------------------------------------------------- responses
def render(message: Message, extras: Extras | None, version: str) -> dict[str, Any]:
    """A message as the REST API answers it: proto3 JSON (camelCase names, enums by name,
    int64 as strings, durations "3600s", RFC 3339 timestamps, defaults left out), with its
    REST-only fields, seen through `version`'s schema."""
    data: dict[str, Any] = json_format.MessageToDict(message)
    if extras:
        data = merge_json(data, extras)
    if version == "v2":
        data = _to_v2(data, message.DESCRIPTOR)
    return data


def _to_v2(data: dict[str, Any], descriptor: Descriptor | None) -> dict[str, Any]:
    """A v2alpha1 object as v2 has it: its alpha-only fields dropped, renamed fields renamed."""
    if descriptor is None:
        return data
    schema = descriptor.name
    absent = V2_ABSENT.get(schema, frozenset())
    renamed = {old: new for new, old in V2_RENAMED.get(schema, {}).items()}
    result: dict[str, Any] = {}
    for key, value in data.items():
        if key in absent and key not in renamed:
            continue
        field = descriptor.fields_by_camelcase_name.get(key)
        nested = field is not None and _is_message(field)
        result[renamed.get(key, key)] = _v2_value(value, field.message_type) if nested else value
    return result


def _v2_value(value: Any, descriptor: Descriptor) -> Any:
    if isinstance(value, list):
        return [_to_v2(item, descriptor) if isinstance(item, dict) else item for item in value]
    if isinstance(value, dict):
        return _to_v2(value, descriptor)
    return value


# ------------------------------------------------------------------ partial responses
Selection = dict[str, "Selection | None"]


def parse_fields(text: str) -> Selection:
    """The `fields` system parameter (`name,state`, `nodes(name,state/state)`, `a/b`) as a
    tree: a name maps to None (all of it) or to the selection inside it."""
    parser = _FieldsParser(text)
    selection = parser.selection()
    if parser.position != len(text):
        raise invalid(f"Invalid field selection {text!r}")
    return selection


class _FieldsParser:
    _NAME = re.compile(r"[A-Za-z0-9_@$.*-]+")

    def __init__(self, text: str) -> None:
        self.text = text.replace(" ", "")
        self.position = 0

    def selection(self) -> Selection:
        result: Selection = {}
        while True:
            name, inner = self.item()
            result[name] = _union(result[name], inner) if name in result else inner
            if not self._take(","):
                return result

    def item(self) -> tuple[str, Selection | None]:
        match = self._NAME.match(self.text, self.position)
        if match is None:
            raise invalid(f"Invalid field selection {self.text!r}")
        self.position = match.end()
        if self._take("/"):
            name, inner = self.item()
            return match.group(), {name: inner}
        if self._take("("):
            inner_selection = self.selection()
            if not self._take(")"):
                raise invalid(f"Invalid field selection {self.text!r}: ')' expected")
            return match.group(), inner_selection
        return match.group(), None

    def _take(self, char: str) -> bool:
        if self.text.startswith(char, self.position):
            self.position += 1
            return True
        return False


def _union(left: Selection | None, right: Selection | None) -> Selection | None:
    if left is None or right is None:
        return None
    merged = dict(left)
    for key, value in right.items():
        merged[key] = _union(merged[key], value) if key in merged else value
    return merged


def select(data: Any, selection: Selection | None) -> Any:
    """Keep only what `selection` names (applied to each element of a list)."""
    if selection is None:
        return data
    if isinstance(data, list):
        return [select(item, selection) for item in data]
    if not isinstance(data, dict):
        return data
    if "*" in selection:
        return data
    return {key: select(data[key], inner) for key, inner in selection.items() if key in data}
