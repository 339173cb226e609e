"""The worker plane with real OpenSSH sshd servers, so clients are tested against the real thing.

sshd only logs in users that exist on this machine, so the test logs in as the current OS user.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import paramiko
import pytest

from tests.emulator.workers_helpers import (
    ClientKey,
    alive,
    connect,
    identity,
    new_key,
    os_user,
    read_pids,
    run,
    wait_for,
)
from tpuctl.emulator.vms import vm
from tpuctl.emulator.vms.workers import WorkerInfo, WorkerPlane
from tpuctl.fanout import remote

SSHD = Path("/usr/sbin/sshd")
pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not SSHD.exists(), reason="OpenSSH sshd is not installed"),
]
NODE = "ossh"


def _sshd_pids(state_dir: Path) -> list[int]:
    """sshd processes started with a config under `state_dir`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sshd" in cmdline and str(state_dir).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def key() -> ClientKey:
    return new_key("me@laptop")


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, key: ClientKey
) -> Iterator[tuple[WorkerPlane, list[WorkerInfo]]]:
    state_dir = tmp_path_factory.mktemp("openssh")
    plane = WorkerPlane(state_dir, ssh_server="openssh")
    plane.start()
    try:
        infos = plane.create_node(
            identity(NODE, workers=2), {"ssh-keys": key.metadata_line(os_user())}, coordinator=None
        )
        yield plane, infos
    finally:
        plane.close()
    assert vm.scan_processes(plane.instance_id) == {}
    assert _sshd_pids(state_dir) == []


def test_openssh_runs_commands_in_the_worker_home(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    plane, infos = setup
    user = os_user()
    command = 'pwd; echo "$HOME|$TPUCTL_EMULATED_WORKER|$GCE_METADATA_HOST"; cat; exit 5'
    result = run(plane, infos[1], user, key, command, stdin=b"from-stdin")
    home = plane.vm_root(NODE, 1) / "home" / user
    assert result.exit_status == 5
    assert result.stdout.decode().splitlines() == [
        str(home),
        f"{home}|{NODE}/1|{infos[1].ip}:{plane.metadata_port}",
        "from-stdin",
    ]


def test_openssh_host_key_is_the_published_one(
    setup: tuple[WorkerPlane, list[WorkerInfo]],
) -> None:
    plane, infos = setup
    for info in infos:
        served, version = _served_key(info.ip, plane.ssh_port)
        assert "OpenSSH" in version
        assert served == info.host_key


def _served_key(ip: str, port: int) -> tuple[str, str]:
    """The host key line a server presents, and its version string."""
    with socket.create_connection((ip, port), timeout=5) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=5)
            server_key = transport.get_remote_server_key()
            return f"{server_key.get_name()} {server_key.get_base64()}", transport.remote_version
        finally:
            transport.close()


def test_openssh_accepts_exactly_the_published_keys(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    plane, infos = setup
    user = os_user()
    late = new_key("late@ci")
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[0], user, late, "true")
    plane.set_metadata(NODE, {"ssh-keys": f"{key.metadata_line(user)}\n{late.metadata_line(user)}"})
    assert run(plane, infos[0], user, late, "echo in").stdout == b"in\n"
    plane.set_metadata(NODE, {"ssh-keys": key.metadata_line(user)})
    with pytest.raises(asyncssh.PermissionDenied):
        run(plane, infos[0], user, late, "true")


def test_openssh_sftp_starts_in_the_worker_home(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey, tmp_path: Path
) -> None:
    plane, infos = setup
    user = os_user()
    local = tmp_path / "payload.bin"
    local.write_bytes(os.urandom(100_000))

    async def go() -> str:
        async with (
            await connect(plane, infos[0], user, key) as conn,
            conn.start_sftp_client() as sftp,
        ):
            await sftp.put(str(local), "payload.bin")
            return str(await sftp.realpath("."))

    home = plane.vm_root(NODE, 0) / "home" / user
    assert asyncio.run(go()) == str(home)
    assert (home / "payload.bin").read_bytes() == local.read_bytes()


@pytest.mark.skipif(
    os.getuid() == 0,
    reason="OpenSSH refuses SSH signal requests in root sessions "
    "('session signalling requires privilege separation'); a TPU VM user is not root",
)
def test_openssh_forwards_signals(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    plane, infos = setup

    async def go() -> asyncssh.SSHCompletedProcess:
        async with await connect(plane, infos[0], os_user(), key) as conn:
            process = await conn.create_process(
                "trap 'echo got-int; exit 9' INT; echo ready; while :; do sleep 0.05; done"
            )
            assert await asyncio.wait_for(process.stdout.readline(), 10) == "ready\n"
            process.send_signal("INT")
            return await asyncio.wait_for(process.wait(), 10)

    result = asyncio.run(go())
    assert result.exit_status == 9 and "got-int" in str(result.stdout)


def test_openssh_login_shell_with_pty(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    plane, infos = setup

    async def go() -> str:
        async with await connect(plane, infos[1], os_user(), key) as conn:
            process = await conn.create_process(term_type="xterm", term_size=(80, 24))
            process.stdin.write("echo cwd=$PWD; tty; exit\n")
            output = await asyncio.wait_for(process.stdout.read(), 10)
            await process.wait()
            return str(output)

    output = asyncio.run(go())
    assert f"cwd={plane.vm_root(NODE, 1) / 'home' / os_user()}" in output
    assert "/dev/pts/" in output


def test_openssh_stop_node_kills_detached_processes(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    plane, infos = setup
    user = os_user()
    command = "setsid nohup sleep 300 >/dev/null 2>&1 & echo $!"
    (pid,) = read_pids(run(plane, infos[0], user, key, command).stdout.decode())
    wait_for(lambda: pid in plane.worker_processes(NODE, 0), 5, "the marker")
    plane.stop_node(NODE, grace=0.5)
    wait_for(lambda: not alive(pid), 5, "the process to die")
    assert plane.worker_processes(NODE, 0) == []
    assert run(plane, infos[0], user, key, "echo up").stdout == b"up\n"


def test_openssh_detached_run_is_in_the_session_sshd_made_and_stop_ends_it(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    """A detached start through a real sshd returns at once, its leader leads a group of its
    own in the session sshd made for the start (recorded in the pid file), and stop signals
    both: a child that made a group of its own ends too."""
    plane, infos = setup
    user = os_user()
    escape = "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(300)'"
    started = run(
        plane, infos[1], user, key, remote.start_script("r-ossh", f"{escape} & sleep 300")
    )
    assert started.exit_status == 0, started.stderr
    (leader,) = read_pids(started.stdout.decode())
    runs = plane.vm_root(NODE, 1) / "home" / user / ".tpuctl" / "runs"
    pid, _boot, session = (runs / "r-ossh.pid").read_text().split()
    assert int(pid) == leader == os.getpgid(leader)
    assert int(session) == os.getsid(leader) != leader  # the start shell's, which sshd made
    status = run(plane, infos[1], user, key, remote.status_script("r-ossh")).stdout.decode()
    assert status.startswith(f"state=running run=r-ossh pid={leader} ")

    def escaped() -> list[int]:
        found = [p for p in plane.worker_processes(NODE, 1) if _ids(p)[1] == int(session)]
        return found if any(_ids(p)[0] not in (leader, None) for p in found) else []

    in_session = wait_for(escaped, 10, "a process of the run in a group of its own")
    stopped = run(plane, infos[1], user, key, remote.stop_script("r-ossh", 5.0)).stdout.decode()
    assert stopped.startswith("state=stopped run=r-ossh")
    wait_for(lambda: not any(alive(p) for p in in_session), 10, "the run's processes to end")


def _ids(pid: int) -> tuple[int | None, int | None]:
    """The process group and session of `pid` (None, None once it is gone)."""
    try:
        return os.getpgid(pid), os.getsid(pid)
    except ProcessLookupError:
        return None, None


def test_openssh_faults(setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey) -> None:
    plane, infos = setup
    user = os_user()
    plane.set_ssh_fault(NODE, 1, "refuse")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((infos[1].ip, plane.ssh_port), timeout=5).close()
    plane.set_ssh_fault(NODE, 1, "hang")
    with socket.create_connection((infos[1].ip, plane.ssh_port), timeout=5) as sock:
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # no banner from a stopped sshd
    plane.set_ssh_fault(NODE, 1, None)
    assert run(plane, infos[1], user, key, "echo ok").stdout == b"ok\n"


def test_openssh_rotated_host_key_is_served(
    setup: tuple[WorkerPlane, list[WorkerInfo]], key: ClientKey
) -> None:
    """A rebuilt VM's new host key: served from the next connection on, running or refused."""
    plane, infos = setup
    before = infos[0]
    infos[0] = plane.rotate_host_key(NODE, 0)  # later tests of the module see the new key
    assert infos[0].host_key != before.host_key and infos[0].ip == before.ip
    assert _served_key(infos[0].ip, plane.ssh_port)[0] == infos[0].host_key
    assert run(plane, infos[0], os_user(), key, "echo ok").stdout == b"ok\n"
    plane.set_ssh_fault(NODE, 0, "refuse")
    try:
        infos[0] = plane.rotate_host_key(NODE, 0)
    finally:
        plane.set_ssh_fault(NODE, 0, None)
    assert _served_key(infos[0].ip, plane.ssh_port)[0] == infos[0].host_key
