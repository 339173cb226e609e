"""The order a parallel run starts tests in (tests/conftest.py's slow_first): the longest
tests start xdist's shares, the other known slow ones sit a third of the way in, and no test
is lost or run twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from tests.conftest import HEAD_SECONDS, slow_first


@dataclass(frozen=True)
class Item:
    nodeid: str


def _shares(ordered: list[Any], workers: int) -> list[list[str]]:
    """The contiguous shares xdist's worksteal scheduler hands out at the start."""
    shares, start, remaining = [], 0, len(ordered)
    for share in range(workers):
        size = remaining // (workers - share)
        remaining -= size
        shares.append([item.nodeid for item in ordered[start : start + size]])
        start += size
    return shares


def test_the_longest_start_the_shares_and_the_other_slow_ones_come_a_third_in() -> None:
    items = [Item(f"t{i}") for i in range(120)]
    durations = {"t5": 90.0, "t50": HEAD_SECONDS, "t7": 30.0, "t8": 20.0, "t9": 9.0}
    ordered = cast(list[Any], slow_first(cast(list[Any], items), 3, durations))
    assert sorted(item.nodeid for item in ordered) == sorted(item.nodeid for item in items)
    shares = _shares(ordered, 3)
    assert [share[0] for share in shares[:2]] == ["t5", "t50"]
    assert shares[2][0] not in durations  # no long test for it: it starts computing
    for share in shares:
        for position, nodeid in enumerate(share):
            if nodeid in durations and durations[nodeid] < HEAD_SECONDS:
                assert len(share) // 4 <= position <= len(share) // 2, (nodeid, share)
    # The middles are dealt by their sum: the share without a long test takes the longest.
    assert "t7" in shares[2]


def test_without_durations_the_order_is_the_collected_one() -> None:
    items = [Item(f"t{i}") for i in range(10)]
    assert slow_first(cast(list[Any], items), 4, {}) == items
