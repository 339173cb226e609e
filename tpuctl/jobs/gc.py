"""`tpuctl gc`: find tpuctl's queued resources that nothing will use again (SUSPENDED, FAILED,
ACTIVE with a done job or none), in one zone or several, and delete them.

`survey` decides, reading each ACTIVE one's job over SSH the way `status --jobs` does;
`collect` deletes what it chose, every delete sent before waiting for any to finish. The
verdicts themselves are pure functions (`verdict`, `job_verdict`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from tpuctl import worker as contract
from tpuctl.clock import format_duration, utc_now
from tpuctl.cloud import describe, lifecycle
from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.queries import queued_resources_in_zones
from tpuctl.cloud.zones import ZoneError, zones_error, zones_exit_code
from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.fanout.known_hosts import default_path
from tpuctl.fanout.operations import SshSettings
from tpuctl.jobs.control import WorkerJobStatus, job_status_for_run
from tpuctl.jobs.fleet import prepare_fleet

Verdict = Literal["delete", "keep"]
Progress = Callable[[str], None]
# States that end only when the QR is deleted: nothing will ever run on it again.
DEAD_STATES = frozenset({"FAILED", "SUSPENDED"})
_WHY_KEPT = {
    "CREATING": "being created",
    "ACCEPTED": "queueing",
    "WAITING_FOR_RESOURCES": "queueing for capacity",
    "PROVISIONING": "being provisioned",
    "SUSPENDING": "being suspended; SUSPENDED next",
    "DELETING": "already being deleted",
}


@dataclass
class Collectable:
    """One of tpuctl's queued resources and what gc decided about it (and did).

    `job` is the run name from its `tpuctl-run` label (None: its spec has no job); `job_state`
    the workers' job states when they were read (one state, or the distinct ones joined by
    commas), else None. `deleted` is True once it is gone; `error` says why a delete failed.
    """

    name: str
    zone: str
    state: str
    create_time: datetime | None
    age_seconds: float | None
    job: str | None
    job_state: str | None
    verdict: Verdict
    reason: str
    deleted: bool = False
    error: str | None = None
    exit_codes: list[int] | None = None  # the job's distinct exit codes, when it exited


@dataclass(frozen=True)
class Counts:
    queued_resources: int
    delete: int
    keep: int
    deleted: int
    failed: int


@dataclass
class GarbageCollection(Result):
    """What `tpuctl gc` found, decided and deleted (docs/output.md, kind GarbageCollection).

    Exits 1 when a delete failed, else with the code of a zone that could not be listed."""

    KIND: ClassVar[str] = "GarbageCollection"
    project: str
    zones: list[str]
    dry_run: bool
    older_than_seconds: float | None
    queued_resources: list[Collectable] = field(default_factory=list)
    zone_errors: list[ZoneError] = field(default_factory=list)
    summary: Counts | None = None
    # tpuctl's known-hosts file, and the pins in it of the nodes deleted (with --dry-run, of
    # the nodes that would be): forgotten once their node is gone.
    known_hosts: str | None = None
    pins: list[str] = field(default_factory=list)
    # The numeric ids of each doomed queued resource's nodes, by (zone, name): table only.
    node_uids: dict[tuple[str, str], list[int]] = field(
        default_factory=dict, metadata={"json": False}
    )

    def __post_init__(self) -> None:
        self.count()

    def count(self) -> None:
        rows = self.queued_resources
        self.summary = Counts(
            queued_resources=len(rows),
            delete=sum(row.verdict == "delete" for row in rows),
            keep=sum(row.verdict == "keep" for row in rows),
            deleted=sum(row.deleted for row in rows),
            failed=len(self.failed),
        )

    @property
    def doomed(self) -> list[Collectable]:
        return [row for row in self.queued_resources if row.verdict == "delete"]

    @property
    def failed(self) -> list[Collectable]:
        return [row for row in self.queued_resources if row.error is not None]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.ERROR if self.failed else zones_exit_code(self.zone_errors)

    def exit_error(self) -> TpuctlError | None:
        if self.failed:
            names = ", ".join(f"{row.name} ({row.zone}): {row.error}" for row in self.failed)
            return TpuctlError(f"{len(self.failed)} delete(s) failed: {names}")
        return zones_error(self.zone_errors, len(self.zones))


# ------------------------------------------------------------------------------- verdicts


def verdict(
    state: str,
    *,
    age_seconds: float | None,
    older_than: float | None,
    failure: str | None = None,
    initiator: str | None = None,
    has_job: bool = True,
) -> tuple[Verdict, str] | None:
    """What the state (and age) alone decide; None when an ACTIVE one's job must be read."""
    if older_than is not None:
        if age_seconds is None:
            return "keep", "its create time is unknown, so it may be younger than --older-than"
        if age_seconds < older_than:
            return "keep", (
                f"created {format_duration(age_seconds)} ago, younger than --older-than "
                f"{format_duration(older_than)}"
            )
    if state == "FAILED":
        return "delete", f"FAILED: {failure or 'no reason given by the service'}"
    if state == "SUSPENDED":
        cause = "preempted by the service" if initiator == "SERVICE" else f"by {initiator or '?'}"
        return "delete", f"SUSPENDED ({cause}); a suspended queued resource never runs again"
    if state == "ACTIVE":
        return None if has_job else ("delete", "ACTIVE with no job (its spec has none)")
    return "keep", f"{state}: {_WHY_KEPT.get(state, 'not a state gc collects')}"


def job_verdict(
    statuses: Sequence[WorkerJobStatus], *, include_exited: bool = False
) -> tuple[Verdict, str, str]:
    """An ACTIVE queued resource's verdict from its workers' job states, the reason, and the
    states in one word (or several joined by commas). A job that ended on every worker
    without being done (crashed, or finished without its marker) is kept unless
    `include_exited`; either way its row says so, with the exit codes."""
    states = Counter(status.state for status in statuses)
    summary = ",".join(sorted(states))
    total = len(statuses)
    unreachable = [status for status in statuses if not status.reachable]
    if unreachable:
        first = unreachable[0]
        return (
            "keep",
            (
                f"{len(unreachable)} of {total} workers unreachable ({first.label}: "
                f"{first.error or 'no answer'}), so its job is unknown"
            ),
            summary,
        )
    unreadable = [status for status in statuses if status.state == contract.UNREADABLE]
    if unreadable:
        first = unreadable[0]
        return (
            "keep",
            (
                f"the job status of {len(unreadable)} of {total} workers could not be read "
                f"({first.label}: {first.error or 'no answer'})"
            ),
            summary,
        )
    if set(states) == {"done"}:
        return "delete", f"ACTIVE, its job is done on every worker ({total})", summary
    if set(states) == {contract.NO_STATUS}:
        return "delete", f"ACTIVE, its job never started on any worker ({total})", summary
    if set(states) <= contract.ENDED_STATES | {"done"} and set(states) & contract.ENDED_STATES:
        exited = f"ACTIVE, its job exited on every worker without being done ({_endings(statuses)})"
        if include_exited:
            return (
                "delete",
                f"{exited}; --include-exited: deleting it stops the bill; its checkpoints "
                "stay, so tpuctl up SPEC resumes from them",
                summary,
            )
        return (
            "keep",
            f"{exited}: crashed, or finished without its done marker, and nothing runs on it "
            "again unless restarted; --include-exited would delete it",
            summary,
        )
    parts = ", ".join(f"{state} on {count}" for state, count in sorted(states.items()))
    return "keep", f"its job is not done: {parts} of {total} workers", summary


NAMED_WORKERS = 8  # an ending names this many workers, then counts the rest


def _endings(statuses: Sequence[WorkerJobStatus]) -> str:
    """How the job ended on each worker, grouped: `exit 1 on 0/0, 0/1; done on 1/0`."""
    groups: dict[str, list[str]] = {}
    for status in statuses:
        code = f"exit {status.exit_code}" if status.exit_code is not None else None
        if status.state == "setup-failed":
            ending = f"setup failed ({code})" if code else "setup failed"
        elif status.state == "exited":
            ending = code or "exited"
        else:
            ending = status.state
        groups.setdefault(ending, []).append(status.label)
    parts = []
    for ending, labels in groups.items():
        named = ", ".join(labels[:NAMED_WORKERS])
        rest = len(labels) - NAMED_WORKERS
        parts.append(f"{ending} on {named}" + (f" and {rest} more" if rest > 0 else ""))
    return "; ".join(parts)


def exit_codes(statuses: Sequence[WorkerJobStatus]) -> list[int] | None:
    """The distinct exit codes of the workers whose job exited, or None when none did."""
    codes = sorted({s.exit_code for s in statuses if s.exit_code is not None})
    return codes or None


# --------------------------------------------------------------------------------- survey


@dataclass(frozen=True)
class GcOptions:
    """`older_than`: only queued resources created at least this many seconds ago;
    `include_exited`: also an ACTIVE one whose job exited on every worker without being done
    (unless a live `tpuctl up` babysits it)."""

    older_than: float | None = None
    dry_run: bool = False
    ssh: SshSettings = field(default_factory=SshSettings)
    include_exited: bool = False  # also a job that exited everywhere without being done


def survey(
    api: TpuApi,
    zones: Sequence[str],
    options: GcOptions,
    *,
    now: datetime | None = None,
    on_progress: Progress | None = None,
) -> GarbageCollection:
    """tpuctl's queued resources in `zones` (listed side by side), each with its verdict.

    Deletes nothing. A zone that cannot be listed, when there are several, is in
    `zone_errors`; an ACTIVE one whose job cannot be read is kept, saying why."""
    moment = now or utc_now()
    listed = queued_resources_in_zones(api, zones)
    rows: list[Collectable] = []
    doomed_nodes: dict[tuple[str, str], list[str]] = {}
    for zone, queued_resources in listed.answers.items():
        for queued_resource in queued_resources:
            row = _decide(
                api.in_zone(zone), queued_resource, options, now=moment, on_progress=on_progress
            )
            rows.append(row)
            if row.verdict == "delete":
                node_ids = list(describe.template_of(queued_resource).node_ids)
                doomed_nodes[(row.zone, row.name)] = node_ids
    rows.sort(key=lambda row: (row.name, row.zone))
    result = GarbageCollection(
        project=api.location.project,
        zones=list(zones),
        dry_run=options.dry_run,
        older_than_seconds=options.older_than,
        queued_resources=rows,
        zone_errors=listed.errors,
        known_hosts=str(options.ssh.known_hosts or default_path()),
        node_uids=_node_uids(api, doomed_nodes),
    )
    result.pins = _pins_of(result, [row for row in rows if row.verdict == "delete"])
    return result


def _node_uids(
    api: TpuApi, doomed: dict[tuple[str, str], list[str]]
) -> dict[tuple[str, str], list[int]]:
    """The numeric ids of each doomed queued resource's nodes (one ListNodes per zone; a
    zone that cannot be listed gives none: their pins are then kept)."""
    found: dict[tuple[str, str], list[int]] = {}
    for zone in dict.fromkeys(zone for zone, _name in doomed):
        try:
            nodes = api.in_zone(zone).list_nodes()
        except TpuctlError:
            continue
        ids = {describe.short_name(node.name): int(getattr(node, "id", 0) or 0) for node in nodes}
        for (where, name), node_ids in doomed.items():
            if where == zone:
                found[(where, name)] = [ids[node] for node in node_ids if ids.get(node)]
    return found


def _pins_of(result: GarbageCollection, rows: Sequence[Collectable]) -> list[str]:
    """The pins in the known-hosts file of `rows`' nodes (none when it cannot be read)."""
    from tpuctl.jobs.host_pins import pins_of

    uids = [uid for row in rows for uid in result.node_uids.get((row.zone, row.name), [])]
    if not uids or result.known_hosts is None:
        return []
    try:
        return pins_of(Path(result.known_hosts), uids)
    except (TpuctlError, OSError):
        return []


def _decide(
    api: TpuApi,
    queued_resource: Any,
    options: GcOptions,
    *,
    now: datetime,
    on_progress: Progress | None,
) -> Collectable:
    state = describe.state_name(queued_resource)
    created = describe.timestamp(queued_resource.create_time)
    age = round(max(0.0, (now - created).total_seconds()), 1) if created else None
    run = describe.template_of(queued_resource).labels.get(contract.RUN_LABEL) or None
    failure = describe.failure_of(queued_resource)
    row = Collectable(
        name=describe.short_name(queued_resource.name),
        zone=api.location.zone,
        state=state,
        create_time=created,
        age_seconds=age,
        job=run,
        job_state=None,
        verdict="keep",
        reason="",
    )
    decided = verdict(
        state,
        age_seconds=age,
        older_than=options.older_than,
        failure=failure.get("message") if failure else None,
        initiator=describe.enum_name(queued_resource.state.state_initiator),
        has_job=run is not None,
    )
    if decided is not None:
        row.verdict, row.reason = decided
        return row
    assert run is not None
    try:
        run_name = contract.check_run_name(run)
        fleet = prepare_fleet(api, row.name, options.ssh, on_progress=on_progress)
        statuses = job_status_for_run(fleet, run_name)
    except (TpuctlError, ValueError) as error:
        why = error.one_line() if isinstance(error, TpuctlError) else str(error)
        row.reason = f"its job could not be read: {why}"
        return row
    row.verdict, row.reason, row.job_state = job_verdict(
        statuses, include_exited=options.include_exited
    )
    row.exit_codes = exit_codes(statuses)
    if row.verdict == "delete" and set(contract.ENDED_STATES) & {s.state for s in statuses}:
        babysitter = _babysitter(api, row.name)
        if babysitter is not None:
            row.verdict = "keep"
            row.reason = (
                f"its job exited on every worker ({_endings(statuses)}), and a tpuctl up "
                f"babysits it ({babysitter}): that up restarts or ends it"
            )
    return row


def _babysitter(api: TpuApi, name: str) -> str | None:
    """Who babysits the run on queued resource `name`: a `tpuctl up` whose lease beside the
    run's checkpoints is fresh, described; None when none does (or it cannot be told)."""
    from tpuctl.jobs.report import spec_of_queued_resource
    from tpuctl.storage.lease import STALE_AFTER, Holder, path_of
    from tpuctl.worker import lease_location

    try:
        url = lease_location(spec_of_queued_resource(api, name))
        if url is None:
            return None
        storage, path = path_of(url)
        found = storage.read_versioned(path)
    except (TpuctlError, OSError, ValueError):
        return None
    if found is None:
        return None
    holder, now = Holder.parse(found[0]), utc_now()
    if holder.heartbeat is None or (now - holder.heartbeat).total_seconds() > STALE_AFTER:
        return None  # a holder that died: nothing babysits it
    return holder.describe(now)


# -------------------------------------------------------------------------------- collect


def collect(
    api: TpuApi,
    result: GarbageCollection,
    *,
    timeout: float = lifecycle.DEFAULT_DELETE_TIMEOUT,
    on_progress: Progress | None = None,
) -> GarbageCollection:
    """Delete (with their nodes) every queued resource `result` chose: every request is sent
    first, then each is waited for until gone (`timeout` each), so they go side by side. A
    delete that fails is recorded on its row; the others go on."""
    say = on_progress or (lambda _message: None)
    sent: list[Collectable] = []
    for row in result.doomed:
        say(f"deleting {row.name} ({row.zone}, {row.state})")
        try:
            zone_api = api.in_zone(row.zone)
            lifecycle.delete(
                zone_api, row.name, force=True, wait_until_gone=False, ignore_missing=True
            )
        except TpuctlError as error:
            row.error = error.one_line()
            continue
        sent.append(row)
    for row in sent:
        try:
            lifecycle.wait_deleted(
                api.in_zone(row.zone), row.name, force=True, state=row.state, timeout=timeout
            )
        except TpuctlError as error:
            row.error = error.one_line()
            continue
        row.deleted = True
        say(f"deleted {row.name} ({row.zone})")
    result.count()
    result.pins = _forget_pins(result, say)
    return result


def _forget_pins(result: GarbageCollection, say: Progress) -> list[str]:
    """Forget the host-key pins of the nodes deleted; a file that cannot be rewritten is
    said, never an error of gc's."""
    from tpuctl.jobs.host_pins import forget

    pins = _pins_of(result, [row for row in result.queued_resources if row.deleted])
    if not pins or result.known_hosts is None:
        return []
    try:
        return forget(Path(result.known_hosts), pins)
    except (TpuctlError, OSError) as error:
        why = error.one_line() if isinstance(error, TpuctlError) else str(error)
        say(f"could not prune the host-key pins of the deleted nodes: {why}")
        return []
