"""Who may log in to an emulated TPU VM, as Cloud TPU decides it: project metadata (Compute's
commonInstanceMetadata, where `enable-oslogin` usually lives) and the OS Login API's keys.

A node uses OS Login when its own metadata says `enable-oslogin: TRUE`, or says nothing and
its project's metadata says TRUE (a node's FALSE wins over the project's TRUE, as on Compute
Engine). Its SSH servers then accept only the keys imported through the OS Login API for the
POSIX user logging in, unexpired, and never the `ssh-keys` metadata.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field

# Google derives a user's POSIX name from their email (alice@example.com → alice_example_com)
# and a service account's from its unique id (sa_<digits>); the emulator does the same.
_NOT_POSIX = re.compile(r"[^a-z0-9_]")
POSIX_MAX = 32


def posix_username(email: str) -> str:
    email = email.strip().lower()
    if email.endswith(".gserviceaccount.com"):
        digits = int(hashlib.sha256(email.encode()).hexdigest(), 16) % 10**21
        return f"sa_{digits:021d}"
    return _NOT_POSIX.sub("_", email.replace("@", "_"))[:POSIX_MAX]


def truthy(value: str | None) -> bool | None:
    """`enable-oslogin`'s value as Compute Engine reads it; None when unset."""
    if value is None or not value.strip():
        return None
    return value.strip().upper() in ("TRUE", "1", "YES")


@dataclass
class ImportedKey:
    key: str  # "ssh-ed25519 AAAA… comment"
    fingerprint: str
    expires_usec: int  # 0: never


@dataclass
class Profile:
    email: str
    username: str
    keys: dict[str, ImportedKey] = field(default_factory=dict)  # fingerprint → key


class Access:
    """Project metadata and OS Login accounts for the whole emulator (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._projects: dict[str, dict[str, str]] = {}
        self._profiles: dict[str, Profile] = {}  # email → profile

    # ----------------------------------------------------------------- project metadata
    def project_metadata(self, project: str) -> dict[str, str]:
        with self._lock:
            return dict(self._projects.get(project, {}))

    def set_project_metadata(self, project: str, items: dict[str, str | None]) -> dict[str, str]:
        """Set (or with None remove) keys of a project's common instance metadata."""
        with self._lock:
            current = self._projects.setdefault(project, {})
            for key, value in items.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            return dict(current)

    def os_login(self, project: str, node_metadata: dict[str, str]) -> bool:
        node = truthy(node_metadata.get("enable-oslogin"))
        if node is not None:
            return node
        return bool(truthy(self.project_metadata(project).get("enable-oslogin")))

    # ----------------------------------------------------------------------- OS Login
    def import_key(self, email: str, key: str, expires_usec: int) -> Profile:
        fingerprint = hashlib.sha256(key.split()[1].encode()).hexdigest() if key.split() else ""
        with self._lock:
            profile = self._profiles.setdefault(email, Profile(email, posix_username(email)))
            profile.keys[fingerprint] = ImportedKey(key.strip(), fingerprint, expires_usec)
            return _copy(profile)

    def profile(self, email: str) -> Profile:
        with self._lock:
            profile = self._profiles.setdefault(email, Profile(email, posix_username(email)))
            return _copy(profile)

    def delete_key(self, email: str, fingerprint: str) -> bool:
        with self._lock:
            profile = self._profiles.get(email)
            return profile is not None and profile.keys.pop(fingerprint, None) is not None

    def oslogin_keys(self, username: str) -> list[str]:
        """The unexpired keys of the account whose POSIX name is `username`."""
        now = int(time.time() * 1_000_000)
        with self._lock:
            for profile in self._profiles.values():
                if profile.username == username:
                    return [
                        item.key
                        for item in profile.keys.values()
                        if item.expires_usec == 0 or item.expires_usec > now
                    ]
        return []


def _copy(profile: Profile) -> Profile:
    return Profile(profile.email, profile.username, dict(profile.keys))
