"""Fakes of what `up` and `drill` decide with (tpuctl.jobs.adapters) and a fake clock: scripted
queued-resource states, worker statuses and checkpoints, advanced by the babysitter's own
sleeps. Decisions run in milliseconds, with no emulator and no SSH."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from tpuctl.clock import Clock
from tpuctl.cloud.results import CreateResult, DeleteResult
from tpuctl.cloud.watcher import GONE, Observation, Outcome, WatchEvent, WatchPolicy, WatchResult
from tpuctl.errors import (
    ApiUnavailableError,
    DeadlineError,
    NotFoundError,
    PreemptedError,
    QueuedResourceFailed,
    TpuctlError,
)
from tpuctl.fanout.operations import Fleet
from tpuctl.fanout.results import FanoutResult, WorkerResult
from tpuctl.fanout.targets import WorkerTarget
from tpuctl.spec.load import load_spec_text
from tpuctl.spec.model import Spec
from tpuctl.storage.lease import Holder, LeaseHeld, LeaseLost

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


class FakeClock:
    """Time moves only when the code under test sleeps; `at(t, action)` runs an action once
    the clock reaches t (the world changing while the babysitter waits)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.pending: list[tuple[float, Callable[[], None]]] = []
        self.limit = 3600.0

    def at(self, t: float, action: Callable[[], None]) -> None:
        self.pending.append((t, action))
        self.pending.sort(key=lambda item: item[0])

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)
        assert self.t < self.limit, "the code under test waited for ever"
        while self.pending and self.pending[0][0] <= self.t:
            self.pending.pop(0)[1]()

    def clock(self) -> Clock:
        return Clock(
            monotonic=lambda: self.t,
            now=lambda: T0 + timedelta(seconds=self.t),
            sleep=self.sleep,
        )


@dataclass
class FakeQr:
    """A queued resource: its state, and what was asked of it. `in_zone` gives the same
    spec's QR in another zone (one fake per zone, shared through `zones`)."""

    name: str = "job"
    state: str = GONE
    initiator: str | None = None
    failure: str | None = None
    settled: bool = True
    # What wait() finds: a creation goes ACTIVE, unless set (e.g. "FAILED", "SUSPENDED").
    next_state: str = "ACTIVE"
    creates: int = 0
    deletes: int = 0
    maintenances: list[tuple[str, int]] = field(default_factory=list)
    api_down: bool = False  # every call fails as the TPU API does in an outage
    undeletable: bool = False  # a deadline's delete cannot be sent (the API is down)
    zone: str = "z"
    zones: dict[str, FakeQr] = field(default_factory=dict)  # every zone's fake, shared

    def __post_init__(self) -> None:
        self.zones.setdefault(self.zone, self)

    @property
    def resource(self) -> str:
        return f"projects/p/locations/{self.zone}/queuedResources/{self.name}"

    def in_zone(self, zone: str) -> FakeQr:
        if zone not in self.zones:
            FakeQr(name=self.name, zone=zone, zones=self.zones)
        return self.zones[zone]

    def _call(self) -> None:
        if self.api_down:
            raise ApiUnavailableError("the TPU API kept failing", status="UNAVAILABLE")

    def observe(self) -> Observation:
        self._call()
        return Observation(self.state, self.initiator, self.failure)

    def create(self) -> CreateResult:
        self._call()
        if self.state == GONE:
            self.creates += 1
            self.state, self.initiator, self.failure = "WAITING_FOR_RESOURCES", None, None
            return CreateResult("created", self.name, f"request-{self.creates}")
        return CreateResult("exists", self.name, None)

    def wait(
        self,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        on_event: Callable[[WatchEvent], None] | None,
        clock: Clock | None,
    ) -> None:
        if self.state in ("WAITING_FOR_RESOURCES", "PROVISIONING"):
            self.state = self.next_state
        if on_event is not None:
            now = T0 if clock is None else clock.now()
            observation = self.observe()
            on_event(WatchEvent("state", now, self.state, observation=observation))
        if self.state == "FAILED":
            raise QueuedResourceFailed(f"{self.name} FAILED", name=self.name, reason="no luck")
        if self.state in ("SUSPENDING", "SUSPENDED"):
            raise PreemptedError(f"{self.name} {self.state}", name=self.name, state=self.state)
        if self.state == "WAITING_FOR_RESOURCES" and policy.queue_timeout is not None:
            if clock is not None:
                clock.sleep(policy.queue_timeout)  # the world may change meanwhile
            if self.state == "WAITING_FOR_RESOURCES":
                raise self.give_up(
                    _timed_out(self.state), policy, keep_on_timeout=keep_on_timeout, clock=clock
                )

    def give_up(
        self,
        result: WatchResult,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        clock: Clock | None,
    ) -> TpuctlError:
        """As lifecycle.wait_failure: a deadline deletes the QR unless kept."""
        if result.outcome is Outcome.FAILED:
            return QueuedResourceFailed(f"{self.name} FAILED", name=self.name, reason="no luck")
        if result.outcome is Outcome.SUSPENDED:
            return PreemptedError(f"{self.name} {result.state}", state=result.state)
        if result.outcome is Outcome.GONE:
            return NotFoundError(f"{self.name} was deleted while waiting for it")
        if self.undeletable:
            keep_on_timeout = True
        elif not keep_on_timeout:
            self.delete()
        return DeadlineError(
            f"{self.name} in {self.zone} still {result.state} after the queueing deadline",
            name=self.name,
            phase="queueing",
            deleted=not keep_on_timeout,
        )

    def delete(self) -> DeleteResult:
        self._call()
        before = self.state
        self.deletes += 1
        self.state = GONE
        return DeleteResult(self.name, "deleted" if before != GONE else "missing", True, before)

    def node_disruption(self, node_ids: Sequence[str]) -> str | None:
        self._call()
        return None if self.settled else "node job is RESTARTING"

    def simulate_maintenance(self, node_id: str, worker: int) -> None:
        self.maintenances.append((node_id, worker))

    def delete_command(self) -> str:
        return f"tpuctl delete {self.name} --force --yes --zone {self.zone}"


def _timed_out(state: str) -> WatchResult:
    return WatchResult(Outcome.QUEUE_DEADLINE, state, Observation(state), 0.0, 1)


@dataclass
class Status:
    """One worker's job, as job control reports it."""

    label: str
    state: str = "none"
    boot: int | None = 1
    pid: int | None = None
    exit_code: int | None = None
    reachable: bool = True
    signalled: bool = False


class FakeJobs:
    """The workers' jobs: `start` makes them run; tests script what happens next."""

    def __init__(self, labels: Sequence[str] = ("0/0", "0/1")) -> None:
        self.workers = {label: Status(label) for label in labels}
        self.delivered = 0
        self.restarted = 0
        self.step = 0  # the step the log shows, when `logs` has nothing for the boot
        self.logs: dict[int, str] = {}  # boot → the log's text
        self.marked_done: str | None = None
        self.tails: dict[str, str] = {}  # label → the log tail log_tails gives
        # A worker going down: a read through a fleet shortened by connecting_within gets
        # nothing, after `going_down(timeout)` (a test's script of what happens meanwhile);
        # each timeout is recorded.
        self.going_down: Callable[[float], None] | None = None
        self.connect_timeouts: list[float] = []
        self._pids = 100

    def _run(self, *, new_boot: bool = False) -> None:
        for status in self.workers.values():
            self._pids += 1
            status.state, status.pid, status.exit_code = "running", self._pids, None
            status.signalled = False
            if new_boot:
                status.boot = (status.boot or 0) + 1

    def set(self, state: str, exit_code: int | None = None, *, signalled: bool = False) -> None:
        for status in self.workers.values():
            status.state, status.exit_code, status.signalled = state, exit_code, signalled

    def new_disks(self) -> None:
        """A queued resource (re)created: fresh workers wait for their code (boot 1)."""
        for status in self.workers.values():
            status.state, status.boot, status.pid, status.exit_code = (
                "waiting-for-code",
                1,
                None,
                None,
            )
            status.signalled = False

    def reboot(self) -> None:
        """Maintenance or a reset: the startup script relaunches the job in a new boot."""
        self._run(new_boot=True)

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        self.delivered += 1
        self._run()
        return _ok(fleet)

    def job_status(self, fleet: Fleet, spec: Spec) -> list[Status]:
        return [Status(**vars(status)) for status in self.workers.values()]

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        self.restarted += 1
        self._run()
        return _ok(fleet)

    def mark_done(self, fleet: Fleet, spec: Spec, reason: str) -> FanoutResult:
        self.marked_done = reason
        return _ok(fleet)

    def log_tails(self, fleet: Fleet, spec: Spec, lines: int) -> dict[str, str]:
        return {label: self.tails.get(label, f"last line of {label}\n") for label in self.workers}

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        timeout = getattr(fleet, "connect_timeout", None)  # the fake fleet's, once shortened
        if timeout is not None and self.going_down is not None:
            self.connect_timeouts.append(timeout)
            self.going_down(timeout)
            return ""
        current = self.workers[target.label].boot or 1
        text = self.logs.get(boot if boot is not None else current)
        if text is not None:
            return text
        return f"step {self.step}/1000\n" if self.step else ""


def _ok(fleet: Fleet) -> FanoutResult:
    return FanoutResult([WorkerResult(target, "ok", exit_code=0) for target in fleet.targets])


@dataclass
class FakeRecord:
    done: bool = False
    steps: list[int] = field(default_factory=list)
    shared: bool = True  # the spec has a checkpoint.dir to write the marker in
    reason: str | None = None
    location: str = "gs://bucket/ckpt/job"
    claims: bool = True  # the spec has a zone claim (zone_policy first-active)
    claimed: str | None = None
    claim_history: list[str | None] = field(default_factory=list)

    def is_done(self) -> bool:
        return self.done

    def claimed_zone(self) -> str | None:
        return self.claimed

    def claim_zone(self, zone: str | None) -> bool:
        if self.claims:
            self.claimed = zone
            self.claim_history.append(zone)
        return self.claims

    def write_done(self, reason: str) -> bool:
        if self.shared:
            self.done, self.reason = True, reason
        return self.shared

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        return (max(self.steps), T0) if self.steps else None

    def complete_steps(self) -> tuple[int, ...]:
        return tuple(sorted(self.steps))


@dataclass
class FakeJournal:
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def append(self, kind: str, **fields: Any) -> object:
        self.entries.append((kind, fields))
        return None

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.entries]


def fleet(slices: int = 1, workers: int = 2, zone: str | None = None) -> Fleet:
    """A stand-in Fleet: the babysitter reads only its targets; a drill also shortens its
    connect timeout (connecting_within), which the fake keeps as `connect_timeout`."""
    targets = [
        WorkerTarget(s, f"job-{s}" if slices > 1 else "job", w, f"10.0.{s}.{w}")
        for s in range(slices)
        for w in range(workers)
    ]

    class _Fleet:
        def __init__(
            self, chosen: Sequence[WorkerTarget] | None = None, within: float | None = None
        ) -> None:
            self.targets = list(chosen) if chosen is not None else targets
            self.connect_timeout = within  # None: the fleet's own

        def only(self, chosen: Sequence[WorkerTarget]) -> _Fleet:
            return _Fleet(chosen, self.connect_timeout)

        def connecting_within(self, seconds: float) -> _Fleet:
            return _Fleet(self.targets, seconds)

    return cast(Fleet, _Fleet())


def spec(
    *,
    max_preemptions: int = 2,
    max_failures: int = 1,
    autocheckpoint: bool = True,
    extra: str = "",
) -> Spec:
    text = f"""apiVersion: tpuctl/v1
name: job
tpu: {{accelerator: v4-16, runtime: tpu-ubuntu2204-base}}
capacity: {{tier: spot}}
checkpoint: {{dir: /ckpt, autocheckpoint: {str(autocheckpoint).lower()}}}
job: {{command: python3 train.py}}
recovery: {{max_preemptions: {max_preemptions}, max_failures: {max_failures}}}
{extra}"""
    return load_spec_text(text, environ={}).spec


@dataclass
class FakeLease:
    """The run's lease: free, held by another `up`, or taken over while we run."""

    held_by: Holder | None = None
    lost_at: float | None = None  # the clock time our lease is taken over
    clock: FakeClock | None = None
    acquired: bool = False
    released: bool = False

    def acquire(
        self, *, wait: bool = False, on_wait: Callable[[Holder], None] | None = None
    ) -> Holder | None:
        if self.held_by is not None:
            raise LeaseHeld(f"another supervisor holds this run: {self.held_by.command}")
        self.acquired = True
        return None

    def renew_if_due(self) -> None:
        if self.lost_at is not None and self.clock is not None and self.clock.t >= self.lost_at:
            raise LeaseLost("the lease was taken over")

    def release(self) -> None:
        self.released = True
