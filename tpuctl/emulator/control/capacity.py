"""Capacity pools: chips per TPU generation, allocated to queued resources while they hold VMs.

One pool per generation serves every zone, unless a zone was given pools of its own
(`set_total(generation, chips, zone=…)`): that zone then draws only from its own pool of that
generation, and the shared pool no longer sees it.
"""

from __future__ import annotations

from typing import Any

# A pool: (zone, generation), the zone "" for the pool every zone shares.
PoolKey = tuple[str, str]
SHARED = ""


class CapacityPools:
    """Not locked: the caller (CloudTpu) holds its own lock around every call."""

    def __init__(self, totals: dict[str, int]) -> None:
        self._totals: dict[PoolKey, int] = {(SHARED, gen): chips for gen, chips in totals.items()}
        self._allocations: dict[str, tuple[PoolKey, int]] = {}  # owner -> (pool, chips)

    def pool(self, generation: str, zone: str | None = None) -> PoolKey:
        """The pool a QR in `zone` draws `generation` chips from."""
        if zone and (zone, generation) in self._totals:
            return (zone, generation)
        return (SHARED, generation)

    def total(self, generation: str, zone: str | None = None) -> int:
        return self._totals.get(self.pool(generation, zone), 0)

    def used(self, generation: str, zone: str | None = None) -> int:
        key = self.pool(generation, zone)
        return sum(chips for pool, chips in self._allocations.values() if pool == key)

    def free(self, generation: str, zone: str | None = None) -> int:
        return self.total(generation, zone) - self.used(generation, zone)

    def try_allocate(
        self, owner: str, generation: str, chips: int, zone: str | None = None
    ) -> bool:
        if owner in self._allocations:
            return True
        if chips > self.free(generation, zone):
            return False
        self._allocations[owner] = (self.pool(generation, zone), chips)
        return True

    def release(self, owner: str) -> bool:
        return self._allocations.pop(owner, None) is not None

    def holds(self, owner: str) -> bool:
        return owner in self._allocations

    def holds_from(self, owner: str, generation: str, zone: str | None = None) -> bool:
        """Whether `owner` holds chips of the pool a QR in `zone` draws `generation` from."""
        held = self._allocations.get(owner)
        return held is not None and held[0] == self.pool(generation, zone)

    def keys(self) -> list[str]:
        """The generations (or other keys) that have a pool."""
        return sorted({key for _zone, key in self._totals})

    def set_total(self, generation: str, chips: int, zone: str | None = None) -> None:
        self._totals[(zone or SHARED, generation)] = chips

    def snapshot(self, zone: str | None = None) -> dict[str, Any]:
        """Every generation's pool as a QR in `zone` sees it (the shared pools without one)."""
        generations = sorted({gen for _zone, gen in self._totals})
        return {
            gen: {
                "total": self.total(gen, zone),
                "used": self.used(gen, zone),
                "free": self.free(gen, zone),
            }
            for gen in generations
        }
