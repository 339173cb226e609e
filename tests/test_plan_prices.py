"""plan's capacity lines: each rung's price per hour from the table or a prices file, and the
number of flex-start runs a job needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.errors import UsageError
from tpuctl.plan import make_plan
from tpuctl.plan.prices import load_prices
from tpuctl.spec.load import load_spec_text

LADDER = """apiVersion: tpuctl/v1
name: ladder
tpu: {accelerator: v6e-16, runtime: v2-alpha-tpuv6e}
capacity:
  fallback:
    - {tier: spot}
    - {tier: flex-start, max_run_duration: 1d}
    - {tier: on-demand}
checkpoint: {dir: gs://b/r}
job: {command: python3 train.py, target_step: 100000}
"""


def test_each_rung_is_priced_and_a_file_fills_what_the_table_lacks(tmp_path: Path) -> None:
    spec = load_spec_text(LADDER, environ={}).spec
    file = tmp_path / "prices.yaml"
    file.write_text("{v6e: {spot: 1.1, flex-start: 1.5}}\n")
    plan = make_plan(spec, prices=load_prices(str(file)), step_seconds=2.0)
    assert [(p.rung, p.hour) for p in plan.capacity] == [
        ("spot", pytest.approx(17.6)),
        ("flex-start 1d", pytest.approx(24.0)),
        ("on-demand", pytest.approx(2.70 * 16)),
    ]
    # 200,000 s of steps; a day's run trains 1d - 300 s (the stop's lead) - 600 s (restart).
    assert plan.runs is not None and plan.runs.runs == 3
    assert plan.runs.useful_seconds == 86400 - 300 - 600
    unpriced = make_plan(spec)
    assert [p.hour for p in unpriced.capacity][:2] == [None, None]


def test_a_bad_prices_file_is_a_usage_error(tmp_path: Path) -> None:
    file = tmp_path / "prices.yaml"
    file.write_text("{v6e: {sopt: 1.1}}\n")
    with pytest.raises(UsageError, match=r"v6e\.sopt"):
        load_prices(str(file))
