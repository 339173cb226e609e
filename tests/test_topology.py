"""The accelerator catalog: every family in both spellings, totals across slices, and errors."""

from __future__ import annotations

import pytest

from tpuctl.topology import (
    FAMILIES,
    AcceleratorError,
    default_topology,
    from_type_topology,
    mesh_product,
    parse_accelerator,
    runtime_warning,
)

# accelerator_type, generation, chips, TensorCores, VMs per slice, chips per VM, topology
CASES = [
    ("v2-8", "v2", 4, 8, 1, 4, "2x2"),
    ("v2-32", "v2", 16, 32, 4, 4, "4x4"),
    ("v2-512", "v2", 256, 512, 64, 4, "16x16"),
    ("v3-8", "v3", 4, 8, 1, 4, "2x2"),
    ("v3-64", "v3", 32, 64, 8, 4, "4x8"),
    ("v3-2048", "v3", 1024, 2048, 256, 4, "32x32"),
    ("v4-8", "v4", 4, 8, 1, 4, "2x2x1"),
    ("v4-16", "v4", 8, 16, 2, 4, "2x2x2"),
    ("v4-32", "v4", 16, 32, 4, 4, "2x2x4"),
    ("v4-128", "v4", 64, 128, 16, 4, "4x4x4"),
    ("v4-4096", "v4", 2048, 4096, 512, 4, "8x16x16"),
    ("v5p-8", "v5p", 4, 8, 1, 4, "2x2x1"),
    ("v5p-16", "v5p", 8, 16, 2, 4, "2x2x2"),
    ("v5p-128", "v5p", 64, 128, 16, 4, "4x4x4"),
    ("v5litepod-1", "v5e", 1, 1, 1, 1, "1x1"),
    ("v5litepod-4", "v5e", 4, 4, 1, 4, "2x2"),
    ("v5litepod-8", "v5e", 8, 8, 1, 8, "2x4"),
    ("v5litepod-16", "v5e", 16, 16, 4, 4, "4x4"),
    ("v5litepod-256", "v5e", 256, 256, 64, 4, "16x16"),
    ("v6e-1", "v6e", 1, 1, 1, 1, "1x1"),
    ("v6e-8", "v6e", 8, 8, 1, 8, "2x4"),
    ("v6e-32", "v6e", 32, 32, 8, 4, "4x8"),
    ("v6e-256", "v6e", 256, 256, 64, 4, "16x16"),
]

TYPE_NAMES = {"v2": "v2", "v3": "v3", "v4": "v4", "v5p": "v5p", "v5e": "v5litepod", "v6e": "v6e"}


Case = tuple[str, str, int, int, int, int, str]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_accelerator_type_form(case: Case) -> None:
    text, generation, chips, cores, vms, per_vm, topology = case
    accelerator = parse_accelerator(text)
    assert accelerator.accelerator_type == text
    assert accelerator.generation == generation
    assert accelerator.chips == chips
    assert accelerator.tensorcores == cores
    assert accelerator.vms == vms
    assert accelerator.chips_per_vm == per_vm
    assert accelerator.vms * accelerator.chips_per_vm == accelerator.chips
    assert accelerator.topology == topology


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_type_topology_form_matches(case: Case) -> None:
    text, generation, _chips, _cores, _vms, _per_vm, topology = case
    accelerator = from_type_topology(TYPE_NAMES[generation], topology)
    assert accelerator == parse_accelerator(text)
    assert accelerator.topology == topology


@pytest.mark.parametrize(
    ("type_name", "topology", "expected"),
    [
        ("V4", "2x2x2", "v4-16"),
        ("v5e", "4x4", "v5litepod-16"),
        ("v5lite", "2x4", "v5litepod-8"),
        ("V5LITE_POD", "8x8", "v5litepod-64"),
        ("V5P", "2x2x4", "v5p-32"),
        ("V6E", "4x8", "v6e-32"),
        ("V2", "4x4", "v2-32"),
        ("V3", "2x2", "v3-8"),
    ],
)
def test_type_aliases(type_name: str, topology: str, expected: str) -> None:
    assert from_type_topology(type_name, topology).accelerator_type == expected


def test_topology_given_is_kept_not_normalised() -> None:
    accelerator = from_type_topology("v5litepod", "4x2")
    assert accelerator.accelerator_type == "v5litepod-8"
    assert accelerator.topology == "4x2"


@pytest.mark.parametrize("text", ["V4-16", " v4-16 "])
def test_accelerator_type_is_case_and_space_insensitive(text: str) -> None:
    assert parse_accelerator(text).accelerator_type == "v4-16"


@pytest.mark.parametrize("slices", [1, 2, 4, 256])
def test_totals_across_slices(slices: int) -> None:
    accelerator = parse_accelerator("v4-32")
    assert accelerator.totals(slices) == {
        "slices": slices,
        "vms": 4 * slices,
        "chips": 16 * slices,
        "tensorcores": 32 * slices,
    }


def test_totals_for_chip_counted_family() -> None:
    assert parse_accelerator("v5litepod-16").totals(3) == {
        "slices": 3,
        "vms": 12,
        "chips": 48,
        "tensorcores": 48,
    }


@pytest.mark.parametrize(
    ("generation", "multislice"),
    [("v2", False), ("v3", False), ("v4", True), ("v5p", True), ("v5e", True), ("v6e", True)],
)
def test_multislice_support(generation: str, multislice: bool) -> None:
    family = next(f for f in FAMILIES if f.generation == generation)
    smallest = f"{family.prefix}-{family.sizes[0]}"
    assert parse_accelerator(smallest).supports_multislice is multislice


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("v7-8", "unknown accelerator type"),
        ("v4", "unknown accelerator type"),
        ("v4-abc", "unknown accelerator type"),
        ("", "unknown accelerator type"),
        ("v5e-16", "unknown accelerator type"),  # the API spelling is v5litepod-16
        ("v4-12", "not a v4 size"),
        ("v2-16", "not a v2 size"),
        ("v5litepod-2", "not a v5e size"),
        ("v6e-512", "not a v6e size"),
    ],
)
def test_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(AcceleratorError, match=fragment):
        parse_accelerator(text)


def test_unknown_type_error_lists_known_families() -> None:
    with pytest.raises(AcceleratorError) as caught:
        parse_accelerator("tpu-9")
    for family in FAMILIES:
        assert f"{family.prefix}-N" in str(caught.value)


@pytest.mark.parametrize(
    ("type_name", "topology", "fragment"),
    [
        ("v9", "2x2", "unknown TPU type"),
        ("v4", "2x2", "give 3 dimensions"),
        ("v5litepod", "2x2x2", "give 2 dimensions"),
        ("v4", "2xax2", "give 3 dimensions"),
        ("v4", "", "give 3 dimensions"),
        ("v4", "0x2x2", "give 3 dimensions"),
        ("v5litepod", "3x3", "not a v5e slice size"),
        ("v2", "2x4", "not a v2 slice size"),
    ],
)
def test_type_topology_errors(type_name: str, topology: str, fragment: str) -> None:
    with pytest.raises(AcceleratorError, match=fragment):
        from_type_topology(type_name, topology)


def test_default_topology_is_most_cube_like() -> None:
    v4 = next(f for f in FAMILIES if f.generation == "v4")
    assert default_topology(v4, 32) == "2x4x4"
    assert default_topology(v4, 4) == "2x2x1"


def test_runtime_warning() -> None:
    v5e = parse_accelerator("v5litepod-16")
    assert runtime_warning(v5e, "v2-alpha-tpuv5-lite") is None
    assert runtime_warning(v5e, "some-new-runtime") is None  # unknown: let the service decide
    warning = runtime_warning(v5e, "v2-alpha-tpuv6e")
    assert warning is not None and "v6e" in warning and "v2-alpha-tpuv5-lite" in warning
    assert runtime_warning(parse_accelerator("v4-8"), "tpu-ubuntu2204-base") is None
    assert runtime_warning(parse_accelerator("v5p-8"), "tpu-ubuntu2204-base") is None
    shared = runtime_warning(v5e, "tpu-ubuntu2204-base")
    assert shared is not None and "not v5e" in shared


def test_mesh_product() -> None:
    assert mesh_product({}) == 1
    assert mesh_product({"data": 2, "fsdp": 4, "tensor": 2}) == 16
