"""tpuctl's known-hosts file (~/.ssh/tpuctl_known_hosts), without a network: pins by node id and
worker, OpenSSH's format and fingerprints, atomic 0600 rewrites that keep other lines and other
writers' pins, files others could write refused, and one warning per batch of first-use pins."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import asyncssh
import pytest

from tpuctl.errors import AuthError, ExitCode
from tpuctl.fanout.known_hosts import (
    HEADER,
    NAMED_WORKERS,
    HostKeyPins,
    KnownHostsFile,
    default_path,
    fingerprint,
    host_alias,
    merge,
    name_workers,
    parse,
)
from tpuctl.fanout.targets import WorkerTarget

OTHER_UID = 4242  # nobody on the test machine owns this uid


def _key() -> tuple[str, str, asyncssh.SSHKey]:
    private = asyncssh.generate_private_key("ssh-ed25519")
    algorithm, blob = private.export_public_key("openssh").decode().split()[:2]
    return algorithm, blob, private


def _target(slice_index: int = 0, worker: int = 0, uid: int | None = None) -> WorkerTarget:
    """A worker of node job-<slice>, whose unique id is 7519457668826798549 + slice."""
    node_uid = 7519457668826798549 + slice_index if uid is None else uid
    return WorkerTarget(slice_index, f"job-{slice_index}", worker, "10.0.0.2", node_uid=node_uid)


def test_alias_is_gcloud_s_and_names_the_node_by_its_unique_id() -> None:
    assert host_alias(_target(0, 3)) == "tpu.7519457668826798549-3"
    # The same name created again is another node: another alias, so a first use, not an alarm.
    assert host_alias(_target(0, 3, uid=11)) != host_alias(_target(0, 3))
    assert host_alias(WorkerTarget(0, "job-0", 1, "10.0.0.2")) == "tpu.job-0-1"  # no id known


def test_fingerprint_is_openssh_s() -> None:
    _algorithm, blob, private = _key()
    assert fingerprint(blob) == private.get_fingerprint("sha256")
    if shutil.which("ssh-keygen"):
        line = private.export_public_key("openssh").decode()
        listed = subprocess.run(
            ["ssh-keygen", "-lf", "-"], input=line, capture_output=True, text=True, check=True
        )
        assert fingerprint(blob) == listed.stdout.split()[1]


def test_parse_reads_pins_and_skips_what_pins_nothing() -> None:
    text = (
        "# a comment\n"
        "\n"
        "tpu.1-0 ssh-ed25519 AAAA0 job-0 worker 0, trusted on first use\n"
        "@revoked tpu.1-1 ssh-ed25519 AAAAR\n"
        "|1|c2FsdA==|aGFzaA== ssh-ed25519 AAAAH\n"
        "truncated-line ssh-ed25519\n"
        "tpu.1-1,other ssh-rsa AAAA1\n"
        "tpu.1-1 ecdsa-sha2-nistp256 AAAA2\n"
    )
    pins = parse(text)
    assert [(p.algorithm, p.blob, p.line) for p in pins["tpu.1-0"]] == [("ssh-ed25519", "AAAA0", 3)]
    assert [(p.blob, p.line) for p in pins["tpu.1-1"]] == [("AAAA1", 7), ("AAAA2", 8)]
    assert set(pins) == {"tpu.1-0", "tpu.1-1", "other"}


def test_merge_replaces_in_place_drops_duplicates_appends_and_keeps_the_rest() -> None:
    current = ["# header", "tpu.1-0 k A", "tpu.1-1 k B", "tpu.1-0 k C", "custom line kept"]
    merged = merge(current, {"tpu.1-0": "tpu.1-0 k NEW", "tpu.2-0": "tpu.2-0 k D"})
    assert merged == ["# header", "tpu.1-0 k NEW", "tpu.1-1 k B", "custom line kept", "tpu.2-0 k D"]


def test_write_creates_a_0600_file_atomically_and_keeps_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "tpuctl_known_hosts"
    file = KnownHostsFile(path)
    assert file.read() == {}  # no file yet: nothing pinned
    file.write({"tpu.1-0": "tpu.1-0 ssh-ed25519 AAAA0 job-0 worker 0"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().splitlines()[: len(HEADER)] == list(HEADER)
    with path.open("a") as handle:
        handle.write("example.com ssh-ed25519 AAAAX added by hand\n")
    path.chmod(0o644)  # readable by others is no risk: the next write makes it 0600 again
    file.write({"tpu.1-0": "tpu.1-0 ssh-ed25519 AAAA9 job-0 worker 0", "tpu.1-1": "tpu.1-1 k B"})
    pins = file.read()
    assert [p.blob for p in pins["tpu.1-0"]] == ["AAAA9"]
    assert pins["tpu.1-0"][0].line == len(HEADER) + 1  # rewritten where it was
    assert "example.com" in pins and "tpu.1-1" in pins
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Replaced by rename: no temporary file is left beside it.
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, f".{path.name}.lock"]
    )


def test_ssh_keygen_forgets_a_pin_in_the_file(tmp_path: Path) -> None:
    """The fix tpuctl prints for a changed key works on its file."""
    if not shutil.which("ssh-keygen"):
        pytest.skip("no ssh-keygen")
    path = tmp_path / "known_hosts"
    pins = HostKeyPins.load(path, "accept-new")
    for worker in (0, 1):
        algorithm, blob, _ = _key()
        pins.remember(_target(0, worker), algorithm, blob, first_use=True)
    pins.settle()
    stale = host_alias(_target(0, 0))
    subprocess.run(["ssh-keygen", "-R", stale, "-f", str(path)], check=True, capture_output=True)
    assert set(KnownHostsFile(path).read()) == {host_alias(_target(0, 1))}


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_file_others_can_write_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("tpu.1-0 ssh-ed25519 AAAA0\n")
    path.chmod(mode)
    with pytest.raises(AuthError) as caught:
        KnownHostsFile(path).read()
    assert caught.value.exit_code == ExitCode.AUTH
    assert f"chmod 600 {path}" in (caught.value.hint or "")


def test_a_file_owned_by_another_user_or_not_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("")
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(AuthError, match="owned by uid 4242") as caught:
        KnownHostsFile(path).read()
    assert "chown" in (caught.value.hint or "")
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(AuthError, match="not a regular file"):
        KnownHostsFile(directory).read()


def test_first_use_pins_are_written_once_with_one_warning(tmp_path: Path) -> None:
    warnings: list[str] = []
    path = default_path(tmp_path)
    pins = HostKeyPins.load(path, "accept-new", warnings.append)
    keys = {(s, w): _key() for s in range(2) for w in range(2)}
    for (s, w), (algorithm, blob, _) in keys.items():
        pins.remember(_target(s, w), algorithm, blob, first_use=True)
    assert not path.exists()  # nothing written before settle
    pins.settle()
    pins.settle()  # nothing new: no second write, no second warning
    assert len(warnings) == 1, warnings
    assert "4 workers published no host key" in warnings[0]
    assert "0/0, 0/1, 1/0, 1/1" in warnings[0] and str(path) in warnings[0]
    assert "\n" not in warnings[0]
    # Key material is never printed: fingerprints at most.
    assert not any(blob in warnings[0] for _, blob, _ in keys.values())
    again = HostKeyPins.load(path, "yes")
    for (s, w), (algorithm, blob, _) in keys.items():
        assert [(p.algorithm, p.blob) for p in again.pinned(_target(s, w))] == [(algorithm, blob)]
    assert "trusted on first use" in path.read_text()


def test_a_published_key_refreshes_a_pin_silently(tmp_path: Path) -> None:
    warnings: list[str] = []
    path = tmp_path / "known_hosts"
    old_algorithm, old_blob, _ = _key()
    first = HostKeyPins.load(path, "accept-new", warnings.append)
    first.remember(_target(), old_algorithm, old_blob, first_use=True)
    first.settle()
    algorithm, blob, _ = _key()
    pins = HostKeyPins.load(path, "accept-new", warnings.append)
    pins.remember(_target(), algorithm, blob, first_use=False)
    assert [p.blob for p in pins.pinned(_target())] == [blob]  # at once, for this run
    pins.settle()
    assert len(warnings) == 1  # the first use only
    assert [p.blob for p in KnownHostsFile(path).read()[host_alias(_target())]] == [blob]
    assert "from guest attributes" in path.read_text()
    # The same key again changes nothing: no rewrite.
    before = path.stat().st_mtime_ns, path.stat().st_ino
    pins.remember(_target(), algorithm, blob, first_use=False)
    pins.settle()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_pins_that_cannot_be_written_are_said_for_this_run_only(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("a file\n")
    warnings: list[str] = []
    path = tmp_path / "not-a-dir" / ".ssh" / "tpuctl_known_hosts"
    pins = HostKeyPins.load(path, "accept-new", warnings.append)
    algorithm, blob, _ = _key()
    pins.remember(_target(1, 0), algorithm, blob, first_use=True)
    pins.settle()
    assert len(warnings) == 1 and "could not pin" in warnings[0]
    assert "for this run only (1/0)" in warnings[0]


def test_two_writers_keep_each_other_s_pins(tmp_path: Path) -> None:
    """Two tpuctl processes pinning at once (threads here: the lock is a file lock, taken
    per open file description, so it serializes threads as it does processes)."""
    path = tmp_path / "known_hosts"
    start = threading.Barrier(8)

    def pin(index: int) -> None:
        pins = HostKeyPins.load(path, "accept-new")
        algorithm, blob, _ = _key()
        pins.remember(_target(0, index), algorithm, blob, first_use=True)
        start.wait()
        pins.settle()

    threads = [threading.Thread(target=pin, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(KnownHostsFile(path).read()) == 8


def test_name_workers_orders_and_counts_the_rest() -> None:
    many = [_target(s, w) for s in (1, 0) for w in range(NAMED_WORKERS)]
    named = name_workers(many)
    assert named.startswith("0/0, 0/1, ") and named.endswith(f" and {NAMED_WORKERS} more")
