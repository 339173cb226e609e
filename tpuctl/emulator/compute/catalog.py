"""The TPU machine types of Compute Engine the fake offers, and slice arithmetic on them.

A TPU VM on Compute Engine is an instance of an accelerator-optimized machine type whose name
says its chips (`-4t`: four). A multi-host slice is a topology (`2x2x2`) in a workload policy
over `chips / chips-per-host` instances of one such type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuctl.emulator.compute.errors import ComputeApiError, invalid


@dataclass(frozen=True)
class MachineType:
    name: str  # "ct6e-standard-4t"
    generation: str  # the capacity pool: "v5p", "v6e", "tpu7x"
    chips: int  # TPU chips on one VM
    dims: int  # topology dimensions of the generation
    counts_cores: bool  # whether the accelerator-type number counts TensorCores (2 per chip)
    accelerator: str  # guestAccelerators[].acceleratorType name, e.g. "ct6e"
    host_topology: str  # the topology of one VM's chips

    def accelerator_type(self, chips: int) -> str:
        """The `accelerator-type` a slice of `chips` chips reports: `v5p-16`, `v6e-8`."""
        prefix = "tpu7x" if self.generation == "tpu7x" else self.generation
        return f"{prefix}-{chips * 2 if self.counts_cores else chips}"


MACHINE_TYPES: dict[str, MachineType] = {
    machine.name: machine
    for machine in (
        MachineType("ct5p-hightpu-4t", "v5p", 4, 3, True, "ct5p", "2x2x1"),
        MachineType("ct6e-standard-1t", "v6e", 1, 2, False, "ct6e", "1x1"),
        MachineType("ct6e-standard-4t", "v6e", 4, 2, False, "ct6e", "2x2"),
        MachineType("ct6e-standard-8t", "v6e", 8, 2, False, "ct6e", "2x4"),
        MachineType("tpu7x-standard-4t", "tpu7x", 4, 3, True, "tpu7x", "2x2x1"),
    )
}
GENERATIONS: tuple[str, ...] = ("v5p", "v6e", "tpu7x")


def machine_type(name: str, field: str) -> MachineType:
    """The TPU machine type `name`; a 400 naming `field` when the fake does not offer it."""
    found = MACHINE_TYPES.get(name)
    if found is None:
        raise invalid(
            f"Invalid value for field '{field}': '{name}'. The emulator offers the TPU machine "
            f"types {', '.join(MACHINE_TYPES)}",
        )
    return found


@dataclass(frozen=True)
class Slice:
    machine: MachineType
    topology: str
    chips: int
    hosts: int

    @property
    def accelerator_type(self) -> str:
        return self.machine.accelerator_type(self.chips)


def single_host(machine: MachineType) -> Slice:
    return Slice(machine, machine.host_topology, machine.chips, 1)


def slice_of(machine: MachineType, topology: str, field: str) -> Slice:
    """The slice `topology` of `machine` VMs; a 400 when the shape cannot be built from them."""
    try:
        dims = [int(part) for part in topology.lower().split("x")]
    except ValueError:
        dims = []
    if len(dims) != machine.dims or any(dim < 1 for dim in dims):
        example = "2x2x2" if machine.dims == 3 else "4x4"
        raise ComputeApiError(
            400,
            "invalid",
            f"Invalid value for field '{field}': '{topology}'. A {machine.generation} "
            f"accelerator topology has {machine.dims} dimensions, like {example}",
        )
    chips = math.prod(dims)
    if chips % machine.chips:
        raise invalid(
            f"Invalid value for field '{field}': '{topology}'. {chips} chips are not a whole "
            f"number of {machine.name} VMs ({machine.chips} chips each)"
        )
    return Slice(machine, "x".join(str(dim) for dim in dims), chips, chips // machine.chips)


def parse_pools(text: str) -> dict[str, int]:
    """`v5p=64,tpu7x=128` → chips per generation pool of the Compute Engine fake."""
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
