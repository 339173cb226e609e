"""Shell completion: the scripts, and what a real bash completes with them (commands, options,
spec files, queued resource names from the emulator, files only when the API is out of reach)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_lifecycle_offline import closed_port, no_cloud_environment
from tests.harness import Project
from tests.support import child_environment
from tpuctl.cli.completion import spec_paths

Cli = Callable[..., Any]
Spawn = Callable[..., Any]

# The generated script sourced as ~/.bashrc would, then the completion function called as bash
# calls it for `complete -F` (command, word, previous word) with COMP_WORDS/COMP_CWORD set.
BASH_DRIVER = """
eval "$(tpuctl completion bash)"
complete -p tpuctl
COMP_WORDS=("$@")
COMP_CWORD=$(( $# - 1 ))
_tpuctl_completion tpuctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
for reply in "${COMPREPLY[@]}"; do printf 'REPLY %s\\n' "$reply"; done
"""


def tpuctl_on_path(directory: Path) -> str:
    """A PATH whose `tpuctl` is this checkout (the script runs `tpuctl` by name)."""
    directory.mkdir(exist_ok=True)
    shim = directory / "tpuctl"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tpuctl "$@"\n')
    shim.chmod(0o755)
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


def bash_complete(
    words: list[str], cwd: Path, env: Mapping[str, str]
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """What a real bash puts in COMPREPLY for `words` (the last one is being completed)."""
    environ = child_environment({**env, "PATH": tpuctl_on_path(cwd.parent / "bin")})
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", BASH_DRIVER, "bash", *words],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard, not a measurement
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return [line.removeprefix("REPLY ") for line in lines if line.startswith("REPLY ")], done


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with two specs, a file that is not one, a directory and a hidden file."""
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "inner.yaml").write_text("name: inner\n")
    (work / "job.yaml").write_text("name: job\n")
    (work / "jax.yml").write_text("name: jax\n")
    (work / "notes.txt").write_text("not a spec\n")
    (work / ".hidden.yaml").write_text("name: hidden\n")
    return work


# ----------------------------------------------------------------------------- the scripts

SHELL_MARKS = {
    "bash": ["_tpuctl_completion()", "complete -o nosort -F _tpuctl_completion tpuctl"],
    "zsh": ["#compdef tpuctl", "compdef _tpuctl_completion tpuctl"],
    "fish": ["function _tpuctl_completion", "complete --no-files --command tpuctl"],
}
# tpuctl's additions to click's scripts: a directory completes without a trailing space.
OUR_ADDITIONS = {"bash": "compopt -o nospace", "zsh": "compadd -U -S ''", "fish": ""}


@pytest.mark.parametrize("shell", sorted(SHELL_MARKS))
def test_the_script_is_the_shells_and_what_click_prints(shell: str, spawn: Spawn) -> None:
    printed = spawn(["completion", shell])
    assert printed.returncode == 0, printed.stderr
    for mark in SHELL_MARKS[shell]:
        assert mark in printed.stdout
    assert "_TPUCTL_COMPLETE" in printed.stdout
    assert OUR_ADDITIONS[shell] in printed.stdout
    # The same as click's own instruction, so either way of installing gives one script.
    sourced = spawn([], env={"_TPUCTL_COMPLETE": f"{shell}_source"})
    assert sourced.returncode == 0
    assert sourced.stdout == printed.stdout


@pytest.mark.parametrize("shell", sorted(SHELL_MARKS))
def test_the_script_parses_in_its_shell(shell: str, cli: Cli, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    printed = cli(["completion", shell])
    script = tmp_path / f"tpuctl.{shell}"
    script.write_text(printed.stdout)
    checked = subprocess.run(
        [shell, "-n", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stderr


def test_an_unknown_shell_is_a_usage_error(cli: Cli) -> None:
    outcome = cli(["completion", "tcsh"])
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    assert outcome.stderr.count("\n") == 1
    assert "'tcsh' is not one of 'bash', 'zsh', 'fish'" in outcome.stderr


def test_help_says_how_to_install(cli: Cli) -> None:
    outcome = cli(["completion", "--help"])
    assert outcome.exit_code == 0
    assert 'eval "$(tpuctl completion bash)"' in outcome.stdout
    assert 'eval "$(tpuctl completion zsh)"' in outcome.stdout
    assert "tpuctl completion fish | source" in outcome.stdout


# ----------------------------------------------------------------------------- in a real bash


def test_bash_completes_a_partial_command(workdir: Path) -> None:
    replies, done = bash_complete(["tpuctl", "sta"], workdir, {})
    assert replies == ["status"]
    assert "complete -o nosort -F _tpuctl_completion tpuctl" in done.stdout
    assert done.stderr == ""


def test_bash_completes_options_of_a_lazily_loaded_command(workdir: Path) -> None:
    replies, _ = bash_complete(["tpuctl", "status", "--proj"], workdir, {})
    assert replies == ["--project"]
    replies, _ = bash_complete(["tpuctl", "status", "--pro"], workdir, {})
    assert replies == ["--project", "--proxy-jump"]


def test_bash_completes_spec_files_and_directories(workdir: Path) -> None:
    replies, _ = bash_complete(["tpuctl", "validate", ""], workdir, {})
    assert replies == ["configs/", "jax.yml", "job.yaml"]
    replies, _ = bash_complete(["tpuctl", "validate", "configs/"], workdir, {})
    assert replies == ["configs/inner.yaml"]


@pytest.mark.emulator
def test_bash_completes_a_queued_resource_name(project: Project, workdir: Path) -> None:
    qr = project.create_from_spec(project.spec())
    partial = qr.name[: len("job-") + 2]
    # A loaded machine may take more than the 3 s a lookup gets by default to import the client.
    env = {**project.env, "TPUCTL_COMPLETION_SECONDS": "30"}
    replies, done = bash_complete(["tpuctl", "status", partial], workdir, env)
    assert replies == [qr.name]
    assert done.stderr == ""
    # Names first, then spec files, for every NAME|SPEC (here: a fan-out command).
    replies, _ = bash_complete(["tpuctl", "ssh", ""], workdir, env)
    assert replies == [qr.name, "configs/", "jax.yml", "job.yaml"]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """host:port of a server that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


# gcloud's own OAuth client: google-auth warns (on stderr) about its user credentials.
GCLOUD_USER_CREDENTIALS = {
    "type": "authorized_user",
    "client_id": "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com",
    "client_secret": "unused",
    "refresh_token": "unused",
}


@pytest.mark.parametrize(
    "case", ["closed port, no project", "no answer", "no credentials", "warning credentials"]
)
def test_name_completion_without_the_api_gives_spec_files_silently(
    case: str, workdir: Path, silent_server: str
) -> None:
    env = no_cloud_environment(workdir.parent)
    if case == "closed port, no project":
        env["TPU_EMULATOR_HOST"] = f"127.0.0.1:{closed_port()}"
    elif case == "no answer":  # only the lookup's own deadline ends this one
        env.update(
            TPU_EMULATOR_HOST=silent_server,
            TPUCTL_PROJECT="my-project",
            TPUCTL_ZONE="us-central2-b",
        )
        env["TPUCTL_API_RETRY_SECONDS"] = "600"  # what tpuctl list would wait; completion won't
    elif case == "no credentials":
        missing_key = str(workdir.parent / "no-such-key.json")
        env.update(GOOGLE_APPLICATION_CREDENTIALS=missing_key, TPUCTL_ZONE="us-central2-b")
    else:  # ADC from `gcloud auth application-default login`, no project anywhere
        adc = Path(env["CLOUDSDK_CONFIG"]) / "application_default_credentials.json"
        adc.write_text(json.dumps(GCLOUD_USER_CREDENTIALS))
        env["TPUCTL_ZONE"] = "us-central2-b"
    replies, done = bash_complete(["tpuctl", "status", ""], workdir, env)
    assert replies == ["configs/", "jax.yml", "job.yaml"]
    assert done.stderr == ""


# ----------------------------------------------------------------------------- the parts

# Completes `tpuctl <TAB>` through click in a fresh interpreter, then reports what it imported.
PROBE = """
import json, sys
from click.shell_completion import BashComplete
from tpuctl.cli.main import cli
items = BashComplete(cli, {}, "tpuctl", "_TPUCTL_COMPLETE").get_completions([], "")
print(json.dumps({"names": [i.value for i in items], "modules": sorted(sys.modules)}))
"""


def test_command_names_complete_without_importing_the_commands(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert "status" in report["names"] and "completion" in report["names"]
    commands = [m for m in report["modules"] if m.startswith("tpuctl.cli.") and "_commands" in m]
    assert commands == []
    assert not {"grpc", "google.cloud", "paramiko", "rich"} & set(report["modules"])


def test_spec_paths_as_typed(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    assert spec_paths("j") == ["jax.yml", "job.yaml"]
    assert spec_paths("co") == ["configs/"]
    assert spec_paths(".h") == [".hidden.yaml"]
    assert spec_paths("notes") == []
    assert spec_paths("missing/") == []
    assert spec_paths(f"{workdir}/configs/i") == [f"{workdir}/configs/inner.yaml"]
    monkeypatch.setenv("HOME", str(workdir))
    assert spec_paths("~/configs/") == ["~/configs/inner.yaml"]
