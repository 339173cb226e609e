"""Any string in an env value, a setup line or the command reaches real bash byte for byte."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tpuctl.render.startup import render_startup_script

# Everything but NUL, which no shell string can hold (the renderer refuses it).
ANY_TEXT = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40
)
# Pieces that break naive quoting, glued together.
TRICKY = st.sampled_from(
    [
        "'",
        '"',
        "$HOME",
        "${X}",
        "`id`",
        "\\",
        "\n",
        "$(echo x)",
        "é",
        "'\"'\"'",
        "-e",
        "*",
        "~",
        "\t",
    ]
)
VALUES = st.one_of(ANY_TEXT, st.lists(TRICKY, max_size=6).map("".join))
_worker_names = itertools.count()


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(env_value=VALUES, argument=VALUES, setup_value=VALUES)
@example(env_value="a'b\"c$d`e`\nf é\\", argument="$(touch pwned)", setup_value="'; exit 1; '")
def test_strings_survive_the_script_byte_for_byte(
    make_worker: Callable[..., Any],
    job_spec: Callable[..., Any],
    env_value: str,
    argument: str,
    setup_value: str,
) -> None:
    # The command and the setup line each carry an arbitrary string as a quoted word, so the
    # spec's text is arbitrary too; the env value is read back from the environment.
    command = (
        f'printf %s {shlex.quote(argument)} >"$HOME/argument"; '
        'printf %s "$ODD_VALUE" >"$HOME/env_value"'
    )
    setup = f'printf %s {shlex.quote(setup_value)} >"$HOME/setup_value"'
    spec = job_spec(command, env={"ODD_VALUE": env_value}, setup=(setup,), slices=1)
    worker = make_worker("demo", name=f"vm{next(_worker_names)}")
    result = worker.run(render_startup_script(spec))
    assert result.returncode == 0, result.stderr
    worker.wait_for_state("exited")
    home = worker.root / "home/tpuctl"
    assert (home / "argument").read_bytes() == argument.encode()
    assert (home / "env_value").read_bytes() == env_value.encode()
    assert (home / "setup_value").read_bytes() == setup_value.encode()
    # The exact command bash ran, recorded by the script.
    assert (worker.state_dir / "command").read_bytes() == command.encode()
    # An injected `touch pwned` would land in whatever directory the shell was in: look in
    # the whole emulated VM and in this process's directory.
    assert not list(worker.root.rglob("pwned"))
    assert not (Path.cwd() / "pwned").exists()
