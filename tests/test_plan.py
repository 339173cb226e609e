"""Plan arithmetic: sizes, the mesh check, the DCN batch minimum, Young and Daly intervals,
periodic against continuous checkpointing, and the checkpoint bucket's region."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from datetime import timedelta

import pytest

from tpuctl.plan import (
    checkpoint_plan,
    daly_interval,
    dcn_arithmetic,
    judge_bucket,
    make_plan,
    region_of,
    waste_fraction,
    young_interval,
)
from tpuctl.spec.model import JobSpec, ParallelismSpec, Spec, TpuSpec

MINUTE = 60.0
HOUR = 3600.0


def make_spec(
    accelerator: str = "v4-16",
    slices: int = 1,
    *,
    ici: dict[str, int] | None = None,
    dcn: dict[str, int] | None = None,
    job: bool = True,
) -> Spec:
    parallelism = None
    if ici is not None or dcn is not None:
        parallelism = ParallelismSpec(ici=ici or {}, dcn=dcn or {})
    return Spec(
        name="demo",
        tpu=TpuSpec(accelerator=accelerator, runtime="tpu-ubuntu2204-base", slices=slices),
        job=JobSpec(command="python train.py", parallelism=parallelism) if job else None,
    )


def test_sizes_per_slice_and_total() -> None:
    plan = make_plan(make_spec("v4-32", slices=4))
    assert (plan.accelerator, plan.generation, plan.topology) == ("v4-32", "v4", "2x2x4")
    assert (plan.slices, plan.vms_per_slice, plan.vms_total) == (4, 4, 16)
    assert (plan.chips_per_slice, plan.chips_total) == (16, 64)
    assert (plan.tensorcores_per_slice, plan.tensorcores_total) == (32, 128)
    assert plan.chips_per_vm == 4


def test_type_topology_spec_uses_the_given_topology() -> None:
    spec = make_spec("v5litepod-8")
    spec = replace(spec, tpu=replace(spec.tpu, type="v5litepod", topology="4x2"))
    plan = make_plan(spec)
    assert (plan.accelerator, plan.topology, plan.chips_per_vm, plan.vms_per_slice) == (
        "v5litepod-8",
        "4x2",
        8,
        1,
    )


def test_parallelism_ok() -> None:
    plan = make_plan(make_spec("v4-16", slices=2, ici={"fsdp": 4, "tensor": 2}, dcn={"data": 2}))
    assert plan.parallelism is not None
    assert plan.parallelism.ok
    assert plan.parallelism.ici.product == 8 and plan.parallelism.ici.expected == 8
    assert plan.parallelism.dcn.product == 2 and plan.parallelism.dcn.expected == 2
    assert plan.parallelism.ici.message == "ici: fsdp 4 × tensor 2 = 8, chips per slice = 8: ok"
    assert plan.parallelism.warnings == ()


def test_parallelism_mismatch_reports_both_numbers() -> None:
    plan = make_plan(make_spec("v4-16", slices=4, ici={"fsdp": 16}, dcn={"data": 2}))
    check = plan.parallelism
    assert check is not None and not check.ok
    assert not check.ici.ok and (check.ici.product, check.ici.expected) == (16, 8)
    assert "mismatch" in check.ici.message
    assert not check.dcn.ok and (check.dcn.product, check.dcn.expected) == (2, 4)
    assert check.dcn.message == "dcn: data 2 = 2, slices = 4: mismatch"


def test_dcn_tensor_is_flagged() -> None:
    plan = make_plan(make_spec("v4-16", slices=2, ici={"fsdp": 8}, dcn={"tensor": 2}))
    check = plan.parallelism
    assert check is not None
    assert check.ici.ok and check.dcn.ok
    assert check.dcn_tensor == 2
    assert not check.ok
    assert any("dcn tensor = 2" in warning for warning in check.warnings)


def test_missing_dcn_axes_mean_one_slice() -> None:
    check = make_plan(make_spec("v4-8", ici={"data": 4})).parallelism
    assert check is not None and check.ok
    assert check.dcn.product == 1 and check.dcn.message.startswith("dcn: (none) = 1")


def test_no_job_or_no_parallelism_is_said() -> None:
    without_job = make_plan(make_spec(job=False))
    assert without_job.parallelism is None
    assert any("no job" in note for note in without_job.notes)
    without_mesh = make_plan(make_spec())
    assert without_mesh.parallelism is None
    assert any("no job.parallelism" in note for note in without_mesh.notes)


@pytest.mark.parametrize(
    ("slices", "bits", "minimum"), [(2, 32, 176_000), (3, 64, 352_000), (64, 64, 352_000)]
)
def test_dcn_minimum_batch(slices: int, bits: int, minimum: int) -> None:
    dcn = dcn_arithmetic(slices, "v4")
    assert dcn.dcn_bits_per_parameter == bits
    assert dcn.min_global_batch_tokens == minimum
    # 4·B/bits ≥ 22,000 FLOP per DCN bit, exactly at the minimum.
    assert 4 * dcn.min_global_batch_tokens / bits == 22_000
    assert dcn.min_batch_tokens_per_slice == math.ceil(minimum / slices)
    assert dcn.docs_margin_tokens == (350_000, 700_000)
    assert not any("constants are v4's" in note for note in dcn.notes)


def test_dcn_constants_flagged_for_other_generations() -> None:
    dcn = dcn_arithmetic(2, "v5e")
    assert any("constants are v4's" in note for note in dcn.notes)


def test_single_slice_has_no_dcn_arithmetic() -> None:
    plan = make_plan(make_spec(slices=1))
    assert plan.dcn is None
    assert make_plan(make_spec(slices=2)).dcn is not None


def test_young_interval() -> None:
    assert young_interval(5 * MINUTE, 24 * HOUR) == pytest.approx(120 * MINUTE)


@pytest.mark.parametrize(
    ("mtbf", "expected_minutes", "tolerance"),
    [(24 * HOUR, 117, 0.5), (6 * HOUR, 57, 0.5), (15 * MINUTE, 9.1, 0.05)],
)
def test_daly_check_cases(mtbf: float, expected_minutes: float, tolerance: float) -> None:
    """Daly's own cases from reference/checkpoints.md (R = 10 min, δ = 5 min)."""
    assert daly_interval(5 * MINUTE, mtbf) / MINUTE == pytest.approx(
        expected_minutes, abs=tolerance
    )
    plan = checkpoint_plan(mtbf_seconds=mtbf, save_seconds=5 * MINUTE, restart_seconds=10 * MINUTE)
    assert plan.daly_interval_seconds / MINUTE == pytest.approx(expected_minutes, abs=tolerance)


def test_daly_when_save_exceeds_twice_mtbf_is_mtbf() -> None:
    assert daly_interval(save_seconds=100, mtbf_seconds=50) == 50
    assert daly_interval(save_seconds=100, mtbf_seconds=49.9) == 49.9


def test_waste_and_lost_work() -> None:
    plan = checkpoint_plan(
        mtbf_seconds=24 * HOUR, save_seconds=5 * MINUTE, restart_seconds=10 * MINUTE
    )
    tau = plan.daly_interval_seconds
    expected = 300 / tau + (tau + 300) / (2 * 24 * HOUR) + 600 / (24 * HOUR)
    assert plan.waste_fraction == pytest.approx(expected)
    assert plan.waste_fraction == pytest.approx(
        waste_fraction(tau, 5 * MINUTE, 24 * HOUR, 10 * MINUTE)
    )
    assert 0.085 < plan.waste_fraction < 0.10  # ~9.2%
    assert plan.lost_work_per_failure_seconds == pytest.approx((tau + 300) / 2)


def test_young_is_the_first_order_optimum() -> None:
    """Young's τ minimises the first-order waste model; Daly's is close to it (within 0.1%)."""
    delta, m, r = 60.0, 6 * HOUR, 600.0
    young = young_interval(delta, m)
    best = waste_fraction(young, delta, m, r)
    assert best < waste_fraction(young * 0.8, delta, m, r)
    assert best < waste_fraction(young * 1.25, delta, m, r)
    assert waste_fraction(daly_interval(delta, m), delta, m, r) == pytest.approx(best, abs=1e-3)


def test_mtbf_is_the_jobs_unless_per_host() -> None:
    spec = make_spec("v4-32", slices=2)  # 8 hosts
    job = make_plan(spec, mtbf=timedelta(hours=24), save_seconds=300)
    assert job.checkpoint is not None
    assert job.checkpoint.mtbf_seconds == 24 * HOUR
    assert job.checkpoint.mtbf_basis == "job"
    per_host = make_plan(spec, mtbf=timedelta(hours=24), mtbf_per_host=True, save_seconds=300)
    assert per_host.checkpoint is not None
    assert per_host.checkpoint.mtbf_seconds == 3 * HOUR
    assert "8 hosts" in per_host.checkpoint.mtbf_basis


def test_restart_and_save_defaults() -> None:
    plan = make_plan(make_spec(), mtbf=timedelta(hours=6))
    assert plan.checkpoint is not None
    assert plan.checkpoint.save_seconds == 60
    assert plan.checkpoint.restart_seconds == 600
    assert any("assumed 60 s" in note for note in plan.checkpoint.notes)


def test_no_mtbf_means_no_checkpoint_plan() -> None:
    plan = make_plan(make_spec())
    assert plan.checkpoint is None
    assert any("--mtbf" in note for note in plan.notes)


def test_checkpoint_rejects_non_positive_inputs() -> None:
    with pytest.raises(ValueError, match="positive"):
        checkpoint_plan(mtbf_seconds=0, save_seconds=60, restart_seconds=600)


def test_plan_is_json_friendly() -> None:
    plan = make_plan(
        make_spec("v4-16", slices=4, ici={"fsdp": 8}, dcn={"data": 4}),
        mtbf=timedelta(hours=24),
    )
    decoded = json.loads(json.dumps(asdict(plan)))
    assert decoded["chips_total"] == 32
    assert decoded["parallelism"]["ok"] is True
    assert decoded["dcn"]["min_global_batch_tokens"] == 352_000
    assert decoded["checkpoint"]["mtbf_basis"] == "job"


def test_periodic_and_continuous_side_by_side_in_steps() -> None:
    plan = checkpoint_plan(
        mtbf_seconds=24 * HOUR, save_seconds=30, restart_seconds=600, step_seconds=2
    )
    periodic, continuous = plan.modes
    assert (periodic.mode, continuous.mode) == ("periodic", "continuous")
    assert plan.step_seconds == 2 and plan.selected == "periodic"
    # Periodic: Daly's interval in whole steps, (τ + δ)/2 lost on average.
    assert periodic.interval_steps == round(plan.daly_interval_seconds / 2)
    assert periodic.interval_seconds == periodic.interval_steps * 2
    assert periodic.lost_work_per_failure_seconds == pytest.approx(
        (periodic.interval_seconds + 30) / 2
    )
    assert periodic.lost_steps_per_failure == pytest.approx(
        periodic.lost_work_per_failure_seconds / 2
    )
    # Continuous: a save every ⌈δ/step⌉ = 15 steps; δ + I/2 = 45 s = 22.5 steps lost.
    assert (continuous.interval_steps, continuous.interval_seconds) == (15, 30)
    assert continuous.lost_work_per_failure_seconds == 45
    assert continuous.lost_steps_per_failure == 22.5
    assert continuous.waste_fraction == pytest.approx((45 + 600) / (24 * HOUR))
    assert continuous.lost_work_per_failure_seconds < periodic.lost_work_per_failure_seconds


def test_continuous_with_a_step_longer_than_the_save_commits_every_step() -> None:
    plan = checkpoint_plan(
        mtbf_seconds=HOUR, save_seconds=5, restart_seconds=60, step_seconds=12, continuous=True
    )
    continuous = plan.modes[1]
    assert plan.selected == "continuous"
    assert (continuous.interval_steps, continuous.interval_seconds) == (1, 12)
    assert continuous.lost_work_per_failure_seconds == 5 + 6


def test_without_a_step_time_the_modes_are_in_seconds_only() -> None:
    plan = checkpoint_plan(mtbf_seconds=HOUR, save_seconds=20, restart_seconds=60)
    assert all(m.interval_steps is None and m.lost_steps_per_failure is None for m in plan.modes)
    assert plan.modes[1].interval_seconds == 20
    assert any("--step-seconds" in note for note in plan.notes)
    with pytest.raises(ValueError, match="step time"):
        checkpoint_plan(mtbf_seconds=HOUR, save_seconds=20, restart_seconds=60, step_seconds=0)


@pytest.mark.parametrize(
    ("location", "kind", "data", "ok"),
    [
        ("US-CENTRAL2", "region", (), True),
        ("us-central2", "region", (), True),
        ("US-EAST1", "region", (), False),
        ("US", "multi-region", (), False),
        ("US", "dual-region", ("US-CENTRAL2", "US-EAST1"), True),
        ("NAM4", "dual-region", (), False),
    ],
)
def test_the_bucket_must_be_in_the_slices_region(
    location: str, kind: str, data: tuple[str, ...], ok: bool
) -> None:
    placement = judge_bucket(
        "gs://b", "us-central2-b", location=location, location_type=kind, data_locations=data
    )
    assert placement.region == "us-central2" and placement.ok is ok
    if ok:
        assert placement.warning is None
    else:
        assert placement.warning is not None
        assert f"gs://b is in {location} ({kind}), the slices in us-central2" in placement.warning
        assert "use a bucket in us-central2" in placement.warning


def test_an_unreadable_bucket_location_is_a_warning_not_a_verdict() -> None:
    placement = judge_bucket("gs://b", "europe-west4-a", location=None, error="403 Forbidden")
    assert not placement.ok and placement.location is None
    assert placement.warning == "could not read the location of gs://b: 403 Forbidden"
    assert region_of("europe-west4-a") == "europe-west4" and region_of("local") == "local"
