"""AdminMethods, ComputeEngine's answers to the admin service: faults on instances or whole MIGs
(preemption, host maintenance), capacity pools set and shown, and the status of everything."""

from __future__ import annotations

from typing import Any

from tpuctl.emulator.compute import disruptions, groups, instances
from tpuctl.emulator.compute.catalog import GENERATIONS
from tpuctl.emulator.compute.errors import ComputeApiError, invalid, not_ready
from tpuctl.emulator.compute.instances import Context
from tpuctl.emulator.compute.store import GroupRecord, InstanceRecord, Store
from tpuctl.emulator.control.clock import rfc3339


class AdminMethods:
    """The admin methods of ComputeEngine (which sets these attributes)."""

    store: Store
    ctx: Context

    def resolve_instance(self, target: str) -> InstanceRecord:
        """A full or partial instance URL, or a bare name that names one instance. Locked."""
        parts = target.split("/compute/v1/", 1)[-1].strip("/").split("/")
        if len(parts) == 6 and parts[0] == "projects" and parts[4] == "instances":
            return self.store.instance(parts[1], parts[3], parts[5])
        matches = [i for i in self.store.instances.values() if i.name == target]
        if len(matches) != 1:
            raise ComputeApiError(
                404 if not matches else 400,
                "notFound" if not matches else "invalid",
                f"no instance {target!r}"
                if not matches
                else f"{target!r} names several instances: give projects/P/zones/Z/instances/NAME",
            )
        return matches[0]

    def resolve_targets(self, target: str) -> list[InstanceRecord]:
        """An instance, or every instance of a MIG (`…/instanceGroupManagers/NAME`, or the
        bare name of one). Locked."""
        parts = target.split("/compute/v1/", 1)[-1].strip("/").split("/")
        group: GroupRecord | None = None
        if len(parts) == 6 and parts[4] == "instanceGroupManagers":
            group = self.store.group(parts[1], (parts[2], parts[3]), parts[5])
        elif "/" not in target:
            named = [g for g in self.store.groups.values() if g.name == target]
            group = named[0] if len(named) == 1 else None
        if group is None:
            return [self.resolve_instance(target)]
        found = [i for _name, i in groups.members(self.store, group) if i is not None]
        if not found:
            raise not_ready(group.link)
        return found

    def preempt(self, target: str) -> dict[str, Any]:
        with self.store.lock:
            doomed = self.resolve_targets(target)
            for instance in doomed:  # all of them can be preempted, or none is
                disruptions.check_preemptible(instance)
            for instance in doomed:
                disruptions.preempt(self.ctx, instance)
            return {"preempted": [instance.link for instance in doomed]}

    def maintenance(self, target: str, after: float) -> dict[str, Any]:
        with self.store.lock:
            chosen = self.resolve_targets(target)
            if after <= 0:
                for instance in chosen:
                    if instance.status != "RUNNING":
                        raise ComputeApiError(
                            400,
                            "resourceNotReady",
                            f"'{instance.link}' is {instance.status}, not RUNNING",
                        )
                    disruptions.begin_maintenance(self.ctx, instance, "admin")
                now = self.store.clock.wall()
                return {"maintenance": [i.link for i in chosen], "at": rfc3339(now)}
            at = [disruptions.announce_maintenance(self.ctx, i, after) for i in chosen]
            return {"maintenance": [i.link for i in chosen], "at": rfc3339(at[0])}

    def set_capacity(self, changes: dict[str, int], zone: str | None) -> dict[str, Any]:
        """Pool sizes (chips per generation; with `zone`, that zone's own pool). A pool shrunk
        below what is held preempts its spot VMs, newest first, until it fits."""
        store = self.store
        with store.lock:
            for generation, total in changes.items():
                if generation not in GENERATIONS or total < 0:
                    raise invalid(
                        f"bad capacity {generation}={total}: use GENERATION=CHIPS with GENERATION "
                        f"one of {', '.join(GENERATIONS)}"
                    )
                store.pools.set_total(generation, total, zone)
                store.events.emit(
                    "compute.capacity", detail=f"{zone + ': ' if zone else ''}{generation}={total}"
                )
                self._reclaim(generation, zone)
            store.cond.notify_all()
            return store.pools.snapshot(zone)

    def _reclaim(self, generation: str, zone: str | None) -> None:
        store = self.store
        victims = sorted(
            (
                i
                for i in store.instances.values()
                if i.model == "SPOT"
                and i.machine.generation == generation
                and store.pools.holds_from(i.link, generation, zone or i.zone)
                and i.status in ("PROVISIONING", "STAGING", "RUNNING")
            ),
            key=lambda i: i.created,
            reverse=True,
        )
        for instance in victims:
            if store.pools.free(generation, zone or instance.zone) >= 0:
                break
            disruptions.preempt(self.ctx, instance)
            instances.release(store, instance)

    def capacity(self, zone: str | None) -> dict[str, Any]:
        with self.store.lock:
            return self.store.pools.snapshot(zone)

    def status(self) -> dict[str, Any]:
        with self.store.lock:
            return {
                "capacity": self.store.pools.snapshot(),
                "instances": [
                    {
                        "instance": i.link,
                        "status": i.status,
                        "model": i.model,
                        "machine_type": i.machine.name,
                        "group": i.group,
                    }
                    for _key, i in sorted(self.store.instances.items())
                ],
                "groups": [
                    {
                        "group": g.link,
                        "state": g.state,
                        "target_size": g.target_size,
                        "topology": g.topology,
                        "topology_state": groups.topology_state(self.store, g)
                        if g.topology
                        else None,
                    }
                    for _key, g in sorted(self.store.groups.items())
                ],
            }
