"""Which workers a reconcile step expects of a spec: every worker of every slice, on either API."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.jobs.reconcile.world import expected_workers
from tpuctl.spec.load import load_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("config", "workers"),
    [
        ("compute-tpu7x-2x2x2.yaml", ["0/0", "0/1"]),  # TPU7x: Compute Engine only, two VMs
        ("compute-v6e-8-flex.yaml", ["0/0"]),
    ],
)
def test_a_compute_specs_workers_are_its_vms(config: str, workers: list[str]) -> None:
    assert expected_workers(load_spec(CONFIGS / config).spec) == workers
