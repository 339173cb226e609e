"""The order a parallel run starts tests in (tests/order.py's spread_slow_tests, which
tests/conftest.py applies): the known slow tests go to xdist's shares by their sum, each share
starts with its longest (the later shares after a part of a run of the rest) and has the others
spread by time over its first part, and no test is lost or run twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from tests.order import UNKNOWN_SECONDS, Durations, spread_slow_tests


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
    durations = Durations(slow={"t5": 90.0, "t50": 60.0, "t7": 30.0, "t8": 25.0, "t9": 9.0})
    ordered = cast(list[Any], spread_slow_tests(cast(list[Any], items), 3, durations, spread=0.5))
    assert sorted(item.nodeid for item in ordered) == sorted(item.nodeid for item in items)
    shares = _shares(ordered, 3)
    assert all(len(share) == 40 for share in shares)
    # 90 | 60 | 30, then 25 to the lightest (30 → 55), then 9 to the lightest again (→ 64).
    heads = [[nodeid for nodeid in share if nodeid in durations.slow] for share in shares]
    assert heads == [["t5"], ["t50"], ["t7", "t8", "t9"]]
    # Each share's first slow test is its longest: the first share starts with it, the second
    # after a third of one of its runs, the third after two thirds of one.
    assert UNKNOWN_SECONDS == 0.3  # what each of these tests is expected to take
    # Second share: 39 others, half their time (5.85 s) in 1 + 1/3 runs: 4.39 s each; a
    # third of that is 1.46 s, 5 tests.
    assert shares[1].index("t50") == 5
    # Third share: 37 others, 5.55 s in 3 + 2/3 runs of 1.51 s (6 tests), the first 1.01 s
    # (4 tests); the other 15 after them, which idle processes may steal, have no slow test.
    third = shares[2]
    assert [third.index(nodeid) for nodeid in heads[2]] == [4, 11, 18]
    assert not set(third[25:]) & set(durations.slow)
    assert shares[0][0] == "t5"
    # The rest keep their collected order.
    others = [nodeid for nodeid in third if nodeid not in durations.slow]
    assert others == sorted(others, key=lambda nodeid: int(nodeid[1:]))


def test_the_runs_between_slow_tests_are_cut_by_time_not_by_count() -> None:
    # As pytest-randomly leaves them: a module's tests together. a.py's take 0.01 s each,
    # b.py's 2 s: a run of equal time holds many of the one and few of the other.
    items = [Item(f"a.py::t{i}") for i in range(200)] + [Item(f"b.py::t{i}") for i in range(40)]
    items[100:100] = [Item("s.py::one"), Item("s.py::two"), Item("s.py::three")]
    durations = Durations(
        slow={"s.py::one": 30.0, "s.py::two": 20.0, "s.py::three": 10.0},
        modules={"a.py": 0.01, "b.py": 2.0},
    )
    ordered = [item.nodeid for item in spread_slow_tests(cast(list[Any], items), 1, durations)]
    assert sorted(ordered) == sorted(item.nodeid for item in items)
    # 240 others expected to take 82 s (mean 0.342 s): 0.8 of it, 65.6 s, in three runs of
    # 21.9 s: all 200 of a.py (2 s) and 10 of b.py (20 s) first, then 11 of b.py, then the
    # next 11. By count, each run would have been 64 tests, the first two all of a.py's.
    slow_at = [ordered.index(f"s.py::{name}") for name in ("one", "two", "three")]
    assert slow_at == [0, 211, 223]
    assert all(nodeid.startswith("b.py") for nodeid in ordered[212:223])


def test_without_durations_the_order_is_the_collected_one() -> None:
    items = [Item(f"t{i}") for i in range(10)]
    assert spread_slow_tests(cast(list[Any], items), 4, Durations()) == items


@dataclass(frozen=True)
class Marked:
    nodeid: str
    library: bool


def test_the_tests_picked_together_go_to_the_first_shares_only_and_start_them() -> None:
    items = [Marked(f"t{i}", library=i % 10 == 0) for i in range(120)]
    durations = Durations(slow={"t0": 50.0, "t3": 40.0, "t20": 30.0, "t30": 20.0, "t4": 10.0})
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
    # four, a load of 1.5 and 1.2 s), then the slow ones among them by load: t0 to the second
    # (→ 51.2), t20 and t30 to the first (→ 31.5 → 51.5). Each share's first slow test is its
    # longest, and its fast picked ones come right after it; only the first share has no run
    # of the rest before it.
    assert not picked & (set(shares[2]) | set(shares[3]))
    assert shares[0][0] == "t20" and "t30" in shares[0]
    second = shares[1].index("t0")
    assert second > 0 and not set(shares[1][:second]) & picked
    fast = sorted(picked - set(durations.slow), key=lambda nodeid: int(nodeid[1:]))
    assert shares[0][1:6] == fast[0::2] and shares[1][second + 1 : second + 5] == fast[1::2]
    assert "t3" in shares[2] and "t4" in shares[3]  # the others to the lightest of all
