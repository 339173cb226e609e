"""Runs found by their records: run.json read back, record directories found under a location,
the exit code of `reconcile --all`, and the row `tpuctl runs` shows for one record (its state,
its last step, and the flag on a run nobody steps any more)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuctl.clock import rfc3339
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.jobs.reconcile.discover import FoundRun, is_record_dir, runs_under
from tpuctl.jobs.reconcile.step import ReconcileResult, RunError, reconciles_code
from tpuctl.jobs.reconcile.store import RunFile, read_run_file
from tpuctl.jobs.runs import run_row
from tpuctl.storage.journal import Journal
from tpuctl.storage.locations import open_location

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
RUN = RunFile(
    name="job",
    run="job",
    spec="apiVersion: tpuctl/v1\nname: job\n",
    source="/home/me/job.yaml",
    project="p",
    zone="us-central2-b",
    zones=("us-central2-b",),
    overrides=("tpu.slices=2",),
    variables=("HF_TOKEN",),
    options={"keep": True},
)


def test_run_json_reads_back_what_was_written_and_refuses_what_it_is_not(tmp_path: Path) -> None:
    storage = open_location(str(tmp_path))
    storage.write_text("run.json", json.dumps(RUN.to_dict()))
    assert read_run_file(storage) == RUN
    storage.write_text("run.json", json.dumps({**RUN.to_dict(), "version": 99}))
    with pytest.raises(TpuctlError, match="not one this tpuctl wrote"):
        read_run_file(storage)
    storage.write_text("run.json", json.dumps({"version": 1, "name": "job"}))
    with pytest.raises(TpuctlError, match="lacks"):
        read_run_file(storage)


def test_records_are_found_under_a_location_and_nothing_else(tmp_path: Path) -> None:
    for path in ("team/a/tpuctl/one/run.json", "team/b/deep/tpuctl/two/run.json",
                 "team/a/checkpoints/run.json", "team/a/tpuctl/one/journal/run.json"):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    found = runs_under(str(tmp_path / "team"))
    assert [run.url for run in found.runs] == [
        str(tmp_path / "team/a/tpuctl/one"),
        str(tmp_path / "team/b/deep/tpuctl/two"),
    ]
    # The record directory itself is a location too.
    assert [run.url for run in runs_under(str(tmp_path / "team/a/tpuctl/one")).runs] == [
        str(tmp_path / "team/a/tpuctl/one")
    ]
    assert runs_under(str(tmp_path / "nowhere")).runs == []
    assert is_record_dir("gs://b/x/tpuctl/run/") and not is_record_dir("gs://b/x/run")


def _result(name: str, outcome: str, code: int) -> ReconcileResult:
    return ReconcileResult(name=name, outcome=outcome, code=code, message="", action="wait")


def test_reconcile_all_exits_with_what_a_scheduler_must_act_on() -> None:
    going, done = _result("a", "in_progress", 12), _result("b", "done", 0)
    down = _result("c", "in_progress", 11)
    spent, failed = _result("d", "given_up", 7), _result("e", "given_up", 3)
    unset = RunError("f", "/r/f", "spec", "environment variable X is not set", None, 2)
    zone = RunError(None, None, "api_unavailable", "zone z: unavailable", None, 11)
    assert reconciles_code([], []) == ExitCode.OK
    assert reconciles_code([done], []) == ExitCode.OK
    assert reconciles_code([done, going], []) == ExitCode.IN_PROGRESS
    assert reconciles_code([going, down], []) == ExitCode.API_UNAVAILABLE
    assert reconciles_code([going], [zone]) == ExitCode.API_UNAVAILABLE
    assert reconciles_code([going, down, failed, spent], []) == ExitCode.PREEMPTED
    assert reconciles_code([going], [unset]) == ExitCode.USAGE
    assert reconciles_code([failed], [unset]) == ExitCode.COMMAND_FAILED


def _record(tmp_path: Path, *kinds: str, beat_age: float | None) -> Path:
    record = tmp_path / "ckpt" / "tpuctl" / "job"
    record.mkdir(parents=True)
    (record / "run.json").write_text(json.dumps(RUN.to_dict()))
    journal = Journal(None, url=str(record / "journal"))
    for kind in kinds:
        fields = {"zone": "us-central2-b", "state": "ACTIVE"} if kind == "qr.state" else {}
        if kind == "run.gave_up":
            fields = {"error": {"kind": "preempted", "exit_code": 7, "message": "budget spent"}}
        journal.append(kind, **fields)
    if beat_age is not None:
        beat = {"at": rfc3339(NOW - timedelta(seconds=beat_age)), "host": "sched-1",
                "by": "reconcile", "pid": 7, "action": "wait", "latest_step": 120}  # fmt: skip
        (record / "supervisor.json").write_text(json.dumps(beat))
    workers = record / "workers"
    workers.mkdir()
    state = {"version": 1, "slice": 0, "worker": 0, "state": "running", "last_step": 130}
    (workers / "0-0.json").write_text(json.dumps(state))
    return record


def test_a_run_in_progress_that_nobody_steps_is_flagged_with_what_to_do(tmp_path: Path) -> None:
    record = _record(tmp_path, "run.start", "qr.created", "qr.state", beat_age=900)
    row = run_row(FoundRun(str(record)), now=NOW, stale_after=600)
    assert (row.name, row.state, row.project, row.source) == (
        "job", "in_progress", "p", "/home/me/job.yaml",
    )  # fmt: skip
    assert row.unsupervised and row.advice is not None
    assert "for 15m" in row.advice and "reconcile on sched-1" in row.advice
    assert "tpuctl supervise /home/me/job.yaml --on cron --install" in row.advice
    assert (row.latest_step, row.last_step) == (120, 130)
    assert [(q.zone, q.state, q.source) for q in row.queued_resources] == [
        ("us-central2-b", "ACTIVE", "record")
    ]
    fresh = run_row(FoundRun(str(record)), now=NOW, stale_after=1800)
    assert not fresh.unsupervised and fresh.advice is None
    assert fresh.last_reconciled is not None and fresh.last_reconciled.by == "reconcile"


def test_a_run_that_gave_up_says_why_and_is_not_flagged(tmp_path: Path) -> None:
    record = _record(tmp_path, "run.start", "run.gave_up", beat_age=None)
    row = run_row(FoundRun(str(record)), now=NOW, stale_after=600)
    assert (row.state, row.why, row.exit_code, row.unsupervised) == (
        "given_up", "budget spent", 7, False,
    )  # fmt: skip
    assert row.last_reconciled is None


def test_a_record_without_run_json_is_still_a_row(tmp_path: Path) -> None:
    record = _record(tmp_path, "run.start", beat_age=None)
    (record / "run.json").unlink()
    row = run_row(FoundRun(str(record)), now=NOW)
    assert row.name == "job" and row.error is not None and "run.json" in row.error
    assert row.unsupervised and "tpuctl supervise SPEC" in (row.advice or "")


def test_a_found_run_s_spec_loads_again_with_this_environment_s_variables() -> None:
    from dataclasses import replace

    from tpuctl.errors import SpecError, UsageError
    from tpuctl.jobs.reconcile.discover import load_run_spec

    text = (
        "apiVersion: tpuctl/v1\nname: job\ntpu:\n  accelerator: v4-8\n"
        "  runtime: tpu-ubuntu2204-base\ncheckpoint:\n  dir: gs://b/${TEAM}\n"
        "job:\n  command: train --token ${TOKEN}\n"
    )
    run = replace(
        RUN, spec=text, variables=("TEAM", "TOKEN"), zones=("us-central2-b", "us-east5-a")
    )
    env = {"TEAM": "ml", "TOKEN": "t0"}
    loaded = load_run_spec(run, "gs://b/ml/tpuctl/job", environ=env)
    assert loaded.spec.zones == ("us-central2-b", "us-east5-a") and loaded.spec.tpu.slices == 2
    assert loaded.spec.job is not None and loaded.spec.job.command == "train --token t0"
    with pytest.raises(SpecError, match="TOKEN is not set"):
        load_run_spec(run, "gs://b/ml/tpuctl/job", environ={"TEAM": "ml"})
    with pytest.raises(UsageError, match="another record directory, gs://b/ops/tpuctl/job"):
        load_run_spec(run, "gs://b/ml/tpuctl/job", environ={**env, "TEAM": "ops"})
