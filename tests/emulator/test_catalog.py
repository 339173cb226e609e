"""The emulator's accelerator types, runtime versions and reservations, through the unmodified
google-cloud-tpu client: pages, names, NOT_FOUND and the admin-made reservations."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions

from tests.harness import unique

PARENT_ZONE = "us-central2-b"


def test_accelerator_types_and_runtime_versions(emulator: Any) -> None:
    client = emulator.tpu_client()
    parent = f"projects/{unique('catalog')}/locations/{PARENT_ZONE}"
    first = client.list_accelerator_types(request={"parent": parent, "page_size": 5})
    page = next(iter(first.pages))
    assert len(page.accelerator_types) == 5 and page.next_page_token
    types = {
        item.type_: item
        for item in client.list_accelerator_types(request={"parent": parent, "page_size": 1000})
    }
    assert {"v4-8", "v4-16", "v5p-8", "v5litepod-16", "v6e-8", "v2-8"} <= set(types)
    v5e = types["v5litepod-16"]
    assert v5e.name == f"{parent}/acceleratorTypes/v5litepod-16"
    assert [(c.type_.name, c.topology) for c in v5e.accelerator_configs] == [("V5LITE_POD", "4x4")]
    got = client.get_accelerator_type(name=f"{parent}/acceleratorTypes/v4-16")
    assert [c.topology for c in got.accelerator_configs] == ["2x2x2"]
    with pytest.raises(exceptions.NotFound):
        client.get_accelerator_type(name=f"{parent}/acceleratorTypes/v4-12")

    versions = [item.version for item in client.list_runtime_versions(request={"parent": parent})]
    assert {
        "tpu-ubuntu2204-base",
        "v2-alpha-tpuv5",
        "v2-alpha-tpuv5-lite",
        "v2-alpha-tpuv6e",
    } <= set(versions)
    name = f"{parent}/runtimeVersions/v2-alpha-tpuv6e"
    assert client.get_runtime_version(name=name).version == "v2-alpha-tpuv6e"
    with pytest.raises(exceptions.NotFound):
        client.get_runtime_version(name=f"{parent}/runtimeVersions/tpu-ubuntu2204-bsae")
    with pytest.raises(exceptions.InvalidArgument):
        client.list_runtime_versions(request={"parent": "projects/x"})


def test_reservations_come_from_the_admin_service(emulator: Any) -> None:
    client = emulator.tpu_client()
    parent = f"projects/{unique('catalog')}/locations/{PARENT_ZONE}"
    assert list(client.list_reservations(request={"parent": parent})) == []
    name = f"{parent}/reservations/pool"
    emulator.admin.reservation(name, chips=256, generation="v5e", state="PROVISIONING")
    try:
        [listed] = client.list_reservations(request={"parent": parent})
        assert listed.name == name and listed.state.name == "PROVISIONING"
        assert (listed.standard.size, listed.standard.capacity_units.name) == (256, "CHIPS")
        assert listed.standard.resource_type == "v5e"
        other_zone = parent.replace(PARENT_ZONE, "europe-west4-a")
        assert list(client.list_reservations(request={"parent": other_zone})) == []
    finally:
        emulator.admin.reservation(name, remove=True)
    assert list(client.list_reservations(request={"parent": parent})) == []
