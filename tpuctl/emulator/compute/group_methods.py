"""GroupMethods, ComputeEngine's methods for instance templates, workload policies and managed
instance groups: the API calls, each checked and recorded under the store's lock; the flows they
start (a bulk create, deleting members) are in groups.py."""

from __future__ import annotations

from typing import Any

from tpuctl.emulator.compute import groups
from tpuctl.emulator.compute.errors import already_exists, not_found, not_ready
from tpuctl.emulator.compute.instances import Context
from tpuctl.emulator.compute.links import check_name, link
from tpuctl.emulator.compute.listing import page
from tpuctl.emulator.compute.store import (
    GroupRecord,
    OperationRecord,
    PolicyRecord,
    Scope,
    Store,
    TemplateRecord,
    once_per_request,
)
from tpuctl.emulator.control.config import EmulatorConfig


class GroupMethods:
    """The template, policy and MIG methods of ComputeEngine (which sets these attributes)."""

    config: EmulatorConfig
    store: Store
    ctx: Context

    def _record(
        self, records: dict[str, Any], record: TemplateRecord | PolicyRecord, request_id: str
    ) -> dict[str, Any]:
        """Keep a new template or policy: its insert's operation is over as it starts."""
        if record.link in records:
            raise already_exists(record.link)
        records[record.link] = record
        return self._done(record, "insert", request_id)

    def _drop(
        self, records: dict[str, Any], record: TemplateRecord | PolicyRecord, request_id: str
    ) -> dict[str, Any]:
        """Delete a template or policy no MIG uses, in one step as its insert."""
        what = "template" if isinstance(record, TemplateRecord) else "policy"
        groups.check_unused(self.store, record.link, what)
        del records[record.link]
        return self._done(record, "delete", request_id)

    def _done(
        self, record: TemplateRecord | PolicyRecord, verb: str, request_id: str
    ) -> dict[str, Any]:
        return self.store.start_operation(
            record.project,
            record.scope,
            verb,
            record.link,
            record.id,
            request_id=request_id,
            done=True,
        ).to_json()

    # ------------------------------------------------------------------------ templates
    @once_per_request
    def insert_template(
        self, project: str, region: str | None, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        name = check_name(body.get("name"))
        groups.check_template(body)
        template = TemplateRecord(project, region, name, body, self.store.clock.wall())
        return self._record(self.store.templates, template, request_id)

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
        return page(
            "compute#instanceTemplateList",
            link(project, *where, "instanceTemplates"),
            found,
            query,
        )

    @once_per_request
    def delete_template(
        self, project: str, region: str | None, name: str, request_id: str
    ) -> dict[str, Any]:
        return self._drop(self.store.templates, self._template(project, region, name), request_id)

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
    @once_per_request
    def insert_policy(
        self, project: str, region: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        name = check_name(body.get("name"))
        groups.check_policy(body)
        policy = PolicyRecord(project, region, name, body, self.store.clock.wall())
        return self._record(self.store.policies, policy, request_id)

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
        return page(
            "compute#resourcePolicyList",
            link(project, "regions", region, "resourcePolicies"),
            found,
            query,
        )

    @once_per_request
    def delete_policy(
        self, project: str, region: str, name: str, request_id: str
    ) -> dict[str, Any]:
        return self._drop(self.store.policies, self._policy(project, region, name), request_id)

    def _policy(self, project: str, region: str, name: str) -> PolicyRecord:
        key = link(project, "regions", region, "resourcePolicies", name)
        found = self.store.policies.get(key)
        if found is None:
            raise not_found(key)
        return found

    # ----------------------------------------------------------------------------- MIGs
    @once_per_request
    def insert_group(
        self, project: str, scope: Scope, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        store = self.store
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
        return page(kind, link(project, *scope, "instanceGroupManagers"), found, query)

    def managed_instances(self, project: str, scope: Scope, name: str) -> dict[str, Any]:
        with self.store.lock:
            group = self.store.group(project, scope, name)
            return {"managedInstances": groups.managed_instances(self.store, group)}

    @once_per_request
    def delete_group(
        self, project: str, scope: Scope, name: str, request_id: str, graceful: bool
    ) -> dict[str, Any]:
        store = self.store
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

    @once_per_request
    def resize_group(
        self, project: str, scope: Scope, name: str, size: int, request_id: str
    ) -> dict[str, Any]:
        store = self.store
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


def _group_verb(scope: Scope, verb: str) -> str:
    kind = "regionInstanceGroupManagers" if scope[0] == "regions" else "instanceGroupManagers"
    return f"compute.{kind}.{verb}"
