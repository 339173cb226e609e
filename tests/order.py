"""The order a parallel run starts tests in: the known slow ones spread over each share
(tests/conftest.py applies it after collection). No side effects on import, so
tests/test_order.py can import it."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import pytest

# Wall seconds of the slowest tests in a parallel run (`scripts/slowest-tests --durations`
# rewrites it). xdist's work stealing gives each process a contiguous share of the collected
# order. The known slow tests go to the shares by their sum; each share starts with its
# longest, so none of them starts last and holds up the run's end. They mostly wait on their
# emulators: the share's others come between them, so a process is not in one slow test after
# another while the cores idle (all of them first left both cores about a third idle for the
# run's first two minutes, and all of it busy in the last one).
DURATIONS = Path(__file__).with_name("durations.json")
# The part of each share the slow tests are spread over: its rest is left to be stolen.
SPREAD = 0.8
# The shares that take the tests marked `compute_library`. Importing google-cloud-compute costs
# a process about 2 s of CPU (its ~1,500 message classes are built at import), and in the
# collected order its users were run by 10 processes of 12: 20 s of the suite's CPU.
LIBRARY_SHARES = 3


def load_durations(path: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def spread_slow_tests(
    items: list[pytest.Item],
    workers: int,
    durations: dict[str, float],
    *,
    spread: float = SPREAD,
    together: Callable[[pytest.Item], bool] = lambda item: False,
    together_shares: int = LIBRARY_SHARES,
) -> list[pytest.Item]:
    """`items` reordered so each of the `workers` contiguous shares (as xdist's worksteal
    scheduler cuts them) starts with its longest known slow test, and its other slow tests
    come between runs of the rest over the first `spread` of the share. The tests `together`
    picks go to the first `together_shares` shares only (the slow ones to the lighter, the
    others in turn), at the start of each, where idle processes do not steal them."""
    slow = sorted((i for i in items if i.nodeid in durations), key=lambda i: -durations[i.nodeid])
    grouped = [item for item in items if together(item)]
    picked = {id(item) for item in grouped}
    if not slow and not grouped:
        return items
    kept = max(1, min(together_shares, workers))
    unknown = [item for item in grouped if item.nodeid not in durations]
    fast = [unknown[share::kept] for share in range(kept)]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    # A test not in `durations` took under a few seconds: about one, as a load.
    loads = [float(len(fast[share])) if share < kept else 0.0 for share in range(workers)]
    # The longest first, each to the lightest share so far: the grouped ones among the kept
    # shares before the others, so those see the kept shares' load.
    for item in sorted(slow, key=lambda i: id(i) not in picked):
        choices = range(kept) if id(item) in picked else range(workers)
        share = min(choices, key=lambda index: loads[index])
        heads[share].append(item)
        loads[share] += durations[item.nodeid]
    for head in heads:
        head.sort(key=lambda i: -durations[i.nodeid])
    taken = {id(item) for item in slow} | picked
    rest = iter([item for item in items if id(item) not in taken])
    ordered: list[pytest.Item] = []
    remaining = len(items)
    for share in range(workers):
        size = remaining // (workers - share)  # what xdist sends each idle process at the start
        remaining -= size
        first = fast[share] if share < kept else []
        others = max(0, size - len(heads[share]) - len(first))
        # The slow tests mostly wait on their emulators: runs of the rest between them keep
        # both cores busy, and the end of the share (what idle processes steal) has none.
        gap = int(others * spread) // max(1, len(heads[share]))
        for index, slow_item in enumerate(heads[share]):
            ordered.append(slow_item)
            if index == 0:
                ordered += first
            ordered += islice(rest, gap)
            others -= gap
        if not heads[share]:
            ordered += first
        ordered += islice(rest, others)
    return ordered + list(rest)
