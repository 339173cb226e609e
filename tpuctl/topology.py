"""The accelerator catalog: "v4-16" → generation, chips, TensorCores, VMs; runtime checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpuctl.errors import quoted


class AcceleratorError(ValueError):
    """An accelerator type or topology tpuctl does not know; the message lists what it does,
    `fix` (when set) what to change in the spec."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Family:
    generation: str  # "v4", "v5e", …: the name people use, and the emulator's capacity pool key
    prefix: str  # the accelerator_type prefix: "v4", "v5litepod", …
    config_type: str  # AcceleratorConfig.Type name: "V4", "V5LITE_POD", …
    counts_cores: bool  # True when the number in the type counts TensorCores (2 per chip)
    sizes: tuple[int, ...] = field(repr=False)  # the numbers accepted after the dash
    dims: int  # topology dimensions (3 for v4/v5p, 2 otherwise)
    multislice: bool
    runtimes: tuple[str, ...]  # runtime versions known to match


FAMILIES: tuple[Family, ...] = (
    Family("v2", "v2", "V2", True, (8, 32, 128, 256, 512), 2, False, ("tpu-ubuntu2204-base",)),
    Family(
        "v3", "v3", "V3", True, (8, 32, 64, 128, 256, 512, 1024, 2048), 2, False,
        ("tpu-ubuntu2204-base",),
    ),
    Family(
        "v4", "v4", "V4", True, tuple(range(8, 8192 + 1, 8)), 3, True,
        ("tpu-ubuntu2204-base", "tpu-vm-v4-base"),
    ),
    Family(
        "v5p", "v5p", "V5P", True, tuple(range(8, 17920 + 1, 8)), 3, True,
        ("v2-alpha-tpuv5", "tpu-ubuntu2204-base"),
    ),
    Family(
        "v5e", "v5litepod", "V5LITE_POD", False, (1, 4, 8, 16, 32, 64, 128, 256), 2, True,
        ("v2-alpha-tpuv5-lite",),
    ),
    Family(
        "v6e", "v6e", "V6E", False, (1, 4, 8, 16, 32, 64, 128, 256), 2, True,
        ("v2-alpha-tpuv6e",),
    ),
)  # fmt: skip

_BY_PREFIX = {family.prefix: family for family in FAMILIES}
# Names a person may write for a family in `type:` (gcloud's and the API's spellings).
_TYPE_ALIASES = {
    **{family.prefix: family for family in FAMILIES},
    **{family.config_type.lower(): family for family in FAMILIES},
    "v5e": _BY_PREFIX["v5litepod"],
    "v5lite": _BY_PREFIX["v5litepod"],
}
MAX_SLICES = 256

# TPU7x (Ironwood): two TensorCores a chip (the TPU7x page of the Cloud TPU documentation), so
# its accelerator type counts TensorCores as v5p's does (`tpu7x-8`: 4 chips, one VM); four
# chips a VM, 9,216 chips a pod. Offered only on Compute Engine (and GKE).
TPU7X = Family(
    "tpu7x", "tpu7x", "TPU7X", True, tuple(range(8, 18432 + 1, 8)), 3, False, ()
)  # fmt: skip
# The generations Compute Engine offers as TPU VM instances (accelerator-optimized machine
# types), and the machine type of each: chips a VM → name.
COMPUTE_FAMILIES: tuple[Family, ...] = (_BY_PREFIX["v5p"], _BY_PREFIX["v6e"], TPU7X)
COMPUTE_MACHINE_TYPES: dict[str, dict[int, str]] = {
    "v5p": {4: "ct5p-hightpu-4t"},
    "v6e": {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
    "tpu7x": {4: "tpu7x-standard-4t"},
}
_COMPUTE_BY_PREFIX = {family.prefix: family for family in COMPUTE_FAMILIES}

# What the Cloud TPU API lists of the newest generations (the v5e, v6e and v5p pages of the
# Cloud TPU documentation, read 2025-09): v5e and v6e come in these shapes only; a v5p slice
# is at most 16x16x24 (6,144 chips, 96 cubes: v5p-12288), shapes below a cube (64 chips) are
# the listed ones and from a cube up every dimension is a multiple of 4 (whole cubes).
LISTED_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "v5e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v6e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4"),
}
V5P_MAX_CHIPS = 6144
CUBE_CHIPS = 64
# TPU7x (Ironwood) names people write: the Cloud TPU API does not offer it.
_IRONWOOD = ("tpu7x", "ironwood", "v7x", "tpu7")
IRONWOOD_WHY = (
    "TPU7x (Ironwood) is offered only through Compute Engine and GKE, not the Cloud TPU API"
)
IRONWOOD_FIX = "set tpu.api: compute (TPU VMs as Compute Engine instances), or use GKE"
COMPUTE_WHY = "Compute Engine offers TPU VMs of v5p, v6e and tpu7x only"
COMPUTE_FIX = (
    "set tpu.api: tpu (the Cloud TPU API's queued resources), or a v5p, v6e or tpu7x accelerator"
)


def known_families(api: str = "tpu") -> str:
    """Human list of accepted forms, for error messages."""
    return ", ".join(f"{family.prefix}-N" for family in _families(api))


def _families(api: str) -> tuple[Family, ...]:
    """The generations `api` offers (tpu: Cloud TPU's queued resources; compute)."""
    return COMPUTE_FAMILIES if api == "compute" else FAMILIES


@dataclass(frozen=True)
class Accelerator:
    """One slice of a given accelerator type."""

    family: Family
    accelerator_type: str  # canonical, e.g. "v4-16"
    chips: int  # per slice
    tensorcores: int  # per slice
    vms: int  # TPU VMs (workers) per slice
    chips_per_vm: int
    topology: str  # e.g. "2x2x2"

    @property
    def generation(self) -> str:
        return self.family.generation

    @property
    def supports_multislice(self) -> bool:
        return self.family.multislice

    def totals(self, slices: int) -> dict[str, int]:
        """Counts across `slices` slices of this type."""
        return {
            "slices": slices,
            "vms": self.vms * slices,
            "chips": self.chips * slices,
            "tensorcores": self.tensorcores * slices,
        }


def _family_for(name: str, api: str, aliases: dict[str, Family]) -> Family | None:
    """The family `name` names for `api`; AcceleratorError when that API does not offer it."""
    if name in _IRONWOOD:
        if api == "compute":
            return TPU7X
        raise AcceleratorError(f"{IRONWOOD_WHY} (which offers {_api_families()})", IRONWOOD_FIX)
    family = aliases.get(name)
    if family is not None and api == "compute" and family.prefix not in _COMPUTE_BY_PREFIX:
        raise AcceleratorError(
            f"{COMPUTE_WHY}, not {family.generation} (the Cloud TPU API offers it)", COMPUTE_FIX
        )
    return family


def parse_accelerator(text: str, *, api: str = "tpu") -> Accelerator:
    """`"v4-16"` or `"v5litepod-16"` → Accelerator; AcceleratorError when unknown, or when
    `api` ("tpu": Cloud TPU's queued resources, "compute": Compute Engine) does not offer it."""
    prefix, dash, number = text.strip().lower().rpartition("-")
    family = _family_for(prefix, api, _BY_PREFIX) if dash else None
    if family is None or not number.isdigit():
        raise AcceleratorError(
            f"unknown accelerator type {quoted(text)}; known families: {known_families(api)}"
        )
    size = int(number)
    if size not in family.sizes:
        raise AcceleratorError(
            f"{quoted(text)} is not a {family.generation} size; "
            f"valid sizes: {_describe_sizes(family)}"
        )
    chips = size // 2 if family.counts_cores else size
    _check_listed(family, chips, None)
    return _build(family, chips)


def _sorted_dims(shape: str) -> tuple[int, ...]:
    """A shape's dimensions in order (4x2 and 2x4 are the same shape, turned)."""
    return tuple(sorted(int(part) for part in shape.split("x")))


def _api_families() -> str:
    return ", ".join(family.generation for family in FAMILIES)


def _check_listed(family: Family, chips: int, topology: str | None) -> None:
    """The shape is one the Cloud TPU API offers (LISTED_TOPOLOGIES, V5P_MAX_CHIPS)."""
    listed = LISTED_TOPOLOGIES.get(family.generation)
    if listed is None:
        return
    if family.generation == "v5p":
        size = f"v5p-{chips * 2}"
        if chips > V5P_MAX_CHIPS:
            raise AcceleratorError(
                f"{quoted(size)} is larger than the largest v5p slice, 16x16x24 "
                f"(v5p-{V5P_MAX_CHIPS * 2}); more chips are several slices (tpu.slices)"
            )
        if topology is None:
            if chips < CUBE_CHIPS and default_topology(family, chips) not in listed:
                raise AcceleratorError(
                    f"{quoted(size)} is not a v5p slice the API offers; below a cube (64 chips) "
                    "it offers v5p-8, v5p-16, v5p-32 and v5p-64"
                )
            return
        dims = [int(part) for part in topology.split("x")]
        cube_multiple = all(dim % 4 == 0 for dim in dims)
        shapes = {_sorted_dims(each) for each in listed}
        if _sorted_dims(topology) not in shapes and (chips < CUBE_CHIPS or not cube_multiple):
            raise AcceleratorError(
                f"topology {quoted(topology)} is not a v5p shape the API offers: "
                f"{', '.join(listed)}, or whole cubes (every dimension a multiple of 4, "
                "e.g. 4x4x8)"
            )
        return
    shape = topology or default_topology(family, chips)
    if _sorted_dims(shape) not in {_sorted_dims(each) for each in listed}:
        raise AcceleratorError(
            f"topology {quoted(shape)} is not a {family.generation} shape the API offers: "
            + ", ".join(listed)
        )


def from_type_topology(type_name: str, topology: str, *, api: str = "tpu") -> Accelerator:
    """`type: v5litepod` + `topology: 4x4` → Accelerator (the accelerator_config form); `api`
    as for parse_accelerator."""
    family = _family_for(type_name.strip().lower(), api, _TYPE_ALIASES)
    if family is None:
        raise AcceleratorError(
            f"unknown TPU type {quoted(type_name)}; known types: "
            + ", ".join(family.prefix for family in _families(api))
        )
    try:
        dims = [int(part) for part in topology.lower().split("x")]
    except ValueError:
        dims = []
    if len(dims) != family.dims or any(d < 1 for d in dims):
        example = "2x2x2" if family.dims == 3 else "4x4"
        raise AcceleratorError(
            f"topology {quoted(topology)} is not valid for {family.generation}: "
            f"give {family.dims} dimensions like {example}"
        )
    chips = math.prod(dims)
    size = chips * 2 if family.counts_cores else chips
    if size not in family.sizes:
        raise AcceleratorError(
            f"topology {quoted(topology)} gives {chips} chips, not a {family.generation} slice size"
        )
    shape = "x".join(str(d) for d in dims)
    _check_listed(family, chips, shape)
    return _build(family, chips, topology=shape)


def _build(family: Family, chips: int, topology: str | None = None) -> Accelerator:
    chips_per_vm = chips if (not family.counts_cores and chips <= 8) else min(4, chips)
    vms = max(1, chips // chips_per_vm)
    size = chips * 2 if family.counts_cores else chips
    return Accelerator(
        family=family,
        accelerator_type=f"{family.prefix}-{size}",
        chips=chips,
        tensorcores=chips * 2 if family.counts_cores else chips,
        vms=vms,
        chips_per_vm=chips_per_vm,
        topology=topology or default_topology(family, chips),
    )


def default_topology(family: Family, chips: int) -> str:
    """The most cube-like (3D) or square-like (2D) shape, smallest dimension first."""
    if family.dims == 2:
        low = 2 ** (int(math.log2(chips)) // 2) if chips & (chips - 1) == 0 else 1
        while chips % low:
            low -= 1
        return f"{low}x{chips // low}"
    best = (1, 1, chips)
    for a in range(1, round(chips ** (1 / 3)) + 2):
        if chips % a:
            continue
        for b in range(a, math.isqrt(chips // a) + 1):
            if (chips // a) % b == 0:
                c = chips // a // b
                if c >= b and max(a, b, c) - min(a, b, c) < max(best) - min(best):
                    best = (a, b, c)
    if chips == 4:  # v4-8 is 2x2x1 by Cloud TPU's convention
        best = (2, 2, 1)
    return "x".join(str(d) for d in best)


def _describe_sizes(family: Family) -> str:
    if len(family.sizes) > 12:
        return f"multiples of 8 from 8 to {family.sizes[-1]}"
    return ", ".join(str(size) for size in family.sizes)


def runtime_warning(accelerator: Accelerator, runtime: str) -> str | None:
    """A warning when `runtime` is known, but only for other generations than this one."""
    if runtime in accelerator.family.runtimes:
        return None
    meant_for = [family.generation for family in FAMILIES if runtime in family.runtimes]
    if not meant_for:
        return None  # an unknown runtime may be new; the service will say
    return (
        f"runtime {quoted(runtime)} is meant for {', '.join(meant_for)}, not "
        f"{accelerator.generation}; expected one of " + ", ".join(accelerator.family.runtimes)
    )


MESH_AXES = ("data", "fsdp", "tensor", "sequence", "expert", "pipeline", "autoregressive")


def mesh_product(axes: dict[str, int]) -> int:
    return math.prod(axes.values()) if axes else 1


def compute_machine_type(accelerator: Accelerator) -> str:
    """The Compute Engine machine type of one VM of the slice: `v6e-8` → ct6e-standard-8t,
    `v5p-16` → ct5p-hightpu-4t (two of them). KeyError for a generation Compute Engine does
    not offer (refused when the spec is loaded)."""
    return COMPUTE_MACHINE_TYPES[accelerator.generation][accelerator.chips_per_vm]
