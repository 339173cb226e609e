"""Plan arithmetic for a spec: slices and chips, the mesh check, DCN batch, checkpoint interval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import ClassVar

from tpuctl.envelope import Result
from tpuctl.spec.model import Spec
from tpuctl.topology import Accelerator, from_type_topology, mesh_product, parse_accelerator

# Seed arithmetic from the Multislice docs, measured on v4: 275 TFLOP/s per chip, 4 chips and
# 50 Gbit/s of DCN per host → 22,000 FLOP per DCN bit.
FLOP_PER_DCN_BIT = 22_000
DCN_BITS_PER_PARAMETER_TWO_SLICES = 32  # bits of DCN per parameter per step, 2 slices
DCN_BITS_PER_PARAMETER_MORE_SLICES = 64  # … more than 2 slices
BACKWARD_FLOP_PER_PARAMETER_PER_TOKEN = 4
DOCS_MARGIN_TOKENS = (350_000, 700_000)  # the docs' suggested global batch per pod
DCN_CONSTANTS_GENERATION = "v4"

DEFAULT_SAVE_SECONDS = 60.0
DEFAULT_RESTART_SECONDS = 600.0


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
class BucketPlacement:
    """Where the checkpoint bucket is against the slices' region (`plan --online`, create)."""

    bucket: str  # gs://name
    region: str  # the slices' region, from the zone
    location: str | None  # e.g. US-CENTRAL1, US, NAM4; None when it could not be read
    location_type: str | None  # region | dual-region | multi-region
    ok: bool
    warning: str | None = None


def region_of(zone: str) -> str:
    """`us-central2-b` → `us-central2`."""
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone


def judge_bucket(
    bucket: str,
    zone: str,
    *,
    location: str | None,
    location_type: str | None = None,
    data_locations: tuple[str, ...] = (),
    error: str | None = None,
) -> BucketPlacement:
    """ok when the bucket is in the slices' region (a regional bucket there, or a dual-region
    one that includes it); else a warning saying what each save and restore then costs."""
    region = region_of(zone)
    if location is None:
        return BucketPlacement(
            bucket,
            region,
            None,
            None,
            ok=False,
            warning=f"could not read the location of {bucket}: {error or 'unknown'}",
        )
    places = {location.lower(), *(place.lower() for place in data_locations)}
    ok = region.lower() in places
    kind = (location_type or "").lower() or "location"
    warning = None
    if not ok:
        warning = (
            f"checkpoint bucket {bucket} is in {location} ({kind}), the slices in {region}: "
            "every save and restore crosses regions (slower, and billed as network egress); "
            f"use a bucket in {region}"
        )
    return BucketPlacement(bucket, region, location, location_type, ok=ok, warning=warning)


@dataclass(frozen=True)
class CheckpointMode:
    """One way of checkpointing: how often a checkpoint commits, what a failure loses."""

    mode: str  # "periodic" (every interval, Daly's) or "continuous" (one save after another)
    interval_seconds: float
    interval_steps: int | None  # with the step time
    lost_work_per_failure_seconds: float
    lost_steps_per_failure: float | None  # with the step time
    waste_fraction: float


@dataclass(frozen=True)
class CheckpointPlan:
    """Checkpoint interval by Young and Daly for a job MTBF M, save time δ and restart cost R,
    and both modes side by side: periodic at Daly's interval, and continuous."""

    mtbf_seconds: float  # M of the whole job
    mtbf_basis: str  # "job" or "per-host MTBF / N hosts"
    save_seconds: float  # δ
    restart_seconds: float  # R
    young_interval_seconds: float
    daly_interval_seconds: float
    waste_fraction: float  # at Daly's interval
    lost_work_per_failure_seconds: float  # (τ + δ) / 2 for blocking saves
    step_seconds: float | None = None
    selected: str = "periodic"  # the spec's mode (checkpoint.continuous)
    modes: tuple[CheckpointMode, ...] = ()
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


def accelerator_of(spec: Spec) -> Accelerator:
    """The catalog entry for the spec's slices (`type`+`topology` wins when both are set)."""
    if spec.tpu.type and spec.tpu.topology:
        return from_type_topology(spec.tpu.type, spec.tpu.topology)
    return parse_accelerator(spec.tpu.accelerator)


def make_plan(
    spec: Spec,
    *,
    mtbf: timedelta | None = None,
    mtbf_per_host: bool = False,
    save_seconds: float | None = None,
    restart_seconds: float = DEFAULT_RESTART_SECONDS,
    step_seconds: float | None = None,
    bucket: BucketPlacement | None = None,
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
    )


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


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young: τ ≈ √(2δM)."""
    return math.sqrt(2 * save_seconds * mtbf_seconds)


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly: τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M."""
    delta, m = save_seconds, mtbf_seconds
    if delta >= 2 * m:
        return m
    ratio = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta


def waste_fraction(
    interval_seconds: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float
) -> float:
    """δ/τ + (τ+δ)/(2M) + R/M: time saving, redoing lost work, and restarting."""
    tau, delta, m = interval_seconds, save_seconds, mtbf_seconds
    return delta / tau + (tau + delta) / (2 * m) + restart_seconds / m


def checkpoint_plan(
    *,
    mtbf_seconds: float,
    save_seconds: float,
    restart_seconds: float,
    basis: str = "job",
    save_assumed: bool = False,
    autocheckpoint: bool = False,
    step_seconds: float | None = None,
    continuous: bool = False,
) -> CheckpointPlan:
    """Young and Daly intervals, the waste at Daly's, the expected loss per failure, and the
    periodic and continuous modes side by side."""
    if mtbf_seconds <= 0 or save_seconds <= 0 or restart_seconds < 0:
        raise ValueError("MTBF and save time must be positive, restart time not negative")
    if step_seconds is not None and step_seconds <= 0:
        raise ValueError("the step time must be positive")
    daly = daly_interval(save_seconds, mtbf_seconds)
    waste = waste_fraction(daly, save_seconds, mtbf_seconds, restart_seconds)
    notes: list[str] = []
    if save_assumed:
        notes.append(f"save time assumed {save_seconds:g} s (--save-seconds)")
    if step_seconds is None:
        notes.append("no step time (--step-seconds): intervals in seconds only")
    if waste >= 1:
        notes.append("waste ≥ 100%: failures come faster than the job can save and restart")
    if autocheckpoint:
        notes.append("autocheckpoint on: an announced maintenance event loses ~0 work")
    notes.append(
        "periodic: Young and Daly's model, each save stalling training for δ (asynchronous "
        "saves stall less and lose the same)"
    )
    notes.append(
        "continuous: each save starts once the previous one has committed, at a step "
        "boundary; saves are taken to be asynchronous (no stall), so storage is written all "
        "the time and checkpoint.keep bounds what is kept"
    )
    notes.append("Cloud TPU's maintenance guide suggests checkpointing about hourly")
    modes = (
        periodic_mode(daly, save_seconds, mtbf_seconds, restart_seconds, step_seconds),
        continuous_mode(save_seconds, mtbf_seconds, restart_seconds, step_seconds),
    )
    return CheckpointPlan(
        mtbf_seconds=mtbf_seconds,
        mtbf_basis=basis,
        save_seconds=save_seconds,
        restart_seconds=restart_seconds,
        young_interval_seconds=young_interval(save_seconds, mtbf_seconds),
        daly_interval_seconds=daly,
        waste_fraction=waste,
        lost_work_per_failure_seconds=(daly + save_seconds) / 2,
        step_seconds=step_seconds,
        selected="continuous" if continuous else "periodic",
        modes=modes,
        notes=tuple(notes),
    )


def _steps(seconds: float, step_seconds: float | None) -> float | None:
    return None if step_seconds is None else seconds / step_seconds


def periodic_mode(
    daly: float,
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float,
    step_seconds: float | None,
) -> CheckpointMode:
    """A save every Daly interval (in whole steps when the step time is known), blocking for
    δ: a failure loses (τ + δ)/2 on average."""
    steps = None if step_seconds is None else max(1, round(daly / step_seconds))
    tau = daly if steps is None or step_seconds is None else steps * step_seconds
    lost = (tau + save_seconds) / 2
    return CheckpointMode(
        mode="periodic",
        interval_seconds=tau,
        interval_steps=steps,
        lost_work_per_failure_seconds=lost,
        lost_steps_per_failure=_steps(lost, step_seconds),
        waste_fraction=waste_fraction(tau, save_seconds, mtbf_seconds, restart_seconds),
    )


def continuous_mode(
    save_seconds: float, mtbf_seconds: float, restart_seconds: float, step_seconds: float | None
) -> CheckpointMode:
    """A save starts at the first step boundary after the previous one committed, so one
    commits every I = ⌈δ/step⌉ steps; the newest committed state is δ to δ+I old at a failure,
    δ + I/2 on average. Asynchronous saves: the waste is only lost work and restarts."""
    steps = None if step_seconds is None else max(1, math.ceil(save_seconds / step_seconds))
    interval = save_seconds if steps is None or step_seconds is None else steps * step_seconds
    lost = save_seconds + interval / 2
    return CheckpointMode(
        mode="continuous",
        interval_seconds=interval,
        interval_steps=steps,
        lost_work_per_failure_seconds=lost,
        lost_steps_per_failure=_steps(lost, step_seconds),
        waste_fraction=(lost + restart_seconds) / mtbf_seconds,
    )
