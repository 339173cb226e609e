"""Lifecycle commands without a TPU API: resolution errors, credentials, dry run, confirmation."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Fixtures from tests/cli/conftest.py: in-process CLI, spec writer, real subprocess.
Cli = Callable[..., Any]
WriteSpec = Callable[..., Path]
Spawn = Callable[..., Any]

SPEC_WITH_LOCATION = """\
apiVersion: tpuctl/v1
name: offline-job
project: spec-project
zone: us-central2-b
tpu:
  accelerator: v4-8
  runtime: tpu-ubuntu2204-base
capacity:
  tier: spot
"""

SPEC_WITHOUT_LOCATION = SPEC_WITH_LOCATION.replace("project: spec-project\n", "").replace(
    "zone: us-central2-b\n", ""
)


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def no_cloud_environment(tmp_path: Path) -> dict[str, str]:
    """No credentials anywhere, and google-auth kept off the real metadata server.

    NO_GCE_CHECK skips google-auth's GCE probe; GCE_METADATA_HOST/IP point any stray request
    at a closed loopback port, so nothing ever goes to 169.254.169.254.
    """
    dead = f"127.0.0.1:{closed_port()}"
    config = tmp_path / "gcloud-config"
    config.mkdir(exist_ok=True)
    return {
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(config),
        "GOOGLE_APPLICATION_CREDENTIALS": "",
        "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": dead,
        "GCE_METADATA_IP": dead,
        "TPUCTL_API_RETRY_SECONDS": "1",
    }


def test_dry_run_prints_the_request_and_sends_nothing(cli: Cli, write_spec: WriteSpec) -> None:
    path = write_spec(SPEC_WITH_LOCATION)
    outcome = cli(["create", str(path), "--dry-run", "--format", "json"])
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert data["action"] == "dry_run"
    request = data["request"]
    assert request["parent"] == "projects/spec-project/locations/us-central2-b"
    assert request["queued_resource_id"] == "offline-job"
    assert request["request_id"] == data["request_id"]
    labels = request["queued_resource"]["tpu"]["node_spec"][0]["node"]["labels"]
    assert labels["managed-by"] == "tpuctl"
    assert "would create" in outcome.stderr


def test_spec_location_beats_tpuctl_env_but_flags_beat_the_spec(
    cli: Cli, write_spec: WriteSpec
) -> None:
    path = write_spec(SPEC_WITH_LOCATION)
    env = {"TPUCTL_PROJECT": "env-project", "TPUCTL_ZONE": "us-east5-a"}
    outcome = cli(["create", str(path), "--dry-run", "--format", "json"], env=env)
    assert json.loads(outcome.stdout)["request"]["parent"] == (
        "projects/spec-project/locations/us-central2-b"
    )
    outcome = cli(
        ["create", str(path), "--dry-run", "--format", "json", "--project", "flag-p"], env=env
    )
    assert json.loads(outcome.stdout)["request"]["parent"].startswith("projects/flag-p/")


def test_missing_project_and_zone_is_exit_2_naming_each_place(
    cli: Cli, write_spec: WriteSpec, tmp_path: Path
) -> None:
    path = write_spec(SPEC_WITHOUT_LOCATION)
    env = {
        "TPU_EMULATOR_HOST": f"127.0.0.1:{closed_port()}",
        "CLOUDSDK_CONFIG": str(tmp_path / "empty"),
    }
    outcome = cli(["create", str(path), "--format", "json"], env=env)
    assert outcome.exit_code == 2
    error = json.loads(outcome.stdout)["error"]
    assert error["kind"] == "usage"
    for place in ("--project", "TPUCTL_PROJECT", "CLOUDSDK_CORE_PROJECT", "--zone", "gcloud"):
        assert place in error["message"]
    assert len(outcome.stderr.strip().splitlines()) == 1
    outcome = cli(["status", "some-qr", "--project", "my-project"], env=env)
    assert outcome.exit_code == 2
    assert "no zone found" in outcome.stderr and "no project" not in outcome.stderr


def test_missing_credentials_is_exit_8_in_one_line(spawn: Spawn, tmp_path: Path) -> None:
    env = no_cloud_environment(tmp_path)
    done = spawn(
        ["status", "some-qr", "--project", "my-project", "--zone", "us-central2-b"],
        env=env,
        timeout=60,
    )
    assert done.returncode == 8, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    for place in ("GOOGLE_APPLICATION_CREDENTIALS", "application_default_credentials.json"):
        assert place in lines[0]
    assert "metadata server" in lines[0]
    assert "gcloud auth application-default login" in lines[0]
    done = spawn(
        ["list", "--project", "my-project", "--zone", "us-central2-b", "--format", "json"], env=env
    )
    assert done.returncode == 8
    assert json.loads(done.stdout)["error"]["kind"] == "auth"


def test_missing_project_without_emulator_also_names_adc(spawn: Spawn, tmp_path: Path) -> None:
    env = no_cloud_environment(tmp_path)
    done = spawn(["list", "--zone", "us-central2-b"], env=env)
    assert done.returncode == 2, done.stderr
    assert "Application Default Credentials" in done.stderr


def test_delete_refuses_without_yes_when_stdin_is_not_a_terminal(cli: Cli) -> None:
    env = {"TPU_EMULATOR_HOST": f"127.0.0.1:{closed_port()}"}
    outcome = cli(
        ["delete", "some-qr", "--project", "my-project", "--zone", "us-central2-b"], env=env
    )
    assert outcome.exit_code == 2
    assert "--yes" in outcome.stderr
    assert "some-qr" in outcome.stderr


def test_bad_duration_is_a_usage_error(cli: Cli) -> None:
    outcome = cli(
        [
            "wait",
            "x",
            "--project",
            "my-project",
            "--zone",
            "us-central2-b",
            "--queue-timeout",
            "soon",
        ]
    )
    assert outcome.exit_code == 2
    assert "duration" in outcome.stderr


def test_every_lifecycle_command_has_help(cli: Cli) -> None:
    for command in ("create", "status", "describe", "list", "wait", "reset", "delete"):
        outcome = cli([command, "--help"])
        assert outcome.exit_code == 0, (command, outcome.stderr)
        assert "--project" in outcome.stdout
