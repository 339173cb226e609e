"""Both APIs behind one face (tpuctl.cloud.either): a name is Cloud TPU's, else Compute
Engine's; a listing holds both, and a Compute Engine side that cannot be listed is said, never
hiding the queued resources."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions

from tpuctl.cloud.either import EitherTpuClient


class Side:
    """A client answering `get_queued_resource` from `names` and listing `listed` (or
    raising `error` for everything)."""

    def __init__(self, names: set[str], error: Exception | None = None) -> None:
        self.names = names
        self.error = error

    def get_queued_resource(self, name: str, **_: Any) -> str:
        if self.error is not None:
            raise self.error
        if name not in self.names:
            raise exceptions.NotFound(f"{name} not found")  # type: ignore[no-untyped-call]
        return name

    def list_queued_resources(self, parent: str, **_: Any) -> list[str]:
        if self.error is not None:
            raise self.error
        return sorted(self.names)

    def list_locations(self, **_: Any) -> list[str]:
        return ["us-central2-b"]


def test_a_name_is_cloud_tpu_s_else_compute_engine_s() -> None:
    either = EitherTpuClient(Side({"qr"}), Side({"vm"}))
    assert either.get_queued_resource(name="qr") == "qr"
    assert either.get_queued_resource(name="vm") == "vm"
    with pytest.raises(exceptions.NotFound, match="neither"):
        either.get_queued_resource(name="neither")
    # Everything else is the Cloud TPU API's.
    assert either.list_locations() == ["us-central2-b"]


def test_compute_engine_closed_to_the_caller_leaves_cloud_tpu_s_answer() -> None:
    denied = exceptions.Forbidden("compute.instances.get denied")  # type: ignore[no-untyped-call]
    said: list[str] = []
    either = EitherTpuClient(Side({"qr"}), Side(set(), denied), on_error=said.append)
    with pytest.raises(exceptions.NotFound, match="missing"):
        either.get_queued_resource(name="missing")
    assert either.list_queued_resources(parent="p") == ["qr"]
    assert said and "compute.instances.get denied" in said[0]


def test_a_listing_holds_both() -> None:
    either = EitherTpuClient(Side({"qr"}), Side({"vm", "mig"}))
    assert either.list_queued_resources(parent="p") == ["qr", "mig", "vm"]
