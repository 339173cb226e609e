"""Fakes of the world a reconcile step sees and acts on: the run's queued resource in each zone
(scripted states, advanced by a fake clock), the journal in memory, and a world assembled from
them and tests.jobs.fakes' jobs and checkpoints. Steps run in milliseconds, with no emulator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tests.jobs.fakes import T0, FakeClock, FakeJobs, FakeRecord, fleet
from tpuctl.cloud.watcher import GONE
from tpuctl.errors import ApiUnavailableError, ResourceExhaustedError
from tpuctl.fanout.operations import Fleet
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import SliceSeen
from tpuctl.jobs.reconcile.world import SshWorkers, World


@dataclass
class FakeZone:
    """The run's queued resource in one zone. A creation waits for capacity, then becomes
    `next_state` after `ready_after` seconds (None: it waits for ever); a deletion takes a
    second."""

    state: str = GONE
    initiator: str | None = None
    failure: str | None = None
    created_at: float | None = None
    deleted_at: float | None = None
    next_state: str | None = "ACTIVE"
    ready_after: float = 2.0
    settled: bool = True
    undeletable: bool = False  # deletes cannot be sent (the API refuses them)
    refuses: bool = False  # creates are refused: RESOURCE_EXHAUSTED (no quota or capacity)
    run_for: float | None = None  # flex-start: taken back this long after its creation
    gone_at_end: bool = False  # taken back by deleting it (Compute Engine's flex-start VM)
    creates: int = 0
    deletes: int = 0


class FakeSlices:
    """Slices in scripted zones; `history` records (t, zone, event) for every create and
    delete, so a test can check that two never existed at once."""

    def __init__(
        self,
        clock: FakeClock,
        zones: tuple[str, ...] = ("z",),
        name: str = "job",
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.on_ready = on_ready  # a creation became ACTIVE: its workers boot
        self.name = name
        self.zones = {zone: FakeZone() for zone in zones}
        self.api_down = False
        self.history: list[tuple[float, str, str]] = []
        self.rungs_asked: list[int] = []  # the ladder's rung of every create

    def zone(self, zone: str) -> FakeZone:
        return self.zones.setdefault(zone, FakeZone())

    def _call(self) -> None:
        if self.api_down:
            raise ApiUnavailableError("the TPU API kept failing", status="UNAVAILABLE")

    def _advance(self, zone: FakeZone) -> None:
        now = self.clock.t
        if zone.state == "DELETING" and zone.deleted_at is not None and now - zone.deleted_at >= 1:
            zone.state = GONE
        waiting = zone.state in ("WAITING_FOR_RESOURCES", "PROVISIONING")
        ready = zone.created_at is not None and now - zone.created_at >= zone.ready_after
        if waiting and zone.next_state and ready:
            zone.state = zone.next_state
            if zone.state == "ACTIVE" and self.on_ready is not None:
                self.on_ready()
        end = self._termination(zone)
        if end is not None and now >= end and zone.state == "ACTIVE":
            zone.state, zone.initiator = "SUSPENDED", "SERVICE"
            if zone.gone_at_end:
                zone.state, zone.initiator = GONE, None

    @staticmethod
    def _termination(zone: FakeZone) -> float | None:
        if zone.run_for is None or zone.created_at is None:
            return None
        return zone.created_at + zone.ready_after + zone.run_for

    def look(self, zone: str) -> SliceSeen:
        self._call()
        fake = self.zone(zone)
        self._advance(fake)
        if fake.state == GONE:
            return SliceSeen(zone)
        created = T0 + timedelta(seconds=fake.created_at or 0.0)
        end = self._termination(fake)
        return SliceSeen(
            zone=zone,
            state=fake.state,
            initiator=fake.initiator,
            failure=fake.failure,
            incarnation=f"{zone}@{fake.creates}",
            created_at=created,
            termination_time=None if end is None else T0 + timedelta(seconds=end),
        )

    def disruption(self, zone: str) -> str | None:
        self._call()
        return None if self.zone(zone).settled else "node job is RESTARTING"

    def create(self, zone: str, rung: int = 0) -> tuple[str, str | None]:
        self._call()
        self.rungs_asked.append(rung)
        fake = self.zone(zone)
        self._advance(fake)
        if fake.state != GONE:
            return "exists", None
        if fake.refuses:
            raise ResourceExhaustedError("Quota exceeded", created=False, zone=zone)
        fake.creates += 1
        fake.state, fake.initiator, fake.failure = "WAITING_FOR_RESOURCES", None, None
        fake.created_at = self.clock.t
        self.history.append((self.clock.t, zone, "create"))
        return "created", f"request-{fake.creates}"

    def delete(self, zone: str) -> str:
        self._call()
        fake = self.zone(zone)
        self._advance(fake)
        if fake.undeletable:
            raise ApiUnavailableError("the TPU API kept failing", status="UNAVAILABLE")
        if fake.state == GONE:
            return "missing"
        if fake.state == "DELETING":
            return "deleting"
        fake.deletes += 1
        fake.state, fake.deleted_at = "DELETING", self.clock.t
        self.history.append((self.clock.t, zone, "delete"))
        return "delete_requested"

    def delete_command(self, zone: str) -> str:
        return f"tpuctl delete {self.name} --force --yes --zone {zone}"

    def fleet(self, zone: str) -> Fleet:
        return fleet(zone=zone)

    def most_at_once(self) -> int:
        """The most queued resources that existed at the same time (deletes count at once)."""
        alive: set[str] = set()
        most = 0
        for _t, zone, event in self.history:
            if event == "create":
                alive.add(zone)
            else:
                alive.discard(zone)
            most = max(most, len(alive))
        return most


@dataclass
class Entry:
    timestamp: datetime
    kind: str
    fields: dict[str, Any]
    name: str


@dataclass
class FakeStore:
    """The run's journal in memory; `load` folds it all, as after a lost snapshot."""

    clock: FakeClock
    entries: list[Entry] = field(default_factory=list)
    beats: list[dict[str, Any]] = field(default_factory=list)
    begun: int = 0  # how often the run's spec was kept (run.json)

    def load(self) -> RunRecord:
        return RunRecord().fold(self.entries)

    def begin(self) -> None:
        self.begun += 1

    def append(self, kind: str, message: str, fields: dict[str, Any]) -> Entry:
        at = T0 + timedelta(seconds=self.clock.t)
        entry = Entry(at, kind, {"message": message, **fields}, f"{len(self.entries):06d}")
        self.entries.append(entry)
        return entry

    def save(self, record: RunRecord) -> None:
        return None

    def beat(self, document: dict[str, Any]) -> None:
        self.beats.append(document)

    @property
    def kinds(self) -> list[str]:
        return [entry.kind for entry in self.entries]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [entry.fields for entry in self.entries if entry.kind == kind]


def make_world(
    clock: FakeClock,
    slices: FakeSlices,
    jobs: FakeJobs,
    record: FakeRecord,
    spec: Any,
    *,
    save_logs: Callable[[dict[str, str]], str | None] | None = None,
) -> World:
    return World(
        spec=spec,
        slices=slices,
        jobs=jobs,
        record=record,
        workers=SshWorkers(jobs),
        clock=clock.clock(),
        save_logs=save_logs,
    )
