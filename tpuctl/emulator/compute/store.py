"""The Compute Engine fake's records, the one lock over them, operations, request IDs, capacity
and the flow threads that do what takes emulated time.

Concurrency as in the Cloud TPU side (control/runtime.py): one lock guards every record; a flow
runs in a thread of its own, serialised per instance by its `flow_lock`; an action that
supersedes the running one (delete, stop, preemption, maintenance) bumps the instance's `epoch`
and the old flow stops at its next step. Worker-plane calls block, so they are made off the lock.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from tpuctl.emulator.compute import catalog
from tpuctl.emulator.compute.catalog import MachineType, Slice
from tpuctl.emulator.compute.errors import OperationError, not_found
from tpuctl.emulator.compute.links import link
from tpuctl.emulator.control.capacity import CapacityPools
from tpuctl.emulator.control.clock import Clock, rfc3339
from tpuctl.emulator.control.config import DEFAULT_CAPACITY_CHIPS, EmulatorConfig
from tpuctl.emulator.control.events import EventLog

log = logging.getLogger("tpuctl.emulator")

Scope = tuple[str, str]  # ("zones", Z) | ("regions", R) | ("global", "")
USER = "emulator@tpuctl.invalid"  # who an operation says started it


def new_id() -> str:
    """A resource id: a uint64 as Compute Engine writes it (a string of digits)."""
    return str(random.getrandbits(63) | (1 << 60))


def fingerprint(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


@dataclass
class OperationRecord:
    name: str
    project: str
    scope: Scope
    operation_type: str
    target_link: str
    target_id: str
    insert_time: datetime
    request_id: str = ""
    id: str = field(default_factory=new_id)
    status: str = "RUNNING"
    start_time: datetime | None = None
    end_time: datetime | None = None
    error: OperationError | None = None
    status_message: str = ""

    @property
    def link(self) -> str:
        kind, where = self.scope
        return (
            link(self.project, "global", "operations", self.name)
            if kind == "global"
            else link(self.project, kind, where, "operations", self.name)
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self.id,
            "name": self.name,
            "operationType": self.operation_type,
            "targetLink": self.target_link,
            "targetId": self.target_id,
            "status": self.status,
            "user": USER,
            "progress": 100 if self.status == "DONE" else 0,
            "insertTime": rfc3339(self.insert_time),
            "selfLink": self.link,
        }
        kind, where = self.scope
        if kind == "zones":
            body["zone"] = link(self.project, "zones", where)
        elif kind == "regions":
            body["region"] = link(self.project, "regions", where)
        if self.request_id:
            body["clientOperationId"] = self.request_id
        if self.start_time is not None:
            body["startTime"] = rfc3339(self.start_time)
        if self.end_time is not None:
            body["endTime"] = rfc3339(self.end_time)
        if self.status_message:
            body["statusMessage"] = self.status_message
        if self.error is not None:
            body.update(self.error.fields())
        return body


@dataclass
class InstanceRecord:
    project: str
    zone: str
    name: str
    body: dict[str, Any]  # as sent, checked against the schema
    machine: MachineType
    slice: Slice
    created: datetime
    model: str  # scheduling.provisioningModel
    action: str  # scheduling.instanceTerminationAction
    run_duration: float | None  # scheduling.maxRunDuration, emulated seconds
    termination_time: datetime | None  # scheduling.terminationTime
    wait_window: float | None  # params.requestValidForDuration, emulated seconds
    items: dict[str, str]  # the user's metadata items
    external: bool  # an access config: reachable from anywhere, else only via IAP / the VPC
    id: str = field(default_factory=new_id)
    status: str = "PROVISIONING"
    status_message: str = ""
    platform: dict[str, str] = field(default_factory=dict)  # metadata the platform adds
    group: str | None = None  # the managing MIG's selfLink
    worker: int = 0
    termination_timestamp: datetime | None = None
    upcoming: dict[str, Any] | None = None  # resourceStatus.upcomingMaintenance
    preempted: bool = False
    maintenance_event: str = "NONE"
    in_plane: bool = False
    ip: str = ""
    host_key: str = ""  # "ssh-ed25519 AAAA…"
    last_start: datetime | None = None
    last_stop: datetime | None = None
    gone: bool = False  # deleted (the record lingers only in running flows)
    epoch: int = 0
    metadata_version: int = 0
    flow_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def link(self) -> str:
        return link(self.project, "zones", self.zone, "instances", self.name)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.project, self.zone, self.name)

    @property
    def plane_key(self) -> str:
        """Its VM in the worker plane (and folder under vms/): four dotted parts, so never a
        Cloud TPU node's key (at most three)."""
        return f"{self.name}.{self.zone}.{self.project}.gce"

    @property
    def metadata(self) -> dict[str, str]:
        """Its metadata items as the API and the metadata server show them: the user's, and
        the keys the platform adds for a TPU VM (which win)."""
        return {**self.items, **self.platform}

    @property
    def metadata_fingerprint(self) -> str:
        return fingerprint((self.metadata_version, sorted(self.items.items())))

    @property
    def preemptible(self) -> bool:
        return self.model == "SPOT" or bool(self.body.get("scheduling", {}).get("preemptible"))


@dataclass
class TemplateRecord:
    project: str
    region: str | None  # None: a global template
    name: str
    body: dict[str, Any]
    created: datetime
    id: str = field(default_factory=new_id)

    @property
    def scope(self) -> Scope:
        return ("regions", self.region) if self.region else ("global", "")

    @property
    def link(self) -> str:
        return link(self.project, *self.scope, "instanceTemplates", self.name)


@dataclass
class PolicyRecord:
    project: str
    region: str
    name: str
    body: dict[str, Any]
    created: datetime
    id: str = field(default_factory=new_id)

    @property
    def scope(self) -> Scope:
        return ("regions", self.region)

    @property
    def link(self) -> str:
        return link(self.project, *self.scope, "resourcePolicies", self.name)


@dataclass
class GroupRecord:
    """A managed instance group, zonal or regional."""

    project: str
    scope: Scope
    name: str
    body: dict[str, Any]
    created: datetime
    template: TemplateRecord
    machine: MachineType
    slice: Slice  # the accelerator topology of the workload policy, or one VM's
    topology: str | None  # the workload policy's acceleratorTopology
    zone: str  # where its instances live
    target_size: int
    id: str = field(default_factory=new_id)
    members: list[str] = field(default_factory=list)  # managed instance names
    state: str = "WAITING"  # WAITING → CREATING → READY; DELETING
    progress_error: OperationError | None = None  # bulkInstanceOperation.lastProgressCheck
    progress_time: datetime | None = None
    epoch: int = 0
    deleting: bool = False

    @property
    def link(self) -> str:
        kind, where = self.scope
        return link(self.project, kind, where, "instanceGroupManagers", self.name)

    @property
    def key(self) -> tuple[str, Scope, str]:
        return (self.project, self.scope, self.name)


class Store:
    """Every record of the fake and the one lock over them; see the module docstring."""

    def __init__(self, config: EmulatorConfig, events: EventLog, clock: Clock) -> None:
        self.config = config
        self.events = events
        self.clock = clock
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.pools = CapacityPools(dict.fromkeys(catalog.GENERATIONS, DEFAULT_CAPACITY_CHIPS))
        self.instances: dict[tuple[str, str, str], InstanceRecord] = {}
        self.templates: dict[str, TemplateRecord] = {}  # by selfLink
        self.policies: dict[str, PolicyRecord] = {}
        self.groups: dict[tuple[str, Scope, str], GroupRecord] = {}
        self.operations: dict[str, OperationRecord] = {}  # by selfLink
        self._requests: dict[tuple[str, str], str] = {}  # (project, requestId) → operation
        self.closing = False
        self._threads: set[threading.Thread] = set()

    # ----------------------------------------------------------------------- lookups
    def instance(self, project: str, zone: str, name: str) -> InstanceRecord:
        found = self.instances.get((project, zone, name))
        if found is None:
            raise not_found(link(project, "zones", zone, "instances", name))
        return found

    def group(self, project: str, scope: Scope, name: str) -> GroupRecord:
        found = self.groups.get((project, scope, name))
        if found is None:
            kind, where = scope
            raise not_found(link(project, kind, where, "instanceGroupManagers", name))
        return found

    # -------------------------------------------------------------------- operations
    def replay(self, project: str, request_id: str) -> OperationRecord | None:
        """The operation an earlier request with this requestId started."""
        if not request_id:
            return None
        name = self._requests.get((project, request_id))
        return self.operations.get(name) if name else None

    def start_operation(
        self,
        project: str,
        scope: Scope,
        operation_type: str,
        target_link: str,
        target_id: str,
        *,
        request_id: str = "",
        done: bool = False,
    ) -> OperationRecord:
        """A new operation on `target_link` (under the lock); `done`: over as it starts, what
        a change made in one step answers (a template's or a resource policy's insert and
        delete)."""
        now = self.clock.wall()
        name = f"operation-{int(now.timestamp() * 1000)}-{uuid.uuid4().hex[:12]}"
        operation = OperationRecord(
            name=name,
            project=project,
            scope=scope,
            operation_type=operation_type,
            target_link=target_link,
            target_id=target_id,
            insert_time=now,
            start_time=now,
            request_id=request_id,
        )
        self.operations[operation.link] = operation
        if request_id:
            self._requests[(project, request_id)] = operation.link
        if done:
            self.finish(operation)
        return operation

    def finish(self, operation: OperationRecord, error: OperationError | None = None) -> None:
        """End `operation` (under the lock); one that ended keeps its first outcome."""
        if operation.status == "DONE":
            return
        operation.status = "DONE"
        operation.error = error
        operation.end_time = self.clock.wall()
        self.cond.notify_all()

    def system_event(self, instance: InstanceRecord, operation_type: str, message: str) -> None:
        """An operation the platform started (a preemption, host maintenance), already DONE,
        as Compute Engine lists them among the zone's operations."""
        operation = self.start_operation(
            instance.project, ("zones", instance.zone), operation_type, instance.link, instance.id
        )
        operation.status_message = message
        self.finish(operation)

    def operation(self, project: str, scope: Scope, name: str) -> OperationRecord:
        kind, where = scope
        key = (
            link(project, "global", "operations", name)
            if kind == "global"
            else link(project, kind, where, "operations", name)
        )
        found = self.operations.get(key)
        if found is None:
            raise not_found(key)
        return found

    # ------------------------------------------------------------------------- flows
    def spawn(self, flow: Callable[..., None], *args: Any) -> None:
        """Run `flow(*args)` in a thread of its own."""

        def run() -> None:
            try:
                flow(*args)
            except Exception:
                if not self.closing:
                    log.exception("compute flow %s failed", flow.__name__)
            finally:
                with self.lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"gce-{flow.__name__}", daemon=True)
        with self.lock:
            self._threads.add(thread)
        thread.start()

    def alive(self, instance: InstanceRecord, epoch: int) -> bool:
        return not self.closing and not instance.gone and instance.epoch == epoch

    def supersede(self, instance: InstanceRecord) -> int:
        instance.epoch += 1
        self.cond.notify_all()
        return instance.epoch

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait (real seconds) until `done()` under the lock, or the timeout, or closing."""
        end = time.monotonic() + timeout
        with self.cond:
            while not done():
                left = end - time.monotonic()
                if left <= 0 or self.closing:
                    return done()
                self.cond.wait(min(left, 1.0))
            return True

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self.cond.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + 5.0
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


Method = TypeVar("Method", bound=Callable[..., dict[str, Any]])


def once_per_request(method: Method) -> Method:
    """A mutating method of the API, with `project` and `request_id` among its parameters and
    the Store as `self.store`: called with the requestId of an earlier call, it answers that
    call's operation and changes nothing. The store's lock is held from the check through the
    change, so two retries at once make one change (so the method makes no worker-plane call,
    which blocks: `set_metadata` checks by hand)."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        named = signature.bind(self, *args, **kwargs).arguments
        store: Store = self.store
        with store.lock:
            replay = store.replay(named["project"], named["request_id"])
            if replay is not None:
                return replay.to_json()
            return method(self, *args, **kwargs)

    return cast(Method, call)
