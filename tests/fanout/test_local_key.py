"""Problems with the local key (~/.ssh/google_compute_engine) are the user's to fix: exit 8 with
the fix in the hint, never an internal error, and a key is never quietly changed.

These run as root on the test machine, where file modes do not stop a read: each case is made
with what stops root too (HOME inside a regular file, a directory where the key should be, a
key owned by another uid, a read under `setpriv` without the capabilities that bypass modes).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import QR, Project
from tests.support import child_environment
from tpuctl.errors import AuthError, ExitCode
from tpuctl.fanout.keys import ensure_key

OTHER_UID = 4242  # nobody on the test machine owns this uid


def _home_inside_a_file(home: Path) -> Path:
    """HOME below a regular file: ~/.ssh cannot be created, whoever runs."""
    (home / "not-a-dir").write_text("a file\n")
    return home / "not-a-dir" / "home"


def _good_key(home: Path) -> Path:
    return ensure_key(home / ".ssh" / "google_compute_engine").path


def _key_readable_by_others(home: Path) -> Path:
    key = _good_key(home)
    key.chmod(0o644)
    return home


def _key_owned_by_another_user(home: Path) -> Path:
    key = _good_key(home)
    os.chown(key, OTHER_UID, -1)
    return home


def _key_is_a_directory(home: Path) -> Path:
    (home / ".ssh" / "google_compute_engine").mkdir(parents=True)
    return home


def _key_is_not_a_key(home: Path) -> Path:
    (home / ".ssh").mkdir(mode=0o700)
    key = home / ".ssh" / "google_compute_engine"
    key.write_text("this is not a private key\n")
    key.chmod(0o600)
    return home


def _key_has_a_passphrase(home: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (home / ".ssh").mkdir(mode=0o700)
    _key(home).write_bytes(pem)
    _key(home).chmod(0o600)
    return home


def _key(home: Path) -> Path:
    return home / ".ssh" / "google_compute_engine"


needs_chown = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving a file to another uid needs root (CAP_CHOWN)"
)

# (how HOME is made bad, what the message says, what the hint says): the hint is the fix.
CASES: dict[str, tuple[Callable[[Path], Path], str, Callable[[Path], str]]] = {
    "home inside a file": (
        _home_inside_a_file,
        "cannot create SSH key",
        lambda home: f"{home.parent} is not a directory",
    ),
    "key readable by others": (
        _key_readable_by_others,
        "are too open",
        lambda home: f"chmod 600 {_key(home)}",
    ),
    "key owned by another user": (
        _key_owned_by_another_user,
        f"is owned by uid {OTHER_UID}",
        lambda home: f"chown {pwd.getpwuid(os.geteuid()).pw_name} {_key(home)}",
    ),
    "key is a directory": (
        _key_is_a_directory,
        "is not a regular file",
        lambda home: f"mv {_key(home)} {_key(home)}.old",
    ),
    "key is not a key": (
        _key_is_not_a_key,
        "is not a private key tpuctl can read",
        lambda home: f"mv {_key(home)} {_key(home)}.old",
    ),
    "key has a passphrase": (
        _key_has_a_passphrase,
        "is protected by a passphrase",
        lambda home: f"mv {_key(home)} {_key(home)}.old",
    ),
}
PARAMS = [pytest.param(name, marks=needs_chown) if "owned" in name else name for name in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_a_key_problem_is_an_auth_error_with_the_fix(tmp_path: Path, case: str) -> None:
    make, message, hint = CASES[case]
    home = make(tmp_path)
    with pytest.raises(AuthError) as raised:
        ensure_key(_key(home))
    assert raised.value.exit_code == ExitCode.AUTH
    assert message in raised.value.message
    assert raised.value.hint is not None and hint(home) in raised.value.hint


def test_a_key_readable_by_others_is_refused_not_changed(tmp_path: Path) -> None:
    """As OpenSSH does: the user decides to chmod it; tpuctl does not do it behind their back."""
    _key_readable_by_others(tmp_path)
    with pytest.raises(AuthError):
        ensure_key(_key(tmp_path))
    assert stat.S_IMODE(_key(tmp_path).stat().st_mode) == 0o644
    for loose in (0o640, 0o604, 0o660):
        _key(tmp_path).chmod(loose)
        with pytest.raises(AuthError, match=f"permissions {loose:04o}"):
            ensure_key(_key(tmp_path))
    _key(tmp_path).chmod(0o400)  # read-only for its owner is fine, as for OpenSSH
    assert ensure_key(_key(tmp_path)).path == _key(tmp_path)


SETPRIV = shutil.which("setpriv")
# Root, minus the capabilities that let it read any file whatever its mode.
AS_PLAIN_USER = (
    [SETPRIV, "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
)


@pytest.mark.skipif(
    os.geteuid() == 0 and SETPRIV is None, reason="root reads any file; setpriv is missing"
)
def test_a_key_its_owner_cannot_read_says_chmod(tmp_path: Path) -> None:
    """Owned by the user, 0000: a read that fails (EACCES), in a process that modes bind."""
    key = _good_key(tmp_path)
    key.chmod(0o000)
    probe = (
        "import sys; from pathlib import Path\n"
        "from tpuctl.errors import AuthError\n"
        "from tpuctl.fanout.keys import ensure_key\n"
        "try:\n    ensure_key(Path(sys.argv[1]))\n"
        "except AuthError as error:\n    print(error.message); print(error.hint); sys.exit(8)\n"
    )
    done = subprocess.run(
        [*AS_PLAIN_USER, sys.executable, "-c", probe, str(key)],
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 8, done.stderr
    message, hint = done.stdout.splitlines()[:2]
    assert "cannot read SSH key" in message and "Permission denied" in message
    assert f"chmod 600 {key}" in hint


# ----------------------------------------------------------------------- through tpuctl


@pytest.mark.parametrize("case", PARAMS)
def test_tpuctl_ssh_exits_8_with_the_fix_and_no_internal_error(
    tpuctl: Project, qr: QR, tmp_path: Path, case: str
) -> None:
    make, message, hint = CASES[case]
    home = tmp_path / "elsewhere"  # not the fixture's HOME, which holds a working key
    home.mkdir()
    home = make(home)
    out = tpuctl("ssh", qr.name, "--", "true", env={"HOME": str(home)})
    assert out.exit_code == 8, out.stderr
    assert "internal error" not in out.stderr
    assert message in out.stderr and hint(home) in out.stderr
    as_json = tpuctl("ssh", qr.name, "--format", "json", "--", "true", env={"HOME": str(home)})
    error = as_json.json()["error"]
    assert error["kind"] == "auth" and error["exit_code"] == 8 and hint(home) in error["hint"]
