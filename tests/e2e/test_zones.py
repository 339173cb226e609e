"""End to end: a run queued across zones (capacity.zones / --zones) in the emulator.

Sequential: the first zone has no capacity, so its queueing deadline passes; `up` deletes what
it queued there, moves on, and runs the job to the end in the second. First-active: both zones
fill at once; the job runs in exactly one of them, whatever the timing of their VMs' boots.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import FAST_UP, Job
from tests.harness import Project

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

EMPTY, FULL = "asia-east1-c", "europe-west4-b"  # zones no other test queues in


@pytest.fixture
def empty_zone(emulator: Any) -> Iterator[str]:
    """EMPTY with no v4 chips of its own (restored afterwards)."""
    before = emulator.admin.capacity(zone=EMPTY)
    emulator.admin.capacity({"v4": 0}, zone=EMPTY)
    yield EMPTY
    emulator.admin.capacity({"v4": before["v4"]["total"]}, zone=EMPTY)


def zone_of(project: Project, name: str, zone: str) -> Any:
    return project.api().in_zone(zone).find_queued_resource(name)


def run_up(job: Job, *args: str, timeout: float = 240) -> tuple[int, str]:
    log = job.spec.with_suffix(".up.log")
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tpuctl", "up", str(job.spec), *FAST_UP, *args],
            env=job.child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"tpuctl up still running:\n{log.read_text()}") from None
    return code, log.read_text()


def starts_recorded(job: Job, tmp_path: Path) -> Path:
    """Make the job's command record, per start, which queued resource's workers ran it (the
    coordinator address differs between the zones' queued resources)."""
    starts = tmp_path / "starts"
    starts.mkdir()
    starts.chmod(0o777)
    text = job.spec.read_text(encoding="utf-8")
    marker = "  command: "
    head, _, command = text.partition(marker)
    command, newline, tail = command.partition("\n")
    record = (
        f'echo "$TPUCTL_COORDINATOR_ADDRESS" > {starts}/"$TPUCTL_SLICE_ID-$TPUCTL_WORKER_ID-'
        '$TPUCTL_COORDINATOR_ADDRESS"'
    )
    job.spec.write_text(
        head + marker + json.dumps(f"{record}; {command}") + newline + tail, encoding="utf-8"
    )
    return starts


def test_sequential_moves_to_the_zone_with_capacity_and_leaves_nothing_behind(
    make_job: Callable[..., Job], project: Project, empty_zone: str
) -> None:
    job = make_job(steps=60)
    code, log = run_up(job, "--zones", f"{empty_zone},{FULL}", "--queue-timeout", "6")
    assert code == 0, log
    assert f"trying the next zone, {FULL}" in log
    assert json.loads((job.checkpoint_dir / "final.json").read_text())["step"] == job.steps
    assert zone_of(project, job.name, empty_zone) is None  # deleted at its deadline
    assert zone_of(project, job.name, FULL) is None  # deleted once done
    kinds = job.journal_kinds()
    assert kinds.count("zone.next") == 1 and kinds.count("job.done") == 1
    running = [entry for entry in job.journal() if entry.kind == "job.running"]
    assert {entry.fields.get("zone") for entry in running} == {FULL}
    report = job.cli("report", str(job.spec), "--format", "json")
    assert report.exit_code == 0, report.stderr
    parts = {(part["phase"], tuple(part["zones"])) for part in report.json()["timeline"]}
    assert ("queueing", (empty_zone,)) in parts and ("running", (FULL,)) in parts


def test_first_active_runs_the_job_in_exactly_one_zone(
    make_job: Callable[..., Job], project: Project, tmp_path: Path
) -> None:
    job = make_job(steps=60)
    starts = starts_recorded(job, tmp_path)
    code, log = run_up(
        job, "--zones", f"us-east5-b,{FULL}", "--set", "capacity.zone_policy=first-active"
    )
    assert code == 0, log
    chosen = [entry for entry in job.journal() if entry.kind == "zone.chosen"]
    assert len(chosen) == 1, job.journal_kinds()
    winner = chosen[0].fields["zone"]
    loser = FULL if winner == "us-east5-b" else "us-east5-b"
    assert zone_of(project, job.name, loser) is None and zone_of(project, job.name, winner) is None
    # Every start of the job was on the same queued resource's workers: one coordinator.
    coordinators = {path.read_text().strip() for path in starts.iterdir()}
    assert len(coordinators) == 1, sorted(path.name for path in starts.iterdir())
    assert len(list(starts.iterdir())) == 2 * 2  # 2 slices × 2 workers, each started once
    assert json.loads((job.checkpoint_dir / "final.json").read_text())["step"] == job.steps


def test_create_wait_across_zones_says_where_it_landed(project: Project, empty_zone: str) -> None:
    spec = project.spec()
    name = spec.stem
    outcome = project.cli(
        "create", str(spec), "--wait", "--zones", f"{empty_zone},{FULL}",
        "--queue-timeout", "4", "--format", "json",
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    document = outcome.json()
    assert document["zone"] == FULL and document["queued_resource"]["state"] == "ACTIVE"
    assert f"created {name} in {FULL}" in outcome.stderr
    assert zone_of(project, name, empty_zone) is None
    both = project.cli("create", str(spec), "--zone", FULL, "--zones", f"{empty_zone},{FULL}")
    assert both.exit_code == 2 and "--zone and --zones exclude one another" in both.stderr
    project.cli("delete", name, "--zone", FULL, "--force")
