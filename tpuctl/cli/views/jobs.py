"""Views of the job results: up, drill, report and checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.table import Column, pairs, render

if TYPE_CHECKING:  # what each view draws; the command that made it has imported it
    from tpuctl.jobs.drill_verdict import DrillReport
    from tpuctl.jobs.reconcile.step import ReconcileResult, ReconcilesResult
    from tpuctl.jobs.report import JobReport
    from tpuctl.jobs.up import UpResult
    from tpuctl.storage.checkpoints import CheckpointReport

TIMELINE_COLUMNS = (
    Column("PHASE"),
    Column("ZONE", drop=3),
    Column("FROM", drop=1),
    Column("TO", drop=2),
    Column("DURATION"),
)
RUNG_COLUMN = Column("CAPACITY", drop=4)
DISRUPTION_COLUMNS = (
    Column("DISRUPTION"),
    Column("DETECTED", drop=2),
    Column("RUNNING AGAIN", drop=1),
    Column("RECOVERY", align="right"),
    Column("RECOMPUTED", align="right"),
)
BUCKET_COLUMNS = (Column("BUCKET"), Column("TIME", align="right"), Column("SHARE", align="right"))
FLEX_RUN_COLUMNS = (
    Column("RUN", identity=True, align="right"),
    Column("FROM", drop=2),
    Column("TO", drop=3),
    Column("TIME", align="right"),
    Column("SHARE", align="right"),
    Column("RUNNING", align="right", drop=1),
    Column("ENDED"),
    Column("BACK AFTER", align="right", drop=4),
)
CHECKPOINT_COLUMNS = (
    Column("STEP", identity=True, align="right"),
    Column("NAME", identity=True),
    Column("COMPLETE"),
    Column("COMMITTED", drop=1),
    Column("SAVE", align="right", drop=2),
    Column("NOTES", shrink=True),
)


def up_view(result: UpResult, _style: Style) -> str:
    if result.outcome == "detached":
        return _handed_over(result)
    if result.already:
        return (
            f"{result.message or result.name + ': done'}; nothing was done. To run it again, "
            "remove its done marker (or the run's journal for a fresh start), or give it "
            "another run name: --set job.run_name=NAME\n"
        )
    if result.outcome == "stopped":
        return f"{result.message or result.name + ': stopped'}\n"
    kept = "deleted" if result.deleted else "kept"
    where = f" in {result.zone}" if result.zone else ""
    return (
        f"{result.name}: {result.outcome}{where} (latest step {value(result.latest_step)}); "
        f"{result.preemptions} preemptions, {result.failures} job failures, "
        f"{result.restarts} restarts; queued resource {kept}\n"
    )


def _handed_over(result: UpResult) -> str:
    where = f" in {result.zone}" if result.zone else ""
    text = f"{result.message}{where}\n"
    handover = result.supervisor or {}
    if handover.get("installed"):
        text += f"installed: {handover.get('target')} steps it: {handover.get('step')}\n" + "".join(
            f"remove it with: {command}\n" for command in handover.get("remove") or ()
        )
    elif handover.get("command"):
        text += (
            f"hand it to a scheduler on this machine: {handover['command']}\n"
            "(or --on systemd; a scheduler elsewhere: --on kubernetes, cloud-run or github, "
            "see docs/supervision.md)\n"
        )
    return text


def reconcile_view(result: ReconcileResult, _style: Style) -> str:
    lines = [f"{result.message}"]
    if result.outcome == "in_progress" and result.next_in_s is not None and not result.held_by:
        lines.append(f"in progress: the next step is useful in {value(result.next_in_s)} s")
    return "\n".join(lines) + "\n"


RECONCILES_COLUMNS = (
    Column("NAME", identity=True),
    Column("OUTCOME"),
    Column("CODE", align="right", drop=2),
    Column("ACTION", drop=1),
    Column("MESSAGE", shrink=True),
)


def reconciles_view(result: ReconcilesResult, style: Style) -> str:
    rows: list[list[object]] = [
        [run.name, run.outcome.replace("_", " "), run.code, run.action, run.message]
        for run in result.runs
    ]
    rows += [
        [error.name or error.record_url or MISSING, "error", error.exit_code, MISSING,
         error.message + (f" ({error.hint})" if error.hint else "")]
        for error in result.errors
    ]  # fmt: skip
    where = " and ".join(
        [*([result.bucket] if result.bucket else []),
         *([f"project {result.project}"] if result.project else [])]
    )  # fmt: skip
    if not rows:
        text = f"no runs found in {where}\n"
    else:
        text = render(RECONCILES_COLUMNS, rows, width=style.width)
    text += "".join(
        f"skipped {item['name']} in {item['zone']}: {item['reason']}\n" for item in result.skipped
    )
    return text


def drill_view(report: DrillReport, style: Style) -> str:
    exact = "" if report.step_at_event_exact else " (lower bound)"
    boots = ", ".join(
        f"{label} {value(report.boots_before.get(label))}→{value(boot)}"
        for label, boot in report.boots_after.items()
    )
    text = pairs(
        [
            ("drill", f"{report.drill} on {report.name} (run {report.run})"),
            ("autocheckpoint", "on" if report.autocheckpoint else "off"),
            ("triggered", style.time(report.triggered_at)),
            ("back after", style.duration(report.recovery_seconds)),
            ("step at the event", value(report.step_at_event) + exact),
            ("checkpoint at that step", "yes" if report.checkpoint_at_event else "no"),
            ("last checkpoint before", value(report.last_checkpoint_before_event)),
            ("resumed from step", value(report.resumed_from)),
            ("steps recomputed", value(report.recomputed_steps)),
            ("allowed", value(report.allowed_steps)),
            ("boots", boots or MISSING),
        ]
    )
    text += "".join(f"note: {note}\n" for note in report.notes)
    return text + report.verdict + "\n"


def report_view(result: JobReport, style: Style) -> str:
    goodput = result.goodput
    text = (
        f"{result.name} (run {result.run}): {result.status}; "
        f"{style.duration(result.total_seconds)} from {style.time(result.started_at)} to "
        f"{style.time(result.ended_at)}; latest step {value(result.latest_step)}\n"
    )
    ladder = any(phase.rung for phase in result.timeline)  # a CAPACITY column: which rung
    timeline = [
        [
            phase.phase,
            *([phase.rung or MISSING] if ladder else []),
            ",".join(phase.zones) or MISSING,
            style.time(phase.start),
            style.time(phase.end),
            style.duration(phase.seconds),
        ]
        for phase in result.timeline
    ]
    columns = (
        (TIMELINE_COLUMNS[0], RUNG_COLUMN, *TIMELINE_COLUMNS[1:]) if ladder else TIMELINE_COLUMNS
    )
    text += render(columns, timeline, width=style.width)
    if result.disruptions:
        rows = [
            [
                item.kind,
                style.time(item.detected_at),
                style.time(item.running_again_at),
                style.duration(item.recovery_seconds),
                value(item.recomputed_steps),
            ]
            for item in result.disruptions
        ]
        text += "\n" + render(DISRUPTION_COLUMNS, rows, width=style.width)
    else:
        text += "no disruptions\n"
    total = result.total_seconds
    if result.flex_runs:
        text += "\n" + _flex_runs(result, style)
    buckets: list[list[object]] = [
        [key.replace("_", " "), style.duration(seconds), _share(seconds, total)]
        for key, seconds in result.badput.items()
    ]
    buckets.append(
        ["productive", style.duration(result.productive_seconds), _percent(result.goodput)]
    )
    text += "\n" + render(BUCKET_COLUMNS, buckets, width=style.width)
    step = f" (mean step {result.step_seconds:.3f}s)" if result.step_seconds else ""
    text += "goodput " + (MISSING if goodput is None else f"{goodput:.3f}") + step + "\n"
    text += "".join(f"note: {note}\n" for note in result.notes)
    if result.logs is not None:
        text += _kept_logs(result, style)
    return text


def _flex_runs(result: JobReport, style: Style) -> str:
    """Each flex-start run's share of the time, apart from the disruptions."""
    rows: list[list[object]] = []
    for run in result.flex_runs:
        document = run.to_dict(result.total_seconds)
        rows.append(
            [
                run.run,
                style.time(run.start),
                style.time(run.end),
                style.duration(run.seconds),
                _percent(document["share"]),
                style.duration(run.running_seconds),
                "at its maximum run duration" if run.ended else "no (the last)",
                style.duration(document["gap_seconds"]),
            ]
        )
    return render(FLEX_RUN_COLUMNS, rows, width=style.width)


def _kept_logs(result: JobReport, style: Style) -> str:
    """The workers' last log lines a give-up kept: the workers are gone, these are not."""
    logs = result.logs
    assert logs is not None
    where = f"; every worker's in {logs.where}" if logs.where else ""
    text = f"\nlast log lines kept at the give-up ({style.time(logs.at)}{where}):\n"
    for label, tail in sorted(logs.tails.items()):
        reason = logs.reasons.get(label)
        text += f"--- {label}" + (f" ({reason})" if reason else "") + " ---\n"
        text += "".join(f"{line}\n" for line in tail.splitlines())
    return text


def _share(seconds: float, total: float) -> str:
    return _percent(seconds / total if total > 0 else None)


def _percent(fraction: float | None) -> str:
    return MISSING if fraction is None else f"{fraction:.1%}"


def checkpoints_view(report: CheckpointReport, style: Style) -> str:
    text = f"{report.url} ({report.storage})\n"
    rows: list[list[object]] = [
        [
            folder.step,
            folder.name,
            "yes" if folder.complete else "no",
            style.time(folder.committed_at),
            style.duration(folder.save_seconds),
            "; ".join(folder.notes) or MISSING,
        ]
        for folder in report.steps
    ]
    rows += [
        [
            folder.step,
            folder.name,
            "no",
            MISSING,
            MISSING,
            "stale tmp folder" if folder.stale else "tmp folder: save in progress?",
        ]
        for folder in report.tmp_folders
    ]
    rows.sort(key=lambda row: (int(str(row[0])), str(row[1])))
    text += render(CHECKPOINT_COLUMNS, rows, width=style.width) if rows else "no step folders\n"
    latest = "none" if report.latest_step is None else str(report.latest_step)
    unfinished = ", ".join(str(step) for step in report.unfinished_steps) or "none"
    stale = ", ".join(folder.name for folder in report.stale_tmp_folders) or "none"
    return (
        text
        + f"latest complete step: {latest}\n"
        + f"unfinished saves: {unfinished}\n"
        + f"stale tmp folders: {stale}\n"
    )
