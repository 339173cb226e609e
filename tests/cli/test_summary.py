"""Results at scale read at a glance: above 64 workers a table shows the workers that stand
out and one line for the rest; --all-rows draws every row, and JSON always has every worker."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tpuctl.cli.format import Style
from tpuctl.cli.views.fanout import fanout_view
from tpuctl.fanout.remote import RunState
from tpuctl.fanout.results import FanoutResult, WorkerResult
from tpuctl.fanout.targets import WorkerTarget

WORKERS = 1024
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def targets() -> list[WorkerTarget]:
    return [
        WorkerTarget(i // 16, f"job-{i // 16}", i % 16, f"10.0.{i // 16}.{i % 16}")
        for i in range(WORKERS)
    ]


def ssh_result() -> FanoutResult:
    results = [WorkerResult(target, "ok", exit_code=0) for target in targets()]
    results[5] = WorkerResult(results[5].target, "failed", exit_code=3)
    results[700] = WorkerResult(results[700].target, "unreachable", error="connection refused")
    results[1023] = WorkerResult(results[1023].target, "timeout", error="no answer in 30s")
    return FanoutResult(results, operation="ssh")


def ps_result() -> FanoutResult:
    results = []
    for target in targets():
        run = RunState("running", "r1", 100 + target.worker, None, started=NOW)
        results.append(WorkerResult(target, "ok", exit_code=0, detail=run))
    results[9].detail = RunState("exited", "r1", 109, 1, started=NOW, last_line="boom")
    results[10] = WorkerResult(results[10].target, "unreachable", error="no route")
    return FanoutResult(results, operation="ps", run="r1")


@pytest.mark.parametrize("width", [None, 120])
def test_1024_results_are_the_odd_ones_and_one_line_for_the_rest(width: int | None) -> None:
    lines = fanout_view(ssh_result(), Style(width=width, now=NOW)).splitlines()
    assert len(lines) == 1 + 3 + 2  # header, the 3 that were not ok, the rest, the summary
    assert [line.split()[0] for line in lines[1:4]] == ["0/5", "43/12", "63/15"]
    assert lines[4].startswith("… 1021 more workers ok (--all-rows shows every row)")
    assert lines[5].startswith("1024 workers: 1021 ok, 1 failed, 1 unreachable, 1 timeout")


def test_ps_summarises_the_state_most_workers_share() -> None:
    lines = fanout_view(ps_result(), Style(width=None, now=NOW)).splitlines()
    assert len(lines) == 1 + 2 + 2
    assert lines[1].split()[0] == "0/9" and "exited" in lines[1] and "boom" in lines[1]
    assert lines[2].split()[0] == "0/10" and "UNREACHABLE" in lines[2]
    assert lines[3].startswith("… 1022 more workers running (--all-rows shows every row)")


def test_all_rows_draws_every_worker_and_json_has_every_worker() -> None:
    result = ssh_result()
    lines = fanout_view(result, Style(width=None, all_rows=True, now=NOW)).splitlines()
    assert len(lines) == 1 + WORKERS + 1
    assert len(result.to_dict()["workers"]) == WORKERS
