"""The worker plane against real SSH clients, real processes and real signals."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncssh
import paramiko
import pytest

from tests.emulator.workers_helpers import (
    ClientKey,
    alive,
    connect,
    identity,
    metadata_get,
    new_key,
    read_pids,
    run,
    wait_for,
)
from tests.support import wait_for_bytes
from tpuctl.emulator.vms import vm
from tpuctl.emulator.vms.workers import NodeIdentity, WorkerInfo, WorkerPlane
from tpuctl.errors import NotFoundError

# It starts emulators of its own (servers, worker VMs): an emulator test.
pytestmark = pytest.mark.emulator

USER = "alice"
_ids = itertools.count()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPlane]:
    plane = WorkerPlane(tmp_path_factory.mktemp("workers"))
    plane.start()
    yield plane
    plane.close()
    assert vm.scan_processes(plane.instance_id) == {}


@pytest.fixture(scope="module")
def key() -> ClientKey:
    return new_key("alice@laptop")


NodeFactory = Callable[..., list[WorkerInfo]]


@pytest.fixture
def make_node(plane: WorkerPlane, key: ClientKey) -> Iterator[NodeFactory]:
    created: list[str] = []

    def make(
        *,
        metadata: dict[str, str] | None = None,
        coordinator: str | None = None,
        **kwargs: object,
    ) -> list[WorkerInfo]:
        node_id = f"node-{next(_ids)}"
        meta = {"ssh-keys": key.metadata_line(USER)} if metadata is None else metadata
        infos = plane.create_node(identity(node_id, **kwargs), meta, coordinator=coordinator)  # type: ignore[arg-type]
        created.append(node_id)
        make.node_id = node_id  # type: ignore[attr-defined]
        return infos

    yield make
    for node_id in created:
        with contextlib.suppress(NotFoundError):
            plane.delete_node(node_id)


def node_of(make_node: NodeFactory) -> str:
    return str(make_node.node_id)  # type: ignore[attr-defined]


# -- authentication and host keys --------------------------------------------------------------


def test_published_key_logs_in_and_unpublished_key_is_refused(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    result = run(plane, infos[1], USER, key, "whoami >/dev/null; echo ok")
    assert result.exit_status == 0 and result.stdout == b"ok\n"

    stranger = new_key("stranger")
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[1], USER, stranger, "true")
    # The right key under another login name is not published either.
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[1], "bob", key, "true")


def test_keys_added_with_set_metadata_work_at_once(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    node_id = node_of(make_node)
    late = new_key("carol@ci", algorithm="ecdsa-sha2-nistp256")
    rsa = new_key("dave@ci", algorithm="ssh-rsa")
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[0], "carol", late, "true")
    lines = [key.metadata_line(USER), late.metadata_line("carol"), rsa.metadata_line("dave")]
    plane.set_metadata(node_id, {"ssh-keys": "\n".join(lines)})
    assert run(plane, infos[0], "carol", late, "echo $USER").stdout == b"carol\n"
    assert run(plane, infos[0], "dave", rsa, "echo $USER").stdout == b"dave\n"
    # Removing a key revokes it for new connections.
    plane.set_metadata(node_id, {"ssh-keys": key.metadata_line(USER)})
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[0], "carol", late, "true")


def test_host_key_seen_over_ssh_is_the_published_one(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    assert infos[0].host_key != infos[1].host_key
    for info in infos:
        assert info.host_key.startswith("ssh-ed25519 AAAA") and len(info.host_key.split()) == 2
        with socket.create_connection((info.ip, plane.ssh_port), timeout=5) as sock:
            transport = paramiko.Transport(sock)
            try:
                transport.start_client(timeout=5)
                server_key = transport.get_remote_server_key()
            finally:
                transport.close()
        assert f"{server_key.get_name()} {server_key.get_base64()}" == info.host_key


def test_paramiko_client_runs_a_command(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey, tmp_path: Path
) -> None:
    infos = make_node()
    key_file = tmp_path / "id_ed25519"
    key.private.write_private_key(key_file)
    client = paramiko.SSHClient()
    host_type, host_b64 = infos[0].host_key.split()
    client.get_host_keys().add(
        f"[{infos[0].ip}]:{plane.ssh_port}",
        host_type,
        paramiko.Ed25519Key(data=base64.b64decode(host_b64)),
    )
    client.connect(
        infos[0].ip,
        port=plane.ssh_port,
        username=USER,
        key_filename=str(key_file),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
    )
    try:
        _, stdout, stderr = client.exec_command("echo out; echo err >&2; exit 4")
        assert stdout.read() == b"out\n"
        assert stderr.read() == b"err\n"
        assert stdout.channel.recv_exit_status() == 4
    finally:
        client.close()


# -- sessions --------------------------------------------------------------------------------


def test_exit_status_output_streams_and_stdin_round_trip(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    payload = bytes(range(256)) * 4096  # 1 MiB of every byte value, through flow control
    result = run(
        plane, infos[0], USER, key, "cat; printf 'to-stderr\\0' >&2; exit 7", stdin=payload
    )
    assert result.exit_status == 7
    assert result.stdout == payload
    assert result.stderr == b"to-stderr\0"


def test_killed_process_reports_exit_signal(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    result = run(plane, infos[0], USER, key, "kill -KILL $$")
    assert result.exit_signal is not None and result.exit_signal[0] == "KILL"


def test_signal_over_ssh_reaches_the_process_group(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()

    async def go() -> asyncssh.SSHCompletedProcess:
        async with await connect(plane, infos[0], USER, key) as conn:
            process = await conn.create_process(
                "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.05; done"
            )
            assert await asyncio.wait_for(process.stdout.readline(), 10) == "ready\n"
            process.send_signal("TERM")
            return await asyncio.wait_for(process.wait(), 10)

    result = asyncio.run(go())
    assert result.exit_status == 42
    assert "got-term" in str(result.stdout)


def test_session_runs_in_the_worker_home_with_the_vm_environment(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    node_id = node_of(make_node)
    command = (
        'pwd; echo "$HOME|$USER|$LOGNAME|$TPUCTL_VM_ROOT|$GCE_METADATA_HOST|'
        '$TPUCTL_EMULATED_WORKER"; ls "$TPUCTL_VM_ROOT/dev"'
    )
    lines = run(plane, infos[1], USER, key, command).stdout.decode().splitlines()
    root = plane.vm_root(node_id, 1)
    home = root / "home" / USER
    assert lines[0] == str(home)
    assert lines[1] == (
        f"{home}|{USER}|{USER}|{root}|{infos[1].ip}:{plane.metadata_port}|{node_id}/1"
    )
    assert lines[2:] == ["accel0", "accel1", "accel2", "accel3"]  # v4: 4 chips per VM


def test_interactive_login_shell_gets_a_pty(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()

    async def go() -> str:
        async with await connect(plane, infos[0], USER, key) as conn:
            process = await conn.create_process(term_type="xterm", term_size=(100, 30))
            process.stdin.write("tty; stty size; echo sum=$((6*7)); exit 3\n")
            output = await asyncio.wait_for(process.stdout.read(), 10)
            await process.wait()
            assert process.exit_status == 3
            return str(output)

    output = asyncio.run(go())
    assert "/dev/pts/" in output
    assert "30 100" in output
    assert "sum=42" in output


def test_sftp_paths_are_relative_to_the_worker_home(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey, tmp_path: Path
) -> None:
    infos = make_node()
    node_id = node_of(make_node)
    local = tmp_path / "train.py"
    local.write_bytes(b"print('hello')\n" * 1000)

    async def go() -> str:
        async with (
            await connect(plane, infos[0], USER, key) as conn,
            conn.start_sftp_client() as sftp,
        ):
            await sftp.put(str(local), "train.py")
            await sftp.mkdir("runs")
            return str(await sftp.realpath("."))

    cwd = asyncio.run(go())
    home = plane.vm_root(node_id, 0) / "home" / USER
    assert cwd == str(home)
    assert (home / "train.py").read_bytes() == local.read_bytes()
    assert (home / "runs").is_dir()


def test_sftp_without_openssh_sftp_server_uses_asyncssh(
    plane: WorkerPlane,
    make_node: NodeFactory,
    key: ClientKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tpuctl.emulator.vms import sshd

    monkeypatch.setattr(sshd, "SFTP_SERVER", str(tmp_path / "no-sftp-server"))
    infos = make_node(workers=1)
    home = plane.vm_root(node_of(make_node), 0) / "home" / USER

    async def go() -> str:
        async with (
            await connect(plane, infos[0], USER, key) as conn,
            conn.start_sftp_client() as sftp,
        ):
            async with sftp.open("notes.txt", "w") as handle:
                await handle.write("kept")
            return str(await sftp.realpath("."))

    assert asyncio.run(go()) == str(home)
    assert (home / "notes.txt").read_text() == "kept"


@pytest.mark.skipif(not shutil.which("ssh"), reason="the OpenSSH client is not installed")
def test_openssh_client_ssh_and_scp_work(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey, tmp_path: Path
) -> None:
    infos = make_node(workers=1)
    home = plane.vm_root(node_of(make_node), 0) / "home" / USER
    key_file = tmp_path / "id_ed25519"
    key.private.write_private_key(key_file)
    key_file.chmod(0o600)
    known = tmp_path / "known_hosts"
    known.write_text(f"[{infos[0].ip}]:{plane.ssh_port} {infos[0].host_key}\n")
    options = ["-i", str(key_file), "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes"]
    options += ["-o", "StrictHostKeyChecking=yes"]
    target = f"{USER}@{infos[0].ip}"
    ssh = subprocess.run(
        ["ssh", *options, "-p", str(plane.ssh_port), target, "echo $PWD; exit 6"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (ssh.returncode, ssh.stdout) == (6, f"{home}\n"), ssh.stderr
    scp = subprocess.run(
        ["scp", *options, "-P", str(plane.ssh_port), str(known), f"{target}:copied"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert scp.returncode == 0, scp.stderr
    assert (home / "copied").read_text() == known.read_text()


# -- metadata --------------------------------------------------------------------------------


def test_metadata_serves_each_workers_identity(plane: WorkerPlane, make_node: NodeFactory) -> None:
    infos = make_node(
        workers=4,
        accelerator_type="v4-32",
        topology="2x2x4",
        slice_index=1,
        num_slices=2,
        coordinator="127.1.2.3:8080",
        metadata={"ssh-keys": "", "custom-key": "custom value"},
    )
    node_id = node_of(make_node)
    port = plane.metadata_port
    attributes = "/computeMetadata/v1/instance/attributes/"
    for info in infos:
        assert metadata_get(info.ip, port, attributes + "agent-worker-number") == (
            200,
            str(info.worker),
        )
        status, endpoints = metadata_get(info.ip, port, attributes + "worker-network-endpoints")
        assert status == 200
        assert [entry.split(":")[2] for entry in endpoints.split(",")] == [i.ip for i in infos]
        status, env = metadata_get(info.ip, port, attributes + "tpu-env")
        values = dict(line.split(": ", 1) for line in env.splitlines())
        assert values["WORKER_ID"] == f"'{info.worker}'"
        assert values["NODE_ID"] == f"'{node_id}'"
        assert values["ACCELERATOR_TYPE"] == "'v4-32'"
        assert values["TOPOLOGY"] == "'2x2x4'"
        assert values["ZONE"] == "'us-central2-b'"
        assert values["CONSUMER_PROJECT_ID"] == "'proj-1'"
        assert values["MEGASCALE_COORDINATOR_ADDRESS"] == "'127.1.2.3:8080'"
        assert values["MEGASCALE_NUM_SLICES"] == "'2'"
        assert values["MEGASCALE_SLICE_ID"] == "'1'"
    ip = infos[2].ip
    assert metadata_get(ip, port, attributes + "accelerator-type") == (200, "v4-32")
    assert metadata_get(ip, port, attributes + "enable-oslogin") == (200, "FALSE")
    assert metadata_get(ip, port, attributes + "custom-key") == (200, "custom value")
    status, listing = metadata_get(ip, port, attributes)
    assert {"agent-worker-number", "tpu-env", "ssh-keys", "custom-key"} <= set(listing.split())
    assert metadata_get(ip, port, "/computeMetadata/v1/project/project-id") == (200, "proj-1")
    status, zone = metadata_get(ip, port, "/computeMetadata/v1/instance/zone")
    assert status == 200 and zone.endswith("/zones/us-central2-b")
    status, hostname = metadata_get(ip, port, "/computeMetadata/v1/instance/hostname")
    assert status == 200 and hostname.startswith("t1v-n-") and "-w-2." in hostname
    assert metadata_get(ip, port, attributes + "no-such-key")[0] == 404
    # Like GCE: without the header, 403.
    assert metadata_get(ip, port, attributes + "tpu-env", flavor=False)[0] == 403
    # Metadata updates show at once.
    plane.set_metadata(node_id, {"custom-key": "v2"})
    assert metadata_get(ip, port, attributes + "custom-key") == (200, "v2")


def test_single_slice_tpu_env_has_no_megascale(plane: WorkerPlane, make_node: NodeFactory) -> None:
    infos = make_node(workers=1, accelerator_type="v4-8", topology="2x2x1")
    status, env = metadata_get(
        infos[0].ip, plane.metadata_port, "/computeMetadata/v1/instance/attributes/tpu-env"
    )
    assert status == 200 and "WORKER_ID: '0'" in env and "MEGASCALE" not in env


def test_worker_process_reaches_its_metadata_server(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    command = (
        "curl -sf -H Metadata-Flavor:Google "
        '"http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/agent-worker-number"'
    )
    assert run(plane, infos[1], USER, key, command).stdout == b"1"


# -- boot and startup scripts -----------------------------------------------------------------

STARTUP = """\
echo "boot $(cat "$TPUCTL_VM_ROOT/var/lib/google/boot-count") as $USER in $PWD"
curl -sf -H Metadata-Flavor:Google \
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/agent-worker-number"
echo
setsid nohup sleep 300 >/dev/null 2>&1 &
exit 3
"""


def _wait_exit(root: Path, boot: int) -> str:
    path = root / f"var/log/startup-script/boot-{boot}.exit"
    return wait_for_bytes(path, 10, f"{path}").decode().strip()


def test_startup_script_runs_at_every_boot(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(metadata={"ssh-keys": key.metadata_line(USER), "startup-script": STARTUP})
    node_id = node_of(make_node)
    plane.boot(node_id)
    for info in infos:
        root = plane.vm_root(node_id, info.worker)
        assert _wait_exit(root, 1) == "3"
        log = (root / "var/log/startup-script/boot-1.log").read_text()
        assert log.splitlines() == [f"boot 1 as root in {root / 'root'}", str(info.worker)]
        # The backgrounded daemon outlives the script and is still the worker's.
        worker = info.worker
        wait_for(lambda worker=worker: len(plane.worker_processes(node_id, worker)) >= 1)  # type: ignore[misc]
    plane.stop_node(node_id, grace=None)
    assert plane.worker_processes(node_id, 0) == []
    plane.boot(node_id)
    root = plane.vm_root(node_id, 0)
    assert _wait_exit(root, 2) == "3"
    assert (root / "var/lib/google/boot-count").read_text().strip() == "2"
    assert (root / "var/log/startup-script/boot-2.log").read_text().startswith("boot 2 ")


def test_boot_without_startup_script_only_counts(
    plane: WorkerPlane, make_node: NodeFactory
) -> None:
    make_node(workers=1)
    node_id = node_of(make_node)
    plane.boot(node_id)
    plane.boot(node_id)
    root = plane.vm_root(node_id, 0)
    assert (root / "var/lib/google/boot-count").read_text().strip() == "2"
    assert list((root / "var/log/startup-script").iterdir()) == []
    assert plane.worker_processes(node_id, 0) == []


# -- stopping, faults, disks -----------------------------------------------------------------

TRAPPER = (
    'setsid nohup bash -c \'trap "sleep 0.3; echo done > cleaned; exit 0" TERM; '
    "touch trapper-ready; while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!"
)
# Notes the SIGTERM and carries on; notes when it has outlived the trapper's cleanup.
IGNORER = (
    'nohup bash -c \'trap "touch ignorer-got-term; termed=1" TERM; touch ignorer-ready; '
    'while :; do if [ -n "$termed" ] && [ -e cleaned ]; then touch ignorer-outlived; termed=; '
    "fi; sleep 0.05; done' >/dev/null 2>&1 & echo $!"
)


def test_stop_node_shutdown_lets_cleanup_finish_then_kills(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1)
    node_id = node_of(make_node)
    home = plane.vm_root(node_id, 0) / "home" / USER
    (trapper,) = read_pids(run(plane, infos[0], USER, key, TRAPPER).stdout.decode())
    (ignorer,) = read_pids(run(plane, infos[0], USER, key, IGNORER).stdout.decode())
    # Signal only once both have installed their traps.
    wait_for(lambda: (home / "trapper-ready").exists() and (home / "ignorer-ready").exists())
    assert {trapper, ignorer} <= set(plane.worker_processes(node_id, 0))
    # Nothing holds the chips: the VM shuts down at once, SIGTERM to everything.
    plane.stop_node(node_id, grace=30, shutdown=1.5)
    assert (home / "cleaned").read_text() == "done\n"  # the TERM trap finished its cleanup
    # The ignorer got SIGTERM too, was still alive once the cleanup had finished (the shutdown
    # was not cut short), and was killed: it never ends on its own.
    assert (home / "ignorer-got-term").exists() and (home / "ignorer-outlived").exists()
    assert not alive(trapper) and not alive(ignorer)
    assert plane.worker_processes(node_id, 0) == []


# Holds the VM's first chip like a TPU program; saves for 0.3 s on SIGTERM, then exits.
HOLDER = (
    'setsid nohup bash -c \'exec 3<"$TPUCTL_VM_ROOT/dev/accel0"; '
    'trap "echo term >> order; sleep 0.3; echo saved >> order; exit 0" TERM; '
    "touch holder-ready; while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!"
)
# Holds no device; records when its SIGTERM came.
BYSTANDER = (
    'setsid nohup bash -c \'trap "echo bystander-term >> order; exit 0" TERM; '
    "touch bystander-ready; while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!"
)


def test_stop_node_with_grace_signals_the_tpu_program_first(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    """The autocheckpoint SIGTERM goes to what holds the chips; the rest of the VM hears of
    the shutdown only once the program has saved and let go of them."""
    infos = make_node(workers=1)
    node_id = node_of(make_node)
    home = plane.vm_root(node_id, 0) / "home" / USER
    pids = read_pids(run(plane, infos[0], USER, key, HOLDER + "; " + BYSTANDER).stdout.decode())
    wait_for(lambda: (home / "holder-ready").exists() and (home / "bystander-ready").exists())
    plane.stop_node(node_id, grace=30, shutdown=5)
    assert (home / "order").read_text().split() == ["term", "saved", "bystander-term"]
    assert not any(alive(pid) for pid in pids)
    assert plane.worker_processes(node_id, 0) == []


def test_stop_node_grace_ends_for_a_program_that_keeps_the_chips(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1)
    node_id = node_of(make_node)
    home = plane.vm_root(node_id, 0) / "home" / USER
    keeper = (
        'setsid nohup bash -c \'exec 3<"$TPUCTL_VM_ROOT/dev/accel0"; '
        'trap "echo term >> order" TERM; touch keeper-ready; '
        "while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!"
    )
    (pid,) = read_pids(run(plane, infos[0], USER, key, keeper).stdout.decode())
    wait_for((home / "keeper-ready").exists)
    plane.stop_node(node_id, grace=0.5, shutdown=0.5)
    # Once at the grace, once more at the shutdown, then killed.
    assert (home / "order").read_text().split() == ["term", "term"]
    assert not alive(pid)


TERM_NOTER = (
    'setsid nohup bash -c \'trap "echo term > got-term" TERM; touch noter-ready; '
    "while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!"
)


def test_stop_node_without_grace_kills_detached_processes(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    node_id = node_of(make_node)
    home = plane.vm_root(node_id, 1) / "home" / USER
    command = (
        "setsid nohup sleep 300 >/dev/null 2>&1 & echo $!; "
        "( (sleep 301 >/dev/null 2>&1 & echo $!) & ); "  # double fork: orphaned at once
        "nohup sleep 302 >/dev/null 2>&1 & echo $!; " + TERM_NOTER
    )
    pids = read_pids(run(plane, infos[1], USER, key, command).stdout.decode())
    assert len(pids) == 4
    wait_for(lambda: set(pids) <= set(plane.worker_processes(node_id, 1)), 5, "markers")
    wait_for((home / "noter-ready").exists, 5, "the noter's trap")
    assert plane.worker_processes(node_id, 0) == []  # markers are per worker
    plane.stop_node(node_id, grace=None)
    wait_for(lambda: not any(alive(pid) for pid in pids), 5, "killed processes to vanish")
    # No grace: SIGKILL at once, not a SIGTERM first (the noter records one in a builtin).
    assert not (home / "got-term").exists()
    assert plane.worker_processes(node_id, 1) == []
    # The workers themselves are still up: SSH works after a stop.
    assert run(plane, infos[1], USER, key, "echo back").stdout == b"back\n"


def test_stop_node_drops_running_sessions(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1)
    node_id = node_of(make_node)

    async def go() -> None:
        async with await connect(plane, infos[0], USER, key) as conn:
            process = await conn.create_process("echo ready; sleep 300")
            assert await asyncio.wait_for(process.stdout.readline(), 10) == "ready\n"
            await asyncio.get_running_loop().run_in_executor(None, plane.stop_node, node_id, 5.0)
            await asyncio.wait_for(process.wait_closed(), 5)

    asyncio.run(go())
    assert plane.worker_processes(node_id, 0) == []


def test_hang_fault_accepts_tcp_but_never_answers(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node()
    node_id = node_of(make_node)

    async def go() -> None:
        existing = await connect(plane, infos[0], USER, key)
        await asyncio.get_running_loop().run_in_executor(
            None, plane.set_ssh_fault, node_id, 0, "hang"
        )
        # New connections: TCP succeeds, no banner ever comes.
        reader, writer = await asyncio.open_connection(infos[0].ip, plane.ssh_port)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.5)
        writer.close()
        with pytest.raises((asyncio.TimeoutError, asyncssh.Error, OSError)):
            await connect(plane, infos[0], USER, key, login_timeout=0.5, connect_timeout=0.5)
        # An existing connection stops answering too.
        pending = asyncio.ensure_future(existing.run("echo still-here", timeout=30))
        done, _ = await asyncio.wait({pending}, timeout=0.7)
        assert not done
        # Other workers are unaffected.
        other = await connect(plane, infos[1], USER, key)
        assert (await other.run("echo fine")).stdout == "fine\n"
        other.close()
        await asyncio.get_running_loop().run_in_executor(
            None, plane.set_ssh_fault, node_id, 0, None
        )
        assert (await asyncio.wait_for(pending, 10)).stdout == "still-here\n"
        existing.close()
        again = await connect(plane, infos[0], USER, key)
        assert (await again.run("echo ok")).stdout == "ok\n"
        again.close()

    asyncio.run(go())


def test_refuse_fault_closes_the_listener(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1)
    node_id = node_of(make_node)
    plane.set_ssh_fault(node_id, 0, "refuse")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((infos[0].ip, plane.ssh_port), timeout=5).close()
    # Metadata is a different service; it still answers.
    assert (
        metadata_get(infos[0].ip, plane.metadata_port, "/computeMetadata/v1/instance/name")[0]
        == 200
    )
    plane.set_ssh_fault(node_id, 0, None)
    assert run(plane, infos[0], USER, key, "echo ok").stdout == b"ok\n"
    with pytest.raises(ValueError):
        plane.set_ssh_fault(node_id, 0, "flaky")


def test_replace_disk_gives_a_fresh_empty_vm_root(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1, metadata={"ssh-keys": key.metadata_line(USER)})
    node_id = node_of(make_node)
    plane.boot(node_id)
    run(plane, infos[0], USER, key, "echo ckpt > step-100; nohup sleep 300 >/dev/null 2>&1 &")
    assert plane.worker_processes(node_id, 0)
    plane.replace_disk(node_id)
    root = plane.vm_root(node_id, 0)
    assert plane.worker_processes(node_id, 0) == []
    assert list((root / "home").iterdir()) == []
    assert not (root / "var/lib/google/boot-count").exists()
    assert sorted(p.name for p in (root / "dev").iterdir()) == [f"accel{i}" for i in range(4)]
    # Same address and host key: the client's pinned key still verifies.
    assert run(plane, infos[0], USER, key, "ls -A | wc -l").stdout == b"0\n"


def test_delete_node_kills_closes_and_removes(
    plane: WorkerPlane, make_node: NodeFactory, key: ClientKey
) -> None:
    infos = make_node(workers=1)
    node_id = node_of(make_node)
    (pid,) = read_pids(
        run(
            plane, infos[0], USER, key, "setsid sleep 300 >/dev/null 2>&1 & echo $!"
        ).stdout.decode()
    )
    root = plane.vm_root(node_id, 0)
    plane.delete_node(node_id)
    wait_for(lambda: not alive(pid), 5, "the process to die")
    assert not root.exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((infos[0].ip, plane.ssh_port), timeout=5).close()
    with pytest.raises(NotFoundError):
        plane.worker_processes(node_id, 0)
    with pytest.raises(NotFoundError):
        plane.boot(node_id)


def test_node_ids_are_unique_and_addresses_are_never_localhost(
    plane: WorkerPlane, make_node: NodeFactory
) -> None:
    infos = make_node(workers=3)
    node_id = node_of(make_node)
    with pytest.raises(ValueError):
        plane.create_node(identity(node_id), {}, coordinator=None)
    ips = [info.ip for info in infos]
    assert len(set(ips)) == 3
    assert all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)


def test_nodes_are_created_and_stopped_from_many_threads(
    plane: WorkerPlane, key: ClientKey
) -> None:
    """The control plane calls from a thread pool: concurrent calls must not interfere."""
    names = [f"threaded-{next(_ids)}" for _ in range(8)]
    meta = {"ssh-keys": key.metadata_line(USER)}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        created = list(
            pool.map(lambda name: plane.create_node(identity(name), meta, coordinator=None), names)
        )
        ips = [info.ip for infos in created for info in infos]
        assert len(set(ips)) == 16
        list(pool.map(plane.boot, names))
        list(pool.map(lambda name: plane.stop_node(name, 0.2), names))
        assert run(plane, created[-1][1], USER, key, "echo ok").stdout == b"ok\n"
        list(pool.map(plane.delete_node, names))


def test_close_leaves_no_process_behind(tmp_path: Path, key: ClientKey) -> None:
    plane = WorkerPlane(tmp_path)
    plane.start()
    try:
        meta = {"ssh-keys": key.metadata_line(USER), "startup-script": "sleep 300 & sleep 301"}
        infos = plane.create_node(identity("closing", workers=2), meta, coordinator=None)
        plane.boot("closing")
        run(plane, infos[0], USER, key, "setsid nohup sleep 302 >/dev/null 2>&1 &")
        wait_for(lambda: len(vm.scan_processes(plane.instance_id)) >= 5, 10, "processes")
        pids = list(vm.scan_processes(plane.instance_id))
    finally:
        plane.close()
    assert vm.scan_processes(plane.instance_id) == {}
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(OSError):
        socket.create_connection((infos[0].ip, plane.ssh_port), timeout=2).close()
    plane.close()  # idempotent


def test_unknown_ssh_server_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        WorkerPlane(tmp_path, ssh_server="dropbear")


def test_identity_is_frozen() -> None:
    ident = identity("n")
    with pytest.raises(AttributeError):
        ident.workers = 3  # type: ignore[misc]
    assert isinstance(ident, NodeIdentity)
    assert os.environ.get(vm.WORKER_MARKER) is None  # the test process itself is no worker
