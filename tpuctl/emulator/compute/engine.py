"""ComputeEngine: one method per Compute Engine API method the fake serves, and per admin fault.

The HTTP layer (tpuctl.emulator.api.compute) has checked every body against the discovery
document already; here is what the service decides: names taken, resources missing, states
that forbid an action, request IDs replayed, capacity. This module has the instance, operation
and firewall methods; templates, policies and MIGs are in group_methods.py, the admin service's
faults, capacity and status in admin.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuctl.emulator.compute import disruptions, groups, instance_resource, instances
from tpuctl.emulator.compute.admin import AdminMethods
from tpuctl.emulator.compute.errors import (
    ComputeApiError,
    already_exists,
    fingerprint_mismatch,
    not_found,
    not_ready,
)
from tpuctl.emulator.compute.group_methods import GroupMethods
from tpuctl.emulator.compute.instance_resource import instance_json
from tpuctl.emulator.compute.instances import ComputePlane, Context
from tpuctl.emulator.compute.links import link
from tpuctl.emulator.compute.listing import matches, page
from tpuctl.emulator.compute.store import (
    InstanceRecord,
    OperationRecord,
    Scope,
    Store,
    once_per_request,
)
from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.config import EmulatorConfig
from tpuctl.emulator.control.events import EventLog

WAIT_SECONDS = 120.0  # operations.wait returns by then, DONE or not (Compute Engine: 2 min)
# What `firewalls.list` answers for every project: a new project's default network.
DEFAULT_FIREWALLS = (
    ("default-allow-internal", [{"IPProtocol": "all"}], ["10.128.0.0/9"], 65534),
    ("default-allow-ssh", [{"IPProtocol": "tcp", "ports": ["22"]}], ["0.0.0.0/0"], 65534),
    ("default-allow-icmp", [{"IPProtocol": "icmp"}], ["0.0.0.0/0"], 65534),
)


class ComputeEngine(GroupMethods, AdminMethods):
    def __init__(
        self,
        config: EmulatorConfig,
        plane: ComputePlane,
        events: EventLog,
        clock: Clock,
        project_metadata: Callable[[str], dict[str, str]] = lambda _project: {},
    ) -> None:
        self.config = config
        self.store = Store(config, events, clock)
        self.ctx = Context(self.store, plane)
        self.ctx.member_changed = lambda instance: groups.member_changed(self.ctx, instance)
        self.project_metadata = project_metadata

    def close(self) -> None:
        self.store.close()

    # ------------------------------------------------------------------------ instances
    @once_per_request
    def insert_instance(
        self, project: str, zone: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
        instance = instance_resource.plan_instance(store, project, zone, body)
        if instance.key in store.instances:
            raise already_exists(instance.link)
        store.instances[instance.key] = instance
        operation = store.start_operation(
            project,
            ("zones", zone),
            "insert",
            instance.link,
            instance.id,
            request_id=request_id,
        )
        store.events.emit(
            "compute.instance.insert",
            node=instance.link,
            detail=f"{instance.machine.name} {instance.model}",
        )
        store.spawn(instances.create, self.ctx, instance, instance.epoch, operation)
        return operation.to_json()

    def get_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.store.lock:
            return instance_json(self.store.instance(project, zone, name))

    def list_instances(self, project: str, zone: str, query: dict[str, str]) -> dict[str, Any]:
        with self.store.lock:
            found = [
                instance_json(instance)
                for (p, z, _name), instance in sorted(self.store.instances.items())
                if (p, z) == (project, zone)
            ]
        return page("compute#instanceList", link(project, "zones", zone, "instances"), found, query)

    def aggregated_instances(self, project: str, query: dict[str, str]) -> dict[str, Any]:
        by_zone: dict[str, list[dict[str, Any]]] = {}
        with self.store.lock:
            for (p, zone, _name), instance in sorted(self.store.instances.items()):
                if p == project:
                    by_zone.setdefault(f"zones/{zone}", []).append(instance_json(instance))
        filtered = {
            scope: [item for item in listed if matches(item, query.get("filter", ""))]
            for scope, listed in by_zone.items()
        }
        return {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "selfLink": link(project, "aggregated", "instances"),
            "items": {scope: {"instances": listed} for scope, listed in filtered.items() if listed},
        }

    @once_per_request
    def delete_instance(
        self, project: str, zone: str, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
        instance = store.instance(project, zone, name)
        operation = self._operation(instance, "delete", request_id)
        epoch = store.supersede(instance)
        if instance.status == "PENDING" or not instance.in_plane:
            instances.forget(store, instance)
            store.finish(operation)
        else:
            instances.set_status(store, instance, "STOPPING")
            self._terminate(instance, epoch, True, graceful, operation)
        store.events.emit("compute.instance.delete", node=instance.link)
        return operation.to_json()

    @once_per_request
    def stop_instance(
        self, project: str, zone: str, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
        instance = store.instance(project, zone, name)
        operation = self._operation(instance, "stop", request_id)
        if instance.status == "TERMINATED":
            store.finish(operation)
            return operation.to_json()
        if instance.status == "PENDING":
            raise not_ready(instance.link)
        epoch = store.supersede(instance)
        instances.set_status(store, instance, "STOPPING")
        self._terminate(instance, epoch, False, graceful, operation)
        return operation.to_json()

    @once_per_request
    def start_instance(self, project: str, zone: str, name: str, request_id: str) -> dict[str, Any]:
        store = self.store
        instance = store.instance(project, zone, name)
        if instance.status in ("PENDING", "STOPPING"):
            raise not_ready(instance.link)
        if instance.status == "TERMINATED" and instance.model == "SPOT":
            # Cloud TPU's documentation: a TPU Spot VM is not restarted; delete and
            # recreate it.
            raise ComputeApiError(
                400,
                "unsupportedOperation",
                f"The TPU Spot VM '{instance.link}' cannot be restarted: delete it and "
                "create it again",
            )
        operation = self._operation(instance, "start", request_id)
        if instance.status != "TERMINATED":
            store.finish(operation)
            return operation.to_json()
        epoch = store.supersede(instance)
        store.spawn(instances.start, self.ctx, instance, epoch, operation)
        return operation.to_json()

    def set_metadata(
        self, project: str, zone: str, name: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        # once_per_request's check by hand: the worker-plane push blocks, so it is made off
        # the lock, between the change and the operation's end.
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            instance = store.instance(project, zone, name)
            if body.get("fingerprint") != instance.metadata_fingerprint:
                raise fingerprint_mismatch()
            items = instance_resource.metadata_items({"metadata": body}, "metadata")
            # The platform's keys stay the platform's: what a client sends for them is dropped.
            instance.items = {k: v for k, v in items.items() if k not in instance.platform}
            instance.metadata_version += 1
            operation = self._operation(instance, "setMetadata", request_id)
            store.events.emit("compute.instance.metadata", node=instance.link)
        instances.push_metadata(self.ctx, instance)
        with store.lock:
            store.finish(operation)
            return operation.to_json()

    @once_per_request
    def simulate_maintenance(
        self, project: str, zone: str, name: str, request_id: str
    ) -> dict[str, Any]:
        store = self.store
        instance = store.instance(project, zone, name)
        if instance.status != "RUNNING":
            raise not_ready(instance.link)
        operation = self._operation(instance, "simulateMaintenanceEvent", request_id)
        disruptions.begin_maintenance(self.ctx, instance, "simulated")
        store.finish(operation)
        return operation.to_json()

    def guest_attributes(
        self, project: str, zone: str, name: str, query: dict[str, str]
    ) -> dict[str, Any]:
        """Host keys, as the guest agent publishes them: only with `enable-guest-attributes`
        TRUE in the instance's (or else the project's) metadata, once the VM has booted."""
        with self.store.lock:
            instance = self.store.instance(project, zone, name)
            setting = instance.metadata.get("enable-guest-attributes")
            published = instance.in_plane and instance.status == "RUNNING"
            host_key = instance.host_key
        if setting is None:
            setting = self.project_metadata(project).get("enable-guest-attributes")
        target = link(project, "zones", zone, "instances", name, "guestAttributes")
        if (setting or "").strip().upper() != "TRUE" or not published or not host_key:
            raise not_found(target)
        kind, _, value = host_key.partition(" ")
        entries = [{"namespace": "hostkeys", "key": kind, "value": value.split(" ")[0]}]
        body: dict[str, Any] = {"kind": "compute#guestAttributes", "selfLink": target}
        variable = query.get("variableKey", "")
        if variable:
            namespace, _, key = variable.partition("/")
            hit = [e for e in entries if (e["namespace"], e["key"]) == (namespace, key)]
            if not hit:
                raise not_found(f"{target}/{variable}")
            body.update(variableKey=variable, variableValue=hit[0]["value"])
            return body
        path = query.get("queryPath", "")
        namespace = path.split("/", 1)[0]
        chosen = [e for e in entries if not namespace or e["namespace"] == namespace]
        if not chosen:
            raise not_found(f"{target}/{path}")
        body.update(queryPath=path, queryValue={"items": chosen})
        return body

    # ------------------------------------------------------------------------ operations
    def get_operation(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        with self.store.lock:
            return self.store.operation(project, scope, name).to_json()

    def wait_operation(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        store = self.store
        with store.lock:
            operation = store.operation(project, scope, name)
        store.wait_until(lambda: operation.status == "DONE", WAIT_SECONDS)
        with store.lock:
            return operation.to_json()

    def list_operations(self, project: str, scope: Scope, query: dict[str, str]) -> dict[str, Any]:
        with self.store.lock:
            found = [
                operation.to_json()
                for operation in sorted(
                    self.store.operations.values(), key=lambda op: op.insert_time
                )
                if (operation.project, operation.scope) == (project, scope)
            ]
        return page("compute#operationList", link(project, *scope, "operations"), found, query)

    def delete_operation(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        with self.store.lock:
            operation = self.store.operation(project, scope, name)
            del self.store.operations[operation.link]
        return {}

    def _terminate(
        self,
        instance: InstanceRecord,
        epoch: int,
        delete: bool,
        graceful: bool,
        operation: OperationRecord,
    ) -> None:
        """Stop or delete the VM in a flow of its own (under the lock)."""

        def terminate() -> None:
            instances.terminate(
                self.ctx,
                instance,
                epoch,
                delete=delete,
                why="deleted" if delete else "stopped",
                graceful=graceful,
                operation=operation,
            )

        self.store.spawn(terminate)

    def _operation(self, instance: InstanceRecord, verb: str, request_id: str) -> OperationRecord:
        return self.store.start_operation(
            instance.project,
            ("zones", instance.zone),
            verb,
            instance.link,
            instance.id,
            request_id=request_id,
        )

    # ------------------------------------------------------------------------- firewalls
    def list_firewalls(self, project: str, query: dict[str, str]) -> dict[str, Any]:
        found = [_firewall(project, *rule) for rule in DEFAULT_FIREWALLS]
        return page("compute#firewallList", link(project, "global", "firewalls"), found, query)

    def get_firewall(self, project: str, name: str) -> dict[str, Any]:
        for rule in DEFAULT_FIREWALLS:
            if rule[0] == name:
                return _firewall(project, *rule)
        raise not_found(link(project, "global", "firewalls", name))


def _firewall(
    project: str, name: str, allowed: list[dict[str, Any]], sources: list[str], priority: int
) -> dict[str, Any]:
    return {
        "kind": "compute#firewall",
        "id": str(abs(hash((project, name))) % (1 << 62)),
        "name": name,
        "network": link(project, "global", "networks", "default"),
        "direction": "INGRESS",
        "priority": priority,
        "allowed": allowed,
        "sourceRanges": sources,
        "disabled": False,
        "selfLink": link(project, "global", "firewalls", name),
        "creationTimestamp": "1970-01-01T00:00:00.000Z",
    }
