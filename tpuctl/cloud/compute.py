"""Compute Engine as the source of a spec's slice (`tpu.api: compute`): a TPU VM instance, or a
multi-host slice as a workload policy, an instance template and a bulk MIG, read and driven
over Compute Engine's REST API (tpuctl.cloud.compute_http).

`ComputeTpuClient` answers the TpuClient calls TpuApi and tpuctl.cloud.nodes make (get, list,
create and delete a queued resource; list and get nodes; guest attributes; a node's metadata
update), with the generated client's keywords, so TpuApi keeps its one retry policy, call
budget and error mapping; what it reads is shown as queued resources and nodes by
tpuctl.cloud.compute_slices.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import partial
from typing import Any

from tpuctl.cloud.compute_http import ComputeRest, at
from tpuctl.cloud.compute_ops import (
    DONE,
    OPERATION_POLL,
    ComputeCreate,
    ComputeOperation,
    Conflicts,
    NotServed,
    google_error,
    operation_error,
    request_ids,
)
from tpuctl.cloud.compute_rest import COMPUTE_ENV
from tpuctl.cloud.compute_slices import (
    STOPPED_BY,
    ComputeSlice,
    failed_queued_resource,
    is_tpu_machine,
    metadata_items,
    short,
    slice_node,
    slice_queued_resource,
    stop_cause,
    termination_of,
    worker_number,
)
from tpuctl.errors import TpuctlError

PREEMPTED_OPERATION = "compute.instances.preempted"
MAINTENANCE_OPERATION = "compute.instances.terminateOnHostMaintenance"
# An insert overtaken by a delete or a stop before its VM ran ends with this HTTP status.
OVERTAKEN = 409
DELETE_STEP_TIMEOUT = 600.0
# A VM gone this close to its run's end (clocks differ a little) was taken back at the end.
RUN_END_SLACK = timedelta(seconds=5)


# ---------------------------------------------------------------------------------- client


class ComputeTpuClient:
    """The TpuClient face over Compute Engine (see the module doc): `api_endpoint` is where
    compute v1 answers (None: compute.googleapis.com), `credentials` what its requests use."""

    def __init__(self, credentials: Any, api_endpoint: str | None = None) -> None:
        self.credentials = credentials
        self.api_endpoint = api_endpoint
        self.rest = ComputeRest(credentials, api_endpoint)
        # The ids of the instances this client asked to delete: Compute Engine shows a
        # deleting instance as STOPPING, which alone would read as a suspension (ids, not
        # names: the slice made again under the same name is another instance).
        self._deleting: set[str] = set()
        # The end of each slice's run as last seen (its VMs stop saying it once they go), and
        # the last view of each lone VM with one (its run's end deletes it: see _run_ended).
        self._ends: dict[str, str] = {}
        self._last_run: dict[str, tuple[ComputeSlice, str]] = {}

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

    # -------------------------------------------------------------------------- operations

    def operation(self, operation: Any) -> dict[str, Any]:
        """The current state of an operation (its JSON), read from the operations collection
        of its scope."""
        data = dict(operation)
        if data.get("status") == DONE:
            return data
        collection, keys = at(str(data["selfLink"]))
        with Conflicts():
            return self.rest.call(collection, "get", **keys)

    def forget(self, operation: Mapping[str, Any], *, quiet: bool = True) -> None:
        """Delete a zone operation's record (`quiet`: best effort, errors ignored)."""
        from google.api_core import exceptions

        ignored: tuple[type[BaseException], ...] = (exceptions.GoogleAPICallError,) if quiet else ()
        with contextlib.suppress(*ignored):
            collection, keys = at(str(operation["selfLink"]))
            self.rest.call(collection, "delete", **keys)

    def wait_done(self, operation: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            data = self.operation(operation)
            if data.get("status") == DONE:
                if data.get("error"):
                    raise operation_error(data)
                return data
            if time.monotonic() >= deadline:
                raise google_error("DeadlineExceeded", f"{data.get('name')} did not finish in time")
            time.sleep(OPERATION_POLL)
            operation = data

    # ---------------------------------------------------------------------------- reading

    def find_slice(self, project: str, zone: str, name: str) -> ComputeSlice | None:
        """The slice named `name`: the instance of that name, else the MIG of that name."""
        from google.api_core import exceptions

        try:
            data = self.rest.call("instances", "get", project=project, zone=zone, instance=name)
        except exceptions.NotFound:
            pass
        else:
            # A MIG's member named like the slice is not it: the MIG below is.
            if "created-by" not in metadata_items(data.get("metadata")):
                return ComputeSlice(name, [self._with_stop_cause(project, zone, data)])
        try:
            group = self.rest.call(
                "instanceGroupManagers",
                "get",
                project=project,
                zone=zone,
                instance_group_manager=name,
            )
        except exceptions.NotFound:
            return None
        return self._group_slice(project, zone, group)

    def _with_stop_cause(self, project: str, zone: str, data: dict[str, Any]) -> dict[str, Any]:
        """A stopped instance with what stopped it, from the zone's system operations (the
        documented signal): `compute.instances.preempted` (its statusMessage then says
        preempted) or `compute.instances.terminateOnHostMaintenance` (stopped by the
        service)."""
        if data.get("status") not in ("STOPPING", "TERMINATED") or stop_cause(data):
            return data
        listed = self.rest.list(
            "zoneOperations",
            "list",
            project=project,
            zone=zone,
            filter=f"targetId = {data.get('id')}",
        )
        kinds = {str(operation.get("operationType", "")) for operation in listed}
        if PREEMPTED_OPERATION in kinds:
            return {**data, "statusMessage": "Instance was preempted."}
        if MAINTENANCE_OPERATION in kinds:
            return {**data, STOPPED_BY: "SERVICE"}
        return data

    def _group_slice(self, project: str, zone: str, group: dict[str, Any]) -> ComputeSlice:
        from google.api_core import exceptions

        managed = self.rest.list(
            "instanceGroupManagers",
            "listManagedInstances",
            project=project,
            zone=zone,
            instance_group_manager=str(group["name"]),
        )
        instances = []
        for entry in managed:
            try:
                instance = self.rest.call(
                    "instances", "get", project=project, zone=zone, instance=str(entry["name"])
                )
            except exceptions.NotFound:
                continue
            instances.append(self._with_stop_cause(project, zone, instance))
        ordered = sorted(
            enumerate(instances), key=lambda pair: worker_number(pair[1], 10_000 + pair[0])
        )
        template = self._template(str(group.get("instanceTemplate", "")))
        return ComputeSlice(str(group["name"]), [i for _, i in ordered], group, template)

    def _template(self, link: str) -> dict[str, Any] | None:
        from google.api_core import exceptions

        if not link:
            return None
        collection, keys = at(link)
        try:
            return self.rest.call(collection, "get", **keys)
        except exceptions.NotFound:
            return None

    def failed_insert(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """The newest insert of instance `name` in `zone` that failed (no capacity, …; not
        one a delete overtook), if any."""
        listed = self.rest.list(
            "zoneOperations", "list", project=project, zone=zone, filter="operationType = insert"
        )
        found = None
        for data in listed:
            if short(str(data.get("targetLink", ""))) != name or not data.get("error"):
                continue
            if int(data.get("httpErrorStatusCode") or 0) == OVERTAKEN:
                continue  # deleted (or stopped) before it ran: gone, not failed
            if found is None or str(data.get("insertTime", "")) >= str(found.get("insertTime")):
                found = data
        return found

    def slices(self, project: str, zone: str) -> list[ComputeSlice]:
        """Every slice in the zone: lone TPU VMs (not a MIG's) and MIGs (of TPU VMs)."""
        slices: list[ComputeSlice] = []
        for data in self.rest.list("instances", "list", project=project, zone=zone):
            lone = "created-by" not in metadata_items(data.get("metadata"))
            if lone and is_tpu_machine(str(data.get("machineType", ""))):
                slices.append(ComputeSlice(str(data["name"]), [data]))
        for group in self.rest.list("instanceGroupManagers", "list", project=project, zone=zone):
            found = self._group_slice(project, zone, group)
            if is_tpu_machine(found.machine_type):
                slices.append(found)
        return slices

    # ------------------------------------------------------------- what doctor reads

    def machine_type(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """The zone's machine type `name`, or None when the zone has none of that name."""
        return self._found("machineTypes", "get", project=project, zone=zone, machine_type=name)

    def image(self, source: str) -> dict[str, Any] | None:
        """The image a boot disk's sourceImage names (`projects/P/global/images/family/F`
        or `…/images/NAME`), or None when there is none."""
        project = _after(source, "projects")
        if "/family/" in source:
            return self._found("images", "getFromFamily", project=project, family=short(source))
        return self._found("images", "get", project=project, image=short(source))

    def reservation(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        return self._found("reservations", "get", project=project, zone=zone, reservation=name)

    def _found(self, collection: str, method: str, **request: str) -> dict[str, Any] | None:
        from google.api_core import exceptions

        try:
            return self.rest.call(collection, method, **request)
        except exceptions.NotFound as error:
            # The emulator's Compute Engine answers a method it lacks with a 404 of its own.
            if any(words in str(error.message) for words in ("No such path", "No such method")):
                raise NotServed(f"{collection}.{method}") from None
            return None

    # ---------------------------------------------------------- the TpuClient face: reads

    def get_queued_resource(self, name: str, retry: Any = None, timeout: Any = None) -> Any:
        project, zone, slice_name = _parts(name)
        found = self._call(retry, lambda: self.find_slice(project, zone, slice_name))
        if found is not None:
            end = termination_of(found)
            last = self._last_run.get(name)
            if last is not None and last[0].identity != found.identity:
                del self._last_run[name]  # another VM under the name now
            if end:
                self._ends[found.identity] = end
                self._last_run[name] = (found, end)
            deleting = found.identity in self._deleting
            return slice_queued_resource(
                name, found, deleting=deleting, termination=self._ends.get(found.identity)
            )
        failed = self._call(retry, lambda: self.failed_insert(project, zone, slice_name))
        if failed is not None:
            return failed_queued_resource(name, failed)
        ended = self._run_ended(name)
        if ended is not None:
            return ended
        raise google_error("NotFound", f"{name} not found (no instance or MIG of that name)")

    def _run_ended(self, name: str) -> Any | None:
        """A lone VM deleted at its run's end (flex-start's DELETE) read as Cloud TPU shows a
        queued resource whose run is over: SUSPENDED by the service, with its end; until
        tpuctl deletes it. Only for a VM this client saw running with that end, once the end
        has come (so a VM deleted by anyone before it is gone, not ended)."""
        from tpuctl.clock import parse_rfc3339, utc_now

        last = self._last_run.get(name)
        if last is None:
            return None
        found, end = last
        moment = parse_rfc3339(end)
        if found.group is not None or moment is None or utc_now() < moment - RUN_END_SLACK:
            return None
        stopped = ComputeSlice(found.name, [{**found.instances[0], "status": "TERMINATED"}])
        return slice_queued_resource(name, stopped, termination=end)

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
            raise google_error("NotFound", f"{name} not found")
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
            raise google_error("NotFound", f"{name} not found")
        answers = []
        for instance in found.instances:
            entries = []
            try:
                published = self.rest.call(
                    "instances",
                    "getGuestAttributes",
                    project=project,
                    zone=zone,
                    instance=str(instance["name"]),
                    query_path=query or "hostkeys/",
                )
                entries = [
                    tpu.GuestAttributesEntry(
                        namespace=str(e.get("namespace", "")),
                        key=str(e.get("key", "")),
                        value=str(e.get("value", "")),
                    )
                    for e in (published.get("queryValue") or {}).get("items") or []
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

    def _insert(self, sent: Any, request_id: str) -> dict[str, Any]:
        with Conflicts():
            return self.rest.call(
                sent.resource, sent.method, body=sent.body, request_id=request_id, **sent.scope
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
            if self._last_run.pop(str(request.name), None) is not None:
                return ComputeOperation(self, [])  # deleted at its run's end already
            failed = self.failed_insert(project, zone, name)
            if failed is None:
                raise google_error("NotFound", f"{request.name} not found")
            with Conflicts():
                self.forget(failed, quiet=False)
            return ComputeOperation(self, [])
        self._deleting.add(found.identity)
        scope = {"project": project, "zone": zone, "request_id": request_id}
        if found.group is None:
            collection, target = "instances", {"instance": name}
        else:
            collection, target = "instanceGroupManagers", {"instance_group_manager": name}
        with Conflicts():
            operation = self._call(
                retry, lambda: self.rest.call(collection, "delete", **scope, **target)
            )
        if found.group is None:
            return ComputeOperation(self, [operation])
        self.wait_done(operation, DELETE_STEP_TIMEOUT)
        return ComputeOperation(self, self._delete_parts(found.group))

    def _delete_parts(self, group: Mapping[str, Any]) -> list[Any]:
        """Delete a deleted MIG's template and workload policy (gone already: fine)."""
        from google.api_core import exceptions

        sent = []
        template = str(group.get("instanceTemplate", ""))
        policy = str((group.get("resourcePolicies") or {}).get("workloadPolicy", ""))
        for link in (template, policy):
            if link:
                collection, keys = at(link)
                with contextlib.suppress(exceptions.NotFound):
                    sent.append(self.rest.call(collection, "delete", **keys))
        return sent

    def update_node(
        self, request: Mapping[str, Any], retry: Any = None, timeout: Any = None
    ) -> ComputeOperation:
        """A node's `ssh-keys` metadata, set on every instance of its slice (each keeps its
        own other items; a stale fingerprint is ABORTED, which the caller retries)."""
        node = request["node"]
        project, zone, name = _parts(str(node["name"]))
        wanted = dict(node.get("metadata") or {})
        found = self.find_slice(project, zone, name)
        if found is None:
            raise google_error("NotFound", f"{node['name']} not found")
        sent = []
        for instance in found.instances:
            metadata = instance.get("metadata") or {}
            items = metadata_items(metadata)
            if "ssh-keys" in wanted:
                items["ssh-keys"] = str(wanted["ssh-keys"])
            body = {
                "fingerprint": str(metadata.get("fingerprint", "")),
                "items": [{"key": k, "value": v} for k, v in items.items()],
            }
            with Conflicts():
                sent.append(
                    self.rest.call(
                        "instances",
                        "setMetadata",
                        body=body,
                        project=project,
                        zone=zone,
                        instance=str(instance["name"]),
                    )
                )
        return ComputeOperation(self, sent)

    def simulate_maintenance_event(
        self, request: Any, retry: Any = None, timeout: Any = None
    ) -> ComputeOperation:
        """Host maintenance now on the worker of the node `request.worker_ids` names (the
        first one; worker 0 without), through instances.simulateMaintenanceEvent."""
        project, zone, name = _parts(str(request.name))
        found = self.find_slice(project, zone, name)
        if found is None or not found.instances:
            raise google_error("NotFound", f"{request.name} not found")
        workers = [int(worker) for worker in getattr(request, "worker_ids", []) or [0]]
        instance = found.instances[min(workers[0], len(found.instances) - 1)]
        with Conflicts():
            operation = self.rest.call(
                "instances",
                "simulateMaintenanceEvent",
                project=project,
                zone=zone,
                instance=str(instance["name"]),
            )
        return ComputeOperation(self, [operation])

    def reset_queued_resource(self, name: str, retry: Any = None, timeout: Any = None) -> Any:
        raise TpuctlError(
            f"cannot reset {name}: a Compute Engine slice has no reset in tpuctl yet",
            hint="delete it and create it again (tpuctl delete, tpuctl create)",
        )

    def _call(self, retry: Any, call: Callable[[], Any]) -> Any:
        with Conflicts():
            return retry(call)() if retry is not None else call()


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
