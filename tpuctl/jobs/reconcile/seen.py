"""What one reconcile step observed of the world, as plain values: the run's queued resource in
each zone, every worker's job, the done marker, the checkpoints and the zone claim."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpuctl.cloud.watcher import GONE


@dataclass(frozen=True)
class SliceSeen:
    """The run's slice set in one zone (a queued resource, or Compute Engine instances): its
    state in the queued resource's vocabulary (CREATING, WAITING_FOR_RESOURCES, PROVISIONING,
    ACTIVE, SUSPENDING, SUSPENDED, FAILED, DELETING, or DELETED when there is none).
    `incarnation` tells one creation of it from the next (the zone and the API's create time);
    `disruption` says why its nodes are not settled (read only for an ACTIVE one), None when
    they are."""

    zone: str
    state: str = GONE
    initiator: str | None = None
    failure: str | None = None
    incarnation: str | None = None
    created_at: datetime | None = None
    disruption: str | None = None
    # When the platform takes it back (a flex-start run's maximum run duration), if it will.
    termination_time: datetime | None = None

    @property
    def present(self) -> bool:
        return self.state != GONE

    def to_dict(self) -> dict[str, Any]:
        return {
            "zone": self.zone,
            "state": self.state,
            "initiator": self.initiator,
            "failure": self.failure,
            "incarnation": self.incarnation,
            "disruption": self.disruption,
            "termination_time": self.termination_time,
        }


@dataclass(frozen=True)
class WorkerSeen:
    """One worker's job, from its state object beside the journal or over SSH (`source`).
    `state` is the startup script's (starting, setup, waiting-for-code, waiting-for-zone,
    running, exited, done, setup-failed), `none` (never started here) or `unknown` (not read:
    `error` says why)."""

    label: str
    state: str
    boot: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signalled: bool = False
    reachable: bool = True
    last_step: int | None = None
    resumed_from: int | None = None
    reason: str | None = None
    error: str | None = None
    source: str = "ssh"

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.label,
            "state": self.state,
            "boot": self.boot,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signalled": self.signalled,
            "reachable": self.reachable,
            "last_step": self.last_step,
            "resumed_from": self.resumed_from,
            "reason": self.reason,
            "error": self.error,
            "source": self.source,
        }


@dataclass(frozen=True)
class Seen:
    """Everything a step observed. `slices` has one entry per zone looked at (GONE where the
    run has no queued resource). `api_error` is set when the TPU API could not be read: then
    nothing about the slices is known. `workers` is None when they were not read (no ACTIVE
    queued resource, or the run is over)."""

    at: datetime
    slices: dict[str, SliceSeen] = field(default_factory=dict)
    api_error: str | None = None
    workers: tuple[WorkerSeen, ...] | None = None
    done: bool = False
    latest_step: int | None = None
    claimed_zone: str | None = None

    def present(self) -> list[SliceSeen]:
        return [seen for seen in self.slices.values() if seen.present]

    def in_zones(self, zones: Sequence[str]) -> list[SliceSeen]:
        return [self.slices[zone] for zone in zones if zone in self.slices]

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "slices": [seen.to_dict() for seen in self.slices.values()],
            "api_error": self.api_error,
            "workers": None if self.workers is None else [w.to_dict() for w in self.workers],
            "done_marker": self.done,
            "latest_step": self.latest_step,
            "claimed_zone": self.claimed_zone,
        }
