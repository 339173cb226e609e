"""Spec → the worker startup script that keeps tpuctl's resume contract (bash, every boot).

The script is a real file, `startup.sh` beside this module (linted by shellcheck in
scripts/test). Rendering replaces its values block, the lines between `# @values-begin` and
`# @values-end`, with the spec's values, each one single-quoted once; the rest of the
file is fixed text that only ever expands those variables in double quotes, so any string
(quotes, `$`, backticks, newlines, non-ASCII) reaches the trainer byte for byte.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from tpuctl import worker
from tpuctl.errors import SpecError, quoted
from tpuctl.spec.command import analyse
from tpuctl.spec.frameworks import (
    Checkpointing,
    FlagValue,
    PresetFlag,
    checkpointing_environment,
    preset_flags,
)
from tpuctl.spec.model import Spec

TEMPLATE = "startup.sh"
VALUES_HEADER = "# --- values from the spec (each one shell-quoted) ---"
VALUES_BEGIN = "# @values-begin"
VALUES_END = "# @values-end"
# Inside preset_args(), the values only the worker can resolve are bash variables.
_FLAG_VARIABLES = {
    FlagValue.RUN_NAME: "RUN_NAME",
    FlagValue.CHECKPOINT_DIR: "CHECKPOINT_DIR",
    FlagValue.NUM_PROCESSES: "NUM_PROCESSES",
    FlagValue.PROCESS_ID: "PROCESS_ID",
    FlagValue.COORDINATOR: "COORDINATOR_ADDRESS",
}
# Which spec key each quoted value comes from, for errors.
_SPEC_PATHS = {
    "SPEC_NAME": "name",
    "RUN_NAME": "job.run_name",
    "JOB_USER": "job.user",
    "WORKDIR_SPEC": "job.workdir",
    "CODE": "job.code",
    "CHECKPOINT_DIR_SPEC": "checkpoint.dir",
    "CHECKPOINT_ROOT_SPEC": "checkpoint.dir",
    "DONE_MARKER_SPEC": "checkpoint.dir",
    "ZONE_CLAIM_SPEC": "capacity.zone_policy",
    "WORKER_STATES_SPEC": "checkpoint.dir",
    "FRAMEWORK": "job.framework",
    "JOB_COMMAND": "job.command",
}


@cache
def template() -> tuple[str, str]:
    """The template's text before and after its values block."""
    text = resources.files("tpuctl.render").joinpath(TEMPLATE).read_text(encoding="utf-8")
    head, _, rest = text.partition(VALUES_BEGIN)
    _, _, tail = rest.partition(VALUES_END)
    if not rest or not tail:
        raise RuntimeError(f"{TEMPLATE} lost its {VALUES_BEGIN} / {VALUES_END} lines")
    return head, tail.split("\n", 1)[1]


def render_startup_script(spec: Spec) -> str:
    """The `startup-script` metadata value for a spec with a job (see DESIGN: the resume
    contract)."""
    head, tail = template()
    return head + render_values(spec) + tail


def render_values(spec: Spec) -> str:
    """The values block for `spec`: what differs between two specs' startup scripts."""
    job = spec.job
    if job is None:
        raise SpecError("a startup script needs a job section", path="job")
    if job.target_step is not None and not spec.checkpoint.dir:
        raise SpecError(
            "target_step needs a checkpoint directory to find the committed steps in",
            path="job.target_step",
        )
    values = {
        "SPEC_NAME": spec.name,
        "RUN_NAME": spec.run_name,
        "JOB_USER": job.user,
        "WORKDIR_SPEC": job.workdir,
        "CODE": job.code or "",
        "CHECKPOINT_DIR_SPEC": spec.checkpoint.dir or worker.DEFAULT_CHECKPOINT_DIR,
        # Both empty without checkpoint.dir: the marker then stays on the worker's disk.
        "CHECKPOINT_ROOT_SPEC": worker.checkpoint_root(spec) or "",
        "DONE_MARKER_SPEC": worker.done_marker(spec) or "",
        # Set for zone_policy first-active: the job runs only in the zone this file names.
        "ZONE_CLAIM_SPEC": worker.zone_claim(spec) or "",
        # Where each worker keeps its job's state for supervisors (empty: nowhere shared).
        "WORKER_STATES_SPEC": worker.worker_states_dir(spec) or "",
        "FRAMEWORK": job.framework,
        "JOB_COMMAND": job.command,
    }
    for name, value in values.items():
        _check_no_nul(value, _SPEC_PATHS[name])
    for index, line in enumerate(job.setup):
        _check_no_nul(line, f"job.setup[{index}]")
    _check_no_nul(job.boot_script or "", "job.boot_script")
    for key, value in job.env.items():
        if not worker.is_env_name(key):
            raise SpecError(
                f"{quoted(key)} is not a valid environment variable name",
                path=f"job.env.{key}",
                hint="use letters, digits and _ and do not start with a digit",
            )
        _check_no_nul(value, f"job.env.{key}")
    settings = checkpointing(spec)
    flags = preset_flags(job.framework, settings, command_words=analyse(job.command).words)
    environment = {**checkpointing_environment(settings), **job.env}
    lines = [f"{name}={quote(value)}" for name, value in values.items()]
    lines += [
        f"MULTISLICE={1 if spec.tpu.slices > 1 else 0}",
        f"AUTOCHECKPOINT={1 if spec.checkpoint.autocheckpoint else 0}",
        f"TARGET_STEP={'' if job.target_step is None else int(job.target_step)}",
        _bash_array("SETUP_COMMANDS", [quote(line) for line in job.setup]),
        _bash_array("JOB_ENV", [quote(f"{key}={value}") for key, value in environment.items()]),
        f"STATE_ROOT={quote(worker.STATE_ROOT)}",
        f"LOG_ROOT={quote(worker.LOG_ROOT)}",
        f"CODE_READY_MARKER={quote(worker.CODE_READY_MARKER)}",
        f"BOOT_SCRIPT={quote(job.boot_script or '')}",
        f"GRACE_SECONDS={worker.AUTOCHECKPOINT_GRACE_SECONDS}",
        f"NOFILE_LIMIT={worker.NOFILE_LIMIT}",
    ]
    array = _bash_array("PRESET_ARGS", [_flag_word(flag) for flag in flags])
    lines += [
        "",
        "# The framework preset's flags, filled in once the checkpoint dir is resolved.",
        "preset_args() {",
        "  " + array.replace("\n", "\n  "),
        "}",
    ]
    return "\n".join(lines) + "\n"


def checkpointing(spec: Spec) -> Checkpointing:
    checkpoint = spec.checkpoint
    return Checkpointing(
        checkpoint.autocheckpoint, checkpoint.continuous, checkpoint.keep, spec.tpu.slices > 1
    )


def read_values(script: str) -> dict[str, str]:
    """The single-word values (`NAME='value'`) of a rendered script's values block: what
    tpuctl can read back from a queued resource it created (run name, checkpoint dir, …)."""
    import shlex

    block = script.partition(VALUES_HEADER)[2].partition("\npreset_args() {")[0]
    values: dict[str, str] = {}
    for line in block.splitlines():
        name, sep, _rest = line.partition("=")
        if not sep or not name.isidentifier() or not name.isupper():
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if len(words) == 1:
            values[name] = words[0].partition("=")[2]
    return values


def quote(value: str) -> str:
    """`value` as one single-quoted shell word, always quoted (shlex.quote leaves a word such as
    `pax` bare, which then reads like a command to shellcheck and to people)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _bash_array(name: str, words: list[str]) -> str:
    if not words:
        return f"{name}=()"
    return f"{name}=(\n" + "".join(f"  {word}\n" for word in words) + ")"


def _flag_word(flag: PresetFlag) -> str:
    if isinstance(flag.value, FlagValue):
        return quote(f"{flag.name}=") + f'"${_FLAG_VARIABLES[flag.value]}"'
    return quote(f"{flag.name}={flag.value}")


def _check_no_nul(value: str, path: str) -> None:
    if "\0" in value:
        raise SpecError("a NUL character cannot be passed through a shell", path=path)
