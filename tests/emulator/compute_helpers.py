"""Shared pieces of the Compute Engine fake's tests: request bodies (as JSON, the way a client
renders them), the unmodified google-cloud-compute clients, operation waits, SSH to an
instance with the host key from its guest attributes."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from tests.emulator.helpers import wait_until
from tests.emulator.workers_helpers import ClientKey, new_key, os_user

IMAGE = (
    "projects/ubuntu-os-accelerator-images/global/images/family/"
    "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
)
DONE = 2104194  # compute_v1.Operation.Status.DONE


def unique_zone() -> str:
    """A zone of its own (with its own capacity pools once a test sizes them)."""
    return f"zz-t{uuid.uuid4().hex[:6]}1-a"


def region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def boot_disk() -> list[dict[str, Any]]:
    return [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": IMAGE}}]


def instance_body(
    name: str,
    zone: str,
    machine: str = "ct6e-standard-1t",
    *,
    model: str = "STANDARD",
    metadata: dict[str, str] | None = None,
    external: bool = True,
    **scheduling: Any,
) -> dict[str, Any]:
    nic: dict[str, Any] = {"network": "global/networks/default"}
    if external:
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    return {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine}",
        "disks": boot_disk(),
        "networkInterfaces": [nic],
        "scheduling": {"provisioningModel": model, "onHostMaintenance": "TERMINATE", **scheduling},
        "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
    }


def template_body(
    name: str, machine: str, *, model: str = "STANDARD", metadata: dict[str, str] | None = None,
    **scheduling: Any,
) -> dict[str, Any]:  # fmt: skip
    properties = instance_body(
        name, "unused", machine, model=model, metadata=metadata, **scheduling
    )
    del properties["name"]
    properties["machineType"] = machine  # a template takes the bare name
    return {"name": name, "properties": properties}


def policy_body(name: str, topology: str) -> dict[str, Any]:
    return {
        "name": name,
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology},
    }


def group_body(name: str, template_link: str, policy_link: str, size: int) -> dict[str, Any]:
    return {
        "name": name,
        "instanceTemplate": template_link,
        "targetSize": size,
        "targetSizePolicy": {"mode": "BULK"},
        "resourcePolicies": {"workloadPolicy": policy_link},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    }


def message(kind: str, body: dict[str, Any]) -> Any:
    """`message("Instance", {...})` → the compute_v1 message, read from JSON as sent."""
    from google.cloud import compute_v1

    return getattr(compute_v1, kind).from_json(json.dumps(body))


@dataclass
class Compute:
    """The clients of one emulator's Compute Engine fake, and waits on what they start."""

    emulator: Any
    project: str

    def client(self, service: str) -> Any:
        return self.emulator.compute_client(service)

    @property
    def instances(self) -> Any:
        return self.client("InstancesClient")

    def wait(self, operation: Any, *, timeout: float = 60.0) -> Any:
        """Wait for an operation by name through the operations client of its scope (an
        ExtendedOperation's own polling client ignores api_endpoint, so it is not used);
        raises on an operation error."""
        from google.cloud import compute_v1

        zone = str(getattr(operation, "zone", "") or "").rsplit("/", 1)[-1]
        where = str(getattr(operation, "region", "") or "").rsplit("/", 1)[-1]
        if zone:
            client, scope = self.client("ZoneOperationsClient"), {"zone": zone}
        elif where:
            client, scope = self.client("RegionOperationsClient"), {"region": where}
        else:
            client, scope = self.client("GlobalOperationsClient"), {}

        def done() -> Any:
            current = client.wait(project=self.project, operation=operation.name, **scope)
            return current if current.status == compute_v1.Operation.Status.DONE else None

        finished = wait_until(done, f"operation {operation.name}", timeout)
        if finished.error.errors:
            raise OperationFailed(finished)
        return finished

    def insert_instance(self, zone: str, body: dict[str, Any], **kw: Any) -> Any:
        from google.cloud import compute_v1

        request = compute_v1.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=message("Instance", body), **kw
        )
        return self.instances.insert(request=request)

    def get(self, zone: str, name: str) -> Any:
        return self.instances.get(project=self.project, zone=zone, instance=name)

    def status(self, zone: str, name: str) -> str:
        return str(self.get(zone, name).status)

    def wait_status(self, zone: str, name: str, status: str, timeout: float = 60.0) -> Any:
        seen: list[str] = []

        def probe() -> Any:
            current = self.get(zone, name)
            if not seen or seen[-1] != current.status:
                seen.append(current.status)
            return current if current.status == status else None

        try:
            return wait_until(probe, f"{name} to be {status}", timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}; seen: {seen}") from None

    def gone(self, zone: str, name: str, timeout: float = 60.0) -> None:
        from google.api_core import exceptions

        def probe() -> bool:
            try:
                self.get(zone, name)
            except exceptions.NotFound:
                return True
            return False

        wait_until(probe, f"{name} to be deleted", timeout)

    def host_key(self, zone: str, name: str) -> str:
        from google.cloud import compute_v1

        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=self.project, zone=zone, instance=name, query_path="hostkeys/"
        )
        [entry] = self.instances.get_guest_attributes(request=request).query_value.items
        return f"{entry.key} {entry.value}"

    def vm_root(self, zone: str, name: str) -> Path:
        return Path(self.emulator.state_dir) / "vms" / f"{name}.{zone}.{self.project}.gce" / "0"


class OperationFailed(Exception):
    def __init__(self, operation: Any) -> None:
        errors = [(e.code, e.message) for e in operation.error.errors]
        super().__init__(f"{operation.name}: {operation.http_error_status_code} {errors}")
        self.operation = operation
        self.codes = [code for code, _message in errors]


@dataclass
class Login:
    user: str
    key: ClientKey

    @property
    def metadata(self) -> dict[str, str]:
        return {"ssh-keys": self.key.metadata_line(self.user), "enable-guest-attributes": "TRUE"}


def login() -> Login:
    return Login(os_user(), new_key())


def ssh(ip: str, port: int, host_key: str, who: Login, command: str) -> str:
    """Run `command` on the VM over SSH, trusting only `host_key`; its stdout."""

    async def go() -> str:
        async with asyncssh.connect(
            ip,
            port,
            username=who.user,
            client_keys=[who.key.private],
            known_hosts=([asyncssh.import_public_key(host_key)], [], []),
            agent_path=None,
            config=None,
            connect_timeout=20,
        ) as conn:
            result = await conn.run(command, timeout=30, check=True)
            return str(result.stdout)

    return asyncio.run(go())
