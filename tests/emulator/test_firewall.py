"""The firewall in front of workers with no external IP (tpuctl/emulator/vms/firewall.py), worker
addresses kept out of the emulated IAP range, and the `hostname` guest attribute that IAP
tunnels take."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tests.emulator.helpers import (
    QrState,
    create,
    new_project,
    parent_of,
    qr_request,
    unique,
    wait_state,
)
from tests.emulator.workers_helpers import connect, identity, new_key, run
from tpuctl.emulator.vms import firewall
from tpuctl.emulator.vms.workers import WorkerPlane

pytestmark = pytest.mark.emulator

USER = "alice"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPlane]:
    plane = WorkerPlane(tmp_path_factory.mktemp("firewall"))
    plane.start()
    yield plane
    plane.close()


def _banner(address: str, port: int, source: str, wait: float) -> bytes:
    """What the SSH port says within `wait` seconds to a connection from `source`."""
    with socket.create_connection((address, port), timeout=5, source_address=(source, 0)) as sock:
        sock.settimeout(wait)
        try:
            return sock.recv(64)
        except TimeoutError:
            return b""


def test_no_external_ip_admits_only_iap_and_the_vpc(plane: WorkerPlane) -> None:
    key = new_key()
    meta = {"ssh-keys": key.metadata_line(USER)}
    private = plane.create_node(
        replace(identity("private-node"), external_ips=False), meta, coordinator=None
    )
    public = plane.create_node(identity("public-node"), meta, coordinator=None)
    try:
        port = plane.ssh_port
        # From outside (this host, 127.0.0.1): accepted by the kernel, then never a word.
        assert _banner(private[0].ip, port, "127.0.0.1", 1.0) == b""
        # From IAP's range, and from another worker (the same VPC): an SSH server.
        assert _banner(private[0].ip, port, "127.235.240.9", 5.0).startswith(b"SSH-2.0-")
        assert _banner(private[0].ip, port, public[0].ip, 5.0).startswith(b"SSH-2.0-")
        assert _banner(private[1].ip, port, private[0].ip, 5.0).startswith(b"SSH-2.0-")
        # A node with external IPs takes anyone.
        assert _banner(public[0].ip, port, "127.0.0.1", 5.0).startswith(b"SSH-2.0-")
        with pytest.raises((asyncssh.Error, OSError, asyncio.TimeoutError)):
            asyncio.run(connect(plane, private[0], USER, key, connect_timeout=1))

        # A worker is a bastion: `ssh -J` through the public worker reaches the private one,
        # and the forwarded connection leaves from the bastion's own address.
        async def through_bastion() -> str:
            async with await connect(plane, public[0], USER, key) as bastion:
                tunnel = await connect(plane, private[1], USER, key, tunnel=bastion)
                async with tunnel:
                    done = await tunnel.run("echo $SSH_CLIENT", check=True, timeout=30)
                    return str(done.stdout)

        assert asyncio.run(through_bastion()).startswith(public[0].ip + " ")
        assert run(plane, public[1], USER, key, "true").exit_status == 0
    finally:
        plane.delete_node("private-node")
        plane.delete_node("public-node")


def test_worker_addresses_stay_out_of_the_iap_range(tmp_path: Path) -> None:
    plane = WorkerPlane(tmp_path)  # not started: only its address arithmetic
    per_octet = 256 * 254
    for octet in (16, 233, 234, 236):
        plane._octet = octet
        seen = {plane._ip_for(host).split(".")[1] for host in range(0, 3 * per_octet, 997)}
        assert str(firewall.RESERVED_OCTET) not in seen
    assert plane._ip_for(0) == "127.236.0.1"  # from 236, the range only goes up
    plane._octet = 234
    assert plane._ip_for(per_octet) == "127.236.0.1"  # 127.235 is skipped
    assert not firewall.from_iap(plane._ip_for(per_octet))
    assert firewall.from_iap("127.235.255.254") and not firewall.from_iap("127.235.224.1")


def test_guest_attributes_name_each_workers_instance(emulator: Any) -> None:
    client = emulator.tpu_client()
    parent = parent_of(new_project())
    node_id = unique("named")
    request = qr_request(
        parent,
        accelerator_type="v4-16",
        node_id=node_id,
        network_config={"enable_external_ips": False},
    )
    name = create(client, parent, unique("qr"), request).result(timeout=30).name
    try:
        wait_state(client, name, QrState.ACTIVE)
        node_name = f"{parent}/nodes/{node_id}"
        node = client.get_node(name=node_name)
        assert all(not e.access_config.external_ip for e in node.network_endpoints)
        full = client.get_guest_attributes(request={"name": node_name})
        names = [
            [item.value for item in g.query_value.items if item.key == "hostname"]
            for g in full.guest_attributes
        ]
        assert [len(found) for found in names] == [1, 1]
        assert all(re.fullmatch(rf"t1v-n-[0-9a-f]{{8}}-w-{i}", n[0]) for i, n in enumerate(names))
        one = client.get_guest_attributes(
            request={"name": node_name, "query_path": "hostname", "worker_ids": ["1"]}
        )
        assert [i.value for i in one.guest_attributes[0].query_value.items] == names[1]
        keys = client.get_guest_attributes(request={"name": node_name, "query_path": "hostkeys/"})
        assert all(i.key != "hostname" for g in keys.guest_attributes for i in g.query_value.items)
    finally:
        client.delete_queued_resource(request={"name": name, "force": True})
