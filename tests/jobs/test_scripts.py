"""The worker-side scripts of tpuctl.jobs.control, run locally: syntax under sh and bash, paths,
packing, status parsing and stopping a real process group."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.errors import UsageError
from tpuctl.fanout.results import Tail, WorkerResult
from tpuctl.fanout.targets import WorkerTarget
from tpuctl.jobs import control as jobs
from tpuctl.jobs import scripts
from tpuctl.spec.model import JobSpec, Spec, TpuSpec

SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]


def _spec(**job: object) -> Spec:
    return Spec(
        name="demo",
        tpu=TpuSpec(accelerator="v4-8", runtime="tpu-ubuntu2204-base"),
        job=JobSpec(command="true", run_name="demo", **job),  # type: ignore[arg-type]
    )


def _scripts() -> dict[str, str]:
    spec = _spec(user="trainer", workdir="~/my job/it's")
    return {
        "deliver-code": scripts.deliver_script(spec, "0" * 64),
        "deliver-no-code": scripts.deliver_script(spec, None),
        "probe": scripts.probe_script("demo"),
        "stop": scripts.stop_script("demo", 2.5),
        "restart": scripts.restart_script("demo", 2.5),
    }


# bash scripts (tpuctl.fanout.remote.bash_script): a POSIX sh runs only their first line, which
# hands them to bash; test_probe_is_the_same_under_every_shell runs them under each shell.
BASH_ONLY = {"probe"}


@pytest.mark.parametrize(
    ("shell", "name"),
    [
        (shell, name)
        for name in sorted(_scripts())
        for shell in (["bash"] if name in BASH_ONLY else SHELLS)
    ],
)
def test_scripts_parse_in_posix_sh_and_bash(shell: str, name: str) -> None:
    result = subprocess.run(
        [shell, "-n"], input=_scripts()[name], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_workdir_resolves_like_the_startup_script() -> None:
    assert scripts.workdir_word("~") == '"$h"'
    assert scripts.workdir_word("~/job") == '"$h"/job'
    assert scripts.workdir_word("job dir") == "\"$h\"/'job dir'"
    assert scripts.workdir_word("/srv/job") == '"${TPUCTL_VM_ROOT:-}"/srv/job'
    with pytest.raises(UsageError):
        scripts.workdir_word("~other/job")
    with pytest.raises(UsageError):
        scripts.probe_script("../escape")


def test_pack_code_a_file_or_a_directory(tmp_path: Path) -> None:
    trainer = tmp_path / "train.py"
    trainer.write_text("print('x')\n")
    trainer.chmod(0o755)
    with tarfile.open(fileobj=io.BytesIO(jobs.pack_code(trainer))) as archive:
        [member] = archive.getmembers()
    assert member.name == "train.py" and member.mode & 0o111
    assert jobs.pack_code(trainer) == jobs.pack_code(trainer)  # byte for byte, every time
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("")
    with tarfile.open(fileobj=io.BytesIO(jobs.pack_code(tmp_path))) as archive:
        names = archive.getnames()
    assert {"train.py", "pkg", "pkg/mod.py"} <= set(names)
    with pytest.raises(UsageError):
        jobs.pack_code(tmp_path / "missing.py")


@pytest.fixture
def vm_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "vm"
    (root / "var/lib/tpuctl/demo").mkdir(parents=True)
    monkeypatch.setenv("TPUCTL_VM_ROOT", str(root))
    return root


@pytest.fixture
def trainer() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _write_status(root: Path, **values: object) -> None:
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    (root / "var/lib/tpuctl/demo/status").write_text(text)


def _probe_output(shell: str = "sh", path: str | None = None) -> bytes:
    env = {**os.environ, "PATH": os.environ["PATH"] if path is None else path}
    done = subprocess.run(
        [shell, "-c", scripts.probe_script("demo")], capture_output=True, env=env, check=True
    )
    assert not done.stderr, done.stderr
    return done.stdout


def _probe(root: Path) -> jobs.WorkerJobStatus:
    output = _probe_output()
    worker = WorkerResult(WorkerTarget(1, "node-1", 2, "127.0.0.1"), "ok", exit_code=0)
    worker.stdout = Tail(keep_all=True)
    worker.stdout.add(output)
    return jobs.parse_probe(worker)


def test_probe_reads_the_status_file(vm_root: Path, trainer: list[subprocess.Popen[bytes]]) -> None:
    assert _probe(vm_root).state == "none"
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    trainer.append(process)
    _write_status(
        vm_root, state="running", boot=3, pid=process.pid, started="2026-01-01T00:00:00Z",
        exit_code="", heartbeat=int(time.time()) - 5, reason="odd = value",
    )  # fmt: skip
    status = _probe(vm_root)
    assert (status.slice, status.node, status.worker) == (1, "node-1", 2)
    assert (status.state, status.boot, status.pid) == ("running", 3, process.pid)
    assert status.trainer_alive and status.exit_code is None and status.reason == "odd = value"
    assert status.heartbeat_age_s is not None and 4 <= status.heartbeat_age_s <= 60
    # A pid that is alive but not a process-group leader is not our trainer (a reused pid).
    _write_status(vm_root, state="running", boot=3, pid=os.getpid())
    assert not _probe(vm_root).trainer_alive


def _write_log(root: Path, data: bytes) -> None:
    (root / "var/log/tpuctl/demo").mkdir(parents=True, exist_ok=True)
    (root / "var/log/tpuctl/demo/current.log").write_bytes(data)


def test_probe_starts_no_process(
    vm_root: Path, trainer: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """With no program on the PATH the probe reads everything: builtins only (a log of at most
    4 KiB; a longer one costs one `tail`)."""
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    trainer.append(process)
    _write_status(vm_root, state="running", boot=3, pid=process.pid, heartbeat=int(time.time()))
    (vm_root / "var/lib/tpuctl/demo/boot").write_text("3\n")
    _write_log(vm_root, b"step 1\r\nstep 2\r\n12:00:00 tpuctl-startup: heartbeat\n")
    bash = shutil.which("bash") or "/bin/bash"
    output = _probe_output(bash, path=str(tmp_path / "nobin"))
    values = dict(line.partition("=")[::2] for line in output.decode().splitlines())
    assert abs(int(values["now"]) - time.time()) < 60
    assert values["status.state"] == "running" and values["bootfile"] == "3"
    assert (values["alive"], values["last"]) == ("1", "step 2")


@pytest.mark.parametrize("shell", SHELLS)
def test_probe_is_the_same_under_every_shell(vm_root: Path, shell: str) -> None:
    _write_status(vm_root, state="exited", exit_code=3, reason="odd = value")
    _write_log(vm_root, b"".join(b"step %d\n" % step for step in range(2000)))  # > 4 KiB

    def masked(output: bytes) -> bytes:
        return b"\n".join(line for line in output.split(b"\n") if not line.startswith(b"now="))

    assert masked(_probe_output(shell)) == (
        b"status.state=exited\nstatus.exit_code=3\nstatus.reason=odd = value\nalive=0\n"
        b"last=step 1999\n"
    )


def _trainer_last_line(log: bytes) -> bytes:
    """The old pipeline's: `tail -c 4096 | grep -av " tpuctl-startup: " | tail -n 1`, else (none,
    or an empty line) `tail -c 2048 | tail -n 1`; carriage returns removed."""
    window = log[-4096:]
    lines = (window[:-1] if window.endswith(b"\n") else window).split(b"\n")
    last = next((line for line in reversed(lines) if b" tpuctl-startup: " not in line), b"")
    if not last:
        tail = log[-2048:]
        last = (tail[:-1] if tail.endswith(b"\n") else tail).rpartition(b"\n")[2]
    return last.replace(b"\r", b"")


JOB_LOG_PIECES = st.sampled_from(
    [b"", b"step 7 loss 0.5", b"\r", b"50%\r100%", "é€".encode(), b"\xff", b" x ",
     b"12:00:00 tpuctl-startup: waiting", b"09:00:00 tpuctl-startup: " + b"w" * 900,
     b"y" * 2500, b"z" * 1100]
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    st.lists(JOB_LOG_PIECES, max_size=14),
    st.sampled_from([b"", b"\n", b"\n\n", b"\r\n"]),
)
def test_probe_last_line_is_the_trainers(pieces: list[bytes], end: bytes) -> None:
    log = b"\n".join(pieces) + end
    with tempfile.TemporaryDirectory() as directory:  # a fresh VM root for each example
        root = Path(directory)
        (root / "var/lib/tpuctl/demo").mkdir(parents=True)
        _write_log(root, log)
        env = {**os.environ, "TPUCTL_VM_ROOT": str(root)}
        output = subprocess.run(
            ["bash", "-c", scripts.probe_script("demo")], capture_output=True, env=env, check=True
        ).stdout
    assert output.split(b"\n")[-2] == b"last=" + _trainer_last_line(log)


def _stop(grace: float) -> str:
    return subprocess.run(
        ["sh", "-c", scripts.stop_script("demo", grace)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_stop_terms_the_group_then_kills_it(
    vm_root: Path, trainer: list[subprocess.Popen[bytes]]
) -> None:
    # Reaped as soon as it exits, as the supervisor reaps the trainer (a zombie keeps its group).
    polite = subprocess.Popen(["sleep", "30"], start_new_session=True)
    trainer.append(polite)
    reaper = threading.Thread(target=polite.wait, daemon=True)
    reaper.start()
    _write_status(vm_root, state="running", pid=polite.pid)
    assert _stop(5) == f"state=stopped pid={polite.pid} signal=TERM"
    reaper.join(5)
    assert polite.returncode == -signal.SIGTERM
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(30)"],
        start_new_session=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    trainer.append(stubborn)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    reaper = threading.Thread(target=stubborn.wait, daemon=True)
    reaper.start()
    _write_status(vm_root, state="running", pid=stubborn.pid)
    assert _stop(0.3) == f"state=stopped pid={stubborn.pid} signal=KILL"
    reaper.join(5)
    assert stubborn.returncode == -signal.SIGKILL
    assert _stop(0.3) == f"state=not-running pid={stubborn.pid}"
