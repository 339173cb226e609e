"""Unreachable, hanging and dropped workers; host key mismatch; a command never run twice."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.harness import QR, Project, by_label
from tests.support import python_with_default_sigint, wait_for


@contextmanager
def ssh_fault(emulator: Any, qr: QR, slice_index: int, worker: int, mode: str) -> Iterator[None]:
    emulator.admin.ssh_fault(qr.node_ids[slice_index], worker, mode)
    try:
        yield
    finally:
        emulator.admin.ssh_fault(qr.node_ids[slice_index], worker, None)


def test_unreachable_worker_gives_exit_10_without_holding_up_the_rest(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    with ssh_fault(emulator, qr, 0, 1, "refuse"):
        out = tpuctl("ssh", qr.name, "--format", "json", "--", "echo ran")
    assert out.exit_code == 10, out.stderr
    rows = by_label(out)
    assert rows["0/1"]["status"] == "unreachable"
    assert "connect" in rows["0/1"]["error"]
    assert all(rows[label]["stdout_tail"] == "ran" for label in qr.labels() if label != "0/1")


def test_hanging_worker_is_unreachable_at_the_connect_timeout_exit_10(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    """A worker that takes the TCP connection and never speaks SSH: unreachable (exit 10), the
    verdict a worker with no external IP gets for the same silence (test_private_workers)."""
    # The healthy workers must connect within the same timeout: a handshake takes about 0.1 s,
    # but 1 s was once too short for one of them with both cores loaded by the whole suite.
    with ssh_fault(emulator, qr, 1, 0, "hang"):
        out = tpuctl("ssh", qr.name, "--connect-timeout", "5", "--format", "json", "--", "echo ran")
    assert out.exit_code == 10, out.stderr
    rows = by_label(out)
    assert rows["1/0"]["status"] == "unreachable"
    # The flag reached the connection: the error names its 5 s (the default is 20 s).
    assert re.search(r"\b5 s\b", rows["1/0"]["error"]), rows["1/0"]["error"]
    others = [label for label in qr.labels() if label != "1/0"]
    assert all(rows[label]["status"] == "ok" for label in others), rows
    assert all(rows[label]["stdout_tail"] == "ran" for label in others)


def test_hanging_command_hits_timeout_exit_4(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--worker", "0", "--timeout", "1", "--", "sleep 30")
    assert out.exit_code == 4, out.stderr
    assert "TIMEOUT" in out.stderr  # the table: stdout is the workers' output


def _prepare(tpuctl: Project, qr: QR, **settings: Any) -> Any:
    from tpuctl.cloud.client import connect
    from tpuctl.cloud.resolve import Location
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.jobs.fleet import prepare_fleet

    api = connect(Location(qr.project, "us-central2-b"), environ=tpuctl.env)
    port = int(tpuctl.env["TPUCTL_SSH_PORT"])
    return prepare_fleet(api, qr.name, SshSettings(user="tester", ssh_port=port, **settings))


def test_hanging_worker_does_not_hold_up_the_others(tpuctl: Project, qr: QR, emulator: Any) -> None:
    """The others finish while 1/0 still hangs: its fault is lifted only once they have."""
    from tpuctl.fanout.engine import run_fanout

    fleet = _prepare(tpuctl, qr)  # the default 20 s connect timeout, far beyond the others
    others = {label for label in qr.labels() if label != "1/0"}
    finished: list[str] = []
    others_finished = threading.Event()

    def on_event(target: Any, kind: str, _message: str) -> None:
        if kind == "finished":
            finished.append(target.label)
            if others <= set(finished):
                others_finished.set()

    def lift_once_the_others_finish() -> None:
        others_finished.wait(60)
        emulator.admin.ssh_fault(qr.node_ids[1], 0, None)

    with ssh_fault(emulator, qr, 1, 0, "hang"):
        lifter = threading.Thread(target=lift_once_the_others_finish)
        lifter.start()
        try:
            result = run_fanout(fleet.targets, "echo ran", fleet.connect, on_event=on_event)
        finally:
            others_finished.set()
            lifter.join()
    assert set(finished[:-1]) == others and finished[-1] == "1/0", finished
    rows = {r.target.label: r for r in result.results}
    assert all(rows[label].ok and rows[label].stdout.text() == "ran" for label in others)


def test_dropped_connection_after_start_is_not_rerun(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    from dataclasses import replace

    from tpuctl.fanout.engine import FanoutOptions, run_fanout

    fleet = _prepare(tpuctl, qr)
    target = fleet.targets[0]
    counter = qr.home(0, 0) / "runs.count"
    release = qr.home(0, 0) / "runs.release"
    counter.unlink(missing_ok=True)
    release.unlink(missing_ok=True)
    # It runs until released (at most ~30 s), and records its start and its end.
    command = (
        "echo run >> runs.count; "
        "for _ in $(seq 600); do test -e runs.release && break; sleep 0.05; done; "
        "echo finished >> runs.count"
    )
    options = replace(fleet.connect, keepalive=0.3, keepalive_count=2)
    done: dict[str, Any] = {}

    def drop_once_started() -> None:
        wait_for(counter.exists, what="the command to start")
        emulator.admin.ssh_fault(qr.node_ids[0], 0, "hang")  # the worker stops answering

    import threading

    dropper = threading.Thread(target=drop_once_started)
    dropper.start()
    try:
        done["result"] = run_fanout([target], command, options, FanoutOptions())
    finally:
        dropper.join()
        emulator.admin.ssh_fault(qr.node_ids[0], 0, None)
        release.touch()
    result = done["result"].results[0]
    assert result.status == "unreachable" and result.started
    assert "not re-run" in (result.error or "")
    # The command outlives the dropped connection and finishes once released: one run only.
    wait_for(lambda: counter.read_text().endswith("finished\n"), 40, "the command to finish")
    assert counter.read_text() == "run\nfinished\n"


def test_host_key_mismatch_is_refused(tpuctl: Project, qr: QR) -> None:
    import asyncssh

    from tpuctl.fanout.engine import run_fanout

    fleet = _prepare(tpuctl, qr)
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    tampered = [fleet.targets[0].with_host_keys([(impostor[0], impostor[1])]), *fleet.targets[1:]]
    result = run_fanout(tampered, "echo ran", fleet.connect)
    first = result.results[0]
    assert first.status == "hostkey-mismatch" and not first.started
    assert "HOST KEY MISMATCH" in (first.error or "") and "0/0" in (first.error or "")
    assert all(r.ok for r in result.results[1:])
    assert int(result.exit_code) == 8


def test_strict_host_key_checking_no_warns_on_stderr(tpuctl: Project, qr: QR) -> None:
    out = tpuctl("ssh", qr.name, "--strict-host-key-checking", "no", "--", "true")
    assert out.exit_code == 0, out.stderr
    assert "NOT checked" in out.stderr


@pytest.mark.parametrize("batch_size", ["1"])
def test_long_command_on_more_workers_than_batch_size_starts_everywhere(
    tpuctl: Project, qr: QR, batch_size: str
) -> None:
    """gcloud joins each batch before the next: `sleep` on more workers than --batch-size never
    starts on the rest. Here every worker starts while the others still run; then Ctrl-C."""
    import signal
    import subprocess

    homes = [qr.home(s, w) for s in range(len(qr.node_ids)) for w in range(qr.workers_per_node)]
    for home in homes:
        (home / "long.pid").unlink(missing_ok=True)
    process = subprocess.Popen(
        python_with_default_sigint("-m", "tpuctl", "ssh", qr.name, "--batch-size", batch_size,
                                   "--", "echo $$ > long.pid; exec sleep 60"),
        env=tpuctl.child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # `echo $$ > long.pid` creates the file before it writes the pid: wait for the pid.
        def pids_written() -> bool:
            return all(
                (h / "long.pid").exists() and (h / "long.pid").read_text().strip() for h in homes
            )

        wait_for(pids_written, 30, "every worker")
        assert process.poll() is None  # all started while the first ones still run
        pids = [int((h / "long.pid").read_text()) for h in homes]
        process.send_signal(signal.SIGINT)
        _stdout, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "still running" in stderr
    # Ctrl-C sent SIGTERM through each session: no sleep is left behind.
    from tests.fanout.helpers import pid_alive

    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 10, "the remote sleeps to end")
