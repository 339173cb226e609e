#!/usr/bin/env python3
"""What each of tpuctl's paramiko tunings pays: fan-out client CPU per worker with it and without.

tpuctl keeps a paramiko internal only where it measurably pays (tpuctl/fanout/handshake.py).
This runs tpuctl's fan-out engine against one emulated worker plane (scripts/bench/fanout.py's)
as shipped and with one tuning undone at a time, the variants interleaved round by round, each
run its own process (time.process_time: the client's CPU, all threads):

  shipped      as tpuctl runs
  timer        paramiko's Packetizer: a handshake timer thread per connection
  poll         paramiko's Transport: its thread wakes every 0.1 s, not every 2 s
  x25519       curve25519-sha256 key exchange first (for information: tpuctl keeps paramiko's
               default, the post-quantum hybrid mlkem768x25519-sha256 where paramiko has it)

The poll interval shows on commands that run a while (`sleep 4`), the handshake on any.

    scripts/bench/paramiko_tuning.py [--workers 512] [--rounds 5] [--commands 'true,sleep 4']
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VARIANTS = ("shipped", "timer", "poll", "x25519")


def run_variant(variant: str, size: int, command: str, key_file: str, plane_file: str) -> None:
    """Child process: one timed fan-out with `variant`; prints {"cpu", "wall", "ok"}."""
    sys.path[:0] = [str(REPO), str(HERE)]
    import fanout as bench
    import paramiko

    from tpuctl.fanout import connection, handshake

    transport, packetizer = handshake._transport_class(), handshake._packetizer_class()
    if variant == "timer":
        packetizer = paramiko.packet.Packetizer
    elif variant == "poll":
        transport = paramiko.Transport
    elif variant == "x25519":
        shipped = handshake.new_transport

        def new_transport(sock: Any) -> paramiko.Transport:
            made = shipped(sock)
            options = made.get_security_options()
            first = "curve25519-sha256@libssh.org"
            options.kex = (first, *(name for name in options.kex if name != first))
            return made

        connection.new_transport = new_transport  # type: ignore[assignment]
    handshake._CLASSES = (transport, packetizer)
    plane = json.loads(Path(plane_file).read_text())
    prepare, run = bench._tpuctl(plane, size, command, key_file)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ok = run(prepare)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"cpu": cpu, "wall": wall, "ok": ok}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--commands", default="true,sleep 4")
    parser.add_argument("--variant", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        variant, size, command, key_file, plane_file = args.variant
        run_variant(variant, int(size), command, key_file, plane_file)
        return
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    work = Path(tempfile.mkdtemp(prefix="tpuctl-bench-tuning-"))
    key = ed25519.Ed25519PrivateKey.generate()
    key_file = work / "id_ed25519"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    server = subprocess.Popen(
        [sys.executable, str(HERE / "fanout.py"), "--serve", str(args.workers),
         public.decode() + " bench"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{args.workers} workers, {args.rounds} rounds; load average before: {load}")
    try:
        assert server.stdout is not None
        plane_file = work / "plane.json"
        plane_file.write_text(server.stdout.readline())
        for command in args.commands.split(","):
            samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    argv = [sys.executable, __file__, "--variant", variant, str(args.workers),
                            command, str(key_file), str(plane_file)]  # fmt: skip
                    out = subprocess.run(argv, capture_output=True, text=True, check=True)
                    figures = json.loads(out.stdout.strip().splitlines()[-1])
                    if figures["ok"] != args.workers:
                        raise SystemExit(f"{variant} {command!r}: {figures['ok']} ok: {out.stderr}")
                    samples[variant].append(figures["cpu"] * 1000 / args.workers)
            shipped = statistics.median(samples["shipped"])
            print(f"\n`{command}`: client CPU ms per worker, median of {args.rounds}")
            for variant in VARIANTS:
                median = statistics.median(samples[variant])
                print(f"  {variant:8} {median:6.2f}  {median / shipped:5.2f}x shipped")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
