"""Where worker output goes while a fan-out runs: prefixed lines on our stdout/stderr, or one
file per worker and stream; and notes on connection retries."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from tpuctl.cli.context import AppContext
    from tpuctl.fanout.targets import WorkerTarget


class PrefixedOutput:
    """Worker lines to our stdout/stderr as `[slice/worker] line` (whole lines, one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, target: WorkerTarget, stream: str, lines: bytes) -> None:
        prefix = f"[{target.label}] ".encode()
        data = b"".join(prefix + line + b"\n" for line in lines.rstrip(b"\n").split(b"\n"))
        out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        with self._lock:
            out.write(data)
            out.flush()


class OutputFiles:
    """One file per worker and stream: <dir>/<node>-w<worker>.out|.err (no cross-slice clash)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._files: dict[tuple[str, int, str], BinaryIO] = {}

    def path(self, target: WorkerTarget, stream: str) -> Path:
        suffix = "out" if stream == "stdout" else "err"
        return self.directory / f"{target.node_id}-w{target.worker}.{suffix}"

    def __call__(self, target: WorkerTarget, stream: str, lines: bytes) -> None:
        key = (target.node_id, target.worker, stream)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = self.path(target, stream).open("ab")
        handle.write(lines)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


def retry_note(app: AppContext) -> Callable[[WorkerTarget, str, str], None]:
    """A fan-out event callback that says on stderr when a worker's connection is retried."""

    def note(target: WorkerTarget, kind: str, message: str) -> None:
        if kind == "retry":
            app.info(f"[{target.label}] connection set-up failed, retrying: {message}")

    return note
