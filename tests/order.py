"""The order a parallel run starts tests in: the known slow ones first (tests/conftest.py
applies it after collection). No side effects on import, so tests/test_order.py can import it."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

# Wall seconds of the slowest tests in a parallel run (`scripts/slowest-tests --durations`
# rewrites it). xdist's work stealing gives each process a contiguous share of the collected
# order: the known slow tests go at the head of the shares, spread by their sum, so none of
# them starts last and holds up the run's end.
DURATIONS = Path(__file__).with_name("durations.json")


def load_durations(path: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def slow_first(
    items: list[pytest.Item], workers: int, durations: dict[str, float]
) -> list[pytest.Item]:
    """`items` reordered so each of the `workers` contiguous shares (as xdist's worksteal
    scheduler cuts them) starts with its part of the known slow tests, longest first."""
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
        ordered += heads[share]
        ordered += islice(rest, max(0, size - len(heads[share])))
    return ordered + list(rest)
