"""Compute Engine v1 over REST: the methods tpuctl calls, answered as the API's JSON.

google-cloud-compute answers the same calls, but importing it took about a second of CPU
(every service and message of Compute Engine), which `tpuctl list`, `gc` and every command on
a `tpu.api: compute` spec paid before its first request. Each method here is a path of the
compute v1 discovery document (tests/cloud/test_compute_http.py checks every one against the
document google-api-python-client ships), sent through google-auth's AuthorizedSession, and
an error is the google.api_core exception of its HTTP status, as google-cloud-compute raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

COMPUTE_API = "https://compute.googleapis.com"
# Connect, then read: a request never waits for ever (google-cloud-compute sets none).
TIMEOUT = (20.0, 120.0)

# (collection, method) → (HTTP verb, path under compute/v1/, what a list's page holds the
# items in). Path parameters are the discovery document's names; a call names them in
# snake_case (`instance_group_manager`), as google-cloud-compute's keywords do.
METHODS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("instances", "get"): ("GET", "projects/{project}/zones/{zone}/instances/{instance}", ""),
    ("instances", "list"): ("GET", "projects/{project}/zones/{zone}/instances", "items"),
    ("instances", "insert"): ("POST", "projects/{project}/zones/{zone}/instances", ""),
    ("instances", "delete"): ("DELETE", "projects/{project}/zones/{zone}/instances/{instance}", ""),
    ("instances", "getGuestAttributes"): (
        "GET",
        "projects/{project}/zones/{zone}/instances/{instance}/getGuestAttributes",
        "",
    ),
    ("instances", "setMetadata"): (
        "POST",
        "projects/{project}/zones/{zone}/instances/{instance}/setMetadata",
        "",
    ),
    ("instances", "simulateMaintenanceEvent"): (
        "POST",
        "projects/{project}/zones/{zone}/instances/{instance}/simulateMaintenanceEvent",
        "",
    ),
    ("instanceGroupManagers", "get"): (
        "GET",
        "projects/{project}/zones/{zone}/instanceGroupManagers/{instanceGroupManager}",
        "",
    ),
    ("instanceGroupManagers", "list"): (
        "GET",
        "projects/{project}/zones/{zone}/instanceGroupManagers",
        "items",
    ),
    ("instanceGroupManagers", "listManagedInstances"): (
        "POST",
        "projects/{project}/zones/{zone}/instanceGroupManagers/{instanceGroupManager}"
        "/listManagedInstances",
        "managedInstances",
    ),
    ("instanceGroupManagers", "insert"): (
        "POST",
        "projects/{project}/zones/{zone}/instanceGroupManagers",
        "",
    ),
    ("instanceGroupManagers", "delete"): (
        "DELETE",
        "projects/{project}/zones/{zone}/instanceGroupManagers/{instanceGroupManager}",
        "",
    ),
    ("regionInstanceGroupManagers", "insert"): (
        "POST",
        "projects/{project}/regions/{region}/instanceGroupManagers",
        "",
    ),
    ("instanceTemplates", "get"): (
        "GET",
        "projects/{project}/global/instanceTemplates/{instanceTemplate}",
        "",
    ),
    ("instanceTemplates", "insert"): ("POST", "projects/{project}/global/instanceTemplates", ""),
    ("instanceTemplates", "delete"): (
        "DELETE",
        "projects/{project}/global/instanceTemplates/{instanceTemplate}",
        "",
    ),
    ("regionInstanceTemplates", "get"): (
        "GET",
        "projects/{project}/regions/{region}/instanceTemplates/{instanceTemplate}",
        "",
    ),
    ("regionInstanceTemplates", "insert"): (
        "POST",
        "projects/{project}/regions/{region}/instanceTemplates",
        "",
    ),
    ("regionInstanceTemplates", "delete"): (
        "DELETE",
        "projects/{project}/regions/{region}/instanceTemplates/{instanceTemplate}",
        "",
    ),
    ("resourcePolicies", "insert"): (
        "POST",
        "projects/{project}/regions/{region}/resourcePolicies",
        "",
    ),
    ("resourcePolicies", "delete"): (
        "DELETE",
        "projects/{project}/regions/{region}/resourcePolicies/{resourcePolicy}",
        "",
    ),
    ("zoneOperations", "get"): (
        "GET",
        "projects/{project}/zones/{zone}/operations/{operation}",
        "",
    ),
    ("zoneOperations", "list"): ("GET", "projects/{project}/zones/{zone}/operations", "items"),
    ("zoneOperations", "delete"): (
        "DELETE",
        "projects/{project}/zones/{zone}/operations/{operation}",
        "",
    ),
    ("regionOperations", "get"): (
        "GET",
        "projects/{project}/regions/{region}/operations/{operation}",
        "",
    ),
    ("globalOperations", "get"): ("GET", "projects/{project}/global/operations/{operation}", ""),
    ("machineTypes", "get"): (
        "GET",
        "projects/{project}/zones/{zone}/machineTypes/{machineType}",
        "",
    ),
    ("images", "get"): ("GET", "projects/{project}/global/images/{image}", ""),
    ("images", "getFromFamily"): ("GET", "projects/{project}/global/images/family/{family}", ""),
    ("reservations", "get"): (
        "GET",
        "projects/{project}/zones/{zone}/reservations/{reservation}",
        "",
    ),
}
_FIELD = re.compile(r"\{(\w+)\}")
# A link's scope and kind → the collection that serves it, where the name differs by scope.
SCOPED = {
    ("zones", "operations"): "zoneOperations",
    ("regions", "operations"): "regionOperations",
    ("global", "operations"): "globalOperations",
    ("regions", "instanceTemplates"): "regionInstanceTemplates",
    ("regions", "instanceGroupManagers"): "regionInstanceGroupManagers",
}


def camel(name: str) -> str:
    """`instance_group_manager` → `instanceGroupManager` (already camel: unchanged)."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def at(link: str) -> tuple[str, dict[str, str]]:
    """What a resource's link (`…/projects/P/{zones/Z|regions/R|global}/KIND/NAME`) names: the
    collection whose methods take it, and their keywords (project, zone or region, the name
    under the parameter name its paths give it)."""
    parts = link.split("/")
    rest = parts[parts.index("projects") + 1 :] if "projects" in parts else []
    if len(rest) < 4:
        raise ValueError(f"not a Compute Engine resource link: {link!r}")
    keys = {"project": rest[0]}
    if rest[1] == "global":
        scope, (kind, name) = "global", rest[2:4]
    else:
        if len(rest) < 5:
            raise ValueError(f"not a Compute Engine resource link: {link!r}")
        scope, (kind, name) = rest[1], rest[3:5]
        keys[scope.removesuffix("s")] = rest[2]
    collection = SCOPED.get((scope, kind), kind)
    [parameter] = {
        _FIELD.findall(path)[-1]
        for (served, _), (_, path, _) in METHODS.items()
        if served == collection and path.endswith("}")
    }
    keys[parameter] = name
    return collection, keys


class ComputeRest:
    """Compute Engine v1 at `endpoint` (None: compute.googleapis.com) with `credentials`."""

    def __init__(self, credentials: Any, endpoint: str | None = None) -> None:
        self.base = f"{(endpoint or COMPUTE_API).rstrip('/')}/compute/v1/"
        self.credentials = credentials
        self._session: Any = None

    def call(self, collection: str, method: str, body: Any = None, **params: Any) -> dict[str, Any]:
        """One request: path parameters and query parameters by keyword (snake_case or the
        API's camelCase), `body` the resource sent as JSON. The answer's JSON; an HTTP error
        raises google.api_core's exception for its status."""
        verb, template, _ = METHODS[(collection, method)]
        return self._send(verb, *self._url(template, params), body)

    def list(self, collection: str, method: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a list method, page after page."""
        verb, template, key = METHODS[(collection, method)]
        url, query = self._url(template, params)
        while True:
            page = self._send(verb, url, query, None)
            yield from page.get(key) or []
            token = page.get("nextPageToken")
            if not token:
                return
            query = {**query, "pageToken": token}

    def _url(self, template: str, params: dict[str, Any]) -> tuple[str, dict[str, str]]:
        values = {camel(key): value for key, value in params.items() if value is not None}
        missing = [name for name in _FIELD.findall(template) if name not in values]
        if missing:
            raise TypeError(f"{template}: no value for {', '.join(missing)}")
        path = _FIELD.sub(lambda m: quote(str(values.pop(m.group(1))), safe=""), template)
        return self.base + path, {key: str(value) for key, value in values.items()}

    def _send(self, verb: str, url: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        from google.api_core import exceptions

        if self._session is None:
            from google.auth.transport.requests import AuthorizedSession

            self._session = AuthorizedSession(self.credentials)  # type: ignore[no-untyped-call]
        response = self._session.request(verb, url, params=query, json=body, timeout=TIMEOUT)
        if response.status_code >= 400:
            raise exceptions.from_http_response(response)  # type: ignore[no-untyped-call]
        if not response.content:
            return {}
        data: dict[str, Any] = response.json()
        return data
