"""What a job log says about progress: step lines and where a boot resumed (pure)."""

from __future__ import annotations

import pytest

from tpuctl.storage.logs import compile_step_pattern, parse_log


def test_parse_log_reads_the_toy_trainer_and_maxtext() -> None:
    toy = "process 0 of 1\nresumed from step 40\nstep 41/100 loss=1\nstep 42/100 loss=1\n"
    facts = parse_log(toy)
    assert (facts.resumed_from, facts.first_step, facts.last_step) == (40, 41, 42)
    assert facts.resume_point == 40
    maxtext = "completed step: 7, seconds: 1.0\ncompleted step: 8, seconds: 1.0\n"
    assert parse_log(maxtext).resume_point == 6  # no resume line: first step − 1
    assert parse_log("starting fresh\nstep 1/5\n").resume_point == 0
    custom = compile_step_pattern(r"iter=(\d+)")
    assert parse_log("iter=3\niter=9\nstep 50/60\n", custom).last_step == 9
    with pytest.raises(ValueError):
        compile_step_pattern("no group")
