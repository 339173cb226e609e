"""What a hostile user feeds tpuctl: endless input, values YAML reads by surprise, names a shell
would interpret, a deadline already gone. Each ends in exit 2 and one line, never a crash, a
silent default or an unquoted suggestion."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import InvokeCli, WriteSpec
from tests.support import child_environment
from tpuctl.spec.yamlsource import MAX_SPEC_CHARS

# A tpuctl that reads without bound dies of MemoryError under this cap instead of taking the
# machine's memory with it; `tpuctl validate` itself needs a small fraction of it.
MEMORY_CAP = 1 << 30


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _validate_in_child(
    spec: str, tmp_path: Path, stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuctl", "validate", spec],
        cwd=tmp_path,
        env=child_environment(),
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_capped,
        check=False,
    )


def _one_line_naming(done: subprocess.CompletedProcess[str], source: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {source}: "), lines[0]
    assert f"{MAX_SPEC_CHARS >> 20} MiB" in lines[0]
    assert done.stdout == ""


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_validate_dev_zero_stops_at_the_limit(tmp_path: Path) -> None:
    _one_line_naming(_validate_in_child("/dev/zero", tmp_path), "/dev/zero")


def test_validate_an_endless_stdin_stops_at_the_limit(tmp_path: Path) -> None:
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        assert yes.stdout is not None
        done = _validate_in_child("-", tmp_path, stdin=yes.stdout.fileno())
    finally:
        yes.kill()
        yes.wait()
    _one_line_naming(done, "<stdin>")


def test_validate_a_large_file_names_it(cli: InvokeCli, write_spec: WriteSpec) -> None:
    path = write_spec("#" * (MAX_SPEC_CHARS + 1))
    outcome = cli(["validate", str(path)])
    assert outcome.exit_code == 2
    assert outcome.stderr.count("\n") == 1
    assert f"{path}: spec is too large" in outcome.stderr
