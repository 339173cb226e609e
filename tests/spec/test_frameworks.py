"""Framework presets: the flags that go with checkpointing, autocheckpoint, continuous saves and
Pax on Multislice, never doubled; and the environment Orbax and custom jobs get instead."""

from __future__ import annotations

import pytest

from tpuctl.spec.command import analyse
from tpuctl.spec.frameworks import (
    Checkpointing,
    autocheckpoint_warning,
    checkpointing_environment,
    preset_flags,
)

KNOWN = {
    "run_name": "r1",
    "checkpoint_dir": "gs://b/c",
    "num_processes": "8",
    "process_id": "3",
    "coordinator": "10.0.0.2:8476",
}


def texts(framework: str, command: str, **settings: object) -> list[str]:
    flags = preset_flags(
        framework,  # type: ignore[arg-type]
        Checkpointing(**settings),  # type: ignore[arg-type]
        command_words=analyse(command).words,
    )
    return [flag.text(**KNOWN) for flag in flags]


def test_maxtext_flags_with_and_without_autocheckpoint_and_continuous_saves() -> None:
    base = [
        "run_name=r1",
        "base_output_directory=gs://b/c",
        "enable_checkpointing=true",
        "async_checkpointing=true",
    ]
    assert texts("maxtext", "python3 train.py cfg.yml") == base
    assert texts("maxtext", "python3 train.py cfg.yml", autocheckpoint=True) == [
        *base,
        "enable_autocheckpoint=true",
    ]
    assert texts("maxtext", "train.py", continuous=True, keep=3)[-2:] == [
        "enable_continuous_checkpointing=true",
        "max_num_checkpoints_to_keep=3",
    ]


def test_pax_flags_with_and_without_autocheckpoint_and_on_multislice() -> None:
    assert texts("pax", "python3 main.py --exp=x") == ["--job_log_dir=gs://b/c"]
    assert texts("pax", "python3 main.py --exp=x", autocheckpoint=True) == [
        "--job_log_dir=gs://b/c",
        "--jax_fully_async_checkpoint=1",
        "--exit_after_ondemand_checkpoint=1",
    ]
    assert texts("pax", "main.py", autocheckpoint=True, multislice=True)[-3:] == [
        "--num_hosts=8",
        "--host_idx=3",
        "--server_addr=10.0.0.2:8476",
    ]


@pytest.mark.parametrize("framework", ["orbax", "custom"])
def test_orbax_and_custom_get_the_environment_instead(framework: str) -> None:
    assert texts(framework, "python3 train.py", autocheckpoint=True, continuous=True) == []
    assert checkpointing_environment(Checkpointing(continuous=True, keep=2)) == {
        "TPUCTL_CONTINUOUS_CHECKPOINTING": "1",
        "TPUCTL_CHECKPOINTS_TO_KEEP": "2",
    }
    assert checkpointing_environment(Checkpointing()) == {}


def test_a_flag_the_user_wrote_is_not_added() -> None:
    command = "python3 train.py cfg.yml run_name=mine 'base_output_directory=gs://x y'"
    assert texts("maxtext", command, autocheckpoint=True) == [
        "enable_checkpointing=true",
        "async_checkpointing=true",
        "enable_autocheckpoint=true",
    ]
    # absl style, with a space instead of `=`
    assert texts(
        "pax",
        "main.py --job_log_dir gs://x --exit_after_ondemand_checkpoint=0",
        autocheckpoint=True,
    ) == ["--jax_fully_async_checkpoint=1"]
    # A longer flag that merely starts with the name does not count.
    assert "run_name=r1" in texts("maxtext", "train.py run_name_suffix=x")


def test_autocheckpoint_warning_only_for_custom() -> None:
    assert autocheckpoint_warning("custom", autocheckpoint=True)
    assert autocheckpoint_warning("custom", autocheckpoint=False) is None
    assert autocheckpoint_warning("maxtext", autocheckpoint=True) is None
