"""Capacity pools: chips per TPU generation, allocated to queued resources while they hold VMs."""

from __future__ import annotations

from typing import Any


class CapacityPools:
    """Not locked: the caller (CloudTpu) holds its own lock around every call."""

    def __init__(self, totals: dict[str, int]) -> None:
        self._totals = dict(totals)
        self._allocations: dict[str, tuple[str, int]] = {}  # owner -> (generation, chips)

    def total(self, generation: str) -> int:
        return self._totals.get(generation, 0)

    def used(self, generation: str) -> int:
        return sum(chips for gen, chips in self._allocations.values() if gen == generation)

    def free(self, generation: str) -> int:
        return self.total(generation) - self.used(generation)

    def try_allocate(self, owner: str, generation: str, chips: int) -> bool:
        if owner in self._allocations:
            return True
        if chips > self.free(generation):
            return False
        self._allocations[owner] = (generation, chips)
        return True

    def release(self, owner: str) -> bool:
        return self._allocations.pop(owner, None) is not None

    def holds(self, owner: str) -> bool:
        return owner in self._allocations

    def set_total(self, generation: str, chips: int) -> None:
        self._totals[generation] = chips

    def snapshot(self) -> dict[str, Any]:
        return {
            gen: {"total": total, "used": self.used(gen), "free": total - self.used(gen)}
            for gen, total in sorted(self._totals.items())
        }
