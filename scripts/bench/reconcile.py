#!/usr/bin/env python3
"""One `tpuctl reconcile` step on an idle ACTIVE run, at 256 and 1,024 emulated workers: with
the workers' state objects beside the journal (the default) against every worker over SSH
(`--read-workers ssh`), side by side in one run.

For each size, a run of v4-128 slices (16 workers each) whose job sleeps is brought up on the
emulator; once every worker's state object says it runs, each kind of step is timed
`--repeat` times as its own process (what a scheduler runs): wall time, the process's CPU
(user + system, children included), the objects read and the workers read over SSH, and the
ratio of the SSH step to the objects step.

    .venv/bin/python scripts/bench/reconcile.py [--workers 256,1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tpuctl.emulator.client.testing import EmulatorProcess  # noqa: E402

ZONE = "us-central2-b"
WORKERS_PER_SLICE = 16  # v4-128


def tpuctl(env: dict[str, str], *args: str, timeout: float = 600) -> tuple[int, str, float, float]:
    """Run tpuctl; (exit code, stdout, wall seconds, CPU seconds of the process and children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tpuctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.returncode, done.stdout + done.stderr, wall, cpu


def bring_up(env: dict[str, str], spec: Path, states: Path, workers: int) -> None:
    code, out, wall, _ = tpuctl(env, "create", str(spec), "--wait", "--no-preflight")
    if code != 0:
        raise SystemExit(f"create failed: {out}")
    print(f"  ACTIVE in {wall:.1f} s; waiting for every worker's state object", flush=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        running = 0
        for path in states.glob("*.json"):
            with contextlib.suppress(ValueError, KeyError, OSError):
                running += json.loads(path.read_text())["state"] == "running"
        if running == workers:
            return
        time.sleep(1)
    raise SystemExit("the workers' state objects never all said running")


def step(env: dict[str, str], spec: Path, *flags: str) -> dict[str, Any]:
    code, out, wall, cpu = tpuctl(
        env, "reconcile", str(spec), "--no-preflight", "--format", "json", *flags
    )
    if code not in (0, 12):
        raise SystemExit(f"reconcile exited {code}: {out[-2000:]}")
    if "}" not in out:
        raise SystemExit(f"reconcile {flags} printed no JSON (exit {code}): {out[-2000:]}")
    document = json.loads(out[: out.rindex("}") + 1])
    observed = document["observed"]["workers"] or []
    return {
        "wall": wall,
        "cpu": cpu,
        "objects": sum(w["source"] == "object" for w in observed),
        "ssh": sum(w["source"] == "ssh" for w in observed),
        "action": document["action"],
    }


def measure(emulator: EmulatorProcess, workers: int, repeat: int, base: Path) -> dict[str, Any]:
    name = f"bench-{workers}"
    checkpoints = base / f"ckpt-{workers}"
    spec = base / f"{name}.yaml"
    spec.write_text(
        f"""apiVersion: tpuctl/v1
name: {name}
tpu: {{accelerator: v4-128, runtime: tpu-ubuntu2204-base, slices: {workers // WORKERS_PER_SLICE}}}
capacity: {{tier: on-demand}}
checkpoint: {{dir: {checkpoints}}}
job: {{command: sleep 3600}}
""",
        encoding="utf-8",
    )
    home = base / f"home-{workers}"
    home.mkdir()
    env = {
        **os.environ,
        **emulator.environment(),
        "NO_GCE_CHECK": "true",
        "HOME": str(home),
        "TPUCTL_PROJECT": "bench-reconcile",
        "TPUCTL_ZONE": ZONE,
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"{workers} workers:", flush=True)
    bring_up(env, spec, checkpoints / "tpuctl" / name / "workers", workers)
    step(env, spec)  # the first step records the run and publishes the key: not timed
    step(env, spec, "--read-workers", "ssh")
    results: dict[str, list[dict[str, Any]]] = {"objects": [], "ssh": []}
    for _ in range(repeat):
        results["objects"].append(step(env, spec))
        results["ssh"].append(step(env, spec, "--read-workers", "ssh"))
    tpuctl(env, "delete", str(spec), "--force", "--yes")
    summary: dict[str, Any] = {"workers": workers}
    for kind, runs in results.items():
        summary[kind] = {
            "wall": statistics.median(r["wall"] for r in runs),
            "cpu": statistics.median(r["cpu"] for r in runs),
            "objects": runs[-1]["objects"],
            "ssh": runs[-1]["ssh"],
            "action": runs[-1]["action"],
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="256,1024")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-reconcile-") as scratch:
        base = Path(scratch)
        emulator = EmulatorProcess(base / "state", "--speed", "20", "--capacity", "v4=16384")
        emulator.start()
        try:
            rows = [measure(emulator, size, args.repeat, base) for size in sizes]
        finally:
            emulator.stop()
    print()
    print(
        f"{'workers':>8} {'read':>8} {'wall s':>8} {'cpu s':>7} {'objects':>8} {'over ssh':>9}"
        f" {'action':>7}"
    )
    for row in rows:
        for kind in ("objects", "ssh"):
            r = row[kind]
            print(
                f"{row['workers']:>8} {kind:>8} {r['wall']:>8.2f} {r['cpu']:>7.2f} "
                f"{r['objects']:>8} {r['ssh']:>9} {r['action']:>7}"
            )
        ratio_wall = row["ssh"]["wall"] / row["objects"]["wall"]
        ratio_cpu = row["ssh"]["cpu"] / row["objects"]["cpu"]
        print(
            f"{row['workers']:>8} {'ratio':>8} {ratio_wall:>7.2f}x {ratio_cpu:>6.2f}x  "
            "(SSH step / objects step)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
