#!/usr/bin/env python3
"""The emulator's timings, each beside what it stands for, in one run at the suite's settings.

The tests assert what the emulator does (which QR stays waiting, who got SIGTERM and outlived
whose cleanup, what the event log says in which order); how long it takes is measured here.
Times come from the emulator's event log (its own wall clock, in milliseconds) unless noted.

  scale    a QR of 4 and of 64 v4-128 slices (64 and 1,024 workers, each with its own SSH
           server), CREATING → ACTIVE; the cost per worker of each, side by side.
           Target: 1,024 workers ACTIVE within 60 s.
  windows  valid_after_duration and valid_until_duration of WINDOW emulated seconds: CREATING →
           chips allocated, and CREATING → FAILED, against the window divided by --speed.
           Target: never early (ratio ≥ 1), at most 0.5 s late.
  grace    simulated maintenance of a VM running a TPU-holding process that ignores SIGTERM,
           with and without autocheckpoint: maintenance.stop → the reboot's node.boot, against
           the grace and the graceful-shutdown timeout (autocheckpoint only) plus the reboot
           delay, divided by --speed.
           Target: never early, at most 1 s late.
  idle     the emulator at rest (no queued resource, this process's channel open) for
           IDLE_SECONDS, its CPU from /proc schedstat, beside a bare gRPC server with one
           channel open measured over the same seconds: what gRPC costs at rest whoever
           serves (its server loop wakes 5 times a second). Target: ≤ 1.75× the bare server
           (an idle emulator sits beside every test process, the whole run long).
  follow   `tpuctl emulator events --follow`: an admin call → its line on the follower's
           stdout (this process's monotonic clock), against the 10 s long-poll a missed
           wake-up would cost. Target: ≤ 1 s.

    .venv/bin/python scripts/bench/emulator.py [--speed 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tpuctl.emulator.client.testing import EmulatorProcess  # noqa: E402

ZONE = "us-central2-b"
GRACE = 60.0  # emulated seconds, as the test suite's session emulator (--grace 60s)
REBOOT = 2.0  # emulated seconds a VM stays down after maintenance (Delays.reboot)
WINDOW = 40.0  # emulated seconds of each queueing window
FOLLOW_POLL = 10.0  # the long-poll of `events --follow`
SCALE_TARGET = 60.0
WINDOW_LATE = 0.5
GRACE_LATE = 1.0
FOLLOW_TARGET = 1.0
IDLE_SECONDS = 20.0
IDLE_TARGET = 1.75  # × a bare gRPC server at rest (2.3–2.5× before it slept)
RESOLUTION = 0.002  # event timestamps are whole milliseconds: "early" by less is rounding

# Started by the startup script: holds the TPU like a program and ignores SIGTERM, so a stop
# with a grace lasts the whole grace, and then the whole graceful-shutdown timeout.
STUBBORN = """#!/bin/bash
nohup setsid bash -c 'exec 3<"$TPUCTL_VM_ROOT/dev/accel0"; trap "" TERM; touch {ready}
while true; do sleep 0.1; done' >/dev/null 2>&1 &
"""
SHUTDOWN = 90.0  # emulated seconds a graceful shutdown waits (EmulatorConfig.shutdown)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def wait(probe: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


class Bench:
    def __init__(self, emulator: EmulatorProcess) -> None:
        self.emulator = emulator
        self.admin = emulator.admin
        self.client: Any = emulator.tpu_client()
        self.parent = f"projects/bench-{uuid.uuid4().hex[:6]}/locations/{ZONE}"

    # -- queued resources ----------------------------------------------------------------
    def create(self, prefix: str, node: dict[str, Any], **body: Any) -> tuple[str, str]:
        """Create a QR (node_count in `body` makes it multislice); (QR name, first node id)."""
        qr_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
        node = {
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
            "network_config": {"enable_external_ips": True},
            **node,
        }
        spec: dict[str, Any] = {"parent": self.parent, "node": node}
        count = body.pop("node_count", 0)
        if count:
            spec["multi_node_params"] = {"node_count": count, "node_id_prefix": qr_id}
            node_id = f"{qr_id}-0"
        else:
            spec["node_id"] = node_id = f"{qr_id}-node"
        self.client.create_queued_resource(
            request={
                "parent": self.parent,
                "queued_resource_id": qr_id,
                "queued_resource": {"tpu": {"node_spec": [spec]}, **body},
            }
        )
        return f"{self.parent}/queuedResources/{qr_id}", node_id

    def state(self, name: str) -> str:
        from google.cloud.tpu_v2alpha1.types import cloud_tpu

        state = self.client.get_queued_resource(name=name).state.state
        return str(cloud_tpu.QueuedResourceState.State(state).name)

    def delete(self, name: str) -> None:
        from google.api_core import exceptions

        self.client.delete_queued_resource(request={"name": name, "force": True})

        def gone() -> bool:
            try:
                self.client.get_queued_resource(name=name)
            except exceptions.NotFound:
                return True
            return False

        wait(gone, f"{name} to be deleted")

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.admin.events(0) if name in (e["qr"], e["node"])]

    def first(self, name: str, kind: str, detail: str | None = None, after: int = -1) -> Any:
        for event in self.events(name):
            matches = detail is None or event["detail"] == detail
            if event["kind"] == kind and event["seq"] > after and matches:
                return event
        return None

    def between(self, start: dict[str, Any], end: dict[str, Any]) -> float:
        return (parse_time(end["timestamp"]) - parse_time(start["timestamp"])).total_seconds()

    # -- the measurements ------------------------------------------------------------------
    def scale(self, slices: int) -> float:
        name, _ = self.create(
            "scale",
            {"accelerator_type": "v4-128", "metadata": {"startup-script": "true"}},
            node_count=slices,
        )
        wait(lambda: self.state(name) == "ACTIVE", f"{slices} slices ACTIVE")
        took = self.between(
            self.first(name, "qr.state", "CREATING"), self.first(name, "qr.state", "ACTIVE")
        )
        self.delete(name)
        return took

    def window(self, policy: str) -> float:
        """CREATING → chips (valid_after) or → FAILED (valid_until, with an empty v2 pool)."""
        if policy == "valid_after":
            name, _ = self.create(
                "after", {}, queueing_policy={"valid_after_duration": {"seconds": int(WINDOW)}}
            )
            end = wait(lambda: self.first(name, "capacity.allocate"), "the chips")
        else:
            name, _ = self.create(
                "until",
                {"accelerator_type": "v2-8"},
                queueing_policy={"valid_until_duration": {"seconds": int(WINDOW)}},
            )
            end = wait(lambda: self.first(name, "qr.failed"), "the queue timeout")
        took = self.between(self.first(name, "qr.state", "CREATING"), end)
        self.delete(name)
        return took

    def grace(self, autocheckpoint: bool, scratch: Path) -> float:
        ready = scratch / f"ready-{uuid.uuid4().hex[:6]}"
        node = {
            "autocheckpoint_enabled": autocheckpoint,
            "metadata": {"startup-script": STUBBORN.format(ready=ready)},
        }
        name, node_id = self.create("grace", node)
        wait(lambda: self.state(name) == "ACTIVE", "ACTIVE")
        wait(ready.exists, "the stubborn process")
        node_name = f"{self.parent}/nodes/{node_id}"
        self.client.simulate_maintenance_event(
            request={"name": node_name, "worker_ids": ["0"]}
        ).result(timeout=60)
        end = wait(lambda: self.first(name, "maintenance.end"), "the end of the maintenance")
        stop = self.first(name, "maintenance.stop")
        boot = self.first(name, "node.boot", after=stop["seq"])
        assert boot is not None and boot["seq"] < end["seq"], "no reboot in the maintenance"
        took = self.between(stop, boot)
        self.delete(name)
        return took

    def follow(self, repeat: int) -> list[float]:
        env = {**os.environ, "TPU_EMULATOR_HOST": self.emulator.host, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "tpuctl", "emulator", "events", "--follow"]
        arrived: list[tuple[float, dict[str, Any]]] = []
        with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as follower:
            assert follower.stdout is not None
            stdout = follower.stdout

            def read() -> None:
                for line in stdout:
                    arrived.append((time.monotonic(), json.loads(line)))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                wait(lambda: arrived, "the follower's first line", timeout=60)
                latencies = []
                for index in range(repeat):
                    # Let the long-poll settle into its wait first: the case that matters.
                    time.sleep(1.0)
                    detail = f"v6e={16384 + index + 1}"
                    sent = time.monotonic()
                    self.admin.capacity({"v6e": 16384 + index + 1})

                    def seen(detail: str = detail) -> float | None:
                        for at, event in list(arrived):
                            if event["kind"] == "capacity" and event["detail"] == detail:
                                return at
                        return None

                    latencies.append(wait(seen, "the capacity event", timeout=60) - sent)
                self.admin.capacity({"v6e": 16384})
            finally:
                follower.terminate()
                reader.join(10)
        return latencies


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of `pid`, by "name tid"."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            nanoseconds = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
        seconds[f"{name} {task.name}"] = nanoseconds / 1e9
    return seconds


BARE_GRPC_SERVER = """
import sys, time
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
sys.stdin.read()
"""


def process_cpu(pid: int) -> float:
    return sum(thread_cpu(pid).values())


def idle(emulator: EmulatorProcess) -> tuple[float, float, dict[str, float]]:
    """The emulator's and a bare gRPC server's shares of a core at rest, over the same
    IDLE_SECONDS, and the emulator's by thread."""
    import grpc

    assert emulator.process is not None
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE_GRPC_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert bare.stdout is not None
        port = int(bare.stdout.readline())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        time.sleep(2.0)  # past the start-ups' own work
        before = thread_cpu(emulator.process.pid), process_cpu(bare.pid)
        time.sleep(IDLE_SECONDS)
        after = thread_cpu(emulator.process.pid), process_cpu(bare.pid)
        channel.close()
    finally:
        bare.kill()
        bare.wait()
    threads = {
        name: (after[0][name] - before[0].get(name, 0.0)) / IDLE_SECONDS for name in after[0]
    }
    return sum(threads.values()), (after[1] - before[1]) / IDLE_SECONDS, threads


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=20.0, help="emulator speed (20)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each timed case (3)")
    args = parser.parse_args()
    speed: float = args.speed
    repeat: int = args.repeat

    with (
        tempfile.TemporaryDirectory(prefix="tpuctl-bench-") as tmp,
        EmulatorProcess(
            Path(tmp) / "state", "--speed", f"{speed:g}", "--grace", f"{GRACE:g}s"
        ) as emulator,
    ):
        rest = idle(emulator)
        bench = Bench(emulator)
        emulator.admin.capacity({"v2": 0})  # valid_until needs a pool that stays empty
        print(f"emulator {emulator.host} at speed {speed:g}, grace {GRACE:g} s emulated")
        scale = {slices: [bench.scale(slices) for _ in range(repeat)] for slices in (4, 64)}
        policies = ("valid_after", "valid_until")
        windows = {policy: [bench.window(policy) for _ in range(repeat)] for policy in policies}
        graces = {
            flag: [bench.grace(flag, Path(tmp)) for _ in range(repeat)] for flag in (True, False)
        }
        follow = bench.follow(repeat)

    ok = True
    share, bare_share, threads = rest
    ratio = share / bare_share
    ok &= ratio <= IDLE_TARGET
    print(
        f"\nAt rest for {IDLE_SECONDS:g} s: the emulator {share * 100:.3f}% of a core, a bare "
        f"gRPC server {bare_share * 100:.3f}%: {ratio:.2f}× (target ≤ {IDLE_TARGET:g}×): "
        f"{verdict(ratio <= IDLE_TARGET)}"
    )
    for name, value in sorted(threads.items(), key=lambda item: -item[1])[:4]:
        print(f"  {name:<24} {value * 1000:6.3f} ms per second")

    print(f"\nScale: CREATING → ACTIVE, median of {repeat}")
    per_worker = {}
    for slices, values in scale.items():
        workers = slices * 16
        median = statistics.median(values)
        per_worker[slices] = median / workers
        print(
            f"  {workers:>5} workers  {median:6.2f} s  (min {min(values):.2f}, max "
            f"{max(values):.2f})  {per_worker[slices] * 1000:6.2f} ms per worker"
        )
    biggest = max(scale[64])
    ok &= biggest <= SCALE_TARGET
    print(
        f"  per-worker cost, 1,024 vs 64 workers: {per_worker[64] / per_worker[4]:.2f}×; "
        f"slowest 1,024 run {biggest:.2f} s, target ≤ {SCALE_TARGET:.0f} s: "
        f"{verdict(biggest <= SCALE_TARGET)}"
    )

    asked = WINDOW / speed
    print(f"\nQueueing windows of {WINDOW:g} s emulated = {asked:.2f} s real")
    for policy, values in windows.items():
        early, late = min(values) - asked, max(values) - asked
        good = early >= -RESOLUTION and late <= WINDOW_LATE
        ok &= good
        print(
            f"  {policy:<12} median {statistics.median(values):5.2f} s = "
            f"{statistics.median(values) / asked:.3f}× the window; earliest {early:+.3f} s, "
            f"latest {late:+.3f} s (never early, ≤ +{WINDOW_LATE} s): {verdict(good)}"
        )

    print("\nMaintenance: maintenance.stop → the reboot, with a process ignoring SIGTERM")
    for flag, values in graces.items():
        expected = ((GRACE + SHUTDOWN if flag else 0.0) + REBOOT) / speed
        early, late = min(values) - expected, max(values) - expected
        good = early >= -RESOLUTION and late <= GRACE_LATE
        ok &= good
        label, parts = (
            ("autocheckpoint", "grace + shutdown + reboot") if flag else ("no grace", "reboot")
        )
        print(
            f"  {label:<15} median {statistics.median(values):5.2f} s against {expected:.2f} s "
            f"({parts}) = {statistics.median(values) / expected:.3f}×; earliest "
            f"{early:+.3f} s, latest {late:+.3f} s (never early, ≤ +{GRACE_LATE:g} s): "
            f"{verdict(good)}"
        )

    worst = max(follow)
    ok &= worst <= FOLLOW_TARGET
    print(
        f"\nevents --follow: a new event printed after median {statistics.median(follow):.3f} s "
        f"(max {worst:.3f} s) = {worst / FOLLOW_POLL:.3f}× the {FOLLOW_POLL:g} s long-poll; "
        f"target ≤ {FOLLOW_TARGET:g} s: {verdict(worst <= FOLLOW_TARGET)}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
