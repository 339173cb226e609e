"""Access in locked-down projects, as Cloud TPU enforces it (the emulator does too): OS Login
turned on by the project or the node, keys imported through the OS Login API with an expiry,
the caller's POSIX user, and never a key in the nodes' `ssh-keys` metadata."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.harness import QR, Project, by_label, project_in
from tests.support import wait_for

ACCOUNT = "tester@example.com"
POSIX = "tester_example_com"  # as Google derives it from the email
ACCOUNT_ENV = {"TPUCTL_ACCOUNT": ACCOUNT}


@pytest.fixture
def oslogin_project(emulator: Any, tmp_path: Path) -> Iterator[tuple[Project, QR]]:
    """A project whose common instance metadata turns OS Login on, with a 2 × 2 QR."""
    with project_in(emulator, tmp_path) as project:
        emulator.admin.project_metadata(project.name, {"enable-oslogin": "TRUE"})
        yield project, project.create_qr(accelerator="v4-16", slices=2)


def _ssh_keys_metadata(project: Project, qr: QR) -> list[str]:
    api = project.api()
    return [
        str(dict(api.get_node(api.location.node_name(node_id)).metadata).get("ssh-keys", ""))
        for node_id in qr.node_ids
    ]


def test_os_login_from_the_project_reaches_every_worker_as_the_posix_user(
    oslogin_project: tuple[Project, QR],
) -> None:
    project, qr = oslogin_project
    outcome = project.cli("ssh", qr.name, "--format", "json", "--", "echo $USER", env=ACCOUNT_ENV)
    assert outcome.exit_code == 0, outcome.stderr
    rows = by_label(outcome)
    assert sorted(rows) == ["0/0", "0/1", "1/0", "1/1"]
    assert {row["stdout_tail"] for row in rows.values()} == {POSIX}
    assert "OS Login (the project turns it on): imported" in outcome.stderr
    assert f"for {ACCOUNT}, expiring in 1d; logging in as {POSIX}" in outcome.stderr
    assert _ssh_keys_metadata(project, qr) == ["", ""]  # nothing written to the nodes


def test_under_os_login_a_metadata_key_is_refused(
    oslogin_project: tuple[Project, QR], emulator: Any
) -> None:
    """The key in `ssh-keys` (what tpuctl did before) no longer opens the door."""
    project, qr = oslogin_project
    api = project.api()
    key_path = project.home / ".ssh" / "google_compute_engine"
    warm = project.cli(
        "ssh", qr.name, "--node", "0", "--worker", "0", "--", "true", env=ACCOUNT_ENV
    )  # makes the key, imported for the account
    assert warm.exit_code == 0, warm.stderr
    pkey = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    line = f"intruder:{pkey.get_name()} {pkey.get_base64()} intruder"
    node_name = api.location.node_name(qr.node_ids[0])
    api.client.update_node(
        request={
            "node": {"name": node_name, "metadata": {"ssh-keys": line}},
            "update_mask": {"paths": ["metadata"]},
        }
    ).result(timeout=30)
    address = api.get_node(node_name).network_endpoints[0].ip_address
    transport = paramiko.Transport((address, emulator.ssh_port))
    try:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.AuthenticationException):
            transport.auth_publickey("intruder", pkey)
    finally:
        transport.close()


def test_a_node_turns_os_login_on_by_itself_and_keys_expire(
    project: Project, emulator: Any
) -> None:
    spec = project.write_spec(
        {
            "name": "oslogin-node",
            "tpu": {
                "accelerator": "v4-8",
                "runtime": "tpu-ubuntu2204-base",
                "metadata": {"enable-oslogin": "TRUE"},
            },
        }
    )
    qr = project.create_from_spec(spec)
    short = project.cli("ssh", qr.name, "--key-ttl", "2s", "--", "echo $USER", env=ACCOUNT_ENV)
    assert short.exit_code == 0, short.stderr
    assert "OS Login (the node turns it on)" in short.stderr and "expiring in 2s" in short.stderr
    pkey = paramiko.Ed25519Key.from_private_key_file(
        str(project.home / ".ssh" / "google_compute_engine")
    )
    api = project.api()
    address = api.get_node(api.location.node_name(qr.node_ids[0])).network_endpoints[0].ip_address

    def refused() -> bool:
        transport = paramiko.Transport((address, emulator.ssh_port))
        try:
            transport.start_client(timeout=10)
            transport.auth_publickey(POSIX, pkey)
        except paramiko.AuthenticationException:
            return True
        finally:
            transport.close()
        return False

    wait_for(refused, 20, "the imported key to expire")  # OS Login keeps nothing for ever
    again = project.cli("ssh", qr.name, "--", "echo $USER", env=ACCOUNT_ENV)  # imports anew
    assert again.exit_code == 0 and f"[0/0] {POSIX}" in again.stdout


def test_os_login_without_a_known_account_says_how_to_name_one(
    oslogin_project: tuple[Project, QR],
) -> None:
    project, qr = oslogin_project
    outcome = project.cli("ssh", qr.name, "--", "true")
    assert outcome.exit_code == 8
    assert "cannot tell which account" in outcome.stderr and "TPUCTL_ACCOUNT" in outcome.stderr


def test_a_node_that_alone_turns_os_login_on_is_named(project: Project) -> None:
    """The first node decides how the key is granted; a later node that turns OS Login on by
    itself would ignore a metadata key, so it is named with the fix (exit 8)."""
    qr = project.create_qr(accelerator="v4-16", slices=2)
    api = project.api()
    api.client.update_node(
        request={
            "node": {
                "name": api.location.node_name(qr.node_ids[1]),
                "metadata": {"enable-oslogin": "TRUE"},
            },
            "update_mask": {"paths": ["metadata"]},
        }
    ).result(timeout=30)
    outcome = project.cli("ssh", qr.name, "--", "true")
    assert outcome.exit_code == 8, outcome.stderr
    assert f"node {qr.node_ids[1]} turns OS Login on" in outcome.stderr
    assert "unlike the queued resource's first node" in outcome.stderr
    assert "give every node the same enable-oslogin" in outcome.stderr
    assert "does not support OS Login" not in outcome.stderr
