"""Shared pieces of the worker-plane tests: identities, client keys, SSH and metadata calls."""

from __future__ import annotations

import asyncio
import http.client
import os
import time
from dataclasses import dataclass
from typing import Any

import asyncssh

from tests.support import wait_for  # noqa: F401  (re-exported for this folder)
from tpuctl.emulator.vms.workers import NodeIdentity, WorkerInfo, WorkerPlane


def identity(
    node_id: str,
    *,
    workers: int = 2,
    accelerator_type: str = "v4-16",
    topology: str = "2x2x2",
    slice_index: int = 0,
    num_slices: int = 1,
    preemptible: bool = False,
) -> NodeIdentity:
    return NodeIdentity(
        node_id=node_id,
        node_name=f"projects/proj-1/locations/us-central2-b/nodes/{node_id}",
        project="proj-1",
        zone="us-central2-b",
        accelerator_type=accelerator_type,
        workers=workers,
        slice_index=slice_index,
        num_slices=num_slices,
        preemptible=preemptible,
        autocheckpoint=False,
        topology=topology,
    )


@dataclass(frozen=True)
class ClientKey:
    private: asyncssh.SSHKey
    public: str  # "ssh-ed25519 AAAA… comment"

    def metadata_line(self, user: str) -> str:
        return f"{user}:{self.public}"


def new_key(comment: str = "tester", algorithm: str = "ssh-ed25519") -> ClientKey:
    key = asyncssh.generate_private_key(algorithm, comment=comment)
    return ClientKey(key, key.export_public_key("openssh").decode().strip())


def known_hosts(info: WorkerInfo) -> tuple[list[asyncssh.SSHKey], list[Any], list[Any]]:
    """Trust exactly the host key the plane published (as tpuctl does via guest attributes)."""
    return [asyncssh.import_public_key(info.host_key)], [], []


async def connect(
    plane: WorkerPlane, info: WorkerInfo, user: str, key: ClientKey, **options: Any
) -> asyncssh.SSHClientConnection:
    options.setdefault("connect_timeout", 10)
    return await asyncssh.connect(
        info.ip,
        plane.ssh_port,
        username=user,
        client_keys=[key.private],
        known_hosts=known_hosts(info),
        agent_path=None,
        config=None,
        **options,
    )


def run(
    plane: WorkerPlane,
    info: WorkerInfo,
    user: str,
    key: ClientKey,
    command: str,
    *,
    stdin: bytes | None = None,
) -> asyncssh.SSHCompletedProcess:
    async def go() -> asyncssh.SSHCompletedProcess:
        async with await connect(plane, info, user, key) as conn:
            return await conn.run(command, input=stdin, encoding=None, timeout=30)

    return asyncio.run(go())


def metadata_get(ip: str, port: int, path: str, *, flavor: bool = True) -> tuple[int, str]:
    connection = http.client.HTTPConnection(ip, port, timeout=5)
    try:
        headers = {"Metadata-Flavor": "Google"} if flavor else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def read_pids(text: str) -> list[int]:
    return [int(word) for word in text.split() if word.isdigit()]


def os_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# -- a fan-out client, run in its own process so it does not share the plane's GIL -------------


SCALE_KEX = ["curve25519-sha256", "curve25519-sha256@libssh.org"]
SCALE_CIPHERS = ["aes128-gcm@openssh.com"]


async def fan_out(
    targets: list[tuple[str, str]], *, port: int, user: str, key_pem: str, command: str, limit: int
) -> dict[str, Any]:
    """Run `command` on every (ip, host_key) with at most `limit` connections in flight."""
    key = asyncssh.import_private_key(key_pem)
    gate = asyncio.Semaphore(limit)
    statuses: list[int | None] = []
    failures: list[str] = []

    async def one(ip: str, host_key: str) -> None:
        async with gate:
            try:
                async with asyncssh.connect(
                    ip,
                    port,
                    username=user,
                    client_keys=[key],
                    known_hosts=([asyncssh.import_public_key(host_key)], [], []),
                    agent_path=None,
                    config=None,
                    connect_timeout=60,
                    # What tpuctl's paramiko client negotiates with the emulator: asyncssh's
                    # own first choices (ML-KEM hybrid key exchange, ChaCha20-Poly1305 framed
                    # packet by packet in Python) cost both ends about twice the CPU.
                    kex_algs=SCALE_KEX,
                    encryption_algs=SCALE_CIPHERS,
                ) as conn:
                    result = await conn.run(command, timeout=60)
                    statuses.append(result.exit_status)
            except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
                failures.append(f"{ip}: {exc!r}")

    started = time.perf_counter()
    await asyncio.gather(*(one(ip, host_key) for ip, host_key in targets))
    return {
        "seconds": time.perf_counter() - started,
        "ok": sum(1 for status in statuses if status == 0),
        "failures": failures[:5],
        "failed": len(failures),
    }


if __name__ == "__main__":
    import json
    import resource
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    request = json.loads(sys.stdin.read())
    report = asyncio.run(
        fan_out(
            [(ip, host_key) for ip, host_key in request["targets"]],
            port=request["port"],
            user=request["user"],
            key_pem=request["key"],
            command=request["command"],
            limit=request["limit"],
        )
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report["client_cpu_seconds"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(report))
