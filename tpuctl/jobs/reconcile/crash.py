"""A crash point before every side effect of a reconcile step, for the tests that kill a step
between any two of its actions.

`TPUCTL_TEST_KILL_AT=N` (read only by tests; never set it otherwise) makes the process SIGKILL
itself at the Nth crash point it reaches, before that side effect happens: a test that runs a
step once for every N proves that the next step, from any machine, converges from wherever the
killed one stopped. `TPUCTL_TEST_KILL_LOG=PATH` appends, for every point reached, a line naming
it (so a test knows how many there are).
"""

from __future__ import annotations

import os
import signal
import threading

KILL_AT = "TPUCTL_TEST_KILL_AT"
KILL_LOG = "TPUCTL_TEST_KILL_LOG"

_lock = threading.Lock()
_reached = 0


def point(what: str) -> None:
    """Called right before a side effect named `what` (an API call, a storage write, an SSH
    command)."""
    target, log = os.environ.get(KILL_AT), os.environ.get(KILL_LOG)
    if not target and not log:
        return
    global _reached  # noqa: PLW0603 - one count per process, as the kill is per process
    with _lock:
        _reached += 1
        number = _reached
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{number} {what}\n")
    if target and target.isdigit() and number == int(target):
        os.kill(os.getpid(), signal.SIGKILL)
