"""Starting a Python child that a test will interrupt with a real SIGINT."""

from __future__ import annotations

import sys

# A runner started as a background job (`.ci/run &`) has SIGINT ignored, and its children
# inherit that; Python installs its Ctrl-C handler only over the default disposition, so such a
# child would never see the test's SIGINT. Reset it, then exec: the default survives exec.
_RESET_AND_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def python_with_default_sigint(*args: str) -> list[str]:
    """argv for `python ARGS` whose SIGINT behaves as at a terminal, however tests were run."""
    return [sys.executable, "-c", _RESET_AND_EXEC, *args]
