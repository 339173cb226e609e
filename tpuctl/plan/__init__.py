"""Plan arithmetic for a spec: slices and chips, the mesh check, DCN batch; the checkpoint
arithmetic is tpuctl.plan.checkpoints, the bucket's placement tpuctl.plan.bucket."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import ClassVar

from tpuctl.envelope import Result
from tpuctl.plan.bucket import BucketPlacement, judge_bucket, region_of
from tpuctl.plan.checkpoints import (
    DEFAULT_RESTART_SECONDS,
    DEFAULT_SAVE_SECONDS,
    CheckpointMode,
    CheckpointPlan,
    checkpoint_plan,
    continuous_mode,
    daly_interval,
    periodic_mode,
    waste_fraction,
    young_interval,
)
from tpuctl.plan.prices import PRICES, RungPrice, RunsPlan, rung_price, runs_needed
from tpuctl.spec.model import Spec
from tpuctl.topology import Accelerator, from_type_topology, mesh_product, parse_accelerator

__all__ = [
    "DEFAULT_RESTART_SECONDS",
    "DEFAULT_SAVE_SECONDS",
    "AxisCheck",
    "BucketPlacement",
    "CheckpointMode",
    "CheckpointPlan",
    "DcnArithmetic",
    "ParallelismCheck",
    "Plan",
    "RungPrice",
    "RunsPlan",
    "accelerator_of",
    "check_parallelism",
    "checkpoint_plan",
    "continuous_mode",
    "daly_interval",
    "dcn_arithmetic",
    "judge_bucket",
    "make_plan",
    "periodic_mode",
    "region_of",
    "waste_fraction",
    "young_interval",
]

# Seed arithmetic from the Multislice docs, measured on v4: 275 TFLOP/s per chip, 4 chips and
# 50 Gbit/s of DCN per host → 22,000 FLOP per DCN bit.
FLOP_PER_DCN_BIT = 22_000
DCN_BITS_PER_PARAMETER_TWO_SLICES = 32  # bits of DCN per parameter per step, 2 slices
DCN_BITS_PER_PARAMETER_MORE_SLICES = 64  # … more than 2 slices
BACKWARD_FLOP_PER_PARAMETER_PER_TOKEN = 4
DOCS_MARGIN_TOKENS = (350_000, 700_000)  # the docs' suggested global batch per pod
DCN_CONSTANTS_GENERATION = "v4"


@dataclass(frozen=True)
class AxisCheck:
    """One product check: `ici` axes against chips per slice, or `dcn` axes against slices."""

    axes: dict[str, int]
    product: int
    expected: int
    expected_what: str  # "chips per slice" or "slices"
    ok: bool
    message: str


@dataclass(frozen=True)
class ParallelismCheck:
    ici: AxisCheck
    dcn: AxisCheck
    dcn_tensor: int
    ok: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DcnArithmetic:
    """Minimum global batch (tokens) for data parallelism across slices to stay compute-bound."""

    slices: int
    dcn_bits_per_parameter: int
    flop_per_dcn_bit: int
    min_global_batch_tokens: int
    min_batch_tokens_per_slice: int
    docs_margin_tokens: tuple[int, int]
    constants_generation: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan(Result):
    """Everything `tpuctl plan` reports; JSON-friendly (ints, floats, strings, dicts)."""

    KIND: ClassVar[str] = "Plan"
    name: str
    accelerator: str
    generation: str
    topology: str
    slices: int
    vms_per_slice: int
    vms_total: int
    chips_per_slice: int
    chips_total: int
    tensorcores_per_slice: int
    tensorcores_total: int
    chips_per_vm: int
    parallelism: ParallelismCheck | None
    dcn: DcnArithmetic | None
    checkpoint: CheckpointPlan | None
    bucket: BucketPlacement | None = None
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    # What each rung of the capacity ladder (or the one tier) costs an hour.
    capacity: tuple[RungPrice, ...] = field(default=())
    # A flex-start job with a target step and a step time: how many runs it needs.
    runs: RunsPlan | None = None


def accelerator_of(spec: Spec) -> Accelerator:
    """The catalog entry for the spec's slices (`type`+`topology` wins when both are set)."""
    if spec.tpu.type and spec.tpu.topology:
        return from_type_topology(spec.tpu.type, spec.tpu.topology, api=spec.tpu.api)
    return parse_accelerator(spec.tpu.accelerator, api=spec.tpu.api)


def make_plan(
    spec: Spec,
    *,
    mtbf: timedelta | None = None,
    mtbf_per_host: bool = False,
    save_seconds: float | None = None,
    restart_seconds: float = DEFAULT_RESTART_SECONDS,
    step_seconds: float | None = None,
    bucket: BucketPlacement | None = None,
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> Plan:
    """Pure arithmetic over a loaded spec; `mtbf` is the job's unless `mtbf_per_host`.
    `bucket` is what `plan --online` found about the checkpoint bucket, if anything."""
    accelerator = accelerator_of(spec)
    slices = spec.tpu.slices
    totals = accelerator.totals(slices)
    notes: list[str] = []

    parallelism = None
    if spec.job is None:
        notes.append("the spec has no job: no parallelism to check")
    elif spec.job.parallelism is None:
        notes.append("the spec has no job.parallelism: no mesh to check")
    else:
        mesh = spec.job.parallelism
        parallelism = check_parallelism(
            mesh.ici, mesh.dcn, chips_per_slice=accelerator.chips, slices=slices
        )

    dcn = dcn_arithmetic(slices, accelerator.generation) if slices > 1 else None
    if dcn is None:
        notes.append("one slice: no DCN traffic between slices")

    checkpoint = None
    if mtbf is None:
        notes.append("no MTBF given (--mtbf): checkpoint interval not computed")
    else:
        hosts = totals["vms"]
        job_mtbf = mtbf.total_seconds() / hosts if mtbf_per_host else mtbf.total_seconds()
        basis = f"per-host MTBF / {hosts} hosts" if mtbf_per_host else "job"
        checkpoint = checkpoint_plan(
            mtbf_seconds=job_mtbf,
            save_seconds=DEFAULT_SAVE_SECONDS if save_seconds is None else save_seconds,
            restart_seconds=restart_seconds,
            basis=basis,
            save_assumed=save_seconds is None,
            autocheckpoint=spec.checkpoint.autocheckpoint,
            step_seconds=step_seconds,
            continuous=spec.checkpoint.continuous,
        )
    warnings: list[str] = []
    if bucket is not None and bucket.warning:
        warnings.append(bucket.warning)
    elif bucket is None and (spec.checkpoint.dir or "").startswith("gs://"):
        notes.append("the checkpoint bucket's location was not checked (plan --online)")

    capacity, runs = _capacity_plan(
        spec,
        accelerator=accelerator,
        chips=totals["chips"],
        prices=prices or PRICES,
        step_seconds=step_seconds,
        restart_seconds=restart_seconds,
        notes=notes,
    )
    return Plan(
        name=spec.name,
        accelerator=accelerator.accelerator_type,
        generation=accelerator.generation,
        topology=accelerator.topology,
        slices=slices,
        vms_per_slice=accelerator.vms,
        vms_total=totals["vms"],
        chips_per_slice=accelerator.chips,
        chips_total=totals["chips"],
        tensorcores_per_slice=accelerator.tensorcores,
        tensorcores_total=totals["tensorcores"],
        chips_per_vm=accelerator.chips_per_vm,
        parallelism=parallelism,
        dcn=dcn,
        checkpoint=checkpoint,
        bucket=bucket,
        notes=tuple(notes),
        warnings=tuple(warnings),
        capacity=capacity,
        runs=runs,
    )


def _capacity_plan(
    spec: Spec,
    *,
    accelerator: Accelerator,
    chips: int,
    prices: Mapping[str, Mapping[str, float]],
    step_seconds: float | None,
    restart_seconds: float,
    notes: list[str],
) -> tuple[tuple[RungPrice, ...], RunsPlan | None]:
    from tpuctl.spec.ladder import rung_names, rung_specs
    from tpuctl.worker import AUTOCHECKPOINT_GRACE_SECONDS

    rungs = rung_specs(spec)
    names = rung_names(spec) or (spec.capacity.tier,)
    priced = tuple(
        rung_price(name, rung.capacity.tier, accelerator.generation, chips, prices)
        for name, rung in zip(names, rungs, strict=True)
    )
    if any(price.chip_hour is None for price in priced):
        notes.append(
            "the price table has no price for some tiers here (plan --prices FILE gives them)"
        )
    flex = next((rung for rung in rungs if rung.capacity.tier == "flex-start"), None)
    if flex is None or flex.capacity.max_run_duration is None:
        return priced, None
    target = spec.job.target_step if spec.job is not None else None
    if target is None or step_seconds is None:
        notes.append(
            "flex-start: give job.target_step and --step-seconds for the number of runs the "
            "job needs"
        )
        return priced, None
    runs = runs_needed(
        target_step=target,
        step_seconds=step_seconds,
        max_run_seconds=flex.capacity.max_run_duration.total_seconds(),
        lead_seconds=AUTOCHECKPOINT_GRACE_SECONDS,
        restart_seconds=restart_seconds,
    )
    return priced, runs


def check_parallelism(
    ici: dict[str, int], dcn: dict[str, int], *, chips_per_slice: int, slices: int
) -> ParallelismCheck:
    """ici product = chips per slice, dcn product = slices; dcn tensor should be 1."""
    ici_check = _axis_check("ici", ici, chips_per_slice, "chips per slice")
    dcn_check = _axis_check("dcn", dcn, slices, "slices")
    dcn_tensor = dcn.get("tensor", 1)
    warnings: list[str] = []
    if dcn_tensor > 1:
        warnings.append(
            f"dcn tensor = {dcn_tensor}: tensor parallelism across slices is bandwidth-bound "
            "over DCN; keep tensor on ici and use data or fsdp on dcn"
        )
    return ParallelismCheck(
        ici=ici_check,
        dcn=dcn_check,
        dcn_tensor=dcn_tensor,
        ok=ici_check.ok and dcn_check.ok and dcn_tensor <= 1,
        warnings=tuple(warnings),
    )


def _axis_check(kind: str, axes: dict[str, int], expected: int, what: str) -> AxisCheck:
    product = mesh_product(axes)
    shown = " × ".join(f"{name} {size}" for name, size in axes.items()) or "(none)"
    ok = product == expected
    verdict = "ok" if ok else "mismatch"
    message = f"{kind}: {shown} = {product}, {what} = {expected}: {verdict}"
    return AxisCheck(dict(axes), product, expected, what, ok, message)


def dcn_arithmetic(slices: int, generation: str) -> DcnArithmetic:
    """B ≥ FLOP_PER_DCN_BIT · bits / 4 tokens so the backward pass hides the DCN all-reduce."""
    bits = DCN_BITS_PER_PARAMETER_TWO_SLICES if slices <= 2 else DCN_BITS_PER_PARAMETER_MORE_SLICES
    minimum = FLOP_PER_DCN_BIT * bits // BACKWARD_FLOP_PER_PARAMETER_PER_TOKEN
    notes = [
        f"data parallelism over DCN needs a global batch of at least ~{minimum:,} tokens "
        f"(4·B/{bits} ≥ {FLOP_PER_DCN_BIT:,} FLOP per DCN bit); the docs suggest "
        f"{DOCS_MARGIN_TOKENS[0]:,}–{DOCS_MARGIN_TOKENS[1]:,} tokens per pod for margin"
    ]
    if generation != DCN_CONSTANTS_GENERATION:
        notes.append(
            f"the constants are v4's (275 TFLOP/s per chip, 50 Gbit/s per host); "
            f"{generation} differs, so treat the minimum as an estimate"
        )
    return DcnArithmetic(
        slices=slices,
        dcn_bits_per_parameter=bits,
        flop_per_dcn_bit=FLOP_PER_DCN_BIT,
        min_global_batch_tokens=minimum,
        min_batch_tokens_per_slice=math.ceil(minimum / slices),
        docs_margin_tokens=DOCS_MARGIN_TOKENS,
        constants_generation=DCN_CONSTANTS_GENERATION,
        notes=tuple(notes),
    )
