"""The one context object every command receives, and the output renderer (table | json | yaml)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.console import Console

OutputFormat = Literal["table", "json", "yaml"]
FORMATS: tuple[OutputFormat, ...] = ("table", "json", "yaml")


@dataclass
class AppContext:
    """Settings from the root group, plus consoles created on first use (rich is lazy)."""

    output: OutputFormat = "table"
    debug: bool = False
    _stdout: Console | None = field(default=None, repr=False)
    _stderr: Console | None = field(default=None, repr=False)

    @property
    def machine_output(self) -> bool:
        return self.output != "table"

    @property
    def stdout(self) -> Console:
        if self._stdout is None:
            self._stdout = _make_console(sys.stdout)
        return self._stdout

    @property
    def stderr(self) -> Console:
        if self._stderr is None:
            self._stderr = _make_console(sys.stderr)
        return self._stderr

    def info(self, message: str) -> None:
        """A progress or status line for people, always on stderr (no rich needed)."""
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    def warn(self, message: str) -> None:
        colour = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        line = f"warning: {message}"
        sys.stderr.write((f"\x1b[33m{line}\x1b[0m" if colour else line) + "\n")
        sys.stderr.flush()

    def emit(self, data: Any, human: Callable[[Console], None] | None = None) -> None:
        """Print a command's result: `human` draws it for people; json/yaml print `data`."""
        if self.output == "json":
            sys.stdout.write(to_json(data) + "\n")
        elif self.output == "yaml":
            import yaml

            sys.stdout.write(yaml.safe_dump(jsonable(data), sort_keys=False, allow_unicode=True))
        elif human is not None:
            human(self.stdout)
        else:
            sys.stdout.write(to_json(data) + "\n")
        sys.stdout.flush()


def _make_console(stream: Any) -> Console:
    from rich.console import Console

    # No colour or animation unless the stream is a terminal; NO_COLOR is honoured by rich.
    is_tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(
        file=stream,
        force_terminal=None if is_tty else False,
        no_color=not is_tty or "NO_COLOR" in os.environ,
        highlight=False,
        soft_wrap=not is_tty,
    )


def jsonable(value: Any) -> Any:
    """Turn dataclasses, enums, datetimes and timedeltas into plain JSON values."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, the one timestamp format tpuctl prints."""
    from datetime import timezone

    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    text = moment.astimezone(timezone.utc).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def to_json(data: Any) -> str:
    return json.dumps(jsonable(data), indent=2, ensure_ascii=False)
