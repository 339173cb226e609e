"""The emulator's google.cloud.location.Locations service (the zones it knows), and queued
resources in two zones of one project side by side, through the unmodified client."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.location import locations_pb2

from tests.emulator.helpers import create, delete, new_project, qr_request, unique
from tpuctl.emulator.client.testing import EmulatorProcess
from tpuctl.emulator.control.config import DEFAULT_ZONES

pytestmark = pytest.mark.emulator

# Ten emulated hours before they may start: they stay WAITING_FOR_RESOURCES, with no VMs.
LATER = {"valid_after_duration": datetime.timedelta(hours=10)}


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Any:
    return emulator.tpu_client()


def _request(**fields: Any) -> locations_pb2.ListLocationsRequest:
    return locations_pb2.ListLocationsRequest(**fields)


def test_list_locations_answers_the_known_zones_in_pages(client: Any) -> None:
    project = new_project()
    whole = client.list_locations(request=_request(name=f"projects/{project}"))
    assert [location.location_id for location in whole.locations] == list(DEFAULT_ZONES)
    assert {"us-central2-b", "europe-west4-a"} <= set(DEFAULT_ZONES)
    first = whole.locations[0]
    assert first.name == f"projects/{project}/locations/{first.location_id}"
    assert whole.next_page_token == ""

    pages, token = [], ""
    while True:
        page = client.list_locations(
            request=_request(name=f"projects/{project}", page_size=5, page_token=token)
        )
        pages.append([location.location_id for location in page.locations])
        token = page.next_page_token
        if not token:
            break
    assert [len(ids) for ids in pages][:-1] == [5] * (len(pages) - 1)
    assert [zone for ids in pages for zone in ids] == list(DEFAULT_ZONES)

    known = client.get_location(
        request=locations_pb2.GetLocationRequest(name=f"projects/{project}/locations/us-east5-a")
    )
    assert known.location_id == "us-east5-a"


def test_list_locations_refuses_what_it_cannot_answer(client: Any) -> None:
    with pytest.raises(exceptions.InvalidArgument, match="projects/PROJECT"):
        client.list_locations(request=_request(name="projects/p/locations/z"))
    with pytest.raises(exceptions.InvalidArgument, match="filter"):
        client.list_locations(request=_request(name="projects/p", filter="labels.a=b"))
    with pytest.raises(exceptions.NotFound):
        client.get_location(
            request=locations_pb2.GetLocationRequest(name="projects/p/locations/mars-north1-a")
        )


def test_two_zones_of_one_project_are_listed_apart(client: Any) -> None:
    project = new_project()
    here, there = (f"projects/{project}/locations/{zone}" for zone in DEFAULT_ZONES[:2])
    names = {}
    for parent in (here, there):
        qr_id = unique("qr")
        names[parent] = create(client, parent, qr_id, qr_request(parent, queueing_policy=LATER))
        names[parent] = names[parent].result(timeout=30).name
    try:
        for parent in (here, there):
            listed = client.list_queued_resources(parent=parent)
            assert [qr.name for qr in listed] == [names[parent]]
            assert client.get_queued_resource(name=names[parent]).name.startswith(parent + "/")
        everywhere = client.list_queued_resources(parent=f"projects/{project}/locations/-")
        assert sorted(qr.name for qr in everywhere) == sorted(names.values())
    finally:
        for name in names.values():
            delete(client, name, force=False)
