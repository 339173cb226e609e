"""What a reconcile decision is made of: its actions and outcomes, the policy it follows, the
notes it writes, and the plumbing every part of the decider shares (decide.py decides where the
run lives, decide_job.py what its job does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpuctl.errors import ExitCode
from tpuctl.jobs.reconcile.record import RunRecord
from tpuctl.jobs.reconcile.seen import Seen, WorkerSeen

# Actions.
WAIT = "wait"
CREATE = "create"  # `zones`: one, or every zone of a first-active race
DELETE = "delete"  # `zones`: what to delete, and `why`
CLAIM = "claim"  # `claim`: the zone the run is claimed for, or None to withdraw the claim
START = "start"  # deliver the job's code and run the startup script everywhere
RESTART = "restart"
MARK_DONE = "mark_done"
GIVE_UP = "give_up"  # keep the workers' last log lines, record it, delete (unless kept)
FINISH = "finish"  # record that the run is done
NOTHING = "nothing"  # the run is over and nothing is left
REFUSE = "refuse"  # a request this step must not act on (nothing is recorded)

# Outcomes of a step, as a scheduler sees them.
IN_PROGRESS = "in_progress"
DONE = "done"
GIVEN_UP = "given_up"
STOPPED = "stopped"

OUTAGE_SAY_EVERY = 30.0  # seconds between "the API is unavailable" notes
WAIT_SAY_AGAIN = 600.0  # a wait that lasts is said again after this long
FAST = 1.0  # seconds to the next step while something changes
REDELIVER_AFTER = 60.0  # a delivered job still waiting for its code is delivered again
# A slice set taken back this close to its termination time ended its run (flex-start), and a
# job that ended this close before it was stopped for it: neither is a preemption or a failure.
TIME_UP_SLACK = 60.0
# A worker in one of these has not started the job of this boot: the job is delivered to it.
WAITING_STATES = frozenset({"waiting-for-code", "waiting-for-zone", "none"})
END_NEAR = 600.0


@dataclass(frozen=True)
class Policy:
    """What a decision needs of the spec and of the supervisor's options."""

    name: str
    zones: tuple[str, ...]
    zone_policy: str = "sequential"  # or first-active
    claims_zone: bool = False
    max_preemptions: int = 3
    max_failures: int = 3
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    keep: bool = False
    keep_on_timeout: bool = False
    # A person's `tpuctl up` without --keep on a run that ended with its queued resource kept
    # deletes it; a scheduler's step leaves what a person chose to keep.
    delete_kept: bool = False
    settle: float = 120.0
    running_timeout: float = 600.0
    crashloop_restarts: int = 2
    start_attempts: int = 3
    poll: float = 6.0  # seconds between steps while nothing changes
    job_check_every: float = 20.0
    # A capacity ladder (capacity.fallback): each rung's name, the first the spec's own tier;
    # a rung is climbed when its queueing deadline passes in every zone or its preemption
    # budget is spent. `prefer_cheapest`: every new bring-up starts from the first rung again.
    rungs: tuple[str, ...] = ()
    prefer_cheapest: bool = False

    @property
    def racing(self) -> bool:
        return self.zone_policy == "first-active" and len(self.zones) > 1


@dataclass(frozen=True)
class Note:
    """A journal entry the step writes before it acts: an observation or a decision."""

    kind: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GiveUp:
    """Why the run ends without being done: the error a supervisor exits with."""

    kind: str
    exit_code: int
    message: str
    hint: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exit_code": self.exit_code,
            "message": self.message,
            "hint": self.hint,
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Decision:
    """One step's decision: its action, why (one line), the notes to record first, and how
    the run stands for a scheduler (`outcome`) with the seconds until another step is useful."""

    action: str
    message: str
    notes: tuple[Note, ...] = ()
    zones: tuple[str, ...] = ()
    claim: str | None = None
    why: str = ""
    give_up: GiveUp | None = None
    outcome: str = IN_PROGRESS
    next_in: float = FAST
    again: int | None = None  # a create after the `again`-th preemption
    rung: int = 0  # a create: the capacity ladder's rung it asks for
    workers: tuple[str, ...] = ()  # a start: only these workers (empty: every one)
    from_step: int | None = None  # a restart: the checkpoint it resumes from
    ending: str | None = None  # a restart: the ending it answers
    kept: bool = False  # the run ends with its queued resource kept
    api_unavailable: bool = False
    running: str | None = None  # the job runs: its workers' states, e.g. "4 running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "message": self.message,
            "zones": list(self.zones),
            "claim": self.claim,
            "outcome": self.outcome,
            "next_in_s": self.next_in,
            "give_up": None if self.give_up is None else self.give_up.to_dict(),
            "notes": [{"kind": note.kind, "message": note.message} for note in self.notes],
        }


def ending_key(workers: Sequence[WorkerSeen]) -> str:
    """One ending of the job: every worker's boot, pid, state and exit code."""
    return ";".join(
        f"{w.label}:{w.boot}:{w.pid}:{w.state}:{w.exit_code}"
        for w in sorted(workers, key=lambda w: w.label)
    )


def give_up_of(error: Mapping[str, Any] | None) -> GiveUp | None:
    if not error:
        return None
    return GiveUp(
        str(error.get("kind") or "error"),
        int(error.get("exit_code") or ExitCode.ERROR),
        str(error.get("message") or ""),
        error.get("hint"),
        dict(error.get("details") or {}),
    )


class DeciderBase:
    """What every part of a decision shares: what the step saw, the record, the policy, and
    the notes the step writes."""

    def __init__(self, seen: Seen, record: RunRecord, policy: Policy) -> None:
        self.seen = seen
        self.record = record
        self.policy = policy
        self.name = policy.name
        self.now = seen.at
        self.notes: list[Note] = []
        self.rung = record.rung  # the ladder's rung, once this step's notes are written

    # ----------------------------------------------------------------------- plumbing

    def note(self, kind: str, message: str, **fields: Any) -> None:
        self.notes.append(Note(kind, message, fields))

    def make(self, action: str, message: str, **values: Any) -> Decision:
        return Decision(action, message, tuple(self.notes), **values)

    def wait(self, key: str, message: str, next_in: float, **values: Any) -> Decision:
        """Wait, saying why once (and again when the same wait has lasted a while)."""
        said = self.record.wait_said_at
        if key != self.record.wait_key or said is None or self._since(said) >= WAIT_SAY_AGAIN:
            self.note("reconcile.wait", message, key=key)
        return self.make(WAIT, message, next_in=next_in, **values)

    def _since(self, moment: datetime | None) -> float:
        return 0.0 if moment is None else max(0.0, (self.now - moment).total_seconds())

    def give_up(
        self,
        kind: str,
        code: ExitCode,
        message: str,
        *,
        hint: str | None = None,
        delete: bool = True,
        **details: Any,
    ) -> Decision:
        present = tuple(s.zone for s in self.seen.present() if s.state != "DELETING")
        kept = not delete and bool(present)
        return self.make(
            GIVE_UP,
            message,
            give_up=GiveUp(kind, int(code), message, hint, details),
            zones=present if delete else (),
            outcome=GIVEN_UP,
            kept=kept,
        )

    # ----------------------------------------------------------------------- the order
