"""SSH keys the way gcloud handles them: ~/.ssh/google_compute_engine, published in `ssh-keys`."""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.errors import AuthError, TpuctlError, UsageError

if TYPE_CHECKING:
    import paramiko

    from tpuctl.cloud.client import TpuApi

KEY_NAME = "google_compute_engine"
SSH_KEYS = "ssh-keys"
OS_LOGIN = "enable-oslogin"
PUBLISH_ATTEMPTS = 6
PUBLISH_TIMEOUT = 120.0


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


# ----------------------------------------------------------------------------- publishing


def has_key(ssh_keys: str, user: str, key: LocalKey) -> bool:
    for raw in ssh_keys.splitlines():
        owner, sep, rest = raw.strip().partition(":")
        words = rest.split()
        if sep and owner == user and len(words) >= 2 and words[1] == key.blob:
            return True
    return False


def os_login_enabled(metadata: Any) -> bool:
    return str(dict(metadata).get(OS_LOGIN, "")).strip().lower() in ("true", "1", "yes")


def publish_key(
    api: TpuApi,
    node_names: list[str],
    user: str,
    key: LocalKey,
    *,
    on_progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Add `user:key` to each node's `ssh-keys` metadata when it is absent (UpdateNode with
    update_mask=metadata, waiting for the operation). A concurrent update (ABORTED or 409)
    is retried from a fresh read. Returns the nodes that were updated.

    OS Login is not supported: a node with `enable-oslogin: TRUE` is an AuthError.
    """
    updated: list[str] = []
    for name in node_names:
        if _publish_one(api, name, user, key):
            updated.append(name)
            if on_progress is not None:
                on_progress(f"published {user}'s key {key.path}.pub to {name.rsplit('/', 1)[-1]}")
    return updated


def _publish_one(api: TpuApi, name: str, user: str, key: LocalKey) -> bool:
    from google.api_core import exceptions as api_exceptions

    from tpuctl.cloud.client import api_errors, make_retry

    for attempt in range(PUBLISH_ATTEMPTS):
        node = api.get_node(name)
        if node is None:
            raise TpuctlError(f"node {name} disappeared while publishing the SSH key")
        if os_login_enabled(node.metadata):
            raise AuthError(
                f"node {name.rsplit('/', 1)[-1]} has enable-oslogin: TRUE; tpuctl does not "
                "support OS Login yet (it publishes keys in the node's ssh-keys metadata)",
                hint="turn OS Login off for the node's project or metadata, or use "
                "gcloud compute tpus queued-resources ssh",
                resource=name,
            )
        existing = str(dict(node.metadata).get(SSH_KEYS, ""))
        if has_key(existing, user, key):
            return False
        metadata = dict(node.metadata)
        lines = [line for line in existing.splitlines() if line.strip()]
        metadata[SSH_KEYS] = "\n".join([*lines, key.metadata_line(user)])
        request = {
            "node": {"name": name, "metadata": metadata},
            "update_mask": {"paths": ["metadata"]},
        }
        try:
            with api_errors("update metadata of", name):
                try:
                    operation = api.client.update_node(
                        request=request,
                        retry=make_retry(total_seconds=api.retry_total, reads=False),
                        timeout=api.rpc_timeout,
                    )
                    operation.result(timeout=PUBLISH_TIMEOUT)
                except (api_exceptions.Aborted, api_exceptions.Conflict):
                    raise _ConcurrentUpdate from None
        except _ConcurrentUpdate:
            time.sleep(min(0.2 * 2**attempt, 3.0))
            continue
        return True
    raise TpuctlError(
        f"could not add the SSH key to {name}: its metadata kept changing underneath",
        hint="retry in a minute",
        resource=name,
    )


class _ConcurrentUpdate(Exception):
    pass


def check_user(user: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", user):
        raise UsageError(f"{user!r} is not a valid login name for ssh-keys metadata")
    return user
