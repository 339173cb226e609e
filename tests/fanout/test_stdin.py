"""What a worker reads on its stdin: EOF at once for a fan-out command, the bytes of local stdin
with --stdin (the same bytes on every worker, then EOF), and a piped script for the shell.

tpuctl runs as a real process here, since stdin is a file descriptor the process inherits. A
test that hangs fails at its deadline instead of blocking the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import select
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import QR, Project
from tests.support import wait_for

DEADLINE = 120.0  # seconds before a tpuctl that never returns counts as hung


def _finish(process: subprocess.Popen[str], stdin: str | None = None) -> tuple[str, str]:
    """The process's (stdout, stderr), failing the test if it has not ended by DEADLINE."""
    try:
        return process.communicate(input=stdin, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"tpuctl {process.args[-6:]} did not return within {DEADLINE:g} s (hung)")


def _workers(stdout: str) -> dict[str, dict[str, Any]]:
    return {f"{w['slice']}/{w['worker']}": w for w in json.loads(stdout)["workers"]}


@pytest.mark.parametrize("local_stdin", ["devnull", "bytes in a pipe"])
def test_a_command_reads_eof_at_once_and_nothing_is_forwarded(
    tpuctl: Project, qr: QR, local_stdin: str
) -> None:
    """`head -c 10` would wait for ten bytes forever: it gets EOF, and no local byte."""
    if local_stdin == "devnull":
        process = tpuctl.spawn(
            "ssh", qr.name, "--format", "json", "--", "head -c 10", stdin=subprocess.DEVNULL
        )
        stdout, stderr = _finish(process)
    else:
        process = tpuctl.spawn(
            "ssh", qr.name, "--format", "json", "--", "head -c 10", stdin=subprocess.PIPE
        )
        stdout, stderr = _finish(process, stdin="not for the workers\n")
    assert process.returncode == 0, stderr
    workers = _workers(stdout)
    assert list(workers) == qr.labels()
    assert all(w["status"] == "ok" and w["stdout_tail"] == "" for w in workers.values()), workers


def test_stdin_flag_sends_the_same_bytes_to_every_worker(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    payload = bytes(range(256)) * 4096 + b"\x00\r\nno newline at the end"
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    with source.open("rb") as local_stdin:
        process = tpuctl.spawn(
            "ssh", qr.name, "--stdin", "--format", "json", "--", "sha256sum",
            stdin=local_stdin,
        )  # fmt: skip
        stdout, stderr = _finish(process)
    assert process.returncode == 0, stderr
    expected = hashlib.sha256(payload).hexdigest()
    digests = {label: w["stdout_tail"].split()[0] for label, w in _workers(stdout).items()}
    assert digests == dict.fromkeys(qr.labels(), expected)


def test_stdin_flag_with_an_empty_stdin_is_an_eof(tpuctl: Project, qr: QR) -> None:
    process = tpuctl.spawn(
        "ssh", qr.name, "--stdin", "--format", "json", "--", "wc -c", stdin=subprocess.DEVNULL
    )
    stdout, stderr = _finish(process)
    assert process.returncode == 0, stderr
    assert {w["stdout_tail"] for w in _workers(stdout).values()} == {"0"}


def test_the_shell_without_a_terminal_runs_a_piped_script(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    """No pty (`[ -t 0 ]` is false), stdout and stderr kept apart, and the script's last
    status as tpuctl's exit code: the shell only ends because its stdin reached EOF."""
    script = tmp_path / "script.sh"
    script.write_text(
        'echo "from $TPUCTL_EMULATED_WORKER"\n'
        "if [ -t 0 ]; then echo tty; else echo no-tty; fi\n"
        "echo to-stderr >&2\n"
        "(exit 7)\n"
    )
    with script.open("rb") as local_stdin:
        process = tpuctl.spawn("ssh", qr.name, "--node", "1", "--worker", "1", stdin=local_stdin)
        stdout, stderr = _finish(process)
    assert process.returncode == 7, stderr
    assert stdout.splitlines()[-2:] == [f"from {qr.node_ids[1]}/1", "no-tty"]
    assert "to-stderr" in stderr and "to-stderr" not in stdout


def test_the_shell_from_devnull_returns(tpuctl: Project, qr: QR) -> None:
    process = tpuctl.spawn("ssh", qr.name, "--node", "0", "--worker", "0", stdin=subprocess.DEVNULL)
    _, stderr = _finish(process)
    assert process.returncode == 0, stderr


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (("--stdin", "--detach", "--", "cat"), "--stdin cannot be used with --detach"),
        (("--node", "0", "--worker", "0", "--stdin"), "--stdin needs a COMMAND"),
    ],
)
def test_stdin_flag_is_refused_where_it_has_no_meaning(
    tpuctl: Project, qr: QR, args: tuple[str, ...], refusal: str
) -> None:
    out = tpuctl("ssh", qr.name, *args)
    assert out.exit_code == 2, out.stderr
    assert refusal in out.stderr


@contextlib.contextmanager
def _at_a_terminal(
    tpuctl: Project, *args: str, stdout_too: bool = False
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """tpuctl with stdin (and stdout, `stdout_too`) on a pseudo-terminal: the process and the
    terminal's controller side, closed on the way out."""
    controller, terminal = pty.openpty()
    try:
        outputs: dict[str, Any] = {"stdout": terminal} if stdout_too else {}
        process = tpuctl.spawn(*args, stdin=terminal, **outputs)
        os.close(terminal)
        terminal = -1
        yield process, controller
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)


def test_stdin_flag_is_refused_at_a_terminal(tpuctl: Project, qr: QR) -> None:
    """Bytes typed at a terminal until Ctrl-D, sent to every worker, are a surprise: a file or
    a pipe is what --stdin reads."""
    with _at_a_terminal(tpuctl, "ssh", qr.name, "--stdin", "--", "cat") as (process, _):
        _, stderr = _finish(process)
    assert process.returncode == 2, stderr
    assert "--stdin reads a file or a pipe, not a terminal" in stderr


def test_the_shell_at_a_terminal_is_interactive(tpuctl: Project, qr: QR) -> None:
    """With a terminal, a pty as before: the worker's shell sees a tty, and its exit code is
    tpuctl's."""
    received = bytearray()
    args = ("ssh", qr.name, "--node", "0", "--worker", "0")
    with _at_a_terminal(tpuctl, *args, stdout_too=True) as (process, controller):

        def raw_mode() -> bool:  # tpuctl has put the local terminal in raw mode
            return not termios.tcgetattr(controller)[3] & termios.ICANON

        wait_for(raw_mode, DEADLINE, "the terminal in raw mode")
        os.write(controller, b"tty; exit 3\n")
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], deadline - time.monotonic())
            try:
                chunk = os.read(controller, 65536) if ready else b""
            except OSError:  # tpuctl closed its end
                break
            if not chunk:
                break
            received += chunk
        _, stderr = _finish(process)
    assert process.returncode == 3, stderr
    assert b"/dev/pts/" in received, bytes(received)


def test_help_says_what_happens_to_stdin(tpuctl: Project) -> None:
    text = tpuctl("ssh", "--help").stdout
    assert "--stdin" in text
    assert "EOF" in text
