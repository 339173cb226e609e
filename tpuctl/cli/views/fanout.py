"""Views of a fan-out result: one row per worker (or, above SUMMARY_THRESHOLD workers, only the
ones that were not ok and one line for the rest), the operation's own columns, a summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.table import Column, render
from tpuctl.fanout.remote import RunState
from tpuctl.fanout.results import FanoutResult, WorkerResult

# Above this many workers a table shows the workers that were not ok, and one line for the rest.
SUMMARY_THRESHOLD = 64
BAD_STATUSES = ("failed", "unreachable", "timeout", "hostkey-mismatch", "interrupted")
Detail = Callable[[WorkerResult, Style], list[object]]

BASE = (
    Column("WORKER", identity=True),
    Column("NODE", identity=True, wide=True),
    Column("ADDRESS", wide=True),
    Column("STATUS"),
    Column("EXIT", align="right"),
    Column("TIME", align="right"),
)
NOTE = Column("LAST OUTPUT / ERROR")


def _run_state(worker: WorkerResult, _style: Style) -> list[object]:
    detail = worker.detail
    if not isinstance(detail, RunState):
        return [MISSING, MISSING, MISSING]
    return [value(detail.run), value(detail.pid), detail.describe()]


def _job_status(worker: WorkerResult, style: Style) -> list[object]:
    job = worker.detail
    if job is None:
        return [MISSING] * 6
    heartbeat = job.heartbeat_age_s
    return [
        job.state,
        value(job.boot),
        MISSING if job.pid is None else f"{job.pid}{'' if job.trainer_alive else ' (gone)'}",
        value(job.started),
        MISSING if heartbeat is None else style.duration(heartbeat) + " ago",
        value(job.reason),
    ]


def _delivery(worker: WorkerResult, _style: Style) -> list[object]:
    detail = worker.detail
    if detail is None:
        return [MISSING, MISSING, MISSING]
    return [value(detail.startup), value(detail.pid), value(getattr(detail, "stopped", None))]


# operation → (its detail columns, how a worker's detail fills them)
DETAILS: dict[str, tuple[tuple[Column, ...], Detail]] = {
    "detach": ((Column("RUN"), Column("PID"), Column("STATE")), _run_state),
    "ps": ((Column("RUN"), Column("PID"), Column("STATE")), _run_state),
    "stop": ((Column("RUN"), Column("PID"), Column("STATE")), _run_state),
    "job-status": (
        (
            Column("STATE"),
            Column("BOOT", align="right"),
            Column("PID"),
            Column("STARTED"),
            Column("HEARTBEAT"),
            Column("REASON"),
        ),
        _job_status,
    ),
    "deliver": ((Column("STARTUP"), Column("PID"), Column("STOPPED")), _delivery),
    "restart": ((Column("STARTUP"), Column("PID"), Column("STOPPED")), _delivery),
}


def fanout_view(result: FanoutResult, style: Style) -> str:
    extra, fill = DETAILS.get(result.operation, ((), None))
    columns = (*BASE, *extra, NOTE)
    shown = _rows_to_show(result.results, style)
    rows = []
    for worker in shown:
        target = worker.target
        cells: list[object] = [
            target.label,
            target.node_id,
            target.address,
            worker.status if worker.ok else worker.status.upper(),
            value(worker.exit_code),
            f"{worker.duration_s:.1f}s",
        ]
        if fill is not None:
            cells += fill(worker, style)
        cells.append(_note(worker))
        rows.append(cells)
    text = render(columns, rows, width=style.width, wide=style.wide) if rows else ""
    hidden = len(result.results) - len(shown)
    if hidden:
        text += f"… {hidden} more workers ok (--all shows every row)\n"
    return text + summary_line(result) + "\n"


def _rows_to_show(workers: Sequence[WorkerResult], style: Style) -> Sequence[WorkerResult]:
    if style.all_rows or len(workers) <= SUMMARY_THRESHOLD:
        return workers
    return [worker for worker in workers if not worker.ok]


def _note(worker: WorkerResult) -> str:
    return worker.error or _last_line(worker.stderr.text()) or _last_line(worker.stdout.text())


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def summary_line(result: FanoutResult) -> str:
    counts = result.counts()
    parts = [f"{counts[s]} {s}" for s in ("ok", *BAD_STATUSES) if counts.get(s)]
    return f"{len(result)} workers: {', '.join(parts) or 'none'} in {result.duration_s:.1f}s"
