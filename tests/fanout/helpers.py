"""What fan-out tests share beyond the harness (tests/harness.py): processes on the workers."""

from __future__ import annotations


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
