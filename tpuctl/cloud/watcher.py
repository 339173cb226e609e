"""The queued-resource watcher: poll schedule, state timeline, deadlines and warnings.

A pure state machine over an injected clock, sleep and `fetch()`: it never talks to the API
itself, never prints and never deletes anything. It reports through `on_event` and returns a
`WatchResult` saying how the wait ended; the caller decides what that means (exit code, delete).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from tpuctl.clock import Clock, format_duration
from tpuctl.errors import ApiUnavailableError, quoted

# Everything up to the moment capacity is found: the queueing deadline covers these.
QUEUE_STATES = frozenset({"STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"})
PROVISION_STATES = frozenset({"PROVISIONING"})
# States that normally pass within seconds to a few minutes: poll them quickly.
SHORT_LIVED_STATES = frozenset({"CREATING", "PROVISIONING", "DELETING", "SUSPENDING"})
# The docs tell users to contact support after 15 minutes in these.
SUPPORT_WARNING_STATES = frozenset({"WAITING_FOR_RESOURCES", "PROVISIONING"})
SUSPENDED_STATES = frozenset({"SUSPENDING", "SUSPENDED"})
GONE = "DELETED"  # pseudo-state: Get answered NOT_FOUND
UNKNOWN = "UNKNOWN"  # pseudo-state: never seen (the API was down from the first poll on)
# During an API outage: the pause between polls, and how often the outage is said again.
OUTAGE_POLL = 2.0
OUTAGE_REPORT_EVERY = 30.0

# Where each state sits on the way to ACTIVE, so `--until WAITING_FOR_RESOURCES` is also met
# by a QR that went straight on to PROVISIONING or ACTIVE between two polls.
_PROGRESS = {
    "STATE_UNSPECIFIED": 0,
    "CREATING": 0,
    "ACCEPTED": 1,
    "WAITING_FOR_RESOURCES": 1,
    "PROVISIONING": 2,
    "ACTIVE": 3,
}
TARGETS = ("ACTIVE", "PROVISIONING", "WAITING_FOR_RESOURCES", "SUSPENDED", "FAILED", GONE)


class Outcome(str, Enum):
    REACHED = "reached"
    QUEUE_DEADLINE = "queue_deadline"
    PROVISION_DEADLINE = "provision_deadline"
    DEADLINE = "deadline"  # the overall bound (used by delete's wait-until-gone)
    FAILED = "failed"
    SUSPENDED = "suspended"
    GONE = "gone"


@dataclass(frozen=True)
class Observation:
    """What one poll saw. `state` is a QueuedResourceState.State name, or DELETED."""

    state: str
    initiator: str | None = None  # USER | SERVICE for SUSPENDING/SUSPENDED
    failure: str | None = None  # failed_data.error.message
    detail: str | None = None  # e.g. node states, for the live status line


@dataclass(frozen=True)
class WatchPolicy:
    """Target, deadlines (seconds, None = no limit) and the poll schedule."""

    until: str = "ACTIVE"
    queue_timeout: float | None = None
    provision_timeout: float | None = None
    overall_timeout: float | None = None
    # Quick polls: right after a change, and all along in short-lived states.
    fast_min: float = 0.5
    fast_max: float = 1.0
    # Long-lived states: one fast poll after the change, then the ramp, then
    # `slow_min`..`slow_min * (1 + jitter)`. A 6 s floor keeps any minute from the change
    # on, ramp included, at 12 calls or fewer (0, 0.5, 2.5, 6.5, then every ≥ 6 s).
    slow_min: float = 6.0
    slow_jitter: float = 0.2
    ramp: tuple[float, ...] = (2.0, 4.0)
    long_state_warning: float = 15 * 60.0

    def __post_init__(self) -> None:
        if self.until not in TARGETS:
            raise ValueError(
                f"unknown target state {quoted(self.until)}; one of {', '.join(TARGETS)}"
            )


@dataclass(frozen=True)
class WatchEvent:
    """A state change, a warning, or a poll (for live status lines)."""

    kind: str  # "state" | "warning" | "poll"
    at: datetime
    state: str
    previous: str | None = None
    in_state: float = 0.0  # seconds in `state` so far (as observed by this watcher)
    elapsed: float = 0.0  # seconds since the watch started
    message: str = ""
    observation: Observation | None = None


@dataclass(frozen=True)
class Transition:
    state: str
    at: datetime


@dataclass
class WatchResult:
    outcome: Outcome
    state: str
    observation: Observation
    elapsed: float
    polls: int
    transitions: list[Transition] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    api_unavailable: str | None = None  # the API was down when the wait ended: why


def is_reached(target: str, state: str) -> bool:
    if target == state:
        return True
    if target in _PROGRESS and state in _PROGRESS:
        return _PROGRESS[state] >= _PROGRESS[target]
    return False


class Watcher:
    """Poll `fetch` until the target state, a bad end state, or a deadline.

    `last` always holds the latest observation, so a caller interrupted mid-wait (Ctrl-C)
    can still say what state the queued resource was in.
    """

    def __init__(
        self,
        fetch: Callable[[], Observation],
        policy: WatchPolicy,
        *,
        clock: Clock | None = None,
        on_event: Callable[[WatchEvent], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.fetch = fetch
        self.policy = policy
        self.clock = clock or Clock()
        self.on_event = on_event or (lambda _event: None)
        self.rng = rng or random.Random()
        self.last: Observation | None = None
        self.polls = 0
        self.transitions: list[Transition] = []
        self.warnings: list[str] = []
        self._warned = False
        self._start = 0.0
        self._started = False
        self._state_since = 0.0
        self._polls_in_state = 0
        self._queue_since: float | None = None
        self._provision_since: float | None = None
        self._outage_since: float | None = None
        self._outage_said = 0.0

    def next_interval(self, state: str, polls_in_state: int) -> float:
        """Seconds to sleep after the `polls_in_state`-th poll that saw `state` (1-based)."""
        policy = self.policy
        if state in SHORT_LIVED_STATES or polls_in_state <= 1:
            return self.rng.uniform(policy.fast_min, policy.fast_max)
        step = polls_in_state - 2
        if step < len(policy.ramp):
            return policy.ramp[step]
        return policy.slow_min * (1.0 + self.rng.uniform(0.0, policy.slow_jitter))

    def run(self) -> WatchResult:
        while True:
            result, delay = self.step()
            if result is not None:
                return result
            self.clock.sleep(delay)

    def step(self) -> tuple[WatchResult | None, float]:
        """One poll: how the wait ended, or None and the seconds until the next poll. `run`
        sleeps between steps; a caller watching several queued resources at once steps each
        watcher when its time comes."""
        clock = self.clock
        if not self._started:
            self._started = True
            self._start = clock.monotonic()
        try:
            observation = self.fetch()
        except ApiUnavailableError as error:
            # An outage: the deadlines run on from the last state seen; say so, go on.
            now = clock.monotonic()
            self._outage(error, now)
            outcome = self._decide_blind(now)
            if outcome is not None:
                return self._result(outcome, self.last or Observation(UNKNOWN), now, error), 0.0
            return None, self._clip_to_deadline(OUTAGE_POLL, now)
        self.polls += 1
        now = clock.monotonic()
        self._recovered(observation, now)
        self._observe(observation, now)
        outcome = self._decide(observation, now)
        if outcome is not None:
            return self._result(outcome, observation, now, None), 0.0
        delay = self.next_interval(observation.state, self._polls_in_state)
        return None, self._clip_to_deadline(delay, now)

    def _result(
        self,
        outcome: Outcome,
        observation: Observation,
        now: float,
        outage: ApiUnavailableError | None,
    ) -> WatchResult:
        return WatchResult(
            outcome=outcome,
            state=observation.state,
            observation=observation,
            elapsed=now - self._start,
            polls=self.polls,
            transitions=list(self.transitions),
            warnings=list(self.warnings),
            api_unavailable=outage.message if outage is not None else None,
        )

    def _outage(self, error: ApiUnavailableError, now: float) -> None:
        """Say the API is down at its first failed poll, then every OUTAGE_REPORT_EVERY."""
        if self._outage_since is None:
            self._outage_since = now
        elif now - self._outage_said < OUTAGE_REPORT_EVERY:
            return
        self._outage_said = now
        status = error.details.get("status") or "unavailable"
        message = (
            f"the TPU API is unavailable ({status}) for "
            f"{format_duration(now - self._outage_since)}; still waiting{self._deadline_note(now)}"
        )
        last = self.last or Observation(UNKNOWN)
        self.warnings.append(message)
        self._emit("warning", last, now, previous=last.state, message=message)

    def _recovered(self, observation: Observation, now: float) -> None:
        if self._outage_since is None:
            return
        message = f"the TPU API answers again after {format_duration(now - self._outage_since)}"
        self._outage_since = None
        self._emit("warning", observation, now, previous=observation.state, message=message)

    def _deadline_note(self, now: float) -> str:
        ends = self._deadlines()
        if not ends:
            return ""
        return f"; deadline in {format_duration(max(0.0, min(ends) - now))}"

    def _decide_blind(self, now: float) -> Outcome | None:
        """The deadlines, from the last state seen (or, never seen, the queueing one)."""
        return self._deadline_passed(self.last.state if self.last is not None else UNKNOWN, now)

    def _deadline_passed(self, state: str, now: float) -> Outcome | None:
        """The deadline `state` has run past, if any (UNKNOWN counts as queueing, from the
        start: a state never seen)."""
        policy = self.policy
        if policy.overall_timeout is not None and now - self._start >= policy.overall_timeout:
            return Outcome.DEADLINE
        if state in QUEUE_STATES or state == UNKNOWN:
            since = self._queue_since if self._queue_since is not None else self._start
            if policy.queue_timeout is not None and now - since >= policy.queue_timeout:
                return Outcome.QUEUE_DEADLINE
        if (
            state in PROVISION_STATES
            and policy.provision_timeout is not None
            and self._provision_since is not None
            and now - self._provision_since >= policy.provision_timeout
        ):
            return Outcome.PROVISION_DEADLINE
        return None

    def _observe(self, observation: Observation, now: float) -> None:
        previous = self.last.state if self.last is not None else None
        self.last = observation
        if observation.state != previous:
            self._state_since = now
            self._polls_in_state = 1
            self.transitions.append(Transition(observation.state, self.clock.now()))
            self._emit("state", observation, now, previous=previous)
        else:
            self._polls_in_state += 1
            self._emit("poll", observation, now, previous=previous)
        if observation.state in QUEUE_STATES and self._queue_since is None:
            self._queue_since = now
        if observation.state in PROVISION_STATES and self._provision_since is None:
            self._provision_since = now
        in_state = now - self._state_since
        if (
            not self._warned
            and observation.state in SUPPORT_WARNING_STATES
            and in_state >= self.policy.long_state_warning
        ):
            self._warned = True
            minutes = int(in_state // 60)
            message = (
                f"in {observation.state} for {minutes} minutes; the Cloud TPU docs advise "
                "contacting Google Cloud support after 15 minutes"
            )
            self.warnings.append(message)
            self._emit("warning", observation, now, previous=previous, message=message)

    def _decide(self, observation: Observation, now: float) -> Outcome | None:
        policy = self.policy
        state = observation.state
        if is_reached(policy.until, state):
            return Outcome.REACHED
        if state == GONE:
            return Outcome.GONE
        if state == "FAILED":
            return Outcome.FAILED
        if state in SUSPENDED_STATES and policy.until != "SUSPENDED":
            return Outcome.SUSPENDED
        return self._deadline_passed(state, now)

    def _deadlines(self) -> list[float]:
        """The monotonic times the deadlines of the current (or last seen) state fall at."""
        policy = self.policy
        state = self.last.state if self.last is not None else UNKNOWN
        ends: list[float] = []
        if policy.overall_timeout is not None:
            ends.append(self._start + policy.overall_timeout)
        if (state in QUEUE_STATES or state == UNKNOWN) and policy.queue_timeout is not None:
            since = self._queue_since if self._queue_since is not None else self._start
            ends.append(since + policy.queue_timeout)
        if (
            state in PROVISION_STATES
            and policy.provision_timeout is not None
            and self._provision_since is not None
        ):
            ends.append(self._provision_since + policy.provision_timeout)
        return ends

    def _clip_to_deadline(self, delay: float, now: float) -> float:
        """Never sleep past a deadline: wake up just after it for the final poll."""
        for end in self._deadlines():
            delay = min(delay, max(0.0, end - now))
        return delay

    def _emit(
        self,
        kind: str,
        observation: Observation,
        now: float,
        *,
        previous: str | None,
        message: str = "",
    ) -> None:
        self.on_event(
            WatchEvent(
                kind=kind,
                at=self.clock.now(),
                state=observation.state,
                previous=previous,
                in_state=now - self._state_since,
                elapsed=now - self._start,
                message=message,
                observation=observation,
            )
        )
