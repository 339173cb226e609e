"""The local SSH key the way gcloud keeps it: ~/.ssh/google_compute_engine, created 0600."""

from __future__ import annotations

import getpass
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import AuthError, UsageError

if TYPE_CHECKING:
    import paramiko

KEY_NAME = "google_compute_engine"


@dataclass(frozen=True)
class LocalKey:
    """The user's key pair: the private key loaded once (paramiko PKey) and the public line."""

    path: Path
    public_line: str  # "ssh-ed25519 AAAA… comment"
    pkey: paramiko.PKey
    created: bool

    @property
    def algorithm(self) -> str:
        return self.public_line.split()[0]

    @property
    def blob(self) -> str:
        return self.public_line.split()[1]

    def metadata_line(self, user: str) -> str:
        """`user:ssh-ed25519 AAAA… user`, the line gcloud adds to `ssh-keys`."""
        return f"{user}:{self.algorithm} {self.blob} {user}"


def default_user(flag: str | None = None) -> str:
    """`--user` > $USER > the login name."""
    if flag:
        return flag
    return os.environ.get("USER") or getpass.getuser()


def key_path(home: Path | None = None) -> Path:
    base = home if home is not None else Path(os.path.expanduser("~"))
    return base / ".ssh" / KEY_NAME


def ensure_key(path: Path | None = None) -> LocalKey:
    """Load the key at `path` (default ~/.ssh/google_compute_engine), creating an ed25519 pair
    (private file 0600, directory 0700) when there is none."""
    import paramiko

    private = path or key_path()
    public = private.with_name(private.name + ".pub")
    created = False
    if not private.exists():
        _generate(private, public)
        created = True
    try:
        pkey = paramiko.PKey.from_path(private)
    except (paramiko.SSHException, OSError, ValueError) as error:
        raise AuthError(
            f"cannot load SSH key {private}: {error}",
            hint="an encrypted key is not supported; move it away to let tpuctl create one",
        ) from None
    if private.stat().st_mode & 0o077:
        private.chmod(0o600)
    line = f"{pkey.get_name()} {pkey.get_base64()}"
    if not public.exists():
        _write_public(public, line)
    return LocalKey(private, line, pkey, created)


def _generate(private: Path, public: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private.parent.chmod(0o700)
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    line = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    # O_EXCL + 0600 at creation: the private key is never readable by others, not even briefly.
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    _write_public(public, line)


def _write_public(public: Path, line: str) -> None:
    comment = f"{default_user()}@{socket.gethostname()}"
    public.write_text(f"{line.split(maxsplit=1)[0]} {line.split()[1]} {comment}\n")
    public.chmod(0o644)


def check_user(user: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", user):
        raise UsageError(f"{user!r} is not a valid login name for ssh-keys metadata")
    return user
