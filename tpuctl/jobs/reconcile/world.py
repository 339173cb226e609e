"""What a reconcile step reads of the world (how it acts on it is tpuctl.jobs.reconcile.act).

`Slices` is the one small interface everything above the API talks to: look at the run's slice
set in a zone, create it, delete it, reach its workers. `TpuSlices` implements it with the
Cloud TPU API's queued resources. `observe` gathers a `Seen`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from tpuctl import worker as contract
from tpuctl.clock import Clock, rfc3339
from tpuctl.errors import ApiUnavailableError, NotFoundError, TpuctlError
from tpuctl.jobs.reconcile.decision import (
    Policy,
)
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen, SliceSeen, WorkerSeen

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.fanout.operations import Fleet
    from tpuctl.jobs.adapters import JobOps, JobRecord, WorkerStatus
    from tpuctl.spec.model import Spec

# write(kind, message, **fields): journal one entry (and say it).
Write = Callable[..., None]
# A live state whose object has not been rewritten for this long is not believed (the VM, or
# its startup script, is gone): three of the script's one-minute heartbeats.
STATE_STALE_AFTER = 180.0
SECOND = timedelta(seconds=1)
LOG_TAIL_LINES = 20  # lines of each worker's log in the journal
LOG_KEEP_LINES = 200  # lines of each worker's log kept beside it
LOG_SHOWN_LINES = 5  # lines of each of the first two failed workers' logs said at a give-up
LOG_TAIL_WORKERS = 8  # the journal keeps the tails of this many workers (the failed first)


class Slices(Protocol):
    """Where the run's slices come from, for one spec, in any of its zones."""

    name: str

    def look(self, zone: str) -> SliceSeen:
        """The run's slice set in `zone` (GONE when there is none)."""
        ...

    def disruption(self, zone: str) -> str | None:
        """Why its nodes are not settled (restarting, maintenance announced…), or None."""
        ...

    def create(self, zone: str, rung: int = 0) -> tuple[str, str | None]:
        """Create it from the spec (on the capacity ladder's `rung`: 0 is the spec's own
        tier), one request id for every retry: (`created` or `exists`, the request id)."""
        ...

    def delete(self, zone: str) -> str:
        """Send its deletion (nodes too) and return at once: `delete_requested`, `deleting`
        (one was under way) or `missing`."""
        ...

    def delete_command(self, zone: str) -> str:
        """The command a person runs to delete it."""
        ...

    def fleet(self, zone: str) -> Fleet:
        """Its workers, ready to connect to."""
        ...


class TpuSlices:
    """Slices through the Cloud TPU API: one queued resource per zone, named after the spec."""

    def __init__(
        self,
        api: TpuApi,
        spec: Spec,
        fleet_factory: Callable[..., Fleet],
        name: str = "",
        rungs: Sequence[Spec] = (),
    ) -> None:
        # The spec as each rung of its capacity ladder asks for it (the first: the spec's own).
        self.rungs = list(rungs) or [spec]
        # A rung that only REST can ask for (flex-start, reservation-bound, the boot disk's
        # size) is read over REST too: only REST answers when its run ends.
        self.api = api.over_rest() if any(_needs_rest(rung) for rung in self.rungs) else api
        self.spec = spec
        self.name = name or spec.name
        self.fleet_factory = fleet_factory

    def _api(self, zone: str) -> TpuApi:
        from tpuctl.cloud import lifecycle

        api = self.api.in_zone(zone)
        # One poll retries briefly and silently: an outage is the step's to report, once
        # every 30 s (api.unavailable), and a scheduler's step exits 11.
        quiet = replace(api, on_retry=None)
        return quiet.with_retry(min(api.retry_total, lifecycle.POLL_RETRY_SECONDS))

    def look(self, zone: str) -> SliceSeen:
        from tpuctl.cloud import describe

        queued_resource = self._api(zone).find_queued_resource(self.name)
        if queued_resource is None:
            return SliceSeen(zone)
        failure = describe.failure_of(queued_resource)
        created = describe.timestamp(queued_resource.create_time)
        return SliceSeen(
            zone=zone,
            state=describe.state_name(queued_resource),
            initiator=describe.enum_name(queued_resource.state.state_initiator) or None,
            failure=failure.get("message") if failure else None,
            incarnation=f"{zone}@{rfc3339(created, 'microseconds')}" if created else zone,
            created_at=created,
            termination_time=describe.termination_time(queued_resource),
        )

    def disruption(self, zone: str) -> str | None:
        from tpuctl.cloud import describe
        from tpuctl.cloud.nodes import node_disruption

        api = self._api(zone)
        queued_resource = api.find_queued_resource(self.name)
        if queued_resource is None:
            return "the queued resource is gone"
        return node_disruption(api, describe.template_of(queued_resource).node_ids)

    def create(self, zone: str, rung: int = 0) -> tuple[str, str | None]:
        from tpuctl.cloud import lifecycle
        from tpuctl.jobs.provision import create_request

        api = self.api.in_zone(zone)
        spec = self.rungs[min(rung, len(self.rungs) - 1)]
        created = lifecycle.create(api, create_request(spec, api.location))
        return created.action, created.request_id

    def delete(self, zone: str) -> str:
        import uuid

        from tpuctl.cloud import describe

        api = self.api.in_zone(zone)
        existing = api.find_queued_resource(self.name)
        if existing is None:
            return "missing"
        if describe.state_name(existing) == "DELETING":
            return "deleting"
        try:
            api.delete_queued_resource(self.name, force=True, request_id=str(uuid.uuid4()))
        except NotFoundError:
            return "missing"
        return "delete_requested"

    def delete_command(self, zone: str) -> str:
        from tpuctl.cloud import queries

        return queries.delete_command(self.api.in_zone(zone), self.name)

    def fleet(self, zone: str) -> Fleet:
        return self.fleet_factory(zone=zone)


def _needs_rest(spec: Spec) -> bool:
    from tpuctl.render.request import rest_only_fields

    return bool(rest_only_fields(spec))


class WorkerReader(Protocol):
    """Every worker's job: from the state objects its startup script keeps beside the journal,
    or over SSH. `since`: when the slice set was created (an object older than that is a
    previous incarnation's)."""

    def read(
        self, fleet: Callable[[], Fleet], spec: Spec, since: datetime | None
    ) -> list[WorkerSeen]: ...


class SshWorkers:
    """Every worker's job over SSH (tpuctl.jobs.control.job_status)."""

    def __init__(self, jobs: JobOps) -> None:
        self.jobs = jobs

    def read(
        self, fleet: Callable[[], Fleet], spec: Spec, since: datetime | None = None
    ) -> list[WorkerSeen]:
        return [worker_seen(status) for status in self.jobs.job_status(fleet(), spec)]


class ObjectWorkers:
    """Every worker's job from its state object beside the journal; over SSH only for the
    workers whose object is missing, from an earlier incarnation, or stale (a live state whose
    heartbeat is older than `stale_after`: the VM or its script is gone without a word)."""

    def __init__(
        self, url: str, jobs: JobOps, clock: Clock, *, stale_after: float = STATE_STALE_AFTER
    ) -> None:
        self.url = url
        self.ssh = SshWorkers(jobs)
        self.clock = clock
        self.stale_after = stale_after
        self.read_over_ssh = 0  # workers read over SSH by the last read (for benchmarks)

    def read(
        self, fleet: Callable[[], Fleet], spec: Spec, since: datetime | None = None
    ) -> list[WorkerSeen]:
        from tpuctl.storage.worker_states import read_worker_states

        states = read_worker_states(self.url)
        now = self.clock.now()
        seen: dict[str, WorkerSeen] = {}
        for label in expected_workers(spec):
            state = states.get(label)
            if state is None or state.heartbeat is None:
                continue
            if since is not None and state.heartbeat < since - SECOND:
                continue  # written before this slice set existed (its clock has seconds)
            age = (now - state.heartbeat).total_seconds()
            if state.state in contract.LIVE_STATES and age > self.stale_after:
                continue
            seen[label] = WorkerSeen(
                label=label,
                state=state.state,
                boot=state.boot,
                pid=state.pid,
                exit_code=state.exit_code,
                signalled=state.signalled,
                reason=state.reason,
                last_step=state.last_step,
                resumed_from=state.resumed_from,
                source="object",
            )
        missing = [label for label in expected_workers(spec) if label not in seen]
        self.read_over_ssh = len(missing)
        if missing:
            whole = fleet()
            targets = [target for target in whole.targets if target.label in missing]
            for worker in self.ssh.read(lambda: whole.only(targets), spec):
                seen[worker.label] = worker
        return [seen[label] for label in sorted(seen, key=_label_order)]


def expected_workers(spec: Spec) -> list[str]:
    """Every worker of every slice of the spec, as `slice/worker`."""
    from tpuctl.topology import parse_accelerator

    vms = parse_accelerator(spec.tpu.accelerator, api=spec.tpu.api).vms
    return [f"{s}/{w}" for s in range(spec.tpu.slices) for w in range(vms)]


def _label_order(label: str) -> tuple[int, int]:
    slice_index, _, worker = label.partition("/")
    return int(slice_index), int(worker)


def worker_seen(status: WorkerStatus, source: str = "ssh") -> WorkerSeen:
    return WorkerSeen(
        label=status.label,
        state=status.state,
        boot=status.boot,
        pid=status.pid,
        exit_code=status.exit_code,
        signalled=status.signalled,
        reachable=status.reachable,
        reason=getattr(status, "reason", None),
        error=getattr(status, "error", None),
        source=source,
    )


@dataclass
class World:
    """Everything a step reads and acts on. The fleets and the last workers read are kept
    for the process's next step (`up`), per incarnation of the slice set."""

    spec: Spec
    slices: Slices
    jobs: JobOps
    record: JobRecord
    workers: WorkerReader
    clock: Clock = field(default_factory=Clock)
    save_logs: Callable[[dict[str, str]], str | None] | None = None
    fleets: dict[str, Fleet] = field(default_factory=dict)
    last_read: tuple[str, float, tuple[WorkerSeen, ...]] | None = None
    reread_every: float = 0.0  # `up` reads the workers at most this often while they run

    def fleet(self, zone: str, incarnation: str | None) -> Fleet:
        key = incarnation or zone
        if key not in self.fleets:
            self.fleets[key] = self.slices.fleet(zone)
        return self.fleets[key]

    def forget(self) -> None:
        """Resolve the workers again and read them afresh (after an action, or a failure)."""
        self.fleets.clear()
        self.last_read = None


# ------------------------------------------------------------------------------- observe


def zones_to_look_at(policy: Policy, record: JobRecord) -> list[str]:
    zones = list(policy.zones)
    if policy.claims_zone:
        claimed = record.claimed_zone()
        if claimed and claimed not in zones:
            zones.append(claimed)
    return zones


def observe(world: World, policy: Policy, run: RunRecord) -> Seen:
    """Everything a decision needs, read now. The TPU API down: `api_error` and nothing
    else. Workers are read only while the run has an ACTIVE slice set and goes on."""
    now = world.clock.now()
    record = world.record
    claimed = record.claimed_zone() if policy.claims_zone else None
    try:
        slices = {zone: world.slices.look(zone) for zone in zones_to_look_at(policy, record)}
    except ApiUnavailableError as error:
        return Seen(now, api_error=error.message)
    done = record.is_done()
    checkpoint = record.latest_checkpoint()
    seen = Seen(
        now,
        slices=slices,
        done=done,
        latest_step=checkpoint[0] if checkpoint else None,
        claimed_zone=claimed,
    )
    if done or run.finished is not None:
        return seen
    active = _running_on(seen, policy)
    if active is None:
        return seen
    workers = _read_workers(world, active)
    seen = Seen(
        now,
        slices=slices,
        workers=tuple(workers),
        done=done,
        latest_step=seen.latest_step,
        claimed_zone=claimed,
    )
    if workers and all(w.state in contract.ENDED_STATES for w in workers):
        try:
            disruption = world.slices.disruption(active.zone)
        except ApiUnavailableError:
            disruption = "the TPU API is unavailable, so the nodes cannot be seen"
        slices = {**slices, active.zone: _with_disruption(active, disruption)}
        seen = Seen(
            now,
            slices=slices,
            workers=seen.workers,
            done=done,
            latest_step=seen.latest_step,
            claimed_zone=claimed,
        )
    return seen


def _running_on(seen: Seen, policy: Policy) -> SliceSeen | None:
    """The ACTIVE slice set whose workers the decision looks at: the claimed zone's, else the
    first ACTIVE in the zones' order."""
    active = [s for s in seen.slices.values() if s.state == "ACTIVE"]
    for candidate in active:
        if policy.claims_zone and candidate.zone == seen.claimed_zone:
            return candidate
    return active[0] if active else None


def _read_workers(world: World, active: SliceSeen) -> list[WorkerSeen]:
    key = active.incarnation or active.zone
    if world.last_read is not None and world.reread_every > 0:
        read_for, read_at, last = world.last_read
        still_running = any(w.state in contract.LIVE_STATES for w in last)
        fresh = world.clock.monotonic() - read_at < world.reread_every
        if read_for == key and still_running and fresh:
            return list(last)
    try:
        workers = world.workers.read(
            lambda: world.fleet(active.zone, active.incarnation), world.spec, active.created_at
        )
    except TpuctlError as error:
        world.forget()  # addresses or host keys may have changed: resolve them again next time
        return [WorkerSeen("*", contract.UNREADABLE, reachable=False, error=error.message)]
    if any(not w.reachable for w in workers):
        world.forget()
    else:
        world.last_read = (key, world.clock.monotonic(), tuple(workers))
    return workers


def _with_disruption(seen: SliceSeen, disruption: str | None) -> SliceSeen:
    return replace(seen, disruption=disruption)
