"""What befalls an instance from outside: spot preemption, and host maintenance (announced
ahead, or now). Each is called under the store's lock and leaves the slow part to a thread of
its own (Store.spawn), which ends in the flows of instances.py: terminate, or the VM shut down
and brought up again (bring_up).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpuctl.emulator.compute.errors import ComputeApiError
from tpuctl.emulator.compute.instances import (
    Context,
    bring_up,
    notify_groups,
    pause,
    push_state,
    release,
    set_status,
    terminate,
)
from tpuctl.emulator.compute.store import InstanceRecord
from tpuctl.emulator.control.clock import rfc3339

# Compute Engine's preemption notice: an ACPI soft off, then the VM is off 30 s later.
PREEMPTION_NOTICE = 30.0
MAINTENANCE_WINDOW = 3600.0  # how long an announced maintenance window lasts (emulated)


def check_preemptible(instance: InstanceRecord) -> None:
    """A 400 unless `instance` is a spot VM that runs (or is being made)."""
    if instance.model != "SPOT":
        raise ComputeApiError(
            400, "invalid", f"'{instance.link}' is {instance.model}; only SPOT VMs are preempted"
        )
    if instance.status not in ("PROVISIONING", "STAGING", "RUNNING"):
        raise ComputeApiError(
            400, "resourceNotReady", f"'{instance.link}' is {instance.status}, not running"
        )


def preempt(ctx: Context, instance: InstanceRecord) -> None:
    """Spot preemption (under the lock): `preempted` TRUE at once, the soft-off notice, then
    TERMINATED (or deleted, with instanceTerminationAction DELETE)."""
    store = ctx.store
    check_preemptible(instance)
    epoch = store.supersede(instance)
    instance.preempted = True
    set_status(store, instance, "STOPPING", "Instance was preempted.")
    store.system_event(instance, "compute.instances.preempted", "Instance was preempted.")
    store.events.emit("compute.preempt", node=instance.link, detail=instance.action)

    def flow() -> None:
        push_state(ctx, instance)
        terminate(
            ctx,
            instance,
            epoch,
            delete=instance.action == "DELETE",
            why="preempted",
            notice=PREEMPTION_NOTICE,
        )

    store.spawn(flow)


def announce_maintenance(ctx: Context, instance: InstanceRecord, after: float) -> datetime:
    """Scheduled host maintenance `after` emulated seconds from now (under the lock): it shows
    in resourceStatus.upcomingMaintenance and the metadata server at once, and starts then."""
    store = ctx.store
    if instance.status != "RUNNING":
        raise ComputeApiError(
            400, "resourceNotReady", f"'{instance.link}' is {instance.status}, not RUNNING"
        )
    start_at = store.clock.wall() + timedelta(seconds=store.clock.scaled(after))
    instance.upcoming = {
        "type": "SCHEDULED",
        "maintenanceStatus": "PENDING",
        "canReschedule": False,
        "windowStartTime": rfc3339(start_at),
        "latestWindowStartTime": rfc3339(start_at),
        "windowEndTime": rfc3339(
            start_at + timedelta(seconds=store.clock.scaled(MAINTENANCE_WINDOW))
        ),
    }
    store.events.emit("compute.maintenance.scheduled", node=instance.link, detail=rfc3339(start_at))

    def timer() -> None:
        push_state(ctx, instance)
        with store.cond:
            while not store.closing and not instance.gone:
                left = (start_at - store.clock.wall()).total_seconds()
                if left <= 0:
                    break
                store.cond.wait(min(left, 1.0))
            if store.closing or instance.gone or instance.status != "RUNNING":
                store.events.emit("compute.maintenance.skipped", node=instance.link)
                return
            begin_maintenance(ctx, instance, "scheduled")

    store.spawn(timer)
    return start_at


def begin_maintenance(ctx: Context, instance: InstanceRecord, why: str) -> None:
    """Host maintenance now (under the lock): an instance that terminates on host maintenance
    is shut down (SIGTERM, the OS's stop timeout), the host maintained, and it boots again
    (automaticRestart) with its disk: its startup script runs again."""
    store = ctx.store
    epoch = store.supersede(instance)
    instance.upcoming = {
        **(instance.upcoming or {"type": "UNSCHEDULED", "canReschedule": False}),
        "maintenanceStatus": "ONGOING",
    }
    instance.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
    set_status(store, instance, "STOPPING")
    store.system_event(
        instance, "compute.instances.terminateOnHostMaintenance", "Instance terminated during "
        "Compute Engine maintenance."
    )  # fmt: skip
    store.events.emit("compute.maintenance.start", node=instance.link, detail=why)
    store.spawn(_maintenance, ctx, instance, epoch)


def _maintenance(ctx: Context, instance: InstanceRecord, epoch: int) -> None:
    store = ctx.store
    push_state(ctx, instance)
    with instance.flow_lock:
        if instance.in_plane:
            ctx.plane.stop_node(instance.plane_key, 0.0, store.clock.scaled(store.config.shutdown))
        with store.lock:
            if not store.alive(instance, epoch):
                return
            set_status(store, instance, "TERMINATED")
        notify_groups(ctx, instance)
        if not pause(store, store.config.delays.reboot, lambda: store.alive(instance, epoch)):
            return
        with store.lock:
            restart = bool(instance.body["scheduling"].get("automaticRestart"))
            instance.upcoming = None
            instance.maintenance_event = "NONE"
            if not restart:
                release(store, instance)
                instance.termination_timestamp = None
        if restart:
            bring_up(ctx, [instance], lambda: store.alive(instance, epoch))
        push_state(ctx, instance)
        store.events.emit("compute.maintenance.end", node=instance.link)
    notify_groups(ctx, instance)
