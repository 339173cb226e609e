"""The order a parallel run starts tests in: the known slow ones spread over each share
(tests/conftest.py applies it after collection). No side effects on import, so
tests/test_order.py can import it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import pytest

# Wall seconds from a parallel run (`scripts/slowest-tests --durations` rewrites it): "slow",
# each test that took 8 s or more; "modules", the mean of each module's other tests. xdist's
# work stealing gives each process a contiguous share of the collected order. The known slow
# tests go to the shares by their sum; each share starts with its longest, so none of them
# starts last and holds up the run's end. They mostly wait on their emulators, so the share's
# other tests come between them, by time, not by count: pytest-randomly keeps a module's tests
# together, and thirty of them were a tenth of a second in one module and ten seconds in
# another. With gaps by count, every process was in a slow test at once for the run's first
# 80 s, the cores a third idle, then in none.
DURATIONS = Path(__file__).with_name("durations.json")
# The part of each share the slow tests are spread over: its rest is left to be stolen.
SPREAD = 0.8
# A test of a module the file does not know: about what most take under load.
UNKNOWN_SECONDS = 0.3
# The shares that take the tests marked `compute_library`. Importing google-cloud-compute costs
# a process about 2 s of CPU (its ~1,500 message classes are built at import), and in the
# collected order its users were run by 10 processes of 12: 20 s of the suite's CPU.
LIBRARY_SHARES = 3


@dataclass(frozen=True)
class Durations:
    """What a parallel run took: the slow tests' wall seconds by node id, and the mean of the
    other tests of each module by its path."""

    slow: dict[str, float] = field(default_factory=dict)
    modules: dict[str, float] = field(default_factory=dict)

    def of(self, item: pytest.Item) -> float:
        """The seconds `item` is expected to take."""
        known = self.slow.get(item.nodeid)
        if known is not None:
            return known
        return self.modules.get(item.nodeid.split("::", 1)[0], UNKNOWN_SECONDS)


def load_durations(path: Path) -> Durations:
    try:
        data = json.loads(path.read_text())
        return Durations(
            slow={str(k): float(v) for k, v in data.get("slow", {}).items()},
            modules={str(k): float(v) for k, v in data.get("modules", {}).items()},
        )
    except (OSError, ValueError, AttributeError):
        return Durations()


def spread_slow_tests(
    items: list[pytest.Item],
    workers: int,
    durations: Durations,
    *,
    spread: float = SPREAD,
    together: Callable[[pytest.Item], bool] = lambda item: False,
    together_shares: int = LIBRARY_SHARES,
) -> list[pytest.Item]:
    """`items` reordered so each of the `workers` contiguous shares (as xdist's worksteal
    scheduler cuts them) starts with its longest known slow test (after a part of a run of
    the rest, longer for each later share), and its other slow tests come between runs of
    the rest of about equal expected time, over the first `spread` of the share's time.
    The tests `together` picks go to the first `together_shares` shares only (the slow ones
    to the lighter, the others in turn), early in each, where idle processes do not steal
    them."""
    slow = sorted(
        (i for i in items if i.nodeid in durations.slow), key=lambda i: -durations.slow[i.nodeid]
    )
    grouped = [item for item in items if together(item)]
    picked = {id(item) for item in grouped}
    if not slow and not grouped:
        return items
    kept = max(1, min(together_shares, workers))
    unknown = [item for item in grouped if item.nodeid not in durations.slow]
    fast = [unknown[share::kept] for share in range(kept)]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [
        sum(map(durations.of, fast[share])) if share < kept else 0.0 for share in range(workers)
    ]
    # The longest first, each to the lightest share so far: the grouped ones among the kept
    # shares before the others, so those see the kept shares' load.
    for item in sorted(slow, key=lambda i: id(i) not in picked):
        choices = range(kept) if id(item) in picked else range(workers)
        share = min(choices, key=lambda index: loads[index])
        heads[share].append(item)
        loads[share] += durations.slow[item.nodeid]
    for head in heads:
        head.sort(key=lambda i: -durations.slow[i.nodeid])
    taken = {id(item) for item in slow} | picked
    remaining_items = [item for item in items if id(item) not in taken]
    mean = sum(map(durations.of, remaining_items)) / max(1, len(remaining_items))
    rest = iter(remaining_items)
    ordered: list[pytest.Item] = []
    remaining = len(items)
    for share in range(workers):
        size = remaining // (workers - share)  # what xdist sends each idle process at the start
        remaining -= size
        first = fast[share] if share < kept else []
        left = max(0, size - len(heads[share]) - len(first))  # the share's other tests
        # The slow tests mostly wait on their emulators: runs of the rest between them keep
        # both cores busy, and the end of the share (what idle processes steal) has none.
        # Each later share starts with a longer part of a run (none for the first share,
        # most of one for the last), so the slow tests do not all start waiting at once.
        lead = share / workers if heads[share] else 0.0
        gap = spread * left * mean / max(1.0, len(heads[share]) + lead)
        # A run of the rest before each slow test (the lead before the longest, a gap before
        # each other); the fast picked tests right after the longest, or first of all. After
        # the last slow test, the rest as it comes.
        after_runs = [[item] for item in heads[share]] or [[]]
        after_runs[0] += first
        for index, seconds in enumerate([gap * lead] + [gap] * (len(after_runs) - 1)):
            run = list(_run_of(rest, seconds, left, durations))
            ordered += run + after_runs[index]
            left -= len(run)
        ordered += islice(rest, left)
    return ordered + list(rest)


def _run_of(
    rest: Iterator[pytest.Item], seconds: float, most: int, durations: Durations
) -> Iterator[pytest.Item]:
    """The next tests of `rest`, at most `most`, until they are expected to take `seconds`."""
    spent = 0.0
    while most > 0 and spent < seconds:
        item = next(rest, None)
        if item is None:
            return
        yield item
        spent += durations.of(item)
        most -= 1
