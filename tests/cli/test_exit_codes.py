"""Exit codes and error output of a real `python -m tpuctl` process: 0, 1, 2 and 130."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import python_with_default_sigint, wait_for
from tpuctl import __version__

Spawn = Callable[..., "subprocess.CompletedProcess[str]"]
WriteSpec = Callable[..., Path]

# A library function that breaks: the boundary must turn it into exit 1 without a traceback.
BROKEN_PLAN = """
import sys
import tpuctl.plan

def broken(*args, **kwargs):
    raise RuntimeError("arithmetic exploded")

tpuctl.plan.make_plan = broken
from tpuctl.cli.main import main
sys.argv[0] = "tpuctl"
main()
"""


def test_version(spawn: Spawn) -> None:
    done = spawn(["--version"])
    assert done.returncode == 0
    assert done.stdout.strip() == f"tpuctl, version {__version__}"


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--format", "json", "--version"], {}),
        (["--version", "--format", "json"], {}),
        (["--version"], {"TPUCTL_FORMAT": "json"}),
    ],
)
def test_version_is_one_json_document_when_asked(
    spawn: Spawn, args: list[str], env: dict[str, str]
) -> None:
    done = spawn(args, env=env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["kind"], document["version"]) == ("Version", __version__)
    assert done.stderr == ""


def test_version_as_yaml(spawn: Spawn) -> None:
    import yaml

    done = spawn(["--format", "yaml", "--version"])
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["version"] == __version__


def test_help_lists_every_command(spawn: Spawn) -> None:
    from tpuctl.cli.main import COMMANDS

    done = spawn(["--help"])
    assert done.returncode == 0
    assert done.stdout.startswith("Usage: tpuctl [OPTIONS] COMMAND [ARGS]...")
    for name in COMMANDS:
        assert f"  {name} " in done.stdout
    assert done.stderr == ""


def test_valid_spec_exits_0(spawn: Spawn, write_spec: WriteSpec) -> None:
    done = spawn(["validate", str(write_spec())])
    assert done.returncode == 0
    assert "is valid: demo" in done.stdout
    assert done.stderr == ""


# A misspelt key, and nothing else wrong (a spec with several mistakes lists them all).
ONE_MISTAKE = "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  acelerator: v4-8\n  runtime: r\n"


@pytest.mark.parametrize("command", ["validate", "render", "plan"])
def test_bad_spec_exits_2(spawn: Spawn, write_spec: WriteSpec, command: str) -> None:
    spec = write_spec(ONE_MISTAKE)
    done = spawn([command, str(spec)])
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: {spec}:4:3: tpu.acelerator: unknown key")
    assert "Traceback" not in done.stderr


def test_bad_spec_json_error_on_stdout(spawn: Spawn, write_spec: WriteSpec) -> None:
    spec = write_spec(ONE_MISTAKE)
    done = spawn(["validate", str(spec), "--format", "json"])
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "spec"
    assert error["exit_code"] == 2
    assert (error["file"], error["line"], error["column"]) == (str(spec), 4, 3)
    assert error["path"] == "tpu.acelerator"
    assert error["hint"] == "did you mean 'accelerator'?"
    # The same error through TPUCTL_FORMAT, as a CI job would set it.
    by_env = spawn(["validate", str(spec)], env={"TPUCTL_FORMAT": "json"})
    assert json.loads(by_env.stdout) == json.loads(done.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "job.yaml", "--no-such-option"],
        ["no-such-command"],
        ["validate"],
        ["render", "job.yaml", "--what", "terraform"],
        ["plan", "job.yaml", "--mtbf", "soon"],
    ],
    ids=["unknown-option", "unknown-command", "missing-argument", "bad-choice", "bad-duration"],
)
def test_usage_errors_exit_2(spawn: Spawn, write_spec: WriteSpec, args: list[str]) -> None:
    write_spec()
    done = spawn(args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: ")
    assert done.stderr.count("\n") == 1
    as_json = spawn(args, env={"TPUCTL_FORMAT": "json"})
    assert as_json.returncode == 2
    error = json.loads(as_json.stdout)["error"]
    assert (error["kind"], error["exit_code"]) == ("usage", 2)


def _broken(write_spec: WriteSpec, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    repo = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    environ["PYTHONPATH"] = str(repo)
    return subprocess.run(
        [sys.executable, "-c", BROKEN_PLAN, *extra, "plan", str(write_spec())],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_internal_error_exits_1_without_traceback(write_spec: WriteSpec, tmp_path: Path) -> None:
    done = _broken(write_spec, tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        "error: internal error: RuntimeError: arithmetic exploded "
        "(rerun with --debug for the traceback and report it)\n"
    )


def test_internal_error_json(write_spec: WriteSpec, tmp_path: Path) -> None:
    done = _broken(write_spec, tmp_path, "--format", "json")
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert (error["kind"], error["exit_code"]) == ("error", 1)
    assert "arithmetic exploded" in error["message"]


def test_internal_error_traceback_with_debug(write_spec: WriteSpec, tmp_path: Path) -> None:
    done = _broken(write_spec, tmp_path, "--debug")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "RuntimeError: arithmetic exploded" in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_sigint_exits_130(tmp_path: Path) -> None:
    """A real SIGINT while tpuctl is blocked reading its spec (from a FIFO nobody writes)."""
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    repo = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    environ["PYTHONPATH"] = str(repo)
    process = subprocess.Popen(
        python_with_default_sigint("-m", "tpuctl", "validate", str(fifo)),
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = _open_writer_when_reader_waits(fifo, process)
    try:
        # The reader has opened the FIFO and now blocks in read(); interrupt it there.
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        os.close(writer)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    assert stdout == ""
    # click prints a newline first (to end a line a person may be typing), then the boundary's.
    assert stderr.strip() == "error: interrupted"
    assert "Traceback" not in stderr


def _open_writer_when_reader_waits(fifo: Path, process: subprocess.Popen[Any]) -> int:
    # Opening a FIFO for writing without blocking fails with ENXIO until a reader has it open.
    def writer() -> tuple[int] | None:
        if process.poll() is not None:
            raise AssertionError(f"tpuctl exited early: {process.communicate()}")
        try:
            return (os.open(fifo, os.O_WRONLY | os.O_NONBLOCK),)  # a tuple: fd 0 is true too
        except OSError as error:
            if error.errno != errno.ENXIO:
                raise
        return None

    try:
        (fd,) = wait_for(writer, 30, "tpuctl to open the spec", interval=0.02)
    except AssertionError:
        process.kill()
        process.wait()
        raise
    return fd


def test_every_exit_code_is_in_the_readme_table() -> None:
    from tests.support import REPO
    from tpuctl.errors import ExitCode

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [code for code in ExitCode if f"\n| {int(code)} | " not in readme]
    assert not missing, f"README's exit-code table lacks {missing}"
