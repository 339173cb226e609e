"""An emulated worker is offline like the suite: google-auth there finds the VM's own
(emulated) metadata server, never the link-local address."""

from __future__ import annotations

from tests.harness import QR, Project, by_label


def test_a_worker_points_google_auth_at_its_own_metadata_server(tpuctl: Project, qr: QR) -> None:
    outcome = tpuctl(
        "ssh", qr.name, "--format", "json", "--", 'echo "$GCE_METADATA_HOST $GCE_METADATA_IP"'
    )
    assert outcome.exit_code == 0, outcome.stderr
    for row in by_label(outcome).values():
        host, ip = row["stdout_tail"].split()
        assert host == ip and host.startswith("127.") and not ip.startswith("169.254.")
