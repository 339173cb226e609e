"""Progress is drawn on a terminal only: through a pseudo-terminal the live line shows the
workers done out of the total; with stderr a pipe, or --quiet, nothing is drawn."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

from tests.harness import QR, Project
from tests.support import python_with_default_sigint

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _under_pty(tpuctl: Project, *args: str) -> tuple[int, str, str]:
    """Run tpuctl with stderr on a pseudo-terminal (stdout a pipe); (code, stdout, what the
    terminal received, escapes removed)."""
    master, slave = pty.openpty()
    env = tpuctl.child_env({"COLUMNS": "100", "TERM": "xterm-256color"})
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        python_with_default_sigint("-m", "tpuctl", *args),
        cwd=tpuctl.tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    received = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    stdout = process.stdout.read().decode() if process.stdout else ""
    code = process.wait(timeout=60)
    return code, stdout, ANSI.sub(b"", bytes(received)).decode(errors="replace")


def test_a_fanout_draws_its_progress_on_a_terminal(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("ssh", qr.name, "--output-dir", str(out), "--", "sleep 1; echo done")
    code, stdout, terminal = _under_pty(tpuctl, *args)
    assert code == 0, terminal
    assert re.search(r"ssh: [0-4]/4 workers done", terminal), terminal
    assert "4 workers: 4 ok" in stdout  # the table still goes to stdout, undisturbed
    assert "workers done" not in stdout

    quiet = _under_pty(tpuctl, "--quiet", *args)
    assert quiet[0] == 0 and "workers done" not in quiet[2]


def test_no_progress_without_a_terminal(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    spawned = tpuctl.spawn("ssh", qr.name, "--output-dir", str(tmp_path / "o"), "--", "sleep 1")
    _, stderr = spawned.communicate(timeout=60)
    assert spawned.returncode == 0, stderr
    assert "workers done" not in stderr and "\x1b[" not in stderr


def test_a_wait_draws_the_state_and_time_on_a_terminal(tpuctl: Project) -> None:
    """More chips than the emulator's v4 pool: the request queues until its deadline."""
    spec = tpuctl.write_spec(
        {
            "name": "too-big-to-fit",
            "tpu": {"accelerator": "v4-4096", "runtime": "tpu-ubuntu2204-base", "slices": 16},
        }
    )
    args = ("create", str(spec), "--wait", "--queue-timeout", "2s")
    code, _, terminal = _under_pty(tpuctl, *args)
    assert code == 4, terminal  # the queueing deadline
    assert re.search(r"too-big-to-fit: WAITING_FOR_RESOURCES for \S+ \(waiting \S+\)", terminal)
    assert "deleted" in terminal or "delete" in terminal


def test_a_waits_timers_tick_between_polls(tpuctl: Project) -> None:
    """Polls come at about 0, 0.75, 2.75 and 6.75 s (the watcher's ramp): a line redrawn only
    when a poll answers never shows 4 or 5 s of waiting; one that ticks does."""
    spec = tpuctl.write_spec(
        {
            "name": "ticks-while-it-waits",
            "tpu": {"accelerator": "v4-4096", "runtime": "tpu-ubuntu2204-base", "slices": 16},
        }
    )
    code, _, terminal = _under_pty(tpuctl, "create", str(spec), "--wait", "--queue-timeout", "8s")
    assert code == 4, terminal
    waited = {
        float(seconds)
        for seconds in re.findall(r"WAITING_FOR_RESOURCES for \S+ \(waiting ([\d.]+)s\)", terminal)
    }
    assert any(3.5 <= seconds < 6.0 for seconds in waited), sorted(waited)
