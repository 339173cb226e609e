"""AdminClient: drive a running emulator's faults, capacity and event log from Python."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from tpuctl.errors import NotFoundError, TpuctlError, UsageError

ADMIN_SERVICE = "tpuctl.emulator.v1.Admin"
COMPUTE_ADMIN_SERVICE = "tpuctl.emulator.v1.ComputeAdmin"


class AdminClient:
    """`AdminClient("127.0.0.1:PORT")`: one method per admin call; errors are TpuctlErrors."""

    def __init__(self, host: str, *, timeout: float = 30.0) -> None:
        self.host = host
        self.timeout = timeout
        self._channel = grpc.insecure_channel(host)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
        service: str = ADMIN_SERVICE,
    ) -> Any:
        stub = self._channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=lambda value: json.dumps(value).encode("utf-8"),
            response_deserializer=lambda data: json.loads(data.decode("utf-8")),
        )
        try:
            return stub(body or {}, timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise _convert(error, self.host) from None

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("Status")
        return result

    def reservation(
        self,
        name: str,
        *,
        chips: int = 0,
        generation: str = "v4",
        state: str = "ACTIVE",
        remove: bool = False,
        start: str | None = None,
        end: str | None = None,
    ) -> list[dict[str, Any]]:
        """Make (or replace, or `remove`) the TPU reservation `name`
        (projects/P/locations/Z/reservations/R), as ListReservations then lists it; `start`
        and `end` bound its window ("now", "+2h" emulated from now, or RFC 3339)."""
        body: dict[str, Any] = {"name": name, "chips": chips, "generation": generation}
        body |= {"state": state, "remove": remove, "start": start, "end": end}
        result: list[dict[str, Any]] = self.call("Reservation", body)["reservations"]
        return result

    def update_reservation(self, name: str, **changes: str | None) -> list[dict[str, Any]]:
        """Change an existing reservation: `state`, `start`, `end` ("now" ends its window:
        the reservation-bound QRs in it lose their nodes)."""
        unknown = set(changes) - {"state", "start", "end"}
        if unknown:
            raise UsageError(f"a reservation has no {', '.join(sorted(unknown))} to change")
        result: list[dict[str, Any]] = self.call("Reservation", {"name": name, **changes})[
            "reservations"
        ]
        return result

    def rest_requests(self, resource: str | None = None) -> list[dict[str, Any]]:
        """What the REST API was sent that changes something, oldest first, with each JSON
        body (`resource`: only the requests on that resource; a create counts for what it
        makes)."""
        body = {"resource": resource} if resource else {}
        result: list[dict[str, Any]] = self.call("RestRequests", body)["requests"]
        return result

    def preempt(self, queued_resource: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("Preempt", {"queued_resource": queued_resource})
        return result

    def fail_slice(self, queued_resource: str, slice_index: int) -> dict[str, Any]:
        body = {"queued_resource": queued_resource, "slice": slice_index}
        result: dict[str, Any] = self.call("FailSlice", body)
        return result

    def maintenance(self, node: str, worker: int = 0, at: str | float = 0) -> dict[str, Any]:
        """Maintenance on a node's worker now, or `at` emulated seconds from now ("+30s")."""
        body = {"node": node, "worker": worker, "at": at}
        result: dict[str, Any] = self.call("Maintenance", body)
        return result

    def ssh_fault(self, node: str, worker: int, mode: str | None) -> dict[str, Any]:
        """`mode`: "hang", "refuse", or None/"none" to clear."""
        body = {"node": node, "worker": worker, "mode": mode or "none"}
        result: dict[str, Any] = self.call("SshFault", body)
        return result

    def hostkey_fault(self, node: str, worker: int, mode: str) -> dict[str, Any]:
        """`mode`: "missing" (no host key in guest attributes), "rotate" (a new host key),
        "none" (published again)."""
        body = {"node": node, "worker": worker, "mode": mode}
        result: dict[str, Any] = self.call("HostKeyFault", body)
        return result

    def api_fault(
        self,
        code: str | None = None,
        count: int | None = None,
        create_exhausted: int | None = None,
    ) -> dict[str, Any]:
        """The next `count` API calls fail with `code`; the next `create_exhausted` creates fail
        with RESOURCE_EXHAUSTED. Zero clears."""
        body: dict[str, Any] = {}
        if code is not None:
            body["code"] = code
        if count is not None:
            body["count"] = count
        if create_exhausted is not None:
            body["create_exhausted"] = create_exhausted
        result: dict[str, Any] = self.call("ApiFault", body)
        return result

    def capacity(
        self,
        changes: dict[str, int] | None = None,
        *,
        zone: str | None = None,
        flex_start: bool = False,
    ) -> dict[str, Any]:
        """Show the pools, or set chips per generation (e.g. {"v4": 0}); with `zone`, the
        pools that zone draws from (setting gives the zone pools of its own); with
        `flex_start`, flex-start's own pools."""
        body: dict[str, Any] = {"set": changes or {}, "flex_start": flex_start}
        if zone:
            body["zone"] = zone
        result: dict[str, Any] = self.call("Capacity", body)["capacity"]
        return result

    def project_metadata(
        self, project: str, changes: dict[str, str | None] | None = None
    ) -> dict[str, str]:
        """A project's common instance metadata, after setting `changes` (None removes)."""
        body = {"project": project, "set": changes or {}}
        result: dict[str, str] = self.call("ProjectMetadata", body)["metadata"]
        return result

    # -- the Compute Engine fake -------------------------------------------------------------
    def compute_preempt(self, target: str) -> dict[str, Any]:
        """Spot preemption of an instance (`projects/P/zones/Z/instances/N`, or a name that
        names one), or of every instance of a MIG."""
        result: dict[str, Any] = self.call(
            "Preempt", {"target": target}, service=COMPUTE_ADMIN_SERVICE
        )
        return result

    def compute_maintenance(self, target: str, at: str | float = 0) -> dict[str, Any]:
        """Host maintenance on an instance (or a MIG's): now, or announced in
        upcomingMaintenance and started `at` emulated seconds from now ("+30m")."""
        body = {"target": target, "at": at}
        result: dict[str, Any] = self.call("Maintenance", body, service=COMPUTE_ADMIN_SERVICE)
        return result

    def compute_capacity(
        self, changes: dict[str, int] | None = None, *, zone: str | None = None
    ) -> dict[str, Any]:
        """Show, or set, the chips of the Compute Engine fake's pools (v5p, v6e, tpu7x)."""
        body: dict[str, Any] = {"set": changes or {}}
        if zone:
            body["zone"] = zone
        result: dict[str, Any] = self.call("Capacity", body, service=COMPUTE_ADMIN_SERVICE)[
            "capacity"
        ]
        return result

    def compute_status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("Status", service=COMPUTE_ADMIN_SERVICE)
        return result

    def events(self, since: int = 0, wait: float = 0.0) -> list[dict[str, Any]]:
        """Events with seq >= since; waits up to `wait` seconds for one when there are none."""
        result: list[dict[str, Any]] = self.call(
            "Events", {"since": since, "wait": wait}, timeout=self.timeout + wait
        )["events"]
        return result

    def follow(self, since: int = 0, poll: float = 10.0) -> Iterator[dict[str, Any]]:
        """Every event from `since` on, for ever (long-polls)."""
        while True:
            for event in self.events(since, wait=poll):
                since = event["seq"] + 1
                yield event

    def wait_for_event(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        since: int = 0,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """The first event (from `since`) matching `predicate`; TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event within {timeout} s")
            for event in self.events(since, wait=min(left, 5.0)):
                since = event["seq"] + 1
                if predicate(event):
                    return event


def _convert(error: grpc.RpcError, host: str) -> TpuctlError:
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(details)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return UsageError(details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return TpuctlError(
            f"the emulator at {host} is not answering: {details}",
            hint="start it with `tpuctl emulator start` and export TPU_EMULATOR_HOST",
        )
    return TpuctlError(f"emulator admin call failed ({code.name if code else '?'}): {details}")
