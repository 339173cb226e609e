#!/usr/bin/env python3
"""The baseline for scripts/bench/commands.py: the least a whole fan-out process must do.

One process, as a user would run it: start the interpreter, import google-cloud-tpu, list the
queued resource's nodes through the TPU API (TPU_EMULATOR_HOST, an insecure channel, as tpuctl
does against the emulator), read each node's host keys from its guest attributes (one call per
node, as tpuctl does), then run COMMAND on every worker over asyncssh at once, with at most
BATCH connections being set up at a time (a slot is held from TCP connect until the command has
started, then released: tpuctl's --batch-size rule). Host keys ARE verified, the simple way:
each worker's connection trusts exactly the keys its node publishes for it in guest attributes
(asyncssh known_hosts given as a list), nothing pinned, nothing written. Stdin is closed at
once, as tpuctl does.

Prints one JSON line {"workers", "ok", "failed"} and exits 0 only if every worker exited 0.

    TPU_EMULATOR_HOST=… TPUCTL_SSH_PORT=… asyncssh_client.py PROJECT ZONE QR USER KEY_FILE \
        [--batch-size 64] [--command true]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any


def worker_addresses(project: str, zone: str, queued_resource: str) -> list[tuple[str, list[str]]]:
    """(address, ["algorithm blob", …]) of every worker of the QR, in slice then worker order."""
    import grpc
    from google.cloud import tpu_v2alpha1
    from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport

    channel = grpc.insecure_channel(os.environ["TPU_EMULATOR_HOST"])
    client = tpu_v2alpha1.TpuClient(transport=TpuGrpcTransport(channel=channel))
    parent = f"projects/{project}/locations/{zone}"
    qr_name = f"{parent}/queuedResources/{queued_resource}"
    nodes = [n for n in client.list_nodes(parent=parent) if n.queued_resource == qr_name]

    def order(node: Any) -> tuple[str, int]:
        prefix, _, index = node.name.rpartition("-")
        return (prefix, int(index)) if index.isdigit() else (node.name, -1)

    workers: list[tuple[str, list[str]]] = []
    for node in sorted(nodes, key=order):
        attributes = client.get_guest_attributes(
            request={"name": node.name, "query_path": "hostkeys/"}
        ).guest_attributes
        for index, endpoint in enumerate(node.network_endpoints):
            address = endpoint.access_config.external_ip or endpoint.ip_address
            items = attributes[index].query_value.items if index < len(attributes) else []
            keys = [f"{item.key} {item.value.split()[0]}" for item in items if item.value.strip()]
            workers.append((address, keys))
    return workers


async def fan_out(
    workers: list[tuple[str, list[str]]],
    port: int,
    *,
    user: str,
    key_file: str,
    command: str,
    batch_size: int,
) -> list[int | None]:
    import asyncssh

    client_key = asyncssh.read_private_key(key_file)
    gate = asyncio.Semaphore(batch_size)

    async def one(address: str, host_keys: list[str]) -> int | None:
        trusted = [asyncssh.import_public_key(key) for key in host_keys]
        async with gate:  # held while connecting and starting the command, as tpuctl's slots
            connection = await asyncssh.connect(
                address, port, username=user, client_keys=[client_key],
                known_hosts=(trusted, [], []), agent_path=None, config=None,
                connect_timeout=60,
            )  # fmt: skip
            process = await connection.create_process(command)
            process.stdin.write_eof()
        async with connection:
            completed = await process.wait()
        return completed.exit_status

    return list(await asyncio.gather(*(one(address, keys) for address, keys in workers)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project")
    parser.add_argument("zone")
    parser.add_argument("queued_resource")
    parser.add_argument("user")
    parser.add_argument("key_file")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    workers = worker_addresses(args.project, args.zone, args.queued_resource)
    if not workers:
        print(f"no workers found for {args.queued_resource}", file=sys.stderr)
        return 1
    port = int(os.environ.get("TPUCTL_SSH_PORT", "22"))
    codes = asyncio.run(
        fan_out(
            workers,
            port,
            user=args.user,
            key_file=args.key_file,
            command=args.command,
            batch_size=args.batch_size,
        )
    )
    ok = sum(code == 0 for code in codes)
    print(json.dumps({"workers": len(codes), "ok": ok, "failed": len(codes) - ok}))
    return 0 if ok == len(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
