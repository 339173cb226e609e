"""The local SSH key the way gcloud keeps it: ~/.ssh/google_compute_engine, created 0600, and
refused as OpenSSH refuses it when it is not the user's alone."""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shlex
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import AuthError, UsageError, quoted
from tpuctl.fanout.imports import load_paramiko

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
    (private file 0600, directory 0700) when there is none.

    A key that is not the user's alone is refused as OpenSSH refuses it (owned by someone
    else, or readable by group or others), with the command that fixes it; tpuctl never
    changes the modes of an existing key. Every problem with the files is an AuthError (exit
    8) that says what to do.
    """
    private = path or key_path()
    public = private.with_name(private.name + ".pub")
    created = False
    if not private.exists():
        try:
            _generate(private, public)
        except OSError as error:
            raise _cannot_create("SSH key", private, error) from None
        created = True
    _check_private(private)
    pkey = _load(private)
    line = f"{pkey.get_name()} {pkey.get_base64()}"
    if not public.exists():
        try:
            _write_public(public, line)
        except OSError as error:
            raise _cannot_create("the public key", public, error) from None
    return LocalKey(private, line, pkey, created)


def _load(private: Path) -> paramiko.PKey:
    load_paramiko()
    import paramiko

    try:
        return paramiko.PKey.from_path(private)
    except OSError as error:
        raise AuthError(
            f"cannot read SSH key {private}: {error.strerror or error}",
            hint=f"chmod 600 {shlex.quote(str(private))}",
            key=str(private),
        ) from None
    except (paramiko.PasswordRequiredException, TypeError) as error:
        # cryptography says "Key is password-protected" with a TypeError (OpenSSH format).
        if isinstance(error, TypeError) and "password" not in str(error):
            raise
        raise AuthError(
            f"SSH key {private} is protected by a passphrase, which tpuctl cannot use",
            hint=_move_away(private),
            key=str(private),
        ) from None
    except (paramiko.SSHException, ValueError) as error:
        raise AuthError(
            f"SSH key {private} is not a private key tpuctl can read ({error})",
            hint=_move_away(private),
            key=str(private),
        ) from None


def _cannot_create(what: str, path: Path, error: OSError) -> AuthError:
    return AuthError(
        f"cannot create {what} {path}: {error.strerror or error}",
        hint=f"{_blocker(path)}; point HOME at a directory you can write",
        key=str(path),
    )


def _check_private(private: Path) -> None:
    """OpenSSH's rules for a private key file: a regular file, the user's, 0600 or stricter."""
    status = private.stat()
    quoted = shlex.quote(str(private))
    if not stat.S_ISREG(status.st_mode):
        raise AuthError(
            f"SSH key {private} is not a regular file", hint=_move_away(private), key=str(private)
        )
    me = os.geteuid()
    if status.st_uid != me:
        raise AuthError(
            f"SSH key {private} is owned by uid {status.st_uid}, not by you ({_login(me)}, "
            f"uid {me}), and OpenSSH refuses such a key too",
            hint=f"sudo chown {_login(me)} {quoted}, or {_move_away(private)}",
            key=str(private),
        )
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise AuthError(
            f"permissions {mode:04o} for SSH key {private} are too open: group or others may "
            "read it, and OpenSSH refuses such a key too",
            hint=f"run chmod 600 {quoted}",
            key=str(private),
        )


def _login(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _move_away(private: Path) -> str:
    quoted = shlex.quote(str(private))
    return f"move it away (mv {quoted} {quoted}.old) to let tpuctl create a new one"


def _blocker(path: Path) -> str:
    """What stops `path` from being created: its nearest existing ancestor, which is not a
    directory or cannot be written."""
    for ancestor in path.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                return f"{ancestor} is not a directory"
            if not os.access(ancestor, os.W_OK | os.X_OK):
                return f"{ancestor} is not writable"
            return f"{path} cannot be created in {ancestor}"
    return f"no directory above {path} exists"


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
        raise UsageError(f"{quoted(user)} is not a valid login name for ssh-keys metadata")
    return user
