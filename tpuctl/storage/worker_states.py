"""Each worker's job state, as its startup script keeps it beside the run's journal.

`<checkpoint.dir>/tpuctl/<run>/workers/<slice>-<worker>.json` is rewritten by the worker's
startup script whenever its job's state changes (starting, setup, running, exited, …) and every
minute while the trainer runs (tpuctl/render/startup.sh, `write_shared_state`): what a
supervisor that cannot reach the workers over SSH (a Cloud Run job, a CronJob) needs to decide.
Reading them is one listing and one small read per worker.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tpuctl.errors import NotFoundError, TpuctlError

PARALLEL_READS = 32  # objects read at once from Cloud Storage


@dataclass(frozen=True)
class WorkerState:
    """One worker's state object. `heartbeat` is when it was written (the worker's clock)."""

    slice: int
    worker: int
    state: str
    node: str = ""
    boot: int | None = None
    pid: int | None = None
    started: str | None = None
    exit_code: int | None = None
    signalled: bool = False
    reason: str | None = None
    last_step: int | None = None
    resumed_from: int | None = None  # the step its job said it resumed from in this boot
    heartbeat: datetime | None = None

    @property
    def label(self) -> str:
        return f"{self.slice}/{self.worker}"

    @classmethod
    def parse(cls, text: str) -> WorkerState | None:
        """The object's contents, or None when they are not a state object."""
        try:
            data: Any = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("version") != 1:
            return None
        slice_index, worker = data.get("slice"), data.get("worker")
        state = data.get("state")
        if not isinstance(slice_index, int) or not isinstance(worker, int) or not state:
            return None
        beat = data.get("heartbeat")
        return cls(
            slice=slice_index,
            worker=worker,
            state=str(state),
            node=str(data.get("node") or ""),
            boot=_int(data.get("boot")),
            pid=_int(data.get("pid")),
            started=str(data.get("started") or "") or None,
            exit_code=_int(data.get("exit_code")),
            signalled=data.get("signalled") == 1,
            reason=str(data.get("reason") or "") or None,
            last_step=_int(data.get("last_step")),
            resumed_from=_int(data.get("resumed_from")),
            heartbeat=(
                datetime.fromtimestamp(beat, timezone.utc) if isinstance(beat, int) else None
            ),
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_worker_states(url: str) -> dict[str, WorkerState]:
    """Every readable state object under `url`, by label ("slice/worker"); {} when there is
    none (or the location cannot be listed)."""
    from tpuctl.storage.locations import open_location

    storage = open_location(url)
    try:
        names = [entry.name for entry in storage.list() if entry.name.endswith(".json")]
    except (NotFoundError, TpuctlError):
        return {}

    def read(name: str) -> WorkerState | None:
        try:
            return WorkerState.parse(storage.read_text(name))
        except (NotFoundError, TpuctlError, UnicodeDecodeError):
            return None

    if storage.kind == "gcs" and len(names) > 1:
        with ThreadPoolExecutor(min(PARALLEL_READS, len(names))) as pool:
            found = list(pool.map(read, names))
    else:
        found = [read(name) for name in names]
    return {state.label: state for state in found if state is not None}
