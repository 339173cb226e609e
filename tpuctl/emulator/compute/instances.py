"""Instances' lives: the flows that make, boot, stop, start and delete an instance (waiting for
capacity, PENDING for a flex-start VM; provisioning; boot; the end of its run duration), the
capacity they hold, and what they tell the worker plane. The request checked and the record shown
are in instance_resource.py; spot preemption and host maintenance in disruptions.py.

Every flow runs in its own thread (Store.spawn) under the instance's flow_lock, and gives up at
its next step once superseded (Store.alive). The worker plane is called off the store's lock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from tpuctl.emulator.compute.errors import interrupted, stockout
from tpuctl.emulator.compute.instance_resource import identity, instance_state, platform_metadata
from tpuctl.emulator.compute.links import link
from tpuctl.emulator.compute.store import InstanceRecord, OperationRecord, Store

log = logging.getLogger("tpuctl.emulator")

# A flex-start VM waits for capacity (PENDING) only with a window of at least this much.
PENDING_MIN_WINDOW = 90.0


class ComputePlane(Protocol):
    """What the fake needs of the worker plane (tpuctl.emulator.vms.workers.WorkerPlane)."""

    def create_node(
        self, identity: Any, metadata: dict[str, str], *, coordinator: str | None
    ) -> Sequence[Any]: ...

    def set_metadata(self, node_id: str, metadata: dict[str, str]) -> None: ...

    def set_instance_state(self, node_id: str, state: dict[str, str]) -> None: ...

    def set_hosts(self, node_id: str, text: str) -> None: ...

    def boot(self, node_id: str) -> None: ...

    def stop_node(self, node_id: str, grace: float | None, shutdown: float = 0.0) -> None: ...

    def delete_node(self, node_id: str) -> None: ...


@dataclass
class Context:
    store: Store
    plane: ComputePlane
    # Told when an instance of a MIG changes state (groups.py keeps the MIG's status).
    member_changed: Callable[[InstanceRecord], None] | None = None


# -------------------------------------------------------------------------- the plane
def push_state(ctx: Context, instance: InstanceRecord) -> None:
    """Tell the instance's metadata server what changed (off the lock)."""
    from tpuctl.errors import NotFoundError

    with ctx.store.lock:
        if not instance.in_plane:
            return
        state = instance_state(instance)
    with contextlib.suppress(NotFoundError):  # deleted meanwhile
        ctx.plane.set_instance_state(instance.plane_key, state)


def push_metadata(ctx: Context, instance: InstanceRecord) -> None:
    from tpuctl.errors import NotFoundError

    with ctx.store.lock:
        if not instance.in_plane:
            return
        metadata = instance.metadata
    with contextlib.suppress(NotFoundError):
        ctx.plane.set_metadata(instance.plane_key, metadata)


# ------------------------------------------------------------------------------ capacity
def chips(instances: Iterable[InstanceRecord]) -> int:
    return sum(instance.machine.chips for instance in instances)


def try_allocate(store: Store, instances: Sequence[InstanceRecord]) -> bool:
    """Hold capacity for all of `instances` at once, or for none. Under the lock."""
    first = instances[0]
    generation, zone = first.machine.generation, first.zone
    needed = sum(
        instance.machine.chips for instance in instances if not store.pools.holds(instance.link)
    )
    if needed > store.pools.free(generation, zone):
        return False
    for instance in instances:
        store.pools.try_allocate(instance.link, generation, instance.machine.chips, zone)
    store.events.emit("compute.capacity.allocate", detail=f"{generation}={needed} in {zone}")
    return True


def release(store: Store, instance: InstanceRecord) -> None:
    if store.pools.release(instance.link):
        store.events.emit("compute.capacity.release", node=instance.link)
        store.cond.notify_all()


def set_status(store: Store, instance: InstanceRecord, status: str, message: str = "") -> None:
    """Under the lock."""
    if instance.status != status:
        instance.status = status
        store.events.emit("compute.instance.status", node=instance.link, detail=status)
    instance.status_message = message
    store.cond.notify_all()


def forget(store: Store, instance: InstanceRecord) -> None:
    """The instance is deleted: its record goes, its capacity is released. Under the lock."""
    instance.gone = True
    instance.epoch += 1
    release(store, instance)
    if store.instances.get(instance.key) is instance:
        del store.instances[instance.key]
    store.events.emit("compute.instance.deleted", node=instance.link)
    store.cond.notify_all()


# ------------------------------------------------------------------------------- flows
def create(ctx: Context, instance: InstanceRecord, epoch: int, operation: OperationRecord) -> None:
    """instances.insert: capacity (a flex-start VM waits for it, PENDING), then bring it up."""
    store = ctx.store
    with instance.flow_lock:
        ran = _acquire(store, instance, epoch, operation) and bring_up(
            ctx, [instance], lambda: store.alive(instance, epoch)
        )
        with store.lock:  # (an operation that ended keeps its first outcome)
            store.finish(operation, None if ran else interrupted(instance.link))


def _acquire(
    store: Store, instance: InstanceRecord, epoch: int, operation: OperationRecord
) -> bool:
    waits = instance.model == "FLEX_START" and (instance.wait_window or 0) >= PENDING_MIN_WINDOW
    with store.cond:
        if not store.alive(instance, epoch):
            return False
        if waits:
            set_status(store, instance, "PENDING")
            deadline = store.clock.monotonic() + store.clock.scaled(instance.wait_window or 0)
        else:
            deadline = store.clock.monotonic()
        while True:
            if not store.alive(instance, epoch):
                return False
            if try_allocate(store, [instance]):
                return True
            left = deadline - store.clock.monotonic()
            if left <= 0:
                # No capacity (in the window): the insert fails and the VM is deleted.
                store.finish(operation, stockout(link(instance.project, "zones", instance.zone)))
                forget(store, instance)
                return False
            store.cond.wait(left)


def bring_up(
    ctx: Context,
    instances: Sequence[InstanceRecord],
    alive: Callable[[], bool],
    *,
    extra: Callable[[InstanceRecord], dict[str, str]] | None = None,
) -> bool:
    """PROVISIONING → STAGING (the VMs made, their metadata set) → boot → RUNNING, for
    `instances` together (a slice: each knows the others' names). False when `alive()` turned
    False on the way (the caller was superseded)."""
    from tpuctl.errors import NotFoundError

    store = ctx.store
    delays = store.config.delays
    if not _step(store, instances, "PROVISIONING", alive):
        return False
    if not pause(store, delays.creating, alive):
        return False
    started = store.clock.monotonic()
    if not _step(store, instances, "STAGING", alive):
        return False
    _create_vms(ctx, [instance for instance in instances if not instance.in_plane], alive)
    try:
        if not _describe_slice(ctx, instances, alive, extra):
            return False
        rest = store.clock.scaled(delays.provisioning) - (store.clock.monotonic() - started)
        if not pause(store, rest, alive, real=True):
            return False
        for instance in instances:
            with store.lock:
                if not alive():
                    return False
            ctx.plane.boot(instance.plane_key)
            store.events.emit("compute.instance.boot", node=instance.link)
    except NotFoundError:
        return False  # deleted meanwhile
    with store.lock:
        if not alive():
            return False
        now = store.clock.wall()
        for instance in instances:
            set_status(store, instance, "RUNNING")
            instance.last_start = now
            _arm_run_end(ctx, instance)
    for instance in instances:
        push_state(ctx, instance)
    return True


def _step(
    store: Store, instances: Sequence[InstanceRecord], status: str, alive: Callable[[], bool]
) -> bool:
    with store.lock:
        if not alive():
            return False
        for instance in instances:
            set_status(store, instance, status)
        return True


def _describe_slice(
    ctx: Context,
    instances: Sequence[InstanceRecord],
    alive: Callable[[], bool],
    extra: Callable[[InstanceRecord], dict[str, str]] | None,
) -> bool:
    """Give each VM the platform's metadata (its worker number, the slice's workers) and the
    names of its peers, before it boots. A VM coming back (start, maintenance) keeps what it
    knew of its slice."""
    with ctx.store.lock:
        if not alive():
            return False
        new = [instance for instance in instances if not instance.platform]
        ordered = sorted(new, key=lambda item: item.worker)
        endpoints = [instance.name for instance in ordered]
        hosts = "".join(f"{instance.ip} {instance.name}\n" for instance in ordered)
        for instance in new:
            instance.platform = platform_metadata(
                instance, endpoints, extra(instance) if extra else None
            )
    for instance in instances:
        push_metadata(ctx, instance)
        push_state(ctx, instance)
    for instance in new:
        ctx.plane.set_hosts(instance.plane_key, hosts)
    return True


def pause(store: Store, seconds: float, alive: Callable[[], bool], *, real: bool = False) -> bool:
    """Wait `seconds` of emulated time (real seconds with `real`) under the store's condition;
    False as soon as the store closes or `alive()` turns false, True once the time is up."""
    wait = seconds if real else store.clock.scaled(seconds)
    end = store.clock.monotonic() + wait
    with store.cond:
        while True:
            if store.closing or not alive():
                return False
            left = end - store.clock.monotonic()
            if left <= 0:
                return True
            store.cond.wait(left)


def _create_vms(
    ctx: Context, instances: Sequence[InstanceRecord], alive: Callable[[], bool]
) -> None:
    for instance in instances:
        with ctx.store.lock:
            if not alive():
                return
            metadata = instance.metadata
        [worker] = list(ctx.plane.create_node(identity(instance), metadata, coordinator=None))
        with ctx.store.lock:
            orphan = instance.gone or not alive()
            if not orphan:
                instance.ip = worker.ip
                instance.host_key = worker.host_key
                instance.in_plane = True
        if orphan:  # deleted while its VM was being made
            ctx.plane.delete_node(instance.plane_key)
            return
        ctx.store.events.emit("compute.instance.vm", node=instance.link, detail=worker.ip)


def _arm_run_end(ctx: Context, instance: InstanceRecord) -> None:
    """Set the termination timestamp (when a time limit applies) and its timer. Under the lock.
    A timestamp already set (the VM came back from maintenance) is kept."""
    store = ctx.store
    if instance.termination_timestamp is None:
        if instance.termination_time is not None:
            instance.termination_timestamp = instance.termination_time
        elif instance.run_duration is not None:
            instance.termination_timestamp = store.clock.wall() + timedelta(
                seconds=store.clock.scaled(instance.run_duration)
            )
    if instance.termination_timestamp is None:
        return
    epoch = instance.epoch
    store.spawn(_run_end_timer, ctx, instance, epoch, instance.termination_timestamp)


def _run_end_timer(ctx: Context, instance: InstanceRecord, epoch: int, at: datetime) -> None:
    store = ctx.store
    with store.cond:
        while store.alive(instance, epoch):
            left = (at - store.clock.wall()).total_seconds()
            if left <= 0:
                break
            store.cond.wait(min(left, 1.0))
        if not store.alive(instance, epoch) or instance.status != "RUNNING":
            return
        store.events.emit("compute.instance.run-ended", node=instance.link, detail=instance.action)
        epoch = store.supersede(instance)
        set_status(store, instance, "STOPPING")
    terminate(ctx, instance, epoch, delete=instance.action == "DELETE", why="run duration")


def terminate(
    ctx: Context,
    instance: InstanceRecord,
    epoch: int,
    *,
    delete: bool,
    why: str,
    graceful: bool = True,
    notice: float | None = None,
    operation: OperationRecord | None = None,
) -> None:
    """Shut the VM down (an ACPI soft off: SIGTERM to everything, then `notice` — the OS's
    stop timeout unless given — before the power goes), then TERMINATED, or deleted."""
    store = ctx.store
    with instance.flow_lock:
        with store.lock:
            if instance.gone:
                if operation is not None:
                    store.finish(operation)
                return
            present = instance.in_plane
        if present:
            wait = store.config.shutdown if notice is None else notice
            shutdown = store.clock.scaled(wait) if graceful else 0.0
            ctx.plane.stop_node(instance.plane_key, 0.0 if graceful else None, shutdown)
        if delete:
            if present:
                ctx.plane.delete_node(instance.plane_key)
            pause(store, store.config.delays.deleting, lambda: True)
        with store.lock:
            if delete:
                instance.in_plane = False
                forget(store, instance)
            elif instance.epoch == epoch:
                release(store, instance)
                instance.termination_timestamp = None
                instance.last_stop = store.clock.wall()
                set_status(store, instance, "TERMINATED", instance.status_message)
            store.events.emit("compute.instance.terminated", node=instance.link, detail=why)
            if operation is not None:
                store.finish(operation)
        if not delete:
            push_state(ctx, instance)
        notify_groups(ctx, instance)


def start(ctx: Context, instance: InstanceRecord, epoch: int, operation: OperationRecord) -> None:
    """instances.start of a TERMINATED VM: capacity again, then it boots (the startup script
    runs again) with its disk as it was."""
    store = ctx.store
    with instance.flow_lock:
        with store.lock:
            if not store.alive(instance, epoch):
                store.finish(operation, interrupted(instance.link))
                return
            if not try_allocate(store, [instance]):
                set_status(store, instance, "TERMINATED")
                store.finish(operation, stockout(link(instance.project, "zones", instance.zone)))
                return
            instance.preempted = False
        ran = bring_up(ctx, [instance], lambda: store.alive(instance, epoch))
        with store.lock:
            store.finish(operation, None if ran else interrupted(instance.link))
        notify_groups(ctx, instance)


def notify_groups(ctx: Context, instance: InstanceRecord) -> None:
    """Tell the managing MIG (if any) that one of its instances changed state."""
    if instance.group is not None and ctx.member_changed is not None:
        ctx.member_changed(instance)
