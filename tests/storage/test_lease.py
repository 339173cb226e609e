"""The run's lease: one tpuctl up at a time, on a local directory and on Cloud Storage (a real
fake-gcs-server), with a fake clock for staleness."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.jobs.fakes import FakeClock
from tpuctl.storage.lease import STALE_AFTER, Lease, LeaseHeld, LeaseLost
from tpuctl.storage.locations import open_location
from tpuctl.storage.storage import Storage

MakeStorage = Callable[[], Storage]


@pytest.fixture(params=["local", "gcs"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_location(str(tmp_path / "runs" / "demo"))
    bucket = request.getfixturevalue("gcs_bucket")
    return open_location(f"gs://{bucket}/runs/demo")


def _lease(storage: Storage, time: FakeClock, command: str) -> Lease:
    return Lease(storage, "lease.json", command=command, clock=time.clock(), hostname="laptop")


def test_one_holder_at_a_time_and_a_dead_one_is_taken_over(storage: Storage) -> None:
    time = FakeClock()
    first = _lease(storage, time, "tpuctl up a.yaml")
    assert first.acquire() is None and first.held
    second = _lease(storage, time, "tpuctl up a.yaml (CI)")
    with pytest.raises(LeaseHeld) as raised:
        second.acquire()
    assert "'tpuctl up a.yaml' on laptop" in raised.value.message
    assert "last heartbeat just now" in raised.value.message
    # The first renews (every 30 s), so it stays fresh...
    for _ in range(10):
        time.sleep(30)
        first.renew_if_due()
    with pytest.raises(LeaseHeld):
        second.acquire()
    # ...until it dies: once its heartbeat is stale, the second takes over and says from whom.
    time.sleep(STALE_AFTER + 1)
    previous = second.acquire()
    assert previous is not None and previous.command == "tpuctl up a.yaml"
    # The first, alive after all, finds out at its next heartbeat and stops.
    with pytest.raises(LeaseLost) as lost:
        first.renew_if_due()
    assert "taken over by 'tpuctl up a.yaml (CI)'" in lost.value.message
    first.release()  # not ours any more: leaves the second's lease alone
    found = storage.read_versioned("lease.json")
    assert found is not None and json.loads(found[0])["command"] == "tpuctl up a.yaml (CI)"
    second.release()
    assert storage.read_versioned("lease.json") is None


def test_waiting_for_the_lease_takes_it_when_the_holder_lets_go(storage: Storage) -> None:
    time = FakeClock()
    holder = _lease(storage, time, "tpuctl up first")
    holder.acquire()
    time.at(100, holder.release)
    waiter = _lease(storage, time, "tpuctl up second")
    seen: list[str] = []
    assert waiter.acquire(wait=True, on_wait=lambda h: seen.append(h.command)) is None
    assert waiter.held and seen and set(seen) == {"tpuctl up first"}
    assert 100 <= time.t < 100 + 30


def test_a_lease_file_that_is_not_ours_to_read_counts_as_stale(storage: Storage) -> None:
    """A lease file someone wrote by hand (not JSON) is taken over, not an error."""
    storage.write_text("lease.json", "not json")
    taken = _lease(storage, FakeClock(), "tpuctl up").acquire()
    assert taken is not None and taken.host == "?" and taken.heartbeat is None
