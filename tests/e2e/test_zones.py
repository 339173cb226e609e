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


# --- a multi-zone spec's queued resource, found wherever it is --------------------------------


def zones_spec(project: Project, zones: str, policy: str = "sequential", extra: str = "") -> Path:
    # project.spec ends inside its `capacity:` block.
    return project.spec(extra=f"  zones: [{zones}]\n  zone_policy: {policy}\n{extra}")


def test_create_wait_first_active_keeps_the_first_and_reports_it(project: Project) -> None:
    """zone_policy first-active under `create --wait`: the first ACTIVE is kept and reported
    (the document names its zone and state), every other zone is left empty."""
    first, second = "us-east5-b", FULL
    spec = zones_spec(project, f"{first}, {second}", "first-active")
    name = spec.stem
    outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    assert outcome.exit_code == 0, outcome.stderr
    document = outcome.json()
    winner = document["zone"]
    assert winner in (first, second), document
    assert document["queued_resource"]["state"] == "ACTIVE"
    assert document["queued_resource"]["zone"] == winner
    assert document["wait"]["state"] == "ACTIVE"
    loser = second if winner == first else first
    assert zone_of(project, name, loser) is None
    assert zone_of(project, name, winner) is not None
    status = project.cli("status", str(spec), "--format", "json")
    assert status.exit_code == 0, status.stderr
    assert status.json()["zone"] == winner
    deleted = project.cli("delete", str(spec), "--yes", "--force")
    assert deleted.exit_code == 0, deleted.stderr
    assert zone_of(project, name, winner) is None


def test_every_command_finds_a_multi_zone_spec_s_queued_resource_in_its_second_zone(
    project: Project, empty_zone: str, tmp_path: Path
) -> None:
    spec = zones_spec(project, f"{empty_zone}, {FULL}")
    name = spec.stem
    created = project.cli("create", str(spec), "--wait", "--queue-timeout", "4")
    assert created.exit_code == 0, created.stderr
    assert zone_of(project, name, FULL) is not None and zone_of(project, name, empty_zone) is None

    def ok(*args: str) -> Any:
        outcome = project.cli(*args)
        assert outcome.exit_code == 0, (args, outcome.stdout, outcome.stderr)
        return outcome

    assert ok("status", str(spec), "--format", "json").json()["zone"] == FULL
    again = ok("create", str(spec), "--format", "json").json()  # no second one in the first
    assert (again["action"], again["zone"]) == ("exists", FULL)
    assert zone_of(project, name, empty_zone) is None
    assert ok("describe", str(spec), "--format", "json").json()["zone"] == FULL
    assert ok("wait", str(spec), "--format", "json").json()["state"] == "ACTIVE"
    ran = ok("ssh", str(spec), "--format", "json", "--", "echo", "here")
    assert {worker["exit_code"] for worker in ran.json()["workers"]} == {0}
    ok("ssh", str(spec), "--detach", "--", "sleep 30")
    ok("ps", str(spec))
    ok("logs", str(spec))
    ok("stop", str(spec))
    source = tmp_path / "payload"
    source.mkdir()
    (source / "data.txt").write_text("payload\n", encoding="utf-8")
    ok("upload", str(spec), str(source), "payload")
    ok("download", str(spec), "payload/data.txt", str(tmp_path / "back"))
    assert (tmp_path / "back" / "data.txt").read_text(encoding="utf-8") == "payload\n"
    ok("reset", str(spec), "--wait")
    # Not found anywhere: every zone asked is named.
    missing = project.cli("status", str(zones_spec(project, f"{empty_zone}, {FULL}")))
    assert missing.exit_code == 5
    assert empty_zone in missing.stderr and FULL in missing.stderr
    gone = ok("delete", str(spec), "--yes", "--force")
    assert FULL in gone.stderr
    assert zone_of(project, name, FULL) is None
    again = ok("delete", str(spec), "--yes", "--force", "--ignore-missing")
    assert "nothing to delete" in again.stdout


def test_delete_of_a_multi_zone_spec_deletes_it_in_every_zone_holding_it(
    project: Project,
) -> None:
    from tpuctl.cloud import lifecycle
    from tpuctl.jobs.provision import create_request
    from tpuctl.spec.load import load_spec

    spec_path = zones_spec(project, f"us-east5-b, {FULL}")
    spec = load_spec(spec_path, environ=project.env).spec
    for zone in ("us-east5-b", FULL):
        api = project.api().in_zone(zone)
        lifecycle.create(api, create_request(spec, api.location))
    outcome = project.cli("delete", str(spec_path), "--yes", "--force", "--format", "json")
    assert outcome.exit_code == 0, outcome.stderr
    assert sorted(outcome.json()["zones"]) == sorted(["us-east5-b", FULL])
    assert zone_of(project, spec.name, "us-east5-b") is None
    assert zone_of(project, spec.name, FULL) is None


@pytest.mark.parametrize("policy", ["sequential", "first-active"])
def test_a_zone_that_refuses_the_create_passes_the_run_to_the_next(
    project: Project, policy: str
) -> None:
    """RESOURCE_EXHAUSTED on the create (quota, stockout) is the zone saying no: nothing was
    created there, so the next zone is tried at once, and nothing claims a delete."""
    spec = zones_spec(project, f"us-east5-b, {FULL}", policy)
    project.emulator.admin.api_fault(create_exhausted=1)  # the first create, in us-east5-b
    try:
        outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    finally:
        project.emulator.admin.api_fault(create_exhausted=0)
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.json()["zone"] == FULL
    assert "us-east5-b refused the create" in outcome.stderr
    assert f"deleted {spec.stem}" not in outcome.stderr and "gave up" not in outcome.stderr
    assert zone_of(project, spec.stem, "us-east5-b") is None
    assert project.cli("delete", str(spec), "--yes", "--force").exit_code == 0


def test_every_zone_refusing_the_create_is_one_error_that_deletes_nothing(
    project: Project,
) -> None:
    spec = zones_spec(project, f"us-east5-b, {FULL}")
    project.emulator.admin.api_fault(create_exhausted=2)
    try:
        outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    finally:
        project.emulator.admin.api_fault(create_exhausted=0)
    assert outcome.exit_code == 1, outcome.stderr
    error = outcome.json()["error"]
    assert error["kind"] == "resource_exhausted"
    assert [attempt["zone"] for attempt in error["zones"]] == ["us-east5-b", FULL]
    assert f"deleted {spec.stem}" not in outcome.stderr
    assert all(zone_of(project, spec.stem, zone) is None for zone in ("us-east5-b", FULL))


def test_an_unexpected_error_after_the_create_names_what_is_left_and_how_to_delete_it(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks once a queued resource exists, the error says where it is left and
    the command that deletes it, and that command works."""
    import shlex

    from tpuctl.cloud import lifecycle

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug after the create")

    spec = zones_spec(project, f"us-east5-b, {FULL}", "first-active")
    monkeypatch.setattr(lifecycle, "status", broken)
    outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    monkeypatch.undo()
    assert outcome.exit_code == 1, outcome.stderr
    error = outcome.json()["error"]
    assert "RuntimeError: a bug after the create" in error["message"]
    [zone] = error["left_in"]  # (the first create's own status read broke: one zone so far)
    assert f"{spec.stem} is left in {zone} (" in error["message"]
    command = error["hint"].split("delete it with: ", 1)[1].split(";", 1)[0]
    words = shlex.split(command)
    assert words[:2] == ["tpuctl", "delete"] and zone in words
    assert project.cli(*words[1:]).exit_code == 0
    assert zone_of(project, spec.stem, zone) is None


def test_delete_never_reports_success_while_a_zone_could_not_be_asked(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zone that refuses to answer (here: permission denied in us-east5-b, which the
    emulator cannot refuse by itself) may hold the queued resource: `delete` deletes it where
    it is found, and still fails, naming the zone; `--ignore-missing` does not hide it."""
    from tpuctl.cloud.client import TpuApi
    from tpuctl.errors import AuthError

    spec = zones_spec(project, f"us-east5-b, {FULL}")
    created = project.cli("create", str(spec), "--zone", FULL, "--wait")
    assert created.exit_code == 0, created.stderr
    real = TpuApi.get_queued_resource

    def refused(self: TpuApi, queued_resource_id: str) -> Any:
        if self.location.zone == "us-east5-b":
            raise AuthError("get: permission denied in us-east5-b")
        return real(self, queued_resource_id)

    monkeypatch.setattr(TpuApi, "get_queued_resource", refused)
    status = project.cli("status", str(spec), "--format", "json")
    assert status.exit_code == 0 and status.json()["zone"] == FULL
    assert "zone us-east5-b: get: permission denied" in status.stderr
    outcome = project.cli("delete", str(spec), "--yes", "--force", "--format", "json")
    assert outcome.exit_code == 8, outcome.stdout
    error = outcome.json()["error"]
    assert error["deleted_in"] == [FULL] and error["left_in"] == ["us-east5-b"]
    assert "tpuctl delete" in error["hint"] and "us-east5-b" in error["hint"]
    assert zone_of(project, spec.stem, FULL) is None
    missing = project.cli("delete", str(spec), "--yes", "--ignore-missing", "--format", "json")
    assert missing.exit_code == 8, missing.stdout
    assert "us-east5-b" in missing.json()["error"]["message"]


def test_one_zone_refusing_the_create_says_nothing_was_created(project: Project) -> None:
    spec = project.spec()
    project.emulator.admin.api_fault(create_exhausted=1)
    try:
        outcome = project.cli("create", str(spec), "--wait", "--format", "json")
    finally:
        project.emulator.admin.api_fault(create_exhausted=0)
    assert outcome.exit_code == 1, outcome.stderr
    error = outcome.json()["error"]
    assert (error["kind"], error["created"]) == ("resource_exhausted", False)
    assert "refused the create" in error["message"] and "nothing was created" in error["message"]
    assert "capacity.zones" in error["hint"]
    assert not project.qr_exists(spec.stem)
