"""Framework presets: the training flags that go with checkpoints, resume and autocheckpoint,
and what the flags a user already wrote mean for the spec (their values win).

Facts from the frameworks' own code: MaxText resumes from
`<base_output_directory>/<run_name>/checkpoints`, trains steps 0 … steps-1 and saves its last
checkpoint at steps-1, and exits 0 after an autocheckpoint save; Pax resumes from
`--job_log_dir` (`<dir>/checkpoints/checkpoint_<step>`), exits 1 after an on-demand save, and
with `--jax_fully_async_checkpoint` initialises JAX from `--server_addr`, `--num_hosts` and
`--host_idx`; Orbax has no flags, so Orbax and custom jobs read TPUCTL_* variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from tpuctl.errors import quoted
from tpuctl.spec.command import given_flags
from tpuctl.spec.model import Framework


class FlagValue(Enum):
    """A flag value only the worker knows for sure (the startup script fills it in)."""

    RUN_NAME = "run_name"
    CHECKPOINT_DIR = "checkpoint_dir"  # may start with `~`: resolved on the worker
    NUM_PROCESSES = "num_processes"  # hosts across every slice
    PROCESS_ID = "process_id"  # this host's JAX process index
    COORDINATOR = "coordinator"  # worker 0 of slice 0, JAX's coordinator port


@dataclass(frozen=True)
class PresetFlag:
    """One `name=value` argument added to the user's command, e.g. `run_name=<run>`."""

    name: str  # as the user would write it: "base_output_directory", "--job_log_dir"
    value: str | FlagValue

    @property
    def bare(self) -> str:
        return self.name.lstrip("-")

    def text(self, **known: str) -> str:
        """The argument with worker-side values filled in from `known` (by FlagValue name)."""
        value = known[self.value.value] if isinstance(self.value, FlagValue) else self.value
        return f"{self.name}={value}"


_MAXTEXT = (
    PresetFlag("run_name", FlagValue.RUN_NAME),
    PresetFlag("base_output_directory", FlagValue.CHECKPOINT_DIR),
    PresetFlag("enable_checkpointing", "true"),
    PresetFlag("async_checkpointing", "true"),
)
_MAXTEXT_AUTOCHECKPOINT = (PresetFlag("enable_autocheckpoint", "true"),)
_MAXTEXT_CONTINUOUS = (PresetFlag("enable_continuous_checkpointing", "true"),)
_PAX = (PresetFlag("--job_log_dir", FlagValue.CHECKPOINT_DIR),)
_PAX_AUTOCHECKPOINT = (
    PresetFlag("--jax_fully_async_checkpoint", "1"),
    PresetFlag("--exit_after_ondemand_checkpoint", "1"),
)
# With --jax_fully_async_checkpoint Pax initialises JAX itself from these: on Multislice it must
# be told every host across the slices, its own index, and the coordinator (slice 0, worker 0).
_PAX_MULTISLICE = (
    PresetFlag("--num_hosts", FlagValue.NUM_PROCESSES),
    PresetFlag("--host_idx", FlagValue.PROCESS_ID),
    PresetFlag("--server_addr", FlagValue.COORDINATOR),
)
# Flags whose value, when the user wrote another, contradicts the spec (→ which spec key).
_CONTRADICTS = {
    ("maxtext", "enable_autocheckpoint"): "checkpoint.autocheckpoint",
    ("maxtext", "enable_continuous_checkpointing"): "checkpoint.continuous",
    ("maxtext", "enable_checkpointing"): "checkpoint.dir",
    ("pax", "jax_fully_async_checkpoint"): "checkpoint.autocheckpoint",
    ("pax", "exit_after_ondemand_checkpoint"): "checkpoint.autocheckpoint",
}
_TRUE = {"true", "1", "yes", "on"}


@dataclass(frozen=True)
class Checkpointing:
    """The spec's checkpoint settings the presets follow."""

    autocheckpoint: bool = False
    continuous: bool = False
    keep: int | None = None
    multislice: bool = False


def preset_flags(
    framework: Framework, settings: Checkpointing, *, command_words: tuple[str, ...] = ()
) -> tuple[PresetFlag, ...]:
    """The flags tpuctl adds for `framework`, minus any the user already wrote (theirs win).

    Orbax and custom programs get no flags: they read TPUCTL_CHECKPOINT_DIR, TPUCTL_RUN_NAME
    and the TPUCTL_* checkpointing variables (an Orbax CheckpointManager notices the pending
    preemption by itself).
    """
    flags: tuple[PresetFlag, ...] = ()
    if framework == "maxtext":
        flags = _MAXTEXT
        flags += _MAXTEXT_AUTOCHECKPOINT if settings.autocheckpoint else ()
        flags += _MAXTEXT_CONTINUOUS if settings.continuous else ()
        if settings.keep is not None:
            flags += (PresetFlag("max_num_checkpoints_to_keep", str(settings.keep)),)
    elif framework == "pax":
        flags = _PAX + (_PAX_AUTOCHECKPOINT if settings.autocheckpoint else ())
        flags += _PAX_MULTISLICE if settings.autocheckpoint and settings.multislice else ()
    given = given_flags(command_words)
    return tuple(flag for flag in flags if flag.bare not in given)


def checkpointing_environment(settings: Checkpointing) -> dict[str, str]:
    """What an Orbax or custom job is told about checkpointing, through its environment
    (Orbax has no flags: a job maps these to ContinuousCheckpointingPolicy and LatestN)."""
    env: dict[str, str] = {}
    if settings.continuous:
        env["TPUCTL_CONTINUOUS_CHECKPOINTING"] = "1"
    if settings.keep is not None:
        env["TPUCTL_CHECKPOINTS_TO_KEEP"] = str(settings.keep)
    return env


@dataclass(frozen=True)
class Conflict:
    """A flag in the command that contradicts a spec key: a `validate` error."""

    path: str
    message: str
    hint: str


@dataclass
class Adopted:
    """What the user's own flags say about the spec: values tpuctl then uses everywhere it
    looks (run name, checkpoint location, the last step), and contradictions."""

    run_name: str | None = None
    checkpoint_dir: str | None = None
    target_step: int | None = None
    conflicts: list[Conflict] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (path, warning)


def adopt_given_flags(
    framework: Framework,
    given: Mapping[str, str],
    *,
    run_name: str | None,
    checkpoint_dir: str | None,
    settings: Checkpointing,
) -> Adopted:
    """Reconcile the command's own flags with the spec's explicit values (None when unset)."""
    adopted = Adopted()
    if framework == "maxtext":
        _adopt(adopted, given.get("run_name"), run_name, "run_name", "job.run_name")
        _adopt(
            adopted,
            given.get("base_output_directory"),
            checkpoint_dir,
            "checkpoint_dir",
            "checkpoint.dir",
        )
        steps = given.get("steps")
        if steps is not None and steps.strip().isdigit() and int(steps) > 0:
            adopted.target_step = int(steps) - 1  # MaxText's last step, and its last save
    elif framework == "pax":
        _adopt(
            adopted, given.get("job_log_dir"), checkpoint_dir, "checkpoint_dir", "checkpoint.dir"
        )
    wanted = {
        "checkpoint.autocheckpoint": settings.autocheckpoint,
        "checkpoint.continuous": settings.continuous,
        "checkpoint.dir": bool(checkpoint_dir or adopted.checkpoint_dir),
    }
    for (owner, flag), path in _CONTRADICTS.items():
        if owner != framework or flag not in given or not wanted[path]:
            continue
        if given[flag].strip().lower() not in _TRUE:
            adopted.conflicts.append(
                Conflict(
                    "job.command",
                    f"the command sets {flag}={given[flag]}, which contradicts {path}",
                    f"remove {flag} from the command (tpuctl sets it), or change {path}",
                )
            )
    if framework == "pax" and settings.continuous:
        adopted.notes.append(
            (
                "checkpoint.continuous",
                "Pax has no continuous-checkpointing flag: set the checkpoint policy in the "
                "experiment config",
            )
        )
    return adopted


def _adopt(
    adopted: Adopted, given: str | None, explicit: str | None, attribute: str, path: str
) -> None:
    if given is None:
        return
    if explicit is not None and explicit.rstrip("/") != given.rstrip("/"):
        adopted.conflicts.append(
            Conflict(
                "job.command",
                f"the command says {quoted(given)} for {path.rsplit('.', maxsplit=1)[-1]}, "
                f"but {path} is {quoted(explicit)}",
                f"keep one: remove it from the command, or set {path}: {given}",
            )
        )
        return
    setattr(adopted, attribute, given)


def autocheckpoint_warning(framework: Framework, *, autocheckpoint: bool) -> str | None:
    """Why `autocheckpoint: true` may do nothing for this framework, or None."""
    if autocheckpoint and framework == "custom":
        return (
            "checkpoint.autocheckpoint only gives the program a SIGTERM and a grace period; "
            "a custom program must save a checkpoint on SIGTERM itself (or use framework: orbax)"
        )
    return None
