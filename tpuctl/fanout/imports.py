"""paramiko, imported without invoke."""

from __future__ import annotations

import sys


def load_paramiko() -> None:
    """Import paramiko (once per process) with invoke kept out; `import paramiko` after this
    costs nothing.

    paramiko.config imports invoke (which paramiko 4 requires), and the copy of PyYAML
    invoke vendors, only to run an ssh_config `Match exec` line. tpuctl never hands paramiko
    an ssh_config, and the import took about 50 ms of every `tpuctl ssh`, `up` and
    `reconcile` start. A None entry in sys.modules makes `import invoke` raise ImportError,
    which paramiko handles (it then refuses `Match exec`); the entry is taken out again, so
    a later `import invoke` works. tests/fanout/test_paramiko_canary.py fails if a paramiko
    release stops importing without it.
    """
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return
    sys.modules["invoke"] = None  # type: ignore[assignment]
    try:
        import paramiko  # noqa: F401
    finally:
        if "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
