"""The startup script on a VM with systemd: the trainer as a transient unit, through a
recording `systemd-run` and `systemctl` on PATH (a real systemd is not in the test machine)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.render.conftest import install_python_tools
from tests.support import wait_for_bytes
from tpuctl.render.startup import render_startup_script
from tpuctl.worker import AUTOCHECKPOINT_GRACE_SECONDS, NOFILE_LIMIT

# systemd-run --wait: record the options, run the command after `--` as the unit's main process
# (own session, output appended where StandardOutput says, in --working-directory), publish its
# pid for `systemctl show`, and exit with its status.
FAKE_SYSTEMD_RUN = r"""
import json, os, subprocess, sys
state = os.environ["FAKE_SYSTEMD"]
args = sys.argv[1:]
split = args.index("--")
options, command = args[:split], args[split + 1:]
with open(os.path.join(state, "runs.jsonl"), "a") as runs:
    runs.write(json.dumps({"options": options, "command": command}) + "\n")
value = lambda prefix: next(o[len(prefix):] for o in options if o.startswith(prefix))
unit = value("--unit=")
output = value("--property=StandardOutput=append:")
with open(output, "ab") as sink:
    child = subprocess.Popen(command, cwd=value("--working-directory="), stdout=sink,
                             stderr=sink, stdin=subprocess.DEVNULL, start_new_session=True)
with open(os.path.join(state, unit + ".pid"), "w") as handle:
    handle.write(str(child.pid))
sys.exit(child.wait())
"""
# systemctl show -p MainPID --value UNIT, and systemctl kill --signal=SIG UNIT.
FAKE_SYSTEMCTL = r"""
import os, signal, sys
state = os.environ["FAKE_SYSTEMD"]
args = sys.argv[1:]
with open(os.path.join(state, "systemctl.log"), "a") as log:
    log.write(" ".join(args) + "\n")
unit = args[-1]
try:
    pid = int(open(os.path.join(state, unit + ".pid")).read())
except (OSError, ValueError):
    pid = 0
if args[0] == "show":
    print(pid)
elif args[0] == "kill":
    name = next(a for a in args if a.startswith("--signal=")).split("=", 1)[1]
    os.kill(pid, getattr(signal, name))
"""

TRAINER = (
    "import os, signal, sys, time\n"
    "home = os.environ['HOME']\n"
    "def on_term(*_):\n"
    "    open(home + '/saved', 'w').write('saved')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "open(home + '/env', 'w').write(os.environ['TPUCTL_RUN_NAME'] + ' ' + os.getcwd())\n"
    "print('training', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "systemd-state"
    state.mkdir()
    tools = {"systemd-run": FAKE_SYSTEMD_RUN, "systemctl": FAKE_SYSTEMCTL}
    bin_dir = install_python_tools(tmp_path / "systemd-bin", tools)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD", str(state))
    return state


def test_on_systemd_the_trainer_is_a_transient_unit_stopped_with_the_grace(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], systemd: Path
) -> None:
    spec = job_spec(f"{sys.executable} -c {shlex.quote(TRAINER)}", env={"HF_TOKEN": "s3cret"})
    worker = make_worker("demo")
    (worker.root / "run/systemd/system").mkdir(parents=True)  # systemd is PID 1 here
    result = worker.run(render_startup_script(spec))
    assert result.returncode == 0, result.stderr
    status = worker.wait_for_state("running")
    unit = "tpuctl-demo-boot1"
    main_pid = int(wait_for_bytes(systemd / f"{unit}.pid", 10, "the unit's main process"))
    assert int(status["pid"]) == main_pid  # the unit's main pid, read back from systemctl

    [run] = [json.loads(line) for line in (systemd / "runs.jsonl").read_text().splitlines()]
    options = run["options"]
    for wanted in (
        f"--unit={unit}",
        "--wait",
        "--collect",
        "--service-type=exec",
        "--property=KillMode=mixed",
        f"--property=TimeoutStopSec={AUTOCHECKPOINT_GRACE_SECONDS}",
        "--property=After=network-online.target",
        "--property=Wants=network-online.target",
        f"--property=LimitNOFILE={NOFILE_LIMIT}",
        f"--property=StandardOutput=append:{worker.log_dir}/boot-1.log",
        f"--working-directory={worker.root}/home/tpuctl/job",
    ):
        assert wanted in options, (wanted, options)
    command = run["command"]
    assert command[0] == "env" and command[-3:-1] == ["bash", "-lc"]  # a login environment
    assert "TPUCTL_RUN_NAME=demo" in command and "HF_TOKEN=s3cret" in command
    home = worker.root / "home/tpuctl"
    assert wait_for_bytes(home / "env", 10, "the trainer to start").decode() == f"demo {home}/job"

    # A graceful stop reaches the trainer through systemd, and its save is waited for.
    os.kill(_supervisor(result), signal.SIGTERM)
    exited = worker.wait_for_state("exited")
    assert exited["exit_code"] == "0" and exited["signalled"] == "1"
    assert (home / "saved").read_text() == "saved"
    assert f"kill --signal=SIGTERM {unit}" in (systemd / "systemctl.log").read_text()
    assert "training" in (worker.log_dir / "boot-1.log").read_text()

    # The line as launched (it may hold tokens) is private to root; the status file has no env.
    launched = worker.state_dir / "command"
    assert stat.S_IMODE(launched.stat().st_mode) == 0o600
    assert "s3cret" not in (worker.state_dir / "status").read_text()


def test_without_systemd_the_trainer_gets_its_own_session(
    make_worker: Callable[..., Any], job_spec: Callable[..., Any], systemd: Path
) -> None:
    """systemd-run on PATH is not enough: the VM must be booted with systemd."""
    worker = make_worker("demo")
    worker.run(render_startup_script(job_spec("true")))
    assert worker.wait_for_state("exited")["exit_code"] == "0"
    assert not (systemd / "runs.jsonl").exists()


def _supervisor(result: Any) -> int:
    match = re.search(r"supervisor started as pid (\d+)", result.stderr)
    assert match, result.stderr
    return int(match.group(1))
