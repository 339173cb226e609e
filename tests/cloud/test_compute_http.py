"""tpuctl.cloud.compute_http: every method is the compute v1 discovery document's (verb, path,
where a list's items are), and a call builds its URL, query and body, follows pages and
raises google.api_core's exception for an HTTP error. The calls against a server are in
tests/cloud/test_compute_backend.py and the end-to-end runs."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions

from tpuctl.cloud.compute_http import METHODS, ComputeRest, at, camel


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


@cache
def _discovery() -> dict[str, Any]:
    try:
        import googleapiclient
    except ImportError:
        pytest.skip("google-api-python-client (the test extra) is not installed")
    path = Path(googleapiclient.__file__).parent / "discovery_cache/documents/compute.v1.json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.mark.parametrize("key", sorted(METHODS), ids=".".join)
def test_each_method_is_the_discovery_documents(key: tuple[str, str]) -> None:
    collection, method = key
    verb, path, items = METHODS[key]
    document = _discovery()
    described = document["resources"][collection]["methods"][method]
    assert (described["httpMethod"], described["path"]) == (verb, path)
    if items:
        schema = document["schemas"][described["response"]["$ref"]]
        assert schema["properties"][items]["type"] == "array"
        assert "nextPageToken" in schema["properties"]


class _Session:
    """Answers each request with the next (status, JSON) and records what was sent."""

    def __init__(self, *answers: tuple[int, dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str, dict[str, str], Any]] = []

    def request(self, verb: str, url: str, *, params: Any, json: Any, timeout: Any) -> Any:
        self.sent.append((verb, url, dict(params), json))
        status, body = self.answers.pop(0)
        response = requests.Response()
        response.status_code = status
        response._content = b"" if body is None else _dumps(body)
        response.request = requests.Request(verb, url).prepare()
        return response


def _rest(*answers: tuple[int, Any]) -> tuple[ComputeRest, _Session]:
    rest = ComputeRest(credentials=None, endpoint="http://127.0.0.1:9/")
    session = _Session(*answers)
    rest._session = session
    return rest, session


def test_a_call_fills_the_path_sends_the_rest_as_query_and_the_body_as_json() -> None:
    rest, session = _rest((200, {"kind": "compute#operation", "name": "op-1"}))
    body = {"fingerprint": "abc", "items": [{"key": "ssh-keys", "value": "u:ssh-ed25519 K"}]}
    answer = rest.call(
        "instances", "setMetadata", body=body, project="p", zone="us-east5-a",
        instance="a b/c", request_id="r-1",
    )  # fmt: skip
    assert answer["name"] == "op-1"
    [(verb, url, query, sent)] = session.sent
    assert verb == "POST"
    assert url == (
        "http://127.0.0.1:9/compute/v1/projects/p/zones/us-east5-a/instances/a%20b%2Fc/setMetadata"
    )
    assert query == {"requestId": "r-1"} and sent == body


def test_a_list_follows_every_page() -> None:
    rest, session = _rest(
        (200, {"items": [{"name": "a"}], "nextPageToken": "t1"}),
        (200, {"items": [{"name": "b"}]}),
    )
    listed = rest.list(
        "zoneOperations", "list", project="p", zone="z", filter="operationType = insert"
    )
    names = [item["name"] for item in listed]
    assert names == ["a", "b"]
    assert [query for _, _, query, _ in session.sent] == [
        {"filter": "operationType = insert"},
        {"filter": "operationType = insert", "pageToken": "t1"},
    ]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(404, exceptions.NotFound), (409, exceptions.Conflict), (412, exceptions.PreconditionFailed)],
)
def test_an_http_error_is_google_api_cores_exception(status: int, kind: type) -> None:
    rest, _ = _rest((status, {"error": {"code": status, "message": "the reason"}}))
    with pytest.raises(kind, match="the reason"):
        rest.call("instances", "get", project="p", zone="z", instance="i")


def test_a_missing_path_value_is_said_before_anything_is_sent() -> None:
    rest, session = _rest()
    with pytest.raises(TypeError, match="instance"):
        rest.call("instances", "get", project="p", zone="z")
    assert session.sent == []


def test_snake_case_keywords_become_the_apis_names() -> None:
    assert camel("instance_group_manager") == "instanceGroupManager"
    assert camel("queryPath") == "queryPath"


@pytest.mark.parametrize(
    ("link", "collection", "keys"),
    [
        (
            "https://compute.googleapis.com/compute/v1/projects/p/zones/z/operations/op-1",
            "zoneOperations",
            {"project": "p", "zone": "z", "operation": "op-1"},
        ),
        ("projects/p/regions/r/operations/op-2", "regionOperations",
         {"project": "p", "region": "r", "operation": "op-2"}),
        ("projects/p/global/operations/op-3", "globalOperations",
         {"project": "p", "operation": "op-3"}),
        ("projects/p/global/instanceTemplates/t", "instanceTemplates",
         {"project": "p", "instance_template": "t"}),
        ("projects/p/regions/r/instanceTemplates/t", "regionInstanceTemplates",
         {"project": "p", "region": "r", "instance_template": "t"}),
        ("projects/p/regions/r/resourcePolicies/w", "resourcePolicies",
         {"project": "p", "region": "r", "resource_policy": "w"}),
    ],
)  # fmt: skip
def test_a_link_names_its_collection_and_keywords(
    link: str, collection: str, keys: dict[str, str]
) -> None:
    """What a deletion or an operation poll sends: the link's own collection and keywords."""
    found, got = at(link)
    assert found == collection
    assert {k: v for k, v in got.items()} == {camel(k): v for k, v in keys.items()}
    rest, session = _rest((200, {}))
    rest.call(found, "delete" if "operations" not in link else "get", **got)
    [(_, url, _, _)] = session.sent
    assert url.endswith(link.rsplit("/compute/v1/", maxsplit=1)[-1])


def test_a_link_that_names_no_resource_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Compute Engine resource link"):
        at("projects/p/zones/z")
