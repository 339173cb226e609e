"""The doctor's vocabulary: a check's line (Check and its verdicts) and what every check
reads (Inputs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.resolve import Location, is_emulator
from tpuctl.errors import ExitCode, TpuctlError
from tpuctl.spec.model import Spec

Severity = Literal["blocking", "warning", "info"]
# A doctor rides out no outage: a read failing for this long is said, not waited for.
DOCTOR_RETRY_SECONDS = 10.0
CHECK_THREADS = 8


class PreflightError(TpuctlError):
    """A check that blocks the run (create and up refuse to spend money on it)."""

    exit_code = ExitCode.USAGE
    kind = "preflight"


@dataclass
class Check:
    """One line of the doctor: `ok` or not; how much it matters when not (`severity`); what
    was found (`message`); what to do (`fix`); the zone it is about (`zone`: the checks each
    zone a run may queue in has, else None)."""

    name: str
    ok: bool
    severity: Severity
    message: str
    fix: str | None = None
    zone: str | None = None

    @property
    def blocks(self) -> bool:
        return not self.ok and self.severity == "blocking"

    @property
    def warns(self) -> bool:
        return not self.ok and not self.blocks


def passed(name: str, message: str, severity: Severity = "blocking") -> Check:
    return Check(name, True, severity, message)


def blocked(name: str, message: str, fix: str) -> Check:
    return Check(name, False, "blocking", message, fix)


def warned(name: str, message: str, fix: str | None = None) -> Check:
    return Check(name, False, "warning", message, fix)


def noted(name: str, message: str) -> Check:
    return Check(name, True, "info", message)


@dataclass
class Inputs:
    """What every check reads: the spec, where it runs, the TPU API, the credentials."""

    spec: Spec
    location: Location
    api: TpuApi
    credentials: Any
    environ: Mapping[str, str]

    @property
    def emulator(self) -> bool:
        return is_emulator(self.environ)

    @property
    def project(self) -> str:
        return self.location.project

    @property
    def zone(self) -> str:
        return self.location.zone
