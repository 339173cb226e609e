"""What a hostile user feeds tpuctl: endless input, values YAML reads by surprise, names a shell
would interpret, a deadline already gone. Each ends in exit 2 and one line, never a crash, a
silent default or an unquoted suggestion."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.cli.conftest import InvokeCli, WriteSpec
from tests.harness import ZONE, Project, unique
from tests.jobs.fakes import FakeClock, FakeJobs, FakeJournal, FakeQr, FakeRecord, fleet
from tests.jobs.fakes import spec as fake_spec
from tests.support import Outcome, child_environment
from tpuctl.cli.targets import up_command
from tpuctl.errors import Interrupted
from tpuctl.jobs.job_watch import logs_command
from tpuctl.jobs.up import Babysitter, UpOptions
from tpuctl.spec.yamlsource import MAX_SPEC_CHARS

# A tpuctl that reads without bound dies of MemoryError under this cap instead of taking the
# machine's memory with it; `tpuctl validate` itself needs a small fraction of it.
MEMORY_CAP = 1 << 30


# The cap is set by the child itself before it becomes tpuctl: a preexec_fn would run in a fork
# of this (threaded, gRPC-loaded) test process, where gRPC's fork handler can abort the child.
_CAPPED = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP})); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _validate_in_child(
    spec: str, tmp_path: Path, stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CAPPED, "-m", "tpuctl", "validate", spec],
        cwd=tmp_path,
        env=child_environment(),
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line_naming(done: subprocess.CompletedProcess[str], source: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {source}: "), lines[0]
    assert f"{MAX_SPEC_CHARS >> 20} MiB" in lines[0]
    assert done.stdout == ""


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_validate_dev_zero_stops_at_the_limit(tmp_path: Path) -> None:
    _one_line_naming(_validate_in_child("/dev/zero", tmp_path), "/dev/zero")


def test_validate_an_endless_stdin_stops_at_the_limit(tmp_path: Path) -> None:
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        assert yes.stdout is not None
        done = _validate_in_child("-", tmp_path, stdin=yes.stdout.fileno())
    finally:
        yes.kill()
        yes.wait()
    _one_line_naming(done, "<stdin>")


def test_validate_a_large_file_names_it(cli: InvokeCli, write_spec: WriteSpec) -> None:
    path = write_spec("#" * (MAX_SPEC_CHARS + 1))
    outcome = cli(["validate", str(path)])
    assert outcome.exit_code == 2
    assert outcome.stderr.count("\n") == 1
    assert f"{path}: spec is too large" in outcome.stderr


# --- values that would have become something else ---------------------------------------------

SPEC = """\
apiVersion: tpuctl/v1
name: demo
tpu:
  accelerator: v4-8
  runtime: tpu-ubuntu2204-base
"""


def _one_error_line(outcome: Outcome, *parts: str) -> str:
    assert outcome.exit_code == 2, outcome.stderr
    assert outcome.stdout == ""
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_null_slices_is_an_error(cli: InvokeCli, write_spec: WriteSpec) -> None:
    path = write_spec(SPEC + "  slices: null\n")
    _one_error_line(cli(["validate", str(path)]), f"{path}:6:", "tpu.slices: has no value")


@pytest.mark.parametrize(
    ("override", "says"),
    [("tpu.slices=", "has no value"), ("tpu.slices=010", "'010' is not a decimal integer")],
)
def test_an_empty_or_octal_override_is_an_error(
    cli: InvokeCli, write_spec: WriteSpec, override: str, says: str
) -> None:
    outcome = cli(["validate", str(write_spec(SPEC)), "--set", override])
    _one_error_line(outcome, f"--set {override}: tpu.slices: {says}")


def test_a_queueing_deadline_already_gone_is_an_error(
    cli: InvokeCli, write_spec: WriteSpec
) -> None:
    path = write_spec(SPEC + "capacity:\n  valid_until: 2001-01-01T00:00:00Z\n")
    for command in (["validate"], ["render", "--what", "gcloud"]):
        line = _one_error_line(cli([*command, str(path)]), f"{path}:7:", "capacity.valid_until")
        assert " ago" in line and "2001-01-01T00:00:00Z" in line


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--project", "$(touch owned)"], {}, "--project"),
        (["--zone", "us-central2-b\nrm -rf ~"], {}, "--zone"),
        ([], {"TPUCTL_PROJECT": "my project"}, "TPUCTL_PROJECT"),
        ([], {"TPUCTL_ZONE": "us-central2-b;id"}, "TPUCTL_ZONE"),
    ],
)
def test_a_project_or_zone_a_shell_would_run_is_refused(
    cli: InvokeCli, write_spec: WriteSpec, args: list[str], env: dict[str, str], names: str
) -> None:
    path = write_spec(SPEC)
    base = {"TPUCTL_PROJECT": "my-project", "TPUCTL_ZONE": "us-central2-b"}
    for command in (["render", str(path)], ["status", "demo"]):
        line = _one_error_line(cli([*command, *args], env={**base, **env}), names)
        assert "not a valid" in line


# --- a gcloud configuration that cannot be read ------------------------------------------------


def test_an_unparseable_gcloud_config_is_a_warning_once(cli: InvokeCli, tmp_path: Path) -> None:
    config = tmp_path / "gcloud" / "configurations" / "config_default"
    config.parent.mkdir(parents=True)
    config.write_text("project = my-project\n[compute\nzone = us-central2-b\n")
    env = {"CLOUDSDK_CONFIG": str(config.parent.parent), "TPUCTL_PROJECT": "my-project"}
    outcome = cli(["status", "demo"], env=env)
    assert outcome.exit_code == 2  # the zone was only in the unreadable file
    lines = outcome.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 1, outcome.stderr
    assert str(config) in warnings[0] and "line 1" in warnings[0]
    assert "no zone found" in lines[-1] and len(lines) == 2


# --- commands tpuctl tells a person to run -----------------------------------------------------


def test_create_suggests_up_with_the_spec_path_quoted(project: Project) -> None:
    folder = project.tmp_path / "my specs; and more"
    folder.mkdir()
    path = folder / "job.yaml"
    path.write_text(
        f"apiVersion: tpuctl/v1\nname: {unique('job')}\n"
        "tpu: {accelerator: v4-8, runtime: tpu-ubuntu2204-base}\n"
        "capacity: {tier: spot}\njob: {command: python3 train.py, code: ./src}\n",
        encoding="utf-8",
    )
    created = project.cli("create", str(path), "--set", "job.env.A=b c", "--zone", ZONE)
    assert created.exit_code == 0, created.stderr
    note = next(line for line in created.stderr.splitlines() if line.startswith("note: "))
    expected = shlex.join(["tpuctl", "up", str(path), "--set=job.env.A=b c", "--zone", ZONE])
    assert f"`{expected}`" in note
    assert shlex.split(expected)[2] == str(path)


def test_the_up_command_quotes_every_word() -> None:
    line = up_command("my dir/job's.yaml", ["job.env.X=$(id)"], "my-project", None)
    assert shlex.split(line) == [
        "tpuctl",
        "up",
        "my dir/job's.yaml",
        "--set=job.env.X=$(id)",
        "--project",
        "my-project",
    ]


def test_up_without_a_resume_hint_quotes_the_spec_path() -> None:
    babysitter = Babysitter(
        replace(fake_spec(), source="/tmp/my specs/job.yaml"),
        FakeQr(),
        fleet_factory=fleet,
        jobs=FakeJobs(),
        record=FakeRecord(),
        journal=FakeJournal(),
        options=UpOptions(poll=1.0),
        clock=FakeClock().clock(),
        stop_requested=lambda: True,  # Ctrl-C: what is left, and how to go on
    )
    with pytest.raises(Interrupted) as raised:
        babysitter.run()
    assert "resume with: tpuctl up '/tmp/my specs/job.yaml'" in (raised.value.hint or "")


def test_the_logs_hint_is_quoted() -> None:
    assert logs_command("my job") == "tpuctl logs 'my job' --job"
