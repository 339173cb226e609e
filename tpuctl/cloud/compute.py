"""Compute Engine as the source of a spec's slice (`tpu.api: compute`): a TPU VM instance, or a
multi-host slice as a workload policy, an instance template and a bulk MIG, read and driven
through google-cloud-compute and shown as the v2alpha1 queued resource and node the rest of
tpuctl reads.

`ComputeTpuClient` answers the TpuClient calls TpuApi and tpuctl.cloud.nodes make (get, list,
create and delete a queued resource; list and get nodes; guest attributes; a node's metadata
update), with the generated client's keywords, so TpuApi keeps its one retry policy, call
budget and error mapping. A queued resource here is synthesized from what Compute Engine
says:

- instance PENDING or PROVISIONING before it ever ran, a MIG's bulk creation waiting:
  WAITING_FOR_RESOURCES; instance STAGING before it ever ran, topology ACTIVATING:
  PROVISIONING;
- instance RUNNING, topology ACTIVE (or REACTIVATING, a host back from maintenance), a
  started instance down with automaticRestart (host maintenance; its node not READY): ACTIVE;
- an instance preempted (its statusMessage), a MIG host lost: SUSPENDING / SUSPENDED (SERVICE);
- the insert's operation failed (no capacity) and the VM is gone: FAILED, with its error;
- a MIG being deleted (DEACTIVATING), an instance this client deletes: DELETING.

One node per slice, named like the queued resource; its workers ordered by each instance's
`agent-worker-number` metadata (never the MIG's list order). google.cloud.compute_v1 is
imported only inside functions.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tpuctl.cloud.compute_rest import COMPUTE_ENV
from tpuctl.cloud.describe import SOURCE_ATTRIBUTE
from tpuctl.errors import TpuctlError

API = "compute"
WORKER_NUMBER = "agent-worker-number"
# One TPU VM's chips per machine type (docs/compute-engine.md) and how its accelerator type
# counts them: v5p and TPU7x name TensorCores (2 a chip), v6e chips.
MACHINE_CHIPS = {
    "ct5p-hightpu-4t": ("v5p", 4, 2),
    "ct6e-standard-1t": ("v6e", 1, 1),
    "ct6e-standard-4t": ("v6e", 4, 1),
    "ct6e-standard-8t": ("v6e", 8, 1),
    "tpu7x-standard-4t": ("tpu7x", 4, 2),
}
RESOURCE_CLIENTS = {
    "instances": "InstancesClient",
    "resourcePolicies": "ResourcePoliciesClient",
    "instanceTemplates": "InstanceTemplatesClient",
    "regionInstanceTemplates": "RegionInstanceTemplatesClient",
    "instanceGroupManagers": "InstanceGroupManagersClient",
    "regionInstanceGroupManagers": "RegionInstanceGroupManagersClient",
}
RESOURCE_MESSAGES = {
    "instances": ("Instance", "instance_resource"),
    "resourcePolicies": ("ResourcePolicy", "resource_policy_resource"),
    "instanceTemplates": ("InstanceTemplate", "instance_template_resource"),
    "regionInstanceTemplates": ("InstanceTemplate", "instance_template_resource"),
    "instanceGroupManagers": ("InstanceGroupManager", "instance_group_manager_resource"),
    "regionInstanceGroupManagers": ("InstanceGroupManager", "instance_group_manager_resource"),
}
NO_CAPACITY_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "QUOTA_EXCEEDED"}
)
DONE = "DONE"
# An insert overtaken by a delete or a stop before its VM ran ends with this HTTP status.
OVERTAKEN = 409
DELETE_STEP_TIMEOUT = 600.0
OPERATION_POLL = 0.2


class NotServed(TpuctlError):
    """The Compute Engine endpoint has no such method (the emulator serves only a TPU VM's
    part of compute v1)."""


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def short(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def accelerator_of(machine_type: str, hosts: int) -> str:
    """`ct6e-standard-4t` × 2 hosts → `v6e-8`; `ct5p-hightpu-4t` × 2 → `v5p-16`; "" unknown."""
    known = MACHINE_CHIPS.get(short(machine_type))
    if known is None:
        return ""
    generation, chips, per_chip = known
    return f"{generation}-{chips * max(1, hosts) * per_chip}"


def request_ids(request_id: str, count: int) -> list[str]:
    """One requestId per request of a create, each derived from the create's one id, so every
    retry of the same create sends the same ids (Compute Engine then replays, not repeats)."""
    base = uuid.UUID(request_id) if request_id else uuid.uuid4()
    return [str(uuid.uuid5(base, f"tpuctl/{index}")) for index in range(count)]


@dataclass(frozen=True)
class ComputeCreate:
    """A create bound for Compute Engine, read by tpuctl.cloud.lifecycle as a queued
    resource's create request (`queued_resource_id`, `request_id`, `queued_resource` to
    compare with what exists). `requests`: tpuctl.render.compute's ComputeRequests in the
    order they are sent (resource, method, scope, body)."""

    parent: str
    queued_resource_id: str
    request_id: str
    requests: tuple[Any, ...]
    hosts: int
    machine_type: str
    single_host: bool
    needs_rest: bool = False

    @property
    def queued_resource(self) -> Any:
        """The queued resource this create makes, as a read of it would show it."""
        last = self.requests[-1].body if self.requests else {}
        properties = last if self.single_host else self._template_properties()
        return synthesize_queued_resource(
            f"{self.parent}/queuedResources/{self.queued_resource_id}",
            state="ACCEPTED",
            accelerator=accelerator_of(self.machine_type, self.hosts),
            properties=properties,
        )

    def _template_properties(self) -> dict[str, Any]:
        for request in self.requests:
            if request.resource in ("instanceTemplates", "regionInstanceTemplates"):
                return dict(request.body.get("properties") or {})
        return {}

    def as_dict(self) -> dict[str, Any]:
        """What `create --dry-run` shows: every request in order, as `tpuctl render` does."""
        return {
            "requests": [
                {
                    "method": f"{request.resource}.{request.method}",
                    "scope": dict(request.scope),
                    "body": request.body,
                }
                for request in self.requests
            ]
        }


# ----------------------------------------------------------------------- synthesized protos


def _scheduling(properties: Mapping[str, Any]) -> dict[str, Any]:
    return dict(properties.get("scheduling") or {})


def _items(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    return {
        str(item.get("key")): str(item.get("value", ""))
        for item in (metadata or {}).get("items") or []
    }


def synthesize_queued_resource(
    name: str,
    *,
    state: str,
    accelerator: str,
    properties: Mapping[str, Any],
    initiator: str | None = None,
    failure: tuple[int, str] | None = None,
    create_time: str | None = None,
    termination: str | None = None,
) -> Any:
    """A v2alpha1 QueuedResource for a Compute Engine slice: one node spec (node id = the
    queued resource's), the instance's (or template's) labels, its provisioning model as the
    tier; REST-only fields (provisioningModel, runDuration.terminationTime) kept beside it as
    tpuctl.cloud.rest keeps them."""
    from google.cloud import tpu_v2alpha1 as tpu

    from tpuctl.cloud.rest import _REST_FIELDS

    node_id = short(name)
    parent = name.split("/queuedResources/", maxsplit=1)[0]
    scheduling = _scheduling(properties)
    node = tpu.Node(
        accelerator_type=accelerator,
        runtime_version="",
        labels=dict(properties.get("labels") or {}),
    )
    queued_resource = tpu.QueuedResource(
        name=name,
        tpu=tpu.QueuedResource.Tpu(
            node_spec=[tpu.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=node_id, node=node)]
        ),
    )
    queued_resource.state.state = getattr(tpu.QueuedResourceState.State, state)
    if initiator:
        queued_resource.state.state_initiator = getattr(
            tpu.QueuedResourceState.StateInitiator, initiator
        )
    if failure is not None:
        queued_resource.state.failed_data.error.code = failure[0]
        queued_resource.state.failed_data.error.message = failure[1]
    if create_time:
        from tpuctl.clock import parse_rfc3339

        moment = parse_rfc3339(create_time)
        if moment is not None:
            queued_resource.create_time = moment
    model = str(scheduling.get("provisioningModel") or "STANDARD")
    if model == "SPOT" or scheduling.get("preemptible"):
        queued_resource.spot = tpu.QueuedResource.Spot()
    affinity = properties.get("reservationAffinity") or {}
    values = affinity.get("values") or []
    if values:
        queued_resource.reservation_name = str(values[0])
    extra: dict[str, Any] = {"provisioningModel": model}
    if termination:
        extra["runDuration"] = {"terminationTime": termination}
    setattr(queued_resource, _REST_FIELDS, extra)
    setattr(queued_resource, SOURCE_ATTRIBUTE, API)
    return queued_resource


@dataclass
class ComputeSlice:
    """One slice as Compute Engine shows it: a lone instance, or a MIG and its instances
    (camelCase JSON), in worker order."""

    name: str
    instances: list[dict[str, Any]] = field(default_factory=list)
    group: dict[str, Any] | None = None
    template: dict[str, Any] | None = None

    @property
    def properties(self) -> dict[str, Any]:
        if self.group is None:
            return self.instances[0] if self.instances else {}
        return dict((self.template or {}).get("properties") or {})

    @property
    def identity(self) -> str:
        """The id of its instance or MIG (a name can be taken again)."""
        source = self.group if self.group is not None else self.properties
        return str(source.get("id") or source.get("selfLink") or self.name)

    @property
    def hosts(self) -> int:
        """VMs in the slice: its topology's chips over a VM's (a MIG lowers its targetSize
        when a VM's run ends with DELETE), else the target size."""
        if self.group is None:
            return 1
        applied = (self.group.get("status") or {}).get("appliedAcceleratorTopologies") or [{}]
        topology = str(applied[0].get("acceleratorTopology", ""))
        known = MACHINE_CHIPS.get(self.machine_type)
        if topology and known is not None:
            chips = 1
            for size in topology.split("x"):
                chips *= int(size) if size.isdigit() else 1
            return max(1, chips // known[1])
        return int(self.group.get("targetSize", 0))

    @property
    def machine_type(self) -> str:
        return short(str(self.properties.get("machineType", "")))

    @property
    def create_time(self) -> str | None:
        source = self.group if self.group is not None else self.properties
        value = source.get("creationTimestamp")
        return str(value) if value else None


def _preempted(instance: Mapping[str, Any]) -> bool:
    return "preempt" in str(instance.get("statusMessage", "")).lower()


def _maintenance(instance: Mapping[str, Any]) -> str | None:
    upcoming = (instance.get("resourceStatus") or {}).get("upcomingMaintenance") or {}
    return str(upcoming.get("maintenanceStatus") or "PENDING") if upcoming else None


def _coming_back(instance: Mapping[str, Any]) -> bool:
    """A started instance, not preempted, that restarts by itself (host maintenance)."""
    if _preempted(instance) or not instance.get("lastStartTimestamp"):
        return False
    if _maintenance(instance) == "ONGOING":
        return True
    return bool(_scheduling(instance).get("automaticRestart"))


def _termination(slice_: ComputeSlice) -> str | None:
    """When the platform takes the slice back (its VMs' terminationTimestamp, set while a
    maxRunDuration runs)."""
    for instance in slice_.instances:
        scheduling = (instance.get("resourceStatus") or {}).get("scheduling") or {}
        if scheduling.get("terminationTimestamp"):
            return str(scheduling["terminationTimestamp"])
    return None


def run_ended_by(slice_: ComputeSlice) -> str | None:
    """For a MIG whose VMs' maxRunDuration deleted them (flex-start's DELETE action: they
    left the group, none preempted), a time its run had surely ended by: the group's creation
    plus the maxRunDuration (the run started no earlier). None otherwise."""
    if slice_.group is None or len(slice_.instances) >= slice_.hosts:
        return None
    if any(map(_preempted, slice_.instances)):
        return None
    scheduling = _scheduling(slice_.properties)
    seconds = str((scheduling.get("maxRunDuration") or {}).get("seconds", ""))
    created = slice_.create_time
    if scheduling.get("instanceTerminationAction") != "DELETE" or not seconds.isdigit():
        return None
    from datetime import timedelta

    from tpuctl.clock import parse_rfc3339, rfc3339

    start = parse_rfc3339(created) if created else None
    return rfc3339(start + timedelta(seconds=int(seconds))) if start else None


def instance_state(instance: Mapping[str, Any]) -> tuple[str, str | None]:
    """The queued-resource state (and initiator) of a single-host slice's instance."""
    status = str(instance.get("status", ""))
    started = bool(instance.get("lastStartTimestamp"))
    if status == "RUNNING":
        return "ACTIVE", None
    if _preempted(instance):
        return ("SUSPENDED" if status == "TERMINATED" else "SUSPENDING"), "SERVICE"
    if _coming_back(instance):
        return "ACTIVE", None
    if not started and status in ("PENDING", "PROVISIONING"):
        return "WAITING_FOR_RESOURCES", None
    if not started and status == "STAGING":
        return "PROVISIONING", None
    if status in ("STOPPING", "SUSPENDING"):
        return "SUSPENDING", _stop_initiator(instance)
    if status in ("TERMINATED", "SUSPENDED", "STOPPED"):
        return "SUSPENDED", _stop_initiator(instance)
    return "PROVISIONING", None


def _stop_initiator(instance: Mapping[str, Any]) -> str:
    """A run that reached its maxRunDuration was stopped by the service, else by a user."""
    return "SERVICE" if _scheduling(instance).get("maxRunDuration") else "USER"


def group_state(slice_: ComputeSlice) -> tuple[str, str | None]:
    """The queued-resource state (and initiator) of a MIG slice."""
    assert slice_.group is not None
    status = slice_.group.get("status") or {}
    topologies = status.get("appliedAcceleratorTopologies") or [{}]
    topology = str(topologies[0].get("state", ""))
    if topology == "DEACTIVATING":
        return "DELETING", None
    if (status.get("bulkInstanceOperation") or {}).get("inProgress"):
        started = any(i.get("status") in ("STAGING", "RUNNING") for i in slice_.instances)
        return ("PROVISIONING" if started else "WAITING_FOR_RESOURCES"), None
    if topology in ("ACTIVE", "REACTIVATING"):
        return "ACTIVE", None
    if topology == "INCOMPLETE":
        lost = len(slice_.instances) < slice_.hosts or any(map(_preempted, slice_.instances))
        if not lost and all(
            i.get("status") == "RUNNING" or _coming_back(i) for i in slice_.instances
        ):
            return "ACTIVE", None
        states = [instance_state(i) for i in slice_.instances]
        going = any(state == "SUSPENDING" for state, _ in states)
        initiator = next((who for _, who in states if who), "SERVICE")
        return ("SUSPENDING" if going else "SUSPENDED"), initiator
    return "PROVISIONING", None


def slice_queued_resource(
    name: str, slice_: ComputeSlice, *, deleting: bool = False, termination: str | None = None
) -> Any:
    """The queued resource of a slice Compute Engine holds (`deleting`: asked to go;
    `termination`: its end as seen before, when its VMs no longer say it)."""
    if deleting:
        state, initiator = "DELETING", None
    elif slice_.group is None:
        state, initiator = instance_state(slice_.instances[0])
    else:
        state, initiator = group_state(slice_)
    return synthesize_queued_resource(
        name,
        state=state,
        initiator=initiator,
        accelerator=accelerator_of(slice_.machine_type, slice_.hosts),
        properties=slice_.properties,
        create_time=slice_.create_time,
        termination=_termination(slice_) or termination or run_ended_by(slice_),
    )


def failed_queued_resource(name: str, operation: Mapping[str, Any]) -> Any:
    """The FAILED queued resource of an insert whose operation ended in an error (its VM gone)."""
    errors = (operation.get("error") or {}).get("errors") or [{}]
    message = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors)
    code = int(operation.get("httpErrorStatusCode") or 0)
    return synthesize_queued_resource(
        name,
        state="FAILED",
        accelerator="",
        properties={},
        failure=(code, message.strip(": ")),
        create_time=operation.get("insertTime"),
    )


def _worker_number(instance: Mapping[str, Any], fallback: int) -> int:
    value = _items(instance.get("metadata")).get(WORKER_NUMBER, "")
    return int(value) if value.isdigit() else fallback


def node_state(slice_: ComputeSlice) -> tuple[str, str]:
    """(Node.State, Node.Health) of the slice's one node."""
    statuses = [str(i.get("status", "")) for i in slice_.instances]
    if any(_maintenance(i) == "ONGOING" for i in slice_.instances):
        state = "READY" if all(s == "RUNNING" for s in statuses) else "RESTARTING"
        return state, "UNHEALTHY_MAINTENANCE"
    if statuses and all(s == "RUNNING" for s in statuses) and len(statuses) >= slice_.hosts:
        return "READY", "HEALTHY"
    if any(map(_preempted, slice_.instances)):
        return "PREEMPTED", "HEALTH_UNSPECIFIED"
    if any(s in ("STOPPING", "SUSPENDING") for s in statuses):
        return "STOPPING", "HEALTH_UNSPECIFIED"
    if any(s in ("TERMINATED", "STOPPED", "SUSPENDED") for s in statuses):
        return "STOPPED", "HEALTH_UNSPECIFIED"
    return "CREATING", "HEALTH_UNSPECIFIED"


def slice_node(node_name: str, queued_resource: str, slice_: ComputeSlice) -> Any:
    """The v2alpha1 Node of a slice: workers in `agent-worker-number` order."""
    from google.cloud import tpu_v2alpha1 as tpu

    state, health = node_state(slice_)
    endpoints = []
    for instance in slice_.instances:
        nic = (instance.get("networkInterfaces") or [{}])[0]
        access = (nic.get("accessConfigs") or [{}])[0]
        endpoint = tpu.NetworkEndpoint(ip_address=str(nic.get("networkIP", "")), port=8470)
        if access.get("natIP"):
            endpoint.access_config = tpu.AccessConfig(external_ip=str(access["natIP"]))
        endpoints.append(endpoint)
    first = slice_.instances[0] if slice_.instances else {}
    node = tpu.Node(
        name=node_name,
        accelerator_type=accelerator_of(slice_.machine_type, slice_.hosts),
        state=getattr(tpu.Node.State, state),
        health=getattr(tpu.Node.Health, health),
        network_endpoints=endpoints,
        metadata=_items(first.get("metadata")),
        labels=dict(first.get("labels") or slice_.properties.get("labels") or {}),
        queued_resource=queued_resource,
    )
    upcoming = next(
        (
            (i.get("resourceStatus") or {}).get("upcomingMaintenance")
            for i in slice_.instances
            if _maintenance(i) == "PENDING"
        ),
        None,
    )
    if upcoming:
        node.upcoming_maintenance = tpu.UpcomingMaintenance(
            maintenance_status=tpu.UpcomingMaintenance.MaintenanceStatus.PENDING,
            can_reschedule=bool(upcoming.get("canReschedule", False)),
        )
    created = slice_.create_time
    if created:
        from tpuctl.clock import parse_rfc3339

        moment = parse_rfc3339(created)
        if moment is not None:
            node.create_time = moment
    return node


# ------------------------------------------------------------------------------ operations


class ComputeOperation:
    """A create's, delete's or metadata update's Compute Engine operations, used as
    google.api_core's Operation is: `done(retry=)` polls, `result(timeout=)` raises the
    operation's error as the google.api_core exception of its HTTP status.

    `accepted`: a create counts as done once what it makes exists (as a queued resource's
    create is done once it is queued); the insert's own operation may run until capacity."""

    def __init__(
        self,
        backend: ComputeTpuClient,
        operations: list[Any],
        accepted: Callable[[], bool] | None = None,
    ) -> None:
        self.backend = backend
        self.operations = operations
        self.accepted = accepted
        self.creating = accepted is not None
        self._finished: list[dict[str, Any]] = []

    @property
    def operation(self) -> Any:
        from types import SimpleNamespace

        name = str(getattr(self.operations[-1], "name", "")) if self.operations else ""
        return SimpleNamespace(name=name, done=False)

    def _poll(self) -> list[dict[str, Any]]:
        return [self.backend.operation(op) for op in self.operations]

    def done(self, retry: Any = None, timeout: Any = None) -> bool:
        current = self._poll() if retry is None else retry(self._poll)()
        self._finished = current
        if all(op.get("status") == DONE for op in current):
            return True
        if any(op.get("status") == DONE and op.get("error") for op in current):
            return True
        return self.accepted is not None and self.accepted()

    def result(self, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or 0.0)
        while not self.done():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.operation.name} is still running")
            time.sleep(OPERATION_POLL)
        for op in self._finished:
            if op.get("error"):
                error = operation_error(op)
                if self.creating and _no_capacity(op):
                    # Refused at once: nothing was made, as the TPU API's RESOURCE_EXHAUSTED
                    # create; its operation's record would read as a FAILED slice.
                    self.backend.forget(op)
                raise error
        return None


def _no_capacity(operation: Mapping[str, Any]) -> bool:
    errors = (operation.get("error") or {}).get("errors") or []
    return any(e.get("code") in NO_CAPACITY_CODES for e in errors)


def operation_error(operation: Mapping[str, Any]) -> Exception:
    """A failed operation as the google.api_core exception its status means; no capacity is
    RESOURCE_EXHAUSTED (a create refused, as the TPU API says it)."""
    from google.api_core import exceptions

    errors = (operation.get("error") or {}).get("errors") or [{}]
    message = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors)
    if _no_capacity(operation):
        return _google_error("ResourceExhausted", message)
    status = int(operation.get("httpErrorStatusCode") or 500)
    made: Exception = exceptions.from_http_status(status, message)  # type: ignore[no-untyped-call]
    return made


def _google_error(kind: str, message: str) -> Exception:
    """google.api_core's exception `kind` (its constructors are untyped)."""
    from google.api_core import exceptions

    made: Exception = getattr(exceptions, kind)(message)
    return made


def _as_json(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        type(message).to_json(message, indent=None, use_integers_for_enums=False)
    )
    return data


class _Conflicts:
    """Compute Engine's 409 for a name in use as gRPC's ALREADY_EXISTS (what TpuApi's create
    turns into its idempotency check); 412 (a stale fingerprint) as ABORTED (retried)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        from google.api_core import exceptions

        if (
            isinstance(error, exceptions.Conflict)
            and not isinstance(error, exceptions.AlreadyExists)
            and ("already exists" in str(error).lower() or "alreadyExists" in str(error))
        ):
            raise _google_error("AlreadyExists", str(error.message)) from None
        if isinstance(error, exceptions.PreconditionFailed):
            raise _google_error("Aborted", str(error.message)) from None
        if isinstance(error, exceptions.BadRequest) and not isinstance(
            error, exceptions.InvalidArgument
        ):
            raise _google_error("InvalidArgument", str(error.message)) from None


# ---------------------------------------------------------------------------------- client


class ComputeTpuClient:
    """The TpuClient face over Compute Engine (see the module doc). `options` are the
    compute_v1 clients' ClientOptions (the endpoint), `credentials` theirs."""

    def __init__(self, credentials: Any, api_endpoint: str | None = None) -> None:
        self.credentials = credentials
        self.api_endpoint = api_endpoint
        self._clients: dict[str, Any] = {}
        # The ids of the instances this client asked to delete: Compute Engine shows a
        # deleting instance as STOPPING, which alone would read as a suspension (ids, not
        # names: the slice made again under the same name is another instance).
        self._deleting: set[str] = set()
        # The end of each slice's run as last seen (its VMs stop saying it once they go).
        self._ends: dict[str, str] = {}

    @classmethod
    def connect(
        cls, credentials: Any, environ: Mapping[str, str] | None = None
    ) -> ComputeTpuClient:
        import os

        env = os.environ if environ is None else environ
        endpoint = env.get(COMPUTE_ENV, "").strip().rstrip("/") or None
        if endpoint and "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        return cls(credentials, endpoint)

    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1

            options = ClientOptions(api_endpoint=self.api_endpoint) if self.api_endpoint else None
            self._clients[kind] = getattr(compute_v1, kind)(
                credentials=self.credentials, client_options=options, transport="rest"
            )
        return self._clients[kind]

    # -------------------------------------------------------------------------- operations

    def operation(self, operation: Any) -> dict[str, Any]:
        """The current state of an operation (an ExtendedOperation or its JSON), read through
        the operations client of its scope built with our endpoint (the ExtendedOperation's
        own polling ignores it)."""
        data = operation if isinstance(operation, dict) else _operation_json(operation)
        if data.get("status") == DONE:
            return data
        project = _project_of(str(data.get("selfLink") or data.get("targetLink") or ""))
        name = str(data.get("name", ""))
        with _Conflicts():
            if data.get("zone"):
                current = self._client("ZoneOperationsClient").get(
                    project=project, zone=short(str(data["zone"])), operation=name
                )
            elif data.get("region"):
                current = self._client("RegionOperationsClient").get(
                    project=project, region=short(str(data["region"])), operation=name
                )
            else:
                current = self._client("GlobalOperationsClient").get(
                    project=project, operation=name
                )
        return _as_json(current)

    def forget(self, operation: Mapping[str, Any]) -> None:
        """Delete a zone operation's record (best effort)."""
        from google.api_core import exceptions

        zone = short(str(operation.get("zone", "")))
        if not zone:
            return
        with contextlib.suppress(exceptions.GoogleAPICallError):
            self._client("ZoneOperationsClient").delete(
                project=_project_of(str(operation.get("selfLink", ""))),
                zone=zone,
                operation=str(operation.get("name", "")),
            )

    def wait_done(self, operation: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            data = self.operation(operation)
            if data.get("status") == DONE:
                if data.get("error"):
                    raise operation_error(data)
                return data
            if time.monotonic() >= deadline:
                raise _google_error(
                    "DeadlineExceeded", f"{data.get('name')} did not finish in time"
                )
            time.sleep(OPERATION_POLL)
            operation = data

    # ---------------------------------------------------------------------------- reading

    def find_slice(self, project: str, zone: str, name: str) -> ComputeSlice | None:
        """The slice named `name`: the instance of that name, else the MIG of that name."""
        from google.api_core import exceptions

        try:
            instance = self._client("InstancesClient").get(
                project=project, zone=zone, instance=name
            )
        except exceptions.NotFound:
            pass
        else:
            data = _as_json(instance)
            if WORKER_NUMBER in _items(data.get("metadata")) and "created-by" in _items(
                data.get("metadata")
            ):
                pass  # a MIG's member named like the slice: the MIG below is the slice
            else:
                return ComputeSlice(name, [data])
        try:
            group = self._client("InstanceGroupManagersClient").get(
                project=project, zone=zone, instance_group_manager=name
            )
        except exceptions.NotFound:
            return None
        return self._group_slice(project, zone, _as_json(group))

    def _group_slice(self, project: str, zone: str, group: dict[str, Any]) -> ComputeSlice:
        from google.api_core import exceptions

        managed = self._client("InstanceGroupManagersClient").list_managed_instances(
            project=project, zone=zone, instance_group_manager=str(group["name"])
        )
        instances = []
        for entry in managed:
            try:
                instance = self._client("InstancesClient").get(
                    project=project, zone=zone, instance=entry.name
                )
            except exceptions.NotFound:
                continue
            instances.append(_as_json(instance))
        ordered = sorted(
            enumerate(instances), key=lambda pair: _worker_number(pair[1], 10_000 + pair[0])
        )
        template = self._template(str(group.get("instanceTemplate", "")))
        return ComputeSlice(str(group["name"]), [i for _, i in ordered], group, template)

    def _template(self, link: str) -> dict[str, Any] | None:
        from google.api_core import exceptions

        if not link:
            return None
        parts = link.split("/")
        project = _project_of(link)
        try:
            if "regions" in parts:
                region = parts[parts.index("regions") + 1]
                found = self._client("RegionInstanceTemplatesClient").get(
                    project=project, region=region, instance_template=short(link)
                )
            else:
                found = self._client("InstanceTemplatesClient").get(
                    project=project, instance_template=short(link)
                )
        except exceptions.NotFound:
            return None
        return _as_json(found)

    def failed_insert(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """The newest insert of instance `name` in `zone` that failed (no capacity, …; not
        one a delete overtook), if any."""
        listed = self._client("ZoneOperationsClient").list(
            request={"project": project, "zone": zone, "filter": "operationType = insert"}
        )
        found = None
        for operation in listed:
            data = _as_json(operation)
            if short(str(data.get("targetLink", ""))) != name or not data.get("error"):
                continue
            if int(data.get("httpErrorStatusCode") or 0) == OVERTAKEN:
                continue  # deleted (or stopped) before it ran: gone, not failed
            if found is None or str(data.get("insertTime", "")) >= str(found.get("insertTime")):
                found = data
        return found

    def slices(self, project: str, zone: str) -> list[ComputeSlice]:
        """Every slice in the zone: lone instances (not a MIG's) and MIGs."""
        slices: list[ComputeSlice] = []
        for instance in self._client("InstancesClient").list(project=project, zone=zone):
            data = _as_json(instance)
            if "created-by" not in _items(data.get("metadata")):
                slices.append(ComputeSlice(str(data["name"]), [data]))
        for group in self._client("InstanceGroupManagersClient").list(project=project, zone=zone):
            slices.append(self._group_slice(project, zone, _as_json(group)))
        return slices

    # ------------------------------------------------------------- what doctor reads

    def machine_type(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """The zone's machine type `name`, or None when the zone has none of that name."""
        return self._found(
            "MachineTypesClient", "get", project=project, zone=zone, machine_type=name
        )

    def image(self, source: str) -> dict[str, Any] | None:
        """The image a boot disk's sourceImage names (`projects/P/global/images/family/F`
        or `…/images/NAME`), or None when there is none."""
        project = _after(source, "projects")
        if "/family/" in source:
            return self._found(
                "ImagesClient", "get_from_family", project=project, family=short(source)
            )
        return self._found("ImagesClient", "get", project=project, image=short(source))

    def reservation(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        return self._found(
            "ReservationsClient", "get", project=project, zone=zone, reservation=name
        )

    def _found(self, kind: str, method: str, **request: str) -> dict[str, Any] | None:
        from google.api_core import exceptions

        try:
            found = getattr(self._client(kind), method)(request=request)
        except exceptions.NotFound as error:
            # The emulator's Compute Engine answers a method it lacks with a 404 of its own.
            if any(words in str(error.message) for words in ("No such path", "No such method")):
                raise NotServed(f"{kind.removesuffix('Client')}.{method}") from None
            return None
        return _as_json(found)

    # ---------------------------------------------------------- the TpuClient face: reads

    def get_queued_resource(self, name: str, retry: Any = None, timeout: Any = None) -> Any:

        project, zone, slice_name = _parts(name)
        found = self._call(retry, lambda: self.find_slice(project, zone, slice_name))
        if found is not None:
            end = _termination(found)
            if end:
                self._ends[found.identity] = end
            deleting = found.identity in self._deleting
            return slice_queued_resource(
                name, found, deleting=deleting, termination=self._ends.get(found.identity)
            )
        failed = self._call(retry, lambda: self.failed_insert(project, zone, slice_name))
        if failed is not None:
            return failed_queued_resource(name, failed)
        raise _google_error("NotFound", f"{name} not found (no instance or MIG of that name)")

    def list_queued_resources(self, parent: str, retry: Any = None, timeout: Any = None) -> Any:
        project, zone = _parent(parent)
        found = self._call(retry, lambda: self.slices(project, zone))
        return [
            slice_queued_resource(f"{parent}/queuedResources/{s.name}", s)
            for s in found
            if s.instances or s.group is not None
        ]

    def list_nodes(self, parent: str, retry: Any = None, timeout: Any = None) -> Any:
        project, zone = _parent(parent)
        found = self._call(retry, lambda: self.slices(project, zone))
        return [
            slice_node(f"{parent}/nodes/{s.name}", f"{parent}/queuedResources/{s.name}", s)
            for s in found
            if s.instances
        ]

    def get_node(self, name: str, retry: Any = None, timeout: Any = None) -> Any:

        project, zone, slice_name = _parts(name)
        found = self._call(retry, lambda: self.find_slice(project, zone, slice_name))
        if found is None or not found.instances:
            raise _google_error("NotFound", f"{name} not found")
        parent = name.split("/nodes/", maxsplit=1)[0]
        return slice_node(name, f"{parent}/queuedResources/{slice_name}", found)

    def get_guest_attributes(
        self, request: Mapping[str, Any], retry: Any = None, timeout: Any = None
    ) -> Any:
        """Each worker's guest attributes in worker order (`hostkeys/` as Compute Engine
        publishes them); without a query path, also `hostname`: the instance's name."""
        from google.api_core import exceptions
        from google.cloud import tpu_v2alpha1 as tpu

        name = str(request["name"])
        query = str(request.get("query_path") or "")
        project, zone, slice_name = _parts(name)
        found = self._call(retry, lambda: self.find_slice(project, zone, slice_name))
        if found is None:
            raise _google_error("NotFound", f"{name} not found")
        answers = []
        for instance in found.instances:
            entries = []
            try:
                published = self._client("InstancesClient").get_guest_attributes(
                    request={
                        "project": project,
                        "zone": zone,
                        "instance": str(instance["name"]),
                        "query_path": query or "hostkeys/",
                    }
                )
                entries = [
                    tpu.GuestAttributesEntry(namespace=e.namespace, key=e.key, value=e.value)
                    for e in published.query_value.items
                ]
            except exceptions.NotFound:
                pass  # nothing published (yet, or guest attributes off)
            if not query:
                entries.append(tpu.GuestAttributesEntry(key="hostname", value=instance["name"]))
            answers.append(
                tpu.GuestAttributes(
                    query_path=query, query_value=tpu.GuestAttributesValue(items=entries)
                )
            )
        return tpu.GetGuestAttributesResponse(guest_attributes=answers)

    # --------------------------------------------------------- the TpuClient face: writes

    def create_queued_resource(
        self, request: ComputeCreate, retry: Any = None, timeout: Any = None
    ) -> ComputeOperation:
        """Send the create's requests in order, each with its own requestId derived from the
        create's. A workload policy or template already there from an earlier attempt of
        ours is taken as made; the last insert (instance or MIG) is the operation returned."""
        from google.api_core import exceptions

        project, zone = _parent(request.parent)
        ids = request_ids(request.request_id, len(request.requests))
        last: Any = None
        for index, sent in enumerate(request.requests):
            is_last = index == len(request.requests) - 1
            try:
                operation = self._call(retry, partial(self._insert, sent, ids[index]))
            except exceptions.AlreadyExists:
                if is_last:
                    raise
                continue  # an earlier attempt of this create made it
            if is_last:
                last = operation
            else:
                self.wait_done(operation, DELETE_STEP_TIMEOUT)
        name = request.queued_resource_id

        def accepted() -> bool:
            return self.find_slice(project, zone, name) is not None

        return ComputeOperation(self, [last], accepted)

    def _insert(self, sent: Any, request_id: str) -> Any:
        from google.cloud import compute_v1

        kind, keyword = RESOURCE_MESSAGES[sent.resource]
        message = getattr(compute_v1, kind).from_json(json.dumps(sent.body))
        client = self._client(RESOURCE_CLIENTS[sent.resource])
        with _Conflicts():
            return client.insert(
                request={**dict(sent.scope), keyword: message, "request_id": request_id}
            )

    def delete_queued_resource(
        self, request: Any, retry: Any = None, timeout: Any = None
    ) -> ComputeOperation:
        """Delete the slice: the instance; or the MIG (which cancels a bulk creation that
        still waits), then, once it is gone, its template and workload policy. A FAILED one
        (an insert that failed) is cleared by deleting that operation's record."""

        project, zone, name = _parts(str(request.name))
        request_id = str(request.request_id or "") or str(uuid.uuid4())
        found = self._call(retry, lambda: self.find_slice(project, zone, name))
        if found is None:
            failed = self.failed_insert(project, zone, name)
            if failed is None:
                raise _google_error("NotFound", f"{request.name} not found")
            self._client("ZoneOperationsClient").delete(
                project=project, zone=zone, operation=str(failed["name"])
            )
            return ComputeOperation(self, [])
        self._deleting.add(found.identity)
        if found.group is None:
            with _Conflicts():
                operation = self._call(
                    retry,
                    lambda: self._client("InstancesClient").delete(
                        request={
                            "project": project,
                            "zone": zone,
                            "instance": name,
                            "request_id": request_id,
                        }
                    ),
                )
            return ComputeOperation(self, [operation])
        with _Conflicts():
            operation = self._call(
                retry,
                lambda: self._client("InstanceGroupManagersClient").delete(
                    request={
                        "project": project,
                        "zone": zone,
                        "instance_group_manager": name,
                        "request_id": request_id,
                    }
                ),
            )
        self.wait_done(operation, DELETE_STEP_TIMEOUT)
        return ComputeOperation(self, self._delete_parts(project, found.group))

    def _delete_parts(self, project: str, group: Mapping[str, Any]) -> list[Any]:
        """Delete a deleted MIG's template and workload policy (gone already: fine)."""
        from google.api_core import exceptions

        sent = []
        template = str(group.get("instanceTemplate", ""))
        policy = str((group.get("resourcePolicies") or {}).get("workloadPolicy", ""))
        try:
            if "/regions/" in template:
                sent.append(
                    self._client("RegionInstanceTemplatesClient").delete(
                        project=project,
                        region=_after(template, "regions"),
                        instance_template=short(template),
                    )
                )
            elif template:
                sent.append(
                    self._client("InstanceTemplatesClient").delete(
                        project=project, instance_template=short(template)
                    )
                )
        except exceptions.NotFound:
            pass
        if policy:
            with contextlib.suppress(exceptions.NotFound):
                sent.append(
                    self._client("ResourcePoliciesClient").delete(
                        project=project,
                        region=_after(policy, "regions"),
                        resource_policy=short(policy),
                    )
                )
        return sent

    def update_node(
        self, request: Mapping[str, Any], retry: Any = None, timeout: Any = None
    ) -> ComputeOperation:
        """A node's `ssh-keys` metadata, set on every instance of its slice (each keeps its
        own other items; a stale fingerprint is ABORTED, which the caller retries)."""
        from google.cloud import compute_v1

        node = request["node"]
        project, zone, name = _parts(str(node["name"]))
        wanted = dict(node.get("metadata") or {})
        found = self.find_slice(project, zone, name)
        if found is None:
            raise _google_error("NotFound", f"{node['name']} not found")
        sent = []
        for instance in found.instances:
            metadata = instance.get("metadata") or {}
            items = _items(metadata)
            if "ssh-keys" in wanted:
                items["ssh-keys"] = str(wanted["ssh-keys"])
            body = compute_v1.Metadata(
                fingerprint=str(metadata.get("fingerprint", "")),
                items=[compute_v1.Items(key=k, value=v) for k, v in items.items()],
            )
            with _Conflicts():
                sent.append(
                    self._client("InstancesClient").set_metadata(
                        project=project,
                        zone=zone,
                        instance=str(instance["name"]),
                        metadata_resource=body,
                    )
                )
        return ComputeOperation(self, sent)

    def reset_queued_resource(self, name: str, retry: Any = None, timeout: Any = None) -> Any:
        raise TpuctlError(
            f"cannot reset {name}: a Compute Engine slice has no reset in tpuctl yet",
            hint="delete it and create it again (tpuctl delete, tpuctl create)",
        )

    def _call(self, retry: Any, call: Callable[[], Any]) -> Any:
        with _Conflicts():
            return retry(call)() if retry is not None else call()


def _operation_json(operation: Any) -> dict[str, Any]:
    inner = getattr(operation, "_extended_operation", operation)
    return _as_json(inner)


def _project_of(link: str) -> str:
    return _after(link, "projects")


def _after(link: str, word: str) -> str:
    parts = link.split("/")
    return parts[parts.index(word) + 1] if word in parts else ""


def _parts(name: str) -> tuple[str, str, str]:
    """`projects/P/locations/Z/{queuedResources,nodes}/N` → (P, Z, N)."""
    parts = name.split("/")
    if len(parts) < 6:
        raise TpuctlError(f"not a resource name: {name}")
    return parts[1], parts[3], parts[5]


def _parent(parent: str) -> tuple[str, str]:
    parts = parent.split("/")
    return parts[1], parts[3]
