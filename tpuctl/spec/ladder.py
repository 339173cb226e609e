"""A capacity ladder (capacity.fallback) as specs: the Spec each rung asks for, and its name.

Pure. Rung 0 is the spec's own capacity; without a ladder the spec is its only rung.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuctl.spec.model import RESERVATION_TIERS, CapacitySpec, RungSpec, Spec


def rung_count(spec: Spec) -> int:
    return max(1, len(spec.capacity.fallback))


def rung_spec(spec: Spec, index: int) -> Spec:
    """The spec as rung `index` asks for it: the rung's tier, run duration, reservation and
    zones over the capacity's (the ladder itself is kept, so every rung is the same run)."""
    ladder = spec.capacity.fallback
    if not ladder:
        return spec
    rung = ladder[min(index, len(ladder) - 1)]
    capacity = spec.capacity
    zones = rung.zones or capacity.zones
    changed: CapacitySpec = replace(
        capacity,
        tier=rung.tier,
        max_run_duration=_run_duration(rung, capacity),
        reservation=_reservation(rung, capacity),
        zones=zones,
    )
    zone = zones[0] if rung.zones else spec.zone
    return replace(spec, capacity=changed, zone=zone)


def rung_specs(spec: Spec) -> tuple[Spec, ...]:
    """Every rung's spec, first rung first (the spec alone without a ladder)."""
    return tuple(rung_spec(spec, index) for index in range(rung_count(spec)))


def rung_names(spec: Spec) -> tuple[str, ...]:
    """What each rung is called in the journal and in status: `spot`, `flex-start 1d`,
    `reservation-bound calendar`, `on-demand in us-east5-a`; empty without a ladder."""
    if not spec.capacity.fallback:
        return ()
    return tuple(capacity_name(rung_spec(spec, i), spec) for i in range(rung_count(spec)))


def capacity_name(spec: Spec, base: Spec | None = None) -> str:
    """A capacity in a few words: its tier, its run duration, its reservation, and its zones
    where they differ from `base`'s."""
    from tpuctl.clock import format_duration

    capacity = spec.capacity
    words: list[str] = [capacity.tier]
    if capacity.max_run_duration is not None:
        words.append(format_duration(capacity.max_run_duration.total_seconds()))
    if capacity.reservation:
        words.append(capacity.reservation.rsplit("/", 1)[-1])
    if base is not None and spec.zones != base.zones:
        words.append("in " + ", ".join(spec.zones))
    return " ".join(words)


def _run_duration(rung: RungSpec, capacity: CapacitySpec) -> timedelta | None:
    if rung.tier != "flex-start":
        return None
    return rung.max_run_duration or capacity.max_run_duration


def _reservation(rung: RungSpec, capacity: CapacitySpec) -> str | None:
    if rung.tier not in RESERVATION_TIERS:
        return None
    return rung.reservation or capacity.reservation
