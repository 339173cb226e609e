"""End to end on Compute Engine (`tpu.api: compute`): `tpuctl up` babysits the toy trainer on
TPU VMs of the emulator's Compute Engine fake through what that platform does to them (a spot
preemption), to the result of a run never disturbed, with nothing left behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Job
from tests.emulator.compute_helpers import Compute
from tests.harness import ZONE
from tests.support import wait_for

# Its checks use google-cloud-compute's clients: tests/order.py keeps it on few processes.
pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.compute_library]
IMAGE_FAMILY = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


def left_in(emulator: Any, project: str) -> list[str]:
    """Every instance, template and MIG the project still has on Compute Engine."""
    compute = Compute(emulator, project)
    names = [i.name for i in compute.instances.list(project=project, zone=ZONE)]
    names += [t.name for t in compute.client("InstanceTemplatesClient").list(project=project)]
    groups = compute.client("InstanceGroupManagersClient")
    return names + [g.name for g in groups.list(project=project, zone=ZONE)]


def compute_job(make_job: Callable[..., Job], accelerator: str, **options: Any) -> Job:
    """A toy-trainer job on Compute Engine TPU VMs (no Autocheckpoint there); with
    `tier="flex-start"`, runs of 10 emulated minutes (30 s at the session emulator's speed)."""
    job = make_job(
        slices=1,
        accelerator=accelerator,
        api="compute",
        runtime=IMAGE_FAMILY,
        autocheckpoint=False,
        **options,
    )
    if options.get("tier") == "flex-start":
        flex = "  tier: flex-start\n  max_run_duration: 10m\n"
        job.spec.write_text(job.spec.read_text().replace("  tier: flex-start\n", flex))
    return job


def test_a_spot_vm_preempted_is_made_again_and_the_job_resumes_to_its_end(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = compute_job(make_job, "v6e-4", steps=90, checkpoint_every=10, max_preemptions=2)
    job.start_up()
    wait_for(lambda: any(step >= 20 for step in job.complete_steps()), what="steps 20+")
    project = job.env["TPUCTL_PROJECT"]
    emulator.admin.compute_preempt(f"projects/{project}/zones/{ZONE}/instances/{job.name}")
    code, log = job.wait_up()
    assert code == 0, log
    assert "SUSPENDED" in log, log
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert json.loads(final)["history"] == [[1, job.steps]]
    kinds = job.journal_kinds()
    for kind in ("preemption.detected", "qr.deleted", "qr.recreated", "job.done", "up.exit"):
        assert kind in kinds, (kind, kinds)
    assert left_in(emulator, project) == []


def test_a_flex_start_v5p_slice_rides_out_maintenance_and_its_run_end_to_the_job_s_end(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    # 10 emulated minutes of run at the session emulator's speed (20) are 30 s of real time;
    # the trainer is stopped 15 s before each end (the grace), and needs about 20 s of
    # training: a run ends before the job does.
    job = compute_job(
        make_job, "v5p-16", steps=200, step_seconds=0.1, checkpoint_every=25, tier="flex-start"
    )
    job.start_up()
    wait_for(lambda: any(step >= 25 for step in job.complete_steps()), what="steps 25+")
    project = job.env["TPUCTL_PROJECT"]
    group = f"projects/{project}/zones/{ZONE}/instanceGroupManagers/{job.name}"
    since = emulator.admin.events()[-1]["seq"] if emulator.admin.events() else 0
    emulator.admin.compute_maintenance(group, at=20)
    # The maintenance is announced: the trainers stop to save before its window (there is
    # no Autocheckpoint on Compute Engine: the startup script reads the notice).
    vms = Path(emulator.state_dir) / "vms"

    def boot_logs() -> str:
        found = vms.glob(f"{job.name}-*/0/var/log/tpuctl/*/boot-*.log")
        return "".join(path.read_text(errors="replace") for path in found)

    wait_for(lambda: "host maintenance at" in boot_logs(), 30, "the trainers stopped for it")
    code, log = job.wait_up(timeout=300)
    assert code == 0, log
    started = [
        event
        for event in emulator.admin.events(since)
        if event["kind"] == "compute.maintenance.start" and job.name in event.get("node", "")
    ]
    assert len(started) == 2, started
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert json.loads(final)["history"] == [[1, job.steps]]
    kinds = job.journal_kinds()
    assert "job.done" in kinds and "up.exit" in kinds, kinds
    assert "run.ended" in kinds, kinds
    assert left_in(emulator, project) == []
    policies = Compute(emulator, project).client("ResourcePoliciesClient")
    assert [p.name for p in policies.list(project=project, region=ZONE.rsplit("-", 1)[0])] == []


def test_a_single_flex_start_vm_deleted_at_its_run_s_end_is_a_run_end_not_a_preemption(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = compute_job(
        make_job,
        "v6e-4",
        steps=160,
        step_seconds=0.1,
        checkpoint_every=20,
        tier="flex-start",
        max_preemptions=0,  # a run end counted as a preemption would give up
    )
    job.start_up()
    code, log = job.wait_up(timeout=300)
    assert code == 0, log
    kinds = job.journal_kinds()
    assert "run.ended" in kinds and "preemption.detected" not in kinds, kinds
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert left_in(emulator, job.env["TPUCTL_PROJECT"]) == []


def _drill(job: Job, kind: str) -> dict[str, Any]:
    outcome = job.cli(
        "drill", str(job.spec), "--kind", kind, "--external-recovery", "--timeout", "90",
        "--format", "json",
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stdout + outcome.stderr
    report: dict[str, Any] = outcome.json()
    assert report["ok"] is True and report["resumed_from"] is not None, report
    return report


@pytest.mark.parametrize(("kind", "tier"), [("preempt", "spot"), ("maintenance", "on-demand")])
def test_a_drill_on_a_compute_slice(make_job: Callable[..., Job], kind: str, tier: str) -> None:
    # A preempted spot VM is made again (a new disk); a standard VM maintained comes back on
    # its disk (instances.simulateMaintenanceEvent), its startup script relaunching the job.
    job = compute_job(make_job, "v6e-4", steps=300, checkpoint_every=10, tier=tier)
    job.start_up()
    job.wait_running()
    report = _drill(job, kind)
    boots_before, boots_after = report["boots_before"], report["boots_after"]
    assert boots_after["0/0"] == (1 if kind == "preempt" else boots_before["0/0"] + 1), report
    code, log = job.wait_up()
    assert code == 0, log
    assert ("qr.recreated" in job.journal_kinds()) == (kind == "preempt")
