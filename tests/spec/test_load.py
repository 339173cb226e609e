"""Loading valid specs: defaults, both accelerator forms, tiers, warnings, locations, hashing."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuctl.errors import SourceLocation, SpecError, SpecErrors
from tpuctl.spec.load import (
    LoadedSpec,
    load_spec,
    load_spec_text,
    resolve_code_path,
    spec_fingerprint,
)
from tpuctl.spec.model import (
    CapacitySpec,
    CheckpointSpec,
    DeadlinesSpec,
    ParallelismSpec,
    RecoverySpec,
)

DATA = Path(__file__).parent / "data"
Load = Callable[..., LoadedSpec]


def test_full_example_loads() -> None:
    path = DATA / "example.yaml"
    loaded = load_spec(path)
    spec = loaded.spec
    assert loaded.warnings == ()
    assert spec.source == str(path)
    assert (spec.name, spec.project, spec.zone) == ("llama-cpt", "my-project", "us-central2-b")
    tpu = spec.tpu
    assert (tpu.accelerator, tpu.type, tpu.topology) == ("v4-16", None, None)
    assert tpu.runtime == "tpu-ubuntu2204-base"
    assert (tpu.slices, tpu.network, tpu.subnetwork, tpu.external_ips) == (
        2,
        "default",
        "my-subnet",
        True,
    )
    assert tpu.tags == ("tpu-job",)
    assert tpu.labels == {"team": "ml"}
    assert tpu.service_account == "sa@my-project.iam.gserviceaccount.com"
    assert tpu.scopes == ("https://www.googleapis.com/auth/cloud-platform",)
    assert tpu.metadata == {"my-key": "my-value"}
    assert tpu.description == "optional text"
    assert spec.capacity == CapacitySpec(
        tier="spot", valid_until=timedelta(hours=6), valid_after=timedelta(minutes=10)
    )
    assert spec.checkpoint == CheckpointSpec(
        dir="gs://my-bucket/runs/llama-cpt", autocheckpoint=True
    )
    job = spec.job
    assert job is not None
    assert (job.framework, job.run_name, job.user, job.workdir) == (
        "maxtext",
        "llama-cpt",
        "tpuctl",
        "~/job",
    )
    assert job.code == "gs://my-bucket/code.tar.gz"
    assert job.setup == ("pip install -r requirements.txt",)
    assert job.env == {"WANDB_MODE": "offline"}
    assert job.command == "python3 train.py --steps 10000"
    assert job.parallelism == ParallelismSpec(ici={"fsdp": 8}, dcn={"data": 2})
    assert spec.deadlines == DeadlinesSpec(
        queue=timedelta(hours=2), provision=timedelta(minutes=30)
    )
    assert spec.recovery == RecoverySpec(max_preemptions=10, max_failures=0)


def test_brief_example_reports_its_inconsistency() -> None:
    # fsdp 4 on v4-16: 16 TensorCores are 8 chips, so the ici product must be 8.
    with pytest.raises(SpecErrors) as info:
        load_spec(DATA / "reference-example.yaml")
    reservation, parallelism = info.value.errors  # both, in file order
    assert reservation.path == "capacity.reservation"
    assert "a reservation needs the reserved or reservation-bound tier, not spot" in (
        reservation.message
    )
    assert parallelism.path == "job.parallelism.ici"
    assert "multiply to 4 (fsdp 4), but there are 8 chips" in parallelism.message


def test_minimal_spec_gets_every_default(load: Load, minimal: str) -> None:
    spec = load(minimal).spec
    assert spec.tpu.slices == 1
    assert spec.tpu.external_ips is True
    assert spec.tpu.tags == () and spec.tpu.labels == {} and spec.tpu.metadata == {}
    assert spec.tpu.network is None and spec.tpu.service_account is None
    assert spec.capacity == CapacitySpec(tier="on-demand")
    assert spec.checkpoint == CheckpointSpec()
    assert spec.job is None
    assert spec.deadlines == DeadlinesSpec()
    assert spec.recovery == RecoverySpec(max_preemptions=10, max_failures=0)
    assert spec.project is None and spec.zone is None


def test_job_defaults(load: Load, minimal: str) -> None:
    job = load(minimal + "job:\n  command: python3 train.py\n").spec.job
    assert job is not None
    assert job.run_name == "demo"  # the spec name
    assert (job.framework, job.user, job.workdir, job.code) == ("custom", "tpuctl", "~/job", None)
    assert job.setup == () and job.env == {} and job.parallelism is None


def test_setup_may_be_one_string_and_env_numbers_become_strings(load: Load, minimal: str) -> None:
    job = load(
        minimal
        + "job:\n  command: x\n  setup: pip install .\n  env: {STEPS: 10, LR: 0.5, M: 'no'}\n"
    ).spec.job
    assert job is not None
    assert job.setup == ("pip install .",)
    assert job.env == {"STEPS": "10", "LR": "0.5", "M": "no"}


@pytest.mark.parametrize(
    ("tpu", "accelerator", "type_name", "topology"),
    [
        ("accelerator: v4-16", "v4-16", None, None),
        ("accelerator: V4-16", "v4-16", None, None),
        ("accelerator: ' v5litepod-16 '", "v5litepod-16", None, None),
        ("type: v5litepod\n  topology: 4x4", "v5litepod-16", "v5litepod", "4x4"),
        ("type: v5e\n  topology: 4x4", "v5litepod-16", "v5litepod", "4x4"),
        ("type: V4\n  topology: 2x2x2", "v4-16", "v4", "2x2x2"),
        ("type: v6e\n  topology: 2x4", "v6e-8", "v6e", "2x4"),
    ],
)
def test_accelerator_forms(
    load: Load, tpu: str, accelerator: str, type_name: str | None, topology: str | None
) -> None:
    spec = load(f"apiVersion: tpuctl/v1\nname: demo\ntpu:\n  {tpu}\n  runtime: r\n").spec
    assert spec.tpu.accelerator == accelerator
    assert spec.tpu.type == type_name
    assert spec.tpu.topology == topology


@pytest.mark.parametrize(
    ("capacity", "tier"),
    [
        ("tier: spot", "spot"),
        ("spot: true", "spot"),
        ("reserved: true", "reserved"),
        ("best_effort: true", "best-effort"),
        ("on_demand: true", "on-demand"),
        ("tier: best-effort", "best-effort"),
        ("tier: spot\n  spot: true", "spot"),  # agreeing twice is fine
        ("spot: false", "on-demand"),
        ("tier: reserved\n  reservation: projects/p/locations/z/reservations/r", "reserved"),
    ],
)
def test_tiers(load: Load, minimal: str, capacity: str, tier: str) -> None:
    assert load(minimal + f"capacity:\n  {capacity}\n").spec.capacity.tier == tier


def test_time_bounds(load: Load, minimal: str) -> None:
    capacity = load(
        minimal
        + "capacity:\n  valid_until: 2030-01-31T18:00:00Z\n"
        + "  valid_after: '2030-01-31T10:00:00+02:00'\n"
    ).spec.capacity
    assert capacity.valid_until == datetime(2030, 1, 31, 18, tzinfo=timezone.utc)
    assert isinstance(capacity.valid_after, datetime)
    assert capacity.valid_after.utcoffset() == timedelta(hours=2)
    capacity = load(minimal + "capacity:\n  valid_until: 5400\n").spec.capacity
    assert capacity.valid_until == timedelta(minutes=90)


def test_multislice_on_v5e(load: Load) -> None:
    spec = load(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  accelerator: v5litepod-16\n"
        "  runtime: v2-alpha-tpuv5-lite\n  slices: 4\n"
    ).spec
    assert spec.tpu.slices == 4


def test_merge_keys_and_anchors(load: Load) -> None:
    spec = load(
        "apiVersion: tpuctl/v1\nname: demo\n"
        "tpu:\n  <<: &base {accelerator: v4-8, runtime: r, slices: 3}\n  slices: 2\n"
        "job:\n  command: &cmd python3 train.py\n  setup: [*cmd]\n"
    ).spec
    assert (spec.tpu.accelerator, spec.tpu.slices) == ("v4-8", 2)
    assert spec.job is not None and spec.job.setup == ("python3 train.py",)


def test_locations_point_at_values(write_spec: Callable[..., Path], minimal: str) -> None:
    path = write_spec(minimal + "capacity:\n  tier: spot\n")
    loaded = load_spec(path)
    assert loaded.locations["name"] == SourceLocation(str(path), 2, 7)
    assert loaded.locations["tpu.accelerator"] == SourceLocation(str(path), 4, 16)
    assert loaded.locations["capacity.tier"] == SourceLocation(str(path), 7, 9)
    with pytest.raises(TypeError):
        loaded.locations["name"] = SourceLocation("x")  # type: ignore[index]


def test_stdin(monkeypatch: pytest.MonkeyPatch, minimal: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(minimal))
    assert load_spec("-").spec.source == "<stdin>"
    monkeypatch.setattr(sys, "stdin", io.StringIO(minimal + "zonez: x\n"))
    with pytest.raises(SpecError) as info:
        load_spec("-")
    assert info.value.one_line().startswith("<stdin>:6:1: zonez: unknown key")


def test_text_source_defaults(minimal: str) -> None:
    assert load_spec_text(minimal).spec.source == "<spec>"
    assert load_spec_text(minimal, source="x.yaml").spec.source == "x.yaml"


# --- warnings ---------------------------------------------------------------------------------


def test_runtime_mismatch_warns(load: Load) -> None:
    loaded = load(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  accelerator: v5litepod-8\n"
        "  runtime: v2-alpha-tpuv6e\n"
    )
    assert len(loaded.warnings) == 1
    assert "tpu.runtime: runtime 'v2-alpha-tpuv6e' is meant for v6e" in loaded.warnings[0]
    assert ":5:12: " in loaded.warnings[0]


def test_dcn_tensor_and_root_warn(load: Load, minimal: str) -> None:
    loaded = load(
        minimal.replace("v4-16", "v4-8")
        + "  slices: 2\njob:\n  command: x\n  user: root\n"
        + "  parallelism: {ici: {fsdp: 4}, dcn: {tensor: 2}}\n"
    )
    assert any("job.user: the job runs as root" in text for text in loaded.warnings)
    assert any("job.parallelism.dcn.tensor: tensor parallelism" in text for text in loaded.warnings)
    assert len(loaded.warnings) == 2


def test_local_code_resolves_next_to_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minimal: str
) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    spec_path = project / "spec.yaml"
    spec_path.write_text(minimal + "job:\n  command: x\n  code: ./src\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # not the spec's directory
    loaded = load_spec(spec_path)
    assert loaded.warnings == ()
    assert loaded.spec.job is not None and loaded.spec.job.code == "./src"
    assert resolve_code_path(loaded.spec) == (project / "src").resolve()


def test_missing_local_code_warns(load: Load, minimal: str) -> None:
    loaded = load(minimal + "job:\n  command: x\n  code: ./nothing-here\n")
    assert len(loaded.warnings) == 1
    assert "job.code: local code ./nothing-here does not exist" in loaded.warnings[0]
    assert resolve_code_path(load(minimal).spec) is None


# --- fingerprint ------------------------------------------------------------------------------


def test_fingerprint_is_stable_and_ignores_where_and_formatting(minimal: str) -> None:
    first = spec_fingerprint(load_spec_text(minimal).spec)
    assert len(first) == 12 and int(first, 16) >= 0
    reformatted = (
        "# a comment\napiVersion: tpuctl/v1\ntpu: {runtime: tpu-ubuntu2204-base, "
        "accelerator: V4-16}\nname: demo\nproject: other-project\nzone: europe-west4-a\n"
    )
    assert spec_fingerprint(load_spec_text(reformatted, source="b.yaml").spec) == first
    changed = load_spec_text(minimal + "  slices: 2\n").spec
    assert spec_fingerprint(changed) != first
    with_job = load_spec_text(minimal + "job:\n  command: x\n  env: {A: '1', B: '2'}\n").spec
    reordered = load_spec_text(minimal + "job:\n  env: {B: '2', A: '1'}\n  command: x\n").spec
    assert spec_fingerprint(with_job) == spec_fingerprint(reordered)


def test_fingerprint_is_the_same_across_processes(minimal: str) -> None:
    code = (
        "import sys; from tpuctl.spec.load import load_spec_text, spec_fingerprint;"
        "print(spec_fingerprint(load_spec_text(sys.stdin.read()).spec))"
    )
    text = minimal + "capacity:\n  valid_until: 2030-01-01T00:00:00Z\n"
    result = subprocess.run(
        [sys.executable, "-c", code], input=text, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == spec_fingerprint(load_spec_text(text).spec)


def test_import_stays_light() -> None:
    code = (
        "import sys, tpuctl.spec.load;"
        "heavy = [m for m in sys.modules if m.startswith(('grpc', 'google', 'click', 'rich'))];"
        "print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
