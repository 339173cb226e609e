"""Checkpoint-interval arithmetic: Young's and Daly's intervals for a job MTBF M, save time δ
and restart cost R, and periodic against continuous checkpointing side by side."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_SAVE_SECONDS = 60.0
DEFAULT_RESTART_SECONDS = 600.0


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
