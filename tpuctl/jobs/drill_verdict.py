"""A drill's report and its verdict: what step the event hit, where the job resumed, how many
steps were computed twice, and whether that is within what the event allows. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from tpuctl.envelope import Result
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.storage.logs import LogFacts, parse_log

_AUTOCHECKPOINT = re.compile(r"autocheckpoint at step (\d+)")


@dataclass
class DrillReport(Result):
    """What a drill found; its JSON is documented in docs/output.md (kind Drill)."""

    KIND: ClassVar[str] = "Drill"
    name: str
    run: str
    drill: str  # maintenance | preempt | slice-failure
    autocheckpoint: bool
    triggered_at: datetime | None = None
    recovered_at: datetime | None = None
    recovery_seconds: float | None = None
    observer: str = "0/0"
    progress_from: str = "log"  # log | checkpoints (a log with no step lines recognised)
    step_before_trigger: int | None = None
    step_at_event: int | None = None
    step_at_event_exact: bool = True
    autocheckpoint_logged: int | None = None
    checkpoint_before: int | None = None
    checkpoint_at_event: bool = False
    new_checkpoint_at_event: bool = False
    last_checkpoint_before_event: int | None = None
    resumed_from: int | None = None
    recomputed_steps: int | None = None
    allowed_steps: int | None = None
    step_seconds: float | None = None
    boots_before: dict[str, int | None] = field(default_factory=dict)
    boots_after: dict[str, int | None] = field(default_factory=dict)
    ok: bool = False
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.ERROR

    def exit_error(self) -> TpuctlError | None:
        return None if self.ok else TpuctlError(f"drill failed: {self.verdict}")

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["recovery_seconds"] = _round(self.recovery_seconds)
        data["step_seconds"] = _round(self.step_seconds, 4)
        return data


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def judge(
    report: DrillReport,
    *,
    old_text: str,
    new: LogFacts,
    before_steps: set[int],
    after_steps: set[int],
    pattern: re.Pattern[str],
    has_record: bool,
) -> None:
    """Fill in the report's numbers and verdict from the old boot's log, the new boot's log
    facts and the complete checkpoint steps seen before and after the event."""
    old = parse_log(old_text, pattern)
    auto = _AUTOCHECKPOINT.findall(old_text)
    report.autocheckpoint_logged = int(auto[-1]) if auto else None
    if old.last_step is not None:
        report.step_at_event = old.last_step
    else:
        report.step_at_event = report.step_before_trigger
        report.step_at_event_exact = False
        report.notes.append(
            "the old boot's log was not readable after the event (a new disk): the step at "
            "the event is the last one seen before the trigger, a lower bound"
        )
    resumed = report.resumed_from = new.resume_point
    if resumed is not None and report.step_at_event is not None and resumed > report.step_at_event:
        # The job resumed from a checkpoint past the last step its log showed: that checkpoint
        # was complete, so the job had reached it; the log seen was behind (its last lines
        # never reached the disk, or a worker other than the one read was ahead).
        report.notes.append(
            f"resumed from step {resumed}, after the last step the log showed "
            f"({report.step_at_event}): the step at the event is at least {resumed}"
        )
        report.step_at_event = resumed
        report.step_at_event_exact = False
    # A checkpoint complete only after the event counts if the new process could have used
    # it: one past where it resumed was completed later (a job resumes from its latest
    # complete checkpoint), e.g. by a replaced slice that came up late and saved its part.
    known = before_steps | {s for s in after_steps if resumed is None or s <= resumed}
    if resumed is not None and resumed > 0:
        known.add(resumed)
    event = report.step_at_event
    if event is not None:
        report.checkpoint_at_event = event in known
        report.new_checkpoint_at_event = event in after_steps and event not in before_steps
        earlier = [step for step in known if step <= event]
        report.last_checkpoint_before_event = max(earlier) if earlier else None
    if event is not None and resumed is not None:
        report.recomputed_steps = event - resumed
    expects_zero = report.drill == "maintenance" and report.autocheckpoint
    if expects_zero:
        report.allowed_steps = 0
    elif event is not None and has_record:
        report.allowed_steps = event - (report.last_checkpoint_before_event or 0)
    else:
        report.allowed_steps = 0 if not has_record else None
        if not has_record:
            report.notes.append("no checkpoint.dir known (no spec): only 0 recomputed passes")
    recomputed = report.recomputed_steps
    allowed = report.allowed_steps
    if recomputed is None or allowed is None:
        report.ok = False
        report.verdict = "could not tell what was lost (no step lines before or after the event)"
        return
    missing_autocheckpoint = expects_zero and not report.checkpoint_at_event
    report.ok = recomputed <= allowed and not missing_autocheckpoint
    what = (
        f"event at step {event}, resumed from {report.resumed_from}: {recomputed} steps "
        f"recomputed (allowed {allowed})"
    )
    if missing_autocheckpoint:
        report.verdict = f"FAILED: no checkpoint at the event step ({what})"
    elif report.ok:
        report.verdict = f"ok: {what}"
    else:
        report.verdict = f"FAILED: progress lost beyond what the event allows ({what})"


def judge_checkpoints(report: DrillReport, *, before_steps: set[int], at_restart: set[int]) -> None:
    """The verdict when the log has no step lines: from the complete checkpoints before the
    event and when the job ran again, the job taken to resume from its latest one. Steps
    between checkpoints are not visible, so recomputed steps are only known to be 0 when a
    checkpoint was saved at the event."""
    saved = at_restart - before_steps
    report.last_checkpoint_before_event = max(before_steps) if before_steps else None
    report.resumed_from = max(at_restart) if at_restart else None
    report.new_checkpoint_at_event = report.checkpoint_at_event = bool(saved)
    report.step_at_event = max(saved) if saved else None
    report.step_at_event_exact = False
    report.notes.append(
        "the job is taken to resume from its latest complete checkpoint "
        f"({report.resumed_from if report.resumed_from is not None else 'none: from scratch'})"
    )
    before = report.last_checkpoint_before_event
    if report.drill == "maintenance" and report.autocheckpoint:
        report.allowed_steps = 0
        report.ok = bool(saved)
        if report.ok:
            report.recomputed_steps = 0
            report.verdict = (
                f"ok: a checkpoint at step {report.step_at_event} was saved at the event and the "
                "job resumed from it (progress read from checkpoints)"
            )
        else:
            report.verdict = (
                "FAILED: no checkpoint was saved at the event; the job resumed from "
                f"{'step ' + str(before) if before is not None else 'scratch'}, the last one "
                "before it (progress read from checkpoints)"
            )
        return
    resumed = report.resumed_from
    report.ok = before is None or (resumed is not None and resumed >= before)
    if report.ok:
        if resumed is None:
            report.verdict = (
                "ok: no checkpoint before the event, and the job started again from scratch"
            )
        elif before is None:
            report.verdict = (
                f"ok: resumed from step {resumed}; there was no checkpoint before the event"
            )
        else:
            report.verdict = (
                f"ok: resumed from step {resumed}, not before the last checkpoint before the "
                f"event ({before}); the steps since it were recomputed, which only step lines "
                "would count"
            )
    else:
        report.verdict = (
            f"FAILED: the checkpoint at step {before} was gone when the job ran again "
            f"(it started from {'step ' + str(resumed) if resumed is not None else 'scratch'})"
        )
