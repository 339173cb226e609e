"""scripts/toy_train.py as a real process: real signals, real kills, resume, done marker."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import AMBIENT
from tpuctl.storage.checkpoints import inspect_checkpoints

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "scripts" / "toy_train.py"
STEPS = 40
EVERY = 5
COMMON = ("--steps", str(STEPS), "--seed", "3", "--checkpoint-every", str(EVERY))
STEP_LINE = re.compile(r"step (\d+)/(\d+) loss=[0-9.]+ state=[0-9a-f]{12}\Z")


def toy_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    # Off a TPU VM: identity from the startup script's variables, no metadata lookup.
    environ["TPUCTL_WORKER_ID"] = "0"
    environ.update(extra or {})
    return environ


def toy_command(checkpoint_dir: Path | str, *args: str) -> list[str]:
    return [sys.executable, str(TOY), "--checkpoint-dir", str(checkpoint_dir), *args]


def run_toy(
    checkpoint_dir: Path | str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        toy_command(checkpoint_dir, *args),
        cwd=Path(checkpoint_dir).parent if isinstance(checkpoint_dir, Path) else None,
        env=toy_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def step_lines(stdout: str) -> dict[int, str]:
    """Step number → its log line; a step logged twice in one run fails the test."""
    found: dict[int, str] = {}
    for line in stdout.splitlines():
        match = STEP_LINE.match(line)
        if match:
            step = int(match.group(1))
            assert step not in found, f"step {step} logged twice in one run"
            found[step] = line
    return found


class Running:
    """A toy_train in the background whose stdout lines are collected as they come."""

    def __init__(self, command: list[str], env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            command,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, prefix: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r}: {self.lines}") from None
            if line is None:
                raise AssertionError(f"exited before {prefix!r}: {self.lines}")
            self.lines.append(line)
            if line.startswith(prefix):
                return

    def finish(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        while True:
            line = self._queue.get_nowait() if not self._queue.empty() else None
            if line is None:
                break
            self.lines.append(line)
        return code

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines) + "\n"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[int, str]]:
    """final.json and the step lines of one uninterrupted run (seed 3, 40 steps)."""
    directory = tmp_path_factory.mktemp("reference") / "ckpt"
    result = run_toy(directory, *COMMON, "--step-seconds", "0")
    assert result.returncode == 0, result.stderr
    return (directory / "final.json").read_bytes(), step_lines(result.stdout)


def test_uninterrupted_run(tmp_path: Path, reference: tuple[bytes, dict[int, str]]) -> None:
    directory = tmp_path / "ckpt"
    marker = tmp_path / "record" / "run" / "DONE"
    result = run_toy(directory, *COMMON, "--step-seconds", "0", "--done-marker", str(marker))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "starting fresh"
    assert lines[-1] == f"finished at step {STEPS}"
    assert step_lines(result.stdout) == reference[1]
    assert sorted(reference[1]) == list(range(1, STEPS + 1))
    assert (directory / "final.json").read_bytes() == reference[0]  # deterministic
    final = json.loads(reference[0])
    assert final["step"] == STEPS and final["history"] == [[1, STEPS]]
    assert marker.read_text() == f"finished at step {STEPS}\n"
    # The last --keep (3) steps survive, in Orbax's layout, readable by tpuctl.
    report = inspect_checkpoints(str(directory))
    assert report.complete_steps == (30, 35, 40)
    assert report.latest_step == STEPS and report.tmp_folders == ()
    assert all(folder.save_seconds is not None and not folder.notes for folder in report.steps)
    assert report.ignored == ("final.json",)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_autocheckpoints_and_resume_is_exact(
    tmp_path: Path, signum: signal.Signals, reference: tuple[bytes, dict[int, str]]
) -> None:
    directory = tmp_path / "ckpt"
    marker = tmp_path / "DONE"
    args = (*COMMON, "--done-marker", str(marker))
    first = Running(toy_command(directory, *args, "--step-seconds", "0.03"), toy_environment())
    first.wait_for("step 12/")
    first.process.send_signal(signum)
    assert first.finish() == 0  # like MaxText after its on-demand save
    saved = [line for line in first.lines if line.startswith("autocheckpoint at step ")]
    assert len(saved) == 1, first.lines
    stopped = int(saved[0].rsplit(" ", 1)[1])
    assert 12 <= stopped < STEPS
    assert first.lines[-1] == saved[0]  # nothing after the save
    assert max(step_lines(first.stdout)) == stopped  # the step under way was finished
    assert inspect_checkpoints(str(directory)).latest_step == stopped
    assert not marker.exists()  # an interrupted run is not done

    second = run_toy(directory, *args, "--step-seconds", "0")
    assert second.returncode == 0, second.stderr
    assert f"resumed from step {stopped}" in second.stdout.splitlines()
    first_steps, second_steps = step_lines(first.stdout), step_lines(second.stdout)
    assert min(second_steps) == stopped + 1
    # Every step ran exactly once across the two runs, with the same result as without the stop.
    assert set(first_steps).isdisjoint(second_steps)
    assert {**first_steps, **second_steps} == reference[1]
    assert (directory / "final.json").read_bytes() == reference[0]
    assert json.loads((directory / "final.json").read_text())["history"] == [[1, STEPS]]
    assert marker.exists()


def test_sigkill_resumes_from_the_last_periodic_checkpoint(
    tmp_path: Path, reference: tuple[bytes, dict[int, str]]
) -> None:
    directory = tmp_path / "ckpt"
    first = Running(toy_command(directory, *COMMON, "--step-seconds", "0.05"), toy_environment())
    first.wait_for("step 13/")
    first.process.kill()
    assert first.finish() == -signal.SIGKILL
    reached = max(step_lines(first.stdout))
    latest = inspect_checkpoints(str(directory)).latest_step
    assert latest is not None and latest % EVERY == 0
    assert reached - EVERY <= latest < reached

    second = run_toy(directory, *COMMON, "--step-seconds", "0")
    assert second.returncode == 0, second.stderr
    assert f"resumed from step {latest}" in second.stdout.splitlines()
    recomputed = set(step_lines(first.stdout)) & set(step_lines(second.stdout))
    assert recomputed == set(range(latest + 1, reached + 1))  # only the steps since the save
    assert len(recomputed) == reached - latest
    assert (directory / "final.json").read_bytes() == reference[0]


def test_quiet_prints_nothing_and_holds_the_chips_while_it_trains(
    tmp_path: Path, reference: tuple[bytes, dict[int, str]]
) -> None:
    vm_root = tmp_path / "vm"
    (vm_root / "dev").mkdir(parents=True)
    for index in range(2):
        (vm_root / "dev" / f"accel{index}").touch()
    directory = tmp_path / "ckpt"
    command = toy_command(directory, *COMMON, "--step-seconds", "0.02", "--quiet")
    process = subprocess.Popen(
        command,
        env=toy_environment({"TPUCTL_VM_ROOT": str(vm_root)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def held() -> set[str]:
        found = set()
        for fd in os.listdir(f"/proc/{process.pid}/fd"):
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{process.pid}/fd/{fd}"))
        return found

    devices = {str(vm_root / "dev" / f"accel{index}") for index in range(2)}
    deadline = time.monotonic() + 30
    while not devices <= held():  # opened once it starts training
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert (stdout, stderr) == (b"", b"")  # nothing anyone could parse
    stopped = inspect_checkpoints(str(directory)).latest_step
    assert stopped is not None and stopped < STEPS
    again = run_toy(directory, *COMMON, "--step-seconds", "0", "--quiet")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert (directory / "final.json").read_bytes() == reference[0]


def test_relaunch_after_done_exits_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    marker = tmp_path / "DONE"
    args = (*COMMON, "--step-seconds", "0", "--done-marker", str(marker))
    assert run_toy(directory, *args).returncode == 0
    final = (directory / "final.json").read_bytes()
    marker.unlink()  # e.g. a repaired disk lost it: the checkpoint still says finished
    again = run_toy(directory, *args, "--step-seconds", "5")  # would take minutes if it trained
    assert again.returncode == 0, again.stderr
    assert f"already finished at step {STEPS}" in again.stdout
    assert step_lines(again.stdout) == {}
    assert marker.exists()
    assert (directory / "final.json").read_bytes() == final


def test_fail_at_step_fails_every_time(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    args = (*COMMON, "--step-seconds", "0", "--fail-at-step", "8")
    for attempt in range(2):
        result = run_toy(directory, *args)
        assert result.returncode == 1
        assert result.stdout.splitlines()[-1] == "simulated failure at step 8"
        assert ("resumed from step 5" in result.stdout) == (attempt > 0)
        assert sorted(step_lines(result.stdout)) == (
            [1, 2, 3, 4, 5, 6, 7] if attempt == 0 else [6, 7]
        )
    assert inspect_checkpoints(str(directory)).latest_step == 5


def test_fail_once_at_step_then_finishes_identically(
    tmp_path: Path, reference: tuple[bytes, dict[int, str]]
) -> None:
    directory = tmp_path / "ckpt"
    args = (*COMMON, "--step-seconds", "0", "--fail-once-at-step", "8")
    first = run_toy(directory, *args)
    assert first.returncode == 1 and "simulated failure at step 8" in first.stdout
    second = run_toy(directory, *args)
    assert second.returncode == 0, second.stderr
    assert "resumed from step 5" in second.stdout
    assert (directory / "final.json").read_bytes() == reference[0]
    # The marker is not a step folder, and tpuctl says so.
    assert "toy-train-failed-once-at-8" in inspect_checkpoints(str(directory)).ignored


def test_other_settings_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    assert run_toy(directory, *COMMON, "--step-seconds", "0", "--steps", "5").returncode == 0
    other_seed = run_toy(directory, "--seed", "4", "--steps", "10", "--step-seconds", "0")
    assert other_seed.returncode == 2 and "use another --checkpoint-dir" in other_seed.stderr
    for url in ("gs://bucket/ckpt", "file:/x"):
        refused = subprocess.run(
            toy_command(url, "--steps", "5"),
            cwd=tmp_path,
            env=toy_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 2 and "local paths only" in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]


# ------------------------------------------------------------------------------ identity


class MetadataServer:
    """A worker's metadata server: the attributes a TPU VM serves, Metadata-Flavor required."""

    def __init__(self, attributes: Mapping[str, str]) -> None:
        values = dict(attributes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                prefix = "/computeMetadata/v1/instance/attributes/"
                key = self.path.removeprefix(prefix)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor header")
                elif not self.path.startswith(prefix) or key not in values:
                    self.send_error(404)
                else:
                    body = values[key].encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata_server() -> Iterator[type[MetadataServer]]:
    servers: list[MetadataServer] = []

    class Tracked(MetadataServer):
        def __init__(self, attributes: Mapping[str, str]) -> None:
            super().__init__(attributes)
            servers.append(self)

    yield Tracked
    for server in servers:
        server.close()


ENDPOINTS = "w-0:8470:10.0.0.2,w-1:8470:10.0.0.3"


def test_identity_from_the_metadata_server(
    tmp_path: Path, metadata_server: type[MetadataServer]
) -> None:
    directory = tmp_path / "ckpt"
    # The primary runs part of the job and is preempted.
    primary = metadata_server({"agent-worker-number": "0", "worker-network-endpoints": ENDPOINTS})
    env = toy_environment({"GCE_METADATA_HOST": primary.host, "TPUCTL_WORKER_ID": "7"})
    first = Running(toy_command(directory, *COMMON, "--step-seconds", "0.02"), env)
    first.wait_for("step 12/")
    first.process.terminate()
    assert first.finish() == 0
    assert first.lines[0] == "process 0 of 2 (worker 0, slice 0, from metadata)"
    latest = inspect_checkpoints(str(directory)).latest_step
    before = sorted(path.name for path in directory.iterdir())

    # Worker 1 (the metadata server outranks TPUCTL_WORKER_ID) resumes from the same
    # checkpoint, trains to the end, and writes nothing: only process 0 saves.
    worker = metadata_server({"agent-worker-number": "1", "worker-network-endpoints": ENDPOINTS})
    marker = tmp_path / "DONE"
    result = run_toy(
        directory,
        *COMMON,
        "--step-seconds",
        "0",
        "--done-marker",
        str(marker),
        env={"GCE_METADATA_HOST": worker.host, "TPUCTL_WORKER_ID": "0"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "process 1 of 2 (worker 1, slice 0, from metadata)"
    assert lines[1] == f"resumed from step {latest}"
    assert lines[-1] == f"finished at step {STEPS}"
    assert sorted(path.name for path in directory.iterdir()) == before
    assert not marker.exists()


def test_slice_from_tpu_env_makes_a_secondary_process(
    tmp_path: Path, metadata_server: type[MetadataServer]
) -> None:
    server = metadata_server(
        {
            "agent-worker-number": "0",
            "worker-network-endpoints": ENDPOINTS,
            "tpu-env": "ACCELERATOR_TYPE: 'v4-16'\nMEGASCALE_NUM_SLICES: '2'\n"
            "MEGASCALE_SLICE_ID: '1'\nWORKER_ID: '0'\n",
        }
    )
    directory = tmp_path / "ckpt"
    result = run_toy(
        directory, "--steps", "3", "--step-seconds", "0", env={"GCE_METADATA_HOST": server.host}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "process 2 of 4 (worker 0, slice 1, from metadata)"
    assert not directory.exists()  # slice 1's worker 0 is not the primary


def test_identity_from_the_startup_script_variables(tmp_path: Path) -> None:
    env = {
        "TPUCTL_WORKER_ID": "1",
        "TPUCTL_SLICE_ID": "1",
        "TPUCTL_NUM_SLICES": "2",
        "TPUCTL_WORKERS_PER_SLICE": "4",
    }
    result = run_toy(tmp_path / "ckpt", "--steps", "2", "--step-seconds", "0", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "process 5 of 8 (worker 1, slice 1, from environment)"
    # MEGASCALE_SLICE_ID (what JAX reads) outranks the startup script's copy.
    result = run_toy(
        tmp_path / "ckpt", "--steps", "2", "--step-seconds", "0",
        env={**env, "MEGASCALE_SLICE_ID": "0", "TPUCTL_WORKER_ID": "0"},
    )  # fmt: skip
    assert result.stdout.splitlines()[0] == "process 0 of 8 (worker 0, slice 0, from environment)"


# ------------------------------------------------------------------------------ the model


@pytest.fixture(scope="module")
def toy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("toy_train", TOY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_train"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def final_state(toy: ModuleType, steps: list[int], seed: int = 3) -> tuple[str, list[float]]:
    config = toy.Config(seed, 64, 8)
    dataset = toy.make_dataset(config)
    state = toy.State.fresh(config)
    for step in steps:
        toy.train_step(state, config, dataset, step)
    return state.digest, state.weights


def test_state_depends_on_every_step_and_the_data_order(toy: ModuleType) -> None:
    straight = final_state(toy, list(range(1, 21)))
    assert final_state(toy, list(range(1, 21))) == straight
    assert final_state(toy, [*range(1, 10), *range(11, 21)]) != straight  # one skipped
    assert final_state(toy, [*range(1, 11), *range(10, 21)]) != straight  # one repeated
    assert final_state(toy, [2, 1, *range(3, 21)]) != straight  # two swapped
    assert final_state(toy, list(range(1, 21)), seed=4) != straight
    config = toy.Config(3, 64, 8)
    first_epoch = [toy.batch_indices(config, step) for step in range(1, 9)]
    second_epoch = [toy.batch_indices(config, step) for step in range(9, 17)]
    examples = [index for batch in first_epoch for index in batch]
    assert sorted(examples) == list(range(64))  # each example once per epoch
    assert first_epoch != second_epoch  # reshuffled every epoch
