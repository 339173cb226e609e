"""Our process's streams: where worker output goes while a fan-out runs (prefixed lines on our
stdout/stderr, one file per worker and stream, or each worker's log kept for the JSON
document), a stream silenced for good, and the variable through which a shell asks for
completions."""

from __future__ import annotations

import base64
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

if TYPE_CHECKING:
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
    """One file per worker and stream, <dir>/<node>-w<worker>.out|.err by default (no
    cross-slice clash), or as `naming` says; written as the output arrives."""

    def __init__(
        self, directory: Path, naming: Callable[[WorkerTarget, str], str] | None = None
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.naming = naming or OutputFiles.output_name
        self._files: dict[tuple[str, int, str], BinaryIO] = {}
        self._lock = threading.Lock()

    @staticmethod
    def output_name(target: WorkerTarget, stream: str) -> str:
        return f"{target.node_id}-w{target.worker}.{'out' if stream == 'stdout' else 'err'}"

    @staticmethod
    def log_name(target: WorkerTarget, stream: str) -> str:
        """A gathered log: <slice>-<worker>.log, and what went wrong in <slice>-<worker>.err."""
        return f"{target.slice_index}-{target.worker}.{'log' if stream == 'stdout' else 'err'}"

    def path(self, target: WorkerTarget, stream: str) -> Path:
        return self.directory / self.naming(target, stream)

    @property
    def written(self) -> list[Path]:
        return [Path(handle.name) for handle in self._files.values()]

    def __call__(self, target: WorkerTarget, stream: str, lines: bytes) -> None:
        key = (target.node_id, target.worker, stream)
        with self._lock:
            handle = self._files.get(key)
            if handle is None:
                handle = self._files[key] = self.path(target, stream).open("ab")
        handle.write(lines)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


# What `logs --format json` holds of one worker's log: beyond this the first bytes are left
# out, and said (--output-dir keeps every byte of any size).
LOG_JSON_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class WorkerLog:
    """A worker's log in the `logs` JSON (`detail`): the text, and the exact bytes in base64
    when they are not UTF-8; `bytes` read, `cut_bytes` left out at its start (0: whole)."""

    log: str
    log_base64: str | None
    bytes: int
    cut_bytes: int


class LogCollector:
    """Each worker's log (its stdout, byte for byte) kept for the JSON document, up to `limit`
    bytes each: the newest bytes kept, the number left out counted."""

    def __init__(self, limit: int = LOG_JSON_LIMIT) -> None:
        self.limit = limit
        self._data: dict[tuple[str, int], bytearray] = {}
        self._read: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def __call__(self, target: WorkerTarget, stream: str, data: bytes) -> None:
        if stream != "stdout":
            return  # stderr holds why a log could not be read: the worker's error
        key = (target.node_id, target.worker)
        with self._lock:
            kept = self._data.setdefault(key, bytearray())
            kept += data
            self._read[key] = self._read.get(key, 0) + len(data)
            if len(kept) > 2 * self.limit:
                del kept[: len(kept) - self.limit]

    def log(self, target: WorkerTarget) -> WorkerLog:
        key = (target.node_id, target.worker)
        with self._lock:
            data = bytes(self._data.get(key, b""))[-self.limit :] if self.limit else b""
            read = self._read.get(key, 0)
        try:
            text, exact = data.decode("utf-8"), None
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            exact = base64.b64encode(data).decode("ascii")
        return WorkerLog(text, exact, read, read - len(data))


def instruction_variable(prog_name: str) -> str:
    """Where a shell puts its completion instruction for click: `_TPUCTL_COMPLETE`."""
    return "_{}_COMPLETE".format(prog_name.replace("-", "_").replace(".", "_")).upper()


def silence(stream: TextIO) -> None:
    """Point the stream's file descriptor at /dev/null, for the rest of the process."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except OSError:
        pass
