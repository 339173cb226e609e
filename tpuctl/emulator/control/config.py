"""Emulator settings: ports, speed, capacity pools, delays and the maintenance grace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from tpuctl.clock import DURATION_HINT
from tpuctl.clock import parse_duration as duration_seconds
from tpuctl.topology import FAMILIES

T = TypeVar("T")
GENERATIONS: tuple[str, ...] = tuple(family.generation for family in FAMILIES)
DEFAULT_CAPACITY_CHIPS = 16384  # per generation: room for 64 × v4-128 with plenty to spare
# What ListLocations answers: zones that offer Cloud TPU. A create names its zone freely (the
# emulator checks no zone names), but `--all-zones` finds only QRs in these.
DEFAULT_ZONES: tuple[str, ...] = (
    "asia-east1-c",
    "asia-northeast1-b",
    "europe-west4-a",
    "europe-west4-b",
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-central2-b",
    "us-east1-d",
    "us-east5-a",
    "us-east5-b",
    "us-south1-a",
    "us-west4-a",
)


@dataclass(frozen=True)
class Delays:
    """Emulated seconds each step takes at --speed 1 (real seconds = value / speed)."""

    creating: float = 1.0  # CREATING before WAITING_FOR_RESOURCES (the create LRO ends here)
    waiting: float = 0.5  # the least time in WAITING_FOR_RESOURCES even with free capacity
    provisioning: float = 3.0  # PROVISIONING, on top of the time to set up the VMs
    suspending: float = 1.0  # SUSPENDING before SUSPENDED
    deleting: float = 1.0  # DELETING, on top of the time to tear the VMs down
    reset: float = 2.0  # VMs down during a reset
    reboot: float = 2.0  # VMs down after maintenance
    repair: float = 3.0  # replacing a failed slice
    stopping: float = 1.0  # STOPPING (StopNode), on top of the VMs' shutdown
    starting: float = 2.0  # STARTING (StartNode), before the VMs boot

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(item.name for item in fields(cls))


@dataclass(frozen=True)
class EmulatorConfig:
    port: int = 0
    state_dir: Path | None = None  # None: a fresh temporary directory removed at exit
    speed: float = 1.0
    capacity: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(GENERATIONS, DEFAULT_CAPACITY_CHIPS)
    )
    # Flex-start's own pools (provisioningModel FLEX_START draws only from these).
    flex_capacity: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(GENERATIONS, DEFAULT_CAPACITY_CHIPS)
    )
    grace: float = 300.0  # autocheckpoint grace in emulated seconds (Cloud TPU: 5 minutes)
    # How long a graceful VM shutdown waits for what is left before SIGKILL, in emulated
    # seconds (systemd's DefaultTimeoutStopSec).
    shutdown: float = 90.0
    ssh_port: int = 0
    delays: Delays = field(default_factory=Delays)
    ssh_server: str = "asyncssh"
    zones: tuple[str, ...] = DEFAULT_ZONES
    rest_port: int = 0  # the Cloud TPU REST API's port (0: any free)


def parse_duration(text: str | float) -> float:
    """`300`, `300s`, `5m`, `+30s`, `1.5h`, `250ms`, `1h30m` → seconds, in tpuctl's one
    duration grammar (tpuctl.clock), its ValueError saying how to write one."""
    try:
        return duration_seconds(text)
    except ValueError as error:
        raise ValueError(f"{error} ({DURATION_HINT})") from None


def parse_capacity(text: str) -> dict[str, int]:
    """`v4=64,v5e=256` → {"v4": 64, "v5e": 256} (chips per generation pool)."""
    result: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in GENERATIONS or not value.strip().isdigit():
            raise ValueError(
                f"bad capacity {part!r}: use GENERATION=CHIPS with GENERATION one of "
                + ", ".join(GENERATIONS)
            )
        result[key] = int(value.strip())
    return result


def parse_delays(items: list[str] | tuple[str, ...], base: Delays | None = None) -> Delays:
    """`["creating=2", "provisioning=10s"]` → Delays."""
    delays = base or Delays()
    changes: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in Delays.names():
            raise ValueError(f"bad delay {item!r}: use NAME=SECONDS, NAME one of {Delays.names()}")
        changes[key.strip()] = parse_duration(value)
    return replace(delays, **changes)


def parse_flag(parser: Callable[[Any], T], value: Any, flag: str) -> T:
    """`parser(value)`, its ValueError naming the flag."""
    try:
        return parser(value)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None


def config_from_flags(
    *,
    port: int,
    state_dir: Path | None,
    speed: float,
    capacity: str,
    grace: str | float,
    ssh_port: int,
    delays: list[str] | tuple[str, ...],
    rest_port: int = 0,
    flex_capacity: str = "",
) -> EmulatorConfig:
    """An EmulatorConfig from `tpuctl emulator start`'s flags as typed (ValueError naming the
    flag that is wrong)."""

    if speed <= 0:
        raise ValueError("--speed must be positive")
    pools = dict.fromkeys(GENERATIONS, DEFAULT_CAPACITY_CHIPS)
    pools.update(parse_flag(parse_capacity, capacity, "--capacity"))
    flex_pools = dict.fromkeys(GENERATIONS, DEFAULT_CAPACITY_CHIPS)
    flex_pools.update(parse_flag(parse_capacity, flex_capacity, "--flex-start-capacity"))
    return EmulatorConfig(
        port=port,
        state_dir=state_dir,
        speed=speed,
        capacity=pools,
        grace=parse_flag(parse_duration, grace, "--grace"),
        ssh_port=ssh_port,
        delays=parse_flag(parse_delays, list(delays), "--delay"),
        rest_port=rest_port,
        flex_capacity=flex_pools,
    )
