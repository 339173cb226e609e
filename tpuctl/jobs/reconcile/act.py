"""How a reconcile step acts on the world: `act` carries a `Decision` out (create, delete,
claim a zone, start or restart the job, mark it done, give up, finish), stopping at a crash
point before every side effect (tpuctl.jobs.reconcile.crash) and writing what it did through
`write`, so the journal always says what was sent; at a give-up or the end it keeps the
workers' last log lines. What it acts on is tpuctl.jobs.reconcile.world's `World`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpuctl.errors import ResourceExhaustedError, TpuctlError
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
)
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen, WorkerSeen
from tpuctl.jobs.reconcile.world import (
    LOG_KEEP_LINES,
    LOG_SHOWN_LINES,
    LOG_TAIL_LINES,
    LOG_TAIL_WORKERS,
    World,
    Write,
)

if TYPE_CHECKING:
    pass


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
