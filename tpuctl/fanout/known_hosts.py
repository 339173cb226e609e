"""tpuctl's own known-hosts file: worker host keys pinned per TPU node id and worker, trusted on
first use when a worker publishes none in its guest attributes, kept 0600 and written atomically.

The file is in OpenSSH's known_hosts format, one `tpu.<node id>-<worker> <algorithm> <base64>`
line per worker (gcloud pins TPU VMs under the same alias in google_compute_known_hosts), so
`ssh-keygen -R ALIAS -f FILE` forgets a pin. The alias holds the node's unique numeric id (the
TPU API's Node.id), not its name: a node deleted and created again under the same name is a new
host to pin, never a "changed key" alarm.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shlex
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tpuctl.errors import AuthError
from tpuctl.fanout.targets import WorkerTarget
from tpuctl.files import locked, write_atomic

KNOWN_HOSTS_NAME = "tpuctl_known_hosts"
# --strict-host-key-checking, as OpenSSH's StrictHostKeyChecking: `yes` trusts only keys
# published in guest attributes or already pinned, `accept-new` also pins a key on first use
# when the worker publishes none, `no` checks nothing.
Checking = Literal["yes", "accept-new", "no"]
CHECKING_MODES: tuple[Checking, ...] = ("yes", "accept-new", "no")
HEADER = (
    "# tpuctl: worker host keys pinned per TPU node id and worker (OpenSSH known_hosts format).",
    "# Forget one with: ssh-keygen -R tpu.<node id>-<worker> -f <this file>",
)
FIRST_USE = "trusted on first use"
PUBLISHED = "from guest attributes"
NAMED_WORKERS = 16  # a warning names this many workers, then counts the rest

Warn = Callable[[str], None]


def default_path(home: Path | None = None) -> Path:
    """~/.ssh/tpuctl_known_hosts, beside gcloud's key and known hosts."""
    base = home if home is not None else Path(os.path.expanduser("~"))
    return base / ".ssh" / KNOWN_HOSTS_NAME


def host_alias(target: WorkerTarget) -> str:
    """`tpu.<node id>-<worker>`, gcloud's alias for a TPU VM (the node's name when the API gave
    no numeric id)."""
    return f"tpu.{target.node_uid or target.node_id}-{target.worker}"


def fingerprint(blob: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 public key blob: the only key material tpuctl
    ever shows."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raw = blob.encode()
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def same_key(first: tuple[str, str], second: tuple[str, str]) -> bool:
    """Whether two (algorithm, base64 blob) pairs are one key: rsa-sha2-256/512 name the
    signature algorithm of an ssh-rsa key."""
    return _key_type(first[0]) == _key_type(second[0]) and first[1] == second[1]


def _key_type(name: str) -> str:
    return "ssh-rsa" if name.startswith("rsa-sha2-") else name


def forget_command(alias: str, path: Path) -> str:
    return f"ssh-keygen -R {shlex.quote(alias)} -f {shlex.quote(str(path))}"


@dataclass(frozen=True)
class Pin:
    """One pinned key of a host; `line` is its 1-based line in the file (0: not written yet)."""

    alias: str
    algorithm: str
    blob: str
    line: int = 0


def parse(text: str) -> dict[str, list[Pin]]:
    """Pins by host from known_hosts text. Comments, markers (@revoked, @cert-authority),
    hashed hosts and malformed lines pin nothing (and are kept as they are on rewrite)."""
    pins: dict[str, list[Pin]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@", "|")):
            continue
        for host in fields[0].split(","):
            pins.setdefault(host, []).append(Pin(host, fields[1], fields[2], number))
    return pins


def merge(current: Sequence[str], lines: Mapping[str, str]) -> list[str]:
    """`current` lines with each alias of `lines` set to its new line: in place of the alias's
    first line (its other lines dropped), or appended. Every other line stays as it was."""
    written: set[str] = set()
    merged: list[str] = []
    for raw in current:
        fields = raw.split()
        alias = fields[0] if len(fields) >= 3 else ""
        if alias in lines:
            if alias not in written:
                merged.append(lines[alias])
                written.add(alias)
            continue
        merged.append(raw)
    merged.extend(line for alias, line in lines.items() if alias not in written)
    return merged


class KnownHostsFile:
    """The file on disk: read with OpenSSH-like checks, rewritten whole and atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, list[Pin]]:
        """The pins in the file ({} when there is none). Refuses (AuthError, exit 8) a file
        that someone else could write: whoever can add a line can make tpuctl trust them."""
        try:
            status = os.stat(self.path)
            _check(self.path, status)
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):  # nothing pinned (yet)
            return {}
        except OSError as error:
            raise AuthError(
                f"cannot read tpuctl's known hosts {self.path}: {error.strerror or error}",
                hint=f"chmod 600 {shlex.quote(str(self.path))}",
                key=str(self.path),
            ) from None
        return parse(text)

    def write(self, lines: Mapping[str, str]) -> None:
        """Set each alias's line, re-reading the file under a lock so that pins another tpuctl
        wrote meanwhile are kept, and replace the file in one rename (0600, fsynced)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with locked(self.path):
            try:
                current = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
            except FileNotFoundError:
                current = list(HEADER)
            text = "".join(line + "\n" for line in merge(current, lines))
            write_atomic(self.path, text, mode=0o600)


def _check(path: Path, status: os.stat_result) -> None:
    quoted = shlex.quote(str(path))
    if not stat.S_ISREG(status.st_mode):
        raise AuthError(f"tpuctl's known hosts {path} is not a regular file", key=str(path))
    if status.st_uid != os.geteuid():
        raise AuthError(
            f"tpuctl's known hosts {path} is owned by uid {status.st_uid}, not by you; "
            "whoever owns it can make tpuctl trust any host",
            hint=f"check its pins, then sudo chown {os.geteuid()} {quoted}",
            key=str(path),
        )
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o022:
        raise AuthError(
            f"permissions {mode:04o} for tpuctl's known hosts {path} are too open: group or "
            "others may write it, and so make tpuctl trust any host",
            hint=f"check its pins, then chmod 600 {quoted}",
            key=str(path),
        )


class HostKeyPins:
    """The pins one fleet checks against and learns, shared by its connections (thread-safe).

    A connection reads `pinned(target)` and tells `remember()` what it verified; `settle()`
    writes what was learned in one atomic rewrite and says once which workers were trusted
    on first use.
    """

    def __init__(
        self,
        file: KnownHostsFile,
        checking: Checking,
        pins: dict[str, list[Pin]] | None = None,
        on_warning: Warn | None = None,
    ) -> None:
        self.file = file
        self.checking = checking
        self._pins = dict(pins or {})
        self._warn = on_warning or (lambda _message: None)
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[WorkerTarget, str]] = {}  # alias → (worker, its line)
        self._first_use: list[WorkerTarget] = []

    @classmethod
    def load(cls, path: Path, checking: Checking, on_warning: Warn | None = None) -> HostKeyPins:
        file = KnownHostsFile(path)
        return cls(file, checking, file.read(), on_warning)

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def accepts_new(self) -> bool:
        return self.checking == "accept-new"

    def pinned(self, target: WorkerTarget) -> list[Pin]:
        with self._lock:
            return list(self._pins.get(host_alias(target), ()))

    def remember(self, target: WorkerTarget, algorithm: str, blob: str, *, first_use: bool) -> None:
        """Pin the key `target` presented (verified against its guest attributes, or trusted
        on `first_use`); at once for this run, in the file at `settle()`."""
        alias = host_alias(target)
        with self._lock:
            if any(
                same_key((p.algorithm, p.blob), (algorithm, blob))
                for p in self._pins.get(alias, ())
            ):
                return
            self._pins[alias] = [Pin(alias, algorithm, blob)]
            source = FIRST_USE if first_use else PUBLISHED
            comment = f"{target.node_id} worker {target.worker}, {source}"
            self._pending[alias] = (target, f"{alias} {algorithm} {blob} {comment}")
            if first_use:
                self._first_use.append(target)

    def settle(self) -> None:
        """Write the pins learned since the last call, then one warning naming the workers
        trusted on first use. Never raises: a pin that cannot be written is said instead."""
        with self._lock:
            pending, self._pending = self._pending, {}
            trusted, self._first_use = self._first_use, []
        if not pending:
            return
        ordered = sorted(pending.items(), key=lambda item: _order(item[1][0]))
        try:
            self.file.write({alias: line for alias, (_target, line) in ordered})
        except OSError as error:
            if trusted:
                self._warn(
                    f"could not pin host keys in {self.path} ({error.strerror or error}): "
                    f"{_count(trusted)} trusted on first use for this run only "
                    f"({name_workers(trusted)})"
                )
            return
        if trusted:
            self._warn(
                f"{_count(trusted)} published no host key in guest attributes: trusted the "
                f"key each presented on first use and pinned it in {self.path} "
                f"({name_workers(trusted)}); a changed key will be refused"
            )


def _count(targets: Sequence[WorkerTarget]) -> str:
    return f"{len(targets)} worker{'s' if len(targets) != 1 else ''}"


def _order(target: WorkerTarget) -> tuple[int, int]:
    return target.slice_index, target.worker


def name_workers(targets: Sequence[WorkerTarget]) -> str:
    """`0/0, 0/1, 1/0` in slice/worker order, the first NAMED_WORKERS and a count of the rest."""
    ordered = sorted(targets, key=_order)
    named = ", ".join(target.label for target in ordered[:NAMED_WORKERS])
    rest = len(ordered) - NAMED_WORKERS
    return named + (f" and {rest} more" if rest > 0 else "")
