"""The order a parallel run starts tests in: the known slow ones spread over each share
(tests/conftest.py applies it after collection). No side effects on import, so
tests/test_order.py can import it."""

from __future__ import annotations

import json
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


def load_durations(path: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def spread_slow_tests(
    items: list[pytest.Item], workers: int, durations: dict[str, float], spread: float = SPREAD
) -> list[pytest.Item]:
    """`items` reordered so each of the `workers` contiguous shares (as xdist's worksteal
    scheduler cuts them) starts with its longest known slow test, and its other slow tests
    come between runs of the rest over the first `spread` of the share."""
    slow = sorted((i for i in items if i.nodeid in durations), key=lambda i: -durations[i.nodeid])
    if not slow:
        return items
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in slow:  # the longest first, each to the lightest share so far
        share = loads.index(min(loads))
        heads[share].append(item)
        loads[share] += durations[item.nodeid]
    taken = {id(item) for item in slow}
    rest = iter([item for item in items if id(item) not in taken])
    ordered: list[pytest.Item] = []
    remaining = len(items)
    for share in range(workers):
        size = remaining // (workers - share)  # what xdist sends each idle process at the start
        remaining -= size
        others = max(0, size - len(heads[share]))
        # The slow tests mostly wait on their emulators: runs of the rest between them keep
        # both cores busy, and the end of the share (what idle processes steal) has none.
        gap = int(others * spread) // max(1, len(heads[share]))
        for slow_item in heads[share]:
            ordered.append(slow_item)
            ordered += islice(rest, gap)
            others -= gap
        ordered += islice(rest, others)
    return ordered + list(rest)
