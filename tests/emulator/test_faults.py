"""Faults: spot preemption, queueing timeouts, capacity, maintenance, slice failure, API and SSH
faults, and the event log, against the session emulator with real worker processes."""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.emulator.helpers import (
    NodeState,
    QrState,
    boot_recorder,
    boots,
    create,
    delete,
    new_project,
    parent_of,
    qr_request,
    unique,
    wait_state,
    wait_until,
)
from tpuctl.emulator.client.testing import EmulatorProcess
from tpuctl.emulator.control.config import DEFAULT_CAPACITY_CHIPS
from tpuctl.errors import UsageError

pytestmark = pytest.mark.emulator

Health = cloud_tpu.Node.Health
GRACE_REAL = 60 / 20  # the session emulator's --grace 60s at --speed 20


@pytest.fixture(scope="module")
def client(emulator: EmulatorProcess) -> Any:
    return emulator.tpu_client()


@pytest.fixture
def parent() -> str:
    return parent_of(new_project())


@pytest.fixture
def v2_pool(emulator: EmulatorProcess) -> Iterator[None]:
    """The v2 pool (used by no other test) restored to its default afterwards."""
    yield
    emulator.admin.capacity({"v2": DEFAULT_CAPACITY_CHIPS})


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


def _running(tag: str) -> list[int]:
    """Pids whose command line mentions `tag`, but for the children of one that does: a
    `sleep` or `grep` its bash loop forks has the loop's command line until it execs."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if tag.encode() not in handle.read():
                    continue
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parents[int(entry)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return sorted(pid for pid, parent in parents.items() if parent not in parents)


def _events(emulator: EmulatorProcess, name: str, since: int = 0) -> list[dict[str, Any]]:
    return [
        e for e in emulator.admin.events(since) if name in (e["qr"], e["node"]) or e["qr"] == name
    ]


def test_spot_preemption_suspends_and_returns_capacity(
    client: Any, parent: str, emulator: EmulatorProcess, v2_pool: None
) -> None:
    emulator.admin.capacity({"v2": 4})
    qr_id = unique("spot")
    node_id = unique("spot-node")
    request = qr_request(parent, accelerator_type="v2-8", node_id=node_id, tier="spot")
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    assert emulator.admin.capacity()["v2"]["used"] == 4
    emulator.admin.preempt(qr_id)
    suspended = wait_state(client, name, QrState.SUSPENDED)
    assert suspended.state.state_initiator == cloud_tpu.QueuedResourceState.StateInitiator.SERVICE
    assert client.get_node(name=f"{parent}/nodes/{node_id}").state == NodeState.PREEMPTED
    assert emulator.admin.capacity()["v2"]["used"] == 0
    with pytest.raises(exceptions.AlreadyExists):
        create(client, parent, qr_id, qr_request(parent, accelerator_type="v2-8", tier="spot"))
    kinds = [e["kind"] for e in _events(emulator, name)]
    assert "preempt" in kinds and "capacity.release" in kinds
    delete(client, name, force=False)  # SUSPENDED: no force needed


def test_only_spot_is_preempted(client: Any, parent: str, emulator: EmulatorProcess) -> None:
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    name = (
        create(client, parent, unique("od"), qr_request(parent, queueing_policy=later))
        .result(timeout=30)
        .name
    )
    with pytest.raises(UsageError, match="spot"):
        emulator.admin.preempt(name)
    delete(client, name, force=False)


def test_queue_timeout_fails_with_a_clear_reason(
    client: Any, parent: str, emulator: EmulatorProcess, v2_pool: None
) -> None:
    emulator.admin.capacity({"v2": 0})
    # Two QRs wait for the same empty pool: one for 10 hours at most, one for 40 s (2 s real).
    patient = {"valid_until_duration": datetime.timedelta(hours=10)}
    patient_request = qr_request(parent, accelerator_type="v2-8", queueing_policy=patient)
    patient_name = create(client, parent, unique("patient"), patient_request).result(30).name
    policy = {"valid_until_duration": datetime.timedelta(seconds=40)}
    request = qr_request(parent, accelerator_type="v2-8", queueing_policy=policy)
    qr_id = unique("late")
    create(client, parent, qr_id, request)
    name = f"{parent}/queuedResources/{qr_id}"
    wait_state(client, name, QrState.WAITING_FOR_RESOURCES)  # it waited first (FAILED raises)
    failed = wait_state(client, name, QrState.FAILED)
    error = failed.state.failed_data.error
    assert error.code == 4  # DEADLINE_EXCEEDED
    assert "valid_until" in error.message
    # Its own window closed, not everyone's: the patient QR is still waiting.
    patient_now = client.get_queued_resource(name=patient_name)
    assert patient_now.state.state == QrState.WAITING_FOR_RESOURCES
    states = [e["detail"] for e in _events(emulator, name) if e["kind"] == "qr.state"]
    assert states == ["CREATING", "WAITING_FOR_RESOURCES", "FAILED"]
    assert "qr.failed" not in [e["kind"] for e in _events(emulator, patient_name)]
    delete(client, name, force=False)
    delete(client, patient_name, force=False)


def test_waiting_qr_proceeds_when_capacity_frees(
    client: Any, parent: str, emulator: EmulatorProcess, v2_pool: None
) -> None:
    emulator.admin.capacity({"v2": 4})
    first = create(client, parent, unique("a"), qr_request(parent, accelerator_type="v2-8"))
    first_name = first.result(timeout=30).name
    wait_state(client, first_name, QrState.ACTIVE)
    second_name = (
        create(client, parent, unique("b"), qr_request(parent, accelerator_type="v2-8"))
        .result(timeout=30)
        .name
    )
    # A witness created after it in a pool with room (v4) gets its chips once its least time in
    # WAITING_FOR_RESOURCES is over; the second QR's, begun earlier, is over too by then, so
    # what still holds it is the full v2 pool.
    witness = create(client, parent, unique("w"), qr_request(parent)).result(timeout=30).name
    wait_until(
        lambda: "capacity.allocate" in [e["kind"] for e in _events(emulator, witness)],
        "the witness to get its chips",
    )
    assert client.get_queued_resource(name=second_name).state.state == (
        QrState.WAITING_FOR_RESOURCES
    )
    assert emulator.admin.capacity()["v2"]["used"] == 4
    delete(client, witness)
    delete(client, first_name)
    wait_state(client, second_name, QrState.ACTIVE)
    # The second QR got the chips the first one released.
    chips = [
        (e["kind"], e["qr"])
        for e in emulator.admin.events()
        if e["kind"] in ("capacity.release", "capacity.allocate")
    ]
    assert chips.index(("capacity.release", first_name)) < chips.index(
        ("capacity.allocate", second_name)
    )
    emulator.admin.capacity({"v2": 8})  # raising capacity admits waiting QRs too
    third_name = (
        create(client, parent, unique("c"), qr_request(parent, accelerator_type="v2-8"))
        .result(timeout=30)
        .name
    )
    wait_state(client, third_name, QrState.ACTIVE)
    delete(client, second_name)
    delete(client, third_name)


def test_shrinking_capacity_reclaims_spot(
    client: Any, parent: str, emulator: EmulatorProcess, v2_pool: None
) -> None:
    emulator.admin.capacity({"v2": 4})
    request = qr_request(parent, accelerator_type="v2-8", tier="spot")
    name = create(client, parent, unique("rc"), request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    emulator.admin.capacity({"v2": 0})
    wait_state(client, name, QrState.SUSPENDED)
    delete(client, name, force=False)


def _signal_script(record_dir: Path, tag: str) -> str:
    """Two background processes, each writing what happens to it in its own file. The TPU
    program holds the VM's accelerator device open, saves for 0.5 s on SIGTERM and exits 0;
    the stubborn one holds no device, notes whether its SIGTERM came before or after the
    program's save, and carries on. Neither ever ends unless signalled."""
    trap = record_dir / f"{tag}-trap"
    stubborn = record_dir / f"{tag}-stubborn"
    return f"""#!/bin/bash
nohup setsid bash -c 'exec 3<"$TPUCTL_VM_ROOT/dev/accel0"
trap "echo term >> {trap}; sleep 0.5; echo graceful >> {trap}; exit 0" TERM
echo started >> {trap}; while true; do sleep 0.1; done' >/dev/null 2>&1 &
nohup setsid bash -c 'trap "grep -qx graceful {trap} && echo term-after-save >> {stubborn} \
  || echo term-before-save >> {stubborn}" TERM
echo started >> {stubborn}; while true; do sleep 0.1; done' >/dev/null 2>&1 &
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("autocheckpoint", [True, False], ids=["autocheckpoint", "no-grace"])
def test_simulated_maintenance(
    client: Any,
    parent: str,
    emulator: EmulatorProcess,
    record_dir: Path,
    autocheckpoint: bool,
) -> None:
    tag = unique("mt")
    node_id = unique("mnode")
    request = qr_request(
        parent,
        node_id=node_id,
        startup_script=_signal_script(record_dir, tag),
        autocheckpoint=autocheckpoint,
    )
    name = create(client, parent, unique("qr"), request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    trap, stubborn = record_dir / f"{tag}-trap", record_dir / f"{tag}-stubborn"
    wait_until(lambda: _lines(trap) and _lines(stubborn), "worker processes to start")
    node_name = f"{parent}/nodes/{node_id}"

    operation = client.simulate_maintenance_event(request={"name": node_name, "worker_ids": ["0"]})
    assert operation.metadata.verb == "simulateMaintenanceEvent"
    during = operation.result(timeout=30)
    assert during.health == Health.UNHEALTHY_MAINTENANCE
    # Read again: still in maintenance, unless a loaded machine let it end meanwhile (then
    # the VM has rebooted, as checked below).
    health = client.get_node(name=node_name).health
    assert health in (Health.UNHEALTHY_MAINTENANCE, Health.HEALTHY), health

    wait_until(
        lambda: _lines(trap).count("started") == _lines(stubborn).count("started") == 2,
        "the reboot",
        timeout=30,
    )
    wait_until(
        lambda: client.get_node(name=node_name).health == Health.HEALTHY, "health", timeout=10
    )
    assert client.get_node(name=node_name).state == NodeState.READY
    if autocheckpoint:
        # SIGTERM to the TPU program alone; once it had saved and let go of the chips, the VM
        # shut down: SIGTERM to the rest, and the stubborn one, still alive after its shutdown
        # timeout, was killed before the reboot started it again.
        assert _lines(trap) == ["started", "term", "graceful", "started"]
        assert _lines(stubborn) == ["started", "term-after-save", "started"]
        stop = f"SIGTERM to the TPU program, grace {GRACE_REAL:.3g}s"
    else:
        # No grace: no SIGTERM either, both killed as they were.
        assert _lines(trap) == ["started", "started"]
        assert _lines(stubborn) == ["started", "started"]
        stop = "no autocheckpoint: kill"
    assert len(_running(f"{tag}-stubborn")) == 1  # the old one was killed, the new one runs
    events = _events(emulator, name)
    kinds = [e["kind"] for e in events]
    stopped = kinds.index("maintenance.stop")
    assert events[stopped]["detail"] == stop
    assert kinds.index("maintenance.start") < stopped < kinds.index("maintenance.end")
    assert "node.boot" in kinds[stopped : kinds.index("maintenance.end")]  # the reboot
    delete(client, name)
    wait_until(lambda: not _running(tag), "worker processes to be gone", timeout=10)


def test_multislice_maintenance_restarts_every_slice(
    client: Any, parent: str, record_dir: Path
) -> None:
    qr_id = unique("msm")
    request = qr_request(
        parent,
        accelerator_type="v4-16",
        node_count=2,
        prefix=qr_id,
        startup_script=boot_recorder(record_dir),
    )
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    workers = [(f"{qr_id}-{s}", w) for s in range(2) for w in range(2)]
    wait_until(
        lambda: all(boots(record_dir, n, w) == [1] for n, w in workers), "first boot", timeout=30
    )
    client.simulate_maintenance_event(
        request={"name": f"{parent}/nodes/{qr_id}-1", "worker_ids": ["1"]}
    ).result(timeout=30)
    wait_until(
        lambda: all(boots(record_dir, n, w) == [1, 2] for n, w in workers),
        "every slice to reboot on its own disk",
        timeout=30,
    )
    delete(client, name)


def test_slice_failure_replaces_one_slice_and_restarts_the_others(
    client: Any, parent: str, emulator: EmulatorProcess, record_dir: Path
) -> None:
    qr_id = unique("fs")
    request = qr_request(
        parent,
        accelerator_type="v4-16",
        node_count=3,
        prefix=qr_id,
        startup_script=boot_recorder(record_dir),
    )
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    workers = [(f"{qr_id}-{s}", w) for s in range(3) for w in range(2)]
    wait_until(
        lambda: all(boots(record_dir, n, w) == [1] for n, w in workers), "first boot", timeout=30
    )
    emulator.admin.fail_slice(qr_id, 1)
    expected = {f"{qr_id}-0": [1, 2], f"{qr_id}-1": [1, 1], f"{qr_id}-2": [1, 2]}
    wait_until(
        lambda: all(boots(record_dir, n, w) == expected[n] for n, w in workers),
        "slice 1 on a fresh disk, the others restarted",
        timeout=30,
    )
    wait_until(
        lambda: all(
            n.state == NodeState.READY and n.health == Health.HEALTHY
            for n in client.list_nodes(parent=parent)
        ),
        "nodes READY again",
    )
    kinds = [e["kind"] for e in _events(emulator, name)]
    assert {"slice.fail", "slice.replaced", "slice.repaired"} <= set(kinds)
    with pytest.raises(UsageError, match="out of range"):
        emulator.admin.fail_slice(qr_id, 5)
    delete(client, name)


def test_scheduled_maintenance(
    client: Any, parent: str, emulator: EmulatorProcess, record_dir: Path
) -> None:
    node_id = unique("sched")
    request = qr_request(parent, node_id=node_id, startup_script=boot_recorder(record_dir))
    name = create(client, parent, unique("qr"), request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    wait_until(lambda: boots(record_dir, node_id) == [1], "first boot")
    result = emulator.admin.maintenance(node_id, worker=0, at="+20s")  # 1 s real
    upcoming = client.get_node(name=f"{parent}/nodes/{node_id}").upcoming_maintenance
    assert upcoming.type_ == cloud_tpu.UpcomingMaintenance.MaintenanceType.SCHEDULED
    assert upcoming.maintenance_status == cloud_tpu.UpcomingMaintenance.MaintenanceStatus.PENDING
    assert upcoming.window_start_time == result["at"]
    wait_until(lambda: boots(record_dir, node_id) == [1, 2], "the scheduled reboot", timeout=30)
    delete(client, name)


def test_api_faults(client: Any, parent: str, emulator: EmulatorProcess) -> None:
    name = f"{parent}/queuedResources/none"
    emulator.admin.api_fault("UNAVAILABLE", 2)
    for _ in range(2):
        with pytest.raises(exceptions.ServiceUnavailable):
            client.get_queued_resource(name=name)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)

    emulator.admin.api_fault(create_exhausted=1)
    later = {"valid_after_duration": datetime.timedelta(hours=10)}
    request = qr_request(parent, queueing_policy=later)
    with pytest.raises(exceptions.ResourceExhausted):
        create(client, parent, unique("ex"), request)
    qr = create(client, parent, unique("ex"), request).result(timeout=30)
    assert emulator.admin.status()["api_faults"]["create_exhausted"] == 0
    delete(client, qr.name, force=False)


def _banner(ip: str, port: int, timeout: float = 1.0) -> bytes:
    with socket.create_connection((ip, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        return sock.recv(64)


def test_ssh_faults(client: Any, parent: str, emulator: EmulatorProcess) -> None:
    node_id = unique("ssh")
    name = (
        create(client, parent, unique("qr"), qr_request(parent, node_id=node_id))
        .result(timeout=30)
        .name
    )
    wait_state(client, name, QrState.ACTIVE)
    ip = client.get_node(name=f"{parent}/nodes/{node_id}").network_endpoints[0].ip_address
    assert _banner(ip, emulator.ssh_port).startswith(b"SSH-2.0")
    emulator.admin.ssh_fault(node_id, 0, "refuse")
    with pytest.raises(ConnectionRefusedError):
        _banner(ip, emulator.ssh_port)
    emulator.admin.ssh_fault(node_id, 0, "hang")
    with pytest.raises(TimeoutError):
        _banner(ip, emulator.ssh_port, timeout=0.5)
    emulator.admin.ssh_fault(node_id, 0, None)
    assert _banner(ip, emulator.ssh_port).startswith(b"SSH-2.0")
    delete(client, name)


def test_hostkey_faults_unpublish_rotate_and_publish_again(
    client: Any, parent: str, emulator: EmulatorProcess
) -> None:
    import asyncio

    import asyncssh

    node_id = unique("hk")
    request = qr_request(parent, node_id=node_id, accelerator_type="v4-16")
    name = create(client, parent, unique("qr"), request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    node_name = f"{parent}/nodes/{node_id}"
    ips = [e.ip_address for e in client.get_node(name=node_name).network_endpoints]

    def published() -> list[list[str]]:
        response = client.get_guest_attributes(
            request={"name": node_name, "query_path": "hostkeys/"}
        )
        return [[item.value for item in g.query_value.items] for g in response.guest_attributes]

    def served(worker: int) -> str:
        key = asyncio.run(asyncssh.get_server_host_key(ips[worker], emulator.ssh_port))
        assert key is not None
        return str(key.export_public_key("openssh").decode().split()[1])

    (first,), (second,) = published()
    try:
        reply = emulator.admin.hostkey_fault(node_id, 1, "missing")
        assert (reply["mode"], reply["published"]) == ("missing", False)
        assert published() == [[first], []]  # worker 1 publishes nothing, worker 0 as before
        assert served(1) == second  # its SSH server is unchanged
        reply = emulator.admin.hostkey_fault(node_id, 1, "rotate")  # a rebuilt VM, unpublished
        assert reply["published"] is False and published() == [[first], []]
        rotated = served(1)
        assert rotated != second
        emulator.admin.hostkey_fault(node_id, 1, "none")
        assert published() == [[first], [rotated]]
        emulator.admin.hostkey_fault(node_id, 0, "rotate")  # published at once
        ((zero,), (one,)) = published()
        assert zero != first and zero == served(0) and one == rotated
        kinds = [e["detail"] for e in emulator.admin.events() if e["kind"] == "hostkey.fault"]
        assert "rotate (published: no)" in kinds and "rotate (published: yes)" in kinds
        with pytest.raises(UsageError, match="missing, rotate or none"):
            emulator.admin.hostkey_fault(node_id, 0, "lost")
        with pytest.raises(UsageError):
            emulator.admin.hostkey_fault(node_id, 2, "missing")  # v4-16 has workers 0 and 1
    finally:
        emulator.admin.hostkey_fault(node_id, 1, "none")
        delete(client, name)


def test_event_log_file_and_admin_agree(
    client: Any, parent: str, emulator: EmulatorProcess
) -> None:
    start = emulator.admin.status()
    assert start["host"] == emulator.host
    name = create(client, parent, unique("ev"), qr_request(parent)).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    delete(client, name)
    events = _events(emulator, name)
    states = [e["detail"] for e in events if e["kind"] == "qr.state"]
    assert states == [
        "CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "DELETING",
    ]  # fmt: skip
    lines = (emulator.state_dir / "events.jsonl").read_text().splitlines()
    from_file = [json.loads(line) for line in lines]
    by_seq = {e["seq"]: e for e in from_file}
    for event in events:
        assert by_seq[event["seq"]] == event
        moment = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
        assert moment.tzinfo is not None
        assert set(event) == {"seq", "timestamp", "kind", "qr", "node", "worker", "detail"}
    last = from_file[-1]["seq"]
    assert emulator.admin.events(last + 1, wait=0.1) == []


def _tpu_env_script(record_dir: Path) -> str:
    return f"""#!/bin/bash
md() {{ curl -s -H 'Metadata-Flavor: Google' \\
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/$1"; }}
node=$(md tpu-env | sed -n "s/^NODE_ID: '\\(.*\\)'$/\\1/p")
md tpu-env > "{record_dir}/$node-$(md agent-worker-number).env"
"""


def _tpu_env(path: Path) -> dict[str, str]:
    pairs = (line.split(": ", 1) for line in path.read_text().splitlines() if ": " in line)
    return {key: value.strip("'") for key, value in pairs}


@pytest.fixture(scope="module")
def multislice_env(client: Any, record_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    parent = parent_of(new_project())
    qr_id = unique("env")
    request = qr_request(
        parent, node_count=3, prefix=qr_id, startup_script=_tpu_env_script(record_dir)
    )
    name = create(client, parent, qr_id, request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    paths = [record_dir / f"{qr_id}-{s}-0.env" for s in range(3)]
    wait_until(lambda: all(p.exists() and p.stat().st_size for p in paths), "tpu-env dumps")
    nodes = {n.name.rsplit("/", 1)[1]: n for n in client.list_nodes(parent=parent)}
    coordinator = f"{nodes[f'{qr_id}-0'].network_endpoints[0].ip_address}:8080"
    yield coordinator, {f"{qr_id}-{s}": _tpu_env(p) for s, p in enumerate(paths)}
    delete(client, name)


def test_multislice_tpu_env_names_slice_0_worker_0_as_coordinator(
    multislice_env: tuple[str, dict[str, Any]],
) -> None:
    coordinator, envs = multislice_env
    for slice_index, (node_id, env) in enumerate(envs.items()):
        assert env["NODE_ID"] == node_id
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator
        assert env["MEGASCALE_NUM_SLICES"] == "3"
        assert env["MEGASCALE_SLICE_ID"] == str(slice_index)


def test_multislice_slice_0_knows_it_is_the_coordinator(
    multislice_env: tuple[str, dict[str, Any]],
) -> None:
    coordinator, envs = multislice_env
    first = next(iter(envs.values()))
    assert first.get("MEGASCALE_COORDINATOR_ADDRESS") == coordinator
    assert first.get("MEGASCALE_SLICE_ID") == "0"
