"""Several zones of one project at once: which zones to ask, one call per zone run side by side,
and a zone that fails reported beside the answers of the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.resolve import EVERY_ZONE, checked_zone
from tpuctl.errors import ExitCode, TpuctlError, UsageError

T = TypeVar("T")
# Calls in flight at once; a project has a few dozen TPU zones at most.
MAX_PARALLEL_ZONES = 16


@dataclass(frozen=True)
class ZoneError:
    """A zone that could not be asked: the error's kind, one line, and its exit code."""

    zone: str
    kind: str
    message: str
    exit_code: int


@dataclass
class ZoneAnswers(Generic[T]):
    """Each zone's answer, in the order the zones were given, and the zones that failed."""

    answers: dict[str, T] = field(default_factory=dict)
    errors: list[ZoneError] = field(default_factory=list)


def parse_zones(text: str) -> list[str]:
    """`--zones a,b` → ["a", "b"] (order kept, repeats dropped); UsageError when empty or when a
    name could not be a zone."""
    zones = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not zones:
        raise UsageError("--zones needs at least one zone", hint="e.g. --zones us-central2-b")
    for zone in zones:
        if zone == EVERY_ZONE:
            raise UsageError("--zones: '-' is not a zone", hint="use --all-zones for every zone")
        checked_zone(zone, "--zones")
    return zones


def zones_to_ask(api: TpuApi, zones: Sequence[str] | None, *, every: bool) -> list[str]:
    """`every`: the project's zones (the TPU API's locations); else `zones`, else the API's
    own zone."""
    if every:
        return api.list_zones()
    return list(zones) if zones else [api.location.zone]


def each_zone(api: TpuApi, zones: Sequence[str], call: Callable[[TpuApi], T]) -> ZoneAnswers[T]:
    """`call` once per zone, side by side. With several zones a tpuctl error in one becomes its
    ZoneError and the others still answer; with one zone it is raised as it is."""
    if len(zones) == 1:
        return ZoneAnswers({zones[0]: call(api.in_zone(zones[0]))})
    found: ZoneAnswers[T] = ZoneAnswers()
    executor = ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL_ZONES, len(zones)), thread_name_prefix="tpuctl-zone"
    )
    try:
        futures: dict[str, Future[T]] = {
            zone: executor.submit(call, api.in_zone(zone)) for zone in zones
        }
        for zone, future in futures.items():
            try:
                found.answers[zone] = future.result()
            except TpuctlError as error:
                found.errors.append(
                    ZoneError(zone, error.kind, error.one_line(), int(error.exit_code))
                )
    finally:
        # On Ctrl-C, calls not started yet never start; running ones end within their timeout.
        executor.shutdown(wait=False, cancel_futures=True)
    return found


def zones_exit_code(errors: Sequence[ZoneError]) -> ExitCode:
    """OK when every zone answered, else the highest exit code among the zones that failed."""
    return ExitCode(max((error.exit_code for error in errors), default=ExitCode.OK))


def zones_error(errors: Sequence[ZoneError], asked: int) -> TpuctlError | None:
    """The one line that says the answer is incomplete, or None when every zone answered."""
    if not errors:
        return None
    failed = ", ".join(error.zone for error in errors)
    return TpuctlError(f"{len(errors)} of {asked} zones could not be asked ({failed}); incomplete")
