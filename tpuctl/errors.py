"""The exception tree and exit codes shared by every layer; only cli/ turns them into exits."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Process exit codes, documented in the README and tested one by one."""

    OK = 0
    ERROR = 1
    USAGE = 2  # invalid usage or spec
    COMMAND_FAILED = 3  # a command failed on some workers
    DEADLINE = 4  # queueing, provisioning or command deadline passed
    NOT_FOUND = 5
    QR_FAILED = 6
    PREEMPTED = 7  # preempted or suspended
    AUTH = 8  # authentication or permission
    UNREACHABLE = 10  # workers unreachable
    API_UNAVAILABLE = 11  # the TPU API kept failing (UNAVAILABLE, DEADLINE_EXCEEDED)
    # `tpuctl reconcile`: the run goes on (or another supervisor holds it): call it again later.
    IN_PROGRESS = 12
    INTERRUPTED = 130


class TpuctlError(Exception):
    """Base of every error tpuctl reports to a user.

    `message` says what failed, `hint` what to do next. `details` holds structured facts
    (resource name, worker, field) that the JSON error shape exposes to scripts.
    """

    exit_code: ExitCode = ExitCode.ERROR
    kind: str = "error"

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: dict[str, Any] = details

    def one_line(self) -> str:
        """The single line shown to a person."""
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON error shape: {"error": {kind, message, hint, exit_code, ...}}."""
        body: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "exit_code": int(self.exit_code),
        }
        if self.hint:
            body["hint"] = self.hint
        body.update({k: v for k, v in self.details.items() if v is not None})
        return body


class UsageError(TpuctlError):
    """Bad flags or arguments."""

    exit_code = ExitCode.USAGE
    kind = "usage"


@dataclass(frozen=True)
class SourceLocation:
    """Where a value came from: a file with 1-based line and column, or a `--set` override."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"


class SpecError(TpuctlError):
    """A job spec that cannot be used: `file:line:col: path: what is wrong (the fix)`."""

    exit_code = ExitCode.USAGE
    kind = "spec"

    def __init__(
        self,
        message: str,
        *,
        location: SourceLocation | None = None,
        path: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(
            message,
            hint=hint,
            file=location.file if location else None,
            line=location.line if location else None,
            column=location.column if location else None,
            path=path,
        )
        self.location = location
        self.path = path

    def one_line(self) -> str:
        prefix = f"{self.location}: " if self.location else ""
        field = f"{self.path}: " if self.path else ""
        return f"{prefix}{field}{super().one_line()}"


class SpecErrors(SpecError):
    """Several mistakes in one spec, in file order, each a SpecError of its own: a person
    fixes them in one go, not one run of validate at a time."""

    def __init__(self, errors: list[SpecError]) -> None:
        first = errors[0]
        self.source = first.location.file if first.location else "the spec"
        super().__init__(
            f"{len(errors)} mistakes in {self.source}", location=first.location, path=first.path
        )
        self.errors = list(errors)

    def one_line(self) -> str:
        """The count, then each mistake on a line of its own (file:line:col: path: …)."""
        lines = [f"{self.source}: {len(self.errors)} mistakes"]
        return "\n".join(lines + [f"  {error.one_line()}" for error in self.errors])

    def to_dict(self) -> dict[str, Any]:
        """The first mistake's file, line, column and path, and `errors`: every mistake."""
        body = super().to_dict()
        body["errors"] = [
            {k: v for k, v in error.to_dict().items() if k not in ("kind", "exit_code")}
            for error in self.errors
        ]
        return body


class NotFoundError(TpuctlError):
    exit_code = ExitCode.NOT_FOUND
    kind = "not_found"


class AuthError(TpuctlError):
    exit_code = ExitCode.AUTH
    kind = "auth"


class ApiUnavailableError(TpuctlError):
    """The TPU API kept answering UNAVAILABLE (or timing out) through every retry: an outage,
    not a refusal. Waits ride it out until their own deadlines; anything else ends with this."""

    exit_code = ExitCode.API_UNAVAILABLE
    kind = "api_unavailable"


class ResourceExhaustedError(TpuctlError):
    """The service said RESOURCE_EXHAUSTED to a write: on a create, the zone has no quota or
    capacity for it (nothing was created), so another zone may still say yes."""

    kind = "resource_exhausted"


class DeadlineError(TpuctlError):
    exit_code = ExitCode.DEADLINE
    kind = "deadline"


class QueuedResourceFailed(TpuctlError):
    exit_code = ExitCode.QR_FAILED
    kind = "failed"


class PreemptedError(TpuctlError):
    exit_code = ExitCode.PREEMPTED
    kind = "preempted"


class CommandFailedError(TpuctlError):
    exit_code = ExitCode.COMMAND_FAILED
    kind = "command_failed"


class UnreachableError(TpuctlError):
    exit_code = ExitCode.UNREACHABLE
    kind = "unreachable"


class Interrupted(TpuctlError):
    exit_code = ExitCode.INTERRUPTED
    kind = "interrupted"


def quoted(value: object) -> str:
    """A value as a message shows it: a string in single quotes (double when it holds one),
    as written (a backslash stays one: a regular expression or a path reads as typed, where
    Python's repr doubles it), only characters a terminal would act on escaped; anything else
    as its text (`none` for None)."""
    if not isinstance(value, str):
        return "none" if value is None else str(value)
    mark = '"' if "'" in value and '"' not in value else "'"
    return mark + "".join(_shown(ch) for ch in value) + mark


def _shown(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if ch in named:
        return named[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
