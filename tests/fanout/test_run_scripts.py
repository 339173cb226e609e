"""The detached-run scripts of tpuctl.fanout.remote run locally against a run directory: what
`ps` reports (from builtins alone), under bash and under a POSIX sh, and what a detached run
leaves behind for it."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fanout.helpers import pid_alive
from tests.support import wait_for, wait_for_bytes
from tpuctl.fanout import remote
from tpuctl.fanout.remote import RunState

BASH = shutil.which("bash") or "/bin/bash"
SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]
SUPERVISOR = " tpuctl-startup: "


def _run(script: str, home: Path, *, shell: str = "bash", path: str | None = None) -> bytes:
    env = {"HOME": str(home), "PATH": os.environ["PATH"] if path is None else path}
    # A session of its own, as sshd gives each command.
    done = subprocess.run(
        [shell, "-c", script], env=env, capture_output=True, timeout=30, check=False,
        start_new_session=True,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def _make_run(
    home: Path, run_id: str, *, latest: bool = True, earlier: bool = False, **files: str | bytes
) -> Callable[[str], Path]:
    """A run's files, `runs/<id>.<name>` (`runs/<id>/<name>` for a run of an `earlier`
    version); returns the function from a file name to its path."""
    runs = home / ".tpuctl" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    prefix = f"{run_id}/" if earlier else f"{run_id}."
    if earlier:
        (runs / run_id).mkdir(exist_ok=True)
    else:
        files.setdefault("log", "")  # a start writes it first
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        (runs / f"{prefix}{name}").write_bytes(data)
    if latest:
        (runs / "latest").write_text(run_id + "\n")
    return lambda name: runs / f"{prefix}{name}"


@pytest.fixture
def leader() -> Iterator[int]:
    """A live session leader, not our child (so no zombie outlives it), killed at the end."""
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pid = int(out)
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


def test_ps_reads_a_finished_run_with_no_program_on_the_path(tmp_path: Path) -> None:
    _make_run(
        tmp_path, "r1", pid="999999\n", exit="3\n", started="1700000000\n",
        log="first\r\nsecond\r\n",
    )  # fmt: skip
    shown = _run(remote.status_script(None), tmp_path, shell=BASH, path=str(tmp_path / "nobin"))
    assert shown == b"state=exited run=r1 pid=999999 exit=3 started=1700000000\nlast=second\n"
    state = remote.parse_state(shown.decode())
    assert state is not None and (state.state, state.exit_code, state.last_line) == (
        "exited", 3, "second",
    )  # fmt: skip
    assert state.started is not None and state.started.timestamp() == 1700000000


@pytest.mark.parametrize("shell", SHELLS)
def test_ps_states_under_every_shell(tmp_path: Path, leader: int, shell: str) -> None:
    def state(run_id: str | None) -> RunState | None:
        return remote.parse_state(
            _run(remote.status_script(run_id), tmp_path, shell=shell).decode()
        )

    none = state(None)  # no run at all
    assert none is not None and (none.state, none.run) == ("none", None)
    _make_run(tmp_path, "live", pid=f"{leader}\n", log="working\n")
    # `exit` empty: the leader is writing it, and the run is still running.
    _make_run(tmp_path, "writing", latest=False, pid=f"{leader}\n", exit="")
    _make_run(tmp_path, "killed", latest=False, pid="999999\n", stopped="")
    _make_run(tmp_path, "lost", latest=False, pid="999999\n")
    running = state(None)
    assert running is not None and (running.state, running.run, running.pid) == (
        "running", "live", leader,
    )  # fmt: skip
    assert running.last_line == "working"
    assert [getattr(state(run), "state", None) for run in ("writing", "killed", "lost", "x")] == [
        "running", "stopped", "unknown", "none",
    ]  # fmt: skip
    # Runs of an earlier version, each in a directory of its own, are read as they were.
    _make_run(tmp_path, "dir-live", latest=False, earlier=True, pid=f"{leader}\n", log="")
    _make_run(tmp_path, "dir-done", latest=False, earlier=True, pid="999999\n", exit="2\n")
    assert [getattr(state(run), "state", None) for run in ("dir-live", "dir-done")] == [
        "running", "exited",
    ]  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS)
def test_a_detached_command_runs_as_written_in_the_run_s_leader(tmp_path: Path, shell: str) -> None:
    # Quotes, a newline and bytes that are not UTF-8 arrive as written; `$$` is the run's
    # leader (the pid ps and stop use), as in any shell that runs a command line.
    raw = os.fsdecode(b"caf\xe9")
    command = f'echo "it\'s $$" >"$HOME/out"\nprintf \'%s\' \'{raw}\' >>"$HOME/out"'
    started = _run(remote.start_script("r4", command), tmp_path, shell=shell)
    pid = started.split()[1]
    wait_for((tmp_path / ".tpuctl/runs/r4.exit").exists, 10, "the run to end")
    assert (tmp_path / "out").read_bytes() == b"it's " + pid + b"\ncaf\xe9"


@pytest.mark.parametrize("shell", SHELLS)
def test_stop_reaches_what_left_the_run_s_process_group(tmp_path: Path, shell: str) -> None:
    # A process that made a group of its own is still in the session the run was started
    # in (sshd's for the start), which stop signals too.
    escape = (
        "import os, time; os.setpgid(0, 0); "
        "open(os.environ['HOME'] + '/escaped', 'w').write(str(os.getpid())); time.sleep(60)"
    )
    command = f"{shutil.which('python3')} -c {shlex.quote(escape)} & sleep 60"
    started = _run(remote.start_script("r3", command), tmp_path, shell=shell)
    leader_pid = int(started.split()[1])
    escaped = int(wait_for_bytes(tmp_path / "escaped", 10, "the process to leave the group"))
    try:
        assert os.getpgid(escaped) == escaped != os.getpgid(leader_pid) == leader_pid
        stopped = _run(remote.stop_script(None, 5.0), tmp_path, shell=shell).decode()
        assert stopped.startswith("state=stopped run=r3")
        wait_for(lambda: not pid_alive(escaped), 10, "the escaped process to end")
    finally:
        for pid in (escaped, leader_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_stop_of_a_run_of_an_earlier_version_signals_its_session(tmp_path: Path) -> None:
    # An earlier version's leader led its own session (setsid); a child that made a group of
    # its own (a job of a job-control shell) is reached through that session only.
    child_file = tmp_path / "child"
    leader = subprocess.Popen(
        ["setsid", BASH, "-c", 'set -m; sleep 60 & echo $! >"$0"; wait', str(child_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    child = int(wait_for_bytes(child_file, 10, "the leader's child"))
    try:
        assert os.getsid(leader.pid) == leader.pid == os.getsid(child) != os.getpgid(child)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        _make_run(tmp_path, "old", earlier=True, pid=f"{leader.pid} {boot}\n", log="")
        # Reaped as it ends (it is this process's child): a zombie would look alive to stop.
        threading.Thread(target=leader.wait, daemon=True).start()
        stopped = _run(remote.stop_script(None, 5.0), tmp_path).decode()
        assert stopped.startswith("state=stopped run=old")
        assert (tmp_path / ".tpuctl/runs/old/stopped").exists()
        wait_for(lambda: not pid_alive(child), 10, "the leader's child to end")
    finally:
        for pid in (child, leader.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        leader.wait(timeout=10)


def test_ps_of_a_run_started_before_the_started_file(tmp_path: Path) -> None:
    # A run of an earlier version, in a directory of its own.
    run = _make_run(tmp_path, "old", earlier=True, pid="999999\n", exit="0\n")
    os.utime(run("pid"), (1600000000, 1600000000))
    state = remote.parse_state(_run(remote.status_script("old"), tmp_path).decode())
    assert state is not None and state.started is not None
    assert state.started.timestamp() == 1600000000  # the pid file's mtime, as it always was


def _tail_last_line(data: bytes, window: int = 2048) -> bytes:
    """`tail -c WINDOW | tail -n 1`, without the newline."""
    tail = data[-window:]
    return (tail[:-1] if tail.endswith(b"\n") else tail).rpartition(b"\n")[2]


LOG_PIECES = st.sampled_from(
    [b"", b"step 7 loss 0.5", b"\r", b"50%\r100%", "é€".encode(), b"\xff\xfe", b" x ",
     b"12:00:00" + SUPERVISOR.encode() + b"waiting", b"y" * 2500, b"z" * 1100, b"\\n %s"]
)  # fmt: skip
LOGS = st.builds(
    lambda pieces, end: b"\n".join(pieces) + end,
    st.lists(LOG_PIECES, max_size=12),
    st.sampled_from([b"", b"\n", b"\n\n", b"\r\n"]),
)


@settings(max_examples=40, deadline=None)
@given(LOGS)
def test_ps_last_line_is_what_tail_gives(log: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:  # a fresh HOME for each example
        home = Path(directory)
        _make_run(home, "r1", pid="999999\n", exit="0\n", started="1\n", log=log)
        shown = _run(remote.status_script("r1"), home).split(b"\n")
    assert shown[1] == b"last=" + _tail_last_line(log).replace(b"\r", b"")


def test_a_long_log_is_read_by_one_tail(tmp_path: Path) -> None:
    log = b"".join(b"step %d\n" % step for step in range(200_000)) + b"last\r\n"
    _make_run(tmp_path, "r1", pid="999999\n", exit="0\n", started="1\n", log=log)
    assert _run(remote.status_script("r1"), tmp_path).endswith(b"\nlast=last\n")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_detached_run_records_what_ps_reads(tmp_path: Path, shell: str) -> None:
    before = int(time.time())
    started = _run(remote.start_script("r9", "echo out; exit 5"), tmp_path, shell=shell)
    assert started.startswith(b"started ")
    runs = tmp_path / ".tpuctl" / "runs"
    deadline = time.monotonic() + 10
    while not (runs / "r9.exit").exists() or not (runs / "r9.exit").read_text():
        assert time.monotonic() < deadline, "the run did not record its exit"
        time.sleep(0.02)
    # Files, no directory for the run (no `mkdir` process after the first run).
    assert sorted(path.name for path in runs.iterdir()) == [
        "latest", "r9.command", "r9.exit", "r9.log", "r9.pid", "r9.started",
    ]  # fmt: skip
    assert (runs / "r9.exit").read_text() == "5\n"
    assert (runs / "r9.command").read_text() == "echo out; exit 5\n"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    pid, recorded_boot, session = (runs / "r9.pid").read_text().split()
    assert pid == started.split()[1].decode() and recorded_boot == boot
    assert session == "-" or session.isdigit()
    assert before <= int((runs / "r9.started").read_text()) <= time.time() + 1
    state = remote.parse_state(_run(remote.status_script(None), tmp_path, shell=shell).decode())
    assert state is not None
    assert (state.state, state.run, state.exit_code, state.last_line) == ("exited", "r9", 5, "out")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_run_of_an_earlier_boot_is_not_running_whatever_has_its_pid_now(
    tmp_path: Path, leader: int, shell: str
) -> None:
    # After a maintenance reboot, the number a run's leader had names another process (here
    # a live session leader) or none: not the run, which ps must not call running, stop must
    # not kill and logs --follow must not follow until that process ends.
    _make_run(tmp_path, "old", pid=f"{leader} an-earlier-boot\n", log="before the reboot\n")
    status = _run(remote.status_script(None), tmp_path, shell=shell).decode()
    state = remote.parse_state(status)
    assert state is not None and (state.state, state.run, state.pid) == ("unknown", "old", None)
    stopped = _run(remote.stop_script(None, 1.0), tmp_path, shell=shell).decode()
    assert stopped.startswith("state=not-running run=old")
    os.kill(leader, 0)  # still alive
    logs = remote.logs_script("old", None, follow=True)
    assert _run(logs, tmp_path, shell=shell) == b"before the reboot\n"
    # The same pid recorded in this boot is the run's.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    _make_run(tmp_path, "old", pid=f"{leader} {boot}\n")
    state = remote.parse_state(_run(remote.status_script(None), tmp_path, shell=shell).decode())
    assert state is not None and (state.state, state.pid) == ("running", leader)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_run_is_found_the_moment_its_start_returns(tmp_path: Path, shell: str) -> None:
    # A leader that is slow to get the CPU, as on a loaded worker: a bash that waits before
    # it execs the real one (the same process, so $! is still the leader).
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "bash").write_text(f'#!/bin/sh\nsleep 1\nexec {BASH} "$@"\n')
    (slow / "bash").chmod(0o755)
    path = f"{slow}:{os.environ['PATH']}"
    started = _run(remote.start_script("r7", "echo hi; sleep 60"), tmp_path, shell=shell, path=path)
    pid = int(started.split()[1])
    try:
        status = _run(remote.status_script(None), tmp_path, shell=shell).decode()
        state = remote.parse_state(status)
        assert state is not None and (state.state, state.run, state.pid) == ("running", "r7", pid)
        logs = remote.logs_script(None, None, follow=False)
        assert _run(logs, tmp_path, shell=shell) == b""  # its log, empty so far
    finally:  # the group once the leader is in it, else the leader, still the slow bash
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def test_logs_needs_no_pid_unless_it_follows(tmp_path: Path) -> None:
    _make_run(tmp_path, "r1", log="a\nb\nc\n")
    assert _run(remote.logs_script(None, 2, follow=False), tmp_path) == b"b\nc\n"
    assert "pid" not in remote.logs_script(None, 2, follow=False)
    assert '--pid="$pid"' in remote.logs_script("r1", 2, follow=True)
