"""What tpuctl.cloud.compute sends and waits on: a create bound for Compute Engine (its
requests in order, each with a requestId derived from the create's), its operations read as
google.api_core's Operation, and Compute Engine's errors as the google.api_core exceptions
TpuApi already maps (a 409 for a name in use is ALREADY_EXISTS, no capacity is
RESOURCE_EXHAUSTED). google.api_core is imported only inside functions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tpuctl.cloud.compute_slices import accelerator_of, synthesize_queued_resource
from tpuctl.errors import TpuctlError


class OperationReader(Protocol):
    """What an operation is read through (tpuctl.cloud.compute.ComputeTpuClient)."""

    def operation(self, operation: Any) -> dict[str, Any]: ...

    def forget(self, operation: Mapping[str, Any], *, quiet: bool = True) -> None: ...


NO_CAPACITY_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "QUOTA_EXCEEDED"}
)
DONE = "DONE"
OPERATION_POLL = 0.2


class NotServed(TpuctlError):
    """The Compute Engine endpoint has no such method (the emulator serves only a TPU VM's
    part of compute v1)."""


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


# ------------------------------------------------------------------------------ operations


class ComputeOperation:
    """A create's, delete's or metadata update's Compute Engine operations, used as
    google.api_core's Operation is: `done(retry=)` polls, `result(timeout=)` raises the
    operation's error as the google.api_core exception of its HTTP status.

    `accepted`: a create counts as done once what it makes exists (as a queued resource's
    create is done once it is queued); the insert's own operation may run until capacity."""

    def __init__(
        self,
        backend: OperationReader,
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
                if self.creating and no_capacity(op):
                    # Refused at once: nothing was made, as the TPU API's RESOURCE_EXHAUSTED
                    # create; its operation's record would read as a FAILED slice.
                    self.backend.forget(op)
                raise error
        return None


def no_capacity(operation: Mapping[str, Any]) -> bool:
    errors = (operation.get("error") or {}).get("errors") or []
    return any(e.get("code") in NO_CAPACITY_CODES for e in errors)


def operation_error(operation: Mapping[str, Any]) -> Exception:
    """A failed operation as the google.api_core exception its status means; no capacity is
    RESOURCE_EXHAUSTED (a create refused, as the TPU API says it)."""
    from google.api_core import exceptions

    errors = (operation.get("error") or {}).get("errors") or [{}]
    message = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors)
    if no_capacity(operation):
        return google_error("ResourceExhausted", message)
    status = int(operation.get("httpErrorStatusCode") or 500)
    made: Exception = exceptions.from_http_status(status, message)  # type: ignore[no-untyped-call]
    return made


def google_error(kind: str, message: str) -> Exception:
    """google.api_core's exception `kind` (its constructors are untyped)."""
    from google.api_core import exceptions

    made: Exception = getattr(exceptions, kind)(message)
    return made


class Conflicts:
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
            raise google_error("AlreadyExists", str(error.message)) from None
        if isinstance(error, exceptions.PreconditionFailed):
            raise google_error("Aborted", str(error.message)) from None
        if isinstance(error, exceptions.BadRequest) and not isinstance(
            error, exceptions.InvalidArgument
        ):
            raise google_error("InvalidArgument", str(error.message)) from None
