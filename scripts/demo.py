"""The demo: a 2-slice spot training job on the local emulator, disrupted twice, and recovered.

It drives the real `tpuctl` command line, as a person would, against `tpuctl emulator start`:
validate and plan the spec, `tpuctl up` (create, wait, deliver the trainer, babysit), show the
workers, fan a command out, rehearse a maintenance event with autocheckpoint, preempt the spot
slices and let `tpuctl up` recreate them, then show the checkpoints and the goodput report and
clean up. Every step checks that it did what it says; the first one that did not ends the demo
with a non-zero exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "configs" / "emulator-demo.yaml"
NAME = "emulator-demo"
CHECKPOINTS = Path("/tmp/tpuctl-demo")  # the spec's checkpoint.dir lives here
SPEED = "10"  # emulated delays ÷ 10: provisioning and reboots take a second or two
GRACE = "60s"  # the autocheckpoint grace at maintenance (÷ speed)
console = Console(highlight=False)


class DemoFailed(Exception):
    """A step did not do what it says."""


def tpuctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpuctl", *args]


class Demo:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = dict(os.environ)
        # Its own HOME: the SSH key tpuctl creates for the workers stays out of ~/.ssh.
        self.env["HOME"] = str(workdir / "home")
        self.env.setdefault("USER", "demo")
        self.env.pop("TPUCTL_FORMAT", None)
        self.env["NO_COLOR"] = "1"
        (workdir / "home").mkdir()
        self.emulator: subprocess.Popen[str] | None = None
        self.up: subprocess.Popen[str] | None = None
        self.up_lines: list[str] = []
        self.step_number = 0

    # ------------------------------------------------------------------ helpers
    def step(self, title: str, why: str) -> None:
        self.step_number += 1
        console.print()
        console.rule(f"[bold]{self.step_number}. {title}")
        console.print(why, style="dim")

    def run(
        self, args: Sequence[str], *, expect: int = 0, show: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        shown = " ".join(a if " " not in a else repr(a) for a in ["tpuctl", *args[3:]])
        console.print(f"[cyan]$ {shown}")
        result = subprocess.run(
            list(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=ROOT,
        )
        if show:
            for line in (result.stdout + result.stderr).rstrip().splitlines():
                console.print(f"  {line}", markup=False)
        if result.returncode != expect:
            raise DemoFailed(f"{shown} exited {result.returncode}, expected {expect}")
        return result

    def json(self, *args: str, missing_ok: bool = False) -> Any:
        """A command's JSON result; with missing_ok, None when it is not there (exit 5) yet."""
        command = tpuctl(*args, "--format", "json")
        result = subprocess.run(
            command,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
        if missing_ok and result.returncode == 5:
            return None
        if result.returncode != 0:
            raise DemoFailed(f"tpuctl {' '.join(args)} exited {result.returncode}")
        return json.loads(result.stdout)

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with console.status(f"waiting: {what}"):
            while time.monotonic() < deadline:
                if check():
                    console.print(f"  [green]✓[/] {what}")
                    return
                time.sleep(1)
        raise DemoFailed(f"timed out after {timeout:.0f}s waiting: {what}")

    def job_states(self) -> list[str]:
        status = self.json("status", str(SPEC), "--jobs", missing_ok=True)
        if status is None or status.get("state") != "ACTIVE":
            return []
        return [job.get("state") or "unknown" for job in status.get("jobs") or []]

    def all_running(self) -> bool:
        states = self.job_states()
        return bool(states) and all(state == "running" for state in states)

    # ------------------------------------------------------------------- stages
    def start_emulator(self) -> None:
        self.step(
            "Start a local Cloud TPU",
            "The emulator is a real gRPC server for the v2alpha1 API; every TPU VM it makes has "
            "its own loopback address and SSH server.",
        )
        command = tpuctl("emulator", "start", "--port", "0", "--speed", SPEED, "--grace", GRACE)
        console.print(f"[cyan]$ tpuctl {' '.join(command[3:])} &")
        self.emulator = subprocess.Popen(
            command, env=self.env, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self.emulator.stdout is not None
        for _ in range(3):  # TPU_EMULATOR_HOST, TPUCTL_SSH_PORT, TPUCTL_COMPUTE_ENDPOINT
            line = self.emulator.stdout.readline().strip()
            if "=" not in line:
                raise DemoFailed(f"the emulator did not start (printed {line!r})")
            key, value = line.split("=", 1)
            self.env[key] = value
            console.print(f"  {line}")

    def check_spec(self) -> None:
        self.step(
            "Check the job spec",
            "Every mistake is caught before any API call; plan shows what the spec buys.",
        )
        self.run(tpuctl("validate", str(SPEC)))
        self.run(tpuctl("plan", str(SPEC)))

    def start_up(self) -> None:
        self.step(
            "tpuctl up: create, wait, start the job, and babysit it",
            "up creates the queued resource, waits for ACTIVE, uploads the trainer to every "
            "worker and starts it through the startup script, then watches it until it is done.",
        )
        console.print(f"[cyan]$ tpuctl up {SPEC.relative_to(ROOT)} &")
        self.up = subprocess.Popen(
            tpuctl("up", str(SPEC)),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        threading.Thread(target=self._follow_up, daemon=True).start()
        self.wait_for("the trainer runs on all 4 workers", self.all_running, 120)

    def _follow_up(self) -> None:
        assert self.up is not None and self.up.stdout is not None
        for line in self.up.stdout:
            self.up_lines.append(line.rstrip())
            console.print(f"  [magenta]up │[/] {line.rstrip()}", markup=True, highlight=False)

    def show_workers(self) -> None:
        self.step("The workers", "Two v4-16 slices, two VMs each; every job is running.")
        self.run(tpuctl("status", str(SPEC), "--jobs"))

    def fan_out(self) -> None:
        self.step(
            "Fan a command out to every worker",
            "Connections are verified against the host keys in guest attributes; each worker's "
            "exit code is reported.",
        )
        log = '"${TPUCTL_VM_ROOT:-}/var/log/tpuctl/emulator-demo/current.log"'
        # Exit 0 from tpuctl ssh means the command succeeded on every selected worker.
        self.run(tpuctl("ssh", str(SPEC), "--", f"tail -n 1 {log}"))

    def latest_checkpoint(self) -> int:
        report = self.json("checkpoints", str(SPEC), missing_ok=True)
        return int((report or {}).get("latest_step") or 0)

    def train_until(self, step: int) -> None:
        self.wait_for(
            f"training has committed a checkpoint at step {step} or later",
            lambda: self.latest_checkpoint() >= step,
            120,
        )

    def maintenance(self) -> None:
        self.step(
            "A maintenance event, with autocheckpoint",
            "SimulateMaintenanceEvent: the trainer gets SIGTERM, saves at the step it reached, "
            "the slices reboot, and the startup script resumes it. Nothing is recomputed.",
        )
        self.train_until(50)
        self.run(tpuctl("drill", str(SPEC), "--kind", "maintenance", "--timeout", "120"))

    def preemption(self) -> None:
        self.step(
            "A spot preemption",
            "The service takes the spot slices back with no grace. The queued resource goes "
            "SUSPENDED and is never re-allocated: up deletes it and creates it again under the "
            "same run name, and the trainer resumes from its last checkpoint.",
        )
        self.train_until(125)
        self.run(
            tpuctl(
                "drill",
                str(SPEC),
                "--kind",
                "preempt",
                "--external-recovery",
                "--timeout",
                "180",
            ),
            timeout=240,
        )

    def finish(self) -> None:
        self.step(
            "Training finishes",
            "The trainer writes its done marker after the last checkpoint; up sees it, deletes "
            "the queued resource and exits 0.",
        )
        assert self.up is not None
        with console.status("waiting for tpuctl up to finish"):
            code = self.up.wait(timeout=240)
        if code != 0:
            raise DemoFailed(f"tpuctl up exited {code}")
        console.print("  [green]✓[/] tpuctl up exited 0")
        self.up = None

    def results(self) -> None:
        self.step(
            "Checkpoints and the report",
            "The committed checkpoints, and the job's timeline from its journal (kept next to "
            "the checkpoints, so any machine sees the same): queueing, provisioning, each "
            "disruption and its recovery, and goodput.",
        )
        checkpoints = self.json("checkpoints", str(SPEC))
        self.run(tpuctl("checkpoints", str(SPEC)))
        if checkpoints.get("latest_step") != 300:
            raise DemoFailed(f"latest checkpoint {checkpoints.get('latest_step')}, expected 300")
        self.run(tpuctl("report", str(SPEC)))
        self.same_as_uninterrupted()

    def same_as_uninterrupted(self) -> None:
        """The interrupted run's final state against the same trainer run start to end here."""
        final = CHECKPOINTS / "ckpt" / "final.json"
        reference = self.workdir / "reference"
        command = [
            sys.executable,
            str(ROOT / "scripts" / "toy_train.py"),
            *("--steps", "300", "--checkpoint-every", "25", "--step-seconds", "0"),
            *("--checkpoint-dir", str(reference)),
        ]
        console.print("[cyan]$ python3 scripts/toy_train.py --steps 300 … (no interruptions)")
        subprocess.run(
            command,
            env={**self.env, "TPUCTL_WORKER_ID": "0"},
            capture_output=True,
            check=True,
            timeout=120,
        )
        if not final.exists():
            raise DemoFailed(f"{final} is missing")
        if final.read_bytes() != (reference / "final.json").read_bytes():
            raise DemoFailed("the final model state differs from an uninterrupted run")
        history = json.loads(final.read_text(encoding="utf-8")).get("history")
        if history != [[1, 300]]:
            raise DemoFailed(f"the committed history is {history}, not every step once")
        console.print(
            "  [green]✓[/] final model state byte-identical to an uninterrupted run; "
            "every step 1–300 applied exactly once"
        )

    def clean_up(self) -> None:
        self.step("Clean up", "Nothing is left behind: no queued resource, no emulator.")
        self.run(tpuctl("delete", str(SPEC), "--yes", "--force", "--ignore-missing"))
        self.stop_emulator()
        console.print("  [green]✓[/] emulator stopped")

    def stop_emulator(self) -> None:
        for process in (self.up, self.emulator):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        self.up = self.emulator = None


def main() -> int:
    started = time.monotonic()
    console.print(
        Panel.fit(
            "tpuctl demo: a 2-slice spot job with autocheckpoint on the local emulator,\n"
            "a maintenance event and a spot preemption, and nothing lost.",
            style="bold",
        )
    )
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="tpuctl-demo-") as tmp:
        demo = Demo(Path(tmp))
        try:
            demo.start_emulator()
            demo.check_spec()
            demo.start_up()
            demo.show_workers()
            demo.fan_out()
            demo.maintenance()
            demo.preemption()
            demo.finish()
            demo.results()
            demo.clean_up()
        except (DemoFailed, subprocess.TimeoutExpired) as error:
            console.print(f"\n[bold red]demo failed:[/] {error}")
            demo.stop_emulator()
            return 1
        except KeyboardInterrupt:
            console.print("\n[bold red]interrupted[/]")
            demo.stop_emulator()
            return 130
    console.print(
        f"\n[bold green]demo complete in {time.monotonic() - started:.0f} s:[/] the job survived "
        "a maintenance event and a spot preemption and finished with nothing lost."
    )
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
