"""ComputeEngine: one method per Compute Engine API method the fake serves, and per admin fault.

The HTTP layer (tpuctl.emulator.api.compute) has checked every body against the discovery
document already; here is what the service decides: names taken, resources missing, states
that forbid an action, request IDs replayed, capacity.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tpuctl.emulator.compute import disruptions, groups, instance_resource, instances
from tpuctl.emulator.compute.catalog import GENERATIONS
from tpuctl.emulator.compute.errors import (
    ComputeApiError,
    already_exists,
    fingerprint_mismatch,
    invalid,
    not_found,
    not_ready,
)
from tpuctl.emulator.compute.instance_resource import instance_json
from tpuctl.emulator.compute.instances import ComputePlane, Context
from tpuctl.emulator.compute.links import check_name, link
from tpuctl.emulator.compute.store import (
    GroupRecord,
    InstanceRecord,
    OperationRecord,
    PolicyRecord,
    Scope,
    Store,
    TemplateRecord,
)
from tpuctl.emulator.control.clock import Clock, rfc3339
from tpuctl.emulator.control.config import EmulatorConfig
from tpuctl.emulator.control.events import EventLog

PAGE_SIZE = 500
WAIT_SECONDS = 120.0  # operations.wait returns by then, DONE or not (Compute Engine: 2 min)
# What `firewalls.list` answers for every project: a new project's default network.
DEFAULT_FIREWALLS = (
    ("default-allow-internal", [{"IPProtocol": "all"}], ["10.128.0.0/9"], 65534),
    ("default-allow-ssh", [{"IPProtocol": "tcp", "ports": ["22"]}], ["0.0.0.0/0"], 65534),
    ("default-allow-icmp", [{"IPProtocol": "icmp"}], ["0.0.0.0/0"], 65534),
)


class ComputeEngine:
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
    def insert_instance(
        self, project: str, zone: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
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
        return _page(
            "compute#instanceList", link(project, "zones", zone, "instances"), found, query
        )

    def aggregated_instances(self, project: str, query: dict[str, str]) -> dict[str, Any]:
        by_zone: dict[str, list[dict[str, Any]]] = {}
        with self.store.lock:
            for (p, zone, _name), instance in sorted(self.store.instances.items()):
                if p == project:
                    by_zone.setdefault(f"zones/{zone}", []).append(instance_json(instance))
        filtered = {
            scope: [item for item in listed if _matches(item, query.get("filter", ""))]
            for scope, listed in by_zone.items()
        }
        return {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "selfLink": link(project, "aggregated", "instances"),
            "items": {scope: {"instances": listed} for scope, listed in filtered.items() if listed},
        }

    def delete_instance(
        self, project: str, zone: str, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
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

    def stop_instance(
        self, project: str, zone: str, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
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

    def start_instance(self, project: str, zone: str, name: str, request_id: str) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
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
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            instance = store.instance(project, zone, name)
            if body.get("fingerprint") != instance.metadata_fingerprint:
                raise fingerprint_mismatch()
            items = instance_resource._metadata_items({"metadata": body}, "metadata")
            # The platform's keys stay the platform's: what a client sends for them is dropped.
            instance.items = {k: v for k, v in items.items() if k not in instance.platform}
            instance.metadata_version += 1
            operation = self._operation(instance, "setMetadata", request_id)
            store.events.emit("compute.instance.metadata", node=instance.link)
        instances.push_metadata(self.ctx, instance)
        with store.lock:
            store.finish(operation)
            return operation.to_json()

    def simulate_maintenance(
        self, project: str, zone: str, name: str, request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
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

    # ------------------------------------------------------------------------ templates
    def insert_template(
        self, project: str, region: str | None, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            name = check_name(body.get("name"))
            groups.check_template(body)
            template = TemplateRecord(project, region, name, body, store.clock.wall())
            if template.link in store.templates:
                raise already_exists(template.link)
            store.templates[template.link] = template
            scope: Scope = ("regions", region) if region else ("global", "")
            operation = store.start_operation(
                project, scope, "insert", template.link, template.id, request_id=request_id
            )
            store.finish(operation)
            return operation.to_json()

    def get_template(self, project: str, region: str | None, name: str) -> dict[str, Any]:
        with self.store.lock:
            return groups.template_json(self._template(project, region, name))

    def list_templates(
        self, project: str, region: str | None, query: dict[str, str]
    ) -> dict[str, Any]:
        with self.store.lock:
            found = [
                groups.template_json(t)
                for t in sorted(self.store.templates.values(), key=lambda t: t.name)
                if t.project == project and t.region == region
            ]
        where = ("regions", region) if region else ("global", "")
        return _page(
            "compute#instanceTemplateList",
            link(project, *where, "instanceTemplates"),
            found,
            query,
        )

    def delete_template(
        self, project: str, region: str | None, name: str, request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            template = self._template(project, region, name)
            groups.check_unused(store, template.link, "template")
            del store.templates[template.link]
            scope: Scope = ("regions", region) if region else ("global", "")
            operation = store.start_operation(
                project, scope, "delete", template.link, template.id, request_id=request_id
            )
            store.finish(operation)
            return operation.to_json()

    def _template(self, project: str, region: str | None, name: str) -> TemplateRecord:
        key = (
            link(project, "regions", region, "instanceTemplates", name)
            if region
            else link(project, "global", "instanceTemplates", name)
        )
        found = self.store.templates.get(key)
        if found is None:
            raise not_found(key)
        return found

    # ------------------------------------------------------------------------- policies
    def insert_policy(
        self, project: str, region: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            name = check_name(body.get("name"))
            groups.check_policy(body)
            policy = PolicyRecord(project, region, name, body, store.clock.wall())
            if policy.link in store.policies:
                raise already_exists(policy.link)
            store.policies[policy.link] = policy
            operation = store.start_operation(
                project,
                ("regions", region),
                "insert",
                policy.link,
                policy.id,
                request_id=request_id,
            )
            store.finish(operation)
            return operation.to_json()

    def get_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        with self.store.lock:
            return groups.policy_json(self._policy(project, region, name))

    def list_policies(self, project: str, region: str, query: dict[str, str]) -> dict[str, Any]:
        with self.store.lock:
            found = [
                groups.policy_json(p)
                for p in sorted(self.store.policies.values(), key=lambda p: p.name)
                if (p.project, p.region) == (project, region)
            ]
        return _page(
            "compute#resourcePolicyList",
            link(project, "regions", region, "resourcePolicies"),
            found,
            query,
        )

    def delete_policy(
        self, project: str, region: str, name: str, request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            policy = self._policy(project, region, name)
            groups.check_unused(store, policy.link, "policy")
            del store.policies[policy.link]
            operation = store.start_operation(
                project,
                ("regions", region),
                "delete",
                policy.link,
                policy.id,
                request_id=request_id,
            )
            store.finish(operation)
            return operation.to_json()

    def _policy(self, project: str, region: str, name: str) -> PolicyRecord:
        key = link(project, "regions", region, "resourcePolicies", name)
        found = self.store.policies.get(key)
        if found is None:
            raise not_found(key)
        return found

    # ----------------------------------------------------------------------------- MIGs
    def insert_group(
        self, project: str, scope: Scope, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            group = groups.plan_group(store, project, scope, body, self.config.zones)
            if group.key in store.groups:
                raise already_exists(group.link)
            store.groups[group.key] = group
            operation = store.start_operation(
                project,
                scope,
                _group_verb(scope, "insert"),
                group.link,
                group.id,
                request_id=request_id,
            )
            store.finish(operation)
            store.events.emit(
                "compute.group.insert",
                node=group.link,
                detail=f"{group.target_size} x {group.machine.name} {group.topology or ''}",
            )
            store.spawn(groups.bulk_create, self.ctx, group, group.epoch)
            return operation.to_json()

    def get_group(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        with self.store.lock:
            return groups.group_json(self.store, self.store.group(project, scope, name))

    def list_groups(self, project: str, scope: Scope, query: dict[str, str]) -> dict[str, Any]:
        with self.store.lock:
            found = [
                groups.group_json(self.store, group)
                for key, group in sorted(self.store.groups.items())
                if key[:2] == (project, scope)
            ]
        kind = "compute#instanceGroupManagerList"
        if scope[0] == "regions":
            kind = "compute#regionInstanceGroupManagerList"
        return _page(kind, link(project, *scope, "instanceGroupManagers"), found, query)

    def managed_instances(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        with self.store.lock:
            group = self.store.group(project, scope, name)
            return {"managedInstances": groups.managed_instances(self.store, group)}

    def delete_group(
        self, project: str, scope: Scope, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            group = store.group(project, scope, name)
            operation = store.start_operation(
                project,
                scope,
                _group_verb(scope, "delete"),
                group.link,
                group.id,
                request_id=request_id,
            )
            group.deleting = True
            group.epoch += 1
            store.cond.notify_all()
            store.events.emit("compute.group.delete", node=group.link)
            store.spawn(self._delete_group, group, graceful, operation)
            return operation.to_json()

    def _delete_group(self, group: GroupRecord, graceful: bool, operation: OperationRecord) -> None:
        groups.delete_members(self.ctx, group, graceful, None)
        with self.store.lock:
            self.store.groups.pop(group.key, None)
            self.store.finish(operation)
            self.store.events.emit("compute.group.deleted", node=group.link)

    def resize_group(
        self, project: str, scope: Scope, name: str, size: int, request_id: str
    ) -> dict[str, Any]:
        store = self.store
        with store.lock:
            replay = store.replay(project, request_id)
            if replay is not None:
                return replay.to_json()
            group = store.group(project, scope, name)
            if group.deleting:
                raise not_ready(group.link)
            groups.resize_check(group, size)
            operation = store.start_operation(
                project,
                scope,
                _group_verb(scope, "resize"),
                group.link,
                group.id,
                request_id=request_id,
            )
            if size == group.target_size:
                store.finish(operation)
                return operation.to_json()
            group.epoch += 1
            group.target_size = size
            store.cond.notify_all()
            epoch = group.epoch
            store.spawn(self._resize, group, epoch, operation)
            return operation.to_json()

    def _resize(self, group: GroupRecord, epoch: int, operation: OperationRecord) -> None:
        groups.delete_members(self.ctx, group, True, None)
        with self.store.lock:
            self.store.finish(operation)
        groups.bulk_create(self.ctx, group, epoch)

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
        return _page("compute#operationList", link(project, *scope, "operations"), found, query)

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
        return _page("compute#firewallList", link(project, "global", "firewalls"), found, query)

    def get_firewall(self, project: str, name: str) -> dict[str, Any]:
        for rule in DEFAULT_FIREWALLS:
            if rule[0] == name:
                return _firewall(project, *rule)
        raise not_found(link(project, "global", "firewalls", name))

    # ----------------------------------------------------------------------------- admin
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


def _group_verb(scope: Scope, verb: str) -> str:
    kind = "regionInstanceGroupManagers" if scope[0] == "regions" else "instanceGroupManagers"
    return f"compute.{kind}.{verb}"


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


def _page(
    kind: str, self_link: str, items: list[dict[str, Any]], query: dict[str, str]
) -> dict[str, Any]:
    """A list response: `filter` applied, then a page of `maxResults` from `pageToken`."""
    items = [item for item in items if _matches(item, query.get("filter", ""))]
    try:
        size = min(int(query.get("maxResults") or PAGE_SIZE), PAGE_SIZE)
        start = int(query.get("pageToken") or 0)
    except ValueError:
        raise invalid("Invalid value for field 'pageToken' or 'maxResults'.") from None
    if size <= 0 or start < 0:
        raise invalid("Invalid value for field 'maxResults'.")
    page = items[start : start + size]
    body: dict[str, Any] = {"kind": kind, "id": self_link, "items": page, "selfLink": self_link}
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)
    return body


def _matches(item: dict[str, Any], expression: str) -> bool:
    """Compute Engine's list filter, the simple form: `field = value` or `field != value`
    (quotes optional, a dotted path into the resource), several joined by spaces or AND."""
    import re
    import shlex

    if not expression.strip():
        return True
    try:
        words = [w for w in shlex.split(expression.replace("(", " ").replace(")", " "))]
    except ValueError:
        raise invalid(f"Invalid value for field 'filter': '{expression}'.") from None
    words = [w for w in words if w.upper() != "AND"]
    joined = " ".join(words)
    for field, op, value in re.findall(r"([\w.]+)\s*(!=|=|eq|ne)\s*(\S+)", joined):
        current: Any = item
        for part in field.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        text = json.dumps(current) if isinstance(current, bool) else str(current)
        equal = text == value or (isinstance(current, bool) and text == value.lower())
        if (op in ("=", "eq")) != equal:
            return False
    return True
