"""A job's timeline and infrastructure goodput, computed from its journal entries (pure).

Definitions (after Google's ml-goodput-measurement, for the part tpuctl can see without any
change to the training code):

* total job time: from the first Journal entry (the run's start) to its end: the done marker
  for a run that is done (the deletion after it is not the job's time), the give-up or the
  stop (`run.gave_up`, `run.stopped`), or now while the run goes on;
* queueing: the QR waiting for capacity (CREATING, ACCEPTED, WAITING_FOR_RESOURCES), and the
  time before it existed;
* provisioning: PROVISIONING, and an ACTIVE QR whose job is not running yet (boot, code
  delivery, setup, startup); a job that ended before tpuctl first saw it running (a short
  run that failed, or finished) was running from its start, setup included;
* disruption recovery: from the moment a disruption is detected (preemption, job failure, a
  drill's event) until the job runs again, whatever the QR does meanwhile;
* between runs: a flex-start run that reached its maximum run duration (`run.ended`) until
  the job runs again in the next run: counted apart from preemptions and failures, and each
  run's share of the total time is given (`flex_runs`);
* wasted progress: steps computed twice after a disruption or a run's end (the step reached
  at the event minus the step the job resumed from) × the mean step time, when both are
  known; it is taken out of the running time;
* productive time = running time − wasted progress; goodput = productive time / total time.

Each part of the timeline says the zones it happened in (the `zone` of its entries): one zone,
or while a first-active race runs, every zone queued in. Entries about a race's other zones
(`racing`) move neither the zone nor, but for their states, the queued resource's phase.

Program start-up inside the job, data loading and checkpoint saves count as productive here:
only the training code can measure those. A run that gave up kept its workers' last log lines
(`job.logs`): the report carries them (`logs`), since the workers are gone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, ClassVar, Protocol

from tpuctl.cloud.watcher import GONE, QUEUE_STATES
from tpuctl.envelope import Result

BUCKETS = ("queueing", "provisioning", "disruption_recovery", "between_runs", "wasted_progress")
PHASES = ("queueing", "provisioning", "running", "disruption_recovery", "between_runs")
# How an attempt of the run ended, and the status it gives the report.
_FINISHES = {"run.done": "done", "run.gave_up": "given_up", "run.stopped": "stopped"}
_DISRUPTION_STARTS = {
    "preemption.detected": "preemption",
    "job.failed": "job failure",
    "drill.triggered": "drill",
}
_RUNNING_AGAIN = frozenset({"job.running", "job.relaunched", "drill.recovered"})
# A start of the job (delivery, or a restart after a failure), and the ends that prove it ran:
# a job that ends before tpuctl's first look sees it running has no `job.running` of its own.
_STARTS = frozenset({"job.started", "job.restarted"})
_RAN_AND_ENDED = frozenset({"job.failed", "job.done", "job.disrupted"})


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class EntryLike(Protocol):
    """A Journal entry (tpuctl.storage.journal.JournalEntry)."""

    @property
    def timestamp(self) -> datetime: ...

    @property
    def kind(self) -> str: ...

    @property
    def fields(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Phase:
    phase: str  # queueing | provisioning | running | disruption_recovery
    start: datetime
    end: datetime
    zones: tuple[str, ...] = ()  # where it happened (several while zones race); () unknown
    rung: str | None = None  # the capacity ladder's rung it happened on; None: no ladder

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "start": self.start,
            "end": self.end,
            "seconds": round(self.seconds, 3),
            "zones": list(self.zones),
            "rung": self.rung,
        }


@dataclass
class Disruption:
    kind: str
    detected_at: datetime
    running_again_at: datetime | None = None
    recomputed_steps: int | None = None
    recomputed_exact: bool = False
    wasted_seconds: float | None = None
    detail: str = ""

    @property
    def recovery_seconds(self) -> float | None:
        if self.running_again_at is None:
            return None
        return (self.running_again_at - self.detected_at).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        recovery = self.recovery_seconds
        return {
            "kind": self.kind,
            "detected_at": self.detected_at,
            "running_again_at": self.running_again_at,
            "recovery_seconds": None if recovery is None else round(recovery, 3),
            "recomputed_steps": self.recomputed_steps,
            "recomputed_exact": self.recomputed_exact,
            "wasted_seconds": _round(self.wasted_seconds),
            "detail": self.detail,
        }


@dataclass
class FlexRun:
    """One flex-start run of the job (the time between two run ends): its share of the total
    time, how much of it ran, and what its end cost (the gap until the job ran again, the
    steps computed twice)."""

    run: int
    start: datetime
    end: datetime
    running_seconds: float = 0.0
    ended: bool = False  # taken back at its maximum run duration (else: the current or last)
    termination_time: str | None = None
    running_again_at: datetime | None = None
    recomputed_steps: int | None = None
    wasted_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    def to_dict(self, total: float) -> dict[str, Any]:
        gap = (
            None
            if self.running_again_at is None or not self.ended
            else round((self.running_again_at - self.end).total_seconds(), 3)
        )
        return {
            "run": self.run,
            "start": self.start,
            "end": self.end,
            "seconds": round(self.seconds, 3),
            "share": round(self.seconds / total, 4) if total > 0 else None,
            "running_seconds": round(self.running_seconds, 3),
            "ended": self.ended,
            "termination_time": self.termination_time,
            "running_again_at": self.running_again_at if self.ended else None,
            "gap_seconds": gap,
            "recomputed_steps": self.recomputed_steps,
            "wasted_seconds": _round(self.wasted_seconds),
        }


@dataclass
class KeptLogs:
    """The workers' last log lines a give-up kept (`job.logs`): a few workers' tails in the
    journal, and where every worker's whole tail went."""

    at: datetime
    where: str | None
    tails: dict[str, str]
    reasons: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "where": self.where, "tails": self.tails, "reasons": self.reasons}


@dataclass
class JobReport(Result):
    """The timeline and goodput of one run (docs/output.md, kind Report)."""

    KIND: ClassVar[str] = "Report"
    name: str
    run: str
    # done | given_up | stopped | running | interrupted | failed (a journal from before runs
    # recorded how they ended) | unknown
    status: str
    started_at: datetime
    ended_at: datetime
    total_seconds: float
    running_seconds: float
    productive_seconds: float
    goodput: float | None
    badput: dict[str, float]
    disruptions: list[Disruption] = field(default_factory=list)
    timeline: list[Phase] = field(default_factory=list)
    step_seconds: float | None = None
    latest_step: int | None = None
    entries: int = 0
    notes: list[str] = field(default_factory=list)
    flex_runs: list[FlexRun] = field(default_factory=list)
    logs: KeptLogs | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "run": self.run,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "total_seconds": round(self.total_seconds, 3),
            "running_seconds": round(self.running_seconds, 3),
            "productive_seconds": round(self.productive_seconds, 3),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "badput": {key: round(value, 3) for key, value in self.badput.items()},
            "badput_fraction": {
                key: (round(value / self.total_seconds, 4) if self.total_seconds > 0 else None)
                for key, value in self.badput.items()
            },
            "disruptions": [d.to_dict() for d in self.disruptions],
            "timeline": [p.to_dict() for p in self.timeline],
            "step_seconds": None if self.step_seconds is None else round(self.step_seconds, 4),
            "latest_step": self.latest_step,
            "entries": self.entries,
            "notes": self.notes,
            "flex_runs": [run.to_dict(self.total_seconds) for run in self.flex_runs],
            "logs": None if self.logs is None else self.logs.to_dict(),
        }


@dataclass
class _State:
    qr: str | None = None
    running: bool = False
    disrupted: bool = False
    between: bool = False  # a flex-start run ended; the next has not run the job yet
    zones: tuple[str, ...] = ()
    rung: str | None = None

    def phase(self) -> str:
        if self.disrupted:
            return "disruption_recovery"
        if self.between:
            return "between_runs"
        if self.running:
            return "running"
        if self.qr is None or self.qr == GONE or self.qr in QUEUE_STATES:
            return "queueing"
        return "provisioning"


def build_report(
    entries: Sequence[EntryLike],
    *,
    name: str,
    run: str,
    now: datetime | None = None,
    latest_step: int | None = None,
    checkpoint_step_seconds: float | None = None,
    first_rung: str | None = None,
) -> JobReport:
    """The timeline and goodput of one run from its Journal entries (see the module doc);
    `first_rung` names a capacity ladder's first rung (later ones come from the journal)."""
    ordered = sorted(entries, key=lambda entry: entry.timestamp)
    now = now or datetime.now(timezone.utc)
    if not ordered:
        return JobReport(
            name=name,
            run=run,
            status="unknown",
            started_at=now,
            ended_at=now,
            total_seconds=0.0,
            running_seconds=0.0,
            productive_seconds=0.0,
            goodput=None,
            badput=dict.fromkeys(BUCKETS, 0.0),
            latest_step=latest_step,
            notes=["the Journal has no entries for this run"],
        )
    start = ordered[0].timestamp
    status, end = _status_and_end(ordered, now)
    unseen = _runs_never_seen(ordered)
    timeline = _timeline(ordered, start, end, unseen, first_rung)
    disruptions = _disruptions(ordered, end, unseen)
    flex_runs = _flex_runs(ordered, start, end, timeline)
    step_seconds = _step_seconds(ordered) or checkpoint_step_seconds
    notes: list[str] = []
    if unseen:
        notes.append(
            "the job ended before tpuctl saw it running (a short run): its running time "
            "counts from when it was started, its setup included"
        )
    recomputed: list[Disruption | FlexRun] = [*disruptions, *flex_runs]
    for item in recomputed:
        if item.recomputed_steps is not None and step_seconds is not None:
            item.wasted_seconds = item.recomputed_steps * step_seconds
    if step_seconds is None and any(item.recomputed_steps for item in recomputed):
        notes.append("mean step time unknown: wasted progress not counted")
    totals = dict.fromkeys(PHASES, 0.0)
    for phase in timeline:
        totals[phase.phase] += phase.seconds
    total = max(0.0, (end - start).total_seconds())
    running = totals["running"]
    wasted = min(running, sum(item.wasted_seconds or 0.0 for item in recomputed))
    productive = running - wasted
    badput = {
        "queueing": totals["queueing"],
        "provisioning": totals["provisioning"],
        "disruption_recovery": totals["disruption_recovery"],
        "between_runs": totals["between_runs"],
        "wasted_progress": wasted,
    }
    return JobReport(
        name=name,
        run=run,
        status=status,
        started_at=start,
        ended_at=end,
        total_seconds=total,
        running_seconds=running,
        productive_seconds=productive,
        goodput=(productive / total) if total > 0 else None,
        badput=badput,
        disruptions=disruptions,
        timeline=timeline,
        step_seconds=step_seconds,
        latest_step=latest_step,
        entries=len(ordered),
        notes=notes,
        flex_runs=flex_runs if any(run.ended for run in flex_runs) else [],
        logs=_kept_logs(ordered),
    )


def _status_and_end(ordered: Sequence[EntryLike], now: datetime) -> tuple[str, datetime]:
    """How the run's current attempt ended (`run.done`, `run.gave_up`, `run.stopped` after its
    last `run.start`), and when: a done run at its done marker (`job.done`) when there is one.
    A journal from before runs recorded their end goes by `job.done` and `up.exit`."""
    starts = [index for index, entry in enumerate(ordered) if entry.kind == "run.start"]
    attempt = ordered[starts[-1] :] if starts else ordered
    finish = next((e for e in reversed(attempt) if e.kind in _FINISHES), None)
    done = next((e for e in attempt if e.kind == "job.done"), None)
    if finish is not None:
        status = _FINISHES[finish.kind]
        if status == "done" and done is not None:
            return status, done.timestamp
        return status, finish.timestamp
    if starts:
        last = ordered[-1]
        interrupted = last.kind == "up.exit" and last.fields.get("exit_code") == 130
        return ("interrupted" if interrupted else "running"), max(now, last.timestamp)
    if done is not None:
        return "done", done.timestamp
    last = ordered[-1]
    if last.kind == "up.exit":
        outcome = str(last.fields.get("outcome") or "")
        code = last.fields.get("exit_code")
        status = "interrupted" if code == 130 else ("failed" if code else outcome or "ended")
        if code == 130:
            return status, max(now, last.timestamp)  # the job may still run unwatched
        return status, last.timestamp
    return "running", max(now, last.timestamp)


def _runs_never_seen(ordered: Sequence[EntryLike]) -> set[int]:
    """The positions of the job's starts whose run tpuctl never saw (no `job.running` before
    it ended) but which did run: the next job event is its end (a failure whose workers got
    past setup, done, or an exit with a disruption). That run is running time, not the
    provisioning or recovery it would otherwise be folded into."""
    found: set[int] = set()
    for index, entry in enumerate(ordered):
        if entry.kind not in _STARTS:
            continue
        following = (
            later
            for later in ordered[index + 1 :]
            if later.kind in _STARTS | _RUNNING_AGAIN | _RAN_AND_ENDED
            or later.kind in _DISRUPTION_STARTS
        )
        nxt = next(following, None)
        if nxt is not None and nxt.kind in _RAN_AND_ENDED and _it_ran(nxt):
            found.add(index)
    return found


def _it_ran(ended: EntryLike) -> bool:
    """A job end after which the job had run: not a failure of setup on every worker."""
    states = ended.fields.get("states")
    if ended.kind != "job.failed" or not isinstance(states, list) or not states:
        return True
    return any(state != "setup-failed" for state in states)


def _apply(state: _State, entry: EntryLike) -> None:
    kind = entry.kind
    fields = entry.fields
    racing = bool(fields.get("racing"))  # about a zone that is not (yet) the run's
    zone = fields.get("zone")
    if kind == "capacity.rung" and fields.get("name"):
        state.rung = str(fields["name"])
    if kind == "zone.race":
        state.zones = tuple(str(zone) for zone in fields.get("zones") or ())
    elif isinstance(zone, str) and zone and not racing:
        state.zones = (zone,)
    if kind == "qr.state":
        state.qr = str(fields.get("state") or state.qr)
    elif racing:
        pass
    elif kind in ("qr.created", "qr.recreated"):
        state.qr = "CREATING"
    elif kind == "qr.exists":
        state.qr = str(fields.get("state") or state.qr)
    elif kind == "qr.deleted":
        state.qr = GONE
        state.running = False
    if kind in _DISRUPTION_STARTS:
        state.disrupted = True
        state.running = False
    elif kind == "run.ended":
        state.between = True
        state.running = False
    elif kind in _RUNNING_AGAIN:
        state.disrupted = False
        state.between = False
        state.running = True
    elif kind == "job.done":
        state.running = False


def _timeline(
    ordered: Sequence[EntryLike],
    start: datetime,
    end: datetime,
    unseen: set[int],
    first_rung: str | None = None,
) -> list[Phase]:
    phases: list[Phase] = []
    state = _State(rung=first_rung)
    cursor = start
    for index, entry in enumerate(ordered):
        at = min(max(entry.timestamp, start), end)
        if at > cursor:
            _add(phases, Phase(state.phase(), cursor, at, state.zones, state.rung))
            cursor = at
        _apply(state, entry)
        if index in unseen:
            state.disrupted, state.between, state.running = False, False, True
    if end > cursor:
        _add(phases, Phase(state.phase(), cursor, end, state.zones, state.rung))
    return phases


def _add(phases: list[Phase], phase: Phase) -> None:
    last = phases[-1] if phases else None
    if last and (last.phase, last.zones, last.rung, last.end) == (
        phase.phase,
        phase.zones,
        phase.rung,
        phase.start,
    ):
        phases[-1] = replace(last, end=phase.end)
    else:
        phases.append(phase)


def _disruptions(ordered: Sequence[EntryLike], end: datetime, unseen: set[int]) -> list[Disruption]:
    found: list[Disruption] = []
    current: Disruption | None = None
    last_step: int | None = None
    for index, entry in enumerate(ordered):
        kind, fields = entry.kind, entry.fields
        if index in unseen and current is not None:  # a restart that ran, unseen: back
            current.running_again_at = entry.timestamp
            current = None
            continue
        if kind in _DISRUPTION_STARTS:
            label = _DISRUPTION_STARTS[kind]
            if kind == "drill.triggered":
                label = f"drill: {fields.get('drill')}"
            if current is None:
                current = Disruption(kind=label, detected_at=entry.timestamp)
                found.append(current)
                value = fields.get("last_step")
                last_step = value if isinstance(value, int) else None
            elif label not in current.kind:
                current.kind += f" + {label}"
            if kind == "job.failed":
                current.detail = f"exit codes {fields.get('exit_codes')}"
            elif kind == "preemption.detected":
                current.detail = f"QR {fields.get('state')} ({fields.get('initiator') or '?'})"
        elif kind in _RUNNING_AGAIN and current is not None:
            current.running_again_at = entry.timestamp
            resumed = fields.get("resumed_from")
            if (
                current.recomputed_steps is None
                and isinstance(resumed, int)
                and last_step is not None
            ):
                current.recomputed_steps = max(0, last_step - resumed)  # a lower bound
            current = None
        elif kind == "job.relaunched" and current is None:
            found.append(
                Disruption(
                    kind="reboot (maintenance or reset)",
                    detected_at=entry.timestamp,
                    running_again_at=entry.timestamp,
                    detail="seen when the job had relaunched itself",
                )
            )
        if kind == "drill.result":
            recomputed = fields.get("recomputed_steps")
            target = current or (found[-1] if found else None)
            if target is not None and isinstance(recomputed, int):
                target.recomputed_steps = recomputed
                target.recomputed_exact = True
    return found


def _flex_runs(
    ordered: Sequence[EntryLike], start: datetime, end: datetime, timeline: Sequence[Phase]
) -> list[FlexRun]:
    """The job's flex-start runs, split at each `run.ended`: each one's time, its running time,
    and what its end cost (the gap until the job ran again, steps computed twice)."""
    runs = [FlexRun(1, start, end)]
    pending: FlexRun | None = None
    last_step: int | None = None
    for entry in ordered:
        if entry.timestamp > end:
            break
        if entry.kind == "run.ended":
            current = runs[-1]
            current.end, current.ended = entry.timestamp, True
            when = entry.fields.get("termination_time")
            current.termination_time = str(when) if when else None
            value = entry.fields.get("last_step")
            last_step = value if isinstance(value, int) else None
            pending = current
            runs.append(FlexRun(current.run + 1, entry.timestamp, end))
        elif entry.kind in _RUNNING_AGAIN and pending is not None:
            pending.running_again_at = entry.timestamp
            resumed = entry.fields.get("resumed_from")
            if isinstance(resumed, int) and last_step is not None:
                pending.recomputed_steps = max(0, last_step - resumed)
            pending = None
    for run in runs:
        run.running_seconds = sum(
            _overlap(phase, run.start, run.end) for phase in timeline if phase.phase == "running"
        )
    return runs


def _overlap(phase: Phase, start: datetime, end: datetime) -> float:
    return max(0.0, (min(phase.end, end) - max(phase.start, start)).total_seconds())


def _kept_logs(ordered: Sequence[EntryLike]) -> KeptLogs | None:
    """The last `job.logs` entry: the workers' last lines a give-up kept."""
    entry = next((e for e in reversed(ordered) if e.kind == "job.logs"), None)
    if entry is None:
        return None
    tails, reasons = entry.fields.get("tails"), entry.fields.get("reasons")
    where = entry.fields.get("where")
    return KeptLogs(
        at=entry.timestamp,
        where=str(where) if where else None,
        tails={str(k): str(v) for k, v in tails.items()} if isinstance(tails, dict) else {},
        reasons={str(k): str(v) for k, v in reasons.items()} if isinstance(reasons, dict) else {},
    )


def _step_seconds(ordered: Sequence[EntryLike]) -> float | None:
    values = [
        float(e.fields["step_seconds"])
        for e in ordered
        if isinstance(e.fields.get("step_seconds"), int | float) and e.fields["step_seconds"] > 0
    ]
    if not values:
        return None
    return sum(values) / len(values)


def checkpoint_step_seconds(commits: Sequence[tuple[int, datetime | None]]) -> float | None:
    """Mean step time from consecutive checkpoint commit times (saves included)."""
    known = sorted((step, at) for step, at in commits if at is not None)
    rates = []
    for (step_a, at_a), (step_b, at_b) in itertools.pairwise(known):
        if step_b > step_a and at_a is not None and at_b is not None and at_b > at_a:
            rates.append((at_b - at_a).total_seconds() / (step_b - step_a))
    if not rates:
        return None
    return min(rates)  # the smallest: the stretch least affected by a disruption
