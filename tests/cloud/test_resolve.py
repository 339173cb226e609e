"""Project and zone resolution: the documented order, gcloud's files, one-line errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.cloud.resolve import active_gcloud_config, offline_location, resolve_location
from tpuctl.errors import ExitCode, UsageError


def gcloud_dir(tmp_path: Path, name: str = "default", body: str = "") -> Path:
    root = tmp_path / "gcloud"
    (root / "configurations").mkdir(parents=True)
    (root / "configurations" / f"config_{name}").write_text(body, encoding="utf-8")
    return root


def test_flags_beat_everything(tmp_path: Path) -> None:
    root = gcloud_dir(
        tmp_path, body="[core]\nproject = config-project\n[compute]\nzone = us-central1-a\n"
    )
    env = {
        "CLOUDSDK_CONFIG": str(root),
        "TPUCTL_PROJECT": "env-project",
        "TPUCTL_ZONE": "us-east5-a",
        "CLOUDSDK_CORE_PROJECT": "sdk-project",
        "CLOUDSDK_COMPUTE_ZONE": "europe-west4-a",
    }
    location = resolve_location(
        project_flag="flag-project",
        zone_flag="us-east1-d",
        spec_project="spec-project",
        spec_zone="us-south1-a",
        environ=env,
    )
    assert (location.project, location.zone) == ("flag-project", "us-east1-d")
    assert location.parent == "projects/flag-project/locations/us-east1-d"


def test_order_spec_then_tpuctl_env_then_cloudsdk_env_then_gcloud_config(tmp_path: Path) -> None:
    root = gcloud_dir(
        tmp_path, body="[core]\nproject = config-project\n[compute]\nzone = us-central1-a\n"
    )
    env = {
        "CLOUDSDK_CONFIG": str(root),
        "TPUCTL_PROJECT": "env-project",
        "CLOUDSDK_COMPUTE_ZONE": "europe-west4-a",
    }
    spec_first = resolve_location(spec_project="spec-project", environ=env)
    assert (spec_first.project, spec_first.project_source) == ("spec-project", "the spec's project")
    assert spec_first.zone == "europe-west4-a"
    env_only = resolve_location(environ={"CLOUDSDK_CONFIG": str(root), "TPUCTL_ZONE": "us-west4-a"})
    assert (env_only.project, env_only.zone) == ("config-project", "us-west4-a")
    sdk = resolve_location(
        environ={
            "CLOUDSDK_CONFIG": str(root),
            "CLOUDSDK_CORE_PROJECT": "sdk-project",
            "TPUCTL_PROJECT": "tpuctl-project",
        }
    )
    assert sdk.project == "tpuctl-project"


def test_active_configuration_from_env_or_file(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, name="work", body="[core]\nproject = work-p\n")
    (root / "configurations" / "config_default").write_text("[core]\nproject = default-p\n")
    assert active_gcloud_config({"CLOUDSDK_CONFIG": str(root)}).project == "default-p"
    (root / "active_config").write_text("work\n")
    assert active_gcloud_config({"CLOUDSDK_CONFIG": str(root)}).project == "work-p"
    env = {"CLOUDSDK_CONFIG": str(root), "CLOUDSDK_ACTIVE_CONFIG_NAME": "default"}
    assert active_gcloud_config(env).project == "default-p"


def test_home_config_dir_is_used_without_cloudsdk_config(tmp_path: Path) -> None:
    config = tmp_path / ".config" / "gcloud" / "configurations"
    config.mkdir(parents=True)
    (config / "config_default").write_text(
        "[compute]\nzone = asia-east1-c\n[core]\nproject = home-project\n"
    )
    location = resolve_location(environ={"HOME": str(tmp_path)})
    assert (location.project, location.zone) == ("home-project", "asia-east1-c")


def test_adc_project_is_the_last_resort_and_skipped_for_the_emulator(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "none"), "TPUCTL_ZONE": "us-central2-b"}
    asked: list[bool] = []

    def adc() -> str | None:
        asked.append(True)
        return "adc-project"

    assert resolve_location(environ=env, default_project=adc).project == "adc-project"
    assert (
        resolve_location(project_flag="my-project", environ=env, default_project=adc).project
        == "my-project"
    )
    assert len(asked) == 1
    with pytest.raises(UsageError):
        resolve_location(environ={**env, "TPU_EMULATOR_HOST": "127.0.0.1:1"}, default_project=adc)
    assert len(asked) == 1


def test_missing_project_and_zone_is_one_line_naming_every_place(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "gc")}
    with pytest.raises(UsageError) as caught:
        resolve_location(environ=env, default_project=lambda: None)
    error = caught.value
    assert error.exit_code is ExitCode.USAGE
    line = error.one_line()
    assert "\n" not in line
    for place in (
        "--project",
        "the spec's project",
        "TPUCTL_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
        "gcloud configuration 'default'",
        "Application Default Credentials",
        "--zone",
        "TPUCTL_ZONE",
        "CLOUDSDK_COMPUTE_ZONE",
        "[compute] zone",
    ):
        assert place in line
    assert "no project found" in line and "no zone found" in line


def test_missing_zone_only_names_zone_places(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_location(project_flag="my-project", environ={"CLOUDSDK_CONFIG": str(tmp_path)})
    assert "no zone found" in caught.value.message
    assert "no project" not in caught.value.message


# --- values in their real formats -------------------------------------------------------------

GOOD = {"TPUCTL_PROJECT": "my-project", "TPUCTL_ZONE": "us-central2-b"}


@pytest.mark.parametrize(
    ("flags", "env", "source", "what"),
    [
        ({"project_flag": "$(touch owned)"}, {}, "--project", "project"),
        ({"project_flag": "ab"}, {}, "--project", "project"),
        ({"zone_flag": "us-central2-b\nid"}, {}, "--zone", "zone"),
        ({"zone_flag": "us-central2-b;id"}, {}, "--zone", "zone"),
        ({}, {"TPUCTL_PROJECT": "My_Project"}, "TPUCTL_PROJECT", "project"),
        ({}, {"TPUCTL_ZONE": "`id`"}, "TPUCTL_ZONE", "zone"),
        ({}, {"TPUCTL_ZONE": "", "CLOUDSDK_COMPUTE_ZONE": "z"}, "CLOUDSDK_COMPUTE_ZONE", "zone"),
    ],
)
def test_a_value_that_cannot_be_a_project_or_zone_is_refused(
    tmp_path: Path, flags: dict[str, str], env: dict[str, str], source: str, what: str
) -> None:
    environ = {"CLOUDSDK_CONFIG": str(tmp_path), **GOOD, **env}
    for resolve in (resolve_location, offline_location):
        arguments = {"project_flag": None, "zone_flag": None, **flags}
        arguments.update(spec_project=None, spec_zone=None)
        with pytest.raises(UsageError) as raised:
            resolve(environ=environ, **arguments)  # type: ignore[operator]
        error = raised.value
        assert error.exit_code is ExitCode.USAGE
        line = error.one_line()
        assert line.startswith(f"{source}: ") and f"is not a valid {what}" in line
        assert "\n" not in line
        assert ("my-project" if what == "project" else "us-central2-b") in line


def test_a_gcloud_config_value_is_checked_and_named(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, body="[core]\nproject = $(id)\n")
    with pytest.raises(UsageError) as raised:
        resolve_location(environ={"CLOUDSDK_CONFIG": str(root), "TPUCTL_ZONE": "us-east5-a"})
    assert "gcloud configuration 'default'" in raised.value.message
    assert "'$(id)' is not a valid project" in raised.value.message


@pytest.mark.parametrize(
    ("project", "zone"),
    [
        ("example.com:my-project", "northamerica-northeast1-a"),
        ("a" * 30, "me-central2-a"),
        ("my-project", "-"),  # every zone, as --all-zones asks
    ],
)
def test_real_projects_and_zones_resolve(tmp_path: Path, project: str, zone: str) -> None:
    location = resolve_location(
        project_flag=project, zone_flag=zone, environ={"CLOUDSDK_CONFIG": str(tmp_path)}
    )
    assert (location.project, location.zone) == (project, zone)


# --- a gcloud configuration that cannot be read -------------------------------------------------


@pytest.mark.parametrize(
    ("write", "why"),
    [
        (lambda path: path.write_text("project = no-section\n"), "line 1"),
        (lambda path: path.write_text("[core]\nproject\n"), "line 2"),
        (lambda path: path.write_text("[core]\na = 1\na = 2\n"), "'a'"),
        (lambda path: path.write_bytes(b"[core]\nproject = \xff\n"), "not UTF-8"),
        (lambda path: path.mkdir(), "Is a directory"),
    ],
)
def test_an_unreadable_gcloud_config_is_said_once_and_skipped(
    tmp_path: Path, write: Callable[[Path], object], why: str
) -> None:
    root = tmp_path / "gcloud"
    (root / "configurations").mkdir(parents=True)
    config = root / "configurations" / "config_default"
    write(config)
    warnings: list[str] = []
    env = {"CLOUDSDK_CONFIG": str(root), "CLOUDSDK_CORE_PROJECT": "sdk-project"}
    with pytest.raises(UsageError, match="no zone found"):  # the other sources are still asked
        resolve_location(environ=env, on_warning=warnings.append)
    assert len(warnings) == 1
    assert str(config) in warnings[0] and why in warnings[0]
    assert "\n" not in warnings[0]
    location = resolve_location(
        environ={**env, "TPUCTL_ZONE": "us-east5-a"}, on_warning=warnings.append
    )
    assert (location.project, location.zone) == ("sdk-project", "us-east5-a")
    assert len(warnings) == 1  # not needed, so not read: nothing more to say


def test_a_missing_gcloud_config_is_no_warning(tmp_path: Path) -> None:
    warnings: list[str] = []
    with pytest.raises(UsageError):
        resolve_location(environ={"CLOUDSDK_CONFIG": str(tmp_path)}, on_warning=warnings.append)
    assert warnings == []
