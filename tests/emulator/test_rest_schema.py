"""The emulator's REST face against the discovery documents: the fields only REST carries are
exactly what the v2alpha1 schemas have beyond google-cloud-tpu's messages, v2's differences
are exactly what its document lacks or renames, and every method of each document is routed."""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest
from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.protobuf.descriptor import Descriptor

from tests.emulator.discovery import document, methods
from tpuctl.emulator.api import rest, rest_call, rest_json
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.status import ApiError

# The v2alpha1 schemas that are messages of google-cloud-tpu, and those messages.
_NESTED = {
    "NodeSpec": cloud_tpu.QueuedResource.Tpu.NodeSpec,
    "MultiNodeParams": cloud_tpu.QueuedResource.Tpu.NodeSpec.MultiNodeParams,
    "Tpu": cloud_tpu.QueuedResource.Tpu,
    "QueueingPolicy": cloud_tpu.QueuedResource.QueueingPolicy,
    "Guaranteed": cloud_tpu.QueuedResource.Guaranteed,
    "Spot": cloud_tpu.QueuedResource.Spot,
    "BestEffort": cloud_tpu.QueuedResource.BestEffort,
    "Standard": cloud_tpu.Reservation.Standard,
    "Usage": cloud_tpu.Reservation.Standard.Usage,
}
# Request messages whose `name` is the URL's (the discovery document leaves it out).
_NAME_IN_PATH = {
    "GenerateServiceIdentityRequest": "parent",
    "GetGuestAttributesRequest": "name",
    "PerformMaintenanceQueuedResourceRequest": "name",
    "PerformMaintenanceRequest": "name",
    "ResetQueuedResourceRequest": "name",
    "SimulateMaintenanceEventRequest": "name",
    "StartNodeRequest": "name",
    "StopNodeRequest": "name",
}
# v2 output the emulator does not produce (so v2's view of a node never has it).
_V2_NOT_PRODUCED = {"Node": {"protectionTier"}}


def _descriptor(schema: str) -> Descriptor | None:
    message = _NESTED.get(schema) or getattr(cloud_tpu, schema, None)
    if message is None or not hasattr(message, "pb"):
        return None
    descriptor: Descriptor = message.pb().DESCRIPTOR
    return descriptor


def _type_of(spec: dict[str, Any]) -> Any:
    """A discovery property's type in rest_json.FieldType's terms."""
    if "$ref" in spec:
        return ("message", spec["$ref"])
    if spec.get("type") == "array":
        return ("array", _type_of(spec["items"]))
    if "enum" in spec:
        return ("enum", tuple(spec["enum"]))
    return spec.get("format") or spec["type"]


def test_rest_only_fields_are_what_the_v2alpha1_schemas_have_beyond_the_messages() -> None:
    schemas = document("v2alpha1")["schemas"]
    expected: dict[str, dict[str, Any]] = {}
    for name, schema in schemas.items():
        descriptor = _descriptor(name)
        properties = schema.get("properties", {})
        if descriptor is None:
            # A schema no message matches is REST-only as a whole (RunDuration) or not a
            # resource body (Empty, Status, the state data, Location, …).
            if name in rest_json.REST_ONLY:
                expected[name] = {key: _type_of(spec) for key, spec in properties.items()}
            continue
        known = {field.json_name for field in descriptor.fields}
        known.discard(_NAME_IN_PATH.get(name, ""))
        missing = known - set(properties) - {_NAME_IN_PATH.get(name, "")}
        assert missing == set(), f"{name}: the message has fields the document lacks"
        rest_only = {key: _type_of(properties[key]) for key in set(properties) - known}
        if rest_only:
            expected[name] = rest_only
    assert expected == rest_json.REST_ONLY
    for schema, fields in rest_json.OUTPUT_ONLY.items():
        assert fields <= set(rest_json.REST_ONLY[schema])


def test_v2_differences_are_what_its_document_lacks_or_renames() -> None:
    alpha = document("v2alpha1")["schemas"]
    v2 = document("v2")["schemas"]
    renamed_schemas = {"MultiNodeParams": "MultisliceParams"}
    absent: dict[str, frozenset[str]] = {}
    renamed: dict[str, dict[str, str]] = {}
    for name, schema in alpha.items():
        twin = v2.get(renamed_schemas.get(name, name))
        if twin is None:
            continue  # a schema only the alpha has (its resources are alpha-only too)
        mine = set(schema.get("properties", {}))
        theirs = set(twin.get("properties", {})) - _V2_NOT_PRODUCED.get(name, set())
        for new in theirs - mine:
            old = {"multisliceParams": "multiNodeParams"}[new]
            renamed.setdefault(name, {})[new] = old
        if mine - theirs:
            absent[name] = frozenset(mine - theirs)
    assert renamed == rest_json.V2_RENAMED
    assert absent == rest_json.V2_ABSENT


def _api() -> rest.TpuRestApi:
    return rest.TpuRestApi(
        cloud=None,  # type: ignore[arg-type]  # routing never calls it
        check=lambda method, request: None,
        events=EventLog(Clock()),
        requests=rest_call.RequestLog(),
    )


def _path(method: dict[str, Any], version: str) -> str:
    """A URL of the method in `version`, its path parameters filled in."""
    flat = re.sub(r"\{[A-Za-z]+\}", "x", method["flatPath"])
    return f"/{version}/{flat.split('/', 1)[1]}"


def test_every_method_of_both_documents_is_routed_and_v2_only_to_its_own() -> None:
    api = _api()
    alpha, v2 = methods("v2alpha1"), methods("v2")
    assert {method.api for method in api._routes.values()} == set(alpha)
    assert set(v2) <= set(alpha)
    for name, method in alpha.items():
        for version in ("v2alpha1", "v2"):
            path = _path(method, version)
            if version == "v2" and name not in v2:
                with pytest.raises(ApiError) as refused:
                    api._route(method["httpMethod"], path, {}, b"")
                assert refused.value.code == grpc.StatusCode.NOT_FOUND, path
                continue
            _call, routed = api._route(method["httpMethod"], path, {}, b"")
            assert routed.api == name, path


def test_each_route_takes_the_query_parameters_its_method_has() -> None:
    alpha = methods("v2alpha1")
    for method in _api()._routes.values():
        parameters = alpha[method.api].get("parameters", {})
        in_query = {key for key, spec in parameters.items() if spec["location"] == "query"}
        assert method.params == in_query, method.api
