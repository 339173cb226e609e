"""The admin gRPC service of the Compute Engine fake, `tpuctl.emulator.v1.ComputeAdmin` (JSON
in, JSON out, beside the Cloud TPU side's Admin service): spot preemption, scheduled host
maintenance, capacity pools, status."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from tpuctl.emulator.compute.errors import ComputeApiError
from tpuctl.emulator.control.config import parse_duration

if TYPE_CHECKING:
    from tpuctl.emulator.api.compute import ComputeServer

log = logging.getLogger("tpuctl.emulator")

COMPUTE_ADMIN_SERVICE = "tpuctl.emulator.v1.ComputeAdmin"
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND}

JsonHandler = Callable[[dict[str, Any]], dict[str, Any]]


def _decode(data: bytes) -> dict[str, Any]:
    value = json.loads(data.decode("utf-8") or "{}") if data else {}
    if not isinstance(value, dict):
        raise ValueError("an admin request is a JSON object")
    return value


def _target(body: dict[str, Any]) -> str:
    value = body.get("target")
    if not isinstance(value, str) or not value:
        raise ValueError("target is required: an instance or a managed instance group")
    return value


class ComputeAdminServicer:
    def __init__(self, server: ComputeServer) -> None:
        self._server = server

    def handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, JsonHandler] = {
            "Preempt": lambda b: self._engine().preempt(_target(b)),
            "Maintenance": self.maintenance,
            "Capacity": self.capacity,
            "Status": lambda _b: self._engine().status(),
        }
        return grpc.method_handlers_generic_handler(
            COMPUTE_ADMIN_SERVICE, {name: self._wrap(fn) for name, fn in methods.items()}
        )

    def _engine(self) -> Any:
        engine = self._server.engine
        if engine is None:
            raise ComputeApiError(503, "backendError", self._server.unavailable)
        return engine

    def maintenance(self, body: dict[str, Any]) -> dict[str, Any]:
        """Host maintenance on an instance (or every instance of a MIG): now, or announced in
        upcomingMaintenance and started `at` emulated seconds from now ("+30m")."""
        at = body.get("at", 0)
        after = parse_duration(at) if isinstance(at, str) else float(at)
        result: dict[str, Any] = self._engine().maintenance(_target(body), after)
        return result

    def capacity(self, body: dict[str, Any]) -> dict[str, Any]:
        """Show or set the chips of each generation pool (v5p, v6e, tpu7x); with "zone", that
        zone's pools (setting gives it pools of its own)."""
        changes = body.get("set") or {}
        if not isinstance(changes, dict) or not all(
            isinstance(value, int) and not isinstance(value, bool) for value in changes.values()
        ):
            raise ValueError("set must map generation to chips")
        zone = body.get("zone") or None
        if zone is not None and not isinstance(zone, str):
            raise ValueError("zone must be a zone name")
        engine = self._engine()
        if not changes:
            return {"capacity": engine.capacity(zone)}
        return {"capacity": engine.set_capacity({str(k): v for k, v in changes.items()}, zone)}

    def _wrap(self, fn: JsonHandler) -> grpc.RpcMethodHandler:
        def call(request: dict[str, Any], context: grpc.ServicerContext) -> Any:
            try:
                return fn(request)
            except ComputeApiError as error:
                context.abort(_CODES.get(error.status, grpc.StatusCode.UNAVAILABLE), error.message)
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            except Exception as error:
                log.exception("compute admin call failed")
                context.abort(grpc.StatusCode.INTERNAL, f"emulator error: {error}")

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=_decode,
            response_serializer=lambda value: json.dumps(value).encode("utf-8"),
        )
