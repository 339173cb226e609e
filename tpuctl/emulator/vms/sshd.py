"""What the two SSH servers share: users and keys from `ssh-keys`, host keys, sftp-server.

The servers: sshd_asyncssh.py (in-process, the default) and sshd_openssh.py (a real sshd).
"""

from __future__ import annotations

import errno
import re

import asyncssh

_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
# Read as `sshd.SFTP_SERVER` when a session or a config needs it, so tests can point it away.
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def valid_user(user: str) -> bool:
    return bool(_USER_RE.match(user)) and user not in (".", "..")


def parse_ssh_keys(text: str) -> dict[str, list[str]]:
    """`ssh-keys` metadata → {user: [public key lines]}; malformed lines are skipped."""
    keys: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        user, sep, key = line.partition(":")
        if not sep or not valid_user(user) or not key.strip():
            continue
        try:
            asyncssh.import_authorized_keys(key.strip())
        except (asyncssh.KeyImportError, ValueError):
            continue
        keys.setdefault(user, []).append(key.strip())
    return keys


def authorized_keys(lines: list[str]) -> asyncssh.SSHAuthorizedKeys:
    return asyncssh.import_authorized_keys("\n".join(lines) + "\n")


def generate_host_key() -> tuple[asyncssh.SSHKey, str]:
    """A fresh ed25519 host key and its public line "ssh-ed25519 AAAA…"."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key("openssh").decode().split()
    return key, f"{public[0]} {public[1]}"


def is_address_in_use(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
