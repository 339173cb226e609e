"""What each capacity rung costs an hour, from a small table of public list prices that a user
can override, and how many flex-start runs a job needs (pure arithmetic).

The table: Cloud TPU's public list prices per chip-hour in US regions, on-demand and with a
1-year commitment (what `reserved` capacity is billed at), from https://cloud.google.com/tpu/pricing
as read on PRICES_READ. Spot, flex-start and best-effort prices move with supply and differ by
region: the table has none, and `plan` says so until a prices file gives them. Prices differ by
region and change: `plan --prices FILE` (or TPUCTL_PRICES) lays a file over the table, YAML or
JSON, `{generation: {tier: dollars per chip-hour}}`, e.g. `{v6e: {spot: 1.1, flex-start: 1.6}}`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuctl.errors import UsageError
from tpuctl.spec.model import TIERS

PRICES_SOURCE = "https://cloud.google.com/tpu/pricing"
PRICES_READ = "2025-06"
PRICES_ENV = "TPUCTL_PRICES"

# Dollars per chip-hour: on-demand and 1-year committed (reserved) list prices, US regions.
PRICES: dict[str, dict[str, float]] = {
    "v4": {"on-demand": 3.22, "reserved": 2.03},
    "v5e": {"on-demand": 1.20, "reserved": 0.84},
    "v5p": {"on-demand": 4.20, "reserved": 2.94},
    "v6e": {"on-demand": 2.70, "reserved": 1.89},
}


@dataclass(frozen=True)
class RungPrice:
    """One rung of the capacity ladder (or the spec's one tier) and what it costs."""

    rung: str
    tier: str
    chip_hour: float | None  # dollars per chip-hour; None: not in the table
    hour: float | None  # dollars per hour for every chip of every slice


@dataclass(frozen=True)
class RunsPlan:
    """How many flex-start runs the job needs at the expected step time."""

    runs: int
    work_seconds: float  # target_step × the step time
    useful_seconds: float  # of one run: its duration less the stop lead and the restart
    max_run_seconds: float
    lead_seconds: float
    restart_seconds: float


def load_prices(path: str | None) -> dict[str, dict[str, float]]:
    """The table with the file at `path` laid over it (generation by generation)."""
    table = {generation: dict(tiers) for generation, tiers in PRICES.items()}
    if not path:
        return table
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(
            f"cannot read the prices file {path}: {error}",
            hint="give a YAML or JSON file like {v6e: {spot: 1.1, flex-start: 1.6}}",
        ) from None
    if not isinstance(data, Mapping):
        raise UsageError(
            f"{path}: expected a mapping of generations to tiers and prices",
            hint="e.g. {v6e: {spot: 1.1, flex-start: 1.6}} (dollars per chip-hour)",
        )
    for generation, tiers in data.items():
        if not isinstance(tiers, Mapping):
            raise UsageError(f"{path}: {generation}: expected a mapping of tiers to prices")
        for tier, price in tiers.items():
            if tier not in TIERS or isinstance(price, bool) or not isinstance(price, (int, float)):
                raise UsageError(
                    f"{path}: {generation}.{tier}: expected a tier ({', '.join(TIERS)}) and a "
                    "price in dollars per chip-hour"
                )
            table.setdefault(str(generation), {})[str(tier)] = float(price)
    return table


def rung_price(
    rung: str, tier: str, generation: str, chips: int, table: Mapping[str, Mapping[str, float]]
) -> RungPrice:
    per_chip = table.get(generation, {}).get(tier)
    return RungPrice(rung, tier, per_chip, None if per_chip is None else per_chip * chips)


def runs_needed(
    *, target_step: int, step_seconds: float, max_run_seconds: float, lead_seconds: float,
    restart_seconds: float,
) -> RunsPlan:  # fmt: skip
    """ceil(work ÷ what one run trains): each run loses its stop lead before the end and the
    restart (boot, set-up, resuming) at its start."""
    useful = max(0.0, max_run_seconds - lead_seconds - restart_seconds)
    work = target_step * step_seconds
    runs = math.ceil(work / useful) if useful > 0 else 0
    return RunsPlan(runs, work, useful, max_run_seconds, lead_seconds, restart_seconds)
