"""The order a parallel run starts tests in (tests/order.py's spread_slow_tests, which
tests/conftest.py applies): the known slow tests go to xdist's shares by their sum, each share
starts with its longest and has the others spread over its first part, and no test is lost or
run twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from tests.order import spread_slow_tests


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


def test_slow_tests_start_the_shares_and_are_spread_over_their_first_part() -> None:
    items = [Item(f"t{i}") for i in range(120)]
    durations = {"t5": 90.0, "t50": 60.0, "t7": 30.0, "t8": 25.0, "t9": 9.0}
    ordered = cast(list[Any], spread_slow_tests(cast(list[Any], items), 3, durations, spread=0.5))
    assert sorted(item.nodeid for item in ordered) == sorted(item.nodeid for item in items)
    shares = _shares(ordered, 3)
    assert all(len(share) == 40 for share in shares)
    # 90 | 60 | 30, then 25 to the lightest (30 → 55), then 9 to the lightest again (→ 64).
    heads = [[nodeid for nodeid in share if nodeid in durations] for share in shares]
    assert heads == [["t5"], ["t50"], ["t7", "t8", "t9"]]
    assert [share[0] for share in shares] == ["t5", "t50", "t7"]  # each starts with its longest
    # The third share's 37 others: half of them (18) between its three slow tests, 6 after
    # each, then the other 19, which idle processes may steal, with no slow test among them.
    third = shares[2]
    assert [third.index(nodeid) for nodeid in heads[2]] == [0, 7, 14]
    assert not set(third[21:]) & set(durations)
    # The rest keep their collected order.
    others = [nodeid for nodeid in third if nodeid not in durations]
    assert others == sorted(others, key=lambda nodeid: int(nodeid[1:]))


def test_without_durations_the_order_is_the_collected_one() -> None:
    items = [Item(f"t{i}") for i in range(10)]
    assert spread_slow_tests(cast(list[Any], items), 4, {}) == items


@dataclass(frozen=True)
class Marked:
    nodeid: str
    library: bool


def test_the_tests_picked_together_go_to_the_first_shares_only_and_start_them() -> None:
    items = [Marked(f"t{i}", library=i % 10 == 0) for i in range(120)]
    durations = {"t0": 50.0, "t3": 40.0, "t20": 30.0, "t30": 20.0, "t4": 10.0}
    ordered = cast(
        list[Any],
        spread_slow_tests(
            cast(list[Any], items),
            4,
            durations,
            together=lambda item: cast(Marked, item).library,
            together_shares=2,
        ),
    )
    assert sorted(item.nodeid for item in ordered) == sorted(item.nodeid for item in items)
    shares = _shares(ordered, 4)
    picked = {item.nodeid for item in items if item.library}
    # Every picked test is in the first two shares. The nine fast ones go in turn (five and
    # four, a load of about a second each), then the slow ones among them by load: t0 to the
    # second (4 → 54), t20 and t30 to the first (5 → 35 → 55). Each share starts with its
    # longest, then its fast picked ones.
    assert not picked & (set(shares[2]) | set(shares[3]))
    assert shares[0][0] == "t20" and shares[1][0] == "t0" and "t30" in shares[0]
    fast = sorted(picked - set(durations), key=lambda nodeid: int(nodeid[1:]))
    assert shares[0][1:6] == fast[0::2] and shares[1][1:5] == fast[1::2]
    assert "t3" in shares[2] and "t4" in shares[3]  # the others to the lightest of all
