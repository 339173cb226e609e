"""A crash point before every side effect of a reconcile step, for the tests that kill a step
between any two of its actions.

Read only by tests (never set them otherwise):
- `TPUCTL_TEST_KILL_AT=N` makes the process SIGKILL itself at the Nth crash point it reaches,
  before that side effect happens: a test that runs a step once for every N proves that the
  next step, from any machine, converges from wherever the killed one stopped;
- `TPUCTL_TEST_KILL_ON=NAME` does the same at the first point named NAME (e.g. `create
  us-central2-b`, `journal qr.created`, `start the job`);
- `TPUCTL_TEST_KILL_NEW=PATH` does the same at the first point whose name the file does not
  list yet (and lists it): a run driven by one step process after another is killed once at
  every kind of point it passes;
- `TPUCTL_TEST_KILL_LOG=PATH` appends, for every point reached, a line naming it.
"""

from __future__ import annotations

import os
import signal
import threading

KILL_AT = "TPUCTL_TEST_KILL_AT"
KILL_ON = "TPUCTL_TEST_KILL_ON"
KILL_NEW = "TPUCTL_TEST_KILL_NEW"
KILL_LOG = "TPUCTL_TEST_KILL_LOG"

_lock = threading.Lock()
_reached = 0


def point(what: str) -> None:
    """Called right before a side effect named `what` (an API call, a storage write, an SSH
    command)."""
    target, named, log = os.environ.get(KILL_AT), os.environ.get(KILL_ON), os.environ.get(KILL_LOG)
    new = os.environ.get(KILL_NEW)
    if not target and not named and not log and not new:
        return
    global _reached  # noqa: PLW0603 - one count per process, as the kill is per process
    with _lock:
        _reached += 1
        number = _reached
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{number} {what}\n")
    if (target and target.isdigit() and number == int(target)) or what == named:
        os.kill(os.getpid(), signal.SIGKILL)
    if new and _first_time(new, what):
        os.kill(os.getpid(), signal.SIGKILL)


def _first_time(path: str, what: str) -> bool:
    """Whether `what` is not in the file at `path` yet (then it is added)."""
    try:
        with open(path, encoding="utf-8") as handle:
            if what in handle.read().splitlines():
                return False
    except FileNotFoundError:
        pass
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(what + "\n")
    return True
