"""The control plane's core: the records, the one lock over them, and the flows' primitives.

flows.py and faults.py are built from these; state.py (CloudTpu) owns one Runtime.

Concurrency model: one lock (`lock`) guards every record. Work that takes time (delays, the
worker plane) runs in a "flow" thread per action (`spawn`); flows on one queued resource are
serialised by its `flow_lock`, and an action that supersedes the running one (delete, preempt,
reset, maintenance, slice failure) bumps the QR's `epoch` (`supersede`) so the old flow stops at
its next step (`alive`, `sleep`). Delete and preempt kill the VMs at once, before waiting for
the flow lock, so they never wait out a maintenance grace.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tpuctl.emulator.control import transitions
from tpuctl.emulator.control.capacity import CapacityPools
from tpuctl.emulator.control.catalog import Reservations
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.config import EmulatorConfig
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.names import parse_child
from tpuctl.emulator.control.operations import Operations
from tpuctl.emulator.control.plane import WorkerPlaneAPI
from tpuctl.emulator.control.records import NodeRecord, QueuedResourceRecord
from tpuctl.emulator.control.status import invalid, not_found

log = logging.getLogger("tpuctl.emulator")

T = TypeVar("T")
R = TypeVar("R")


class Runtime:
    """Records, lock and flow threads; every attribute is read and written under `lock`."""

    def __init__(
        self,
        config: EmulatorConfig,
        plane: WorkerPlaneAPI,
        events: EventLog,
        clock: Clock,
        identity_factory: Callable[..., Any],
    ) -> None:
        self.config = config
        self.plane = plane
        self.events = events
        self.clock = clock
        self.identity = identity_factory  # builds the worker plane's NodeIdentity
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.pools = CapacityPools(config.capacity)
        self.flex_pools = CapacityPools(config.flex_capacity)  # provisioningModel FLEX_START
        # Reservation-bound QRs draw from their reservation: one pool per reservation name.
        self.reserved = CapacityPools({})
        self.reservations = Reservations()
        self.qrs: dict[str, QueuedResourceRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.operations = Operations(clock, self.lock)
        self.closing = False
        self._threads: set[threading.Thread] = set()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tpu-plane")

    # ------------------------------------------------------------------------- lookups
    def qr(self, name: str) -> QueuedResourceRecord:
        parse_child(name, "queuedResources")
        record = self.qrs.get(name)
        if record is None:
            raise not_found("queuedResource", name)
        return record

    def node(self, name: str) -> NodeRecord:
        parse_child(name, "nodes")
        record = self.nodes.get(name)
        if record is None:
            raise not_found("node", name)
        return record

    def qr_nodes(self, qr: QueuedResourceRecord | None) -> list[NodeRecord]:
        """The QR's nodes that still exist, in slice order."""
        if qr is None:
            return []
        return [self.nodes[name] for name in qr.node_names if name in self.nodes]

    def resolve_qr(self, name: str) -> str:
        """A full QR name, or a bare id when it names exactly one QR."""
        return _resolve(name, self.qrs, "queuedResources")

    def resolve_node(self, name: str) -> str:
        return _resolve(name, self.nodes, "nodes")

    # --------------------------------------------------------------------------- states
    def set_qr_state(self, qr: QueuedResourceRecord, state: int, initiator: int = 0) -> None:
        transitions.set_qr_state(qr, state, self.events, initiator)
        self.cond.notify_all()

    def set_node_state(self, node: NodeRecord, state: int, health: int | None = None) -> None:
        transitions.set_node_state(node, state, self.events, health)

    def pool_of(self, qr: QueuedResourceRecord) -> tuple[CapacityPools, str, str | None]:
        """(pools, key, zone) the QR draws its chips from: its generation's pool (flex-start's
        own for FLEX_START), or its reservation's."""
        plan = qr.plan
        if plan.tier == "reservation-bound":
            return self.reserved, plan.reservation, None
        pools = self.flex_pools if plan.tier == "flex-start" else self.pools
        return pools, plan.accelerator.generation, plan.zone

    def release(self, qr: QueuedResourceRecord) -> None:
        """Give the QR's chips back to its pool, waking QRs that wait for capacity."""
        pools, _key, _zone = self.pool_of(qr)
        if pools.release(qr.name):
            self.events.emit("capacity.release", qr=qr.name)
            self.cond.notify_all()

    # --------------------------------------------------------------------------- flows
    def spawn(self, flow: Callable[..., None], *args: Any) -> None:
        """Run `flow(self, *args)` in a thread of its own."""

        def run() -> None:
            try:
                flow(self, *args)
            except Exception:
                if not self.closing:  # at shutdown the worker plane goes away under flows
                    log.exception("emulator flow %s failed", flow.__name__)
            finally:
                with self.lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"flow-{flow.__name__}", daemon=True)
        with self.lock:
            self._threads.add(thread)
        thread.start()

    def parallel(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`fn` over `items` on the worker-plane pool (inline for one item)."""
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._pool.map(fn, items))

    def alive(self, qr: QueuedResourceRecord, epoch: int) -> bool:
        """Whether the flow that started at `epoch` still owns the QR."""
        return not self.closing and qr.epoch == epoch and self.qrs.get(qr.name) is qr

    def supersede(self, qr: QueuedResourceRecord) -> int:
        """Stop the QR's running flow at its next step; the epoch of the flow replacing it."""
        qr.epoch += 1
        self.cond.notify_all()
        return qr.epoch

    def sleep(
        self, qr: QueuedResourceRecord, epoch: int, seconds: float, *, scaled: bool = False
    ) -> bool:
        """Wait `seconds` (emulated, unless `scaled`); False as soon as the flow is superseded."""
        wait = seconds if scaled else self.clock.scaled(seconds)
        end = self.clock.monotonic() + wait
        with self.cond:
            while True:
                if not self.alive(qr, epoch):
                    return False
                left = end - self.clock.monotonic()
                if left <= 0:
                    return True
                self.cond.wait(left)

    def plain_sleep(self, seconds: float) -> None:
        """Wait `seconds` of real time, or until the emulator closes."""
        end = self.clock.monotonic() + seconds
        with self.cond:
            while not self.closing:
                left = end - self.clock.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self.cond.notify_all()
            threads = list(self._threads)
        deadline = self.clock.monotonic() + 5.0  # then the worker plane kills what is left
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - self.clock.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)


def _resolve(name: str, table: dict[str, Any], collection: str) -> str:
    if "/" in name:
        return name
    matches = [key for key in table if key.endswith(f"/{collection}/{name}")]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise not_found(collection.rstrip("s"), name)
    raise invalid(f"{name!r} is ambiguous: {', '.join(sorted(matches))}")
