"""The admin gRPC service `tpuctl.emulator.v1.Admin`: faults, capacity, events, status (JSON)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc

from tpuctl.emulator.api.rest_call import RequestLog
from tpuctl.emulator.api.service import ApiFaults
from tpuctl.emulator.control.catalog import UNCHANGED
from tpuctl.emulator.control.config import parse_duration
from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.state import CloudTpu
from tpuctl.emulator.control.status import ApiError, code_by_name, invalid
from tpuctl.emulator.vms.access import Access

log = logging.getLogger("tpuctl.emulator")

ADMIN_SERVICE = "tpuctl.emulator.v1.Admin"
MAX_EVENT_WAIT = 30.0  # seconds an Events call may long-poll

JsonHandler = Callable[[dict[str, Any]], dict[str, Any]]


def _decode(data: bytes) -> dict[str, Any]:
    value = json.loads(data.decode("utf-8") or "{}") if data else {}
    if not isinstance(value, dict):
        raise ValueError("an admin request is a JSON object")
    return value


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode("utf-8")


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{key} must be an integer")
    return value


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{key} is required")
    return value


class AdminServicer:
    def __init__(
        self,
        cloud: CloudTpu,
        faults: ApiFaults,
        events: EventLog,
        info: dict[str, Any],
        access: Access | None = None,
    ) -> None:
        self._cloud = cloud
        self._faults = faults
        self._events = events
        self._info = info  # host, ssh_port, compute_endpoint, rest_endpoint, state_dir
        self._access = access or Access()
        self.rest_requests: RequestLog | None = None  # what the REST face was sent

    def handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, JsonHandler] = {
            "Status": self.status,
            "Preempt": lambda b: self._cloud.preempt(_str(b, "queued_resource")),
            "FailSlice": lambda b: self._cloud.fail_slice(
                _str(b, "queued_resource"), _int(b, "slice")
            ),
            "Maintenance": self.maintenance,
            "SshFault": self.ssh_fault,
            "HostKeyFault": lambda b: self._cloud.set_hostkey_fault(
                _str(b, "node"), _int(b, "worker", 0), _str(b, "mode")
            ),
            "ApiFault": self.api_fault,
            "Reservation": self.reservation,
            "Capacity": self.capacity,
            "Events": self.events,
            "ProjectMetadata": self.project_metadata,
            "RestRequests": self.rest_requests_call,
        }
        return grpc.method_handlers_generic_handler(
            ADMIN_SERVICE, {name: self._wrap(fn) for name, fn in methods.items()}
        )

    def _wrap(self, fn: JsonHandler) -> grpc.RpcMethodHandler:
        def call(request: dict[str, Any], context: grpc.ServicerContext) -> Any:
            try:
                return fn(request)
            except ApiError as error:
                context.abort(error.code, error.message)
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            except Exception as error:
                log.exception("admin call failed")
                context.abort(grpc.StatusCode.INTERNAL, f"emulator error: {error}")

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_decode, response_serializer=_encode
        )

    def status(self, _: dict[str, Any]) -> dict[str, Any]:
        return {**self._info, **self._cloud.status(), "api_faults": self._faults.snapshot()}

    def maintenance(self, body: dict[str, Any]) -> dict[str, Any]:
        at = body.get("at", 0)
        after = parse_duration(at) if isinstance(at, str) else float(at)
        return self._cloud.schedule_maintenance(_str(body, "node"), _int(body, "worker", 0), after)

    def ssh_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        mode = body.get("mode")
        if mode in ("none", ""):
            mode = None
        return self._cloud.set_ssh_fault(_str(body, "node"), _int(body, "worker", 0), mode)

    def reservation(self, body: dict[str, Any]) -> dict[str, Any]:
        """Make (or replace) a TPU reservation that ListReservations lists: {"name":
        "projects/P/locations/Z/reservations/R", "chips", "generation", "state", "start",
        "end"}; without "chips", change an existing one's state or window ("end": "now" ends
        it: the QRs bound to it lose their nodes). Times: "now", an emulated offset from now
        ("+2h", ÷ the speed), RFC 3339, or null (open). With "remove": true, remove it.
        Answers every reservation."""
        name = _str(body, "name")
        if body.get("remove"):
            return {"reservations": self._cloud.remove_reservation(name)}
        chips = _int(body, "chips") if "chips" in body else None
        generation = body.get("generation")
        state = body.get("state")
        if not isinstance(generation, str | None) or not isinstance(state, str | None):
            raise invalid("generation and state are strings")
        if chips is not None:
            generation, state = generation or "v4", state or "ACTIVE"
        times = {
            key: self._moment(body[key], key) if key in body else UNCHANGED
            for key in ("start", "end")
        }
        if chips is not None:  # a new reservation: what is not given is open
            times = {key: None if value is UNCHANGED else value for key, value in times.items()}
        reservations = self._cloud.put_reservation(
            name,
            chips=chips,
            generation=generation,
            state=state,
            start_time=times["start"],
            end_time=times["end"],
        )
        return {"reservations": reservations}

    def _moment(self, value: Any, key: str) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise invalid(f"{key}: a time (now, +2h, RFC 3339) or null")
        now = datetime.now(timezone.utc)
        text = str(value).strip()
        if text == "now":
            return now
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            seconds = parse_duration(text) / self._cloud.config.speed
            return now + timedelta(seconds=seconds)
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

    def rest_requests_call(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the REST face was sent that changes something (POST, PATCH, DELETE), oldest
        first: {"resource": NAME} for the requests on one resource (a create counts for the
        resource it makes)."""
        resource = body.get("resource") or None
        if resource is not None and not isinstance(resource, str):
            raise invalid("resource must be a resource name")
        found = self.rest_requests.find(resource) if self.rest_requests else []
        return {"requests": found}

    def api_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        code = code_by_name(body["code"]) if body.get("code") else None
        count = _int(body, "count") if "count" in body else None
        exhausted = _int(body, "create_exhausted") if "create_exhausted" in body else None
        result = self._faults.set(code, count, exhausted)
        self._events.emit("api.fault.set", detail=json.dumps(result, sort_keys=True))
        return result

    def project_metadata(self, body: dict[str, Any]) -> dict[str, Any]:
        """Show, or set (`set`: key → value, null removes), a project's common instance
        metadata, e.g. {"enable-oslogin": "TRUE"}."""
        project = _str(body, "project")
        changes = body.get("set") or {}
        if not isinstance(changes, dict) or not all(
            isinstance(value, str | None) for value in changes.values()
        ):
            raise invalid("set must map metadata keys to strings (or null to remove)")
        items = self._access.set_project_metadata(project, changes)
        if changes:
            self._events.emit("project.metadata", detail=json.dumps({project: items}))
        return {"project": project, "metadata": items}

    def capacity(self, body: dict[str, Any]) -> dict[str, Any]:
        """Show or set the pools; with "zone", that zone's (set: pools of its own); with
        "flex_start": true, flex-start's own pools."""
        changes = body.get("set") or {}
        if not isinstance(changes, dict):
            raise invalid("set must map generation to chips")
        zone = body.get("zone") or None
        if zone is not None and not isinstance(zone, str):
            raise invalid("zone must be a zone name")
        flex = bool(body.get("flex_start"))
        if not changes:
            return {"capacity": self._cloud.capacity(zone, flex_start=flex)}
        parsed = {str(k): _int(changes, k) for k in changes}
        return {"capacity": self._cloud.set_capacity(parsed, zone, flex_start=flex)}

    def events(self, body: dict[str, Any]) -> dict[str, Any]:
        since = _int(body, "since", 0)
        wait = min(float(body.get("wait", 0) or 0), MAX_EVENT_WAIT)
        events = self._events.since(since, wait)
        return {
            "events": [event.to_dict() for event in events],
            "next": events[-1].seq + 1 if events else since,
        }
