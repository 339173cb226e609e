"""Host keys when guest attributes publish none, end to end against the emulator: trust on first
use pinned per node id and worker in ~/.ssh/tpuctl_known_hosts, a changed key refused (exit 8)
with the command that forgets the stale pin, `--strict-host-key-checking yes|accept-new|no`."""

from __future__ import annotations

import re
import stat
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from tests.harness import QR, Project, by_label

pytestmark = pytest.mark.emulator

Worker = tuple[int, int]  # (slice, worker)


def _every(qr: QR) -> list[Worker]:
    return [(s, w) for s in range(len(qr.node_ids)) for w in range(qr.workers_per_node)]


@contextmanager
def unpublished(emulator: Any, qr: QR, workers: Sequence[Worker]) -> Iterator[None]:
    """These workers publish no host key in their guest attributes, until the block ends."""
    try:
        for slice_index, worker in workers:
            emulator.admin.hostkey_fault(qr.node_ids[slice_index], worker, "missing")
        yield
    finally:
        for slice_index, worker in workers:
            emulator.admin.hostkey_fault(qr.node_ids[slice_index], worker, "none")


def _known_hosts(tpuctl: Project) -> Path:
    return tpuctl.home / ".ssh" / "tpuctl_known_hosts"


def _alias(tpuctl: Project, qr: QR, slice_index: int, worker: int) -> str:
    api = tpuctl.api()
    node = api.get_node(api.location.node_name(qr.node_ids[slice_index]))
    assert node.id
    return f"tpu.{node.id}-{worker}"


def _pinned(tpuctl: Project) -> dict[str, str]:
    """alias → the rest of its line, as in the file."""
    lines = _known_hosts(tpuctl).read_text().splitlines()
    return {line.split()[0]: line for line in lines if line and not line.startswith("#")}


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_workers_without_published_keys_are_pinned_on_first_use_with_one_warning(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    with unpublished(emulator, qr, _every(qr)):
        first = tpuctl("ssh", qr.name, "--format", "json", "--", "echo ran")
        second = tpuctl("ssh", qr.name, "--format", "json", "--", "echo ran")
    assert first.exit_code == 0, first.stderr
    rows = by_label(first)
    assert all(rows[label]["stdout_tail"] == "ran" for label in qr.labels()), rows
    warnings = _warnings(first.stderr)
    assert len(warnings) == 1, first.stderr
    assert "4 workers published no host key" in warnings[0]
    assert "0/0, 0/1, 1/0, 1/1" in warnings[0]
    assert str(_known_hosts(tpuctl)) in warnings[0]
    # Pinned per node id and worker, 0600.
    path = _known_hosts(tpuctl)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    expected = {_alias(tpuctl, qr, s, w) for s, w in _every(qr)}
    assert set(_pinned(tpuctl)) == expected
    # The second run checks the pins: every worker reached, nothing more to say.
    assert second.exit_code == 0, second.stderr
    assert all(row["status"] == "ok" for row in by_label(second).values())
    assert _warnings(second.stderr) == [], second.stderr


def test_a_changed_key_on_a_pinned_worker_is_refused_with_the_fix(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    with unpublished(emulator, qr, _every(qr)):
        pinned = tpuctl("ssh", qr.name, "--", "true")
        assert pinned.exit_code == 0, pinned.stderr
        before = _known_hosts(tpuctl).read_text()
        emulator.admin.hostkey_fault(qr.node_ids[0], 1, "rotate")  # 0/1 rebuilt, new key
        refused = tpuctl("ssh", qr.name, "--format", "json", "--", "echo ran")
        alias = _alias(tpuctl, qr, 0, 1)
        fix = f"ssh-keygen -R {alias} -f {_known_hosts(tpuctl)}"
        assert refused.exit_code == 8, refused.stderr
        rows = by_label(refused)
        assert rows["0/1"]["status"] == "hostkey-mismatch"
        error = rows["0/1"]["error"]
        assert "HOST KEY CHANGED for worker 0/1" in error and fix in error, error
        assert re.search(r"line \d+", error), error
        assert all(rows[label]["stdout_tail"] == "ran" for label in ("0/0", "1/0", "1/1"))
        # Loud on the error line too, and the pin is left alone.
        assert fix in refused.stderr.splitlines()[-1], refused.stderr
        assert _known_hosts(tpuctl).read_text() == before
        # Key material never shows, fingerprints only.
        assert not any(line.split()[2] in refused.stdout + refused.stderr
                       for line in _pinned(tpuctl).values())  # fmt: skip
        # The fix works: forget the stale pin, and the new key is pinned on first use.
        subprocess.run(fix.split(), check=True, capture_output=True)
        again = tpuctl("ssh", qr.name, "--", "true")
    assert again.exit_code == 0, again.stderr
    warnings = _warnings(again.stderr)
    assert len(warnings) == 1 and "1 worker published no host key" in warnings[0], warnings
    assert "(0/1)" in warnings[0]


def test_a_key_published_in_guest_attributes_wins_and_refreshes_its_pin(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    """A rebuilt VM that publishes its new key is verified against it, not refused."""
    first = tpuctl("ssh", qr.name, "--node", "1", "--worker", "0", "--", "true")
    assert first.exit_code == 0, first.stderr
    alias = _alias(tpuctl, qr, 1, 0)
    old = _pinned(tpuctl)[alias]
    assert "from guest attributes" in old
    emulator.admin.hostkey_fault(qr.node_ids[1], 0, "rotate")
    out = tpuctl("ssh", qr.name, "--node", "1", "--worker", "0", "--", "true")
    assert out.exit_code == 0, out.stderr
    assert _warnings(out.stderr) == []
    assert _pinned(tpuctl)[alias] != old


def test_strict_yes_refuses_workers_with_neither_a_published_key_nor_a_pin(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    with unpublished(emulator, qr, [(1, 0)]):
        refused = tpuctl(
            "ssh", qr.name, "--strict-host-key-checking", "yes", "--format", "json", "--", "true"
        )
        assert refused.exit_code == 8, refused.stderr
        rows = by_label(refused)
        # Unknown, not a mismatch: no key was known for it to mismatch with.
        assert rows["1/0"]["status"] == "hostkey-unknown"
        assert refused.json()["summary"]["hostkey-unknown"] == 1
        assert "published no host key" in rows["1/0"]["error"]
        assert "--strict-host-key-checking accept-new" in refused.stderr.splitlines()[-1]
        assert all(rows[label]["status"] == "ok" for label in ("0/0", "0/1", "1/1"))
        assert _alias(tpuctl, qr, 1, 0) not in _pinned(tpuctl)  # yes never trusts on first use
        # Pinned once (the default, accept-new), it is known to `yes` as well.
        assert tpuctl("ssh", qr.name, "--", "true").exit_code == 0
        strict = tpuctl("ssh", qr.name, "--strict-host-key-checking", "yes", "--", "true")
    assert strict.exit_code == 0, strict.stderr


def test_the_shell_pins_on_first_use_and_refuses_a_changed_key(
    tpuctl: Project, qr: QR, emulator: Any
) -> None:
    """`tpuctl ssh NAME --node 1 --worker 1 < script`: one worker, no fan-out, same rules."""

    def shell() -> tuple[int, str, str]:
        process = tpuctl.spawn("ssh", qr.name, "--node", "1", "--worker", "1", stdin=PIPE)
        stdout, stderr = process.communicate("echo shell-ran\n", timeout=120)
        return process.returncode, stdout, stderr

    with unpublished(emulator, qr, [(1, 1)]):
        code, stdout, stderr = shell()
        assert (code, stdout) == (0, "shell-ran\n"), stderr
        warnings = _warnings(stderr)
        assert len(warnings) == 1 and "(1/1)" in warnings[0], stderr
        assert _alias(tpuctl, qr, 1, 1) in _pinned(tpuctl)
        emulator.admin.hostkey_fault(qr.node_ids[1], 1, "rotate")
        code, stdout, stderr = shell()
    assert code == 8 and stdout == "", stderr
    assert "HOST KEY CHANGED for worker 1/1" in stderr
    assert f"ssh-keygen -R {_alias(tpuctl, qr, 1, 1)}" in stderr


def test_strict_no_checks_nothing_and_warns_once(tpuctl: Project, qr: QR, emulator: Any) -> None:
    with unpublished(emulator, qr, _every(qr)):
        out = tpuctl("ssh", qr.name, "--strict-host-key-checking", "no", "--", "true")
    assert out.exit_code == 0, out.stderr
    warnings = _warnings(out.stderr)
    assert len(warnings) == 1 and "NOT checked" in warnings[0], out.stderr
    assert not _known_hosts(tpuctl).exists()
