"""The job's command as written: where the framework's flags go, compound lines refused without
a place for them, the user's own flags winning (their values used everywhere), contradictions
refused, MaxText's steps= giving the target step, and warnings for secrets and own scripts."""

from __future__ import annotations

import pytest

from tpuctl.errors import SpecError
from tpuctl.spec.command import analyse, command_line, given_flags, place_flags
from tpuctl.spec.load import load_spec_text
from tpuctl.worker import checkpoint_root, done_marker

HEAD = """apiVersion: tpuctl/v1
name: demo
tpu: {accelerator: v4-16, runtime: tpu-ubuntu2204-base, slices: 2}
"""


def load(job: str, checkpoint: str = "checkpoint: {dir: gs://b/runs, autocheckpoint: true}\n"):  # type: ignore[no-untyped-def]
    return load_spec_text(HEAD + checkpoint + job, environ={})


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{ python3 paxml/main.py; } 2>&1 | tee pax_logs.txt", "a group"),
        ("python3 train.py | tee log", "a pipeline"),
        ("python3 train.py; echo finished", "a list (;)"),
        ("python3 train.py && echo ok", "a list (&&)"),
        ("python3 train.py &", "a background job"),
        ("python3 train.py # steps=10", "a # comment"),
        ("(cd src && python3 train.py)", "a subshell"),
        ("python3 train.py\necho two", "several lines"),
    ],
)
def test_compound_lines_are_recognised(line: str, why: str) -> None:
    shape = analyse(line)
    assert shape.compound is not None and why in shape.compound
    assert shape.needs_placement


@pytest.mark.parametrize(
    "line",
    [
        "python3 train.py --steps 10",
        "python3 train.py > train.log 2>&1",  # redirections keep the words going to python3
        "env A=1 python3 -c 'import sys; print(sys.argv)'",
        "python3 -m MaxText.train cfg.yml 'run_name=a b'",
    ],
)
def test_simple_commands_take_flags_at_their_end(line: str) -> None:
    assert analyse(line).compound is None


def test_the_placeholder_and_the_list_form() -> None:
    line = "{ python3 paxml/main.py {flags}; } 2>&1 | tee pax_logs.txt"
    assert not analyse(line).needs_placement
    assert place_flags(line, "--job_log_dir=x") == (
        "{ python3 paxml/main.py --job_log_dir=x; } 2>&1 | tee pax_logs.txt"
    )
    assert place_flags("python3 t.py", "a=1") == "python3 t.py a=1"
    assert command_line(["python3", "-c", "print('x y')", "{flags}"]) == (
        "python3 -c 'print('\"'\"'x y'\"'\"')' {flags}"
    )
    assert given_flags(["run_name=r", "--job_log_dir", "gs://x", "--a=b", "-v"]) == {
        "run_name": "r",
        "job_log_dir": "gs://x",
        "a": "b",
    }


def test_validate_refuses_a_pipeline_with_no_place_for_the_flags() -> None:
    with pytest.raises(SpecError) as raised:
        load("job:\n  framework: pax\n  command: '{ python3 paxml/main.py; } 2>&1 | tee log'\n")
    assert raised.value.path == "job.command"
    assert "a group" in raised.value.message and "--job_log_dir" in raised.value.message
    assert "{flags}" in (raised.value.hint or "")


def test_a_marked_pipeline_or_a_list_is_accepted() -> None:
    marked = load(
        "job:\n  framework: pax\n"
        "  command: '{ python3 paxml/main.py {flags}; } 2>&1 | tee pax_logs.txt'\n"
    ).spec
    assert marked.job is not None and "{flags}" in marked.job.command
    listed = load('job:\n  framework: maxtext\n  command: [python3, -m, MaxText.train, "a b"]\n')
    assert listed.spec.job is not None
    assert listed.spec.job.command == "python3 -m MaxText.train 'a b'"


def test_custom_jobs_may_be_compound_since_nothing_is_appended() -> None:
    spec = load("job:\n  command: 'python3 train.py | tee log'\n").spec
    assert spec.job is not None and spec.job.command == "python3 train.py | tee log"


def test_maxtext_flags_the_user_wrote_are_used_everywhere() -> None:
    loaded = load(
        "job:\n  framework: maxtext\n"
        "  command: python3 -m MaxText.train cfg.yml run_name=llama base_output_directory=gs://o/p "
        "steps=5000\n",
        checkpoint="checkpoint: {autocheckpoint: true}\n",
    )
    spec = loaded.spec
    assert spec.run_name == "llama" and spec.checkpoint.dir == "gs://o/p"
    assert checkpoint_root(spec) == "gs://o/p/llama/checkpoints"
    assert done_marker(spec) == "gs://o/p/tpuctl/llama/DONE"
    assert spec.job is not None and spec.job.target_step == 4999  # MaxText's last step


def test_a_flag_that_contradicts_the_spec_is_an_error() -> None:
    with pytest.raises(SpecError) as raised:
        load("job:\n  framework: maxtext\n  run_name: a\n  command: python3 t.py run_name=b\n")
    assert raised.value.path == "job.command" and "'b'" in raised.value.message
    with pytest.raises(SpecError) as disabled:
        load("job:\n  framework: maxtext\n  command: python3 t.py enable_autocheckpoint=false\n")
    assert "checkpoint.autocheckpoint" in disabled.value.message
    with pytest.raises(SpecError):
        load("job:\n  framework: pax\n  command: python3 main.py --job_log_dir=gs://other\n")


def test_an_explicit_target_step_wins_over_steps() -> None:
    spec = load(
        "job:\n  framework: maxtext\n  target_step: 100\n  command: python3 t.py steps=5000\n"
    ).spec
    assert spec.job is not None and spec.job.target_step == 100


def test_warnings_for_secrets_and_an_own_startup_script() -> None:
    loaded = load("job:\n  command: python3 t.py\n  env: {HF_TOKEN: abc, WANDB_MODE: offline}\n")
    [secret] = [w for w in loaded.warnings if "HF_TOKEN" in w]
    assert not any("WANDB_MODE" in w for w in loaded.warnings)
    assert "job.env.HF_TOKEN" in secret and "tpu.nodes.get" in secret
    own = load_spec_text(
        HEAD.replace("slices: 2}", "slices: 2, metadata: {startup-script: 'echo mine'}}")
        + "job:\n  command: python3 t.py\n",
        environ={},
    )
    assert own.spec.own_startup_script
    assert any("replaces tpuctl's startup script" in w for w in own.warnings)


def test_continuous_checkpointing_needs_a_directory_and_sets_the_flags() -> None:
    with pytest.raises(SpecError) as raised:
        load("job:\n  command: python3 t.py\n", checkpoint="checkpoint: {continuous: true}\n")
    assert raised.value.path == "checkpoint.continuous"
