"""Canaries for the paramiko internals tpuctl relies on (tpuctl/fanout/handshake.py): each test
fails loudly when a paramiko release changes one, instead of the fan-out quietly getting slower
or hanging. And the rule they serve: the one monitor thread never waits on one worker."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import QR, Project

pytestmark = pytest.mark.emulator


def _prepare(tpuctl: Project, qr: QR) -> Any:
    from tpuctl.cloud.client import connect
    from tpuctl.cloud.resolve import Location
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.jobs.fleet import prepare_fleet

    api = connect(Location(qr.project, "us-central2-b"), environ=tpuctl.env)
    port = int(tpuctl.env["TPUCTL_SSH_PORT"])
    return prepare_fleet(api, qr.name, SshSettings(user="tester", ssh_port=port))


@pytest.fixture
def connected(tpuctl: Project, qr: QR) -> Iterator[Any]:
    """A transport to worker 0/0, set up as a fan-out sets it up."""
    from tpuctl.fanout.connection import connect
    from tpuctl.fanout.handshake import close_transport

    fleet = _prepare(tpuctl, qr)
    transport = connect(fleet.targets[0], fleet.connect)
    try:
        yield transport
    finally:
        close_transport(transport)


def test_aes_gcm_is_negotiated(connected: Any) -> None:
    """The cipher order reaches the handshake (a paramiko before 3.5 has no GCM at all)."""
    assert connected.local_cipher == "aes128-gcm@openssh.com"
    assert connected.remote_cipher == "aes128-gcm@openssh.com"


def test_the_transport_thread_polls_its_socket_at_our_interval(connected: Any) -> None:
    """Transport._active_check_timeout is what paramiko sets the socket's timeout to."""
    from tpuctl.fanout.handshake import TRANSPORT_POLL_SECONDS

    assert connected.sock.gettimeout() == TRANSPORT_POLL_SECONDS


def test_no_handshake_timer_thread_per_connection(
    tpuctl: Project, qr: QR, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko's Packetizer starts a threading.Timer per handshake; the packetizer_class
    tpuctl passes must keep it from doing so."""
    from tpuctl.fanout.connection import connect
    from tpuctl.fanout.handshake import close_transport

    fleet = _prepare(tpuctl, qr)
    timers: list[Any] = []
    real = threading.Timer

    def counting(*args: Any, **kwargs: Any) -> Any:
        timer = real(*args, **kwargs)
        timers.append(timer)
        return timer

    monkeypatch.setattr(threading, "Timer", counting)
    transport = connect(fleet.targets[0], fleet.connect)
    close_transport(transport)
    assert timers == []


def test_the_keepalive_reply_sets_our_event(connected: Any) -> None:
    from tpuctl.fanout.handshake import send_keepalive

    event = threading.Event()
    assert send_keepalive(connected, event)
    assert event.wait(30), "no reply to keepalive@openssh.com reached the event"


def test_nothing_is_sent_and_nothing_waits_while_keys_are_renegotiated(connected: Any) -> None:
    """During a rekey paramiko clears `clear_to_send`; a keepalive or signal is then skipped
    at once (its `_send_user_message` would wait up to 30 s)."""
    from tpuctl.fanout.connection import open_channel
    from tpuctl.fanout.handshake import send_keepalive, send_signal

    channel = open_channel(connected, 10)
    connected.clear_to_send_timeout = 3600.0  # a wait would outlast the test's timeout
    connected.clear_to_send.clear()
    try:
        assert not send_keepalive(connected, threading.Event())
        assert not send_signal(channel, "TERM")
    finally:
        connected.clear_to_send.set()
    assert send_keepalive(connected, threading.Event())


def test_the_signal_request_reaches_the_command(connected: Any) -> None:
    from tpuctl.fanout.connection import open_channel, start
    from tpuctl.fanout.handshake import send_signal

    channel = open_channel(connected, 10)
    start(channel, "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done")
    assert channel.recv(100).startswith(b"ready")
    assert send_signal(channel, "TERM")
    assert channel.recv_exit_status() == 7


@pytest.mark.timeout(120)
def test_one_worker_in_a_rekey_does_not_hold_up_the_others(
    tpuctl: Project, qr: QR, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0/0 is held in a (simulated) key renegotiation while its quiet command runs, so
    the monitor's keepalive to it cannot be sent. The others' output must keep flowing and
    their commands finish while 0/0 is still held; before, the monitor waited in paramiko's
    `_send_user_message` for 0/0 and every other worker waited with it."""
    from tpuctl.fanout import engine

    fleet = _prepare(tpuctl, qr)
    held_label = fleet.targets[0].label
    others = {t.label for t in fleet.targets[1:]}
    finished: set[str] = set()
    others_done = threading.Event()
    released = threading.Event()
    order: list[str] = []
    real_connect = engine.connect
    held: dict[str, Any] = {}

    def connect(target: Any, options: Any) -> Any:
        transport = real_connect(target, options)
        if target.label == held_label:
            held["transport"] = transport
        return transport

    def on_event(target: Any, kind: str, _message: str) -> None:
        if kind == "started" and target.label == held_label:
            transport = held["transport"]
            transport.clear_to_send_timeout = 3600.0  # a wait would outlast the guard below
            transport.clear_to_send.clear()  # as paramiko does when a key exchange starts
        elif kind == "finished" and target.label in others:
            finished.add(target.label)
            if finished == others:
                others_done.set()

    def release() -> None:
        # The guard: release 0/0 after 60 s at the latest (far above the ~1 s the others
        # need), so the broken behaviour shows as a wrong order, not a hang.
        order.append("others finished" if others_done.wait(60) else "guard")
        held["transport"].clear_to_send.set()
        released.set()

    monkeypatch.setattr(engine, "connect", connect)
    options = dataclasses.replace(fleet.connect, keepalive=0.2)

    def command(target: Any) -> str:
        if target.label == held_label:
            return "sleep 3"  # quiet: the monitor probes it with keepalives
        return "for i in 1 2 3 4 5; do echo $i; sleep 0.3; done"

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        result = engine.run_fanout(fleet.targets, command, options, on_event=on_event)
    finally:
        others_done.set()
        releaser.join()
    assert order == ["others finished"]
    assert all(r.ok for r in result.results), [(r.target.label, r.error) for r in result.results]
    assert all(r.stdout.text() == "1\n2\n3\n4\n5" for r in result.results[1:])


def test_paramiko_is_loaded_without_invoke_and_invoke_still_imports_afterwards() -> None:
    """tpuctl.fanout.imports keeps invoke out of paramiko's import (about 50 ms a process): a
    paramiko that needs invoke to import, or that leaves our sys.modules entry behind, fails
    here. It runs in a fresh interpreter: this one may have imported paramiko already."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from tpuctl.fanout.imports import load_paramiko\n"
        "load_paramiko()\n"
        "assert 'paramiko' in sys.modules and 'invoke' not in sys.modules, sorted(sys.modules)\n"
        "import paramiko\n"
        "assert paramiko.config.invoke is None\n"
        "config = paramiko.SSHConfig.from_text('Host w\\n  User tpu\\n')\n"
        "assert config.lookup('w')['user'] == 'tpu'\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('invoke'):  # paramiko 4 requires it, 3 does not\n"
        "    import invoke\n"
        "    assert invoke.Context is not None\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
