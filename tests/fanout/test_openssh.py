"""tpuctl against a real OpenSSH sshd worker (the emulator's ssh_server="openssh" mode).

sshd logs in only users that exist here, so the SSH user is the current OS user.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Project, by_label
from tests.support import wait_for, wait_for_bytes

SSHD = Path("/usr/sbin/sshd")
pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not SSHD.exists(), reason="OpenSSH sshd is not installed"),
]


class _InProcess:
    """What the harness needs from an emulator, for one running in this process."""

    def __init__(self, emulator: Any) -> None:
        self.host = emulator.host
        self.ssh_port = emulator.ssh_port
        self.state_dir = emulator.state_dir

    def environment(self) -> dict[str, str]:
        return {"TPU_EMULATOR_HOST": self.host, "TPUCTL_SSH_PORT": str(self.ssh_port)}


@pytest.fixture(scope="module")
def openssh_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_InProcess]:
    from tpuctl.emulator.api.server import Emulator
    from tpuctl.emulator.control.config import EmulatorConfig

    state = tmp_path_factory.mktemp("openssh") / "state"
    config = EmulatorConfig(speed=20.0, state_dir=state, ssh_server="openssh")
    with Emulator(config) as emulator:
        yield _InProcess(emulator)


def test_commands_and_exit_codes_through_openssh(
    openssh_emulator: _InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tpuctl = Project(openssh_emulator, tmp_path)
    for name, value in tpuctl.env.items():
        monkeypatch.setenv(name, value)
    qr = tpuctl.create_qr(accelerator="v4-16", slices=1)
    user = pwd.getpwuid(os.getuid()).pw_name  # sshd knows OS users only ($USER is set)
    out = tpuctl(
        "ssh", qr.name, "--user", user, "--format", "json", "--",
        'echo "on $TPUCTL_EMULATED_WORKER"; case $TPUCTL_EMULATED_WORKER in */1) exit 4;; esac',
    )  # fmt: skip
    assert out.exit_code == 3, out.stderr
    rows = by_label(out)
    assert rows["0/0"]["status"] == "ok" and rows["0/0"]["stdout_tail"] == f"on {qr.node_ids[0]}/0"
    assert rows["0/1"]["exit_code"] == 4
    started = tpuctl("ssh", qr.name, "--user", user, "--detach", "--", "sleep 30")
    assert started.exit_code == 0, started.stderr
    stopped = tpuctl("stop", qr.name, "--user", user, "--grace", "1", "--format", "json")
    assert stopped.exit_code == 0, stopped.stderr
    assert {row["detail"]["state"] for row in stopped.json()["workers"]} == {"stopped"}


# Bytes that are not UTF-8, as a user's argv or file names may hold them: Python hands them on
# as surrogate escapes, and SSH's exec request carries bytes, so a worker must get them as
# they were. OpenSSH's sshd (the real workers' server) passes them on untouched.
ODD = b"caf\xe9 \xff\xfe-\x80"


@pytest.fixture(scope="module")
def openssh_qr(
    openssh_emulator: _InProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    owner = Project(openssh_emulator, tmp_path_factory.mktemp("openssh-bytes"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in owner.env.items():
            patch.setenv(name, value)
        yield owner.create_qr(accelerator="v4-16", slices=1)


@pytest.fixture
def openssh_tpuctl(
    openssh_emulator: _InProcess, openssh_qr: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Project:
    project = Project(openssh_emulator, tmp_path, openssh_qr.project)
    for name, value in project.env.items():
        monkeypatch.setenv(name, value)
    return project


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _worker_home(tpuctl: Project, qr: Any) -> Path:
    """Where the worker 0/0's login directory is, as the worker itself says."""
    out = tpuctl("ssh", qr.name, "--user", _user(), "--worker", "0", "--format", "json",
                 "--", "pwd")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    return Path(by_label(out)["0/0"]["stdout_tail"])


@pytest.mark.timeout(120)  # before the fix this hung: the set-up thread died encoding the command
def test_argv_bytes_that_are_not_utf8_reach_the_worker_as_they_are(
    openssh_tpuctl: Project, openssh_qr: Any
) -> None:
    tpuctl, qr = openssh_tpuctl, openssh_qr
    home = _worker_home(tpuctl, qr)
    argument = os.fsdecode(ODD)  # what Python makes of such an argv
    write = ["sh", "-c", 'printf %s "$1" > "$2"', "sh", argument]
    # A real process, table mode: argv bytes as a shell would pass them.
    process = tpuctl.spawn("ssh", qr.name, "--user", _user(), "--worker", "0", "--",
                           *write, "table.bin")  # fmt: skip
    _out, err = process.communicate(timeout=100)
    assert process.returncode == 0, err
    # In-process, JSON mode, and one argument (a command line run as written).
    out = tpuctl("ssh", qr.name, "--user", _user(), "--worker", "0", "--format", "json",
                 "--", f"printf %s '{argument}' > json.bin")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    detached = tpuctl("ssh", qr.name, "--user", _user(), "--worker", "0", "--detach",
                      "--", *write, "detached.bin")  # fmt: skip
    assert detached.exit_code == 0, detached.stderr
    for name in ("table.bin", "json.bin"):
        assert (home / name).read_bytes() == ODD
    assert wait_for_bytes(home / "detached.bin", 20, "the detached run") == ODD


@pytest.mark.timeout(120)
def test_paths_that_are_not_utf8_upload_download_and_gather_logs(
    openssh_tpuctl: Project, openssh_qr: Any, tmp_path: Path
) -> None:
    tpuctl, qr = openssh_tpuctl, openssh_qr
    home = _worker_home(tpuctl, qr)
    odd = os.fsdecode(ODD)
    local = tmp_path / f"up {odd}"
    local.mkdir()
    (local / f"file {odd}").write_bytes(ODD)
    up = tpuctl("upload", qr.name, str(local), f"~/dir {odd}", "--user", _user(),
                "--worker", "0", "--format", "json")  # fmt: skip
    assert up.exit_code == 0, up.stderr
    assert (home / f"dir {odd}" / f"file {odd}").read_bytes() == ODD
    # The result names the destination; its JSON escapes give the bytes back.
    assert os.fsencode(up.json()["transfer"]["destination"]) == b"~/dir " + ODD
    again = tpuctl("upload", qr.name, str(local), f"~/dir {odd}", "--user", _user(),
                   "--worker", "0")  # fmt: skip
    assert again.exit_code == 0, again.stderr

    into = tmp_path / f"down {odd}"
    down = tpuctl("download", qr.name, f"~/dir {odd}/file {odd}", str(into),
                  "--user", _user())  # fmt: skip
    assert down.exit_code == 0, down.stderr
    assert (into / f"file {odd}").read_bytes() == ODD

    run = tpuctl("ssh", qr.name, "--user", _user(), "--worker", "0", "--detach", "--format",
                 "json", "--", f"printf %s '{odd}'")  # fmt: skip
    assert run.exit_code == 0, run.stderr
    logs_dir = tmp_path / f"logs {odd}"

    def gathered() -> bool:
        logs = tpuctl("logs", qr.name, "--user", _user(), "--worker", "0", "--run",
                      run.json()["run"], "--output-dir", str(logs_dir))  # fmt: skip
        assert logs.exit_code == 0, logs.stderr
        return any(path.read_bytes() == ODD for path in logs_dir.iterdir())

    wait_for(gathered, 20, "the run's log")
