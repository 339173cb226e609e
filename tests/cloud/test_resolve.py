"""Project and zone resolution: the documented order, gcloud's files, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.cloud.resolve import active_gcloud_config, resolve_location
from tpuctl.errors import ExitCode, UsageError


def gcloud_dir(tmp_path: Path, name: str = "default", body: str = "") -> Path:
    root = tmp_path / "gcloud"
    (root / "configurations").mkdir(parents=True)
    (root / "configurations" / f"config_{name}").write_text(body, encoding="utf-8")
    return root


def test_flags_beat_everything(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, body="[core]\nproject = cfg-p\n[compute]\nzone = cfg-z\n")
    env = {
        "CLOUDSDK_CONFIG": str(root),
        "TPUCTL_PROJECT": "env-p",
        "TPUCTL_ZONE": "env-z",
        "CLOUDSDK_CORE_PROJECT": "sdk-p",
        "CLOUDSDK_COMPUTE_ZONE": "sdk-z",
    }
    location = resolve_location(
        project_flag="flag-p",
        zone_flag="flag-z",
        spec_project="spec-p",
        spec_zone="spec-z",
        environ=env,
    )
    assert (location.project, location.zone) == ("flag-p", "flag-z")
    assert location.parent == "projects/flag-p/locations/flag-z"


def test_order_spec_then_tpuctl_env_then_cloudsdk_env_then_gcloud_config(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, body="[core]\nproject = cfg-p\n[compute]\nzone = cfg-z\n")
    env = {
        "CLOUDSDK_CONFIG": str(root),
        "TPUCTL_PROJECT": "env-p",
        "CLOUDSDK_COMPUTE_ZONE": "sdk-z",
    }
    spec_first = resolve_location(spec_project="spec-p", environ=env)
    assert (spec_first.project, spec_first.project_source) == ("spec-p", "the spec's project")
    assert spec_first.zone == "sdk-z"
    env_only = resolve_location(environ={"CLOUDSDK_CONFIG": str(root), "TPUCTL_ZONE": "tz"})
    assert (env_only.project, env_only.zone) == ("cfg-p", "tz")
    sdk = resolve_location(
        environ={
            "CLOUDSDK_CONFIG": str(root),
            "CLOUDSDK_CORE_PROJECT": "sdk-p",
            "TPUCTL_PROJECT": "tp",
        }
    )
    assert sdk.project == "tp"


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
    (config / "config_default").write_text("[compute]\nzone = home-z\n[core]\nproject = home-p\n")
    location = resolve_location(environ={"HOME": str(tmp_path)})
    assert (location.project, location.zone) == ("home-p", "home-z")


def test_adc_project_is_the_last_resort_and_skipped_for_the_emulator(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "none"), "TPUCTL_ZONE": "z"}
    asked: list[bool] = []

    def adc() -> str | None:
        asked.append(True)
        return "adc-p"

    assert resolve_location(environ=env, default_project=adc).project == "adc-p"
    assert resolve_location(project_flag="p", environ=env, default_project=adc).project == "p"
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
        resolve_location(project_flag="p", environ={"CLOUDSDK_CONFIG": str(tmp_path)})
    assert "no zone found" in caught.value.message
    assert "no project" not in caught.value.message
