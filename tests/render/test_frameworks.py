"""Framework presets: the flags that go with checkpointing and autocheckpoint, never doubled."""

from __future__ import annotations

import pytest

from tpuctl.render.frameworks import autocheckpoint_warning, preset_flags


def texts(framework: str, command: str, *, autocheckpoint: bool) -> list[str]:
    flags = preset_flags(framework, autocheckpoint=autocheckpoint, command=command)  # type: ignore[arg-type]
    return [flag.text(run_name="r1", checkpoint_dir="gs://b/c") for flag in flags]


def test_maxtext_flags_with_and_without_autocheckpoint() -> None:
    base = [
        "run_name=r1",
        "base_output_directory=gs://b/c",
        "enable_checkpointing=true",
        "async_checkpointing=true",
    ]
    assert texts("maxtext", "python3 train.py cfg.yml", autocheckpoint=False) == base
    assert texts("maxtext", "python3 train.py cfg.yml", autocheckpoint=True) == [
        *base,
        "enable_autocheckpoint=true",
    ]


def test_pax_flags_with_and_without_autocheckpoint() -> None:
    assert texts("pax", "python3 main.py --exp=x", autocheckpoint=False) == [
        "--job_log_dir=gs://b/c"
    ]
    assert texts("pax", "python3 main.py --exp=x", autocheckpoint=True) == [
        "--job_log_dir=gs://b/c",
        "--jax_fully_async_checkpoint=1",
        "--exit_after_ondemand_checkpoint=1",
    ]


@pytest.mark.parametrize("framework", ["orbax", "custom"])
def test_orbax_and_custom_append_nothing(framework: str) -> None:
    assert texts(framework, "python3 train.py", autocheckpoint=True) == []


def test_a_flag_the_user_wrote_is_not_appended() -> None:
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
    assert "run_name=r1" in texts("maxtext", "train.py run_name_suffix=x", autocheckpoint=False)
    # Unbalanced quotes fall back to a plain split rather than failing.
    assert texts("maxtext", "train.py run_name=a 'oops", autocheckpoint=False)[0] == (
        "base_output_directory=gs://b/c"
    )


def test_autocheckpoint_warning_only_for_custom() -> None:
    assert autocheckpoint_warning("custom", autocheckpoint=True)
    assert autocheckpoint_warning("custom", autocheckpoint=False) is None
    assert autocheckpoint_warning("maxtext", autocheckpoint=True) is None
