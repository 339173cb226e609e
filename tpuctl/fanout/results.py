"""Per-worker results of a fan-out and the group result (one stable JSON shape, exit codes)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from tpuctl.envelope import Result, jsonable
from tpuctl.errors import (
    AuthError,
    CommandFailedError,
    DeadlineError,
    ExitCode,
    Interrupted,
    TpuctlError,
    UnreachableError,
)
from tpuctl.fanout.targets import WorkerTarget

# hostkey-mismatch: the worker presented a key other than the one it published or that is
# pinned for it; hostkey-unknown: no key is known for it and nothing may be trusted on first
# use (--strict-host-key-checking yes); auth-failed: the way to it refused our credentials
# (an IAP tunnel with no usable gcloud login). All three are exit 8 and never retried.
Status = Literal[
    "ok",
    "failed",
    "unreachable",
    "timeout",
    "interrupted",
    "hostkey-mismatch",
    "hostkey-unknown",
    "auth-failed",
]
# A summary's always-present keys: the first six, which the output contract (docs/output.md)
# lists; the others are counted in a summary only when some worker has them.
STATUSES: tuple[Status, ...] = get_args(Status)[:6]
# Statuses of a worker tpuctl never got a shell on.
NOT_REACHED: frozenset[str] = frozenset(
    ("unreachable", "hostkey-mismatch", "hostkey-unknown", "auth-failed")
)
TAIL_BYTES = 8192
HINTS_SAID = 3  # the run's error line gives this many workers' fixes, then a count
TAIL_LINES = 20


class Tail:
    """The last TAIL_BYTES of a stream, and everything when `keep_all` (detached-run probes)."""

    __slots__ = ("_data", "_keep_all", "total")

    def __init__(self, keep_all: bool = False) -> None:
        self._data = bytearray()
        self._keep_all = keep_all
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._data += chunk
        if not self._keep_all and len(self._data) > 2 * TAIL_BYTES:
            del self._data[: len(self._data) - TAIL_BYTES]

    def bytes(self) -> bytes:
        return bytes(self._data)

    def text(self, lines: int = TAIL_LINES) -> str:
        data = self._data if self._keep_all else self._data[-TAIL_BYTES:]
        text = bytes(data).decode("utf-8", errors="replace")
        kept = text.splitlines()[-lines:]
        return "\n".join(kept)


@dataclass
class WorkerResult:
    """What happened on one worker. `started` is True once the command may have started
    (the exec request was sent): such a worker is never retried."""

    target: WorkerTarget
    status: Status
    exit_code: int | None = None
    duration_s: float = 0.0
    stdout: Tail = field(default_factory=Tail, repr=False)
    stderr: Tail = field(default_factory=Tail, repr=False)
    error: str | None = None
    started: bool = False
    attempts: int = 0
    # What the operation learned on this worker, a dataclass per operation (docs/output.md):
    # a detached run's state (ps, stop, ssh --detach), the job's status (ps --job), a delivery.
    detail: Any = None
    # The fix for this worker's failure, when there is one (a stale host key pin): said on the
    # run's error line; `error` says it too, for the JSON.
    hint: str | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        target = self.target
        return {
            "slice": target.slice_index,
            "node": target.node_id,
            "worker": target.worker,
            "address": target.address,
            "exit_code": self.exit_code,
            "duration_s": round(self.duration_s, 3),
            "status": self.status,
            "stdout_tail": self.stdout.text(),
            "stderr_tail": self.stderr.text(),
            # What the tails are the end of: a script sees whether anything was left out.
            "stdout_bytes": self.stdout.total,
            "stderr_bytes": self.stderr.total,
            "error": self.error,
            "detail": jsonable(self.detail),
        }


# Worse first: the exit code of a run is the worst status any worker had.
_SEVERITY: tuple[tuple[Status, ExitCode], ...] = (
    ("interrupted", ExitCode.INTERRUPTED),
    ("hostkey-mismatch", ExitCode.AUTH),
    ("hostkey-unknown", ExitCode.AUTH),
    ("auth-failed", ExitCode.AUTH),
    ("unreachable", ExitCode.UNREACHABLE),
    ("timeout", ExitCode.DEADLINE),
    ("failed", ExitCode.COMMAND_FAILED),
)


@dataclass
class Transfer:
    """What a copy moved: the archive (upload, code delivery) or what was unpacked (download)."""

    sha256: str | None = None
    bytes: int | None = None
    source: str | None = None  # the local path, or job.code
    destination: str | None = None  # the path on the workers, or the local directory
    files: int | None = None  # entries unpacked locally (download)


@dataclass
class FanoutResult(Result):
    """Results in target order, like fabric's GroupResult: one bad worker never hides others.

    `operation` names what ran (ssh, detach, ps, logs, stop, upload, download, run, deliver,
    restart, job-status); `run` the detached run's id or the job's run name.
    """

    KIND: ClassVar[str] = "Fanout"
    results: list[WorkerResult]
    duration_s: float = 0.0
    interrupted: bool = False
    operation: str = "ssh"
    run: str | None = None
    transfer: Transfer | None = None
    step: str | None = None  # `tpuctl run`: the step that ran last
    # Ctrl-C ended a `--follow`, which is how one stops following: not an error.
    interrupt_expected: bool = False

    def __iter__(self) -> Iterator[WorkerResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def succeeded(self) -> list[WorkerResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[WorkerResult]:
        return [r for r in self.results if not r.ok]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            counts[result.status] = counts.get(result.status, 0) + 1
        return counts

    @property
    def exit_code(self) -> ExitCode:
        """130 interrupted > 8 host key mismatch > 10 unreachable > 4 timeout > 3 failed > 0.

        Unreachable outranks a failed command: a worker that never ran it is the worse news.
        """
        if self.interrupted and self.interrupt_expected:
            return ExitCode.OK
        if self.interrupted:
            return ExitCode.INTERRUPTED
        statuses = {r.status for r in self.results}
        for status, code in _SEVERITY:
            if status in statuses:
                return code
        return ExitCode.OK

    def summary(self) -> dict[str, Any]:
        return {
            "workers": len(self.results),
            **self.counts(),
            "duration_s": round(self.duration_s, 3),
            "exit_code": int(self.exit_code),
        }

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape (docs/output.md, kind Fanout)."""
        return {
            "operation": self.operation,
            "run": self.run,
            "step": self.step,
            "transfer": jsonable(self.transfer),
            "summary": self.summary(),
            "workers": [r.to_dict() for r in self.results],
        }

    def exit_error(self) -> TpuctlError | None:
        return self.error()

    def error(self) -> TpuctlError | None:
        """The TpuctlError matching `exit_code` (for callers that prefer raising)."""
        code = self.exit_code
        if code == ExitCode.OK:
            return None
        bad = [r for r in self.results if r.status != "ok"]
        names = ", ".join(r.target.label for r in bad[:8]) + (" …" if len(bad) > 8 else "")
        kinds: dict[ExitCode, type[TpuctlError]] = {
            ExitCode.INTERRUPTED: Interrupted,
            ExitCode.AUTH: AuthError,
            ExitCode.UNREACHABLE: UnreachableError,
            ExitCode.DEADLINE: DeadlineError,
            ExitCode.COMMAND_FAILED: CommandFailedError,
        }
        counts = self.counts()
        detail = ", ".join(f"{n} {s}" for s, n in counts.items() if n and s != "ok")
        hints = list(dict.fromkeys(r.hint for r in bad if r.hint))
        hint = "; ".join(hints[:HINTS_SAID]) if hints else None
        if len(hints) > HINTS_SAID:
            hint = f"{hint}; and {len(hints) - HINTS_SAID} more in the workers' errors"
        return kinds[code](
            f"{len(bad)} of {len(self.results)} workers not ok ({detail}): {names}", hint=hint
        )
