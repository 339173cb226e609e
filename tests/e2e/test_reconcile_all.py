"""End to end on the emulator: two runs whose records live under one checkpoint prefix, each
started by one `tpuctl reconcile SPEC` step (which keeps its spec in run.json), then driven to
their end by `tpuctl reconcile --all --bucket PREFIX` alone: a `${VAR}` unset in the step's
environment stops only the run that expands it, a run another supervisor holds is left alone,
`--all --project` finds both runs by their queued resources, and `tpuctl runs` tells each
run's state, who stepped it last, and flags a run nobody steps any more."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_output_contract import check
from tests.e2e.conftest import Job

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

STEP_FLAGS = ("--settle", "2", "--no-preflight")
IN_PROGRESS = 12


def _record(job: Job) -> Path:
    return job.project.tmp_path / f"ckpt-{job.name}" / "tpuctl" / job.name


def _all(job: Job, *flags: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    outcome = job.project.cli("reconcile", "--all", *flags, *STEP_FLAGS, "--format", "json",
                              env=env)  # fmt: skip
    return outcome.exit_code, outcome.json()


def test_reconcile_all_steps_every_run_under_a_prefix_each_from_its_own_spec(
    make_job: Callable[..., Job], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_job(steps=40, slices=1, accelerator="v4-8", conventionless=True)
    second = make_job(steps=40, slices=1, accelerator="v4-8", conventionless=True)
    text = second.spec.read_text().replace("--steps 40", "--steps ${TOY_STEPS}")
    second.spec.write_text(text)
    variable = {"TOY_STEPS": "40"}
    for job, env in ((first, {}), (second, variable)):
        outcome = job.project.cli("reconcile", str(job.spec), *STEP_FLAGS, "--keep",
                                  "--format", "json", env=env)  # fmt: skip
        assert outcome.exit_code == IN_PROGRESS, outcome.stderr
        assert outcome.json()["record_url"] == str(_record(job))
    # The run's own spec, as written, beside its record: the variable's name, not its value.
    kept = json.loads((_record(second) / "run.json").read_text())
    assert kept["spec"] == text and kept["variables"] == ["TOY_STEPS"]
    assert kept["source"] == str(second.spec) and kept["options"] == {
        "keep": True,
        "settle": 2.0,
        "no_preflight": True,
    }
    assert (kept["name"], kept["zones"]) == (second.name, ["us-central2-b"])

    # Found by their queued resources too: the record's location is in the nodes' metadata.
    project = first.project.name
    listed = first.project.cli("runs", "--project", project, "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    by_project = {row["name"]: row for row in listed.json()["runs"]}
    assert set(by_project) == {first.name, second.name}
    assert by_project[first.name]["record_url"] == str(_record(first))
    assert by_project[first.name]["queued_resources"][0]["source"] == "api"

    # Without TOY_STEPS here, the second run cannot be stepped; the first goes on.
    code, document = _all(first, "--bucket", str(tmp_path))
    check(document, "reconcile --all")
    assert code == 2, document
    [error] = document["errors"]
    assert error["name"] == second.name and "TOY_STEPS" in error["message"]
    assert [run["name"] for run in document["runs"]] == [first.name]

    # A run another supervisor holds is left alone (in progress); the other is stepped.
    from tpuctl.storage.lease import Lease
    from tpuctl.storage.locations import open_location

    lease = Lease(open_location(str(_record(first))), "lease.json", command="tpuctl up x.yaml",
                  stale_after=600, hostname="another-machine")  # fmt: skip
    lease.acquire()
    try:
        code, document = _all(first, "--bucket", str(tmp_path), env=variable)
    finally:
        lease.release()
    runs = {run["name"]: run for run in document["runs"]}
    assert runs[first.name]["held_by"] and runs[first.name]["written"] == []
    assert runs[second.name]["held_by"] is None and code == IN_PROGRESS

    # `--project` finds the same two runs.
    code, document = _all(first, "--project", project, env=variable)
    assert sorted(run["name"] for run in document["runs"]) == sorted([first.name, second.name])

    # Nothing but `--all` steps from now on, until both are done.
    for _ in range(200):
        code, document = _all(first, "--bucket", str(tmp_path), env=variable)
        if code not in (IN_PROGRESS, 11):
            break
        time.sleep(0.5)  # a scheduler's pace, sped up
    assert code == 0, json.dumps(document, indent=1)[:6000]
    assert {run["outcome"] for run in document["runs"]} == {"done"}
    monkeypatch.setenv("TOY_STEPS", "40")  # to read the second spec here
    for job in (first, second):
        kinds = job.journal_kinds()
        assert kinds[0] == "run.start" and kinds[-1] == "run.done", kinds
        assert (job.checkpoint_dir / "final.json").read_bytes() == job.uninterrupted_final(tmp_path)

    listed = first.project.cli("runs", "--bucket", str(tmp_path), "--format", "json")
    document = listed.json()
    check(document, "runs")
    rows = {row["name"]: row for row in document["runs"]}
    for job in (first, second):
        row = rows[job.name]
        assert row["state"] == "done" and not row["unsupervised"], row
        assert row["last_reconciled"]["by"] == "reconcile"
        assert row["goodput"] is not None and 0 < row["goodput"] <= 1
        # Kept (--keep, recorded at the first step and kept by --all): its record says so.
        assert [q["state"] for q in row["queued_resources"]] == ["ACTIVE"], row
    live = first.project.cli("runs", "--bucket", str(tmp_path), "--live", "--format", "json")
    assert {row["queued_resources"][0]["source"] for row in live.json()["runs"]} == {"api"}
    for job in (first, second):
        assert job.cli("delete", str(job.spec), "--force", "--yes").exit_code == 0


def test_runs_flags_a_run_nobody_reconciles_any_more(make_job: Callable[..., Job]) -> None:
    job = make_job(steps=400, slices=1, accelerator="v4-8")
    outcome = job.cli("reconcile", str(job.spec), *STEP_FLAGS)
    assert outcome.exit_code == IN_PROGRESS, outcome.stderr
    bucket = str(job.project.tmp_path)
    fresh = job.cli("runs", "--bucket", bucket, "--format", "json").json()["runs"]
    assert [(row["state"], row["unsupervised"]) for row in fresh] == [("in_progress", False)]
    # Its last step is older than --stale-after: the scheduler that took it stopped.
    stale = job.cli("runs", "--bucket", bucket, "--stale-after", "1ms")
    assert stale.exit_code == 0, stale.stderr
    assert "in progress !" in stale.stdout
    assert f"tpuctl supervise {job.spec} --on cron --install" in stale.stdout
    row = job.cli("runs", "--bucket", bucket, "--stale-after", "1ms", "--format", "json").json()
    assert row["runs"][0]["unsupervised"] and "stopped" in row["runs"][0]["advice"]
    assert job.cli("delete", str(job.spec), "--force", "--yes").exit_code == 0
