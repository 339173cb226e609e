#!/usr/bin/env python3
"""toy_train: tpuctl's reference workload, a deterministic trainer that checkpoints and resumes.

Standard library only (Python 3.10+), one file, so it runs on any (emulated) TPU worker. It
behaves like a JAX program with an Orbax CheckpointManager and autocheckpoint on:

* The "model" is a SHA-256 chain plus a small float vector (linear regression by SGD) over a
  fixed synthetic dataset, read in a seeded per-epoch permutation. Every step changes the
  state, so skipping or repeating one changes the result, and the same seed and step count give
  a byte-identical `final.json` whether or not the run was interrupted and resumed.
* Identity as on a TPU VM: worker number from the metadata server (GCE_METADATA_HOST), slice
  from MEGASCALE_SLICE_ID or tpu-env, process id = worker + slice × workers-per-slice. Without
  a metadata server it falls back to the TPUCTL_* variables the startup script exports.
* Checkpoints in the Orbax layout under --checkpoint-dir: `<step>.orbax-checkpoint-tmp-<ns>/`
  holding `state.json` and `_CHECKPOINT_METADATA`, then `commit_success.txt`, then a rename to
  `<step>/` (Orbax's local-disk protocol). Only process 0 writes: the state is replicated. A
  real multi-host Orbax save writes its shards from every host and the primary commits; here
  the other processes only read when they resume. Local paths only: gs:// would need a client
  library, which this stdlib-only toy does not have.
* While it trains it holds the VM's TPU chips open (`/dev/accel*`, under TPUCTL_VM_ROOT on the
  emulator), as libtpu does, so the platform's autocheckpoint SIGTERM, which goes to the
  processes using the TPU, reaches it.
* SIGTERM or SIGINT: finish the current step, save at that step, log `autocheckpoint at step
  N` and exit 0 (what MaxText does after an on-demand save). There is no cross-host agreement
  on the step (JAX's distributed runtime provides that), so each process stops on its own.
* At the end: a checkpoint at the last step, `final.json` beside the checkpoints, and (process
  0) the done marker `$TPUCTL_DONE_MARKER`. Started again after that, it exits 0 at once.

Log lines (stdout, flushed): `starting fresh` or `resumed from step N`, one
`step N/TOTAL loss=… state=<12 hex>` per step (no timestamps: the same in every run),
`checkpoint saved at step N`, `autocheckpoint at step N`, `finished at step N`. With
`--quiet` it prints nothing at all, like a trainer that follows no log conventions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

COMMIT_FILE = "commit_success.txt"
METADATA_FILE = "_CHECKPOINT_METADATA"
STATE_FILE = "state.json"
FINAL_FILE = "final.json"
TMP_MARKER = ".orbax-checkpoint-tmp"
FAILED_ONCE_MARKER = "toy-train-failed-once-at-{step}"
FORMAT_VERSION = 1
FEATURES = 4
LEARNING_RATE = 0.05
EXIT_FAILURE = 1
EXIT_USAGE = 2


class Output:
    """--quiet: print nothing at all, like a trainer with no log conventions."""

    quiet = False


def log(message: str) -> None:
    if Output.quiet:
        return
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """A diagnostic line on stderr (timings, signals); silent under --quiet as well."""
    if not Output.quiet:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def hold_devices() -> list[int]:
    """Open the VM's TPU chips (/dev/accel*, under TPUCTL_VM_ROOT on the emulator) and keep
    them open, as a TPU program does: the platform's autocheckpoint SIGTERM goes to the
    processes holding them. A device that cannot be opened is skipped."""
    root = os.environ.get("TPUCTL_VM_ROOT", "")
    held = []
    for path in sorted(Path(f"{root}/dev").glob("accel*")):
        try:
            held.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except OSError:
            continue
    return held


# ------------------------------------------------------------------------------ identity


@dataclass(frozen=True)
class Identity:
    worker: int
    slice: int
    workers_per_slice: int
    num_slices: int
    source: str

    @property
    def process_id(self) -> int:
        return self.worker + self.slice * self.workers_per_slice

    @property
    def num_processes(self) -> int:
        return self.workers_per_slice * self.num_slices

    @property
    def primary(self) -> bool:
        return self.process_id == 0


def metadata(host: str, key: str) -> str | None:
    url = f"http://{host}/computeMetadata/v1/instance/attributes/{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return str(response.read().decode("utf-8")).strip()
    except (urllib.error.URLError, OSError, ValueError):
        return None


def tpu_env_value(tpu_env: str, key: str) -> str | None:
    """tpu-env has lines like `MEGASCALE_SLICE_ID: '1'`."""
    for line in tpu_env.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip().strip("'\"")
    return None


def env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def resolve_identity() -> Identity:
    """The metadata server first (as JAX does on a TPU VM), then the startup script's variables.

    The real metadata host is tried only when GCE_METADATA_HOST is set or no TPUCTL_WORKER_ID
    was given, so a run off a TPU VM does not wait for a server that is not there.
    """
    host = os.environ.get("GCE_METADATA_HOST", "").strip()
    if not host and "TPUCTL_WORKER_ID" not in os.environ:
        host = "metadata.google.internal"
    worker_text = metadata(host, "agent-worker-number") if host else None
    if worker_text is not None and worker_text.isdigit():
        endpoints = metadata(host, "worker-network-endpoints") or ""
        tpu_env = metadata(host, "tpu-env") or ""
        slice_text = os.environ.get("MEGASCALE_SLICE_ID") or tpu_env_value(
            tpu_env, "MEGASCALE_SLICE_ID"
        )
        slices_text = os.environ.get("MEGASCALE_NUM_SLICES") or tpu_env_value(
            tpu_env, "MEGASCALE_NUM_SLICES"
        )
        per_slice = len([item for item in endpoints.split(",") if item.strip()])
        return Identity(
            worker=int(worker_text),
            slice=int(slice_text) if slice_text and slice_text.isdigit() else 0,
            workers_per_slice=max(per_slice, 1),
            num_slices=int(slices_text) if slices_text and slices_text.isdigit() else 1,
            source="metadata",
        )
    slice_id = env_int("MEGASCALE_SLICE_ID")
    slices = env_int("MEGASCALE_NUM_SLICES")
    return Identity(
        worker=env_int("TPUCTL_WORKER_ID") or 0,
        slice=slice_id if slice_id is not None else env_int("TPUCTL_SLICE_ID") or 0,
        workers_per_slice=max(env_int("TPUCTL_WORKERS_PER_SLICE") or 1, 1),
        num_slices=max(slices if slices is not None else env_int("TPUCTL_NUM_SLICES") or 1, 1),
        source="environment",
    )


# ------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Config:
    seed: int
    dataset_size: int
    batch_size: int

    def to_dict(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
        }


def make_dataset(config: Config) -> list[tuple[list[float], float]]:
    """A fixed synthetic regression set: y = w_true · x + noise, all drawn from the seed."""
    rng = random.Random(config.seed * 7919 + 1)
    truth = [rng.uniform(-2.0, 2.0) for _ in range(FEATURES)]
    data = []
    for _ in range(config.dataset_size):
        x = [rng.uniform(-1.0, 1.0) for _ in range(FEATURES)]
        y = sum(w * v for w, v in zip(truth, x, strict=True)) + rng.gauss(0.0, 0.1)
        data.append((x, y))
    return data


def batch_indices(config: Config, step: int) -> list[int]:
    """The examples of step `step` (1-based): a seeded permutation per epoch, sliced in order."""
    per_epoch = max(config.dataset_size // config.batch_size, 1)
    epoch, position = divmod(step - 1, per_epoch)
    order = list(range(config.dataset_size))
    random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
    return order[position * config.batch_size : (position + 1) * config.batch_size]


@dataclass
class State:
    step: int
    digest: str
    weights: list[float]
    history: list[list[int]]  # applied step indices, run-length: [[first, last], ...]

    @classmethod
    def fresh(cls, config: Config) -> State:
        seed_digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
        return cls(0, seed_digest.hexdigest(), [0.0] * FEATURES, [])

    def to_dict(self, config: Config) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "config": config.to_dict(),
            "step": self.step,
            "digest": self.digest,
            "weights": self.weights,
            "history": self.history,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        return cls(
            int(data["step"]),
            str(data["digest"]),
            [float(value) for value in data["weights"]],
            [[int(first), int(last)] for first, last in data["history"]],
        )


def train_step(
    state: State, config: Config, dataset: list[tuple[list[float], float]], step: int
) -> float:
    """Apply step `step` to `state` in place; returns the batch loss before the update."""
    indices = batch_indices(config, step)
    gradient = [0.0] * FEATURES
    loss = 0.0
    for index in indices:
        x, y = dataset[index]
        error = sum(w * v for w, v in zip(state.weights, x, strict=True)) - y
        loss += error * error
        for feature in range(FEATURES):
            gradient[feature] += 2.0 * error * x[feature]
    count = max(len(indices), 1)
    state.weights = [
        w - LEARNING_RATE * g / count for w, g in zip(state.weights, gradient, strict=True)
    ]
    payload = json.dumps([state.digest, step, indices, state.weights]).encode()
    state.digest = hashlib.sha256(payload).hexdigest()
    state.step = step
    if state.history and state.history[-1][1] == step - 1:
        state.history[-1][1] = step
    else:
        state.history.append([step, step])
    return loss / count


# ------------------------------------------------------------------------------ checkpoints


def complete_steps(directory: Path) -> list[int]:
    """Steps with a committed folder (`N/` holding commit_success.txt), ascending."""
    if not directory.is_dir():
        return []
    steps = []
    for entry in directory.iterdir():
        if entry.name.isdigit() and (entry / COMMIT_FILE).is_file():
            steps.append(int(entry.name))
    return sorted(steps)


def write_file(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_checkpoint(directory: Path, state: State, config: Config, keep: int) -> bool:
    """Orbax's local protocol: tmp folder, data, metadata, commit file, rename, then prune.

    Returns False when that step is already committed (the state at a step is deterministic,
    so the existing one is the same).
    """
    final = directory / str(state.step)
    if (final / COMMIT_FILE).is_file():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    init_ns = time.time_ns()
    tmp = directory / f"{state.step}{TMP_MARKER}-{init_ns}"
    tmp.mkdir()
    metadata = {"init_timestamp_nsecs": init_ns, "commit_timestamp_nsecs": None}
    write_file(tmp / METADATA_FILE, json.dumps(metadata))
    write_file(tmp / STATE_FILE, json.dumps(state.to_dict(config), sort_keys=True, indent=1))
    metadata["commit_timestamp_nsecs"] = time.time_ns()
    write_file(tmp / METADATA_FILE, json.dumps(metadata))
    write_file(tmp / COMMIT_FILE, f"Checkpoint commit was successful to {final}")
    fsync_directory(tmp)
    if final.exists():  # an unfinished folder of an earlier attempt: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_directory(directory)
    for old in complete_steps(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(directory / str(old), ignore_errors=True)
    return True


def load_latest(directory: Path, config: Config) -> State | None:
    steps = complete_steps(directory)
    if not steps:
        return None
    data = json.loads((directory / str(steps[-1]) / STATE_FILE).read_text(encoding="utf-8"))
    if data.get("config") != config.to_dict():
        raise ValueError(
            f"the checkpoint at step {steps[-1]} was made with {data.get('config')}, "
            f"not {config.to_dict()}; use another --checkpoint-dir"
        )
    return State.from_dict(data)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_file(tmp, text)
    os.replace(tmp, path)


def finish(directory: Path, state: State, config: Config, done_marker: str) -> None:
    """final.json and the done marker (process 0 only); both are idempotent."""
    final = json.dumps(state.to_dict(config), sort_keys=True, indent=1) + "\n"
    write_atomic(directory / FINAL_FILE, final)
    if done_marker:
        write_atomic(Path(done_marker), f"finished at step {state.step}\n")
        log(f"done marker {done_marker}")


# ------------------------------------------------------------------------------ main


class StopRequest:
    """Set by SIGTERM/SIGINT; the loop checks it between steps, so a step always completes."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
            note(f"received {signal.Signals(signum).name}; saving after this step")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=100, help="train up to this step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="sleep per step")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="K")
    parser.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    parser.add_argument(
        "--checkpoint-dir", default=os.environ.get("TPUCTL_CHECKPOINT_DIR", ""), metavar="DIR"
    )
    parser.add_argument(
        "--done-marker", default=os.environ.get("TPUCTL_DONE_MARKER", ""), metavar="PATH"
    )
    parser.add_argument("--dataset-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--quiet", action="store_true", help="print nothing (no step, checkpoint or done lines)"
    )
    parser.add_argument("--fail-at-step", type=int, metavar="K", help="exit 1 at step K, always")
    parser.add_argument(
        "--fail-once-at-step", type=int, metavar="K", help="exit 1 at step K the first time only"
    )
    args = parser.parse_args(argv)
    if not args.checkpoint_dir:
        parser.error("no --checkpoint-dir and no TPUCTL_CHECKPOINT_DIR")
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", args.checkpoint_dir):  # gs://, s3://, file:/
        parser.error("toy_train writes local paths only (no Cloud Storage client in the stdlib)")
    if args.steps < 1 or args.checkpoint_every < 1 or args.batch_size < 1:
        parser.error("--steps, --checkpoint-every and --batch-size must be at least 1")
    if args.dataset_size < args.batch_size:
        parser.error("--dataset-size must be at least --batch-size")
    return args


def should_fail(args: argparse.Namespace, directory: Path, step: int) -> bool:
    if args.fail_at_step == step:
        return True
    if args.fail_once_at_step == step:
        marker = directory / FAILED_ONCE_MARKER.format(step=step)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(marker, "x", encoding="utf-8"):
                return True
        except FileExistsError:
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Output.quiet = args.quiet
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    directory = Path(args.checkpoint_dir).expanduser()
    config = Config(args.seed, args.dataset_size, args.batch_size)
    identity = resolve_identity()
    log(
        f"process {identity.process_id} of {identity.num_processes} (worker {identity.worker}, "
        f"slice {identity.slice}, from {identity.source})"
    )
    try:
        state = load_latest(directory, config)
    except ValueError as error:
        sys.stderr.write(f"error: {error}\n")
        return EXIT_USAGE
    if state is None:
        state = State.fresh(config)
        log("starting fresh")
    else:
        log(f"resumed from step {state.step}")
    if state.step >= args.steps:
        log(f"already finished at step {state.step}")
        if identity.primary:
            finish(directory, state, config, args.done_marker)
        return 0
    dataset = make_dataset(config)
    devices = hold_devices()  # held until exit, like libtpu
    while state.step < args.steps:
        if stop.signal is not None:
            if identity.primary:
                save_checkpoint(directory, state, config, args.keep)
            log(f"autocheckpoint at step {state.step}")
            return 0
        step = state.step + 1
        if should_fail(args, directory, step):
            log(f"simulated failure at step {step}")
            return EXIT_FAILURE
        started = time.monotonic()
        loss = train_step(state, config, dataset, step)
        time.sleep(args.step_seconds)  # resumed after a signal handler runs (PEP 475)
        log(f"step {step}/{args.steps} loss={loss:.6f} state={state.digest[:12]}")
        note(f"step-time {step} {time.monotonic() - started:.3f}s")
        if step % args.checkpoint_every == 0 and identity.primary:
            save_started = time.monotonic()
            if save_checkpoint(directory, state, config, args.keep):
                log(f"checkpoint saved at step {step}")
                note(f"save-time {step} {time.monotonic() - save_started:.3f}s")
    if identity.primary:
        save_checkpoint(directory, state, config, args.keep)
        finish(directory, state, config, args.done_marker)
    log(f"finished at step {state.step}")
    for fd in devices:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
