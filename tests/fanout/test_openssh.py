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
