"""The supervisor renderers as pure functions: schedules per target, refusals, names, quoting
for systemd and cron, the environment a local step keeps. (The artefacts themselves are checked
by their real tools in tests/cli/test_supervise.py.)"""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from tpuctl.errors import ExitCode, UsageError
from tpuctl.render.supervisor import (
    SupervisorOptions,
    local_environment,
    reconcile_argv,
    render_supervisor,
)
from tpuctl.render.supervisor.local import systemd_word
from tpuctl.render.supervisor.model import schedule_for
from tpuctl.render.supervisor.remote import CRONJOB_NAME_LIMIT, kubernetes_name

BASE = SupervisorOptions(
    target="cron",
    name="nightly",
    spec_path="/home/me/nightly.yaml",
    spec_text="name: nightly\n",
    tpuctl=("/usr/bin/tpuctl",),
    service_account="sup@p.iam.gserviceaccount.com",
    project="p",
    region="us-central2",
    workload_identity_provider="projects/1/locations/global/workloadIdentityPools/g/providers/g",
    checkpoint_dir="gs://b/runs",
)


@pytest.mark.parametrize(
    "case",
    [
        ("cron", 60, 60, "* * * * *", (0,), "*-*-* *:*:00", False),
        ("cron", 15, 15, "* * * * *", (0, 15, 30, 45), "*-*-* *:*:00/15", False),
        ("systemd", 5, 5, "* * * * *", tuple(range(0, 60, 5)), "*-*-* *:*:00/5", False),
        ("cron", 600, 600, "*/10 * * * *", (0,), "*-*-* *:00/10:00", False),
        ("cron", 3600, 3600, "0 * * * *", (0,), "*-*-* *:00:00", False),
        ("kubernetes", 15, 60, "* * * * *", (0,), "*-*-* *:*:00", True),
        ("cloud-run", 30, 60, "* * * * *", (0,), "*-*-* *:*:00", True),
        ("github", 60, 300, "*/5 * * * *", (0,), "*-*-* *:00/5:00", True),
        ("github", 900, 900, "*/15 * * * *", (0,), "*-*-* *:00/15:00", False),
    ],
)
def test_schedules(case: tuple[str, float, int, str, tuple[int, ...], str, bool]) -> None:
    """(target, --every, seconds, cron, cron's offsets, OnCalendar, rounded up with a note)."""
    target, every, seconds, cron, offsets, calendar, noted = case
    schedule = schedule_for(target, every)  # type: ignore[arg-type]
    assert (schedule.seconds, schedule.cron, schedule.offsets) == (seconds, cron, offsets)
    assert schedule.calendar == calendar
    assert bool(schedule.notes) == noted


@pytest.mark.parametrize("every", [7, 45, 61, 420, 5400, 7200, 0.5, 90])
def test_intervals_that_divide_neither_a_minute_nor_an_hour_are_refused(every: float) -> None:
    with pytest.raises(UsageError) as raised:
        schedule_for("cron", every)
    assert raised.value.hint is not None and "1m" in raised.value.hint


@pytest.mark.parametrize("target", ["kubernetes", "cloud-run", "github"])
@pytest.mark.parametrize("state", [None, "/mnt/ckpt", "~/ckpt"])
def test_remote_targets_need_the_state_on_gcs(target: str, state: str | None) -> None:
    with pytest.raises(UsageError, match=f"--on {target} cannot reach the run's state"):
        render_supervisor(replace(BASE, target=target, checkpoint_dir=state))  # type: ignore[arg-type]
    for local in ("cron", "systemd"):
        assert render_supervisor(replace(BASE, target=local, checkpoint_dir=state)).files


@pytest.mark.parametrize(
    ("target", "missing", "said"),
    [
        ("kubernetes", {"service_account": None}, "--service-account"),
        ("cloud-run", {"region": None}, "--region"),
        ("cloud-run", {"project": None}, "--project"),
        ("github", {"workload_identity_provider": None}, "--workload-identity-provider"),
    ],
)
def test_remote_targets_name_what_they_lack(
    target: str, missing: dict[str, None], said: str
) -> None:
    with pytest.raises(UsageError, match=f"--on {target} needs .*{said}"):
        render_supervisor(replace(BASE, target=target, **missing))  # type: ignore[arg-type]


def test_a_spec_github_would_evaluate_is_refused_unless_in_the_repository() -> None:
    odd = replace(BASE, target="github", spec_text="job:\n  command: echo ${{ x }}\n")
    with pytest.raises(UsageError, match="GitHub would evaluate"):
        render_supervisor(odd)
    assert render_supervisor(replace(odd, spec_in_repository="specs/nightly.yaml")).files


def test_the_step_reads_the_spec_where_each_target_puts_it() -> None:
    args = ("--set", "tpu.slices=2")
    expected = {
        "cron": ["/usr/bin/tpuctl", "reconcile", "/home/me/nightly.yaml", *args],
        "systemd": ["/usr/bin/tpuctl", "reconcile", "/home/me/nightly.yaml", *args],
        "kubernetes": ["tpuctl", "reconcile", "/etc/tpuctl/spec.yaml", *args],
        "cloud-run": ["tpuctl", "reconcile", "/tmp/tpuctl/spec.yaml", *args],
        "github": ["tpuctl", "reconcile", "tpuctl-spec.yaml", *args],
    }
    for target, argv in expected.items():
        options = replace(BASE, target=target, reconcile_args=args)  # type: ignore[arg-type]
        assert reconcile_argv(options) == argv
        assert render_supervisor(options).command == argv
    in_repository = replace(BASE, target="github", spec_in_repository="ops/nightly.yaml")
    assert reconcile_argv(in_repository)[2] == "ops/nightly.yaml"


def test_a_long_run_name_still_fits_a_cronjob() -> None:
    name = "r" * 40  # the longest a spec's name may be
    assert kubernetes_name(replace(BASE, name="short")) == "tpuctl-reconcile-short"
    long = kubernetes_name(replace(BASE, name=name))
    assert len(long) <= CRONJOB_NAME_LIMIT and long == f"tpuctl-{name}"


def test_every_artefact_maps_in_progress_to_success() -> None:
    code = int(ExitCode.IN_PROGRESS)
    for target in ("cron", "kubernetes", "cloud-run", "github"):
        text = render_supervisor(replace(BASE, target=target)).files[0].content  # type: ignore[arg-type]
        assert f'"$rc" = {code} ]' in text, target
    units = render_supervisor(replace(BASE, target="systemd")).files[0].content
    assert f"SuccessExitStatus={code}\n" in units


@pytest.mark.parametrize(
    ("word", "in_exec", "written"),
    [
        ("/usr/bin/tpuctl", True, "/usr/bin/tpuctl"),
        ("--set", True, "--set"),
        ("a b", True, '"a b"'),
        ("50%", True, "50%%"),
        ("$HOME", True, '"$$HOME"'),
        ("$HOME", False, '"$HOME"'),
        ('say "hi"\\', True, '"say \\"hi\\"\\\\"'),
        ("PATH=/usr/bin:/bin", False, "PATH=/usr/bin:/bin"),
    ],
)
def test_systemd_words(word: str, in_exec: bool, written: str) -> None:
    assert systemd_word(word, in_exec=in_exec) == written


def test_the_cron_step_script_keeps_words_whole_and_the_line_short() -> None:
    options = replace(
        BASE,
        reconcile_args=("--set", "job.env.NOTE=50% 'of' it"),
        environment={"PATH": "/usr/bin:/bin", "HOME": "/home/me two"},
        state_dir="/home/me/.local/state/tpuctl/supervise",
    )
    crontab, script = render_supervisor(options).files
    (line,) = [x for x in crontab.content.splitlines() if not x.startswith("#")]
    assert line == (
        "* * * * * cd /home/me/.local/state/tpuctl/supervise && flock -n -E 12 "
        "tpuctl-reconcile-nightly.lock ./tpuctl-reconcile-nightly.sh "
        '>>tpuctl-reconcile-nightly.log 2>&1; rc=$?; [ "$rc" = 12 ] && rc=0; exit "$rc" '
        "# tpuctl-reconcile-nightly"
    )
    exports = [x for x in script.content.splitlines() if x.startswith("export ")]
    assert exports == ["export PATH=/usr/bin:/bin", "export HOME='/home/me two'"]
    (exec_line,) = [x for x in script.content.splitlines() if x.startswith("exec ")]
    assert shlex.split(exec_line)[1:] == [
        "/usr/bin/tpuctl", "reconcile", "/home/me/nightly.yaml", "--set", "job.env.NOTE=50% 'of' it"
    ]  # fmt: skip
    with pytest.raises(UsageError, match="line break"):
        render_supervisor(replace(options, state_dir="/home/me\nstate"))
    with pytest.raises(UsageError, match="more than cron takes"):
        render_supervisor(replace(options, state_dir="/" + "s" * 900))
    percent = render_supervisor(replace(options, state_dir="/home/50%")).files[0].content
    assert "cd /home/50\\% &&" in percent  # cron would end the command at a bare %


def test_the_local_environment_keeps_what_a_step_needs() -> None:
    environ = {
        "PATH": "/opt/bin:/usr/bin",
        "HOME": "/tmp/elsewhere",
        "TPUCTL_PROJECT": "p",
        "TPUCTL_FORMAT": "json",  # would change what the step prints
        "SECRET_TOKEN": "x",  # not ours to copy into a crontab
        "XDG_STATE_HOME": "/state",
    }
    kept = local_environment(environ, home="/home/me", extra={"TPUCTL_SSH_PORT": "2222"})
    assert kept == {
        "PATH": "/opt/bin:/usr/bin",
        "XDG_STATE_HOME": "/state",
        "TPUCTL_PROJECT": "p",
        "HOME": "/tmp/elsewhere",
        "TPUCTL_SSH_PORT": "2222",
    }
    assert "HOME" not in local_environment({"HOME": "/home/me"}, home="/home/me")


def test_a_local_job_code_is_noted_for_remote_targets() -> None:
    local = replace(BASE, target="kubernetes", job_code="./src")
    assert any("job.code ./src is a local path" in note for note in render_supervisor(local).notes)
    on_gcs = replace(local, job_code="gs://b/code.tar.gz")
    assert not any("job.code" in note for note in render_supervisor(on_gcs).notes)
    assert not any("job.code" in n for n in render_supervisor(replace(local, target="cron")).notes)
