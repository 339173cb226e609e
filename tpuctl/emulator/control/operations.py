"""Long-running operation records: their names, replay by request_id, and how they end."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import grpc
from google.longrunning import operations_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

from tpuctl.emulator.control.clock import Clock
from tpuctl.emulator.control.names import parse_child
from tpuctl.emulator.control.protos import operation_proto
from tpuctl.emulator.control.records import OperationRecord
from tpuctl.emulator.control.status import not_found


class Operations:
    """Every operation of the emulator. Guarded by the control plane's lock (`lock`): callers
    hold it, except around `abandon`, which takes it itself."""

    def __init__(self, clock: Clock, lock: threading.RLock) -> None:
        self._clock = clock
        self._lock = lock
        self.records: dict[str, OperationRecord] = {}
        self._requests: dict[tuple[str, str], str] = {}  # (verb, request_id) -> operation

    def get(self, name: str) -> OperationRecord:
        parse_child(name, "operations")
        record = self.records.get(name)
        if record is None:
            raise not_found("operation", name)
        return record

    def replay(self, verb: str, request_id: str) -> operations_pb2.Operation | None:
        """The operation an earlier request with this request_id started, if it still exists."""
        if not request_id:
            return None
        name = self._requests.get((verb, request_id))
        if name is None or name not in self.records:
            return None
        return operation_proto(self.records[name])

    def start(self, parent: str, target: str, verb: str, request_id: str) -> OperationRecord:
        suffix = f"operation-{int(self._clock.wall().timestamp() * 1000)}-{uuid.uuid4().hex[:12]}"
        record = OperationRecord(
            name=f"{parent}/operations/{suffix}",
            target=target,
            verb=verb,
            create_time=self._clock.wall(),
        )
        self.records[record.name] = record
        if request_id:
            key_verb = "delete-node" if verb == "delete" and "/nodes/" in target else verb
            self._requests[(key_verb, request_id)] = record.name
        return record

    def finish(
        self,
        operation: OperationRecord,
        response: Any = None,
        error: status_pb2.Status | None = None,
        extras: dict[str, Any] | None = None,
    ) -> None:
        """End `operation` with a response (a proto-plus or protobuf message, with `extras`,
        its REST-only fields) or an error; an operation that already ended keeps its first
        outcome."""
        if operation.done:
            return
        if response is not None and not isinstance(response, Message):
            response = type(response).pb(response)
        operation.response = response
        operation.response_extras = dict(extras or {})
        operation.error = error
        operation.done = True
        operation.end_time = self._clock.wall()

    def abandon(self, operation: OperationRecord) -> None:
        """End `operation` as ABORTED unless it ended already (its flow was superseded)."""
        with self._lock:
            if not operation.done:
                self.finish(
                    operation,
                    error=status_pb2.Status(
                        code=grpc.StatusCode.ABORTED.value[0],
                        message="The operation was interrupted by a later change to the resource",
                    ),
                )
