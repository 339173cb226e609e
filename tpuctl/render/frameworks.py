"""Framework presets: the training flags that go with checkpoints, resume and autocheckpoint."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import Enum

from tpuctl.spec.model import Framework


class FlagValue(Enum):
    """A flag value only the worker knows for sure (the checkpoint dir may start with `~`)."""

    RUN_NAME = "run_name"
    CHECKPOINT_DIR = "checkpoint_dir"


@dataclass(frozen=True)
class PresetFlag:
    """One `name=value` argument appended to the user's command, e.g. `run_name=<run>`."""

    name: str  # as the user would write it: "base_output_directory", "--job_log_dir"
    value: str | FlagValue

    def text(self, *, run_name: str, checkpoint_dir: str) -> str:
        """The argument with the run name and checkpoint dir filled in."""
        if self.value is FlagValue.RUN_NAME:
            value = run_name
        elif self.value is FlagValue.CHECKPOINT_DIR:
            value = checkpoint_dir
        else:
            value = self.value
        return f"{self.name}={value}"


# MaxText resumes from <base_output_directory>/<run_name>/checkpoints, so both must be the same on
# every boot; enable_autocheckpoint makes it save on the SIGTERM Cloud TPU sends before maintenance.
_MAXTEXT = (
    PresetFlag("run_name", FlagValue.RUN_NAME),
    PresetFlag("base_output_directory", FlagValue.CHECKPOINT_DIR),
    PresetFlag("enable_checkpointing", "true"),
    PresetFlag("async_checkpointing", "true"),
)
_MAXTEXT_AUTOCHECKPOINT = (PresetFlag("enable_autocheckpoint", "true"),)
# Pax resumes from --job_log_dir; the two autocheckpoint flags make it save on SIGTERM and exit.
_PAX = (PresetFlag("--job_log_dir", FlagValue.CHECKPOINT_DIR),)
_PAX_AUTOCHECKPOINT = (
    PresetFlag("--jax_fully_async_checkpoint", "1"),
    PresetFlag("--exit_after_ondemand_checkpoint", "1"),
)


def preset_flags(
    framework: Framework, *, autocheckpoint: bool, command: str
) -> tuple[PresetFlag, ...]:
    """The flags to append to `command` for `framework`, minus any the user already wrote.

    Orbax and custom programs get nothing appended: they read TPUCTL_CHECKPOINT_DIR and
    TPUCTL_RUN_NAME from the environment (an Orbax CheckpointManager notices the pending
    preemption by itself).
    """
    if framework == "maxtext":
        flags = _MAXTEXT + (_MAXTEXT_AUTOCHECKPOINT if autocheckpoint else ())
    elif framework == "pax":
        flags = _PAX + (_PAX_AUTOCHECKPOINT if autocheckpoint else ())
    else:
        flags = ()
    words = _command_words(command)
    return tuple(flag for flag in flags if not _already_given(flag.name, words))


def autocheckpoint_warning(framework: Framework, *, autocheckpoint: bool) -> str | None:
    """Why `autocheckpoint: true` may do nothing for this framework, or None."""
    if autocheckpoint and framework == "custom":
        return (
            "checkpoint.autocheckpoint only gives the program a SIGTERM and a grace period; "
            "a custom program must save a checkpoint on SIGTERM itself (or use framework: orbax)"
        )
    return None


def _command_words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=False)
    except ValueError:  # unbalanced quotes: the shell will complain later; a rough split will do
        return command.split()


def _already_given(name: str, words: list[str]) -> bool:
    # `name=value` for both styles; a bare `--name value` for absl-style flags.
    return any(word == name or word.startswith(name + "=") for word in words)
