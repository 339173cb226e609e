"""What SSH says about OS Login on the emulator: without TPUCTL_COMPUTE_ENDPOINT there is no
project metadata to read, which is the emulator's normal set-up (OS Login off), so a command
says nothing about it; `tpuctl doctor` still notes it. A Compute Engine endpoint that fails is
still said."""

from __future__ import annotations

from tests.cli.test_lifecycle_offline import closed_port
from tests.harness import Project

NOTE = "cannot read the project's metadata"


def test_the_emulator_without_its_compute_endpoint_is_not_said_on_every_command(
    project: Project,
) -> None:
    qr = project.create_qr(accelerator="v4-8", slices=1)
    without = {"TPUCTL_COMPUTE_ENDPOINT": ""}
    for _ in range(2):
        outcome = project.cli("ssh", qr.name, "--", "true", env=without)
        assert outcome.exit_code == 0, outcome.stderr
        assert NOTE not in outcome.stderr
    doctor = project.cli("doctor", str(qr.spec_path), "--format", "json", env=without)
    ssh = next(check for check in doctor.json()["checks"] if check["name"] == "ssh")
    assert "TPUCTL_COMPUTE_ENDPOINT is unset" in ssh["message"]
    broken = project.cli(
        "ssh",
        qr.name,
        "--",
        "true",
        env={"TPUCTL_COMPUTE_ENDPOINT": f"http://127.0.0.1:{closed_port()}"},
    )
    assert broken.exit_code == 0, broken.stderr
    assert NOTE in broken.stderr  # an endpoint that fails is worth a line
