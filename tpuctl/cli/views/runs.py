"""The view of `tpuctl runs`: one row per run, its note saying why it gave up or, for a run
nobody reconciles any more, what to do."""

from __future__ import annotations

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.table import Column, render
from tpuctl.jobs.runs import RunRow, RunsResult

RUNS_COLUMNS = (
    Column("NAME", identity=True),
    Column("STATE"),
    Column("RECONCILED", drop=3),
    Column("BY", drop=4),
    Column("STEP", align="right", drop=2),
    Column("GOODPUT", align="right", drop=1),
    Column("P/F/E", align="right", drop=5),
    Column("QUEUED"),
    Column("NOTE", shrink=True),
)


def runs_view(result: RunsResult, style: Style) -> str:
    rows = [_row(run, style) for run in result.runs]
    where = " and ".join(
        [*([result.bucket] if result.bucket else []),
         *([f"project {result.project}"] if result.project else [])]
    )  # fmt: skip
    text = render(RUNS_COLUMNS, rows, width=style.width) if rows else f"no runs in {where}\n"
    text += "".join(
        f"skipped {item['name']} in {item['zone']}: {item['reason']}\n" for item in result.skipped
    )
    return text + "".join(f"error: {error}\n" for error in result.errors)


def _row(run: RunRow, style: Style) -> list[object]:
    beat = run.last_reconciled
    by = MISSING
    if beat is not None:
        by = f"{beat.by or '?'}@{beat.host or '?'}"
    step = run.latest_step if run.latest_step is not None else run.last_step
    state = run.state.replace("_", " ")
    if run.state == "given_up" and run.exit_code is not None:
        state += f" ({run.exit_code})"
    if run.unsupervised:
        state += " !"
    queued = ", ".join(f"{q.zone} {q.state}" for q in run.queued_resources) or "none"
    note = run.advice or run.why or run.error or MISSING
    goodput = MISSING if run.goodput is None else f"{run.goodput:.1%}"
    return [
        run.name,
        state,
        style.time(beat.at if beat else None),
        by,
        value(step),
        goodput,
        f"{run.preemptions}/{run.failures}/{run.run_ends}",
        queued,
        note,
    ]
