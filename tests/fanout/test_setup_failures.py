"""Whatever goes wrong while a worker's connection is set up is that worker's result: a host key
type paramiko cannot verify, any exception at all; a command no worker could run is refused
before any connection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.harness import QR, Project, by_label

pytestmark = pytest.mark.emulator

# A ssh-dss key blob (paramiko 4 removed DSA) and a FIDO security key's (paramiko has none):
# the kinds a worker's known host key may be of that paramiko cannot check a server against.
DSS = "AAAAB3NzaC1kc3MAAACBAP1/U4EddRIpUt9KnC7s5Of2EbdSPO9EAMMeP4C2USZpRV1AIlH7WT2NWPq/xfW6"
SK_ED25519 = "AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIJi8T3kWQ0ZcJW7vzN4ZtXP5cVmZ8b0TAXc"


@contextmanager
def unpublished(emulator: Any, qr: QR, slice_index: int, worker: int) -> Iterator[None]:
    """The worker publishes no host key in its guest attributes until the block ends."""
    emulator.admin.hostkey_fault(qr.node_ids[slice_index], worker, "missing")
    try:
        yield
    finally:
        emulator.admin.hostkey_fault(qr.node_ids[slice_index], worker, "none")


def _alias(tpuctl: Project, qr: QR, slice_index: int, worker: int) -> str:
    api = tpuctl.api()
    node = api.get_node(api.location.node_name(qr.node_ids[slice_index]))
    return f"tpu.{node.id}-{worker}"


# Bounded by pytest-timeout, not by an assertion on the clock: before the fix the set-up thread
# died on paramiko's ValueError and the fan-out waited for ever, so a hang here is the bug. The
# connect timeout is 600 s, so the worker's result cannot come from a deadline: it comes from
# the refusal itself, at once (well under the 5 s asked of it; 120 s is far above both).
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(
            "ssh-dss",  # removed in paramiko 4
            marks=pytest.mark.skipif(
                int(paramiko.__version__.split(".")[0]) < 4,
                reason="paramiko before 4 still verifies DSA host keys",
            ),
        ),
        "sk-ecdsa-sha2-nistp256@openssh.com",  # a FIDO key: paramiko has none
        "ssh-ed25591",  # a typo
    ],
)
def test_a_pin_of_a_type_paramiko_cannot_verify_fails_its_worker_exit_10(
    tpuctl: Project, qr: QR, emulator: Any, algorithm: str
) -> None:
    pins = tpuctl.home / ".ssh" / "tpuctl_known_hosts"
    pins.parent.mkdir(mode=0o700, exist_ok=True)
    pins.write_text(f"{_alias(tpuctl, qr, 0, 1)} {algorithm} {DSS}\n")
    pins.chmod(0o600)
    with unpublished(emulator, qr, 0, 1):
        out = tpuctl(
            "ssh", qr.name, "--connect-timeout", "600", "--format", "json", "--", "echo ran"
        )  # fmt: skip
    assert out.exit_code == 10, out.stderr
    rows = by_label(out)
    bad = rows["0/1"]
    assert bad["status"] == "unreachable"
    assert f"cannot verify ({algorithm})" in bad["error"], bad["error"]
    assert "(pinned)" in bad["error"]
    assert all(rows[label]["stdout_tail"] == "ran" for label in qr.labels() if label != "0/1")


def _prepare(tpuctl: Project, qr: QR) -> Any:
    from tpuctl.cloud.client import connect
    from tpuctl.cloud.resolve import Location
    from tpuctl.fanout.operations import SshSettings
    from tpuctl.jobs.fleet import prepare_fleet

    api = connect(Location(qr.project, "us-central2-b"), environ=tpuctl.env)
    port = int(tpuctl.env["TPUCTL_SSH_PORT"])
    return prepare_fleet(api, qr.name, SshSettings(user="tester", ssh_port=port))


@pytest.mark.timeout(120)  # as above: a hang is the bug this guards against
def test_a_published_security_key_fails_only_its_worker(tpuctl: Project, qr: QR) -> None:
    """A worker whose guest attributes publish only a key of a type paramiko lacks (a FIDO
    `sk-` key here) is refused before a packet is sent; one it can check besides is used."""
    from tpuctl.fanout.engine import run_fanout

    fleet = _prepare(tpuctl, qr)
    first, second, *rest = fleet.targets
    both = [("sk-ssh-ed25519@openssh.com", SK_ED25519), *second.host_keys]
    targets = [
        first.with_host_keys([("sk-ssh-ed25519@openssh.com", SK_ED25519)]),
        second.with_host_keys(both),
        *rest,
    ]
    result = run_fanout(targets, "echo ran", fleet.connect)
    refused = result.results[0]
    assert refused.status == "unreachable" and not refused.started
    assert "sk-ssh-ed25519@openssh.com" in (refused.error or "")
    assert all(r.ok for r in result.results[1:]), [r.error for r in result.results]
    assert int(result.exit_code) == 10


@pytest.mark.timeout(120)  # as above: a hang is the bug this guards against
@pytest.mark.parametrize("where", ["connect", "open_channel", "start"])
def test_any_exception_in_set_up_is_its_workers_result(
    tpuctl: Project, qr: QR, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from tpuctl.fanout import engine

    fleet = _prepare(tpuctl, qr)
    doomed = fleet.targets[1]
    real = getattr(engine, where)

    def broken(*args: Any, **kwargs: Any) -> Any:
        if where == "connect" and args[0] is doomed:
            raise ZeroDivisionError("injected")
        if where != "connect" and broken.calls == 1:  # type: ignore[attr-defined]
            broken.calls += 1  # type: ignore[attr-defined]
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "injected")
        broken.calls += 1  # type: ignore[attr-defined]
        return real(*args, **kwargs)

    broken.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(engine, where, broken)
    result = engine.run_fanout(
        fleet.targets, "echo ran", fleet.connect, engine.FanoutOptions(batch_size=1)
    )
    failed = [r for r in result.results if not r.ok]
    assert len(failed) == 1, [(r.target.label, r.status, r.error) for r in result.results]
    assert failed[0].status == "unreachable"
    assert "injected" in (failed[0].error or "")
    assert int(result.exit_code) == 10
    assert all(r.stdout.text() == "ran" for r in result.results if r.ok)


def test_a_command_too_long_for_any_shell_is_refused_before_connecting(
    tpuctl: Project, qr: QR, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.fanout import engine

    def no_connection(*_args: Any) -> Any:
        raise AssertionError("a connection was made for a command that cannot run")

    monkeypatch.setattr(engine, "connect", no_connection)
    out = tpuctl("ssh", qr.name, "--", "echo " + "x" * 1_700_000)
    assert out.exit_code == 2, out.stderr
    assert "1,700,005 bytes" in out.stderr and "131,071" in out.stderr
    assert "tpuctl upload" in out.stderr and "--stdin" in out.stderr
    # The detached form wraps it in a script: refused the same way.
    detached = tpuctl("ssh", qr.name, "--detach", "--format", "json", "--", "x" * 200_000)
    assert detached.exit_code == 2, detached.stderr
    assert "tpuctl upload" in detached.json()["error"]["hint"]


def test_the_longest_command_a_shell_takes_runs(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    from tpuctl.fanout.connection import COMMAND_LIMIT

    command = "echo ok #" + "x" * (COMMAND_LIMIT - len("echo ok #"))
    out = tpuctl("ssh", qr.name, "--node", "0", "--worker", "0", "--format", "json", "--", command)
    assert out.exit_code == 0, out.stderr
    assert by_label(out)["0/0"]["stdout_tail"] == "ok"
