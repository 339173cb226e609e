"""`tpu.api: compute`: which accelerators each API offers, and every combination Compute Engine
does not have refused with a one-line error naming the file, line, field and the fix, through
the CLI (validate and render) exactly as a person meets it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import invoke
from tpuctl.errors import ExitCode
from tpuctl.spec.load import load_spec_text

IMAGE = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


def compute_spec(tpu: str = "  accelerator: v6e-8\n", capacity: str = "", rest: str = "") -> str:
    return (
        "apiVersion: tpuctl/v1\n"
        "name: demo\n"
        "tpu:\n"
        "  api: compute\n"
        f"{tpu}"
        f"  runtime: {IMAGE}\n" + (f"capacity:\n{capacity}" if capacity else "") + rest
    )


# (spec text, the field the error names, text on the line it points at, words of the message,
# of the fix)
REFUSALS = {
    "tpu7x with the Cloud TPU API": (
        compute_spec("  accelerator: tpu7x-8\n").replace("api: compute", "api: tpu"),
        "tpu.accelerator",
        "accelerator: tpu7x-8",
        "TPU7x (Ironwood) is offered only through Compute Engine",
        "set tpu.api: compute",
    ),
    "tpu7x type + topology with the Cloud TPU API (api left out)": (
        compute_spec("  type: tpu7x\n  topology: 2x2x2\n").replace("  api: compute\n", ""),
        "tpu.type",
        "type: tpu7x",
        "TPU7x (Ironwood) is offered only through Compute Engine",
        "set tpu.api: compute",
    ),
    "v4 on Compute Engine": (
        compute_spec("  accelerator: v4-8\n"),
        "tpu.accelerator",
        "accelerator: v4-8",
        "Compute Engine offers TPU VMs of v5p, v6e and tpu7x only, not v4",
        "set tpu.api: tpu",
    ),
    "v5e on Compute Engine": (
        compute_spec("  type: v5litepod\n  topology: 2x2\n"),
        "tpu.type",
        "type: v5litepod",
        "not v5e",
        "set tpu.api: tpu",
    ),
    "an unknown accelerator on Compute Engine": (
        compute_spec("  accelerator: v9-8\n"),
        "tpu.accelerator",
        "accelerator: v9-8",
        "known families: v5p-N, v6e-N, tpu7x-N",
        "e.g. v5p-8, v6e-8 or tpu7x-8",
    ),
    "multislice on Compute Engine": (
        compute_spec("  accelerator: v6e-8\n  slices: 2\n"),
        "tpu.slices",
        "slices: 2",
        "Multislice on Compute Engine has no documented procedure",
        "use api: tpu (v4 to v6e) or GKE",
    ),
    "a flex-start window shorter than 90 s": (
        compute_spec(capacity="  tier: flex-start\n  max_run_duration: 1h\n  valid_until: 60s\n"),
        "capacity.valid_until",
        "valid_until",
        "1m is not a queueing window Compute Engine takes (90s to 2h)",
        "give a duration from 90s to 2h",
    ),
    "a flex-start window longer than 2 h": (
        compute_spec(capacity="  tier: flex-start\n  max_run_duration: 1d\n  valid_until: 3h\n"),
        "capacity.valid_until",
        "valid_until",
        "not a queueing window Compute Engine takes (90s to 2h)",
        "give a duration from 90s to 2h",
    ),
    "a flex-start window as a time": (
        compute_spec(
            capacity="  tier: flex-start\n  max_run_duration: 1d\n"
            "  valid_until: 2999-01-01T00:00:00Z\n"
        ),
        "capacity.valid_until",
        "valid_until",
        "as a duration",
        "give a duration from 90s to 2h",
    ),
    "a queueing window for a spot VM": (
        compute_spec(capacity="  tier: spot\n  valid_until: 30m\n"),
        "capacity.valid_until",
        "valid_until",
        "only a flex-start request waits for capacity",
        "set tier: flex-start",
    ),
    "a queueing window for a multi-host flex-start slice": (
        compute_spec(
            "  accelerator: v5p-16\n",
            capacity="  tier: flex-start\n  max_run_duration: 1d\n  valid_until: 30m\n",
        ),
        "capacity.valid_until",
        "valid_until",
        "its template has no queueing window",
        "deadlines.queue bounds how long create waits",
    ),
    "valid_after": (
        compute_spec(capacity="  valid_after: 10m\n"),
        "capacity.valid_after",
        "valid_after",
        "Compute Engine has no not-before time",
        "use tpu.api: tpu",
    ),
    "best-effort": (
        compute_spec(capacity="  tier: best-effort\n"),
        "capacity.tier",
        "tier: best-effort",
        "Compute Engine has no best-effort tier",
        "use spot",
    ),
    "best-effort as a rung of the ladder": (
        compute_spec(capacity="  fallback:\n    - tier: spot\n    - tier: best-effort\n"),
        "capacity.fallback[1].tier",
        "tier: best-effort",
        "Compute Engine has no best-effort tier",
        "use spot",
    ),
    "reserved without a reservation": (
        compute_spec(capacity="  tier: reserved\n"),
        "capacity.tier",
        "tier: reserved",
        "draws from a reservation by name",
        "add `reservation: NAME` under `capacity`",
    ),
    "Autocheckpoint": (
        compute_spec(rest="checkpoint:\n  dir: gs://b/run\n  autocheckpoint: true\n"),
        "checkpoint.autocheckpoint",
        "autocheckpoint: true",
        "Autocheckpoint is the Cloud TPU API's",
        "use tpu.api: tpu",
    ),
    "a Cloud TPU runtime version for an image": (
        compute_spec().replace(IMAGE, "v2-alpha-tpuv6e"),
        "tpu.runtime",
        "runtime:",
        "'v2-alpha-tpuv6e' is a Cloud TPU runtime version",
        "give an image family of ubuntu-os-accelerator-images",
    ),
    "a read-write disk on a multi-host slice": (
        compute_spec("  accelerator: v5p-16\n  data_disks:\n    - source: data\n"),
        "tpu.data_disks[0].mode",
        "source: data",
        "a read-write disk attaches to one VM",
        "set mode: read-only",
    ),
}


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("case", sorted(REFUSALS), ids=sorted(REFUSALS))
def test_refused_with_one_line_naming_file_line_field_and_fix(
    case: str, command: str, tmp_path: Path
) -> None:
    text, field, at, message, fix = REFUSALS[case]
    line = 1 + next(index for index, each in enumerate(text.splitlines()) if at in each)
    spec = tmp_path / "job.yaml"
    spec.write_text(text, encoding="utf-8")
    where = ["--project", "my-project", "--zone", "us-east5-b"] if command == "render" else []
    outcome = invoke([command, str(spec), *where])
    assert outcome.exit_code == ExitCode.USAGE == 2, outcome.stderr
    assert outcome.stdout == ""
    [error] = outcome.stderr.splitlines()
    assert error.startswith(f"error: {spec}:{line}:"), error
    assert f" {field}: " in error
    assert message in error
    assert fix in error


@pytest.mark.parametrize(
    ("tpu", "capacity", "accelerator", "hosts"),
    [
        ("  accelerator: v6e-1\n", "  tier: spot\n", "v6e-1", 1),
        ("  accelerator: v6e-4\n", "", "v6e-4", 1),
        ("  accelerator: v6e-8\n", "  tier: flex-start\n  max_run_duration: 1d\n", "v6e-8", 1),
        ("  accelerator: v5p-16\n", "  tier: flex-start\n  max_run_duration: 8h\n", "v5p-16", 2),
        ("  accelerator: tpu7x-8\n", "  tier: reservation-bound\n  reservation: r\n", "tpu7x-8", 1),
        ("  type: tpu7x\n  topology: 2x2x2\n", "  tier: spot\n", "tpu7x-16", 2),
    ],
)
def test_what_compute_engine_offers_loads(
    tpu: str, capacity: str, accelerator: str, hosts: int
) -> None:
    spec = load_spec_text(compute_spec(tpu, capacity)).spec
    assert (spec.tpu.api, spec.tpu.accelerator) == ("compute", accelerator)
    from tpuctl.render.compute import compute_accelerator

    assert compute_accelerator(spec).vms == hosts


def test_validate_names_the_api_default_and_the_cloud_tpu_api_is_unchanged(
    write_spec: Callable[..., Path], minimal: str
) -> None:
    spec = load_spec_text(minimal).spec
    assert spec.tpu.api == "tpu"
    path = write_spec(compute_spec())
    outcome = invoke(["validate", str(path)])
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout == f"{path} is valid: demo, 1× v6e-8 (on-demand, on Compute Engine)\n"
    assert invoke(["validate", str(path), "--format", "json"]).json()["api"] == "compute"


def test_flex_start_for_v5p_is_compute_engines_to_judge_not_cloud_tpus(
    write_spec: Callable[..., Path],
) -> None:
    """Cloud TPU offers flex-start for v5e and v6e only; on Compute Engine the tier is a
    provisioning model of the VM, taken for v5p too (the fake's reading; not tried)."""
    text = compute_spec("  accelerator: v5p-8\n", "  tier: flex-start\n  max_run_duration: 2h\n")
    assert load_spec_text(text).spec.capacity.tier == "flex-start"
    cloud_tpu = text.replace("api: compute", "api: tpu").replace(IMAGE, "v2-alpha-tpuv5")
    refused = invoke(["validate", str(write_spec(cloud_tpu))])
    assert refused.exit_code == ExitCode.USAGE
    assert "Cloud TPU offers flex-start for v5e and v6e, not v5p" in refused.stderr


def test_the_api_value_is_checked_with_did_you_mean(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(compute_spec().replace("api: compute", "api: compte"), encoding="utf-8")
    outcome = invoke(["validate", str(spec)])
    assert outcome.exit_code == 2
    assert "tpu.api: 'compte' is not a valid api" in outcome.stderr
    assert "did you mean 'compute'?" in outcome.stderr
