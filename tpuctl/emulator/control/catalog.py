"""What a zone offers: accelerator types (from tpuctl.topology's catalog), runtime versions per
generation, and the reservations an admin made; the Tpu service's List/Get answers for them.

Every zone offers every type and runtime here (Cloud TPU's zones each offer a few generations):
the emulator accepts any zone in a create, so a zone that offered less would only refuse what a
create there accepts.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.type import interval_pb2

from tpuctl.emulator.control.names import parse_child, parse_parent
from tpuctl.emulator.control.status import invalid, not_found
from tpuctl.topology import FAMILIES, Family, default_topology

# Runtime versions per generation, as `gcloud compute tpus tpu-vm versions list` shows them in
# zones that offer the generation (base images for JAX, and the TensorFlow and PyTorch ones).
RUNTIME_VERSIONS: dict[str, tuple[str, ...]] = {
    "v2": ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-pt-2.0"),
    "v3": ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-pt-2.0"),
    "v4": (
        "tpu-ubuntu2204-base",
        "tpu-vm-v4-base",
        "tpu-vm-v4-pt-2.0",
        "tpu-vm-tf-2.16.1-pjrt",
        "tpu-vm-tf-2.16.1-pod-pjrt",
    ),
    "v5p": ("v2-alpha-tpuv5", "tpu-ubuntu2204-base", "tpu-vm-tf-2.16.1-pjrt"),
    "v5e": ("v2-alpha-tpuv5-lite", "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.16.1-pod-pjrt"),
    "v6e": ("v2-alpha-tpuv6e",),
}


def runtime_versions() -> list[str]:
    """Every runtime version a zone offers, sorted (the catalog's and RUNTIME_VERSIONS')."""
    names = {name for family in FAMILIES for name in family.runtimes}
    names.update(name for names_of in RUNTIME_VERSIONS.values() for name in names_of)
    return sorted(names)


def _accelerator_type(parent: str, family: Family, size: int) -> cloud_tpu.AcceleratorType:
    chips = size // 2 if family.counts_cores else size
    name = f"{family.prefix}-{size}"
    config = cloud_tpu.AcceleratorConfig(
        type_=getattr(cloud_tpu.AcceleratorConfig.Type, family.config_type),
        topology=default_topology(family, chips),
    )
    return cloud_tpu.AcceleratorType(
        name=f"{parent}/acceleratorTypes/{name}", type_=name, accelerator_configs=[config]
    )


def accelerator_types(parent: str) -> list[cloud_tpu.AcceleratorType]:
    """Every accelerator type of the catalog, in the zone `parent` names."""
    parse_parent(parent)
    return [_accelerator_type(parent, family, size) for family in FAMILIES for size in family.sizes]


def accelerator_type(name: str) -> cloud_tpu.AcceleratorType:
    project, zone, type_name = parse_child(name, "acceleratorTypes")
    prefix, _, number = type_name.rpartition("-")
    for family in FAMILIES:
        if family.prefix == prefix and number.isdigit() and int(number) in family.sizes:
            return _accelerator_type(f"projects/{project}/locations/{zone}", family, int(number))
    raise not_found("acceleratorType", name)


def runtime_version_list(parent: str) -> list[cloud_tpu.RuntimeVersion]:
    parse_parent(parent)
    return [
        cloud_tpu.RuntimeVersion(name=f"{parent}/runtimeVersions/{version}", version=version)
        for version in runtime_versions()
    ]


def runtime_version(name: str) -> cloud_tpu.RuntimeVersion:
    parse_child(name, "runtimeVersions")
    version = name.rsplit("/", 1)[-1]
    if version not in runtime_versions():
        raise not_found("runtimeVersion", name)
    return cloud_tpu.RuntimeVersion(name=name, version=version)


# put_or_update's default: leave the field as it is.
UNCHANGED: object = object()


@dataclass(frozen=True)
class ReservationRecord:
    name: str  # projects/P/locations/Z/reservations/R
    chips: int
    generation: str  # the generation it holds chips of: v4, v5e, …
    state: str = "ACTIVE"
    # Its window (calendar mode), real wall-clock times; None: open on that side.
    start_time: datetime | None = None
    end_time: datetime | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "chips": self.chips,
            "generation": self.generation,
            "state": self.state,
            "start_time": self.start_time.isoformat() if self.start_time else None,
            "end_time": self.end_time.isoformat() if self.end_time else None,
        }


class Reservations:
    """Reservations made through the admin service, per project and zone (thread-safe).

    Listed as Cloud TPU lists them. A reservation-bound queued resource draws its chips from
    the reservation it names (and waits for its window); other creates naming one are not held
    to its size (capacity stays one pool per generation).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, ReservationRecord] = {}

    def put(
        self,
        name: str,
        chips: int,
        generation: str,
        state: str = "ACTIVE",
        *,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
    ) -> ReservationRecord:
        parse_child(name, "reservations")
        if generation not in {family.generation for family in FAMILIES}:
            raise invalid(f"unknown generation {generation!r}")
        if state not in cloud_tpu.Reservation.State.__members__:
            raise invalid(f"unknown reservation state {state!r}")
        if chips < 0:
            raise invalid("chips must not be negative")
        if start_time and end_time and end_time <= start_time:
            raise invalid("a reservation's window must end after it starts")
        record = ReservationRecord(name, chips, generation, state, start_time, end_time)
        with self._lock:
            self._records[name] = record
        return record

    def put_or_update(
        self,
        name: str,
        *,
        chips: int | None = None,
        generation: str | None = None,
        state: str | None = None,
        start_time: object = UNCHANGED,
        end_time: object = UNCHANGED,
    ) -> ReservationRecord:
        """Make the reservation (`chips` given; the rest default) or change the fields given
        of an existing one (NOT_FOUND when there is none)."""
        current = self.get(name)
        if chips is None and current is None:
            raise not_found("reservation", name)
        base = current or ReservationRecord(name, 0, "v4")
        start = base.start_time if start_time is UNCHANGED else start_time
        end = base.end_time if end_time is UNCHANGED else end_time
        assert start is None or isinstance(start, datetime)
        assert end is None or isinstance(end, datetime)
        return self.put(
            name,
            base.chips if chips is None else chips,
            generation or base.generation,
            state or base.state,
            start_time=start,
            end_time=end,
        )

    def get(self, name: str) -> ReservationRecord | None:
        with self._lock:
            return self._records.get(name)

    def remove(self, name: str) -> bool:
        with self._lock:
            return self._records.pop(name, None) is not None

    def listed(
        self, parent: str, usage: Mapping[str, int] | None = None
    ) -> list[cloud_tpu.Reservation]:
        """The reservations of `parent`; `usage`: chips in use per reservation."""
        parse_parent(parent)
        with self._lock:
            records = sorted(
                (record for name, record in self._records.items() if name.startswith(parent + "/")),
                key=lambda record: record.name,
            )
        used = usage or {}
        return [_reservation(record, used.get(record.name, 0)) for record in records]

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                r.to_dict() for r in sorted(self._records.values(), key=lambda record: record.name)
            ]


def _reservation(record: ReservationRecord, used: int = 0) -> cloud_tpu.Reservation:
    """As ListReservations shows it: EXPIRED once its window has ended."""
    state = record.state
    if record.end_time is not None and record.end_time <= datetime.now(timezone.utc):
        state = "EXPIRED"
    standard = cloud_tpu.Reservation.Standard(
        size=record.chips,
        capacity_units=cloud_tpu.Reservation.Standard.CapacityUnits.CHIPS,
        resource_type=record.generation,
        usage=cloud_tpu.Reservation.Standard.Usage(total=used),
    )
    if record.start_time or record.end_time:
        interval = interval_pb2.Interval()
        if record.start_time:
            interval.start_time.FromDatetime(record.start_time)
        if record.end_time:
            interval.end_time.FromDatetime(record.end_time)
        standard.interval = interval
    return cloud_tpu.Reservation(
        name=record.name,
        standard=standard,
        state=getattr(cloud_tpu.Reservation.State, state),
    )
