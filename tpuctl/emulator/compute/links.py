"""Compute Engine resource URLs: the selfLinks the fake answers with, and the full or partial
URLs (and bare names) requests refer to other resources by."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from tpuctl.emulator.compute.errors import ComputeApiError, invalid

ROOT = "https://www.googleapis.com/compute/v1/"
# Resource names: RFC 1035 labels, as Compute Engine requires them.
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIXES = (ROOT, "https://compute.googleapis.com/compute/v1/", "compute/v1/", "/")


def link(project: str, *parts: str) -> str:
    """`link("p", "zones", "z", "instances", "x")` → the full URL."""
    return ROOT + "/".join(("projects", project, *(part for part in parts if part)))


def scope_link(project: str, scope: tuple[str, str]) -> str:
    """The zone, region or (for "global") project URL of a scope."""
    kind, name = scope
    return link(project, kind, name) if kind != "global" else link(project, "global")


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def check_name(name: object, field: str = "resource.name") -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ComputeApiError(
            400,
            "invalid",
            f"Invalid value for field '{field}': '{name}'. Must be a match of regex "
            "'[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'",
        )
    return name


def check_request_id(request_id: str) -> str:
    """A request ID must be a UUID other than the zero UUID."""
    if not request_id:
        return ""
    try:
        parsed = uuid.UUID(request_id)
    except ValueError:
        parsed = None
    if parsed is None or parsed.int == 0:
        raise invalid(
            f"Invalid value for field 'requestId': '{request_id}'. The request ID must be a "
            "valid UUID with the exception that zero UUID is not supported "
            "(00000000-0000-0000-0000-000000000000).",
        )
    return request_id


@dataclass(frozen=True)
class Ref:
    """A reference to a resource: `projects/P/regions/R/resourcePolicies/N`, parsed."""

    project: str | None  # None in a partial URL without a project
    scope: tuple[str, str]  # ("zones", Z) | ("regions", R) | ("global", "")
    collection: str
    name: str


def parse_ref(value: object, field: str, collection: str) -> Ref:
    """A full or partial URL of a `collection` resource; a 400 naming `field` otherwise."""
    text = value if isinstance(value, str) else ""
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    parts = text.split("/")
    project: str | None = None
    if len(parts) >= 2 and parts[0] == "projects":
        project, parts = parts[1], parts[2:]
    scope: tuple[str, str] | None = None
    if len(parts) == 4 and parts[0] in ("zones", "regions"):
        scope, parts = (parts[0], parts[1]), parts[2:]
    elif len(parts) == 3 and parts[0] == "global":
        scope, parts = ("global", ""), parts[1:]
    if scope is None or len(parts) != 2 or parts[0] != collection or not NAME.match(parts[1]):
        raise invalid(
            f"Invalid value for field '{field}': '{value}'. The URL is malformed.",
        )
    return Ref(project, scope, collection, parts[1])
