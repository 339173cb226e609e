"""What a reconcile step reads of the world and how it acts on it.

`Slices` is the one small interface everything above the API talks to: look at the run's slice
set in a zone, create it, delete it, reach its workers. `TpuSlices` implements it with the
Cloud TPU API's queued resources. `observe` gathers a `Seen`; `act` carries a `Decision` out,
stopping at a crash point before every side effect (tpuctl.jobs.reconcile.crash) and writing
what it did through `write`, so the journal always says what was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl import worker as contract
from tpuctl.clock import Clock, rfc3339
from tpuctl.errors import ApiUnavailableError, NotFoundError, ResourceExhaustedError, TpuctlError
from tpuctl.jobs.reconcile import crash
from tpuctl.jobs.reconcile.decision import (
    CLAIM,
    CREATE,
    DELETE,
    FINISH,
    GIVE_UP,
    MARK_DONE,
    RESTART,
    START,
    Decision,
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


# ----------------------------------------------------------------------------------- act


def act(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    """Carry `decision` out; what was sent is written through `write` (see the module doc)."""
    handler = _ACTIONS.get(decision.action)
    if handler is not None:
        handler(decision, world, run, seen, write)


def _create(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    name = world.slices.name
    racing = len(decision.zones) > 1 or run.racing
    for zone in decision.zones:
        crash.point(f"create {zone}")
        try:
            action, request_id = world.slices.create(zone, decision.rung)
        except ResourceExhaustedError as refused:
            write(
                "zone.gave_up",
                f"{name} in {zone}: the zone refused the create ({refused.message}); nothing "
                "was created in it",
                zone=zone,
                outcome="resource_exhausted",
                racing=racing or None,
            )
            continue
        where = f" in {zone}" if len(seen.slices) > 1 or racing else ""
        facts: dict[str, Any] = {
            "zone": zone,
            "racing": racing or None,
            "rung": decision.rung if decision.rung else None,
        }
        if action == "created" and decision.again:
            write(
                "qr.recreated",
                f"created {name} again{where} (same run name, so the job resumes)",
                count=decision.again,
                request_id=request_id,
                **facts,
            )
        elif action == "created":
            write("qr.created", f"created {name}{where}", request_id=request_id, **facts)
        else:
            write("qr.exists", f"{name}{where} exists from this spec; using it", **facts)
    world.forget()


def _delete(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    name = world.slices.name
    for zone in decision.zones:
        write(
            "qr.deleting",
            f"deleting {name} in {zone}: {decision.why}",
            zone=zone,
            reason=decision.why,
        )
        crash.point(f"delete {zone}")
        sent = world.slices.delete(zone)
        where = f" in {zone}" if len(seen.slices) > 1 else ""
        write(
            "qr.deleted",
            f"deleted {name}{where}: {decision.why}",
            zone=zone,
            reason=decision.why,
            sent=sent,
        )
    world.forget()


def _claim(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    crash.point(f"claim {decision.claim}")
    world.record.claim_zone(decision.claim)
    if decision.claim is None:
        write("zone.unclaimed", decision.message, zone=seen.claimed_zone)
    else:
        write("zone.claimed", decision.message, zone=decision.claim)


def _start(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    zone = decision.zones[0]
    incarnation = seen.slices[zone].incarnation
    fleet = world.fleet(zone, incarnation)
    if decision.workers:
        fleet = fleet.only([t for t in fleet.targets if t.label in decision.workers])
    crash.point("start the job")
    try:
        result = world.jobs.deliver_and_start(fleet, world.spec)
    except TpuctlError as error:
        world.forget()
        write(
            "job.start_failed",
            f"delivering/starting the job failed ({error.message}; attempt "
            f"{run.start_failures + 1})",
            attempt=run.start_failures + 1,
            error=error.message,
        )
        return
    world.forget()
    if int(result.exit_code):
        failed = result.failed
        first = failed[0] if failed else None
        write(
            "job.start_failed",
            f"delivering/starting the job failed on {len(failed)} of {len(result)} workers "
            f"(attempt {run.start_failures + 1})"
            + (f": {first.target.label}: {first.error}" if first is not None else ""),
            attempt=run.start_failures + 1,
            workers=[w.target.label for w in failed],
        )
        return
    said = f"{world.slices.name}: job delivered and started on {len(result)} workers"
    if decision.workers:
        said = f"{decision.message}: started on {len(result)}"
    write(
        "job.started",
        said,
        workers=len(result),
        only=list(decision.workers) or None,
        recovering=run.recovering,
        incarnation=incarnation,
        zone=zone,
    )


def _restart(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    zone = decision.zones[0]
    crash.point("restart the job")
    result = world.jobs.restart_job(world.fleet(zone, seen.slices[zone].incarnation), world.spec)
    world.forget()
    write(
        "job.restarted",
        f"{world.slices.name}: restarted the job (restart {run.restarts + 1}; it resumes from "
        f"step {decision.from_step if decision.from_step is not None else 0})",
        count=run.restarts + 1,
        from_step=decision.from_step,
        ending=decision.ending,
        workers_ok=len(result.succeeded),
    )


def _mark_done(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    crash.point("write the done marker")
    if not world.record.write_done(decision.why):
        active = next((s for s in seen.slices.values() if s.state == "ACTIVE"), None)
        if active is not None:
            world.jobs.mark_done(
                world.fleet(active.zone, active.incarnation), world.spec, decision.why
            )
    write("job.done", decision.message, reason=decision.why)


def _give_up(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    assert decision.give_up is not None
    error = decision.give_up
    if not run.logs_saved:
        _keep_logs(world, seen, write)
    write(
        "run.gave_up",
        f"{world.slices.name}: gave up ({error.kind}): {error.message}",
        error=error.to_dict(),
        kept=decision.kept or None,
    )
    if decision.zones:
        _delete(
            Decision(DELETE, decision.message, zones=decision.zones, why=f"gave up ({error.kind})"),
            world,
            run,
            seen,
            write,
        )
    elif decision.kept:
        commands = "  and  ".join(
            world.slices.delete_command(s.zone) for s in seen.present() if s.state != "DELETING"
        )
        write("qr.kept", f"kept {world.slices.name}; delete it with: {commands}")


def _finish(decision: Decision, world: World, run: RunRecord, seen: Seen, write: Write) -> None:
    if decision.kept:
        commands = "  and  ".join(world.slices.delete_command(s.zone) for s in seen.present())
        write("qr.kept", f"kept {world.slices.name} (--keep); delete it with: {commands}")
    write("run.done", decision.message, kept=decision.kept or None)


_ACTIONS: dict[str, Callable[[Decision, World, RunRecord, Seen, Write], None]] = {
    CREATE: _create,
    DELETE: _delete,
    CLAIM: _claim,
    START: _start,
    RESTART: _restart,
    MARK_DONE: _mark_done,
    GIVE_UP: _give_up,
    FINISH: _finish,
}


# ---------------------------------------------------------------------------- the logs


def _keep_logs(world: World, seen: Seen, write: Write) -> None:
    """Before a give-up deletes the workers, and their disks with the only log: each worker's
    last lines go beside the journal (whole tails) and into the journal (a few workers')."""
    active = next((s for s in seen.slices.values() if s.state == "ACTIVE"), None)
    if active is None or seen.workers is None:
        return
    try:
        tails = world.jobs.log_tails(
            world.fleet(active.zone, active.incarnation), world.spec, LOG_KEEP_LINES
        )
    except TpuctlError:
        return
    if not tails:
        return
    crash.point("keep the workers' logs")
    where = world.save_logs(tails) if world.save_logs is not None else None
    failed = [w.label for w in seen.workers if not _ended_well(w)]
    chosen = [*failed, *(label for label in tails if label not in failed)][:LOG_TAIL_WORKERS]
    kept = {label: _last_lines(tails[label], LOG_TAIL_LINES) for label in chosen if label in tails}
    reasons = {w.label: w.reason for w in seen.workers if w.reason}
    shown = [
        f"  [{label}] {line}"
        for label in (failed or chosen)[:2]
        if label in kept
        for line in kept[label].splitlines()[-LOG_SHOWN_LINES:]
    ]
    write(
        "job.logs",
        f"{world.slices.name}: kept the last lines of {len(tails)} workers' logs"
        + (f" in {where}" if where else "")
        + (
            " (tpuctl report SPEC shows them); the last of them:\n" + "\n".join(shown)
            if shown
            else ""
        ),
        tails=kept,
        reasons=reasons or None,
        where=where,
    )


def _ended_well(worker: WorkerSeen) -> bool:
    return worker.state in ("done", "running") or (
        worker.state == "exited" and worker.exit_code == 0
    )


def _last_lines(text: str, count: int) -> str:
    lines = text.splitlines()[-count:]
    return "\n".join(line[:500] for line in lines)
