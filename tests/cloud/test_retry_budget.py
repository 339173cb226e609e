"""TPUCTL_API_RETRY_SECONDS bounds a call as a whole: a TPU API that hangs gets no attempt
whose deadline reaches past the budget (the per-call timeout only caps each attempt), so a
10 s budget gives up after 10 s, not after a 30 s attempt and its retries.

A fake Tpu service that never answers stands in for a hung API (the emulator answers or fails,
it does not hang): it records the deadline each attempt arrives with, which is what the client
promised to wait, so nothing here measures how long the call took."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tpuctl.cloud.client import TpuApi, connect
from tpuctl.cloud.resolve import Location
from tpuctl.errors import ApiUnavailableError


@dataclass
class HungTpu:
    """GetQueuedResource never answers: each attempt is recorded as (arrival on this
    machine's monotonic clock, seconds its deadline leaves), then held until that deadline."""

    attempts: list[tuple[float, float]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def get(self, request: Any, context: Any) -> Any:
        remaining = context.time_remaining()
        self.attempts.append((time.monotonic(), remaining))
        self.release.wait(timeout=remaining + 1.0)  # past it: the client gives up first
        return None


@pytest.fixture
def hung() -> Iterator[tuple[HungTpu, str]]:
    """The hung service on 127.0.0.1; yields (its record, its host:port)."""
    from concurrent import futures

    import grpc
    from google.cloud.tpu_v2alpha1.types import cloud_tpu

    fake = HungTpu()
    handler = grpc.unary_unary_rpc_method_handler(
        fake.get,
        request_deserializer=cloud_tpu.GetQueuedResourceRequest.deserialize,
        response_serializer=cloud_tpu.QueuedResource.serialize,
    )
    service = grpc.method_handlers_generic_handler(
        "google.cloud.tpu.v2alpha1.Tpu", {"GetQueuedResource": handler}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers([service])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        fake.release.set()
        server.stop(grace=None)


def api_for(host: str, budget: float) -> TpuApi:
    environ = {"TPU_EMULATOR_HOST": host, "TPUCTL_API_RETRY_SECONDS": str(budget)}
    return connect(Location("p", "us-central2-b"), environ=environ)


def test_a_hung_api_call_never_waits_past_the_retry_budget(hung: tuple[HungTpu, str]) -> None:
    fake, host = hung
    budget = 1.5
    api = api_for(host, budget)
    assert api.rpc_timeout > budget * 10  # the per-call timeout alone would wait far longer
    started = time.monotonic()
    with pytest.raises(ApiUnavailableError) as raised:
        api.get_queued_resource("job")
    assert "DeadlineExceeded" in raised.value.message or "DEADLINE" in raised.value.message
    assert fake.attempts
    for arrival, remaining in fake.attempts:
        # Every attempt's deadline falls inside the budget counted from the call's start
        # (0.5 s of slack for the time a request takes to arrive on a loaded machine).
        assert arrival - started + remaining <= budget + 0.5, fake.attempts


def test_a_budget_of_zero_still_gets_one_attempt_of_the_per_call_timeout(
    hung: tuple[HungTpu, str],
) -> None:
    """0 means no retries, not no time: the one attempt keeps the per-call timeout."""
    fake, host = hung
    api = api_for(host, 0.0)
    api = TpuApi(api.client, api.location, retry_total=0.0, rpc_timeout=1.0)
    with pytest.raises(ApiUnavailableError):
        api.get_queued_resource("job")
    [(_arrival, remaining)] = fake.attempts
    # gRPC carries the deadline rounded up to its timer's resolution: a few ms over 1 s.
    assert 0.5 < remaining <= 1.05
