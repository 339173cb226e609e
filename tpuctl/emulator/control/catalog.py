"""What a zone offers: accelerator types (from tpuctl.topology's catalog), runtime versions per
generation, and the reservations an admin made; the Tpu service's List/Get answers for them.

Every zone offers every type and runtime here (Cloud TPU's zones each offer a few generations):
the emulator accepts any zone in a create, so a zone that offered less would only refuse what a
create there accepts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from google.cloud.tpu_v2alpha1.types import cloud_tpu

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


@dataclass
class ReservationRecord:
    name: str  # projects/P/locations/Z/reservations/R
    chips: int
    generation: str  # the capacity pool it is for: v4, v5e, …
    state: str = "ACTIVE"


class Reservations:
    """Reservations made through the admin service, per project and zone (thread-safe).

    They are listed as Cloud TPU lists them and nothing more: a create naming one is not held
    to its size (capacity stays one pool per generation).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, ReservationRecord] = {}

    def put(self, name: str, chips: int, generation: str, state: str = "ACTIVE") -> None:
        parse_child(name, "reservations")
        if generation not in {family.generation for family in FAMILIES}:
            raise invalid(f"unknown generation {generation!r}")
        if state not in cloud_tpu.Reservation.State.__members__:
            raise invalid(f"unknown reservation state {state!r}")
        if chips < 0:
            raise invalid("chips must not be negative")
        with self._lock:
            self._records[name] = ReservationRecord(name, chips, generation, state)

    def remove(self, name: str) -> bool:
        with self._lock:
            return self._records.pop(name, None) is not None

    def listed(self, parent: str) -> list[cloud_tpu.Reservation]:
        parse_parent(parent)
        with self._lock:
            records = sorted(
                (record for name, record in self._records.items() if name.startswith(parent + "/")),
                key=lambda record: record.name,
            )
        return [_reservation(record) for record in records]

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                {"name": r.name, "chips": r.chips, "generation": r.generation, "state": r.state}
                for r in sorted(self._records.values(), key=lambda record: record.name)
            ]


def _reservation(record: ReservationRecord) -> cloud_tpu.Reservation:
    standard = cloud_tpu.Reservation.Standard(
        size=record.chips,
        capacity_units=cloud_tpu.Reservation.Standard.CapacityUnits.CHIPS,
        resource_type=record.generation,
        usage=cloud_tpu.Reservation.Standard.Usage(total=0),
    )
    return cloud_tpu.Reservation(
        name=record.name,
        standard=standard,
        state=getattr(cloud_tpu.Reservation.State, record.state),
    )
