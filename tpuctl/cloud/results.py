"""The results of the lifecycle commands (create, wait, reset, delete), as typed objects.

Their JSON shapes are documented in docs/output.md; `status` and `list` are in
tpuctl.cloud.describe, which reads them off the API's protos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

from tpuctl.cloud.describe import QueuedResourceStatus
from tpuctl.envelope import Result

CreateAction = Literal["created", "exists", "dry_run"]
DeleteAction = Literal["deleted", "delete_requested", "missing"]
ResetAction = Literal["reset", "reset_requested"]


@dataclass(frozen=True)
class StateSeen:
    """A state the watcher saw, and when it first saw it."""

    state: str
    at: datetime


@dataclass
class WaitResult(Result):
    """A wait that reached its target (deadlines, FAILED, preemption and Ctrl-C are errors)."""

    KIND: ClassVar[str] = "Wait"
    name: str
    target: str
    outcome: str
    state: str
    elapsed_seconds: float
    polls: int
    transitions: list[StateSeen] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    queued_resource: QueuedResourceStatus | None = None  # None when the target was DELETED


@dataclass
class CreateResult(Result):
    """`created`, `exists` (the same spec's queued resource was there: nothing sent) or
    `dry_run` (`request` holds the exact request)."""

    KIND: ClassVar[str] = "Create"
    action: CreateAction
    name: str
    request_id: str | None
    queued_resource: QueuedResourceStatus | None = None
    request: dict[str, Any] | None = None
    wait: WaitResult | None = None
    zone: str | None = None  # with several zones to try: the one it was made (or found) in


@dataclass
class ResetResult(Result):
    KIND: ClassVar[str] = "Reset"
    name: str
    action: ResetAction
    operation: str | None
    state: str | None  # ACTIVE again after `--wait`, else None


@dataclass
class DeleteResult(Result):
    KIND: ClassVar[str] = "Delete"
    name: str
    action: DeleteAction
    force: bool
    state: str | None  # the state before the delete; None when it was missing
    # The zones it was deleted in: one, or for a spec with several zones each that held it.
    zones: list[str] = field(default_factory=list)
