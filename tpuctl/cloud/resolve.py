"""Where the project and zone come from: flags, the spec, the environment, gcloud's files, ADC."""

from __future__ import annotations

import configparser
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuctl.errors import UsageError

EMULATOR_ENV = "TPU_EMULATOR_HOST"


@dataclass(frozen=True)
class Location:
    """A project and zone, each with a note saying where it was found (for messages)."""

    project: str
    zone: str
    project_source: str = "flag"
    zone_source: str = "flag"

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    def queued_resource_name(self, queued_resource_id: str) -> str:
        return f"{self.parent}/queuedResources/{queued_resource_id}"

    def node_name(self, node_id: str) -> str:
        return f"{self.parent}/nodes/{node_id}"

    def cli_flags(self) -> str:
        """`--project P --zone Z`, for the commands tpuctl tells people to run (shell-quoted)."""
        return f"--project {shlex.quote(self.project)} --zone {shlex.quote(self.zone)}"


@dataclass(frozen=True)
class GcloudConfig:
    """The active gcloud configuration, read as an INI file (gcloud itself is not needed)."""

    name: str
    path: Path
    project: str | None
    zone: str | None


def gcloud_config_dir(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("CLOUDSDK_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".config" / "gcloud"


def active_gcloud_config(environ: Mapping[str, str]) -> GcloudConfig:
    """Read `configurations/config_<active>`; a missing or unreadable file gives no values."""
    config_dir = gcloud_config_dir(environ)
    name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        try:
            name = (config_dir / "active_config").read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
    name = name or "default"
    path = config_dir / "configurations" / f"config_{name}"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return GcloudConfig(name, path, None, None)
    project = parser.get("core", "project", fallback="").strip() or None
    zone = parser.get("compute", "zone", fallback="").strip() or None
    return GcloudConfig(name, path, project, zone)


def is_emulator(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(EMULATOR_ENV))


def resolve_location(
    *,
    project_flag: str | None = None,
    zone_flag: str | None = None,
    spec_project: str | None = None,
    spec_zone: str | None = None,
    environ: Mapping[str, str] | None = None,
    default_project: Callable[[], str | None] | None = None,
) -> Location:
    """Flags > spec > TPUCTL_* > CLOUDSDK_* > the active gcloud configuration > ADC's project.

    `default_project` is asked last (it may load credentials); with the emulator it is skipped
    so tests never reach for Application Default Credentials. A missing value is one UsageError
    line that names every place looked.
    """
    env = os.environ if environ is None else environ
    gcloud = active_gcloud_config(env)
    project_candidates: list[tuple[str, str | None]] = [
        ("--project", project_flag),
        ("the spec's project", spec_project),
        ("TPUCTL_PROJECT", env.get("TPUCTL_PROJECT")),
        ("CLOUDSDK_CORE_PROJECT", env.get("CLOUDSDK_CORE_PROJECT")),
        (f"gcloud configuration '{gcloud.name}' ({gcloud.path} [core] project)", gcloud.project),
    ]
    zone_candidates: list[tuple[str, str | None]] = [
        ("--zone", zone_flag),
        ("the spec's zone", spec_zone),
        ("TPUCTL_ZONE", env.get("TPUCTL_ZONE")),
        ("CLOUDSDK_COMPUTE_ZONE", env.get("CLOUDSDK_COMPUTE_ZONE")),
        (f"gcloud configuration '{gcloud.name}' ({gcloud.path} [compute] zone)", gcloud.zone),
    ]
    project, project_source = _first(project_candidates)
    if project is None and default_project is not None and not is_emulator(env):
        project_candidates.append(("Application Default Credentials' project", None))
        project = default_project()
        project_source = "Application Default Credentials"
    zone, zone_source = _first(zone_candidates)
    missing = []
    if project is None:
        missing.append(("project", "--project my-project", project_candidates))
    if zone is None:
        missing.append(("zone", "--zone us-central2-b", zone_candidates))
    if missing:
        parts = [
            f"no {what} found (looked at {', '.join(name for name, _ in looked)})"
            for what, _, looked in missing
        ]
        fixes = " and ".join(example for _, example, _ in missing)
        raise UsageError("; ".join(parts), hint=f"pass {fixes}, or set it in the spec")
    assert project is not None and zone is not None
    return Location(project, zone, project_source, zone_source)


def _first(candidates: list[tuple[str, str | None]]) -> tuple[str | None, str]:
    for source, value in candidates:
        if value is not None and value.strip():
            return value.strip(), source
    return None, ""


PLACEHOLDER_PROJECT = "PROJECT_ID"
PLACEHOLDER_ZONE = "ZONE"


def offline_location(
    *,
    project_flag: str | None,
    zone_flag: str | None,
    spec_project: str | None,
    spec_zone: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Location, list[str]]:
    """Project and zone for an offline render: flags > spec > TPUCTL_* > CLOUDSDK_* > a
    placeholder (with a warning). Never asks gcloud or google.auth, so it needs no network."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    project = (
        project_flag
        or spec_project
        or env.get("TPUCTL_PROJECT")
        or env.get("CLOUDSDK_CORE_PROJECT")
    )
    zone = zone_flag or spec_zone or env.get("TPUCTL_ZONE") or env.get("CLOUDSDK_COMPUTE_ZONE")
    if not project:
        project = PLACEHOLDER_PROJECT
        warnings.append(
            f"no project given; rendering with the placeholder {PLACEHOLDER_PROJECT} "
            "(set --project, project: in the spec, or TPUCTL_PROJECT)"
        )
    if not zone:
        zone = PLACEHOLDER_ZONE
        warnings.append(
            f"no zone given; rendering with the placeholder {PLACEHOLDER_ZONE} "
            "(set --zone, zone: in the spec, or TPUCTL_ZONE)"
        )
    return Location(project, zone), warnings
