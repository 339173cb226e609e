"""`tpuctl emulator …` through the CLI: start prints its exports and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.emulator.helpers import (
    QrState,
    create,
    new_project,
    parent_of,
    qr_request,
    rest,
    unique,
    wait_state,
    wait_until,
)
from tests.emulator.test_faults import _running
from tpuctl.cli.main import run
from tpuctl.emulator.client.testing import EmulatorProcess, _read_exports

pytestmark = pytest.mark.emulator


def test_start_prints_its_exports_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    tag = f"{unique('left')}-sleeper"
    process = subprocess.Popen(
        [sys.executable, "-m", "tpuctl", "emulator", "start", "--speed", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        exports = _read_exports(process, 60)
        assert set(exports) == {
            "TPU_EMULATOR_HOST",
            "TPUCTL_SSH_PORT",
            "TPUCTL_COMPUTE_ENDPOINT",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS",
        }
        assert exports["TPU_EMULATOR_HOST"].startswith("127.0.0.1:")
        assert int(exports["TPUCTL_SSH_PORT"]) > 0
        assert exports["TPUCTL_COMPUTE_ENDPOINT"].startswith("http://127.0.0.1:")
        # gcloud's settings: its REST endpoints (with the trailing slash it joins paths to)
        # and no credentials.
        assert re.fullmatch(
            r"http://127\.0\.0\.1:\d+/", exports["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"]
        )
        compute = exports["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"]
        assert compute == exports["TPUCTL_COMPUTE_ENDPOINT"] + "/"
        assert exports["CLOUDSDK_AUTH_DISABLE_CREDENTIALS"] == "true"
        handle = EmulatorProcess(tmp_path / "unused")
        handle.host = exports["TPU_EMULATOR_HOST"]
        state_dir = Path(handle.admin.status()["state_dir"])
        assert state_dir.is_dir()
        client = handle.tpu_client()
        parent = parent_of(new_project())
        script = f"#!/bin/bash\nnohup setsid bash -c 'exec -a {tag} sleep 1000' >/dev/null 2>&1 &\n"
        qr = qr_request(parent, accelerator_type="v4-16", startup_script=script)
        name = create(client, parent, unique("qr"), qr).result(timeout=30).name
        wait_state(client, name, QrState.ACTIVE)
        wait_until(lambda: len(_running(tag)) == 2, "two workers running the sleeper")
        handle.admin.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert process.stdout is not None and process.stdout.read() == b""
        assert process.stderr is not None and process.stderr.read() == b""  # quiet without -v
        assert _running(tag) == []
        assert not state_dir.exists()  # the temporary state dir is removed at exit
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout:
            process.stdout.close()
        if process.stderr:
            process.stderr.close()


def test_state_dir_is_kept_when_given(tmp_path: Path) -> None:
    with EmulatorProcess(tmp_path / "state", "--speed", "20") as emulator:
        assert emulator.admin.status()["state_dir"] == str(tmp_path / "state")
    assert (tmp_path / "state" / "events.jsonl").exists()


def _run(args: list[str], capsys: Any) -> tuple[int, str, str]:
    code = run(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_admin_commands(
    emulator: EmulatorProcess, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    code, out, _ = _run(["emulator", "status", "--format", "json"], capsys)
    assert code == 0
    status = json.loads(out)
    assert status["host"] == emulator.host and "v4" in status["capacity"]

    code, out, _ = _run(["emulator", "capacity", "v6e=100", "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["pools"]["v6e"]["total"] == 100
    code, out, _ = _run(["emulator", "capacity", "v6e=16384"], capsys)
    assert code == 0 and "v6e" in out

    code, out, _ = _run(["emulator", "api-fault", "--code", "UNAVAILABLE", "--count", "0"], capsys)
    assert code == 0 and re.search(r"^count:\s+0$", out, re.MULTILINE)  # however aligned

    code, out, _ = _run(["emulator", "events", "--since", "0"], capsys)
    assert code == 0
    first = json.loads(out.splitlines()[0])
    assert first["kind"] == "emulator.start"

    code, _, err = _run(["emulator", "preempt", "no-such-qr"], capsys)
    assert code == 5 and "no-such-qr" in err
    code, _, err = _run(["emulator", "capacity", "v9=1"], capsys)
    assert code == 2 and "v9" in err
    code, _, err = _run(["emulator", "api-fault", "--code", "NOPE"], capsys)
    assert code == 2 and "NOPE" in err

    monkeypatch.delenv("TPU_EMULATOR_HOST")
    code, _, err = _run(["emulator", "status"], capsys)
    assert code == 2 and "TPU_EMULATOR_HOST" in err


def test_hostkey_fault_command(
    emulator: EmulatorProcess, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    client = emulator.tpu_client()
    parent = parent_of(new_project())
    node_id = unique("hkc")
    request = qr_request(parent, node_id=node_id)
    name = create(client, parent, unique("qr"), request).result(timeout=30).name
    wait_state(client, name, QrState.ACTIVE)
    node_name = f"{parent}/nodes/{node_id}"
    try:
        args = ["emulator", "hostkey-fault", node_name, "--worker", "0", "--mode", "missing"]
        code, out, _ = _run([*args, "--format", "json"], capsys)
        assert code == 0 and json.loads(out)["published"] is False
        response = client.get_guest_attributes(
            request={"name": node_name, "query_path": "hostkeys/"}
        )
        assert not response.guest_attributes[0].query_value.items
        code, out, _ = _run([*args[:-1], "none"], capsys)
        assert code == 0 and re.search(r"^published:\s+True$", out, re.MULTILINE)
        code, _, err = _run([*args[:-1], "lost"], capsys)
        assert code == 2 and "--mode" in err
    finally:
        emulator.admin.hostkey_fault(node_name, 0, "none")
        client.delete_queued_resource(request={"name": name, "force": True})


def test_start_rejects_bad_options(capsys: Any) -> None:
    code, _, err = _run(["emulator", "start", "--capacity", "v4=lots"], capsys)
    assert code == 2 and "--capacity" in err
    code, _, err = _run(["emulator", "start", "--grace", "soon"], capsys)
    assert code == 2 and "--grace" in err


def test_events_follow(emulator: EmulatorProcess) -> None:
    command = [sys.executable, "-m", "tpuctl", "emulator", "events", "--follow"]
    env = {**os.environ, "TPU_EMULATOR_HOST": emulator.host}
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as follower:
        assert follower.stdout is not None
        stdout = follower.stdout
        printed: list[dict[str, Any]] = []

        def read() -> None:
            for line in stdout:
                printed.append(json.loads(line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_until(lambda: printed, "the first event", timeout=30)
            assert printed[0]["seq"] == 0
            # An event that happens after the follower has started reaches it, and it goes on.
            seen = len(printed)
            emulator.admin.capacity({"v6e": 16384})
            wait_until(
                lambda: [e for e in printed[seen:] if e["kind"] == "capacity"],
                "the new capacity event",
                timeout=30,
            )
            assert follower.poll() is None
            seqs = [e["seq"] for e in printed]
            assert seqs == list(range(len(seqs)))  # every event once, in order
        finally:
            follower.terminate()
            reader.join(30)


def test_env_prints_export_lines_a_shell_evaluates(
    emulator: EmulatorProcess, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    code, out, _ = _run(["emulator", "env", "--project", "demo project"], capsys)
    assert code == 0
    shown = subprocess.run(
        ["bash", "-c", f"{out}\nenv"], capture_output=True, text=True, check=True, env={}
    ).stdout
    exported = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert exported["TPU_EMULATOR_HOST"] == emulator.host
    assert exported["TPUCTL_SSH_PORT"] == str(emulator.ssh_port)
    assert exported["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == emulator.rest_endpoint
    assert exported["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"] == emulator.compute_endpoint + "/"
    assert exported["CLOUDSDK_AUTH_DISABLE_CREDENTIALS"] == "true"
    assert exported["CLOUDSDK_CORE_PROJECT"] == "demo project"  # quoted for the shell
    code, out, _ = _run(["emulator", "env", "--unset"], capsys)
    assert code == 0 and "unset CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU" in out.splitlines()
    assert "CLOUDSDK_CORE_PROJECT" not in out


def test_reservation_capacity_and_rest_requests_commands(
    emulator: EmulatorProcess, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_EMULATOR_HOST", emulator.host)
    code, out, _ = _run(
        ["emulator", "capacity", "--flex-start", "v6e=10", "--format", "json"], capsys
    )
    assert code == 0 and json.loads(out)["pools"]["v6e"]["total"] == 10
    assert emulator.admin.capacity()["v6e"]["total"] == 16384  # the standard pool is apart
    emulator.admin.capacity({"v6e": 16384}, flex_start=True)

    parent = parent_of(new_project())
    name = f"{parent}/reservations/{unique('cli')}"
    args = ["emulator", "reservation", name]
    code, out, _ = _run([*args, "--chips", "8", "--generation", "v5e", "--format", "json"], capsys)
    [made] = [r for r in json.loads(out)["reservations"] if r["name"] == name]
    assert code == 0 and made["chips"] == 8 and made["end_time"] is None
    code, out, _ = _run([*args, "--end", "now", "--format", "json"], capsys)
    [ended] = [r for r in json.loads(out)["reservations"] if r["name"] == name]
    assert code == 0 and ended["end_time"] is not None and ended["chips"] == 8
    code, _, err = _run(args, capsys)
    assert code == 2 and "--chips" in err
    code, _, _ = _run([*args, "--remove"], capsys)
    assert code == 0
    code, _, err = _run([*args, "--remove"], capsys)
    assert code == 5 and name in err

    qr_id = unique("rq")
    body = {"tpu": {"nodeSpec": []}}
    rest(emulator.rest_endpoint, "POST", f"{parent}/queuedResources", body, queuedResourceId=qr_id)
    code, out, _ = _run(["emulator", "rest-requests", f"{parent}/queuedResources/{qr_id}"], capsys)
    [entry] = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and entry["body"] == body and entry["status"] == 400
    assert entry["api"] == "tpu.projects.locations.queuedResources.create"
    assert entry["query"] == {"queuedResourceId": qr_id}
