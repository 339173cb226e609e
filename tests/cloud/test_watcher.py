"""The watcher as a pure state machine: poll schedule, deadlines and warnings on a fake clock."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from tpuctl.cloud.watcher import (
    GONE,
    Clock,
    Observation,
    Outcome,
    Watcher,
    WatchEvent,
    WatchPolicy,
    is_reached,
)

EPOCH = datetime(2030, 1, 1, tzinfo=timezone.utc)


class FakeTime:
    """Monotonic time that only moves when the watcher sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.t += seconds

    def clock(self) -> Clock:
        return Clock(
            monotonic=lambda: self.t,
            now=lambda: EPOCH + timedelta(seconds=self.t),
            sleep=self.sleep,
        )


def timeline(fake: FakeTime, steps: list[tuple[float, str]]) -> Callable[[], Observation]:
    """fetch() answering the state whose start time (seconds) is the latest not after now."""
    calls: list[float] = []

    def fetch() -> Observation:
        calls.append(fake.t)
        state = steps[0][1]
        for start, name in steps:
            if fake.t >= start:
                state = name
        return Observation(
            state=state, failure="capacity window ended" if state == "FAILED" else None
        )

    fetch.calls = calls  # type: ignore[attr-defined]
    return fetch


def run(
    steps: list[tuple[float, str]], policy: WatchPolicy, seed: int = 1
) -> tuple[Watcher, FakeTime, list[WatchEvent], list[float]]:
    fake = FakeTime()
    events: list[WatchEvent] = []
    fetch = timeline(fake, steps)
    watcher = Watcher(
        fetch, policy, clock=fake.clock(), on_event=events.append, rng=random.Random(seed)
    )
    watcher.result = watcher.run()  # type: ignore[attr-defined]
    return watcher, fake, events, fetch.calls  # type: ignore[attr-defined]


def max_calls_in_window(calls: list[float], start: float, window: float = 60.0) -> int:
    best = 0
    for index, first in enumerate(calls):
        if first < start:
            continue
        count = sum(1 for t in calls[index:] if t <= first + window)
        best = max(best, count)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_long_lived_state_never_exceeds_12_calls_a_minute(seed: int) -> None:
    steps = [(0.0, "CREATING"), (3.0, "WAITING_FOR_RESOURCES"), (900.0, "PROVISIONING")]
    steps.append((910.0, "ACTIVE"))
    watcher, _fake, _events, calls = run(steps, WatchPolicy(long_state_warning=10_000), seed)
    assert watcher.result.outcome is Outcome.REACHED  # type: ignore[attr-defined]
    entered = next(t for t in calls if t >= 3.0)
    # Every 60 s window from the first poll that saw WAITING_FOR_RESOURCES on, ramp included.
    waiting = [t for t in calls if 3.0 <= t < 900.0]
    assert max_calls_in_window(waiting, entered) <= 12
    # …and once settled it is at most 11 a minute (≥ 6 s apart), not a trickle either.
    settled = [t for t in waiting if t > entered + 30]
    gaps = [b - a for a, b in itertools.pairwise(settled)]
    assert min(gaps) >= 6.0
    assert max(gaps) <= 6.0 * 1.2 + 1e-9


def test_quick_polls_after_a_change_and_in_short_lived_states() -> None:
    steps = [(0.0, "CREATING"), (5.0, "PROVISIONING"), (40.0, "ACTIVE")]
    _watcher, _fake, events, calls = run(steps, WatchPolicy())
    provisioning = [t for t in calls if 5.0 <= t < 40.0]
    gaps = [b - a for a, b in itertools.pairwise(provisioning)]
    assert gaps and all(0.5 <= gap <= 1.0 for gap in gaps)
    # Noticed within one fast interval of each change.
    changes = {e.state: (e.at - EPOCH).total_seconds() for e in events if e.kind == "state"}
    assert changes["PROVISIONING"] - 5.0 <= 1.0
    assert changes["ACTIVE"] - 40.0 <= 1.0


def test_states_are_reported_once_each_in_order_with_utc_timestamps() -> None:
    steps = [(0.0, "CREATING"), (2.0, "WAITING_FOR_RESOURCES"), (30.0, "PROVISIONING")]
    steps.append((60.0, "ACTIVE"))
    watcher, _fake, events, _calls = run(steps, WatchPolicy())
    changes = [(e.previous, e.state) for e in events if e.kind == "state"]
    assert changes == [
        (None, "CREATING"),
        ("CREATING", "WAITING_FOR_RESOURCES"),
        ("WAITING_FOR_RESOURCES", "PROVISIONING"),
        ("PROVISIONING", "ACTIVE"),
    ]
    result = watcher.result  # type: ignore[attr-defined]
    assert [t.state for t in result.transitions] == [c[1] for c in changes]
    assert all(t.at.tzinfo is timezone.utc for t in result.transitions)


def test_queue_deadline_fires_on_time_and_only_in_queueing_states() -> None:
    steps = [(0.0, "CREATING"), (1.0, "WAITING_FOR_RESOURCES")]
    watcher, fake, _events, _calls = run(steps, WatchPolicy(queue_timeout=120.0))
    result = watcher.result  # type: ignore[attr-defined]
    assert result.outcome is Outcome.QUEUE_DEADLINE
    assert result.state == "WAITING_FOR_RESOURCES"
    # Clipped sleep: it gives up at the deadline, not up to one slow interval later.
    assert 120.0 <= fake.t <= 120.5


def test_queue_deadline_does_not_cut_provisioning_short() -> None:
    # 100 s of queueing against a 120 s queue deadline, then a 60 s provisioning that must be
    # allowed its own (separate) 90 s budget.
    steps = [(0.0, "WAITING_FOR_RESOURCES"), (100.0, "PROVISIONING"), (160.0, "ACTIVE")]
    policy = WatchPolicy(queue_timeout=120.0, provision_timeout=90.0)
    watcher, _fake, _events, _calls = run(steps, policy)
    assert watcher.result.outcome is Outcome.REACHED  # type: ignore[attr-defined]


def test_provision_deadline_is_separate_from_the_queue_deadline() -> None:
    steps = [(0.0, "WAITING_FOR_RESOURCES"), (100.0, "PROVISIONING")]
    policy = WatchPolicy(queue_timeout=120.0, provision_timeout=30.0)
    watcher, fake, _events, _calls = run(steps, policy)
    result = watcher.result  # type: ignore[attr-defined]
    assert result.outcome is Outcome.PROVISION_DEADLINE
    assert result.state == "PROVISIONING"
    first_provisioning_poll = min(t for t in fake_calls(watcher) if t >= 100.0)
    assert fake.t == pytest.approx(first_provisioning_poll + 30.0, abs=0.01)


def fake_calls(watcher: Watcher) -> list[float]:
    return list(watcher.fetch.calls)  # type: ignore[attr-defined]


def test_failed_and_suspended_and_gone_end_the_wait() -> None:
    failed, *_ = run([(0.0, "WAITING_FOR_RESOURCES"), (10.0, "FAILED")], WatchPolicy())
    assert failed.result.outcome is Outcome.FAILED  # type: ignore[attr-defined]
    assert failed.result.observation.failure == "capacity window ended"  # type: ignore[attr-defined]
    suspended, *_ = run([(0.0, "PROVISIONING"), (5.0, "SUSPENDING")], WatchPolicy())
    assert suspended.result.outcome is Outcome.SUSPENDED  # type: ignore[attr-defined]
    gone, *_ = run([(0.0, "WAITING_FOR_RESOURCES"), (5.0, GONE)], WatchPolicy())
    assert gone.result.outcome is Outcome.GONE  # type: ignore[attr-defined]


def test_waiting_for_suspended_or_deleted_is_not_an_error() -> None:
    suspended, *_ = run(
        [(0.0, "ACTIVE"), (5.0, "SUSPENDING"), (9.0, "SUSPENDED")],
        WatchPolicy(until="SUSPENDED"),
    )
    assert suspended.result.outcome is Outcome.REACHED  # type: ignore[attr-defined]
    gone, *_ = run([(0.0, "DELETING"), (4.0, GONE)], WatchPolicy(until=GONE))
    assert gone.result.outcome is Outcome.REACHED  # type: ignore[attr-defined]


def test_fifteen_minute_warning_fires_once_per_wait() -> None:
    steps = [(0.0, "WAITING_FOR_RESOURCES"), (2000.0, "PROVISIONING"), (3000.0, "ACTIVE")]
    watcher, _fake, events, _calls = run(steps, WatchPolicy())
    warnings = [e for e in events if e.kind == "warning"]
    assert len(warnings) == 1
    assert warnings[0].state == "WAITING_FOR_RESOURCES"
    assert 900.0 <= warnings[0].in_state <= 900.0 + 7.2
    assert "support" in warnings[0].message
    assert watcher.result.warnings == [warnings[0].message]  # type: ignore[attr-defined]


def test_no_warning_before_fifteen_minutes() -> None:
    steps = [(0.0, "WAITING_FOR_RESOURCES"), (880.0, "ACTIVE")]
    _watcher, _fake, events, _calls = run(steps, WatchPolicy())
    assert not [e for e in events if e.kind == "warning"]


def test_overall_deadline() -> None:
    watcher, fake, _events, _calls = run(
        [(0.0, "DELETING")], WatchPolicy(until=GONE, overall_timeout=10)
    )
    assert watcher.result.outcome is Outcome.DEADLINE  # type: ignore[attr-defined]
    assert fake.t == pytest.approx(10.0, abs=0.01)


def test_last_observation_is_kept_for_interrupt_reports() -> None:
    fake = FakeTime()
    polls = 0

    def fetch() -> Observation:
        nonlocal polls
        polls += 1
        if polls == 3:
            raise KeyboardInterrupt
        return Observation("WAITING_FOR_RESOURCES")

    watcher = Watcher(fetch, WatchPolicy(), clock=fake.clock())
    with pytest.raises(KeyboardInterrupt):
        watcher.run()
    assert watcher.last == Observation("WAITING_FOR_RESOURCES")


def test_until_progression() -> None:
    assert is_reached("WAITING_FOR_RESOURCES", "ACTIVE")
    assert is_reached("PROVISIONING", "ACTIVE")
    assert not is_reached("ACTIVE", "PROVISIONING")
    assert not is_reached("ACTIVE", "SUSPENDED")
    with pytest.raises(ValueError, match="unknown target"):
        WatchPolicy(until="RUNNING")
