"""The builder's capacity rules: one tier (or a ladder of them), what each tier needs and
allows, queueing windows, zones and the zone policy."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from tpuctl.clock import format_duration, rfc3339
from tpuctl.spec.model import (
    RESERVATION_TIERS,
    TIERS,
    CapacitySpec,
    CheckpointSpec,
    JobSpec,
    RungSpec,
    Tier,
    TpuSpec,
)
from tpuctl.spec.sections import Rules, Values
from tpuctl.topology import Accelerator

_TIER_FLAGS = (
    ("spot", "spot"),
    ("reserved", "reserved"),
    ("on_demand", "on-demand"),
    ("best_effort", "best-effort"),
)
# flex-start's maximum run duration (runDuration.maxRunDuration), as the service bounds it.
MIN_RUN_DURATION = timedelta(minutes=10)
MAX_RUN_DURATION = timedelta(days=7)
# The generations Cloud TPU offers flex-start for.
FLEX_START_GENERATIONS = ("v5e", "v6e")


class CapacityRules(Rules):
    def capacity(self, capacity: Values) -> CapacitySpec:
        chosen: list[tuple[str, str]] = []  # (tier, the key that asked for it)
        if "tier" in capacity:
            chosen.append((capacity["tier"], "capacity.tier"))
        for key, tier in _TIER_FLAGS:
            if capacity.data.get(key):
                chosen.append((tier, f"capacity.{key}"))
        for tier, path in chosen[1:]:
            if tier != chosen[0][0]:
                raise self.error(
                    f"two capacity tiers: {chosen[0][1]} asks for {chosen[0][0]}, "
                    f"{path} for {tier}",
                    path,
                    "keep one: tier: " + " | ".join(TIERS),
                )
        tier = cast(Tier, chosen[0][0] if chosen else capacity["tier"])
        for key, flag_tier in _TIER_FLAGS:
            if key in capacity and capacity[key] is False and flag_tier == tier and chosen:
                raise self.error(
                    f"contradicts {chosen[0][1]}, which asks for {tier}",
                    f"capacity.{key}",
                    f"remove capacity.{key}",
                )
        fallback = self.fallback(capacity, chosen)
        if fallback:
            first = fallback[0]
            tier = first.tier
            reservation, max_run = _rung_needs(first, capacity)
        else:
            reservation, max_run = capacity["reservation"], capacity["max_run_duration"]
            self.check_tier(tier, reservation, max_run, "capacity")
        until, after = capacity["valid_until"], capacity["valid_after"]
        if self.now is not None and isinstance(until, datetime) and until <= self.now:
            ago = format_duration((self.now - until).total_seconds())
            raise self.error(
                f"{rfc3339(until)} was {ago} ago: the request would give up queueing before "
                "it is sent",
                "capacity.valid_until",
                "give a later time, or a duration such as 6h (counted from the create)",
            )
        if (
            until is not None
            and after is not None
            and type(until) is type(after)
            and after >= until
        ):
            raise self.error(
                "valid_after is not before valid_until: the request could never be served",
                "capacity.valid_after",
                "make valid_after earlier than valid_until",
            )
        zones: tuple[str, ...] = capacity["zones"] or ()
        if "zones" in capacity and not zones:
            raise self.error(
                "an empty list of zones", "capacity.zones", "give at least one zone, or remove it"
            )
        for index, zone in enumerate(zones):
            if zone in zones[:index]:
                raise self.error(
                    f"{zone} is listed twice", f"capacity.zones[{index}]", "list each zone once"
                )
        return CapacitySpec(
            tier=tier,
            reservation=reservation,
            valid_until=until,
            valid_after=after,
            max_run_duration=max_run,
            zones=zones,
            zone_policy=capacity["zone_policy"],
            fallback=fallback,
        )

    def check_tier(
        self, tier: str, reservation: str | None, max_run: timedelta | None, path: str
    ) -> None:
        """What a tier needs and allows: flex-start a maximum run duration, the reservation
        tiers a reservation, and nothing else either."""
        where = "capacity" if path == "capacity" else path
        if tier == "flex-start" and max_run is None:
            raise self.error(
                "a flex-start run lasts a limited time: flex-start needs max_run_duration",
                f"{path}.tier",
                f"add `max_run_duration: 1d` under `{where}` (10m to 7d)",
            )
        if max_run is not None and tier != "flex-start":
            raise self.error(
                f"max_run_duration is flex-start's (the service takes the run back then), "
                f"not {tier}'s",
                f"{path}.max_run_duration",
                "remove it, or set tier: flex-start",
            )
        if max_run is not None and not MIN_RUN_DURATION <= max_run <= MAX_RUN_DURATION:
            raise self.error(
                f"{format_duration(max_run.total_seconds())} is not a run duration the service "
                "takes (10m to 7d)",
                f"{path}.max_run_duration",
                "give a duration from 10m to 7d",
            )
        if tier == "reservation-bound" and reservation is None:
            raise self.error(
                "a reservation-bound run runs in a reservation's window: it needs reservation",
                f"{path}.tier",
                f"add `reservation: NAME` under `{where}` (a calendar-mode reservation)",
            )
        if reservation is not None and tier not in RESERVATION_TIERS:
            raise self.error(
                f"a reservation needs the reserved or reservation-bound tier, not {tier}",
                f"{path}.reservation",
                f"set {path}.tier: reserved or reservation-bound, or remove {path}.reservation",
            )

    def fallback(self, capacity: Values, chosen: list[tuple[str, str]]) -> tuple[RungSpec, ...]:
        """capacity.fallback: each rung checked as a tier is, the first one the capacity's."""
        items: list[dict[str, Any]] = capacity["fallback"] or []
        if "fallback" in capacity and not items:
            raise self.error(
                "an empty capacity ladder", "capacity.fallback", "give its rungs, or remove it"
            )
        if items and chosen and chosen[0][0] != items[0]["tier"]:
            raise self.error(
                f"{chosen[0][1]} asks for {chosen[0][0]}, but the ladder's first rung is "
                f"{items[0]['tier']}",
                chosen[0][1],
                f"remove {chosen[0][1]}: with capacity.fallback the first rung is the tier",
            )
        rungs: list[RungSpec] = []
        for index, item in enumerate(items):
            path = f"capacity.fallback[{index}]"
            rung = RungSpec(
                tier=cast(Tier, item["tier"]),
                max_run_duration=item.get("max_run_duration"),
                reservation=item.get("reservation"),
                zones=tuple(item.get("zones") or ()),
            )
            reservation, max_run = _rung_needs(rung, capacity)
            self.check_tier(rung.tier, reservation, max_run, path)
            if "zones" in item and not rung.zones:
                raise self.error(
                    "an empty list of zones", f"{path}.zones", "give zones, or remove the key"
                )
            if rung in rungs:
                raise self.error(
                    f"rung {index + 1} repeats rung {rungs.index(rung) + 1}",
                    path,
                    "list each rung once",
                )
            rungs.append(rung)
        return tuple(rungs)

    def check_capacity_for(self, capacity: CapacitySpec, accelerator: Accelerator) -> None:
        """flex-start only for the generations Cloud TPU offers it for."""
        tiers = [
            (f"capacity.fallback[{index}].tier", rung.tier)
            for index, rung in enumerate(capacity.fallback)
        ] or [("capacity.tier", capacity.tier)]
        for path, tier in tiers:
            if tier == "flex-start" and accelerator.generation not in FLEX_START_GENERATIONS:
                raise self.error(
                    f"Cloud TPU offers flex-start for {' and '.join(FLEX_START_GENERATIONS)}, "
                    f"not {accelerator.generation}",
                    path,
                    "use a v5e or v6e accelerator, or another tier (spot waits for capacity "
                    "too, with preemptions)",
                )

    def zone(self, values: Values, capacity: CapacitySpec) -> str | None:
        """The spec's one zone: `zone`, or the first of capacity.zones (never both)."""
        if capacity.zones and "zone" in values:
            raise self.error(
                "give zone or capacity.zones, not both",
                "capacity.zones",
                f"list {values['zone']} in capacity.zones and remove zone (the first of the "
                "zones is the one every single-zone command uses)",
            )
        return capacity.zones[0] if capacity.zones else values["zone"]

    def check_zone_policy(
        self,
        capacity: CapacitySpec,
        job: JobSpec | None,
        checkpoint: CheckpointSpec,
        tpu: TpuSpec,
    ) -> None:
        """first-active holds the job back in every zone but the one claimed beside its
        checkpoints, which needs tpuctl's startup script and a shared checkpoint.dir."""
        if capacity.zone_policy != "first-active" or job is None:
            return
        if "startup-script" in tpu.metadata:
            raise self.error(
                "first-active needs tpuctl's startup script: it keeps the job from starting "
                "in any zone but the chosen one, and tpu.metadata.startup-script replaces it",
                "capacity.zone_policy",
                "use zone_policy: sequential (one zone at a time), or job.boot_script for "
                "your own boot steps",
            )
        if not checkpoint.dir:
            raise self.error(
                "first-active needs checkpoint.dir: the claim naming the zone the job may run "
                "in is kept there, where every zone's workers read it",
                "capacity.zone_policy",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME, or use zone_policy: sequential",
            )


def _rung_needs(rung: RungSpec, capacity: Values) -> tuple[str | None, timedelta | None]:
    """A rung's reservation and maximum run duration: its own, else the capacity's where its
    tier takes one."""
    reservation = rung.reservation
    if reservation is None and rung.tier in RESERVATION_TIERS:
        reservation = capacity["reservation"]
    max_run = rung.max_run_duration
    if max_run is None and rung.tier == "flex-start":
        max_run = capacity["max_run_duration"]
    return reservation, max_run
