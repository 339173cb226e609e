"""Views of a fan-out result: one row per worker (or, above SUMMARY_THRESHOLD workers, only the
ones that stand out and one line for the rest), the operation's own columns, a summary.

What stands out: for commands, a worker that was not ok; for ps and the job probes, a worker
whose state is not the one most workers share (1,020 `running` are one line; the 4 that
`exited 1` and the one UNREACHABLE are rows)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from tpuctl.cli.format import MISSING, Style, value
from tpuctl.cli.views.table import Column, render
from tpuctl.clock import parse_rfc3339
from tpuctl.fanout.remote import RunState
from tpuctl.fanout.results import FanoutResult, WorkerResult

# Above this many workers a table shows the workers that were not ok, and one line for the rest.
SUMMARY_THRESHOLD = 64
BAD_STATUSES = (
    "failed",
    "unreachable",
    "timeout",
    "hostkey-mismatch",
    "hostkey-unknown",
    "auth-failed",
    "interrupted",
)
Detail = Callable[[WorkerResult, Style], list[object]]

BASE = (
    Column("WORKER", identity=True),
    Column("NODE", identity=True, wide=True),
    Column("ADDRESS", wide=True),
    Column("STATUS"),
    Column("EXIT", align="right"),
    Column("TIME", align="right", drop=1),
)
NOTE = Column("LAST OUTPUT / ERROR", shrink=True)


def _run_state(worker: WorkerResult, _style: Style) -> list[object]:
    detail = worker.detail
    if not isinstance(detail, RunState):
        return [MISSING, MISSING, MISSING]
    return [value(detail.run), value(detail.pid), detail.describe()]


def _delivery(worker: WorkerResult, _style: Style) -> list[object]:
    detail = worker.detail
    if detail is None:
        return [MISSING, MISSING, MISSING]
    return [value(detail.startup), value(detail.pid), value(getattr(detail, "stopped", None))]


# operation → (its detail columns, how a worker's detail fills them), after the SSH columns
DETAILS: dict[str, tuple[tuple[Column, ...], Detail]] = {
    "detach": ((Column("RUN", drop=3), Column("PID", drop=2), Column("STATE")), _run_state),
    "stop": ((Column("RUN", drop=3), Column("PID", drop=2), Column("STATE")), _run_state),
    "deliver": ((Column("STARTUP"), Column("PID", drop=2), Column("STOPPED")), _delivery),
    "restart": ((Column("STARTUP"), Column("PID", drop=2), Column("STOPPED")), _delivery),
}


# ------------------------------------------------------------------------------- probes
# ps and ps --job answer what a person asks of a run (its state, pid, start, exit, last line),
# not how the SSH call that read it went: that shows only when it failed, in STATE.

PROBE_HEAD = (
    Column("WORKER", identity=True),
    Column("NODE", identity=True, wide=True),
    Column("ADDRESS", wide=True),
)
PROBE_TAIL = (Column("TIME", align="right", wide=True), Column("LAST OUTPUT", shrink=True))


def _probe_failed(worker: WorkerResult) -> str | None:
    return None if worker.ok else worker.status.upper()


def _ps_row(worker: WorkerResult, style: Style) -> list[object]:
    run = worker.detail if isinstance(worker.detail, RunState) else None
    failed = _probe_failed(worker)
    return [
        value(run.run if run else None),
        failed or (run.state if run else MISSING),
        value(run.pid if run else None),
        style.time(run.started if run else None),
        value(run.exit_code if run else None),
        f"{worker.duration_s:.1f}s",
        worker.error if failed else (run.last_line if run and run.last_line else ""),
    ]


def job_cells(job: Any, style: Style) -> list[object]:
    """STATE, BOOT, PID, STARTED, EXIT, HEARTBEAT of a WorkerJobStatus (ps --job, status
    --jobs)."""
    heartbeat = job.heartbeat_age_s
    return [
        job.state,
        value(job.boot),
        MISSING if job.pid is None else f"{job.pid}{'' if job.trainer_alive else ' (gone)'}",
        style.time(parse_rfc3339(job.started)),
        value(job.exit_code),
        MISSING if heartbeat is None else style.duration(heartbeat) + " ago",
    ]


def job_note(job: Any) -> str:
    """What to say of a job in a word: why it ended or failed, else its log's last line."""
    return str(job.error or job.reason or job.last_line or "")


def _job_row(worker: WorkerResult, style: Style) -> list[object]:
    job = worker.detail
    failed = _probe_failed(worker)
    if job is None or failed:
        cells = [failed or MISSING, *[MISSING] * 5]
        return [*cells, f"{worker.duration_s:.1f}s", worker.error or ""]
    return [*job_cells(job, style), f"{worker.duration_s:.1f}s", job_note(job)]


# A job's columns (ps --job, status --jobs); a narrow terminal leaves out the pid first.
JOB_STATUS_COLUMNS = (
    Column("STATE"),
    Column("BOOT", align="right", drop=3),
    Column("PID", drop=4),
    Column("STARTED", drop=2),
    Column("EXIT", align="right"),
    Column("HEARTBEAT", drop=1),
)
PROBES: dict[str, tuple[tuple[Column, ...], Detail]] = {
    "ps": (
        (
            Column("RUN", drop=3),
            Column("STATE"),
            Column("PID", align="right", drop=2),
            Column("STARTED", drop=1),
            Column("EXIT", align="right"),
        ),
        _ps_row,
    ),
    "job-status": (
        (*JOB_STATUS_COLUMNS,),
        _job_row,
    ),
}


def fanout_view(result: FanoutResult, style: Style) -> str:
    probe = PROBES.get(result.operation)
    shown, rest = _rows_to_show(result.results, style, probe is not None)
    if probe is not None:
        middle, fill = probe
        columns: tuple[Column, ...] = (*PROBE_HEAD, *middle, *PROBE_TAIL)
        rows = [[*_where(worker), *fill(worker, style)] for worker in shown]
    else:
        extra, detail = DETAILS.get(result.operation, ((), None))
        columns = (*BASE, *extra, NOTE)
        rows = []
        for worker in shown:
            cells: list[object] = [
                *_where(worker),
                worker.status if worker.ok else worker.status.upper(),
                value(worker.exit_code),
                f"{worker.duration_s:.1f}s",
            ]
            if detail is not None:
                cells += detail(worker, style)
            rows.append([*cells, _note(worker)])
    text = render(columns, rows, width=style.width, wide=style.wide) if rows else ""
    hidden = len(result.results) - len(shown)
    if hidden:
        text += f"… {hidden} more workers {rest} (--all-rows shows every row)\n"
    return text + summary_line(result) + "\n"


def _where(worker: WorkerResult) -> list[object]:
    target = worker.target
    return [target.label, target.node_id, target.address]


def _rows_to_show(
    workers: Sequence[WorkerResult], style: Style, probe: bool
) -> tuple[Sequence[WorkerResult], str]:
    """The rows to draw, and what the rest (summarised in one line) have in common."""
    if style.all_rows or len(workers) <= SUMMARY_THRESHOLD:
        return workers, ""
    if not probe:
        return [worker for worker in workers if not worker.ok], "ok"
    states = [(_probe_state(worker) if worker.ok else None) for worker in workers]
    common = Counter(state for state in states if state is not None).most_common(1)
    if not common:
        return workers, ""
    usual = common[0][0]
    return [w for state, w in zip(states, workers, strict=True) if state != usual], usual


def _probe_state(worker: WorkerResult) -> str:
    """What a probe found on a worker, in a word (a run's or a job's state)."""
    detail = worker.detail
    if isinstance(detail, RunState):
        return detail.describe()
    state = getattr(detail, "state", None)
    if state is None:
        return MISSING
    exit_code = getattr(detail, "exit_code", None)
    return f"{state} {exit_code}" if state == "exited" and exit_code is not None else str(state)


def _note(worker: WorkerResult) -> str:
    """Why a worker is not ok, or its last words: for a command that exited non-zero (its
    code has a column) what it last said, on stderr first."""
    said = _last_line(worker.stderr.bytes()) or _last_line(worker.stdout.bytes())
    if worker.status == "failed" and worker.error == f"exited with {worker.exit_code}":
        return said or worker.error
    return worker.error or said


def _last_line(data: bytes) -> str:
    """The output's last line; bytes that are not UTF-8 kept as surrogates, which the table
    shows as `\\xNN` (as it shows control characters), not as �."""
    lines = data.decode("utf-8", "surrogateescape").strip().split("\n")
    return lines[-1]


def summary_line(result: FanoutResult) -> str:
    counts = result.counts()
    parts = [f"{counts[s]} {s}" for s in ("ok", *BAD_STATUSES) if counts.get(s)]
    return f"{len(result)} workers: {', '.join(parts) or 'none'} in {result.duration_s:.1f}s"
