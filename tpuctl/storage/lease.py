"""The lease that lets one `tpuctl up` babysit a run at a time, from any machine.

A small JSON object next to the run's journal (`<checkpoint.dir>/tpuctl/<run>/lease.json`, or,
without checkpoint.dir, a file in this user's state directory, which guards this machine only)
names the holder (host, pid, command, a random id) and its last heartbeat. `acquire` creates
it exclusively; a lease whose heartbeat is older than `stale_after` is taken over (its holder
died without letting go); `renew` rewrites the heartbeat only if the lease is still ours, and
`release` removes it only if it is. A holder on this machine whose process is gone (killed) is
stale at once. Every change is a compare-and-swap on the object (its
generation on Cloud Storage, an flock-guarded check on a local disk), so two processes can
never both believe they hold it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.clock import Clock, format_duration, parse_rfc3339, rfc3339
from tpuctl.errors import TpuctlError, quoted

if TYPE_CHECKING:
    from tpuctl.storage.storage import Storage

RENEW_EVERY = 30.0  # seconds between heartbeats
STALE_AFTER = 180.0  # a heartbeat older than this is a holder that died
FORMAT_VERSION = 1


class LeaseHeld(TpuctlError):
    """Another `tpuctl up` holds the run's lease (and is alive)."""

    kind = "lease_held"


class LeaseLost(TpuctlError):
    """Our lease was taken over (we looked dead to another `tpuctl up`)."""

    kind = "lease_lost"


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, and since when."""

    id: str
    host: str
    pid: int
    command: str
    started: datetime | None
    heartbeat: datetime | None
    # How long after its last heartbeat the holder counts as dead, as it declared it (a
    # reconcile step: its own deadline; `up`: three minutes). None: the reader's own.
    stale_after: float | None = None

    @classmethod
    def parse(cls, text: str) -> Holder:
        try:
            data: dict[str, Any] = json.loads(text)
        except ValueError:
            data = {}
        return cls(
            id=str(data.get("id") or ""),
            host=str(data.get("host") or "?"),
            pid=int(data.get("pid") or 0),
            command=str(data.get("command") or "?"),
            started=parse_rfc3339(data.get("started")),
            heartbeat=parse_rfc3339(data.get("heartbeat")),
            stale_after=_seconds(data.get("stale_after")),
        )

    def describe(self, now: datetime) -> str:
        if self.heartbeat is None:
            beat = "no heartbeat"
        else:
            age = round(max(0.0, (now - self.heartbeat).total_seconds()))
            beat = "last heartbeat " + ("just now" if age < 1 else f"{format_duration(age)} ago")
        return f"{quoted(self.command)} on {self.host} (pid {self.pid}), {beat}"


class Lease:
    """One run's lease as seen by one process (see the module doc)."""

    def __init__(
        self,
        storage: Storage,
        path: str,
        *,
        command: str,
        clock: Clock | None = None,
        stale_after: float = STALE_AFTER,
        hostname: str | None = None,
    ) -> None:
        self.storage = storage
        self.path = path
        self.where = storage.child_url(path)
        self.command = command
        self.clock = clock or Clock()
        self.stale_after = stale_after
        # Three heartbeats fit in the time after which others take the lease over.
        self.renew_every = min(RENEW_EVERY, stale_after / 3)
        self.id = uuid.uuid4().hex
        self.host = hostname or socket.gethostname()
        self.started = self.clock.now()
        self._version: str | None = None
        self._next_renew = 0.0

    @property
    def held(self) -> bool:
        return self._version is not None

    def _text(self) -> str:
        document = {
            "version": FORMAT_VERSION,
            "id": self.id,
            "host": self.host,
            "pid": os.getpid(),
            "command": self.command,
            "started": rfc3339(self.started),
            "heartbeat": rfc3339(self.clock.now()),
            "stale_after": self.stale_after,
        }
        return json.dumps(document, sort_keys=True) + "\n"

    def _stale(self, holder: Holder) -> bool:
        if holder.heartbeat is None:
            return True
        if holder.host == self.host and holder.pid and not _tpuctl_alive(holder.pid):
            return True  # its process on this machine is gone (killed): no need to wait
        limit = holder.stale_after if holder.stale_after is not None else self.stale_after
        return (self.clock.now() - holder.heartbeat).total_seconds() > limit

    def acquire(
        self, *, wait: bool = False, on_wait: Callable[[Holder], None] | None = None
    ) -> Holder | None:
        """Take the lease; returns the stale holder it was taken over from, if any. Held by a
        live holder: LeaseHeld, or with `wait`, wait (telling `on_wait`) until it is free."""
        while True:
            if self.storage.write_text(self.path, self._text(), exclusive=True):
                return self._took(None)
            found = self.storage.read_versioned(self.path)
            if found is None:
                continue  # released meanwhile: try again
            text, version = found
            holder = Holder.parse(text)
            if self._stale(holder):
                if self.storage.replace_if(self.path, version, self._text()):
                    return self._took(holder)
                continue  # someone else changed it first: look again
            if not wait:
                raise LeaseHeld(
                    f"another supervisor holds this run: {holder.describe(self.clock.now())}",
                    hint="let it be, stop it first, or pass --wait-for-lease to take over "
                    f"when it ends (the lease is {self.where})",
                    holder=holder.host,
                    pid=holder.pid,
                    lease=self.where,
                )
            if on_wait is not None:
                on_wait(holder)
            self.clock.sleep(RENEW_EVERY / 2)

    def _took(self, previous: Holder | None) -> Holder | None:
        found = self.storage.read_versioned(self.path)
        if found is None or Holder.parse(found[0]).id != self.id:
            raise LeaseLost(f"lost the lease {self.where} as soon as it was taken")
        self._version = found[1]
        self._next_renew = self.clock.monotonic() + self.renew_every
        return previous

    def renew_if_due(self) -> None:
        """Rewrite the heartbeat when `renew_every` has passed; LeaseLost if it is not ours."""
        if self._version is None or self.clock.monotonic() < self._next_renew:
            return
        if not self.storage.replace_if(self.path, self._version, self._text()):
            found = self.storage.read_versioned(self.path)
            holder = Holder.parse(found[0]) if found else None
            self._version = None
            who = holder.describe(self.clock.now()) if holder else "nobody (it was removed)"
            raise LeaseLost(
                f"the lease {self.where} was taken over by {who}; stopping (nothing deleted)",
                hint="only one tpuctl up may babysit a run",
            )
        found = self.storage.read_versioned(self.path)
        self._version = found[1] if found else None
        self._next_renew = self.clock.monotonic() + self.renew_every

    def release(self) -> None:
        """Let go (only if it is still ours); never raises."""
        if self._version is None:
            return
        version, self._version = self._version, None
        # On failure the heartbeat goes stale, and the next up takes over.
        with contextlib.suppress(TpuctlError):
            self.storage.delete_if(self.path, version)


class LeaseKeeper:
    """Keeps a held lease's heartbeat going from a thread while its holder works, so one long
    action (a delivery to 1,024 workers) does not let it go stale. A killed process's keeper
    dies with it: its lease goes stale after its `stale_after`. Past `until` (monotonic) the
    keeper stops renewing, so a holder that hangs loses the lease too. `check()` raises
    LeaseLost once another holder took it over."""

    def __init__(self, lease: Lease, *, until: float | None = None) -> None:
        import threading

        self.lease = lease
        self.until = until
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="tpuctl-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def _beat(self) -> None:
        import time

        while not self._stop.wait(max(0.05, self.lease.renew_every / 2)):
            if self.until is not None and time.monotonic() > self.until:
                return
            try:
                self.lease.renew_if_due()
            except LeaseLost as lost:
                self.lost = lost
                return
            except TpuctlError:
                continue  # storage did not answer: the next beat tries again


def _tpuctl_alive(pid: int) -> bool:
    """Whether process `pid` on this machine lives and is a tpuctl (a pid reused by another
    program is not the holder)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"tpuctl" in handle.read()
    except OSError:
        return True  # no /proc to look in: trust the heartbeat alone


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def local_lease_storage(project: str, zone: str) -> Storage:
    """Without checkpoint.dir: this user's state directory (it guards this machine only)."""
    from tpuctl.storage.storage import LocalStorage

    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return LocalStorage(Path(base) / "tpuctl" / "leases" / project / zone)


def path_of(url: str) -> tuple[Storage, str]:
    """The storage of a lease URL's directory and the file's name in it."""
    from tpuctl.storage.locations import open_location

    directory, _, name = url.rstrip("/").rpartition("/")
    return open_location(directory), name
