#!/usr/bin/env python3
"""SSH fan-out benchmark: tpuctl's engine vs an asyncssh baseline vs a gcloud-style runner.

One emulated worker plane (v4-128 slices of 16 workers, real asyncssh servers) runs in its own
process; every client run is a separate subprocess, so the client's CPU (time.process_time,
all threads) is never mixed with the servers'. Side by side, in one run:

  tpuctl     tpuctl.fanout.engine (paramiko, --batch-size 64 set-ups in flight)
  asyncssh   a minimal asyncssh client, 128 connections in flight (the baseline)
  gcloud     gcloud's scheme: batches of 64, each joined before the next, a fresh paramiko
             connection per worker
  detach     tpuctl --detach `sleep 600` (how long until it has started everywhere)

  scripts/bench/fanout.py [--sizes 64,256,1024] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
WORKERS_PER_SLICE = 16  # v4-128
USER = "bench"


# ------------------------------------------------------------------------------- the plane


def serve(count: int, public_key: str) -> None:
    """Child process: a WorkerPlane with `count` workers; prints their addresses as JSON."""
    from tpuctl.emulator.vms.workers import NodeIdentity, WorkerPlane

    state = Path(tempfile.mkdtemp(prefix="tpuctl-bench-"))
    plane = WorkerPlane(state)
    plane.start()
    workers: list[dict[str, Any]] = []
    slices = (count + WORKERS_PER_SLICE - 1) // WORKERS_PER_SLICE
    for index in range(slices):
        node_id = f"bench-{index}"
        identity = NodeIdentity(
            node_id=node_id,
            node_name=f"projects/bench/locations/us-central2-b/nodes/{node_id}",
            project="bench",
            zone="us-central2-b",
            accelerator_type="v4-128",
            workers=min(WORKERS_PER_SLICE, count - index * WORKERS_PER_SLICE),
            slice_index=index,
            num_slices=slices,
            preemptible=False,
            autocheckpoint=False,
            topology="4x4x4",
        )
        infos = plane.create_node(identity, {"ssh-keys": f"{USER}:{public_key}"}, coordinator=None)
        workers += [
            {
                "slice": index,
                "node": node_id,
                "worker": i.worker,
                "ip": i.ip,
                "host_key": i.host_key,
            }
            for i in infos
        ]
    print(json.dumps({"port": plane.ssh_port, "workers": workers}), flush=True)
    stop = False

    def finish(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        plane.close()
        import shutil

        shutil.rmtree(state, ignore_errors=True)


# ------------------------------------------------------------------------------ the clients


def _targets(plane: dict[str, Any], size: int) -> list[Any]:
    from tpuctl.fanout.targets import WorkerTarget

    targets = []
    for entry in plane["workers"][:size]:
        algorithm, blob = entry["host_key"].split()[:2]
        targets.append(
            WorkerTarget(
                entry["slice"], entry["node"], entry["worker"], entry["ip"], plane["port"],
                ((algorithm, blob),),
            )
        )  # fmt: skip
    return targets


def client(engine: str, size: int, command: str, key_file: str, plane_file: str) -> None:
    """Child process: one timed run; prints {"wall", "cpu", "ok"} as JSON."""
    plane = json.loads(Path(plane_file).read_text())
    runner = {"tpuctl": _tpuctl, "detach": _detach, "asyncssh": _asyncssh, "gcloud": _gcloud}
    prepare, run = runner[engine](plane, size, command, key_file)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ok = run(prepare)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(json.dumps({"wall": wall, "cpu": cpu, "ok": ok}), flush=True)


def _paramiko_key(key_file: str) -> Any:
    import paramiko

    return paramiko.Ed25519Key.from_private_key_file(key_file)


def _tpuctl(plane: dict[str, Any], size: int, command: str, key_file: str) -> Any:
    from tpuctl.fanout.connection import ConnectOptions
    from tpuctl.fanout.engine import FanoutOptions, run_fanout

    targets = _targets(plane, size)
    options = ConnectOptions(user=USER, pkey=_paramiko_key(key_file))

    def run(_: Any) -> int:
        result = run_fanout(targets, command, options, FanoutOptions(batch_size=64))
        return len(result.succeeded)

    return None, run


def _detach(plane: dict[str, Any], size: int, command: str, key_file: str) -> Any:
    from tpuctl.fanout import remote
    from tpuctl.fanout.connection import ConnectOptions
    from tpuctl.fanout.engine import FanoutOptions, run_fanout

    targets = _targets(plane, size)
    options = ConnectOptions(user=USER, pkey=_paramiko_key(key_file))
    script = remote.start_script(remote.new_run_id(), command)

    def run(_: Any) -> int:
        result = run_fanout(targets, script, options, FanoutOptions(batch_size=64))
        return len(result.succeeded)

    return None, run


def _asyncssh(plane: dict[str, Any], size: int, command: str, key_file: str) -> Any:
    import asyncio

    import asyncssh

    key = asyncssh.read_private_key(key_file)
    entries = plane["workers"][:size]

    async def one(entry: dict[str, Any], gate: asyncio.Semaphore) -> bool:
        async with gate:
            conn = await asyncssh.connect(
                entry["ip"], plane["port"], username=USER, client_keys=[key],
                known_hosts=([asyncssh.import_public_key(entry["host_key"])], [], []),
                agent_path=None, config=None, connect_timeout=60,
            )  # fmt: skip
        async with conn:
            done = await conn.run(command)
        return done.exit_status == 0

    async def main() -> int:
        gate = asyncio.Semaphore(128)  # connections being set up (released once connected)
        results = await asyncio.gather(*(one(entry, gate) for entry in entries))
        return sum(results)

    return None, lambda _: asyncio.run(main())


def _gcloud(plane: dict[str, Any], size: int, command: str, key_file: str) -> Any:
    import threading

    import paramiko

    key = _paramiko_key(key_file)
    entries = plane["workers"][:size]
    ok = [0]
    lock = threading.Lock()

    def one(entry: dict[str, Any]) -> None:
        ssh = paramiko.SSHClient()
        ssh.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            ssh.connect(
                entry["ip"], plane["port"], username=USER, pkey=key,
                look_for_keys=False, allow_agent=False, timeout=60,
            )  # fmt: skip
            _, stdout, _ = ssh.exec_command(command)
            if stdout.channel.recv_exit_status() == 0:
                with lock:
                    ok[0] += 1
        finally:
            ssh.close()

    def run(_: Any) -> int:
        for start in range(0, len(entries), 64):
            batch = [threading.Thread(target=one, args=(e,)) for e in entries[start : start + 64]]
            for thread in batch:
                thread.start()
            for thread in batch:  # gcloud joins the whole batch before starting the next
                thread.join()
        return ok[0]

    return None, run


# ------------------------------------------------------------------------------- driver


def _measure(engine: str, size: int, command: str, key_file: str, plane_file: str) -> Any:
    out = subprocess.run(
        [sys.executable, __file__, "--client", engine, str(size), command, key_file, plane_file],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{engine} {size} {command!r} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--quick", action="store_true", help="64 and 256 workers, no gcloud.")
    parser.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    if args.client:
        engine, size, command, key_file, plane_file = args.client
        client(engine, int(size), command, key_file, plane_file)
        return
    sizes = [int(s) for s in ("64,256" if args.quick else args.sizes).split(",")]
    engines = ["tpuctl", "asyncssh"] + ([] if args.quick else ["gcloud"])
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    work = Path(tempfile.mkdtemp(prefix="tpuctl-bench-client-"))
    key = ed25519.Ed25519PrivateKey.generate()
    key_file = work / "id_ed25519"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    print(f"starting {max(sizes)} emulated workers …", file=sys.stderr)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(max(sizes)), public.decode() + " bench"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        plane_file = work / "plane.json"
        plane_file.write_text(server.stdout.readline())
        for size in sizes:
            for command in ("true", "sleep 1"):
                for engine in engines:
                    print(f"  {engine:8} {size:5} {command}", file=sys.stderr)
                    m = _measure(engine, size, command, str(key_file), str(plane_file))
                    rows.append({"engine": engine, "size": size, "command": command, **m})
            print(f"  detach   {size:5} sleep 600 &", file=sys.stderr)
            m = _measure("detach", size, "sleep 600", str(key_file), str(plane_file))
            rows.append({"engine": "detach", "size": size, "command": "sleep 600 (detached)", **m})
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    _report(rows, sizes)


def _report(rows: list[dict[str, Any]], sizes: list[int]) -> None:
    print(f"\n{'engine':9} {'workers':>7} {'command':22} {'wall s':>8} {'cpu ms/w':>9} {'ok':>6}")
    for row in rows:
        print(
            f"{row['engine']:9} {row['size']:7} {row['command']:22} {row['wall']:8.2f} "
            f"{row['cpu'] * 1000 / row['size']:9.2f} {row['ok']:6}"
        )

    def wall(engine: str, size: int, command: str) -> float | None:
        for row in rows:
            if (row["engine"], row["size"], row["command"]) == (engine, size, command):
                return float(row["wall"])
        return None

    print("\nratios (targets at 1,024 workers: tpuctl/asyncssh ≤ 1.3 for true, "
          "detach/true ≤ 1.5, CPU ≤ 5 ms per worker)")  # fmt: skip
    for size in sizes:
        ours, base = wall("tpuctl", size, "true"), wall("asyncssh", size, "true")
        detach = wall("detach", size, "sleep 600 (detached)")
        sleep_ours, sleep_base = wall("tpuctl", size, "sleep 1"), wall("asyncssh", size, "sleep 1")
        gcloud = wall("gcloud", size, "sleep 1")
        parts = []
        if ours and base:
            parts.append(f"tpuctl/asyncssh true {ours / base:.2f}")
        if sleep_ours and sleep_base:
            parts.append(f"sleep 1 {sleep_ours / sleep_base:.2f}")
        if detach and ours:
            parts.append(f"detach/true {detach / ours:.2f}")
        if gcloud and sleep_ours:
            parts.append(f"gcloud/tpuctl sleep 1 {gcloud / sleep_ours:.2f}")
        cpu = [
            r["cpu"] * 1000 / size for r in rows if r["engine"] == "tpuctl" and r["size"] == size
        ]
        if cpu:
            parts.append(f"tpuctl CPU {max(cpu):.2f} ms/worker")
        print(f"  {size:5} workers: " + ", ".join(parts))


if __name__ == "__main__":
    main()
