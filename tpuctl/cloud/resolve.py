"""Where the project and zone come from: flags, the spec, the environment, gcloud's files, ADC."""

from __future__ import annotations

import configparser
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuctl.errors import UsageError, quoted
from tpuctl.spec.field import PROJECT_PATTERN, PROJECT_RULE, ZONE_PATTERN, ZONE_RULE

EMULATOR_ENV = "TPU_EMULATOR_HOST"
# Google APIs' wildcard for "every location" in a resource name (`--all-zones`).
EVERY_ZONE = "-"


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
    problem: str | None = None  # why the file could not be read (it then gives no values)
    account: str | None = None  # [core] account: whom OS Login imports keys for


def gcloud_config_dir(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("CLOUDSDK_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".config" / "gcloud"


def active_gcloud_config(environ: Mapping[str, str]) -> GcloudConfig:
    """Read `configurations/config_<active>`. A missing file gives no values; one that cannot
    be read or parsed gives none either, and says why in `problem`."""
    config_dir = gcloud_config_dir(environ)
    name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        active = config_dir / "active_config"
        text, problem = _read_config_file(active)
        if problem is not None:  # which configuration is active is unknown: none is read
            return GcloudConfig("(active)", active, None, None, problem)
        name = text.strip()
    name = name or "default"
    path = config_dir / "configurations" / f"config_{name}"
    text, problem = _read_config_file(path)
    if problem is not None:
        return GcloudConfig(name, path, None, None, problem)
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        return GcloudConfig(name, path, None, None, _parse_problem(exc))
    project = parser.get("core", "project", fallback="").strip() or None
    zone = parser.get("compute", "zone", fallback="").strip() or None
    account = parser.get("core", "account", fallback="").strip() or None
    return GcloudConfig(name, path, project, zone, account=account)


def _read_config_file(path: Path) -> tuple[str, str | None]:
    """The file's text ("" when it does not exist), and why it could not be read."""
    try:
        return path.read_text(encoding="utf-8"), None
    except FileNotFoundError:
        return "", None
    except UnicodeDecodeError as exc:
        return "", f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
    except OSError as exc:
        return "", f"{path}: {exc.strerror or exc}"


def _parse_problem(exc: configparser.Error) -> str:
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return f"{exc.source}: line {exc.lineno}: a setting before any [section] header"
    if isinstance(exc, configparser.ParsingError) and exc.errors:
        line, text = exc.errors[0]
        return f"{exc.source}: line {line}: cannot parse {quoted(text.strip())}"
    return " ".join(str(exc).split())


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
    on_warning: Callable[[str], None] | None = None,
) -> Location:
    """Flags > spec > TPUCTL_* > CLOUDSDK_* > the active gcloud configuration > ADC's project.

    gcloud's files are read only when an earlier place gave no value; one that cannot be read
    is said once through `on_warning` and skipped. `default_project` is asked last (it may load
    credentials); with the emulator it is skipped so tests never reach for Application Default
    Credentials. A missing value, or one that cannot be a project id or zone, is one UsageError
    line that names where it was looked for or found.
    """
    env = os.environ if environ is None else environ
    project_candidates, zone_candidates = _candidates(
        project_flag, zone_flag, spec_project, spec_zone, env
    )
    project, project_source = _first(project_candidates)
    zone, zone_source = _first(zone_candidates)
    if project is None or zone is None:
        gcloud = active_gcloud_config(env)
        if gcloud.problem is not None and on_warning is not None:
            on_warning(f"cannot read the gcloud configuration ({gcloud.problem}); skipped")
        where = f"gcloud configuration '{gcloud.name}' ({gcloud.path}"
        project_candidates.append((f"{where} [core] project)", gcloud.project))
        zone_candidates.append((f"{where} [compute] zone)", gcloud.zone))
        project, project_source = _first(project_candidates)
        zone, zone_source = _first(zone_candidates)
    if project is None and default_project is not None and not is_emulator(env):
        project_candidates.append(("Application Default Credentials' project", None))
        project = default_project()
        project_source = "Application Default Credentials"
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
    return Location(
        checked_project(project, project_source),
        checked_zone(zone, zone_source),
        project_source,
        zone_source,
    )


Candidates = list[tuple[str, str | None]]  # (where, the value found there)


def _candidates(
    project_flag: str | None,
    zone_flag: str | None,
    spec_project: str | None,
    spec_zone: str | None,
    env: Mapping[str, str],
) -> tuple[Candidates, Candidates]:
    """The places before gcloud's files, in order: flags, the spec, TPUCTL_*, CLOUDSDK_*."""
    return [
        ("--project", project_flag),
        ("the spec's project", spec_project),
        ("TPUCTL_PROJECT", env.get("TPUCTL_PROJECT")),
        ("CLOUDSDK_CORE_PROJECT", env.get("CLOUDSDK_CORE_PROJECT")),
    ], [
        ("--zone", zone_flag),
        ("the spec's zone", spec_zone),
        ("TPUCTL_ZONE", env.get("TPUCTL_ZONE")),
        ("CLOUDSDK_COMPUTE_ZONE", env.get("CLOUDSDK_COMPUTE_ZONE")),
    ]


def _first(candidates: Candidates) -> tuple[str | None, str]:
    for source, value in candidates:
        if value is not None and value.strip():
            return value.strip(), source
    return None, ""


def checked_project(project: str, source: str) -> str:
    """`project` when it can be a project id; else a UsageError naming where it came from, so
    nothing a shell or a resource name would misread reaches a request or a printed command."""
    if not re.fullmatch(PROJECT_PATTERN, project):
        raise UsageError(
            f"{source}: {quoted(project)} is not a valid project", hint=f"use {PROJECT_RULE}"
        )
    return project


def checked_zone(zone: str, source: str) -> str:
    """`zone` when it can be a zone name (or EVERY_ZONE); else a UsageError naming its source."""
    if zone != EVERY_ZONE and not re.fullmatch(ZONE_PATTERN, zone):
        raise UsageError(f"{source}: {quoted(zone)} is not a valid zone", hint=f"use {ZONE_RULE}")
    return zone


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
    project_candidates, zone_candidates = _candidates(
        project_flag, zone_flag, spec_project, spec_zone, env
    )
    project, project_source = _first(project_candidates)
    zone, zone_source = _first(zone_candidates)
    if project:
        checked_project(project, project_source)
    else:
        project = PLACEHOLDER_PROJECT
        warnings.append(
            f"no project given; rendering with the placeholder {PLACEHOLDER_PROJECT} "
            "(set --project, project: in the spec, or TPUCTL_PROJECT)"
        )
    if zone:
        checked_zone(zone, zone_source)
    else:
        zone = PLACEHOLDER_ZONE
        warnings.append(
            f"no zone given; rendering with the placeholder {PLACEHOLDER_ZONE} "
            "(set --zone, zone: in the spec, or TPUCTL_ZONE)"
        )
    return Location(project, zone), warnings
