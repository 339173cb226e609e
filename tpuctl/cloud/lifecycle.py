"""Queued-resource lifecycle: idempotent create, wait with give-up policy, status, reset, delete.

Each function takes a `TpuApi` and returns plain data; failures are tpuctl errors carrying the
facts a script needs (name, state, what was deleted). Nothing here prints: progress goes to the
`on_event` callback the caller passes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpuctl.clock import Clock, format_duration
from tpuctl.cloud import describe
from tpuctl.cloud.client import AlreadyExistsError, TpuApi
from tpuctl.cloud.queries import delete_command, locate, observe, status, status_command
from tpuctl.cloud.results import CreateResult, DeleteResult, ResetResult, StateSeen, WaitResult
from tpuctl.cloud.watcher import (
    GONE,
    QUEUE_STATES,
    Observation,
    Outcome,
    Watcher,
    WatchEvent,
    WatchPolicy,
    WatchResult,
)
from tpuctl.cloud.zones import ZoneError
from tpuctl.errors import (
    ApiUnavailableError,
    DeadlineError,
    ExitCode,
    Interrupted,
    NotFoundError,
    PreemptedError,
    QueuedResourceFailed,
    ResourceExhaustedError,
    TpuctlError,
)

EventCallback = Callable[[WatchEvent], None]
DEFAULT_DELETE_TIMEOUT = 600.0
DEFAULT_OPERATION_TIMEOUT = 120.0
# How long one poll of a wait retries before the wait counts the API as down (and says so);
# the wait itself then rides the outage out until its own deadlines.
POLL_RETRY_SECONDS = 5.0


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ----------------------------------------------------------------------------------- status


# ----------------------------------------------------------------------------------- create


def new_request_id() -> str:
    """The idempotency key of one create: every retry of that create sends the same one."""
    return str(uuid.uuid4())


def create(
    api: TpuApi,
    request: Any,
    *,
    delete_on_interrupt: bool = False,
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
) -> CreateResult:
    """Send a CreateQueuedResourceRequest (rendered by tpuctl.render.request, with its
    request_id), or accept an existing queued resource made from the same spec.

    A same-named one made from another spec is an error listing what differs (exit 1); a
    FAILED or SUSPENDED one is reported with the command that clears it (exit 6 / 7).
    """
    name = str(request.queued_resource_id)
    existing = api.find_queued_resource(name)
    if existing is not None:
        return _accept_existing(api, request, existing)
    try:
        operation = api.create_queued_resource(request)
        api.wait_operation(operation, timeout=operation_timeout, action="create", target=name)
        summary = status(api, name)
    except ApiUnavailableError as outage:
        # The request may have landed: say what to check, and how to clean up either way.
        raise ApiUnavailableError(
            f"{outage.message}; the create may or may not have landed",
            hint=f"check with: {status_command(api, name)}  then delete it "
            f"({delete_command(api, name)}) or run the same create again (it is idempotent)",
            name=name,
            status=outage.details.get("status"),
            delete_command=delete_command(api, name),
        ) from None
    except ResourceExhaustedError as refused:
        raise ResourceExhaustedError(
            f"{api.location.zone} refused the create of {name}: "
            f"{refused.message.split(': ', 1)[-1]}; nothing was created",
            hint=refused.hint,
            name=name,
            zone=api.location.zone,
            created=False,
            status=refused.details.get("status"),
        ) from None
    except AlreadyExistsError:
        # Lost a race, or a retried create whose first attempt got through: same check.
        existing = api.find_queued_resource(name)
        if existing is None:
            raise
        return _accept_existing(api, request, existing)
    except KeyboardInterrupt:
        raise interrupted(api, name, None, delete_on_interrupt, during="creating") from None
    return CreateResult("created", name, request.request_id or None, summary)


def create_and_wait(
    api: TpuApi,
    request: Any,
    options: WaitOptions,
    *,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> CreateResult:
    """`create`, then `wait`: Ctrl-C at any point (even between the two, before the first
    poll) reports what is left and the command that deletes it, or deletes it when asked."""
    name = str(request.queued_resource_id)
    created = create(api, request, delete_on_interrupt=options.delete_on_interrupt)
    try:
        created.wait = wait(api, name, options, on_event=on_event, clock=clock)
    except KeyboardInterrupt:
        last = None if options.delete_on_interrupt else observe(api, name)
        raise interrupted(
            api, name, last, options.delete_on_interrupt, during="waiting for"
        ) from None
    created.queued_resource = created.wait.queued_resource
    return created


def _accept_existing(api: TpuApi, request: Any, existing: Any) -> CreateResult:
    name = str(request.queued_resource_id)
    state = describe.state_name(existing)
    diffs = describe.differences(existing, request.queued_resource)
    if diffs:
        raise TpuctlError(
            f"{name} already exists and differs from the spec "
            f"({describe.format_differences(diffs)})",
            hint=f"pick another name, or delete it first: {delete_command(api, name)}",
            name=name,
            state=state,
            differences=diffs,
        )
    clear = delete_command(api, name, force=False)
    if state == "FAILED":
        failure = describe.failure_of(existing) or {}
        raise QueuedResourceFailed(
            f"{name} exists from this spec but is FAILED ({failure.get('message')}); "
            "it keeps its name until deleted",
            hint=f"clear it with: {clear}",
            name=name,
            state=state,
        )
    if state in ("SUSPENDED", "SUSPENDING"):
        raise PreemptedError(
            f"{name} exists from this spec but is {state} "
            f"(initiator {describe.enum_name(existing.state.state_initiator) or 'unknown'}); "
            "a suspended queued resource is never re-allocated and holds its name and quota",
            hint=f"clear it with: {clear}",
            name=name,
            state=state,
        )
    if state == "DELETING":
        raise TpuctlError(
            f"{name} is being deleted", hint="wait until it is gone, then create again", name=name
        )
    return CreateResult("exists", name, None, status(api, name))


# ------------------------------------------------------------------------------------- wait


@dataclass
class WaitOptions:
    policy: WatchPolicy = field(default_factory=WatchPolicy)
    keep_on_timeout: bool = False
    delete_on_interrupt: bool = False
    delete_timeout: float = DEFAULT_DELETE_TIMEOUT


def wait(
    api: TpuApi,
    name: str,
    options: WaitOptions,
    *,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> WaitResult:
    """Wait for `options.policy.until`; on a deadline delete what it gave up on (unless kept).

    Returns the wait object of docs/output.md. Raises DeadlineError (4), QueuedResourceFailed
    (6), PreemptedError (7), NotFoundError (5) or Interrupted (130), each with name and state.
    """
    polling = api.with_retry(min(api.retry_total, POLL_RETRY_SECONDS))
    watcher = Watcher(
        lambda: observe(polling, name), options.policy, clock=clock, on_event=on_event
    )
    try:
        result = watcher.run()
    except KeyboardInterrupt:
        raise interrupted(
            api, name, watcher.last, options.delete_on_interrupt, during="waiting for"
        ) from None
    if result.outcome is Outcome.REACHED:
        return wait_summary(api, name, options.policy.until, result)
    raise wait_failure(api, name, options, result, on_event=on_event, clock=clock)


def wait_summary(api: TpuApi, name: str, target: str, result: WatchResult) -> WaitResult:
    """The Wait document of a wait that reached `target`."""
    return WaitResult(
        name=name,
        target=target,
        outcome=result.outcome.value,
        state=result.state,
        elapsed_seconds=round(result.elapsed, 1),
        polls=result.polls,
        transitions=[StateSeen(t.state, t.at) for t in result.transitions],
        warnings=list(result.warnings),
        queued_resource=None if result.state == GONE else status(api, name),
    )


def wait_failure(
    api: TpuApi,
    name: str,
    options: WaitOptions,
    result: WatchResult,
    *,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> TpuctlError:
    """The error of a wait that ended with `result` short of its target; at a deadline the
    queued resource is deleted first (unless kept), so it can never be filled later."""
    observation = result.observation
    state = result.state
    facts: dict[str, Any] = {"name": name, "state": state, "elapsed_seconds": round(result.elapsed)}
    if result.outcome is Outcome.FAILED:
        return QueuedResourceFailed(
            f"{name} FAILED: {observation.failure or 'no reason given by the service'}",
            hint="it keeps its name (and may hold quota) until deleted: "
            + delete_command(api, name),
            reason=observation.failure,
            **facts,
        )
    if result.outcome is Outcome.SUSPENDED:
        initiator = observation.initiator or "unknown"
        cause = "preempted by the service" if initiator == "SERVICE" else f"by {initiator}"
        return PreemptedError(
            f"{name} is {state} ({cause}); a suspended queued resource is never re-allocated",
            hint=f"delete it and create it again: {delete_command(api, name, force=False)}",
            initiator=observation.initiator,
            **facts,
        )
    if result.outcome is Outcome.GONE:
        if len(result.transitions) == 1:
            return NotFoundError(
                f"queued resource {name} not found in {api.location.parent}", **facts
            )
        return NotFoundError(f"{name} was deleted while waiting for it", **facts)
    # A deadline: give up, and unless told to keep it, cancel what was given up on so it can
    # never be filled later and boot orphan workers.
    phase = "queueing" if state in QUEUE_STATES else "provisioning"
    limit = (
        options.policy.queue_timeout
        if result.outcome is Outcome.QUEUE_DEADLINE
        else options.policy.provision_timeout
        if result.outcome is Outcome.PROVISION_DEADLINE
        else options.policy.overall_timeout
    )
    what = f"{name} still {state} after the {phase} deadline ({format_duration(limit)})"
    if options.keep_on_timeout:
        return DeadlineError(
            f"{what}; kept it (--keep-on-timeout)",
            hint=f"delete it when done: {delete_command(api, name)}",
            phase=phase,
            deleted=False,
            **facts,
        )
    if result.api_unavailable:
        what += f", the TPU API unavailable ({result.api_unavailable})"
    try:
        deleted = delete(
            api,
            name,
            force=True,
            wait_until_gone=True,
            timeout=options.delete_timeout,
            on_event=on_event,
            clock=clock,
        )
    except ApiUnavailableError as outage:
        # Tried for the API's whole retry budget: say what is left, and how to remove it.
        command = delete_command(api, name)
        return DeadlineError(
            f"{what}; could not delete it: the TPU API stayed unavailable "
            f"({outage.details.get('status') or 'unavailable'}), so it may still exist and "
            "be filled later",
            hint=f"delete it with: {command}",
            phase=phase,
            deleted=False,
            api_unavailable=True,
            delete_command=command,
            **facts,
        )
    gone = deleted.action == "deleted"
    return DeadlineError(
        f"{what}; deleted it" if gone else f"{what}; deletion requested",
        hint=None if gone else f"check it is gone: {status_command(api, name)}",
        phase=phase,
        deleted=True,
        **facts,
    )


def interrupted(
    api: TpuApi, name: str, last: Observation | None, delete_it: bool, *, during: str
) -> Interrupted:
    """Ctrl-C: ask nothing; say what is left and the exact command, or delete it when asked."""
    state = last.state if last is not None else "unknown (the create may or may not have landed)"
    if delete_it:
        try:
            api.delete_queued_resource(name, force=True)
        except NotFoundError:
            return Interrupted(
                f"interrupted while {during} {name}; it does not exist, nothing to delete",
                name=name,
                state=state,
                deleted=False,
            )
        except ApiUnavailableError:
            command = delete_command(api, name)
            return Interrupted(
                f"interrupted while {during} {name} (state {state}); could not delete it: "
                "the TPU API is unavailable",
                hint=f"delete it with: {command}",
                name=name,
                state=state,
                deleted=False,
                delete_command=command,
            )
        return Interrupted(
            f"interrupted while {during} {name} (state {state}); deletion requested "
            "(--delete-on-interrupt)",
            hint=f"check it is gone: {status_command(api, name)}",
            name=name,
            state=state,
            deleted=True,
        )
    command = delete_command(api, name)
    return Interrupted(
        f"interrupted while {during} {name} (state {state}); it was left in place",
        hint=f"delete it with: {command}",
        name=name,
        state=state,
        deleted=False,
        delete_command=command,
    )


# ----------------------------------------------------------------------------------- delete


def delete(
    api: TpuApi,
    name: str,
    *,
    force: bool = False,
    wait_until_gone: bool = True,
    ignore_missing: bool = False,
    timeout: float = DEFAULT_DELETE_TIMEOUT,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> DeleteResult:
    """Delete; unless `wait_until_gone` is False, poll Get until NOT_FOUND (bounded)."""
    existing = api.find_queued_resource(name)
    if existing is None:
        if ignore_missing:
            return DeleteResult(name, "missing", force, None)
        raise NotFoundError(
            f"queued resource {name} not found in {api.location.parent}",
            hint="pass --ignore-missing to treat that as success",
            name=name,
        )
    state = describe.state_name(existing)
    if state != "DELETING":
        try:
            api.delete_queued_resource(name, force=force, request_id=str(uuid.uuid4()))
        except NotFoundError:
            if ignore_missing:
                return DeleteResult(name, "missing", force, state)
            raise
        except TpuctlError as error:
            if error.details.get("status") == "FAILED_PRECONDITION" and not force:
                raise TpuctlError(
                    f"cannot delete {name} without --force: it is {state} and still has nodes "
                    f"(the service said: {error.message.split('refused: ', 1)[-1]})",
                    hint=f"delete its nodes with it: {delete_command(api, name)}",
                    name=name,
                    state=state,
                ) from None
            raise
    if not wait_until_gone:
        return DeleteResult(name, "delete_requested", force, state, [api.location.zone])
    return wait_deleted(
        api, name, force=force, state=state, timeout=timeout, on_event=on_event, clock=clock
    )


def delete_in_zones(
    api: TpuApi,
    name: str,
    zones: Sequence[str],
    *,
    force: bool = False,
    wait_until_gone: bool = True,
    ignore_missing: bool = False,
    timeout: float = DEFAULT_DELETE_TIMEOUT,
    on_event: EventCallback | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> DeleteResult:
    """Delete `name` in every zone of `zones` holding it (a spec with several zones: its run
    may have landed in any of them, and a move or a race may have left it in two). Every
    request is sent before any is waited for. Never a success while a zone still holds it or
    could not be asked: that is an error naming what was deleted and what is left."""
    say = on_progress or (lambda _message: None)
    located = locate(api, name, zones)
    if not located.holding:
        if ignore_missing and not located.errors:
            return DeleteResult(name, "missing", force, None)
        raise located.unanswered()
    sent: dict[str, DeleteResult] = {}
    failed: dict[str, TpuctlError] = {}
    for zone in located.holding:
        try:
            sent[zone] = delete(
                api.in_zone(zone), name, force=force, wait_until_gone=False, ignore_missing=True
            )
        except TpuctlError as error:
            failed[zone] = error
    done: list[str] = []
    for zone, result in sent.items():
        if result.action == "missing" or not wait_until_gone:
            done.append(zone)
            continue
        try:
            wait_deleted(
                api.in_zone(zone),
                name,
                force=force,
                state=result.state,
                timeout=timeout,
                on_event=on_event,
            )
        except TpuctlError as error:
            failed[zone] = error
            continue
        done.append(zone)
        say(f"deleted {name} in {zone}")
    if failed or located.errors:
        raise _left_in_zones(api, name, done, failed, located.errors)
    first = next(iter(located.holding))
    action: Any = "deleted" if wait_until_gone else "delete_requested"
    return DeleteResult(name, action, force, located.state_in(first), done)


def _left_in_zones(
    api: TpuApi,
    name: str,
    done: Sequence[str],
    failed: Mapping[str, TpuctlError],
    unasked: Sequence[ZoneError],
) -> TpuctlError:
    """The error of a delete across zones that did not clear every zone."""
    parts = [f"deleted in {', '.join(done)}"] if done else []
    parts += [f"not deleted in {zone}: {error.message}" for zone, error in failed.items()]
    parts += [f"{error.zone} could not be asked: {error.message}" for error in unasked]
    commands = [delete_command(api.in_zone(zone), name) for zone in failed]
    commands += [delete_command(api.in_zone(error.zone), name) for error in unasked]
    error = TpuctlError(
        f"{name} may still exist: {'; '.join(parts)}",
        hint="delete what is left with: " + "  and  ".join(commands),
        name=name,
        deleted_in=list(done),
        left_in=[*failed, *(error.zone for error in unasked)],
    )
    codes = [int(e.exit_code) for e in failed.values()] + [e.exit_code for e in unasked]
    error.exit_code = ExitCode(max(codes))
    return error


def wait_deleted(
    api: TpuApi,
    name: str,
    *,
    force: bool,
    state: str | None,
    timeout: float = DEFAULT_DELETE_TIMEOUT,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> DeleteResult:
    """After a delete request: poll Get until NOT_FOUND (bounded). `state` is the state it was
    in before the request, for the result."""
    policy = WatchPolicy(until=GONE, overall_timeout=timeout)
    watcher = Watcher(lambda: observe(api, name), policy, clock=clock, on_event=on_event)
    result = watcher.run()
    if result.outcome is Outcome.REACHED:
        return DeleteResult(name, "deleted", force, state, [api.location.zone])
    if result.outcome is Outcome.DEADLINE:
        raise DeadlineError(
            f"{name} still {result.state} {format_duration(timeout)} after the delete request",
            hint=f"check later: {status_command(api, name)}",
            name=name,
            state=result.state,
        )
    # FAILED / SUSPENDED while deleting: the delete did not take; say so.
    raise TpuctlError(
        f"{name} went {result.state} instead of away after the delete request",
        hint=f"try again: {delete_command(api, name)}",
        name=name,
        state=result.state,
    )


# ------------------------------------------------------------------------------------ reset


def reset(
    api: TpuApi,
    name: str,
    *,
    wait_for_active: bool = False,
    timeout: float = DEFAULT_DELETE_TIMEOUT,
    on_event: EventCallback | None = None,
    clock: Clock | None = None,
) -> ResetResult:
    """Reset every VM of an ACTIVE queued resource; with `wait_for_active`, wait it out."""
    queued_resource = api.get_queued_resource(name)
    state = describe.state_name(queued_resource)
    if state != "ACTIVE":
        raise TpuctlError(
            f"cannot reset {name}: it is {state}, and only an ACTIVE queued resource can be reset",
            hint=f"see {status_command(api, name)}",
            name=name,
            state=state,
        )
    operation = api.reset_queued_resource(name)
    operation_name = getattr(getattr(operation, "operation", None), "name", None)
    if not wait_for_active:
        return ResetResult(name, "reset_requested", operation_name, None)
    done = api.wait_operation(operation, timeout=timeout, action="reset", target=name)
    if not done:
        raise DeadlineError(
            f"the reset of {name} did not finish within {format_duration(timeout)}",
            hint=f"see {status_command(api, name)}",
            name=name,
        )
    # keep_on_timeout: a slow reset is no reason to delete a running queued resource.
    options = WaitOptions(
        policy=WatchPolicy(until="ACTIVE", overall_timeout=timeout), keep_on_timeout=True
    )
    waited = wait(api, name, options, on_event=on_event, clock=clock)
    return ResetResult(name, "reset", operation_name, waited.state)
