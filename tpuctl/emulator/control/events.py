"""The event log: everything that happened, in memory for the admin API and in events.jsonl."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from tpuctl.emulator.control.clock import Clock, rfc3339

log = logging.getLogger("tpuctl.emulator")


@dataclass(frozen=True)
class Event:
    seq: int
    timestamp: str  # RFC 3339
    kind: str  # e.g. "qr.state", "node.boot", "maintenance.start"
    qr: str | None = None  # full resource names
    node: str | None = None
    worker: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventLog:
    """Append-only, thread-safe; readers wait for new events with `since(seq, wait)`."""

    def __init__(self, clock: Clock, path: Path | None = None) -> None:
        self._clock = clock
        self._events: list[Event] = []
        self._changed = threading.Condition()
        self._file: TextIO | None = path.open("a", encoding="utf-8") if path else None

    def emit(
        self,
        kind: str,
        *,
        qr: str | None = None,
        node: str | None = None,
        worker: int | None = None,
        detail: str = "",
    ) -> Event:
        with self._changed:
            event = Event(
                len(self._events), rfc3339(self._clock.wall()), kind, qr, node, worker, detail
            )
            self._events.append(event)
            if self._file is not None:
                self._file.write(json.dumps(event.to_dict()) + "\n")
                self._file.flush()
            self._changed.notify_all()
        log.info("%s %s %s %s", kind, node or qr or "", "" if worker is None else worker, detail)
        return event

    def since(self, seq: int = 0, wait: float = 0.0) -> list[Event]:
        """Events with seq >= `seq`; waits up to `wait` seconds for the first one."""
        with self._changed:
            if wait > 0 and len(self._events) <= seq:
                self._changed.wait_for(lambda: len(self._events) > seq, timeout=wait)
            return self._events[max(0, seq) :]

    def close(self) -> None:
        with self._changed:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._changed.notify_all()
